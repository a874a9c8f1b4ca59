package kv

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// BenchmarkGet is one reader's one-sided get of a table of 1k (in cache)
// and 100k records
// (16-byte keys, 100-byte values) on another node of this process, on shm
// (the reader's loads from the table's mapping): the cost of the get path
// itself, without the cluster. kvbench kv measures it against a cluster.
func BenchmarkGet(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) { benchGet(b, n) })
	}
}

func benchGet(b *testing.B, n int) {
	dir := b.TempDir()
	name := fmt.Sprintf("kvbench%d", os.Getpid())
	n1, err := shm.Open(1, shm.Options{Dir: dir, Cluster: name})
	if err != nil {
		b.Fatal(err)
	}
	defer n1.Close()
	n2, err := shm.Open(2, shm.Options{Dir: dir, Cluster: name})
	if err != nil {
		b.Fatal(err)
	}
	defer n2.Close()
	tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{2}}, n1)
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	tb.Promise(5)
	tb.SetServing(5)
	keys := make([][]byte, n)
	val := make([]byte, 100)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%012d", i))
		tb.Apply(broadcast.Entry{Index: uint64(i + 1), Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: keys[i], Value: val}})})
	}
	for _, mode := range []Consistency{StaleOK, Linearizable} {
		b.Run(mode.String(), func(b *testing.B) {
			r := NewGroupReader(n2, 0, []rdma.NodeID{1}, 0)
			defer r.Close()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				res, err := r.Get(keys[i%n], mode)
				if err != nil || !res.Found {
					b.Fatal(err)
				}
				i += 7919
			}
			b.ReportMetric(float64(r.Reads)/float64(b.N), "reads/get")
		})
	}
}

// BenchmarkApply is the table's own cost of applying puts of fresh keys
// (16-byte keys, 100-byte values), 28 to a request, the index growing as
// it fills: what a replica's polling goroutine spends per put besides
// ordering it.
func BenchmarkApply(b *testing.B) {
	dir := b.TempDir()
	n1, err := shm.Open(1, shm.Options{Dir: dir, Cluster: fmt.Sprintf("kvapply%d", os.Getpid())})
	if err != nil {
		b.Fatal(err)
	}
	defer n1.Close()
	tb, err := NewTable(TableConfig{}, n1)
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	val := make([]byte, 100)
	ops := make([]Op, 28)
	keys := make([][]byte, 28)
	for i := range keys {
		keys[i] = make([]byte, 16)
	}
	var req []byte
	idx := uint64(0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for k := range ops {
			binary.LittleEndian.PutUint64(keys[k], uint64(i))
			binary.LittleEndian.PutUint64(keys[k][8:], uint64(k))
			ops[k] = Op{Kind: OpPut, Key: keys[k], Value: val}
		}
		req = AppendRequest(req[:0], ops)
		idx++
		tb.Apply(broadcast.Entry{Index: idx, Data: req})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/put")
	b.ReportMetric(float64(tb.Len()), "records")
}

// TestGetAllocs: a linearizable get of a 3-member group (its promise reads
// included) and a stale-ok get allocate nothing in steady state.
func TestGetAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	f := mem.New(mem.Options{})
	var tabs []*Table
	for id := rdma.NodeID(1); id <= 3; id++ {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{9}}, n)
		if err != nil {
			t.Fatal(err)
		}
		defer tb.Close()
		tb.Promise(5)
		tb.Apply(broadcast.Entry{Index: 1, Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}})})
		tabs = append(tabs, tb)
	}
	tabs[0].SetServing(5)
	rn, _ := f.NewNode(9)
	r := NewGroupReader(rn, 0, []rdma.NodeID{1, 2, 3}, 1)
	defer r.Close()
	key := []byte("k")
	for _, mode := range []Consistency{Linearizable, StaleOK} {
		if res, err := r.Get(key, mode); err != nil || string(res.Value) != "v" {
			t.Fatalf("%v get: %q %v", mode, res.Value, err)
		}
		if n := testing.AllocsPerRun(200, func() { r.Get(key, mode) }); n != 0 {
			t.Errorf("%v get: %v allocations", mode, n)
		}
	}
}

// BenchmarkOrderedLookup is one OrderedReader's warm one-sided lookup
// (cached inner nodes, one leaf read) of a group's ordered keyspace of
// 20k records (16-byte keys, 100-byte values, 4 KiB nodes) on shm, with
// a Delegation as the client's readers have: the cost of the ordered get
// path itself, without the cluster (kvbench btree measures it against
// one).
func BenchmarkOrderedLookup(b *testing.B) {
	nodes, rn := orderedNodes(b, "shm")
	g := &orderedGroup{}
	for _, n := range nodes {
		st, err := btree.NewStore(btree.StoreConfig{Tree: btree.Config{NodeSize: 4096, MaxKey: 64}, ChunkSlots: 256, FreeAfter: 4,
			Tablets: []btree.Tablet{btree.All}, Readers: []rdma.NodeID{9}}, n)
		if err != nil {
			b.Fatal(err)
		}
		tb, err := NewTable(TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, Ordered: st, Readers: []rdma.NodeID{9}}, n)
		if err != nil {
			b.Fatal(err)
		}
		tb.Promise(5)
		b.Cleanup(func() { tb.Close(); st.Close() })
		g.tabs, g.stores = append(g.tabs, tb), append(g.stores, st)
	}
	g.tabs[0].SetServing(5)
	const n = 20000
	keys := make([][]byte, n)
	val := make([]byte, 100)
	for i := 0; i < n; i += 100 {
		var ops []btree.Op
		for j := i; j < i+100; j++ {
			keys[j] = []byte(fmt.Sprintf("key-%012d", j))
			ops = append(ops, btree.Op{Kind: btree.OpPut, Key: keys[j], Value: val})
		}
		g.apply(ops...)
	}
	for _, mode := range []Consistency{StaleOK, Linearizable} {
		b.Run(mode.String(), func(b *testing.B) {
			r := NewOrderedReader(rn, 0, []rdma.NodeID{1, 2, 3}, 1, btree.NewCache(16<<20))
			r.SetDelegation(NewDelegation())
			defer r.Close()
			for _, k := range keys {
				if res, err := r.Lookup(k, mode); err != nil || !res.Found {
					b.Fatal(res.Found, err)
				}
			}
			b.ReportAllocs()
			i, reads, retries := 0, 0, 0
			for b.Loop() {
				res, err := r.Lookup(keys[i%n], mode)
				if err != nil || !res.Found {
					b.Fatal(res.Found, err)
				}
				reads, retries = reads+res.NodeReads, retries+res.Retries
				i += 7919
			}
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
			b.ReportMetric(float64(retries)/float64(b.N), "retries/op")
		})
	}
}
