package kvcheck

import (
	"strings"
	"testing"
)

// staleWrites: x=1 at index 5, y=a at 6, x=2 at 8, delete y at 9, x=3
// by a batch at 12.
func staleWrites() []Op {
	return []Op{
		at(idx(putOp(0, "x", "1"), 5), 0, 10),
		at(idx(putOp(0, "y", "a"), 6), 11, 20),
		at(idx(putOp(0, "x", "2"), 8), 21, 30),
		at(idx(delOp(0, "y"), 9), 31, 40),
		at(idx(batchOp(0, BatchOp{Key: "x", Value: "9"}, BatchOp{Key: "x", Value: "3"}, BatchOp{Key: "z", Value: "c"}), 12), 41, 50),
	}
}

// Stale gets that return the state after exactly the writes at or below
// their applied index pass, whenever they ran.
func TestStaleGood(t *testing.T) {
	h := append(staleWrites(),
		at(staleGet(1, "x", false, "", 0), 0, 100),
		at(staleGet(1, "x", false, "", 4), 100, 110),
		at(staleGet(1, "x", true, "1", 5), 100, 110),
		at(staleGet(1, "x", true, "1", 7), 100, 110),
		at(staleGet(1, "x", true, "2", 8), 100, 110),
		at(staleGet(1, "x", true, "2", 11), 100, 110),
		at(staleGet(1, "x", true, "3", 12), 100, 110),
		at(staleGet(1, "x", true, "3", 1000), 100, 110),
		at(staleGet(1, "y", true, "a", 8), 100, 110),
		at(staleGet(1, "y", false, "", 9), 100, 110),
		at(staleGet(1, "z", true, "c", 12), 100, 110),
		at(staleGet(1, "never", false, "", 12), 100, 110),
		// A failed CAS wrote nothing, so it is no newer state.
		at(casOp(2, "x", "0", "4", false), 60, 70),
		// Nor is an unknown get anything.
		at(unknown(staleGet(1, "x", true, "bogus", 12)), 100, 110),
	)
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
	// The writes may come separately (say, from the loader).
	if err := CheckStale(h[5:], h[:5]...); err != nil {
		t.Fatal(err)
	}
}

// (a): a stale-ok get returns a value no write wrote.
func TestStaleCatchesNeverWritten(t *testing.T) {
	for _, g := range []Op{
		at(staleGet(1, "x", true, "bogus", 12), 100, 110),
		at(staleGet(1, "q", true, "1", 12), 100, 110), // a value of another key
		at(staleGet(1, "x", true, "9", 12), 100, 110), // overwritten inside its batch
		// A value a write called only after the get returned wrote.
		at(staleGet(1, "x", true, "1", 5), -10, -1),
	} {
		h := append(staleWrites(), g)
		err := CheckStale(h)
		if err == nil {
			t.Fatalf("%s passed", describe(len(h)-1, &g))
		}
		se := staleErr(t, err)
		if se.Property != NeverWritten || se.Pos != len(h)-1 || !strings.Contains(err.Error(), "op 5 ") {
			t.Fatalf("want (a) for op 5, got %v", err)
		}
		t.Logf("caught as expected: %v", err)
		// The linearizable check leaves stale gets alone.
		mustLinearizable(t, h)
	}
	// A failed CAS did not write its value.
	h := append(staleWrites(), at(casOp(2, "x", "0", "4", false), 60, 70), at(staleGet(1, "x", true, "4", 12), 100, 110))
	if se := staleErr(t, CheckStale(h)); se.Property != NeverWritten {
		t.Fatalf("want (a), got %v", se)
	}
}

// (b): a stale-ok get returns a value older than the state at the applied
// index it reported.
func TestStaleCatchesWrongPrefix(t *testing.T) {
	for _, c := range []struct {
		get  Op
		hint string
	}{
		{staleGet(1, "x", true, "1", 8), "older than reported"}, // x=2 at 8 <= 8
		{staleGet(1, "x", true, "1", 100), "older than reported"},
		{staleGet(1, "x", false, "", 5), "older than reported"},
		{staleGet(1, "y", true, "a", 9), "older than reported"}, // deleted at 9
	} {
		h := append(staleWrites(), at(c.get, 100, 110))
		err := CheckStale(h)
		if err == nil {
			t.Fatalf("%s passed", describe(len(h)-1, &h[len(h)-1]))
		}
		se := staleErr(t, err)
		if se.Property != WrongPrefix || se.Pos != len(h)-1 || !strings.Contains(err.Error(), c.hint) {
			t.Fatalf("want (b) %q for op %d, got %v", c.hint, len(h)-1, err)
		}
		t.Logf("caught as expected: %v", err)
	}
}

// The reported applied index is a lower bound (the replica's position when
// the get began): a newer state, from a write called before the get
// returned, passes.
func TestStaleNewerThanReported(t *testing.T) {
	for _, g := range []Op{staleGet(1, "x", true, "2", 7), staleGet(1, "x", true, "1", 4),
		staleGet(1, "y", false, "", 7)} { // absent: y=a at 6, deleted at 9
		h := append(staleWrites(), at(g, 100, 110))
		if err := CheckStale(h); err != nil {
			t.Fatalf("a state newer than reported was refused: %v", err)
		}
	}
}

// Writes whose index is unknown: the get may return their value or the
// latest known one at or below its applied index, nothing older.
func TestStaleUnknownIndex(t *testing.T) {
	base := append(staleWrites(), at(unknown(putOp(2, "x", "u")), 51, 60))
	for _, c := range []struct {
		get  Op
		prop Property
	}{
		{staleGet(1, "x", true, "u", 9), 0},
		{staleGet(1, "x", true, "2", 9), 0},
		{staleGet(1, "x", true, "1", 9), WrongPrefix}, // older than x=2 at 8
		{staleGet(1, "x", false, "", 9), WrongPrefix},
		{staleGet(1, "x", false, "", 4), 0},
		{staleGet(1, "x", true, "v", 9), NeverWritten},
	} {
		h := append(base[:len(base):len(base)], at(c.get, 70, 80))
		err := CheckStale(h)
		if c.prop == 0 {
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		if se := staleErr(t, err); se.Property != c.prop {
			t.Fatalf("want %v, got %v", c.prop, err)
		}
	}
	// An unknown write called after the get returned is no excuse.
	h := append(staleWrites(), at(staleGet(1, "x", true, "u", 9), 51, 55), at(unknown(putOp(2, "x", "u")), 56, 60))
	if se := staleErr(t, CheckStale(h)); se.Property != NeverWritten {
		t.Fatalf("want (a), got %v", se)
	}
	// Acknowledged writes whose index was not recorded count as unknown.
	h = []Op{
		at(putOp(0, "x", "1"), 0, 10),
		at(putOp(0, "x", "2"), 20, 30),
		at(staleGet(1, "x", true, "1", 3), 40, 50),
		at(staleGet(1, "x", false, "", 3), 40, 50),
	}
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
}

// Indexes are per group: a write recorded in another group than the one a
// get read counts as of unknown index there.
func TestStaleGroups(t *testing.T) {
	inGroup := func(o Op, g int) Op { o.Out.Group = g; return o }
	h := []Op{
		at(inGroup(idx(putOp(0, "x", "1"), 5), 1), 0, 10),
		at(inGroup(idx(batchOp(0, BatchOp{Key: "w", Value: "0"}, BatchOp{Key: "x", Value: "2"}), 9), 0), 20, 30),
		at(inGroup(staleGet(1, "x", true, "1", 7), 1), 40, 50),
		at(inGroup(staleGet(1, "x", true, "2", 7), 1), 40, 50),
		at(inGroup(staleGet(1, "x", false, "", 3), 1), 40, 50),
	}
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
	h = append(h, at(inGroup(staleGet(1, "x", false, "", 7), 1), 40, 50))
	if se := staleErr(t, CheckStale(h)); se.Property != WrongPrefix {
		t.Fatalf("want (b), got %v", se)
	}
}

// Writes sharing an entry are ordered by version when every one has one;
// else any of them may be the latest.
func TestStaleSameEntry(t *testing.T) {
	ver := func(o Op, v uint64) Op { o.Out.Version = v; return o }
	h := []Op{
		at(ver(putOp(0, "x", "1"), 7<<16|0), 0, 10),
		at(ver(putOp(1, "x", "2"), 7<<16|1), 0, 10),
		at(staleGet(2, "x", true, "2", 7), 20, 30),
	}
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
	h[2].Out.Value = "1"
	if se := staleErr(t, CheckStale(h)); se.Property != WrongPrefix {
		t.Fatalf("want (b), got %v", se)
	}
	h[1] = idx(putOp(1, "x", "2"), 7) // index only: either may be latest
	h[1].Call, h[1].Return = 0, 10
	if err := CheckStale(h); err != nil {
		t.Fatal(err)
	}
}

// Many violations are reported, up to a cap.
func TestStaleManyViolations(t *testing.T) {
	h := staleWrites()
	for range 30 {
		h = append(h, at(staleGet(1, "x", true, "bogus", 12), 100, 110))
	}
	err := CheckStale(h)
	if err == nil {
		t.Fatal("passed")
	}
	if n := strings.Count(err.Error(), "(a)"); n != maxReported || !strings.Contains(err.Error(), "and 10 more") {
		t.Fatalf("%d violations reported: %v", n, err)
	}
}
