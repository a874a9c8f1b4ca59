package kvcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A hand-written concurrent history over several keys, with every kind of
// op, that is linearizable only in one order of its overlapping ops.
func TestLinearizableGood(t *testing.T) {
	h := []Op{
		at(putOp(0, "x", "1"), 0, 10),
		at(putOp(1, "x", "2"), 5, 30),        // overlaps the get below
		at(getOp(2, "x", true, "1"), 12, 20), // so x=2 lands after it
		at(getOp(2, "x", true, "2"), 31, 40),
		at(casOp(0, "x", "2", "3", true), 41, 50),
		at(casOp(1, "x", "2", "4", false), 45, 55),
		at(getOp(0, "x", true, "3"), 56, 60),
		at(delOp(1, "x"), 61, 70),
		at(getOp(2, "x", false, ""), 71, 80),
		at(Op{Kind: CAS, Key: "x", OldAbsent: true, Value: "5", Out: Output{OK: true}}, 81, 90),
		at(getOp(2, "x", true, "5"), 91, 95),
		at(batchOp(0, BatchOp{Key: "y", Value: "a"}, BatchOp{Key: "z", Value: "b"}), 100, 200),
		at(getOp(1, "y", true, "a"), 110, 120),
		at(getOp(2, "z", true, "b"), 130, 140),
		at(getOp(1, "w", false, ""), 0, 300),
		// Stale gets are not linearizable's business.
		at(staleGet(3, "x", true, "1", 0), 96, 99),
	}
	res := mustLinearizable(t, h)
	var keys [][]string
	for _, p := range res.Partitions {
		keys = append(keys, p.Keys)
	}
	want := [][]string{{"w"}, {"x"}, {"y", "z"}}
	if !slices.EqualFunc(keys, want, slices.Equal) {
		t.Fatalf("partitions %q, want %q", keys, want)
	}
}

// Keys linked through a chain of batches are one partition; the others
// are one per key.
func TestPartitionComponents(t *testing.T) {
	h := []Op{
		at(batchOp(0, BatchOp{Key: "a", Value: "1"}, BatchOp{Key: "b", Value: "1"}), 0, 10),
		at(batchOp(0, BatchOp{Key: "c", Value: "1"}, BatchOp{Key: "b", Delete: true}), 20, 30),
		at(batchOp(0, BatchOp{Key: "e", Value: "1"}), 20, 30),
		at(putOp(1, "d", "1"), 0, 10),
		at(getOp(1, "a", true, "1"), 40, 50),
		at(getOp(1, "b", false, ""), 40, 50),
		at(staleGet(1, "f", false, "", 0), 40, 50), // nothing to check for f
	}
	res := mustLinearizable(t, h)
	var keys [][]string
	var ops []int
	for _, p := range res.Partitions {
		keys = append(keys, p.Keys)
		ops = append(ops, p.Ops)
	}
	want := [][]string{{"a", "b", "c"}, {"d"}, {"e"}}
	if !slices.EqualFunc(keys, want, slices.Equal) || !slices.Equal(ops, []int{4, 1, 1}) {
		t.Fatalf("partitions %q with %v ops, want %q with [4 1 1]", keys, ops, want)
	}
}

// A linearizable get returns a value that a write which completed before
// the get began had overwritten.
func TestLinearizableCatchesStaleRead(t *testing.T) {
	h := []Op{
		at(putOp(0, "x", "1"), 0, 10),
		at(putOp(0, "x", "2"), 20, 30),
		at(putOp(1, "y", "1"), 0, 50),
		at(getOp(1, "y", true, "1"), 51, 60),
		at(getOp(2, "x", true, "1"), 40, 50), // stale
	}
	res := mustIllegalIn(t, h, "x")
	if len(res.Partitions) != 2 || res.Partitions[1].Keys[0] != "y" || res.Partitions[1].Outcome != Ok {
		t.Fatalf("partitions %v: want y's Ok", res.Partitions)
	}
	// The same get overlapping the second put is fine.
	h[4] = at(h[4], 25, 50)
	mustLinearizable(t, h)
}

// An acknowledged write is lost: a later get does not see it.
func TestLinearizableCatchesLostWrite(t *testing.T) {
	h := []Op{
		at(putOp(0, "k", "v"), 0, 10),
		at(getOp(1, "k", false, ""), 20, 30),
	}
	mustIllegalIn(t, h, "k")
	// Nor may a later delete be lost.
	h = []Op{
		at(putOp(0, "k", "v"), 0, 10),
		at(delOp(0, "k"), 20, 30),
		at(getOp(1, "k", true, "v"), 40, 50),
	}
	mustIllegalIn(t, h, "k")
}

// A CAS reports OK though the key no longer held the old value.
func TestLinearizableCatchesBadCAS(t *testing.T) {
	h := []Op{
		at(putOp(0, "k", "a"), 0, 10),
		at(casOp(1, "k", "a", "b", true), 20, 30),
		at(casOp(2, "k", "a", "c", true), 40, 50), // should have failed
	}
	mustIllegalIn(t, h, "k")
	h[2].Out.OK = false
	mustLinearizable(t, h)
	// The reverse: a CAS whose condition held reports failure.
	h[1].Out.OK = false
	mustIllegalIn(t, h, "k")
	// An absent-expecting CAS on a present key.
	h = []Op{
		at(putOp(0, "k", "a"), 0, 10),
		at(Op{Client: 1, Kind: CAS, Key: "k", OldAbsent: true, Value: "b", Out: Output{OK: true}}, 20, 30),
	}
	mustIllegalIn(t, h, "k")
}

// A batch seen half-applied by linearizable gets: after the batch that
// wrote both keys completed, one client reads x's new value and then y's
// old one.
func TestLinearizableCatchesHalfBatch(t *testing.T) {
	h := []Op{
		at(batchOp(0, BatchOp{Key: "x", Value: "0"}, BatchOp{Key: "y", Value: "0"}), 0, 10),
		at(batchOp(0, BatchOp{Key: "x", Value: "1"}, BatchOp{Key: "y", Value: "1"}), 20, 30),
		at(getOp(1, "x", true, "1"), 40, 50),
		at(getOp(1, "y", true, "0"), 60, 70),
	}
	mustIllegalIn(t, h, "x", "y")
	h[3].Out.Value = "1"
	mustLinearizable(t, h)

	// While the batch is in flight, each get alone could be ordered
	// either side of it, so a per-key check would pass; only checking
	// x and y together shows that x=1 then y=0 splits the batch.
	h = []Op{
		at(batchOp(0, BatchOp{Key: "x", Value: "0"}, BatchOp{Key: "y", Value: "0"}), 0, 10),
		at(batchOp(0, BatchOp{Key: "x", Value: "1"}, BatchOp{Key: "y", Value: "1"}), 20, 100),
		at(getOp(1, "x", true, "1"), 40, 50),
		at(getOp(1, "y", true, "0"), 60, 70),
	}
	mustIllegalIn(t, h, "x", "y")
	h[2].Out.Value = "0" // x old, then y old: the batch lands later
	mustLinearizable(t, h)
}

// A write of unknown outcome may or may not have taken effect, at any time
// after its call: histories that need either are legal; one that needs it
// to take effect and then be undone is not.
func TestLinearizableUnknownWrite(t *testing.T) {
	base := []Op{
		at(putOp(0, "k", "1"), 0, 10),
		at(unknown(putOp(0, "k", "2")), 20, 30), // timed out at 30
	}
	tookEffect := append(slices.Clone(base), at(getOp(1, "k", true, "2"), 1000, 1010))
	mustLinearizable(t, tookEffect)
	didNot := append(slices.Clone(base), at(getOp(1, "k", true, "1"), 1000, 1010))
	mustLinearizable(t, didNot)
	// Took effect long after the client gave up.
	late := append(slices.Clone(base), at(getOp(1, "k", true, "1"), 1000, 1010), at(getOp(1, "k", true, "2"), 2000, 2010))
	mustLinearizable(t, late)
	undone := append(slices.Clone(base), at(getOp(1, "k", true, "2"), 1000, 1010), at(getOp(1, "k", true, "1"), 2000, 2010))
	mustIllegalIn(t, undone, "k")
	// But not before it was called.
	early := []Op{
		at(putOp(0, "k", "1"), 0, 10),
		at(getOp(1, "k", true, "2"), 11, 15),
		at(unknown(putOp(0, "k", "2")), 20, 30),
	}
	mustIllegalIn(t, early, "k")

	// A CAS of unknown outcome: it took effect iff its condition held
	// where it landed, whatever it reported.
	cas := []Op{
		at(putOp(0, "k", "a"), 0, 10),
		at(unknown(casOp(0, "k", "a", "b", false)), 20, 30),
		at(getOp(1, "k", true, "b"), 40, 50),
	}
	mustLinearizable(t, cas)
	cas[2].Out.Value = "a"
	mustLinearizable(t, cas)
	cas[1].Old = "z" // its condition never held
	cas[2].Out.Value = "b"
	mustIllegalIn(t, cas, "k")

	// A batch of unknown outcome is still all or nothing.
	batch := []Op{
		at(unknown(batchOp(0, BatchOp{Key: "x", Value: "1"}, BatchOp{Key: "y", Value: "1"})), 0, 10),
		at(getOp(1, "x", true, "1"), 20, 30),
		at(getOp(1, "y", false, ""), 40, 50),
	}
	mustIllegalIn(t, batch, "x", "y")

	// A get of unknown outcome is dropped, whatever it holds.
	h := append(slices.Clone(base), at(unknown(getOp(1, "k", true, "bogus")), 40, 50))
	mustLinearizable(t, h)
}

// Ops a Recorder never saw end count as of unknown outcome.
func TestLinearizablePendingOps(t *testing.T) {
	var clock int64
	r := NewRecorder(func() int64 { clock += 10; return clock })
	id := r.Begin(0, putOp(0, "k", "1"))
	r.End(id, Output{})
	r.Begin(1, putOp(0, "k", "2")) // never ends
	id = r.Begin(2, Op{Kind: Get, Key: "k"})
	r.End(id, Output{Found: true, Value: "2"})
	mustLinearizable(t, r.History())
}

// The visualization is written where asked, of the failed partition.
func TestLinearizableVisualization(t *testing.T) {
	h := []Op{
		at(putOp(0, "x", "1"), 0, 10),
		at(unknown(putOp(0, "x", "3")), 11, 12),
		at(putOp(0, "x", "2"), 20, 30),
		at(getOp(2, "x", true, "1"), 40, 50),
		at(putOp(1, "y", "1"), 0, 10),
	}
	path := filepath.Join(t.TempDir(), "x.html")
	res, err := CheckLinearizableOptions(h, Options{Timeout: testTimeout, VisualizeTo: path})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Illegal || res.Visualization != path || !strings.Contains(res.Err().Error(), path) {
		t.Fatalf("result %+v", res)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "<html") || !strings.Contains(s, `op 3: get(\"x\") -\u003e \"1\"`) || strings.Contains(s, `put(\"y\"`) {
		t.Fatalf("visualization (%d bytes) lacks the get of x or shows y", len(b))
	}
	// An Ok history shows every partition.
	h[3].Out.Value = "2"
	res, err = CheckLinearizableOptions(h, Options{Timeout: testTimeout, VisualizeTo: path})
	if err != nil || res.Outcome != Ok {
		t.Fatal(res, err)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), `put(\"y\", \"1\")`) {
		t.Fatalf("visualization of an Ok history lacks y: %v", err)
	}
}

// A check out of time says Unknown, for the partitions it did not decide.
func TestLinearizableTimeout(t *testing.T) {
	h := []Op{
		at(putOp(0, "x", "1"), 0, 10),
		at(putOp(0, "y", "1"), 0, 10),
	}
	res, err := CheckLinearizable(h, time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Unknown || len(res.Failed) != 2 || res.Failed[0].Outcome != Unknown ||
		!strings.Contains(res.Err().Error(), "timed out") {
		t.Fatalf("result %+v", res)
	}
}

// Histories that cannot be checked are errors, not verdicts.
func TestLinearizableMalformed(t *testing.T) {
	for _, h := range [][]Op{
		{at(putOp(0, "k", "1"), 10, 5)},
		{at(Op{Kind: 9, Key: "k"}, 0, 1)},
		{at(batchOp(0), 0, 1)},
		{at(Op{Kind: Put, Key: "k", Stale: true}, 0, 1)},
		{at(Op{Kind: Put, Key: "k", Batch: []BatchOp{{Key: "k"}}}, 0, 1)},
	} {
		if _, err := CheckLinearizable(h, testTimeout); err == nil {
			t.Errorf("no error for %+v", h)
		}
		if err := CheckStale(h); err == nil {
			t.Errorf("CheckStale: no error for %+v", h)
		}
	}
}

// TestNamesAndErrorText: every enum value's name, the fallback of a value
// without one, and the exact text of Result.Err and DurableError (at most
// 8 partitions, then how many more; the visualization file), which share
// one writer.
func TestNamesAndErrorText(t *testing.T) {
	for _, c := range []struct {
		got  fmt.Stringer
		want string
	}{
		{Get, "get"}, {Put, "put"}, {Delete, "delete"}, {CAS, "cas"}, {Batch, "batch"}, {Merge, "merge"}, {Scan, "scan"},
		{Kind(0), "kind(0)"}, {Kind(8), "kind(8)"},
		{Ok, "Ok"}, {Illegal, "Illegal"}, {Unknown, "Unknown"}, {Outcome(3), "outcome(3)"},
		{NeverWritten, "(a) never-written value"}, {WrongPrefix, "(b) not the state at the reported applied index"}, {Property(0), "property(0)"}, {Property(3), "property(3)"},
		{DurableSync, "sync"}, {DurableAsync, "async"}, {Durability(0), "durability(0)"}, {Durability(3), "durability(3)"},
		{NotLinearizable, "not linearizable"}, {AcknowledgedLost, "acknowledged lost"}, {AsyncLossBound, "async loss bound"},
		{CheckTimedOut, "check timed out"}, {NotAPrefix, "not a prefix"}, {DurableProperty(0), "durable property(0)"}, {DurableProperty(6), "durable property(6)"},
	} {
		if s := c.got.String(); s != c.want {
			t.Errorf("%T %d: %q, want %q", c.got, c.got, s, c.want)
		}
	}
	var parts []Partition
	for i := range 10 {
		parts = append(parts, Partition{Keys: []string{fmt.Sprint("k", i)}, Ops: i, Outcome: Illegal})
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{Result{Outcome: Illegal, Failed: parts[:2]}.Err(),
			`kvcheck: history not linearizable: partition ["k0"] (0 ops): Illegal; partition ["k1"] (1 ops): Illegal`},
		{Result{Outcome: Unknown, Failed: parts, Visualization: "v.html"}.Err(),
			`kvcheck: linearizability check timed out: partition ["k0"] (0 ops): Illegal; partition ["k1"] (1 ops): Illegal; partition ["k2"] (2 ops): Illegal; partition ["k3"] (3 ops): Illegal; partition ["k4"] (4 ops): Illegal; partition ["k5"] (5 ops): Illegal; partition ["k6"] (6 ops): Illegal; partition ["k7"] (7 ops): Illegal; and 2 more (visualization: v.html)`},
		{&DurableError{Property: AsyncLossBound, Msg: "lost", Partitions: parts[:1]},
			`kvcheck: async loss bound: lost; partition ["k0"] (0 ops): Illegal`},
		{&DurableError{Property: NotAPrefix, Msg: "m", Partitions: parts[:9], Visualization: "d.html"},
			`kvcheck: not a prefix: m; partition ["k0"] (0 ops): Illegal; partition ["k1"] (1 ops): Illegal; partition ["k2"] (2 ops): Illegal; partition ["k3"] (3 ops): Illegal; partition ["k4"] (4 ops): Illegal; partition ["k5"] (5 ops): Illegal; partition ["k6"] (6 ops): Illegal; partition ["k7"] (7 ops): Illegal; and 1 more (visualization: d.html)`},
		{&DurableError{Property: CheckTimedOut, Msg: "porcupine did not decide in time"},
			`kvcheck: check timed out: porcupine did not decide in time`},
	} {
		if c.err.Error() != c.want {
			t.Errorf("error text\n%s\nwant\n%s", c.err, c.want)
		}
	}
}
