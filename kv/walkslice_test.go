package kv

import (
	"fmt"
	"testing"
	"time"
)

// TestPersistWalkSlices: a capture's Persist walk yields its processor
// once it has held it for persistSlice by its clock, so that a poller
// waiting for a processor behind walks waits for slices of at most that
// (issue 19). The walk's clock (knobs.walkClock) says each record took
// 1 us: it advances persistCheck us at each read, and the walk reads it
// every persistCheck records and once after each yield. The property: at
// most persistSlice/1us + 2 x persistCheck records between two yields
// (from the start to the first, and from the last to the end), and the
// bytes written are those of a walk without yields. Planted
// persistYieldCount (the rule before: a yield every 4096 records, 4 ms by
// this clock) is caught by "slice:".
func TestPersistWalkSlices(t *testing.T) {
	const records = 5000
	tb, _ := soloTable(t, TableConfig{LogBuckets: 8})
	for k := range records {
		if res := put(tb, uint64(k+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", k), Value: fmt.Appendf(nil, "v%d", k)}); res.Status != StatusOK {
			t.Fatalf("put %d: %+v", k, res)
		}
	}
	persist := func(yields bool) ([]byte, []int) {
		var clock time.Duration
		var at []int
		tb.knobs.walkClock = func() time.Duration {
			if !yields {
				return 0
			}
			clock += persistCheck * time.Microsecond
			return clock
		}
		tb.knobs.onWalkYield = func(recs int) { at = append(at, recs) }
		c, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		b := make([]byte, c.Size())
		if err := c.Persist(b); err != nil {
			t.Fatal(err)
		}
		return b, at
	}
	check := func(planted bool) error {
		tb.knobs.persistYieldCount = planted
		still, none := persist(false)
		if len(none) != 0 && !planted {
			return fmt.Errorf("idle: a walk whose clock did not move yielded %d times", len(none))
		}
		b, at := persist(true)
		if string(b) != string(still) {
			return fmt.Errorf("bytes: the snapshot written with yields differs from the one without")
		}
		limit := int(persistSlice/time.Microsecond) + 2*persistCheck
		prev := 0
		for _, r := range append(at, records) {
			if r-prev > limit {
				return fmt.Errorf("slice: the walk copied %d records (%d us by its clock) between two yields, want at most %d", r-prev, r-prev, limit)
			}
			prev = r
		}
		t.Logf("planted=%v: %d yields over %d records", planted, len(at), records)
		return nil
	}
	if err := check(false); err != nil {
		t.Fatal(err)
	}
	err := check(true)
	if err == nil || err.Error()[:6] != "slice:" {
		t.Fatalf("planted persistYieldCount: %v, want slice:", err)
	}
	t.Logf("planted persistYieldCount caught: %v", err)
}
