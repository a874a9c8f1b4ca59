package kv

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rdmakv/rdmakv/multicast"
)

var _ multicast.BatchFSM = (*Table)(nil)

// TestTableBatchPublish: inside a batch (BeginBatch ... EndBatch, as
// multicast applies a batch entry) the header is published once, at
// EndBatch, for requests that only moved Applied; yet after every request
// of a batch, gets (linearizable and stale-ok) already return what it
// wrote: a growth of the index, a finished migration and a request of
// several ops are published at the end of their request, as outside a
// batch. A stale-ok get never reports an index beyond what is applied,
// and EndBatch publishes the batch's last index.
func TestTableBatchPublish(t *testing.T) {
	tb, r := soloTable(t, TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
	rng := rand.New(rand.NewPCG(4, 4))
	model := map[string]string{}
	idx := uint64(0)
	quiet, grown := 0, 0
	const keys = 400
	for batch := 0; batch < 300; batch++ {
		tb.BeginBatch()
		before := tb.Header()
		n := 1 + rng.IntN(12)
		for range n {
			idx++
			geo := tb.geometry()
			var ops []Op
			for range 1 + rng.IntN(3)*rng.IntN(2) {
				k := fmt.Sprintf("key-%d", rng.IntN(keys))
				if rng.IntN(5) == 0 {
					ops = append(ops, Op{Kind: OpDelete, Key: []byte(k)})
				} else {
					ops = append(ops, Op{Kind: OpPut, Key: []byte(k), Value: []byte(fmt.Sprintf("v%d-%s", idx, k))})
				}
			}
			if res := put(tb, idx, ops...); res.Status != StatusOK {
				t.Fatalf("request %d: %+v", idx, res)
			}
			for _, op := range ops {
				if op.Kind == OpDelete {
					delete(model, string(op.Key))
				} else {
					model[string(op.Key)] = string(op.Value)
				}
			}
			h := tb.Header()
			switch {
			case tb.geometry() != geo:
				grown++
				fallthrough
			case len(ops) > 1:
				if h.Applied != idx {
					t.Fatalf("request %d (%d ops, geometry %+v -> %+v) not published at its end: header at %d", idx, len(ops), geo, tb.geometry(), h.Applied)
				}
			default:
				if h.Applied == before.Applied {
					quiet++
				}
			}
			if h.Geometry != tb.geometry() || h.Layout != tb.layout || h.Layout%2 != 0 {
				t.Fatalf("request %d: published geometry %+v layout %d, table %+v layout %d", idx, h.Geometry, h.Layout, tb.geometry(), tb.layout)
			}
			for range 3 {
				k := fmt.Sprintf("key-%d", rng.IntN(keys))
				for _, mode := range []Consistency{Linearizable, StaleOK} {
					g, err := r.Get([]byte(k), mode)
					if err != nil {
						t.Fatalf("request %d: get %s: %v", idx, k, err)
					}
					want, ok := model[k]
					if g.Found != ok || string(g.Value) != want {
						t.Fatalf("request %d in a batch: get %s (%v): found %v %q, want %v %q", idx, k, mode, g.Found, g.Value, ok, want)
					}
					if g.Applied > idx {
						t.Fatalf("request %d: a get reports applied %d", idx, g.Applied)
					}
				}
			}
		}
		tb.EndBatch()
		if h := tb.Header(); h.Applied != idx {
			t.Fatalf("after EndBatch: header at %d, applied %d", h.Applied, idx)
		}
	}
	if quiet == 0 || grown == 0 {
		t.Fatalf("%d requests left their publication to EndBatch, %d grew the index: want some of each", quiet, grown)
	}
	t.Logf("%d requests, %d published only at EndBatch, %d grew or finished a migration", idx, quiet, grown)
}
