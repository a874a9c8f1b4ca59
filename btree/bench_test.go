package btree

import (
	"fmt"
	"math/rand/v2"
	"testing"

	tbtree "github.com/tidwall/btree"
)

// BenchmarkWarmLookup measures a warm lookup through a cache that holds
// every inner node, reading leaves from the arena (a copy of the node, as
// a one-sided read delivers it, then Decode and Find), for several node
// sizes, 100 k keys of 16 bytes and 100-byte values; and tidwall/btree's
// Get over the same keys in the same run, the in-process baseline.
func BenchmarkWarmLookup(b *testing.B) {
	const n = 100_000
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12))
	}
	val := make([]byte, 100)
	for _, size := range []int{1024, 4096, 16384} {
		cfg := Config{NodeSize: size, MaxKey: 64}
		a := NewArena(size, 1024, nil)
		tr, err := New(cfg, a, 1)
		if err != nil {
			b.Fatal(err)
		}
		for i, k := range keys {
			if _, err := tr.Put(k, val, uint64(i+2), uint64(i+2)); err != nil {
				b.Fatal(err)
			}
		}
		c := NewCache(64 << 20)
		buf := make([]byte, size)
		read := func(slot uint32) ([]byte, error) {
			copy(buf, a.Bytes(slot))
			return buf, nil
		}
		for _, k := range keys {
			c.Lookup(read, tr.Root(), k)
		}
		b.Run(fmt.Sprintf("node=%d", size), func(b *testing.B) {
			reads := 0
			for i := 0; b.Loop(); i++ {
				_, found, nr, err := c.Lookup(read, tr.Root(), keys[i%n])
				if err != nil || !found {
					b.Fatal(found, err)
				}
				reads += nr
			}
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
			st := tr.Stats()
			b.ReportMetric(st.LeafFill, "leaf-fill")
			b.ReportMetric(float64(c.Stats().Bytes)/float64(n*116), "cache/raw")
		})
	}
	var m tbtree.Map[string, []byte]
	for _, k := range keys {
		m.Set(string(k), val)
	}
	b.Run("tidwall", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := m.Get(string(keys[i%n])); !ok {
				b.Fatal("missing")
			}
		}
	})
}
