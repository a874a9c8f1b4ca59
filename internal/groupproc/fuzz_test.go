package groupproc

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
)

// fuzzState is the ballast of FuzzFSMRestore's FSMs with state: three
// chunks of fuzzChunk bytes, the last one shorter.
const (
	fuzzState = 40
	fuzzChunk = 16
)

func fuzzFSM(record, state bool) *FSM {
	if state {
		return newFSM(record, fuzzState, fuzzChunk)
	}
	return newFSM(record, 0, fuzzChunk)
}

// FuzzFSMRestore: snapshot bytes fetched from another replica either fail
// with ErrSnapshot, leaving the FSM as it was, or restore a state whose own
// snapshot is the same bytes (a recording FSM), or the same digest and
// ballast (a digest-only one, which drops the entries). Either way an
// accepted input is the one encoding of its state (decode accepts only
// canonical encodings): a digest-only FSM accepts no bytes a recording one
// of the same state size would refuse or re-encode differently, and an
// FSM accepts no state of another size than its own.
func FuzzFSMRestore(f *testing.F) {
	for _, state := range []bool{false, true} {
		rec := fuzzFSM(true, state)
		rec.Apply(broadcast.Entry{Index: 1, Data: []byte("a")})
		rec.Apply(broadcast.Entry{Index: 2, Data: []byte("bc")})
		snap, _ := rec.snapshotBytes()
		dig := fuzzFSM(false, state)
		dig.Apply(broadcast.Entry{Index: 1, Data: []byte("a")})
		dsnap, _ := dig.snapshotBytes()
		f.Add(snap, true, state)
		f.Add(snap, false, state)
		f.Add(snap, false, !state)
		f.Add(dsnap, false, state)
		f.Add(dsnap, true, state)
		f.Add(dsnap, true, !state)
		f.Add(append(snap[:16:16], 2), false, state)
	}
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, true, false)
	f.Fuzz(func(t *testing.T, b []byte, record, state bool) {
		m := fuzzFSM(record, state)
		m.Apply(broadcast.Entry{Index: 1, Data: []byte("before")})
		before, _ := m.snapshotBytes()
		dbefore := m.Digest()
		in := bytes.Clone(b) // Restore keeps its input: check against a copy
		if err := m.Restore(in); err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v does not wrap ErrSnapshot", err)
			}
			if after, _ := m.snapshotBytes(); !bytes.Equal(after, before) || m.Digest() != dbefore {
				t.Fatalf("a failed Restore changed the state from %x to %x", before, after)
			}
			return
		}
		got, _ := m.snapshotBytes()
		stateLen := 0
		if state {
			stateLen = fuzzState
		}
		if len(b) < headLen+stateLen {
			t.Fatalf("a %d-byte snapshot accepted by an FSM with a %d-byte state", len(b), stateLen)
		}
		canonDigest := append(append(append(b[:16:16], 0), b[17:headLen]...), b[len(b)-stateLen:]...)
		switch {
		case record && !bytes.Equal(got, b):
			t.Fatalf("snapshot %x restores to a state whose snapshot is %x", b, got)
		case !record && !bytes.Equal(got, canonDigest):
			t.Fatalf("digest-only FSM: snapshot %x restores to %x", b, got)
		case record && uint64(len(m.Entries())) != m.Digest().Index:
			t.Fatalf("%d entries for index %d", len(m.Entries()), m.Digest().Index)
		case !record && b[16] != 0:
			// Accepted for its digest only: b must still be a canonical
			// recording snapshot, one a recording FSM takes back as is.
			r := fuzzFSM(true, state)
			if err := r.Restore(bytes.Clone(b)); err != nil {
				t.Fatalf("digest-only FSM accepted %x, which a recording FSM refuses: %v", b, err)
			}
			if again, _ := r.snapshotBytes(); !bytes.Equal(again, b) {
				t.Fatalf("digest-only FSM accepted %x, which a recording FSM restores as %x", b, again)
			}
		}
		// An FSM of the other state size refuses it.
		if o := fuzzFSM(record, !state); o.Restore(bytes.Clone(b)) == nil {
			t.Fatalf("snapshot %x accepted by FSMs with and without a state", b)
		}
		// The restored FSM goes on like one that applied the same entries:
		// its digest, ballast included, is what its snapshot restores to.
		m.Apply(broadcast.Entry{Index: m.Digest().Index + 1, Data: []byte("after")})
		again, _ := m.snapshotBytes()
		r := fuzzFSM(record, state)
		if err := r.Restore(again); err != nil || r.Digest() != m.Digest() {
			t.Fatalf("re-restore after an Apply: %v, %+v want %+v", err, r.Digest(), m.Digest())
		}
	})
}
