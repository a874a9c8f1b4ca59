package multicast

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// TestSnapshotOwnReuse: a capture encodes its own part into the buffer of
// the last persisted capture, the first into one made with the state (no
// fresh, growing slice on the polling goroutine: issue 19), yet every capture persists the state at its
// capture: one taken while an earlier one is not yet persisted does not
// touch the earlier one's bytes, and a second Persist is refused. Planted
// ownSpareEarly (the buffer offered at capture): the earlier capture's
// bytes change under it.
func TestSnapshotOwnReuse(t *testing.T) {
	for _, planted := range []bool{false, true} {
		err := snapshotOwnReuse(t, planted)
		t.Logf("ownSpareEarly %v: %v", planted, err)
		switch {
		case !planted && err != "":
			t.Fatal(err)
		case planted && !strings.Contains(err, "changed under it"):
			t.Fatalf("planted ownSpareEarly: got %q, want the earlier capture's bytes found changed", err)
		}
	}
}

func snapshotOwnReuse(t *testing.T, planted bool) string {
	s := fuzzState(t)
	s.knobs.ownSpareEarly = planted
	persist := func(c interface {
		Size() int
		Persist([]byte) error
	}) []byte {
		b := make([]byte, c.Size())
		if err := c.Persist(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Capture 1 encodes into the buffer made with the state, large
	// enough for any encoding; persisted, its buffer is the spare.
	first := s.ownSpare.Load()
	if first == nil || cap(*first) < s.maxEncoded() {
		return "no buffer for the first capture, or one smaller than an encoding may be"
	}
	c1, _ := s.Snapshot()
	want1 := s.encode(nil)
	if &c1.(*snap).own[0] != &(*first)[:1][0] {
		return "capture 1 did not encode into the buffer made with the state"
	}
	b1 := persist(c1)
	if !bytes.Equal(b1[8:8+len(want1)], want1) {
		return "capture 1 persisted other bytes than the state's"
	}
	if err := c1.Persist(make([]byte, c1.Size())); err == nil {
		return "a second Persist of capture 1 was accepted"
	}
	c1.Release()
	spare := s.ownSpare.Load()
	// Capture 2 reuses it; capture 3 is taken (after a change) before
	// capture 2 persists.
	s.cpos[0] = 7
	c2, _ := s.Snapshot()
	want2 := s.encode(nil)
	if spare == nil || &c2.(*snap).own[0] != &(*spare)[:1][0] {
		return "capture 2 did not encode into capture 1's buffer"
	}
	s.cpos[0] = 9
	c3, _ := s.Snapshot()
	want3 := s.encode(nil)
	b2 := persist(c2)
	b3 := persist(c3)
	c2.Release()
	c3.Release()
	if !bytes.Equal(b2[8:8+len(want2)], want2) {
		return "capture 2's bytes changed under it (a later capture encoded into its buffer)"
	}
	if !bytes.Equal(b3[8:8+len(want3)], want3) {
		return "capture 3 persisted other bytes than the state's at its capture"
	}
	return ""
}

// TestMaxEncoded: with every forward slot and reply slot full, encode's
// output is no longer than maxEncoded (a longer one would grow the
// capture's buffer on the polling goroutine).
func TestMaxEncoded(t *testing.T) {
	s := fuzzState(t)
	for i := range s.children {
		s.out[i] = uint64(3 * s.pslots)
		for q := s.out[i] - uint64(s.pslots) + 1; q <= s.out[i]; q++ {
			slot := s.fwdSlot(i, q)
			binary.LittleEndian.PutUint32(slot[28:], uint32(maxPayload(s.slotSize))) // the largest record a slot holds
		}
	}
	for i := range s.replies {
		s.replies[i].seq = 1
		s.replies[i].result = s.replies[i].buf[:s.maxResult]
	}
	if n, m := len(s.encode(nil)), s.maxEncoded(); n > m {
		t.Fatalf("a full state encodes to %d bytes, maxEncoded says %d", n, m)
	}
}
