package groupproc

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzFSMRestore: snapshot bytes fetched from another replica either fail
// with ErrSnapshot, leaving the FSM as it was, or restore a state whose own
// snapshot is the same bytes (a recording FSM), or the same digest (a
// digest-only one, which drops the entries). Either way an accepted input
// is the one encoding of its state: a digest-only FSM accepts no bytes a
// recording one would refuse or re-encode differently.
func FuzzFSMRestore(f *testing.F) {
	rec := NewFSM(true)
	rec.Apply(1, []byte("a"))
	rec.Apply(2, []byte("bc"))
	snap, _ := rec.snapshotBytes()
	dig := NewFSM(false)
	dig.Apply(1, []byte("a"))
	dsnap, _ := dig.snapshotBytes()
	f.Add(snap, true)
	f.Add(snap, false)
	f.Add(dsnap, false)
	f.Add(dsnap, true)
	f.Add(append(snap[:16:16], 2), false)
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, true)
	f.Fuzz(func(t *testing.T, b []byte, record bool) {
		m := NewFSM(record)
		m.Apply(1, []byte("before"))
		before, _ := m.snapshotBytes()
		if err := m.Restore(b); err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v does not wrap ErrSnapshot", err)
			}
			if after, _ := m.snapshotBytes(); !bytes.Equal(after, before) {
				t.Fatalf("a failed Restore changed the state from %x to %x", before, after)
			}
			return
		}
		got, _ := m.snapshotBytes()
		switch {
		case record && !bytes.Equal(got, b):
			t.Fatalf("snapshot %x restores to a state whose snapshot is %x", b, got)
		case !record && !bytes.Equal(got, append(b[:16:16], 0)):
			t.Fatalf("digest-only FSM: snapshot %x restores to %x", b, got)
		case record && uint64(len(m.Entries())) != m.Digest().Index:
			t.Fatalf("%d entries for index %d", len(m.Entries()), m.Digest().Index)
		case !record && b[16] != 0:
			// Accepted for its digest only: b must still be a canonical
			// recording snapshot, one a recording FSM takes back as is.
			r := NewFSM(true)
			if err := r.Restore(b); err != nil {
				t.Fatalf("digest-only FSM accepted %x, which a recording FSM refuses: %v", b, err)
			}
			if again, _ := r.snapshotBytes(); !bytes.Equal(again, b) {
				t.Fatalf("digest-only FSM accepted %x, which a recording FSM restores as %x", b, again)
			}
		}
	})
}
