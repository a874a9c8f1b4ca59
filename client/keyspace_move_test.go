package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/kv"
)

// tabletGroup is the group whose tablets hold internal key ik, by c's
// fresh read of the groups' tablets.
func tabletGroup(t *testing.T, c *client.Client, ik []byte) uint32 {
	t.Helper()
	tbs, err := c.Tablets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tbs {
		if tb.State != "installing" && string(ik) >= string(tb.Low) && (tb.HighInf || string(ik) < string(tb.High)) {
			return tb.Group
		}
	}
	t.Fatalf("no tablet holds %q: %+v", ik, tbs)
	return 0
}

// TestKeyspaceMoveStaleReader: a client reads keys of a tablet of group
// 0, then another client moves the tablet to group 1 (group 0 drops its
// keys). The first client's directory is stale: its gets and scans go to
// group 0, whose ownership version changed, so they fail the check, read
// the directory again and answer from group 1, in both consistencies.
// The planted skipOwnCheck (the reader does not check) answers from
// group 0, which no longer has the keys: the gets say not found and the
// scan is empty.
func TestKeyspaceMoveStaleReader(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			lc := startLocal(t, tabletMap(fmt.Sprint("ksmovestale", plant), 2, "m"))
			ctx := context.Background()
			r := open(t, lc, 0)
			if plant {
				client.SetPlantReader(r, kv.PlantSkipOwnCheck)
			}
			ks := r.Keyspace("users")
			keys := []string{"apple", "banana", "cherry"}
			for _, k := range keys {
				if _, err := ks.Put(ctx, []byte(k), []byte("v-"+k)); err != nil {
					t.Fatal(err)
				}
			}
			for _, mode := range []client.Consistency{client.Linearizable, client.StaleOK} {
				for _, k := range keys {
					// A stale-ok get reads the near replica, which may not
					// have applied the put yet (seen under -race in CI).
					deadline := time.Now().Add(10 * time.Second)
					for {
						it, err := ks.GetItem(ctx, []byte(k), mode)
						if err == nil && string(it.Value) == "v-"+k {
							break
						}
						if mode == client.Linearizable || time.Now().After(deadline) {
							t.Fatalf("get %s (%v) before the move: %q %v", k, mode, it.Value, err)
						}
						time.Sleep(time.Millisecond)
					}
				}
			}
			op := open(t, lc, 1)
			if err := op.MoveTablet(ctx, []byte{}, 1); err != nil {
				t.Fatal(err)
			}
			if g := tabletGroup(t, op, []byte("\x01apple")); g != 1 {
				t.Fatalf("after the move the tablet is in group %d", g)
			}
			// Stale-ok reads go to the near replica: wait until group 0's
			// replicas all applied the drop (their headers say so).
			waitApplied(t, lc, 0)
			wrong := 0
			for _, mode := range []client.Consistency{client.Linearizable, client.StaleOK} {
				for _, k := range keys {
					it, err := ks.GetItem(ctx, []byte(k), mode)
					switch {
					case plant && errors.Is(err, client.ErrNotFound):
						wrong++
					case err != nil || string(it.Value) != "v-"+k:
						t.Fatalf("mode %v: get %s after the move through a stale directory: %q %v", mode, k, it.Value, err)
					}
				}
			}
			got := scanAll(t, ks, nil, nil)
			if len(got) != len(keys) {
				if !plant {
					t.Fatalf("scan after the move: %v", got)
				}
				wrong++
			}
			switch {
			case !plant && wrong != 0:
				t.Fatal("wrong answers without the plant")
			case plant && wrong == 0:
				t.Fatal("the planted skipOwnCheck was not caught: every read answered right through a stale directory")
			case plant:
				t.Logf("planted skipOwnCheck caught: %d reads answered from the group the tablet left", wrong)
			}
		})
	}
}

// waitApplied waits until every replica of group g has applied what its
// leader has.
func waitApplied(t *testing.T, lc interface {
	Do(g, i int, f func(*kv.Replica)) error
	Leader(g int) int
}, g int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var lead uint64
		lc.Do(g, lc.Leader(g), func(r *kv.Replica) { lead = r.Table().OrderedPart().(*btree.Store).OwnVersion() })
		ok := true
		for i := range 3 {
			var v uint64
			lc.Do(g, i, func(r *kv.Replica) { v = r.Table().OrderedPart().(*btree.Store).OwnVersion() })
			ok = ok && v == lead
		}
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("group %d's replicas did not converge", g)
}

// TestKeyspaceMoveLinearizable: writers, readers and scanners on the
// keys of one tablet while an operator moves the tablet between the two
// groups and back, pausing between the steps; porcupine checks the
// history. Writes to the frozen tablet wait (StatusMoving) and go to the
// new group; a second client only reads, so its directory stays as it
// was until a read fails the ownership check. Planted bugs, each caught
// as not linearizable: writeDuringMove (the source applies writes to
// the frozen tablet after the mover read it: an acknowledged write is
// lost) and activateFirst (the mover activates the target before the
// source drops the tablet: the reading client reads the source's frozen
// state after writes at the target were acknowledged), and skipOwnCheck
// in the reading client (it reads the source after the drop: keys that
// are there read as absent).
func TestKeyspaceMoveLinearizable(t *testing.T) {
	for _, plant := range []string{"none", "writeDuringMove", "activateFirst", "skipOwnCheck"} {
		t.Run(plant, func(t *testing.T) {
			keyspaceMoveLinearizable(t, plant, false)
		})
	}
}

// moveAttempts bounds the runs of a planted variant: a plant is caught
// only if the workers' operations land in its window (activateFirst: a
// write at the target and a read at the source between the activate and
// the drop), which one run on a loaded machine may miss (CI under -race
// at load 38 missed activateFirst once).
const moveAttempts = 3

// TestKeyspaceMoveLeaderStops: TestKeyspaceMoveLinearizable's history
// while the first move loses the source group's leader after the freeze
// and the target group's leader after the ingest (each stopped for good:
// the move's steps are sent again to the new leaders, and the groups go
// on with two replicas).
func TestKeyspaceMoveLeaderStops(t *testing.T) {
	keyspaceMoveLinearizable(t, "none", true)
}

func keyspaceMoveLinearizable(t *testing.T, plant string, stopLeaders bool) {
	attempts := 1
	if plant != "none" {
		attempts = moveAttempts
	}
	for a := range attempts {
		ops, moves, err := keyspaceMoveRun(t, plant, stopLeaders, a)
		switch {
		case plant == "none" && err != nil:
			t.Fatalf("%d ops, %d moves: %v", ops, moves, err)
		case plant == "none":
			t.Logf("%d ops over %d moves: linearizable", ops, moves)
			return
		case err != nil:
			t.Logf("planted %s caught in run %d: %v", plant, a+1, err)
			return
		}
		t.Logf("run %d: the planted %s was not caught (%d ops, %d moves)", a+1, plant, ops, moves)
	}
	t.Fatalf("the planted %s was not caught in %d runs", plant, attempts)
}

// keyspaceMoveRun is one run of keyspaceMoveLinearizable: its history's
// op and move counts and the linearizability check's verdict.
func keyspaceMoveRun(t *testing.T, plant string, stopLeaders bool, attempt int) (ops, moves int, _ error) {
	m := tabletMap(fmt.Sprintf("ksmovelin%s%v%d", plant, stopLeaders, attempt), 2, "m")
	m.ClientNodes = append(m.ClientNodes, m.ClientNodes[len(m.ClientNodes)-1]+1) // a third client
	lc := startLocal(t, m)
	if plant == "writeDuringMove" {
		for g := range 2 {
			for i := range 3 {
				if err := lc.Do(g, i, func(r *kv.Replica) { btree.PlantWriteDuringMove(r.Table().OrderedPart().(*btree.Store)) }); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d"}
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	rc := open(t, lc, 2, client.WithTimeout(time.Minute)) // reads only
	op := open(t, lc, 1, client.WithTimeout(time.Minute))
	switch plant {
	case "activateFirst":
		client.PlantActivateFirst(op)
	case "skipOwnCheck":
		client.SetPlantReader(rc, kv.PlantSkipOwnCheck)
	}
	var steps []string
	stopped := 0
	client.SetMoveHook(op, func(step string) {
		steps = append(steps, step)
		if stopLeaders && stopped < 2 && len(steps) > 1 && (step == "ingest" && steps[len(steps)-2] == "freeze" || step == "activate") {
			g := 0 // the first move's source, then its target
			if step == "activate" {
				g = 1
			}
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
				if l := lc.Leader(g); l >= 0 {
					lc.Stop(g, l)
					stopped++
					break
				}
			}
		}
		if step == "drop" || step == "freeze" {
			time.Sleep(50 * time.Millisecond) // let the workers run against the frozen tablet
		}
	})
	h := newKsHistory()
	var stop atomic.Bool
	const workers, readers = 5, 2
	wait := goWorkers(workers+readers, func(w int) error {
		rng := rand.New(rand.NewPCG(uint64(w), 19))
		ks, reader := c.Keyspace("users"), w >= workers
		if reader {
			ks = rc.Keyspace("users")
		}
		for i := 0; !stop.Load() && i < 4000; i++ {
			time.Sleep(500 * time.Microsecond) // a history porcupine checks quickly
			o := kvcheck.Op{Client: w, Key: keys[rng.IntN(len(keys))]}
			r := rng.IntN(10)
			if reader {
				r = 5 + r%3 // gets, and a scan now and then
			}
			switch {
			case r < 5:
				o.Kind, o.Value = kvcheck.Put, fmt.Sprintf("w%d-%d", w, i)
			case r < 8:
				o.Kind = kvcheck.Get
			default:
				o.Kind, o.Key, o.End = kvcheck.Scan, "a", "e"
			}
			o, err := h.do(ctx, ks, o)
			if err != nil {
				return err
			}
			h.add(o)
		}
		return nil
	})
	var moveErr error
	for _, to := range []uint32{1, 0, 1, 0} {
		time.Sleep(20 * time.Millisecond)
		if err := op.MoveTablet(ctx, []byte{}, to); err != nil {
			moveErr = fmt.Errorf("move to %d: %w", to, err)
			break
		}
		moves++
	}
	stop.Store(true)
	werr := wait()
	if stopLeaders && stopped != 2 {
		t.Errorf("stopped %d leaders, want 2", stopped)
	}
	if err := errors.Join(werr, moveErr); err != nil {
		t.Fatal(err)
	}
	return len(h.ops), moves, h.check(t)
}

// TestTabletsAfterMoveLinearizable: Tablets right after MoveTablet
// returned names the tablet's new group even when this client's near
// replica of the target group has not applied the move (it is paused:
// its memory is still readable one-sided). Tablets reads each group's
// leader linearizably; reading the near member, as routing does, showed
// the moved tablet nowhere (CI under -race: "no tablet holds"). And a
// get through another client with the same near replica, whose
// directory still names the source, finds the key: its stale-ok
// re-read of the directory has a gap where the tablet was, and it reads
// the directory again linearizably instead of failing.
func TestTabletsAfterMoveLinearizable(t *testing.T) {
	m := tabletMap("ksmovelin", 2, "m")
	m.ClientNodes = append(m.ClientNodes, m.ClientNodes[len(m.ClientNodes)-1]+1) // a third client
	lc := startLocal(t, m)
	ctx := context.Background()
	lag := (lc.Leader(1) + 1) % 3
	w := open(t, lc, 0, client.WithNearReplica(lag))
	ks := w.Keyspace("users")
	for _, k := range []string{"apple", "banana", "melon"} {
		if _, err := ks.Put(ctx, []byte(k), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	op := open(t, lc, 1, client.WithNearReplica(lag))
	if g := tabletGroup(t, op, []byte("\x01apple")); g != 0 {
		t.Fatalf("before the move the tablet is in group %d", g)
	}
	lc.Pause(1, lag)
	defer lc.Resume(1, lag)
	if err := op.MoveTablet(ctx, []byte{}, 1); err != nil {
		t.Fatal(err)
	}
	if g := tabletGroup(t, op, []byte("\x01apple")); g != 1 {
		t.Fatalf("after the move the tablet is in group %d", g)
	}
	if it, err := ks.GetItem(ctx, []byte("apple"), client.Linearizable); err != nil || string(it.Value) != "v" {
		t.Fatalf("get after the move: %q %v", it.Value, err)
	}
	// A scan through a third client with the same near replica, whose
	// first (stale-ok) directory read has the gap.
	sc := open(t, lc, 2, client.WithNearReplica(lag))
	if err := func() error { _, err := client.KeyspaceDirectory(sc.Keyspace("users")); return err }(); err != nil {
		t.Fatal(err)
	}
	if got := scanAll(t, sc.Keyspace("users"), nil, nil); len(got) != 3 {
		t.Fatalf("scan after the move: %v", got)
	}
}
