package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
)

// TestPlanBalanceLoad: with loads, the rule makes a move exactly when
// PlanBalance does, from a group with the most tablets to one with the
// fewest, and among the tied groups it takes the most loaded source and
// the least loaded target.
func TestPlanBalanceLoad(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		groups := 2 + rng.IntN(5)
		var tbs []client.TabletInfo
		for i := range rng.IntN(30) {
			tbs = append(tbs, client.TabletInfo{Low: []byte{byte(i)}, Group: uint32(rng.IntN(groups)), State: "serving"})
		}
		load := make([]uint64, groups)
		for g := range load {
			load[g] = uint64(rng.IntN(4))
		}
		_, _, _, want := client.PlanBalance(tbs, groups)
		low, from, to, ok := client.PlanBalanceLoad(tbs, groups, load)
		if ok != want {
			t.Fatalf("PlanBalance says %v, with loads %v: %v", want, load, ok)
		}
		if !ok {
			continue
		}
		count := make([]int, groups)
		var last []byte
		for _, tb := range tbs {
			count[tb.Group]++
			if tb.Group == from && string(tb.Low) >= string(last) {
				last = tb.Low
			}
		}
		if string(low) != string(last) {
			t.Fatalf("moves %q, not group %d's last tablet %q", low, from, last)
		}
		hi, lo := slices.Max(count), slices.Min(count)
		if count[from] != hi || count[to] != lo {
			t.Fatalf("counts %v: a move from %d to %d", count, from, to)
		}
		for g := range groups {
			if count[g] == hi && load[g] > load[from] || count[g] == lo && load[g] < load[to] {
				t.Fatalf("counts %v, loads %v: a move from %d to %d", count, load, from, to)
			}
		}
	}
}

// balancerCluster is a 3-group cluster whose keyspace "users" a load of
// 300 keys cut into 3 tablets, all in group 0 (early splits), with 4
// client slots.
func balancerCluster(t *testing.T, name string) (*localcluster.Cluster, *cluster.Map) {
	m := orderedMap(name, 3)
	m.Keyspaces[0].FirstTabletMax = 40
	for len(m.ClientNodes) < 4 {
		m.ClientNodes = append(m.ClientNodes, m.ClientNodes[len(m.ClientNodes)-1]+1)
	}
	lc := startLocal(t, m)
	c := open(t, lc, 0)
	ks := c.Keyspace("users")
	for i := range 300 {
		if _, err := ks.Put(context.Background(), fmt.Appendf(nil, "k%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	return lc, m
}

// tabletsOf is the tablets, and each group's count.
func tabletsOf(t *testing.T, c *client.Client) ([]client.TabletInfo, []int) {
	t.Helper()
	tbs, err := c.Tablets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	count := make([]int, len(c.Map().Groups))
	for _, tb := range tbs {
		if tb.State != "installing" {
			count[tb.Group]++
		}
	}
	return tbs, count
}

// waitCounts waits until the tablets read show count tablets per group
// (the directory is read from a replica of each group that may be a step
// behind).
func waitCounts(t *testing.T, c *client.Client, want []int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, count := tabletsOf(t, c)
		if slices.Equal(count, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tablets per group %v, want %v", count, want)
		}
	}
}

// checkAll wants the 300 keys with their values, in order.
func checkAll(t *testing.T, c *client.Client) {
	t.Helper()
	got := scanAll(t, c.Keyspace("users"), nil, nil)
	if len(got) != 300 {
		t.Fatalf("%d keys, want 300", len(got))
	}
	for i, kv := range got {
		if string(kv.Key) != fmt.Sprintf("k%04d", i) || string(kv.Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("pair %d is %s=%s", i, kv.Key, kv.Value)
		}
	}
}

// TestBalancerOneMoveAtATime: while an operator's move holds a tablet
// frozen, balancer rounds start no other move (and do not take the
// frozen one over before StuckAfter); once the operator's move is done,
// rounds balance the groups to one tablet each, one move a round, and
// every key is there. Planted ignoreBusy (the round plans from the
// serving tablets alone) starts a second move while the first is
// frozen, and the test catches it.
func TestBalancerOneMoveAtATime(t *testing.T) {
	for _, plant := range []string{"none", "ignoreBusy"} {
		t.Run(plant, func(t *testing.T) {
			lc, _ := balancerCluster(t, "balbusy"+plant)
			ctx := context.Background()
			op, bc := open(t, lc, 1), open(t, lc, 2)
			tbs, count := tabletsOf(t, op)
			if !slices.Equal(count, []int{3, 0, 0}) {
				t.Fatalf("after the load: tablets per group %v, want [3 0 0]", count)
			}
			frozen, release := make(chan struct{}), make(chan struct{})
			client.SetMoveHook(op, func(step string) {
				if step == "ingest" {
					close(frozen)
					<-release
				}
			})
			done := make(chan error, 1)
			go func() { done <- op.MoveTablet(ctx, tbs[0].Low, 2) }()
			<-frozen
			b := client.NewBalancer(client.BalancerConfig{StuckAfter: time.Hour})
			if plant == "ignoreBusy" {
				client.PlantBalancerIgnoreBusy(b)
			}
			var caught error
			for r := range 3 {
				if err := b.Round(ctx, bc); err != nil {
					t.Fatalf("round %d: %v", r, err)
				}
				now, _ := tabletsOf(t, bc)
				busy := 0
				for _, tb := range now {
					busy += b2i(tb.State != "serving")
				}
				st := b.Status()
				if st.Moves != 0 || busy != 1 || st.State != "waiting" {
					caught = fmt.Errorf("round %d while tablet %q is frozen: %d moves, %d tablets not serving, state %q (want no move while another is under way)", r, tbs[0].Low, st.Moves, busy, st.State)
					break
				}
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("the operator's move: %v", err)
			}
			switch {
			case plant == "none" && caught != nil:
				t.Fatal(caught)
			case plant != "none" && caught == nil:
				t.Fatalf("the planted %s was not caught", plant)
			case plant != "none":
				t.Logf("planted %s caught: %v", plant, caught)
				return
			}
			waitCounts(t, bc, []int{2, 0, 1})
			for r := 0; ; r++ {
				before := b.Status().Moves
				if err := b.Round(ctx, bc); err != nil {
					t.Fatalf("round: %v", err)
				}
				st := b.Status()
				if st.Moves > before+1 {
					t.Fatalf("one round made %d moves", st.Moves-before)
				}
				if st.State == "balanced" && st.Moves == before {
					break
				}
				if r > 200 {
					t.Fatalf("not balanced after %d rounds: %+v", r, st)
				}
				time.Sleep(10 * time.Millisecond)
			}
			waitCounts(t, bc, []int{1, 1, 1})
			if st := b.Status(); st.Moves != 1 || st.Last == nil || st.Last.Source != 0 || st.Last.Target != 1 || st.Last.Err != "" {
				t.Fatalf("status %+v, last %+v: want one move, from group 0 to 1", st, st.Last)
			}
			checkAll(t, bc)
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestBalancerTakesOver: an operator's move dies half way (its goroutine
// ends before the ingest, leaving the tablet frozen, or before the
// activation, leaving it installing at the target). The balancer waits
// StuckAfter with the tablet in that state, then finishes the move: the
// tablet serves at the target the operator named, and every key is
// there. Planted noTakeover (it never finishes another mover's move):
// the tablet stays frozen (installing), and the test catches it.
func TestBalancerTakesOver(t *testing.T) {
	for _, at := range []string{"ingest", "activate"} {
		for _, plant := range []string{"none", "noTakeover"} {
			t.Run(at+"/"+plant, func(t *testing.T) {
				lc, _ := balancerCluster(t, "baltake"+at+plant)
				op, bc := open(t, lc, 1), open(t, lc, 2)
				tbs, _ := tabletsOf(t, op)
				moveStopsBefore(t, op, tbs[0].Low, 2, at) // the operator's kvcli dies there
				// The directory is read from a replica of each group that
				// may not have applied the last step yet: wait for it.
				state := map[string]string{"ingest": "frozen", "activate": "installing"}[at]
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					left, _ := tabletsOf(t, bc)
					var busy []client.TabletInfo
					for _, tb := range left {
						if tb.State != "serving" {
							busy = append(busy, tb)
						}
					}
					if len(busy) == 1 && busy[0].State == state && string(busy[0].Low) == string(tbs[0].Low) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("tablets left: %+v, want tablet %q %s", left, tbs[0].Low, state)
					}
				}
				const stuck = 300 * time.Millisecond
				b := client.NewBalancer(client.BalancerConfig{StuckAfter: stuck})
				if plant == "noTakeover" {
					client.PlantBalancerNoTakeover(b)
				}
				t0 := time.Now()
				var err error
				// t1 is the end of the first round, which saw the tablet
				// busy: a round begun StuckAfter after it finishes the
				// move (the none case). The planted one is caught after 3
				// such rounds, not the whole 5 s.
				var t1 time.Time
				late := 0
				for time.Since(t0) < 5*time.Second && b.Status().Resumed == 0 {
					if plant == "noTakeover" && late >= 3 {
						break
					}
					if !t1.IsZero() && time.Since(t1) >= stuck {
						late++
					}
					if err = b.Round(context.Background(), bc); err != nil {
						t.Fatalf("round: %v", err)
					}
					if t1.IsZero() {
						t1 = time.Now()
					}
					if st := b.Status(); st.Resumed == 0 && st.State != "waiting" {
						t.Fatalf("state %q with a tablet %s", st.State, state)
					}
					time.Sleep(20 * time.Millisecond)
				}
				st := b.Status()
				now, _ := tabletsOf(t, bc)
				var got *client.TabletInfo
				for i, tb := range now {
					if string(tb.Low) == string(tbs[0].Low) {
						got = &now[i]
					}
				}
				if plant == "noTakeover" {
					if st.Resumed != 0 || got == nil || got.State == "serving" {
						t.Fatalf("the planted noTakeover finished the move: %+v %+v", st, got)
					}
					t.Logf("planted noTakeover caught: tablet %q still %s after %v (%d rounds past StuckAfter)", got.Low, got.State, time.Since(t0).Round(time.Millisecond), late)
					return
				}
				if st.Resumed != 1 || st.Moves != 1 || time.Since(t0) < stuck {
					t.Fatalf("status %+v after %v", st, time.Since(t0))
				}
				if got == nil || got.State != "serving" || got.Group != 2 {
					t.Fatalf("tablet after the take-over: %+v", got)
				}
				checkAll(t, bc)
			})
		}
	}
}

// TestKeyspaceDirGapDuringMove: a client reads each group's tablets
// from its near replica; after a move, the source's near replica has
// applied the drop while the target's (paused here) has not applied the
// ingest: the client's directory has a gap where the tablet is. A write
// to a key of the tablet waits for the gap to close (it is a move seen
// through replicas at different points) instead of failing with
// ErrDirGap, and succeeds once the replica catches up; so does a scan.
func TestKeyspaceDirGapDuringMove(t *testing.T) {
	lc := startLocal(t, orderedMap("gapmove", 2))
	ctx := context.Background()
	op := open(t, lc, 0)
	if _, err := op.Keyspace("users").Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	f := (lc.Leader(1) + 1) % 3 // a follower of group 1
	rc := open(t, lc, 1, client.WithNearReplica(f))
	lc.Pause(1, f)
	paused := true
	defer func() {
		if paused {
			lc.Resume(1, f)
		}
	}()
	if err := op.MoveTablet(ctx, []byte{}, 1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tbs, err := client.NearTablets(rc, ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(tbs) == 0 {
			break // group 0's replica f dropped, group 1's shows nothing yet
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gap: %+v", tbs)
		}
	}
	done := make(chan error, 2)
	go func() {
		_, err := rc.Keyspace("users").Put(ctx, []byte("b"), []byte("2"))
		done <- err
	}()
	go func() {
		var err error
		for _, e := range rc.Keyspace("users").Scan(ctx, nil, nil) {
			if e != nil {
				err = e
			}
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	lc.Resume(1, f)
	paused = false
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("through the gap: %v", err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if v, err := rc.Keyspace("users").Get(ctx, []byte("b")); err != nil || string(v) != "2" {
		t.Fatalf("get b: %q %v", v, err)
	}
}

// TestBalancerAbortsFailingMove: the balancer's move fails after the
// freeze every time (its round's context ends before the ingest, as a
// target refusing the ingest would fail it). The next rounds try to
// finish it, and after 3 failures in a row the balancer undoes it: the
// tablet serves at its source again (writes to it go through), every
// key is there, and the balancer makes no move for the next rounds.
// Planted noAbort (it never undoes its move) leaves the tablet frozen
// round after round, and the test catches it.
func TestBalancerAbortsFailingMove(t *testing.T) {
	for _, plant := range []string{"none", "noAbort"} {
		t.Run(plant, func(t *testing.T) { balancerAbortsFailingMove(t, plant) })
	}
}

func balancerAbortsFailingMove(t *testing.T, plant string) {
	lc, _ := balancerCluster(t, "balabort"+plant)
	bc := open(t, lc, 2)
	var mu sync.Mutex
	var cancelRound context.CancelFunc
	ingests := 0
	b := client.NewBalancer(client.BalancerConfig{StuckAfter: time.Hour, BeforeStep: func(step string) {
		if step == "ingest" {
			mu.Lock()
			ingests++
			cancelRound()
			mu.Unlock()
		}
	}})
	round := func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mu.Lock()
		cancelRound = cancel
		mu.Unlock()
		return b.Round(ctx, bc)
	}
	if plant == "noAbort" {
		client.PlantBalancerNoAbort(b)
	}
	for r := 0; b.Status().Aborted == 0; r++ {
		mu.Lock()
		tried := ingests
		mu.Unlock()
		if plant == "noAbort" && tried >= 2*3 {
			// The balancer undoes its move on the round after its 3rd
			// failed ingest (the none case checks exactly 3): twice that
			// many without an abort is the planted bug.
			tbs, _ := tabletsOf(t, bc)
			t.Logf("planted noAbort caught: no abort after %d rounds, %d ingests tried, tablets %+v", r, tried, tbs)
			return
		}
		if r > 20 {
			tbs, _ := tabletsOf(t, bc)
			if plant == "noAbort" {
				t.Logf("planted noAbort caught: no abort after %d rounds, %d ingests tried, tablets %+v", r, ingests, tbs)
				return
			}
			t.Fatalf("no abort after %d rounds: %+v, tablets %+v", r, b.Status(), tbs)
		}
		round()
		time.Sleep(10 * time.Millisecond)
	}
	if plant != "none" {
		t.Fatalf("the planted %s was not caught", plant)
	}
	st := b.Status()
	if ingests != 3 || st.Moves != 0 || st.Errors < 3 || st.State != "paused after an aborted move" {
		t.Fatalf("after the abort: %d ingests tried, status %+v", ingests, st)
	}
	waitCounts(t, bc, []int{3, 0, 0})
	tbs, _ := tabletsOf(t, bc)
	for _, tb := range tbs {
		if tb.State != "serving" {
			t.Fatalf("after the abort: %+v", tbs)
		}
	}
	checkAll(t, bc)
	if _, err := bc.Keyspace("users").Put(context.Background(), []byte("k0299"), []byte("v299")); err != nil {
		t.Fatalf("a write to the tablet after the abort: %v", err)
	}
	for r := range 5 {
		if err := round(); err != nil || b.Status().Moves != 0 || ingests != 3 {
			t.Fatalf("round %d after the abort: %v, %d ingests, %+v", r, err, ingests, b.Status())
		}
	}
}

// TestBalancerUndoAfterDrop: the balancer undoes a move only while the
// source holds the tablet. Here its directory is read from a replica of
// the source that stopped (paused) after the freeze, so it shows the
// tablet frozen although the source's leader already dropped it and the
// target holds the only copy (installing). undoMove refuses: the
// source's ownership changed, so the target keeps the tablet; the move
// then completes and every key is there; so does AbortTabletMove (an
// operator's kvcli abort-move, which told the target first and lost the
// keys). The planted undoUnchecked
// (the target forgets the tablet without the check) loses the keys, and
// the test catches it.
func TestBalancerUndoAfterDrop(t *testing.T) {
	for _, plant := range []string{"none", "undoUnchecked", "operator"} {
		t.Run(plant, func(t *testing.T) {
			lc := startLocal(t, orderedMap("balundo"+plant, 2))
			ctx := context.Background()
			op := open(t, lc, 0)
			ks := op.Keyspace("users")
			for i := range 100 {
				if _, err := ks.Put(ctx, fmt.Appendf(nil, "k%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			f := (lc.Leader(0) + 1) % 3 // a follower of group 0
			bc := open(t, lc, 1, client.WithNearReplica(f))
			if plant == "undoUnchecked" {
				client.PlantUndoUnchecked(bc)
			}
			atActivate, release := make(chan struct{}), make(chan struct{})
			paused := false
			client.SetMoveHook(op, func(step string) {
				switch step {
				case "drop":
					// Replica f of group 0 has the freeze, not the drop.
					for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
						tbs, err := client.NearTablets(bc, ctx)
						if err == nil && len(tbs) > 0 && tbs[0].State == "frozen" {
							break
						}
						if time.Now().After(deadline) {
							t.Errorf("replica %d of group 0 does not show the freeze: %+v %v", f, tbs, err)
							break
						}
					}
					lc.Pause(0, f)
					paused = true
				case "activate":
					close(atActivate)
					<-release
				}
			})
			done := make(chan error, 1)
			go func() { done <- op.MoveTablet(ctx, []byte{}, 1) }()
			<-atActivate
			var err error
			if plant == "operator" {
				// kvcli abort-move: the same undoing.
				err = bc.AbortTabletMove(ctx, []byte{})
			} else {
				err = client.UndoMove(bc, ctx, []byte{})
			}
			t.Logf("undo with the source dropped: %v", err)
			lc.Resume(0, f)
			close(release)
			merr := <-done
			if !paused {
				t.Fatal("replica f was not paused")
			}
			n := 0
			for _, e := range op.Keyspace("users").Scan(ctx, nil, nil) {
				if e == nil {
					n++
				}
			}
			switch {
			case plant != "undoUnchecked" && (err == nil || merr != nil || n != 100):
				t.Fatalf("undo: %v; the move: %v; %d keys, want 100", err, merr, n)
			case plant == "undoUnchecked" && n == 100:
				t.Fatalf("the planted %s was not caught: %d keys", plant, n)
			case plant == "undoUnchecked":
				t.Logf("planted %s caught: %d of 100 keys left (the move: %v)", plant, n, merr)
			}
		})
	}
}
