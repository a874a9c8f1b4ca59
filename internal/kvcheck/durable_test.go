package kvcheck

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Hand-written histories across a whole-group outage of group 1 at
// [100, 110] (nanoseconds on the history's clock); the async window is 50
// ns: writes acknowledged at or after 50 may be lost, older ones not.
var outage1 = []Outage{{Group: 1, Start: 100, End: 110}}

const window = 50 * time.Nanosecond

func inGroup(o Op, g int) Op {
	o.Out.Group = g
	return o
}

// g1 puts o in group 1.
func g1(o Op) Op { return inGroup(o, 1) }

// mustDurable fails t unless h passes CheckDurable, and returns lost.
func mustDurable(t *testing.T, h []Op, mode Durability, outages []Outage) int {
	t.Helper()
	lost, err := CheckDurable(h, mode, outages, window, Options{Timeout: testTimeout})
	if err != nil {
		t.Fatalf("%v: %v\n%s", mode, err, dump(h))
	}
	return lost
}

// mustBreak fails t unless CheckDurable finds h breaks property (on the
// partition of keys), and returns the error.
func mustBreak(t *testing.T, h []Op, mode Durability, outages []Outage, property DurableProperty, keys ...string) *DurableError {
	t.Helper()
	_, err := CheckDurable(h, mode, outages, window, Options{Timeout: testTimeout})
	var de *DurableError
	if !errors.As(err, &de) {
		t.Fatalf("%v: error %v, want a *DurableError (%v)\n%s", mode, err, property, dump(h))
	}
	if de.Property != property {
		t.Fatalf("%v: property %v, want %v: %v\n%s", mode, de.Property, property, err, dump(h))
	}
	if len(de.Partitions) != 1 || !slices.Equal(de.Partitions[0].Keys, keys) {
		t.Fatalf("%v: failed partitions %v, want only %q", mode, de.Partitions, keys)
	}
	if !strings.Contains(err.Error(), property.String()+":") {
		t.Fatalf("the error does not name the property %q: %v", property, err)
	}
	t.Logf("caught as expected (%v): %v", mode, err)
	return de
}

// An acknowledged write before the window is gone after the outage: sync
// fails (acknowledged lost), async too (outside the window).
func TestDurableLostBeforeWindow(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 20, 30), // acknowledged before 50
		at(g1(getOp(1, "x", true, "2")), 35, 40),
		at(g1(getOp(1, "x", true, "1")), 200, 210), // after the outage: x=2 lost
		at(inGroup(putOp(2, "y", "a"), 0), 0, 300), // another group's key, no outage
		at(inGroup(getOp(2, "y", true, "a"), 0), 301, 302),
	}
	if res := mustIllegalIn(t, h, "x"); res.Outcome != Illegal {
		t.Fatal("unreachable")
	}
	mustBreak(t, h, DurableSync, outage1, AcknowledgedLost, "x")
	mustBreak(t, h, DurableAsync, outage1, AsyncLossBound, "x")
	// With the window reaching back to the write, async passes, one lost.
	lost, err := CheckDurable(h, DurableAsync, outage1, 100*time.Nanosecond, Options{Timeout: testTimeout})
	if err != nil || lost != 1 {
		t.Fatalf("window 100: lost %d, %v; want 1 lost, no error", lost, err)
	}
	// Without the outage, the same history is simply not linearizable.
	mustBreak(t, h, DurableAsync, nil, NotLinearizable, "x")
	mustBreak(t, h, DurableSync, nil, NotLinearizable, "x")
}

// Writes acknowledged inside the window lost at the outage: async passes
// and counts them; sync fails. A read before the outage saw a lost write
// (it took effect, then the outage undid it).
func TestDurableLostInWindow(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 60, 70), // in the window
		at(g1(getOp(1, "x", true, "2")), 72, 75),
		at(g1(getOp(1, "x", true, "1")), 200, 210), // lost: 1 (x=2)

		at(g1(putOp(0, "z", "p")), 55, 60),         // in the window
		at(g1(putOp(0, "z", "q")), 62, 68),         // in the window
		at(g1(getOp(1, "z", false, "")), 200, 210), // lost: 2 (both)

		at(g1(putOp(0, "y", "a")), 40, 90),         // in the window, kept (called before any lost write returned)
		at(g1(getOp(1, "y", true, "a")), 200, 210), // not lost

		at(g1(putOp(0, "u", "a")), 0, 10),
		at(g1(delOp(0, "u")), 80, 95),              // in the window
		at(g1(getOp(1, "u", true, "a")), 200, 210), // lost: 1 (the delete)

		at(g1(putOp(0, "v", "a")), 60, 70), // in the window, lost
		at(g1(putOp(0, "v", "b")), 72, 78), // followed it: lost too (no read shows b; the order implies it)
		at(g1(getOp(1, "v", false, "")), 200, 210),
	}
	if res, err := CheckLinearizable(h, testTimeout); err != nil || len(res.Failed) != 4 {
		t.Fatalf("plain linearizability: %v, %v; want x, z, u, v failed", res.Failed, err)
	}
	if lost := mustDurable(t, h, DurableAsync, outage1); lost != 6 {
		t.Fatalf("lost %d, want 6 (x: 1, z: 2, u: 1, v: 2)", lost)
	}
	de := mustBreakAny(t, h, DurableSync, outage1, AcknowledgedLost)
	if len(de.Partitions) != 4 {
		t.Fatalf("sync: failed partitions %v, want x, z, u, v", de.Partitions)
	}
}

// A write lost while a later one (called after it returned) of the same
// group, on another key, was kept: each key alone is explained, but the
// recovered log is not a prefix.
func TestDurableNotAPrefix(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "a", "1")), 60, 70), // in the window, lost
		at(g1(getOp(1, "a", false, "")), 200, 210),
		at(g1(putOp(0, "b", "1")), 75, 80), // followed it, kept
		at(g1(getOp(1, "b", true, "1")), 200, 210),
	}
	de := mustBreakAny(t, h, DurableAsync, outage1, NotAPrefix)
	if len(de.Partitions) != 2 || !strings.Contains(de.Msg, `put("a", "1")`) || !strings.Contains(de.Msg, `put("b", "1")`) {
		t.Fatalf("the error does not name both writes and their partitions: %v", de)
	}
	// b's put concurrent with a's: it may precede it in the log.
	h[2] = at(g1(putOp(0, "b", "1")), 65, 80)
	if lost := mustDurable(t, h, DurableAsync, outage1); lost != 1 {
		t.Fatalf("lost %d, want 1", lost)
	}
	// Another group's later write is not ordered with a's in a log.
	h[2], h[3] = at(inGroup(putOp(0, "b", "1"), 0), 75, 80), at(inGroup(getOp(1, "b", true, "1"), 0), 200, 210)
	if lost := mustDurable(t, h, DurableAsync, outage1); lost != 1 {
		t.Fatalf("lost %d, want 1", lost)
	}
}

// mustBreakAny is mustBreak for any set of partitions.
func mustBreakAny(t *testing.T, h []Op, mode Durability, outages []Outage, property DurableProperty) *DurableError {
	t.Helper()
	_, err := CheckDurable(h, mode, outages, window, Options{Timeout: testTimeout})
	var de *DurableError
	if !errors.As(err, &de) || de.Property != property {
		t.Fatalf("%v: error %v, want a *DurableError with property %v\n%s", mode, err, property, dump(h))
	}
	t.Logf("caught as expected (%v): %v", mode, err)
	return de
}

// Nothing lost: both modes pass with 0 lost, even with reads during the
// outage and writes of unknown outcome that show up after it.
func TestDurableNothingLost(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 60, 70),
		at(g1(getOp(1, "x", true, "2")), 200, 210),
		at(g1(casOp(1, "x", "2", "3", true)), 220, 230),
		at(g1(getOp(1, "x", true, "3")), 240, 250),
		unknown(at(g1(putOp(2, "w", "9")), 90, 0)), // in flight at the outage
		at(g1(getOp(1, "w", true, "9")), 260, 270),
		at(g1(putOp(2, "y", "a")), 95, 205), // acknowledged after the outage
		at(g1(getOp(1, "y", true, "a")), 210, 215),
	}
	for _, mode := range []Durability{DurableSync, DurableAsync} {
		if lost := mustDurable(t, h, mode, outage1); lost != 0 {
			t.Fatalf("%v: lost %d, want 0", mode, lost)
		}
	}
}

// Violations that no loss explains: a stale read away from the outage,
// and a value after the outage that nothing wrote.
func TestDurableNotLinearizable(t *testing.T) {
	stale := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 20, 30),
		at(g1(getOp(1, "x", true, "1")), 40, 45), // stale, before the outage
		at(g1(getOp(1, "x", true, "2")), 200, 210),
	}
	never := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(getOp(1, "x", true, "7")), 200, 210),
	}
	// After the rollback, the old state cannot come back.
	flip := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 80, 90),
		at(g1(getOp(1, "x", true, "1")), 200, 210),
		at(g1(getOp(1, "x", true, "2")), 220, 230),
	}
	// A read after End sees the outage's rollback: it cannot see the
	// lost value.
	late := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 80, 90),
		at(g1(getOp(1, "x", true, "1")), 105, 106), // during the outage: rolled back already
		at(g1(getOp(1, "x", true, "2")), 120, 130), // after it: must not see 2 again
	}
	// Before End the dying replicas serve: nothing is rolled back yet.
	during := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 80, 90),
		at(g1(getOp(1, "x", true, "1")), 105, 106),
	}
	for name, h := range map[string][]Op{"stale": stale, "never-written": never, "flip": flip, "late": late, "during": during} {
		t.Run(name, func(t *testing.T) {
			mustBreak(t, h, DurableSync, outage1, NotLinearizable, "x")
			mustBreak(t, h, DurableAsync, outage1, NotLinearizable, "x")
		})
	}
}

// A second outage of the group: each outage's window is its own, and the
// loss at the second is counted.
func TestDurableTwoOutages(t *testing.T) {
	outs := []Outage{{Group: 1, Start: 100, End: 110}, {Group: 1, Start: 300, End: 310}}
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(getOp(1, "x", true, "1")), 200, 210),
		at(g1(putOp(0, "x", "2")), 270, 280), // inside the second window (250)
		at(g1(getOp(1, "x", true, "1")), 400, 410),
	}
	if lost := mustDurable(t, h, DurableAsync, outs); lost != 1 {
		t.Fatalf("lost %d, want 1", lost)
	}
	h[2] = at(g1(putOp(0, "x", "2")), 220, 230) // before the second window
	mustBreak(t, h, DurableAsync, outs, AsyncLossBound, "x")
}

// A batch over keys of two groups: an outage of group 1 rolls back only
// group 1's keys.
func TestDurableRollbackOnlyItsGroup(t *testing.T) {
	h := []Op{
		at(batchOp(0, BatchOp{Key: "a", Value: "1"}, BatchOp{Key: "b", Value: "1"}), 70, 80),
		at(g1(getOp(1, "a", false, "")), 200, 210),
		at(inGroup(getOp(1, "b", true, "1"), 0), 200, 210),
	}
	h[0].Out.OK = true
	if lost := mustDurable(t, h, DurableAsync, outage1); lost != 1 {
		t.Fatalf("lost %d, want 1 (the batch)", lost)
	}
	// Group 0 had no outage: its key cannot lose the batch.
	h[1], h[2] = at(g1(getOp(1, "a", true, "1")), 200, 210), at(inGroup(getOp(1, "b", false, ""), 0), 200, 210)
	mustBreak(t, h, DurableAsync, outage1, NotLinearizable, "a", "b")
}

// Outages and keys that cannot be checked are errors, not verdicts.
func TestDurableRefuses(t *testing.T) {
	h := []Op{at(g1(putOp(0, "x", "1")), 0, 10), at(inGroup(getOp(0, "x", true, "1"), 2), 20, 30)}
	if _, err := CheckDurable(h, DurableAsync, outage1, window, Options{}); err == nil || !strings.Contains(err.Error(), "groups 1 and 2") {
		t.Fatalf("a key in two groups: %v", err)
	}
	h = h[:1]
	for _, outs := range [][]Outage{
		{{Group: 1, Start: 10, End: 5}},
		{{Group: 1, Start: 10, End: 50}, {Group: 1, Start: 40, End: 60}},
	} {
		if _, err := CheckDurable(h, DurableAsync, outs, window, Options{}); err == nil {
			t.Fatalf("outages %v accepted", outs)
		}
	}
	if _, err := CheckDurable(h, 0, nil, window, Options{}); err == nil {
		t.Fatal("durability 0 accepted")
	}
}

// The visualization of a failure shows the outage's operations.
func TestDurableVisualization(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(putOp(0, "x", "2")), 20, 30),
		at(g1(getOp(1, "x", true, "1")), 200, 210),
	}
	path := filepath.Join(t.TempDir(), "vis.html")
	_, err := CheckDurable(h, DurableAsync, outage1, window, Options{Timeout: testTimeout, VisualizeTo: path})
	var de *DurableError
	if !errors.As(err, &de) || de.Property != AsyncLossBound || de.Visualization != path {
		t.Fatalf("error %v, want async loss bound with a visualization", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "roll back") {
		t.Fatal("the visualization does not show the outage's rollback")
	}
}

// A check that runs out of time is a failure, never a pass.
func TestDurableTimeoutIsNoPass(t *testing.T) {
	h := []Op{
		at(g1(putOp(0, "x", "1")), 0, 10),
		at(g1(getOp(1, "x", true, "1")), 200, 210),
	}
	for _, mode := range []Durability{DurableSync, DurableAsync} {
		_, err := CheckDurable(h, mode, outage1, window, Options{Timeout: time.Nanosecond})
		var de *DurableError
		if !errors.As(err, &de) || de.Property != CheckTimedOut {
			t.Fatalf("%v with a 1ns timeout: %v, want property %v", mode, err, CheckTimedOut)
		}
	}
}
