package btree

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestCaptureAroundDrop: a drop (CtlDrop) publishes the header and the
// directory area before it deletes the tablet's keys (publishBefore, then
// deleteRange, in one apply). A snapshot capture cannot fall between the
// two: captures run on the polling goroutine between applies (broadcast's
// snapshot paths, kv's backup marker), and the drop is one apply. What
// the test checks: a capture taken before the drop, persisted on another
// goroutine while the drop's deletes run (as a replica does), writes the
// section at capture, tablet and keys included; one taken after it writes
// the section without them, which restores to a store without the tablet,
// its keys or the old ownership version. And were a capture taken between
// the publish and the deletes (done here by hand: the first half of the
// drop, a capture, then the deletes), its Persist would refuse it (the
// keys it walks are not the keys counted at capture): no snapshot, never
// an inconsistent one.
func TestCaptureAroundDrop(t *testing.T) {
	n := memNode(t)
	moved, kept := Tablet{Low: []byte("a"), High: []byte("m")}, Tablet{Low: []byte("m"), HighInf: true}
	cfg := StoreConfig{Group: 0, Tree: Config{NodeSize: 256, MaxKey: 8}, FreeAfter: 1, Tablets: []Tablet{moved, kept}}
	s, err := NewStore(cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	idx := uint64(0)
	apply := func(s *Store, b []byte) {
		t.Helper()
		idx++
		if st := status(t, s.Apply(idx, b)); st != StatusOK {
			t.Fatalf("entry %d: status %d", idx, st)
		}
		s.Publish(idx)
	}
	for i := range 150 {
		apply(s, putReq(fmt.Sprintf("b%03d", i), strings.Repeat("v", i%17)))
		apply(s, putReq(fmt.Sprintf("p%03d", i), "w"))
	}
	apply(s, ctlReq(CtlFreeze, 1, 1, moved))
	before := s.Snapshot()

	// The hypothetical capture between the publish and the deletes, on
	// a store restored from the state before the drop.
	mid, err := NewStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit, err := mid.Restore(before)
	if err != nil {
		t.Fatal(err)
	}
	commit(idx)
	k := mid.exact(moved)
	tb := mid.tablets[k]
	mid.tablets = slices.Delete(mid.tablets, k, k+1)
	mid.counts = slices.Delete(mid.counts, k, k+1)
	mid.dirVer++
	mid.ownVer++
	mid.publishBefore()
	c := mid.Capture()
	mid.deleteRange(tb, idx+1)
	err = c.Persist(make([]byte, c.Size()))
	t.Logf("a capture between the publish and the deletes: %v", err)
	if err == nil || !strings.Contains(err.Error(), "walked") {
		t.Fatalf("a capture between the drop's publish and its deletes persisted (err %v): want the key count check to refuse it", err)
	}

	// Before the drop, persisted while the drop's deletes run.
	c = s.Capture()
	got := make([]byte, c.Size())
	var wg sync.WaitGroup
	wg.Go(func() { err = c.Persist(got) })
	own := s.OwnVersion()
	var sts []uint8 // checked once Persist is over (a Fatal must not close s under it)
	for i := range 51 {
		b := putReq(fmt.Sprintf("q%03d", i), "x")
		if i == 0 {
			b = ctlReq(CtlDrop, 1, 1, moved)
		}
		idx++
		r, _ := DecodeResult(s.Apply(idx, b))
		s.Publish(idx)
		sts = append(sts, r.Status)
	}
	wg.Wait()
	for i, st := range sts {
		if st != StatusOK {
			t.Fatalf("request %d after the capture (0: the drop): status %d", i, st)
		}
	}
	if err != nil || !bytes.Equal(got, before) {
		t.Fatalf("the capture before the drop persisted a section unlike the one at capture (err %v)", err)
	}
	if s.OwnVersion() != own+1 || len(s.Tablets()) != 1 || s.Tree().Len() != 200 {
		t.Fatalf("after the drop: own %d (was %d), tablets %+v, %d keys", s.OwnVersion(), own, s.Tablets(), s.Tree().Len())
	}

	// After the drop.
	after := capturedSection(t, s)
	if want := s.Snapshot(); !bytes.Equal(after, want) {
		t.Fatal("the capture after the drop persisted a section unlike the store's snapshot")
	}
	r, err := NewStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if commit, err = r.Restore(after); err != nil {
		t.Fatal(err)
	}
	commit(idx)
	if r.OwnVersion() != s.OwnVersion() || len(r.Tablets()) != 1 || !sameFences(r.Tablets()[0], kept) || r.Tree().Len() != 200 {
		t.Fatalf("restored after the drop: own %d (want %d), tablets %+v, %d keys", r.OwnVersion(), s.OwnVersion(), r.Tablets(), r.Tree().Len())
	}
	r.Tree().ascend(nil, func(e Entry) bool {
		if moved.Contains(e.Key) {
			t.Fatalf("restored after the drop: key %q of the dropped tablet", e.Key)
		}
		return true
	})
}
