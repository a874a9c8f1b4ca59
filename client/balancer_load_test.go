package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/client"
)

// tabletsLoaded are serving tablets, one per entry of groups (low fence
// byte i), with keys keys each.
func tabletsLoaded(groups []uint32, keys uint64) []client.TabletInfo {
	var out []client.TabletInfo
	for i, g := range groups {
		out = append(out, client.TabletInfo{Low: []byte{byte(i)}, Group: g, State: "serving", Keys: keys, HasLoad: true})
	}
	return out
}

// TestPlanBalanceWrites: the rule by load on cases worked by hand: a hot
// tablet that is not all of its group's load moves to the idle group
// though the counts are even; no move within the hysteresis (the count
// rule is not asked either); a tablet that is all of the imbalance is
// not moved (that would only swap it) but split, and not split with too
// few keys; too few writes, unknown loads or a tablet not serving leave
// the decision to the rule by count.
func TestPlanBalanceWrites(t *testing.T) {
	plan := func(gs []uint32, loads []uint64, groups int, keys uint64) (string, bool) {
		low, from, to, split, ok, byLoad := client.PlanBalanceWrites(tabletsLoaded(gs, keys), loads, groups, 100, 64)
		switch {
		case !ok:
			return "none", byLoad
		case split:
			return fmt.Sprintf("split %d in %d", low[0], from), byLoad
		}
		return fmt.Sprintf("move %d from %d to %d", low[0], from, to), byLoad
	}
	for _, c := range []struct {
		name   string
		gs     []uint32
		loads  []uint64
		groups int
		keys   uint64
		want   string
		byLoad bool
	}{
		{"hot tablet moves", []uint32{0, 0, 0, 1, 1, 1}, []uint64{500, 100, 100, 0, 0, 0}, 2, 100, "move 0 from 0 to 1", true},
		{"to the least loaded", []uint32{0, 0, 1, 2}, []uint64{600, 400, 300, 10}, 3, 100, "move 1 from 0 to 2", true},
		{"within the hysteresis", []uint32{0, 0, 0, 0, 1}, []uint64{250, 250, 250, 250, 800}, 2, 100, "none", true},
		{"a move would swap", []uint32{0, 1}, []uint64{1000, 0}, 2, 100, "split 0 in 0", true},
		{"hot and too small to split", []uint32{0, 1}, []uint64{1000, 0}, 2, 10, "none", true},
		{"hot tablet of a group of three", []uint32{0, 0, 0, 1, 1, 1, 2, 2, 2}, []uint64{800, 100, 100, 100, 100, 100, 100, 100, 100}, 3, 100, "split 0 in 0", true},
		{"too few writes", []uint32{0, 0, 0, 1}, []uint64{30, 30, 30, 0}, 2, 100, "none", false},
	} {
		got, byLoad := plan(c.gs, c.loads, c.groups, c.keys)
		if got != c.want || byLoad != c.byLoad {
			t.Errorf("%s: %s (by load %v), want %s (%v)", c.name, got, byLoad, c.want, c.byLoad)
		}
	}
	tbs := tabletsLoaded([]uint32{0, 0, 1}, 100)
	if _, _, _, _, _, byLoad := client.PlanBalanceWrites(tbs, nil, 2, 100, 64); byLoad {
		t.Error("decided by load without loads")
	}
	tbs[2].State = "frozen"
	if _, _, _, _, _, byLoad := client.PlanBalanceWrites(tbs, []uint64{900, 900, 0}, 2, 100, 64); byLoad {
		t.Error("decided by load while a tablet moves")
	}
}

// TestPlanBalanceWritesConverges: at constant per-tablet loads, moves
// made one after the other by the rule end; each takes load off the most
// loaded group and leaves both groups it touches below that group's load
// before, so the most loaded group's load never grows and no move puts
// back the tablet the last one moved (no ping-pong).
func TestPlanBalanceWritesConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	moved := 0
	for range 500 {
		groups := 2 + rng.IntN(5)
		n := 1 + rng.IntN(25)
		gs := make([]uint32, n)
		loads := make([]uint64, n)
		for i := range gs {
			gs[i] = uint32(rng.IntN(groups))
			if rng.IntN(3) > 0 {
				loads[i] = uint64(rng.IntN(1000))
			}
		}
		tbs := tabletsLoaded(gs, 10) // too few keys to split: moves only
		groupLoad := func() []uint64 {
			L := make([]uint64, groups)
			for i, tb := range tbs {
				L[tb.Group] += loads[i]
			}
			return L
		}
		lastLow, lastFrom := -1, uint32(0)
		for step := 0; ; step++ {
			if step > 10*n {
				t.Fatalf("no end after %d moves: groups %v loads %v", step, gs, loads)
			}
			low, from, to, split, ok, _ := client.PlanBalanceWrites(tbs, loads, groups, 1, 64)
			if split {
				t.Fatalf("a split of a tablet of 10 keys")
			}
			if !ok {
				break
			}
			before := groupLoad()
			i := int(low[0])
			if tbs[i].Group != from || from == to || before[from] != slices.Max(before) {
				t.Fatalf("move of tablet %d from %d to %d: it is in %d, loads %v", i, from, to, tbs[i].Group, before)
			}
			if i == lastLow && to == lastFrom {
				t.Fatalf("tablet %d moved back to group %d (ping-pong), loads %v", i, to, before)
			}
			tbs[i].Group = to
			after := groupLoad()
			if after[from] >= before[from] || after[to] >= before[from] {
				t.Fatalf("move of tablet %d (load %d) from %d to %d: loads %v then %v", i, loads[i], from, to, before, after)
			}
			lastLow, lastFrom = i, from
			moved++
		}
	}
	if moved < 100 {
		t.Fatalf("only %d moves over the cases: the test wants more", moved)
	}
}

// TestBalancerMovesHotTablet: a skewed workload in process. After the
// count rule spread the keyspace (one tablet a group, group 1's the big
// one), writes go to keys of group 1's tablet only; the balancer, by
// load, splits that hot tablet and moves a half away, so the hot keys
// end served by two groups, every key kept. The planted ignoreLoad (the
// rule by count alone: one tablet a group looks balanced) leaves them on
// one group, and the test catches it.
func TestBalancerMovesHotTablet(t *testing.T) {
	for _, plant := range []string{"none", "ignoreLoad"} {
		t.Run(plant, func(t *testing.T) {
			lc, _ := balancerCluster(t, "balhot"+plant)
			ctx := context.Background()
			c := open(t, lc, 1)
			if _, err := c.Balance(ctx, 0); err != nil {
				t.Fatal(err)
			}
			waitCounts(t, c, []int{1, 1, 1})
			ks, err := c.Map().FindKeyspace("users")
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := ks.InternalKey(nil, []byte("k0100")), ks.InternalKey(nil, []byte("k0300"))
			hotGroups := func() map[uint32]bool {
				tbs, _ := tabletsOf(t, c)
				gs := map[uint32]bool{}
				for _, tb := range tbs {
					if (tb.HighInf || string(tb.High) > string(lo)) && string(tb.Low) < string(hi) {
						gs[tb.Group] = true
					}
				}
				return gs
			}
			if gs := hotGroups(); len(gs) != 1 {
				t.Fatalf("before the workload the hot keys are in groups %v, want one", gs)
			}
			var logs strings.Builder
			b := client.NewBalancer(client.BalancerConfig{MinWrites: 100, SplitKeys: 20, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			if plant == "ignoreLoad" {
				client.PlantBalancerIgnoreLoad(b)
			}
			users := c.Keyspace("users")
			rng := rand.New(rand.NewPCG(1, 1))
			var gs map[uint32]bool
			for r := range 12 {
				for range 300 {
					i := 100 + rng.IntN(200)
					if _, err := users.Put(ctx, fmt.Appendf(nil, "k%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Round(ctx, c); err != nil {
					t.Fatalf("round %d: %v", r, err)
				}
				if gs = hotGroups(); len(gs) >= 2 {
					break
				}
			}
			st := b.Status()
			switch {
			case plant == "none" && len(gs) < 2:
				t.Fatalf("after the rounds the hot keys are in groups %v (status %+v, last %+v), want two or more", gs, st, st.Last)
			case plant != "none" && len(gs) >= 2:
				t.Fatalf("the planted %s was not caught: the hot keys are in groups %v", plant, gs)
			case plant != "none":
				t.Logf("planted %s caught: the hot keys stay in groups %v (status: %d moves, %d splits)", plant, gs, st.Moves, st.Splits)
				return
			}
			if st.Splits < 1 || st.Last == nil || st.Last.Rule != "load" || st.Last.Err != "" || len(st.Writes) != 3 || st.Writes[1] == 0 {
				t.Fatalf("status %+v, last %+v: want a split and a move by load", st, st.Last)
			}
			t.Logf("the balancer's log:\n%s", logs.String())
			tbs, _ := tabletsOf(t, c)
			for _, tb := range tbs {
				if !tb.HasLoad {
					t.Fatalf("tablet %q read without its load", tb.Low)
				}
			}
			checkAll(t, c)
		})
	}
}
