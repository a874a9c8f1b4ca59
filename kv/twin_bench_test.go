package kv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// BenchmarkApplyInsertTwin measures, in one run, what three replicas'
// applies of kvbench btree's 1-group x64 insert row cost against the
// same row's hashed puts: three Tables on shm (one group's replicas, as
// its poller applies them in turn), each with an ordered part
// (btree.Store in the same node's regions), loaded with the same 100 k
// keys in both keyspaces (17 bytes, kvbench's internal ordered keys, in
// ascending order; 100-byte values; the hashed index sized for 900 k
// keys, so that no growth of it falls in the run: an insert pays none
// of the index's migration, which a run of kvbench spreads over its
// rows as the index grows); then batch entries of 16 multi
// requests of 4 puts of new keys (a loaded key with its last digit made
// a letter; the same bytes for both kinds), hashed and ordered batches
// alternated, each applied as multicast applies a batch (Prefetch of
// each message, BeginBatch, Apply, EndBatch). Metrics: each kind's CPU
// time of the benchmark thread per insert on one replica, and ratio,
// hashed over ordered: what the ordered inserts' rate would be against
// the hashed puts' if the replicas' apply were all a group's poller did
// (kvbench's x64 ratio at 1 group; the target 0.7).
func BenchmarkApplyInsertTwin(b *testing.B) {
	const n, msgs, per, replicas = 100_000, 16, 4, 3
	cluster := fmt.Sprintf("kvtwin%d", os.Getpid())
	tabs := make([]*Table, replicas)
	for r := range tabs {
		node, err := shm.Open(rdma.NodeID(r+1), shm.Options{Cluster: cluster})
		if err != nil {
			b.Fatal(err)
		}
		st, err := btree.NewStore(btree.StoreConfig{Tablets: []btree.Tablet{btree.All}, ChunkSlots: 4096}, node)
		if err != nil {
			node.Close()
			b.Fatal(err)
		}
		tb, err := NewTable(TableConfig{LogBuckets: 17, Ordered: st}, node)
		if err != nil {
			st.Close()
			node.Close()
			b.Fatal(err)
		}
		tabs[r] = tb
		b.Cleanup(func() { tb.Close(); st.Close(); node.Close() })
	}
	key := func(dst []byte, i int) []byte {
		dst = fmt.Appendf(dst[:0], "\x01k%015d", i)
		return dst
	}
	val := make([]byte, 100)
	apply := func(tb *Table, req []byte) {
		if res := tb.Apply(broadcast.Entry{Index: tb.applied + 1, Data: req}); len(res) == 0 || res[0] != StatusOK {
			b.Fatalf("apply: result %v", res)
		}
	}
	// The load: MaxMulti puts a request, each key in both keyspaces.
	hops, oops := make([]Op, MaxMulti), make([]btree.Op, MaxMulti)
	var hreq, oreq []byte
	for i := 0; i < n; i += MaxMulti {
		for j := range hops {
			k := key(nil, i+j)
			hops[j] = Op{Kind: OpPut, Key: k, Value: val}
			oops[j] = btree.Op{Kind: btree.OpPut, Key: k, Value: val}
		}
		hreq, oreq = AppendMulti(hreq[:0], hops), btree.AppendMulti(oreq[:0], oops)
		for _, tb := range tabs {
			apply(tb, hreq)
			apply(tb, oreq)
		}
	}
	for _, tb := range tabs {
		tb.step()
		for tb.old != nil {
			tb.step()
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	reqs := make([][]byte, msgs)
	hb, ob := make([]Op, per), make([]btree.Op, per)
	for j := range hb {
		hb[j] = Op{Kind: OpPut, Value: val}
		ob[j] = btree.Op{Kind: btree.OpPut, Value: val}
	}
	batch := func(ordered bool) {
		for m := range reqs {
			for j := range hb {
				k := key(hb[j].Key, rng.IntN(n))
				k[len(k)-1] = byte('a' + rng.IntN(26))
				hb[j].Key, ob[j].Key = k, k
			}
			if ordered {
				reqs[m] = btree.AppendMulti(reqs[m][:0], ob)
			} else {
				reqs[m] = AppendMulti(reqs[m][:0], hb)
			}
		}
		for _, tb := range tabs {
			for _, req := range reqs {
				tb.Prefetch(req)
			}
			tb.BeginBatch()
			for _, req := range reqs {
				apply(tb, req)
			}
			tb.EndBatch()
		}
	}
	// As kvbench's x1 insert row before its x64 row: 10 k inserts of
	// each kind split the leaves the ascending load left full.
	for range 10_000 / (msgs * per) {
		batch(false)
		batch(true)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu [2]int64
	inserts := 0
	b.ReportAllocs()
	for b.Loop() {
		for kind := range 2 {
			c0 := threadCPU()
			batch(kind == 1)
			cpu[kind] += threadCPU() - c0
		}
		inserts += msgs * per
	}
	hashed := float64(cpu[0]) / float64(inserts*replicas)
	ordered := float64(cpu[1]) / float64(inserts*replicas)
	b.ReportMetric(hashed, "hashed-cpu-ns/insert")
	b.ReportMetric(ordered, "ordered-cpu-ns/insert")
	b.ReportMetric(hashed/ordered, "ratio")
}
