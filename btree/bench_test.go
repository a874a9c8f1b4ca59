package btree

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
	tbtree "github.com/tidwall/btree"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
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

// BenchmarkRemoteLookup measures a warm lookup read one-sided: a tree of
// 100 k keys (16 bytes, 100-byte values, 4 KiB nodes) in registered
// memory on one node of the mem fabric, and a reader on another node
// whose cache holds every inner node, so that each lookup is one local
// search and one leaf read through btree.Remote (reads/op says so).
func BenchmarkRemoteLookup(b *testing.B) {
	const n, size = 100_000, 4096
	f := mem.New(mem.Options{})
	wn, err := f.NewNode(1)
	if err != nil {
		b.Fatal(err)
	}
	defer wn.Close()
	rg, err := NewRegions(wn, 0, size, 1024, []rdma.NodeID{2})
	if err != nil {
		b.Fatal(err)
	}
	defer rg.Close()
	tr, err := New(Config{NodeSize: size, MaxKey: 64}, rg.Arena, 1)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([][]byte, n)
	val := make([]byte, 100)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12))
		if _, err := tr.Put(keys[i], val, uint64(i+2), uint64(i+2)); err != nil {
			b.Fatal(err)
		}
	}
	rg.Publish(tr, n+1, 0, 0, nil)
	rn, err := f.NewNode(2)
	if err != nil {
		b.Fatal(err)
	}
	defer rn.Close()
	conn, err := rn.Connect(1)
	if err != nil {
		b.Fatal(err)
	}
	rem := NewRemote(conn, 0)
	hd, err := rem.Header()
	if err != nil {
		b.Fatal(err)
	}
	c := NewCache(64 << 20)
	for _, k := range keys {
		if _, _, _, err := c.Lookup(rem.Read, hd.Root, k); err != nil {
			b.Fatal(err)
		}
	}
	reads := 0
	for i := 0; b.Loop(); i++ {
		_, found, nr, err := c.Lookup(rem.Read, hd.Root, keys[i%n])
		if err != nil || !found {
			b.Fatal(found, err)
		}
		reads += nr
	}
	b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
}

// BenchmarkStoreApply measures the apply of one ordered put on a replica
// (Store.Apply of a one-op request: the version read, the conditions, the
// leaf's change and its check word) into a tree of 100 k keys of 16 bytes
// and 100-byte values in 4 KiB nodes: inserts of new keys, and updates of
// keys already there.
func BenchmarkStoreApply(b *testing.B) {
	const n = 100_000
	r := rand.New(rand.NewPCG(2, 2))
	mk := func() []byte { return []byte(fmt.Sprintf("user%012d", r.Uint64()%1e12)) }
	val := make([]byte, 100)
	for _, kind := range []string{"insert", "update"} {
		b.Run(kind, func(b *testing.B) {
			s, err := NewStore(StoreConfig{Tablets: []Tablet{All}, MaxChunks: 64, ChunkSlots: 4096}, nil)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([][]byte, n)
			idx := uint64(1)
			for i := range keys {
				keys[i] = mk()
				idx++
				s.Apply(idx, AppendRequest(nil, []Op{{Kind: OpPut, Key: keys[i], Value: val}}))
			}
			reqs := make([][]byte, 4096)
			for i := range reqs {
				k := mk()
				if kind == "update" {
					k = keys[r.IntN(n)]
				}
				reqs[i] = AppendRequest(nil, []Op{{Kind: OpPut, Key: k, Value: val}})
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				idx++
				if res := s.Apply(idx, reqs[i%len(reqs)]); res[0] != StatusOK {
					b.Fatal(res[0])
				}
			}
		})
	}
}

// BenchmarkNodeCheck measures a node's check word over the used bytes of
// a 4 KiB and an 8 KiB node at 70% fill: XXH3 (nodeCheck) and the XXH64
// it replaced.
func BenchmarkNodeCheck(b *testing.B) {
	for _, size := range []int{4096, 8192} {
		buf := make([]byte, size*7/10)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		b.Run(fmt.Sprintf("xxh3/node=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				nodeCheck(buf)
			}
		})
		b.Run(fmt.Sprintf("xxh64/node=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				xxhash.Sum64(buf)
			}
		})
	}
}
