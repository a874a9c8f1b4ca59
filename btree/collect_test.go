package btree

import (
	"fmt"
	"strings"
	"testing"
)

// collectReq is a CtlCollect request, as the client sends it.
func collectReq() []byte { return ctlReq(CtlCollect, 0, 1, All) }

// TestCtlCollect: a group that gets no ordered requests after a drop
// deletes its garbage through CtlCollect alone: each deletes at most
// GarbageStep keys (its own budget), answers the keys left, and the
// load area publishes that count after the request's Publish; once none
// are left it changes nothing (idempotent: same answer, same tree), the
// other tablet's keys are all there and CheckKeys holds throughout. Two
// collections in one batch have a budget each. The planted
// gcIgnoresBudget (every key in one apply) and gcNotPublished (the count
// published stays the old one) are caught by the check aimed at them.
func TestCtlCollect(t *testing.T) {
	if err := runCtlCollect(t, nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name  string
		plant func(*Store)
		want  string
	}{
		{"gcIgnoresBudget", func(s *Store) { s.knobs.gcIgnoresBudget = true }, "budget:"},
		{"gcNotPublished", func(s *Store) { s.knobs.gcNotPublished = true }, "published:"},
	} {
		err := runCtlCollect(t, m.plant)
		if err == nil || !strings.Contains(err.Error(), m.want) {
			t.Fatalf("planted %s: got %v, want a %q failure", m.name, err, m.want)
		}
		t.Logf("planted %s caught: %v", m.name, err)
	}
}

func runCtlCollect(t *testing.T, plant func(*Store)) error {
	const n, step, low = 350, 100, 20
	node := memNode(t)
	lo := Tablet{Low: []byte("a"), High: []byte("m")}
	hi := Tablet{Low: []byte("m"), HighInf: true}
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 16}, Tablets: []Tablet{lo, hi}, TabletMax: -1, GarbageStep: step}, node)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if plant != nil {
		plant(s)
	}
	idx := uint64(0)
	apply := func(b []byte) Result {
		idx++
		r, err := DecodeResult(s.Apply(idx, b))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := range n {
		apply(putReq(fmt.Sprintf("m%05d", i), "v"))
		if i < low {
			apply(putReq(fmt.Sprintf("b%05d", i), "v"))
		}
		s.Publish(idx)
	}
	published := func() uint64 {
		g, ok := DecodeGarbage(s.Regions().hdr.Bytes()[HeaderSize:RegionSize])
		if !ok {
			t.Fatal("load area torn")
		}
		return g
	}
	if g := published(); g != 0 {
		return fmt.Errorf("published: %d garbage keys before any drop", g)
	}
	for _, req := range [][]byte{ctlReq(CtlFreeze, 1, 1, hi), ctlReq(CtlDrop, 1, 1, hi)} {
		if r := apply(req); r.Status != StatusOK {
			t.Fatalf("move step: status %d", r.Status)
		}
		s.Publish(idx)
	}
	// The drop's own apply deleted a step's worth.
	left := n - step
	if st := s.Stats(); st.GarbageKeys != left {
		return fmt.Errorf("budget: %d garbage keys after the drop, want %d", st.GarbageKeys, left)
	}
	if g := published(); g != uint64(left) {
		return fmt.Errorf("published: %d garbage keys after the drop, want %d", g, left)
	}
	// One batch of two collections: a budget each.
	for range 2 {
		r := apply(collectReq())
		want := max(left-step, 0)
		if r.Status != StatusOK || r.Count != want || s.Stats().GarbageKeys != want || r.Prev != uint64(left-want) {
			return fmt.Errorf("budget: a collection with %d left answered status %d count %d deleted %d, holds %d, want %d", left, r.Status, r.Count, r.Prev, s.Stats().GarbageKeys, want)
		}
		left = want
		if err := s.CheckKeys(); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
	}
	s.Publish(idx)
	if g := published(); g != uint64(left) {
		return fmt.Errorf("published: %d garbage keys after a batch of collections, the store holds %d", g, left)
	}
	for try := 0; try < 4; try++ {
		r := apply(collectReq())
		s.Publish(idx)
		want := max(left-step, 0)
		if r.Status != StatusOK || r.Count != want || s.Stats().GarbageKeys != want || r.Prev != uint64(left-want) {
			return fmt.Errorf("budget: a collection with %d left answered status %d count %d deleted %d, holds %d, want %d", left, r.Status, r.Count, r.Prev, s.Stats().GarbageKeys, want)
		}
		if g := published(); g != uint64(want) {
			return fmt.Errorf("published: %d garbage keys after a collection answered %d", g, want)
		}
		if err := s.CheckKeys(); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		left = want
	}
	if st := s.Stats(); st.GarbageKeys != 0 || st.GarbageRanges != 0 || st.Keys != low || st.GarbageDeleted != n {
		return fmt.Errorf("end: %+v, want no garbage, %d keys, %d deleted", st, low, n)
	}
	return nil
}
