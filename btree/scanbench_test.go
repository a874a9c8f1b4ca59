package btree

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkWarmScan measures a forward scan of 100 pairs through a cache
// that holds every inner node, each leaf read as a copy of its slot (as a
// one-sided read delivers it) into a buffer of its own that the scan's
// pairs alias (AliasReads, as kv's OrderedReader does), in trees of 100 k
// keys of 16 bytes with 100-byte values and of 20 k keys with 1 KiB
// values (YCSB E's records); ns/pair is the CPU per scanned record.
func BenchmarkWarmScan(b *testing.B) {
	for _, tc := range []struct{ n, vlen, size int }{{100_000, 100, 4096}, {20_000, 1024, 8192}} {
		r := rand.New(rand.NewPCG(3, 3))
		keys := make([][]byte, tc.n)
		for i := range keys {
			keys[i] = []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12))
		}
		val := make([]byte, tc.vlen)
		a := NewArena(tc.size, 1024, nil)
		tr, err := New(Config{NodeSize: tc.size, MaxKey: 64}, a, 1)
		if err != nil {
			b.Fatal(err)
		}
		for i, k := range keys {
			if _, err := tr.Put(k, val, uint64(i+2), uint64(i+2)); err != nil {
				b.Fatal(err)
			}
		}
		c := NewCache(64 << 20)
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, tc.size)
		}
		next := 0
		read := func(slot uint32) ([]byte, error) {
			buf := bufs[next%len(bufs)]
			next++
			copy(buf, a.Bytes(slot))
			return buf, nil
		}
		for _, k := range keys {
			c.Lookup(read, tr.Root(), k)
		}
		b.Run(fmt.Sprintf("value=%d/node=%d", tc.vlen, tc.size), func(b *testing.B) {
			var w ScanWalk
			var dst []KV
			pairs, reads := 0, 0
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c.BeginScan(&w, tr.Root(), uint64(tc.n+2), keys[i%tc.n], nil, 100, false, dst[:0])
				w.AliasReads()
				if err := w.Run(read); err != nil {
					b.Fatal(err)
				}
				dst = w.Pairs
				pairs += len(w.Pairs)
				reads += w.Reads
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pairs), "ns/pair")
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
		})
	}
}
