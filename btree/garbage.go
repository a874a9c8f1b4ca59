package btree

import (
	"fmt"
	"slices"
)

// Dropped keys (docs/btree.md, "Dropping a tablet: the keys as garbage").
// A drop (CtlDrop) and an abort that removes an installing tablet take
// the tablet out of the group's list at once, but leave its keys in the
// tree as garbage: key ranges (Store.garbage) that no tablet of the group
// covers and whose keys the group deletes a few at a time, at most
// GarbageStep keys per log entry (Store.collect, at the end of each
// ordered apply; the budget is renewed at Publish, which kv.Table calls
// once per batch entry and after each ordered request outside one). One
// apply of a 64 Ki-key tablet's drop took 0.3 s (BenchmarkDrop), all of
// it on the replica's polling goroutine. A group that gets no ordered
// requests deletes its garbage through CtlCollect (move.go: a budget of
// its own per request), which the balancer sends to the groups whose
// load area publishes garbage (load.go).
//
// The deletions are replicated state changes made at apply time, so
// every replica of the group deletes the same keys at the same entry:
// the budget depends only on the log (batch entries and ordered
// requests), and at each log entry's end it is whole again, so a
// snapshot, taken between entries, needs only the ranges (it carries
// them and their keys as tablets of state TabletGarbage), and a restored
// replica goes on deleting exactly as the others do.
//
// Invariants (Store.CheckKeys): garbage ranges are sorted, disjoint from
// each other and from every tablet; every key of the tree lies in
// exactly one tablet or garbage range; GarbageKeys counts the keys in
// the ranges; between two garbage ranges lies a tablet (adjacent ranges
// are merged), so a group holds at most MaxTablets+1 of them.
//
// Readers never see the garbage: it is in no tablet of the published
// directory (clients route no key there), a lookup or scan checks the
// group's ownership version around its node reads (the drop changed it,
// and published it before any deletion), and the Store's own reads
// (through the log) answer only keys of a tablet it owns. A tablet that
// comes back (an ingest whose installing tablet overlaps garbage) first
// deletes the garbage in its range, in that apply, and takes the range
// out of the garbage: the only apply whose deletions are not bounded by
// GarbageStep (it is at most the keys the tablet held when it left).

// TabletGarbage is the state of a dropped key range in a snapshot
// section (never in the directory): its keys wait for deletion.
const TabletGarbage = 3

// DefaultGarbageStep is the default StoreConfig.GarbageStep.
const DefaultGarbageStep = 256

// Garbage is the group's dropped key ranges whose keys are still in the
// tree (sorted, State TabletGarbage), and how many keys they hold.
func (s *Store) Garbage() ([]Tablet, int) { return s.garbage, s.garbageKeys }

// addGarbage makes the keys of tb (n of them, tb out of the group's
// list already) garbage, merging tb with the ranges beside it that no
// tablet separates from it.
func (s *Store) addGarbage(tb Tablet, n int) {
	g := Tablet{Low: slices.Clone(tb.Low), High: slices.Clone(tb.High), HighInf: tb.HighInf, State: TabletGarbage}
	if g.HighInf {
		g.High = nil
	}
	at := searchTablets(s.garbage, g.Low) + 1
	s.garbage = slices.Insert(s.garbage, at, g)
	s.garbageKeys += n
	// Merge with the right neighbour, then with the left one.
	for _, i := range []int{at, at - 1} {
		if i < 0 || i+1 >= len(s.garbage) {
			continue
		}
		a, b := s.garbage[i], s.garbage[i+1]
		if j := searchTablets(s.tablets, b.Low); j >= 0 && string(s.tablets[j].Low) >= string(a.High) {
			continue // a tablet lies between them
		}
		s.garbage[i].High, s.garbage[i].HighInf = b.High, b.HighInf
		s.garbage = slices.Delete(s.garbage, i+1, i+2)
	}
}

// collect deletes garbage keys at entry index, lowest range first, as
// long as the batch's budget lasts (GarbageStep; negative: all).
func (s *Store) collect(index uint64) {
	for len(s.garbage) > 0 && s.gcLeft != 0 {
		r := &s.garbage[0]
		want := s.gcLeft
		if want < 0 {
			want = s.garbageKeys + 1
		}
		// One key more than the budget: the range is done when it
		// holds no more than the budget.
		keys := s.rangeKeys(*r, want+1)
		done := len(keys) <= want
		if !done {
			keys = keys[:want]
		}
		s.deleteKeys(keys, index)
		s.garbageKeys -= len(keys)
		s.work.GarbageDeleted += uint64(len(keys))
		if s.gcLeft > 0 {
			s.gcLeft -= len(keys)
		}
		if done {
			s.garbage = slices.Delete(s.garbage, 0, 1)
			continue
		}
		// Every key of [Low, last] is deleted: the range goes on after.
		r.Low = keys[len(keys)-1]
	}
}

// deleteKeys deletes keys (sorted, in the tree) at entry index: one
// node write per leaf (Tree.deleteKeys), or one per key with the
// planted keyByKey (the comparison of TestGarbageDeleteKeys).
func (s *Store) deleteKeys(keys [][]byte, index uint64) {
	if s.knobs.keyByKey {
		for _, k := range keys {
			s.t.Delete(k, index)
		}
		return
	}
	s.t.deleteKeys(keys, index)
}

// rangeKeys are (copies of) the first max keys of the tree in tb.
func (s *Store) rangeKeys(tb Tablet, max int) [][]byte {
	var keys [][]byte
	s.t.ascend(tb.Low, func(e Entry) bool {
		if len(keys) >= max || !tb.Contains(e.Key) {
			return false
		}
		keys = append(keys, slices.Clone(e.Key))
		return true
	})
	return keys
}

// clearGarbage deletes, at entry index, the garbage keys in tb (a
// tablet coming in), and takes tb's range out of the garbage ranges, so
// that no later collect deletes a key of the tablet. Unbounded: at most
// the keys the tablet held when it left (docs/btree.md).
func (s *Store) clearGarbage(tb Tablet, index uint64) {
	var out []Tablet
	for _, g := range s.garbage {
		if !overlaps(g, tb) {
			out = append(out, g)
			continue
		}
		// The intersection's keys.
		in := Tablet{Low: g.Low, High: g.High, HighInf: g.HighInf}
		if string(tb.Low) > string(in.Low) {
			in.Low = tb.Low
		}
		if !tb.HighInf && (in.HighInf || string(tb.High) < string(in.High)) {
			in.High, in.HighInf = tb.High, false
		}
		keys := s.rangeKeys(in, int(^uint(0)>>1))
		s.deleteKeys(keys, index)
		s.garbageKeys -= len(keys)
		s.work.GarbageCleared += uint64(len(keys))
		if s.knobs.gcKeepsRange {
			out = append(out, g) // planted: the range stays garbage
			continue
		}
		// What is left of g below and above tb.
		if string(g.Low) < string(tb.Low) {
			out = append(out, Tablet{Low: g.Low, High: slices.Clone(tb.Low), State: TabletGarbage})
		}
		if !tb.HighInf && (g.HighInf || string(tb.High) < string(g.High)) {
			out = append(out, Tablet{Low: slices.Clone(tb.High), High: g.High, HighInf: g.HighInf, State: TabletGarbage})
		}
	}
	s.garbage = out
}

// sectionTablets are the tablets and the garbage ranges in key order: the
// ranges a snapshot section lists.
func (s *Store) sectionTablets() []Tablet {
	if len(s.garbage) == 0 {
		return s.tablets
	}
	out := make([]Tablet, 0, len(s.tablets)+len(s.garbage))
	i, j := 0, 0
	for i < len(s.tablets) || j < len(s.garbage) {
		if j == len(s.garbage) || i < len(s.tablets) && string(s.tablets[i].Low) < string(s.garbage[j].Low) {
			out = append(out, s.tablets[i])
			i++
		} else {
			out = append(out, s.garbage[j])
			j++
		}
	}
	return out
}

// CheckKeys verifies the store's key ranges against its tree and returns
// the first violation: tablets and garbage ranges sorted and disjoint, a
// tablet between any two garbage ranges, every key of the tree in a
// tablet or a garbage range, each tablet's count (Counts) its keys in the
// tree, and Garbage's count the keys in the garbage ranges. It walks the
// whole tree (tests and simulators).
func (s *Store) CheckKeys() error {
	all := s.sectionTablets()
	for i := 1; i < len(all); i++ {
		if a, b := all[i-1], all[i]; a.HighInf || string(a.High) > string(b.Low) {
			return fmt.Errorf("ranges: %q..%q (state %d) and %q (state %d) overlap or are out of order", a.Low, a.High, a.State, b.Low, b.State)
		}
		if all[i-1].State == TabletGarbage && all[i].State == TabletGarbage {
			return fmt.Errorf("ranges: garbage ranges at %q and %q with no tablet between", all[i-1].Low, all[i].Low)
		}
	}
	counts := make([]int, len(s.tablets))
	garbage := 0
	var bad error
	s.t.Ascend(nil, func(k, _ []byte) bool {
		if i := s.find(k); i >= 0 {
			counts[i]++
			return true
		}
		if i := searchTablets(s.garbage, k); i >= 0 && s.garbage[i].Contains(k) {
			garbage++
			return true
		}
		bad = fmt.Errorf("key %q lies in no tablet and no garbage range", k)
		return false
	})
	if bad != nil {
		return bad
	}
	for i, n := range counts {
		if n != s.counts[i] {
			return fmt.Errorf("tablet count: tablet %d [%q, %q) holds %d keys, its count says %d", i, s.tablets[i].Low, s.tablets[i].High, n, s.counts[i])
		}
	}
	if garbage != s.garbageKeys {
		return fmt.Errorf("garbage count: the garbage ranges hold %d keys, the count says %d", garbage, s.garbageKeys)
	}
	return nil
}
