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

// TestBatchClockOnce: a batch's messages share one clock read, at
// BeginBatch, and the header EndBatch publishes says the batch was
// applied at that time (not later than any of its messages was); a
// request outside a batch reads the clock itself.
func TestBatchClockOnce(t *testing.T) {
	var now, reads int64
	clock := func() int64 { reads++; return now }
	tb, _ := soloTable(t, TableConfig{LogBuckets: 4, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, Clock: clock})
	idx := uint64(0)
	for batch := 1; batch <= 20; batch++ {
		now = int64(batch) * 1000
		r0 := reads
		tb.BeginBatch()
		start := now
		for m := range batch % 7 {
			idx++
			now++ // time passes while the batch applies
			if res := put(tb, idx, Op{Kind: OpPut, Key: []byte(fmt.Sprintf("k%d", m)), Value: []byte("v")}); res.Status != StatusOK {
				t.Fatalf("batch %d: %+v", batch, res)
			}
		}
		tb.EndBatch()
		if got := reads - r0; got != 1 {
			t.Fatalf("batch %d of %d messages read the clock %d times, want once", batch, batch%7, got)
		}
		if h := tb.Header(); h.Applied != idx || (idx > 0 && h.AppliedAt != start) {
			t.Fatalf("batch %d: header applied %d at %d, want %d at the batch's start %d", batch, h.Applied, h.AppliedAt, idx, start)
		}
	}
	idx++
	now, reads = 99_000, 0
	if res := put(tb, idx, Op{Kind: OpPut, Key: []byte("alone"), Value: []byte("v")}); res.Status != StatusOK {
		t.Fatal(res)
	}
	if h := tb.Header(); reads != 1 || h.Applied != idx || h.AppliedAt != 99_000 {
		t.Fatalf("a request outside a batch: %d clock reads, header applied %d at %d; want 1, %d at 99000", reads, h.Applied, h.AppliedAt, idx)
	}
}
