package broadcast

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestSlabReuse: copies stay intact while referenced, however slabs are
// recycled under them, and a steady stream reuses slabs instead of
// allocating; so do copies of FSM results (replyArenaAllocs).
func TestSlabReuse(t *testing.T) {
	var pool slabPool
	var cur slabCursor
	rng := rand.New(rand.NewPCG(1, 2))
	type held struct {
		want []byte
		got  []byte
		s    *slab
	}
	var live []held
	made := 0
	for i := range 20000 {
		n := rng.IntN(3000)
		if rng.IntN(50) == 0 {
			n = slabMaxData + 1 + rng.IntN(100) // copied apart
		}
		want := make([]byte, n)
		for k := range want {
			want[k] = byte(i + k)
		}
		if len(pool.free) == 0 && (cur.s == nil || len(cur.s.buf)-cur.off < n) && n <= slabMaxData {
			made++
		}
		got, s := cur.copy(&pool, want)
		if n > slabMaxData && s != nil {
			t.Fatalf("%d-byte copy is in a slab", n)
		}
		live = append(live, held{want, got, s})
		// Drop references in a random order, keeping up to ~64 live.
		for len(live) > rng.IntN(64) {
			k := rng.IntN(len(live))
			live[k].s.unref()
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		for _, h := range live {
			if !bytes.Equal(h.got, h.want) {
				t.Fatalf("step %d: a live copy was overwritten", i)
			}
		}
	}
	// 20000 copies of ~1.5 KB are ~460 slabs' worth; with at most ~64 live
	// copies, a handful of slabs must have served them all.
	if made > 16 {
		t.Fatalf("%d slabs made for a stream with at most 64 live copies", made)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		_, s := cur.copy(&pool, make([]byte, 0, 1000)[:1000])
		s.unref()
	})
	if allocs > 0.01 {
		t.Fatalf("steady copy/unref allocates %.2f per op", allocs)
	}
	replyArenaAllocs(t) // results copied for Proposal.Reply

	// A pool sized for a replica's proposals (slabPool.size): batch
	// entries up to a whole proposal, filled in place (alloc, as
	// AppendFunc does), come from reused slabs too: none is copied apart
	// and a steady stream allocates nothing.
	const maxProp = 128<<10 - 64 // the default MaxRecord's
	var big slabPool
	big.size(maxProp)
	var bc slabCursor
	var pinned []*slab
	for range 2000 {
		n := 1 + rng.IntN(maxProp)
		d, s := bc.alloc(&big, n)
		if s == nil || len(d) != n {
			t.Fatalf("%d-byte entry (max %d) not in a slab", n, maxProp)
		}
		pinned = append(pinned, s)
		if len(pinned) > 8 {
			pinned[0].unref()
			pinned = pinned[1:]
		}
	}
	for _, s := range pinned {
		s.unref()
	}
	allocs = testing.AllocsPerRun(1000, func() {
		d, s := bc.alloc(&big, maxProp/2)
		d[0] = 1
		s.unref()
	})
	if allocs > 0.01 {
		t.Fatalf("steady alloc/unref of batch-sized entries allocates %.2f per op", allocs)
	}
}

// TestSlabDoubleRelease: dropping a reference twice is a bug that would
// hand live data to a new owner; it panics rather than corrupt.
func TestSlabDoubleRelease(t *testing.T) {
	var pool slabPool
	var cur slabCursor
	_, s := cur.copy(&pool, []byte("x"))
	s.unref()
	cur.s.unref() // the cursor's own reference: refs reach 0, pooled
	cur.s = nil
	defer func() {
		if recover() == nil {
			t.Fatal("a third unref of a two-reference slab did not panic")
		}
	}()
	s.unref()
}
