package kv

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPersistGate: the captures of tables sharing a PersistGate of one
// token walk one at a time (the pollers then compete with one snapshot
// writer, not one per replica: issue 19), of two tokens two at most, and
// every snapshot is still its table's at capture. Planted persistUngated
// (the walks take no token): all of them walk at once.
func TestPersistGate(t *testing.T) {
	for _, tc := range []struct {
		tokens  int
		planted bool
	}{{1, false}, {2, false}, {1, true}} {
		t.Run(fmt.Sprintf("tokens=%d,planted=%v", tc.tokens, tc.planted), func(t *testing.T) {
			got := persistGateMax(t, tc.tokens, tc.planted)
			t.Logf("at most %d walks at once", got)
			if over := int(got) > tc.tokens; over != tc.planted {
				t.Fatalf("%d walks at once with %d tokens (planted persistUngated %v): the gate did not bound them", got, tc.tokens, tc.planted)
			}
		})
	}
}

// persistGateMax persists four tables' captures at once, each walk held
// for 20 ms, and returns the most walks that ran at once.
func persistGateMax(t *testing.T, tokens int, ungated bool) int32 {
	gate := make(chan struct{}, tokens)
	var active, most atomic.Int32
	hold := func() func() {
		n := active.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		return func() { active.Add(-1) }
	}
	const tables = 4
	caps := make([]*capture, tables)
	want := make([][]byte, tables)
	for i := range tables {
		tb, _ := soloTable(t, TableConfig{LogBuckets: 4, PersistGate: gate})
		tb.knobs.persistUngated, tb.knobs.onPersistWalk = ungated, hold
		for k := range 20 {
			if res := put(tb, uint64(k+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "t%dk%d", i, k), Value: fmt.Appendf(nil, "v%d", k)}); res.Status != StatusOK {
				t.Fatalf("table %d put %d: %+v", i, k, res)
			}
		}
		c, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		caps[i] = c.(*capture)
		want[i] = persistOf(t, tb)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	got := make([][]byte, tables)
	errs := make([]error, tables)
	for i := range tables {
		wg.Go(func() {
			<-start
			got[i] = make([]byte, caps[i].Size())
			errs[i] = caps[i].Persist(got[i])
			caps[i].Release()
		})
	}
	close(start)
	wg.Wait()
	for i := range tables {
		if errs[i] != nil || !bytes.Equal(got[i], want[i]) {
			t.Fatalf("table %d: Persist %v, or its snapshot differs from the table's", i, errs[i])
		}
	}
	if len(gate) != 0 {
		t.Fatalf("%d tokens not given back", len(gate))
	}
	return most.Load()
}

// persistOf is the table's snapshot now, persisted with no hook.
func persistOf(t *testing.T, tb *Table) []byte {
	t.Helper()
	h := tb.knobs.onPersistWalk
	tb.knobs.onPersistWalk = nil
	defer func() { tb.knobs.onPersistWalk = h }()
	c, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	b := make([]byte, c.Size())
	if err := c.Persist(b); err != nil {
		t.Fatal(err)
	}
	return b
}
