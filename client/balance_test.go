package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/kv"
)

// TestPlanBalance: the rule moves a tablet from the group with the most
// to the group with the fewest only when they differ by 2 or more;
// applied again and again to random placements it ends with every
// group within 1 of every other, each move narrowing the spread or
// keeping it while lowering the count of the fullest groups; it never
// moves while a tablet is not serving.
func TestPlanBalance(t *testing.T) {
	mk := func(groups []uint32) []client.TabletInfo {
		var out []client.TabletInfo
		for i, g := range groups {
			out = append(out, client.TabletInfo{Low: []byte{byte(i)}, Group: g, State: "serving"})
		}
		return out
	}
	if _, _, _, ok := client.PlanBalance(mk([]uint32{0}), 2); ok {
		t.Fatal("a move for counts [1 0]")
	}
	busy := mk([]uint32{0, 0, 0})
	busy[1].State = "frozen"
	if _, _, _, ok := client.PlanBalance(busy, 2); ok {
		t.Fatal("a move while a move is under way")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		groups := 2 + rng.IntN(6)
		var gs []uint32
		for range rng.IntN(40) {
			gs = append(gs, uint32(rng.IntN(groups)))
		}
		tbs := mk(gs)
		for moves := 0; ; moves++ {
			if moves > len(tbs) {
				t.Fatalf("no end after %d moves: %v", moves, gs)
			}
			low, from, to, ok := client.PlanBalance(tbs, groups)
			if !ok {
				break
			}
			n := 0
			for i := range tbs {
				if string(tbs[i].Low) == string(low) {
					if tbs[i].Group != from {
						t.Fatalf("tablet %q is in group %d, the plan says %d", low, tbs[i].Group, from)
					}
					tbs[i].Group = to
					n++
				}
			}
			if n != 1 {
				t.Fatalf("the plan names %d tablets", n)
			}
		}
		count := make([]int, groups)
		for _, tb := range tbs {
			count[tb.Group]++
		}
		lo, hi := count[0], count[0]
		for _, c := range count {
			lo, hi = min(lo, c), max(hi, c)
		}
		if hi-lo > 1 {
			t.Fatalf("balanced to %v", count)
		}
	}
}

// TestKeyspaceBalanceSpreads: a keyspace without split points (as the
// embedded cluster declares it) starts in group 0; a load cuts it into as
// many tablets as groups early (FirstTabletMax), Balance spreads them, one
// per group, while writers go on, and every acknowledged write is there
// afterwards, in every group's share.
func TestKeyspaceBalanceSpreads(t *testing.T) {
	m := orderedMap("ksbalance", 3)
	m.Keyspaces[0].FirstTabletMax = 40
	lc := startLocal(t, m)
	ctx := context.Background()
	c := open(t, lc, 0)
	ks := c.Keyspace("users")
	var wg sync.WaitGroup
	put := func(from, to int) {
		for w := range 4 {
			wg.Go(func() {
				for i := from + w; i < to; i += 4 {
					if _, err := ks.Put(ctx, fmt.Appendf(nil, "k%04d", i), []byte("v")); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	put(0, 300)
	wg.Wait()
	op := open(t, lc, 1)
	tbs, err := op.Tablets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tbs) != 3 {
		t.Fatalf("after the load: %d tablets, want 3 (early splits)", len(tbs))
	}
	put(300, 600) // writes while the tablets move
	n, err := op.Balance(ctx, 0)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("Balance made %d moves, want 2 or more (the writers go on splitting)", n)
	}
	tbs, _ = op.Tablets(ctx)
	per := map[uint32]int{}
	for _, tb := range tbs {
		per[tb.Group]++
	}
	if len(per) != 3 {
		t.Fatalf("tablets after Balance: %+v", tbs)
	}
	got := scanAll(t, ks, nil, nil)
	if len(got) != 600 {
		t.Fatalf("scan after the moves: %d keys, want 600", len(got))
	}
	for g := range 3 {
		keys := 0
		if err := lc.Do(g, lc.Leader(g), func(r *kv.Replica) { keys = r.Table().OrderedPart().(*btree.Store).Tree().Len() }); err != nil {
			t.Fatal(err)
		}
		if keys == 0 {
			t.Errorf("group %d's leader holds no keys", g)
		}
	}
}
