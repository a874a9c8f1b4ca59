package kv

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// TestPersistGate: the captures of tables sharing a PersistGate of one
// token walk one at a time (the pollers then compete with one snapshot
// writer, not one per replica: issue 19), of two tokens two at most, and
// every snapshot is still its table's at capture. The walks are held at
// their start; synctest.Wait returns once every Persist is held or
// parked for a token, so the count of walks under way is exact, not
// timed. Planted persistUngated (the walks take no token): all four walk
// at once ("gate:").
func TestPersistGate(t *testing.T) {
	for _, tc := range []struct {
		tokens  int
		planted bool
	}{{1, false}, {2, false}, {1, true}} {
		t.Run(fmt.Sprintf("tokens=%d,planted=%v", tc.tokens, tc.planted), func(t *testing.T) {
			got := persistGateMax(t, tc.tokens, tc.planted)
			if over := got > tc.tokens; over != tc.planted {
				t.Fatalf("gate: %d walks at once with %d tokens (planted persistUngated %v)", got, tc.tokens, tc.planted)
			}
			t.Logf("%d walks at once with %d tokens", got, tc.tokens)
		})
	}
}

// persistGateMax persists four tables' captures at once, their walks
// held until every Persist is blocked, and returns how many walked then.
func persistGateMax(t *testing.T, tokens int, ungated bool) int {
	const tables = 4
	tbs := make([]*Table, tables)
	caps := make([]*capture, tables)
	want := make([][]byte, tables)
	for i := range tables {
		tbs[i], want[i] = closedTestTable(t)
		tbs[i].knobs.persistUngated = ungated
		c, err := tbs[i].Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		caps[i] = c.(*capture)
	}
	var most int
	synctest.Test(t, func(t *testing.T) {
		gate, release := make(chan struct{}, tokens), make(chan struct{})
		var active atomic.Int32
		for _, tb := range tbs {
			tb.cfg.PersistGate = gate
			tb.knobs.onPersistWalk = func() func() {
				active.Add(1)
				<-release
				return func() { active.Add(-1) }
			}
		}
		var wg sync.WaitGroup
		got := make([][]byte, tables)
		errs := make([]error, tables)
		for i := range tables {
			wg.Go(func() {
				got[i] = make([]byte, caps[i].Size())
				errs[i] = caps[i].Persist(got[i])
				caps[i].Release()
			})
		}
		synctest.Wait() // every Persist holds in its walk or waits for a token
		most = int(active.Load())
		close(release)
		wg.Wait()
		for i := range tables {
			if errs[i] != nil || !bytes.Equal(got[i], want[i]) {
				t.Fatalf("table %d: Persist %v, or its snapshot differs from the table's", i, errs[i])
			}
		}
		if len(gate) != 0 {
			t.Fatalf("%d tokens not given back", len(gate))
		}
	})
	return most
}

// TestGateQueuedWalkAfterClose is d54cd8d's crash: a capture's walk waits
// for the process's one token while its table is closed (kvserver's
// stop). Close does not wait for a walk not begun; once the walk has its
// token it refuses (ErrTableClosed) instead of reading the unmapped heap.
// Planted walkAfterClose is caught by "refuse:" (the walk started; the
// test's hook abandons it before it reads).
func TestGateQueuedWalkAfterClose(t *testing.T) {
	for _, planted := range []bool{false, true} {
		err := queuedWalkAfterClose(t, planted)
		switch {
		case !planted && err != nil:
			t.Fatal(err)
		case planted && (err == nil || !strings.HasPrefix(err.Error(), "refuse:")):
			t.Fatalf("planted walkAfterClose: %v, want refuse:", err)
		case planted:
			t.Logf("planted walkAfterClose caught: %v", err)
		}
	}
}

func queuedWalkAfterClose(t *testing.T, planted bool) error {
	a, wantA := closedTestTable(t)
	b, _ := closedTestTable(t)
	b.knobs.walkAfterClose = planted
	ca, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Release()
	cb, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Release()
	var out error
	synctest.Test(t, func(t *testing.T) {
		gate, release := make(chan struct{}, 1), make(chan struct{})
		a.cfg.PersistGate, b.cfg.PersistGate = gate, gate
		a.knobs.onPersistWalk = func() func() { <-release; return func() {} }
		b.knobs.onPersistWalk = func() func() { panic(errAbandoned) }
		gotA := make([]byte, ca.Size())
		resA := persistHeld(ca.(*capture), gotA)
		synctest.Wait() // a's walk holds the token
		resB := persistHeld(cb.(*capture), make([]byte, cb.Size()))
		synctest.Wait() // b's waits for it
		b.Close()       // returns: b's walk has not begun
		close(release)
		if err := <-resA; err != nil || !bytes.Equal(gotA, wantA) {
			t.Fatalf("table a: Persist %v, or its snapshot differs from the table's", err)
		}
		switch err := <-resB; {
		case errors.Is(err, errAbandoned):
			out = errors.New("refuse: the walk that waited for its token past its table's Close started walking the unmapped table")
		case !errors.Is(err, ErrTableClosed):
			out = fmt.Errorf("refuse: the walk that waited past Close returned %v, want ErrTableClosed", err)
		}
	})
	return out
}
