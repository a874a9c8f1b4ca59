package groupproc

import (
	"errors"
	"slices"
	"testing"
)

// TestFSMSnapshot checks that a restored FSM continues where the snapshot
// was taken: same digest, same entries in record mode, and the next Apply
// follows; and that a malformed snapshot is refused.
func TestFSMSnapshot(t *testing.T) {
	for _, record := range []bool{false, true} {
		a := NewFSM(record)
		for i, d := range []string{"x", "", "yz"} {
			a.Apply(uint64(i+1), []byte(d))
		}
		snap, err := a.snapshotBytes()
		if err != nil {
			t.Fatal(err)
		}
		b := NewFSM(record)
		if err := b.Restore(snap); err != nil {
			t.Fatalf("record=%v: restore: %v", record, err)
		}
		if a.Digest() != b.Digest() || !slices.Equal(a.Entries(), b.Entries()) {
			t.Errorf("record=%v: restored %v %q, want %v %q", record, b.Digest(), b.Entries(), a.Digest(), a.Entries())
		}
		a.Apply(4, []byte("w"))
		b.Apply(4, []byte("w"))
		if a.Digest() != b.Digest() {
			t.Errorf("record=%v: digests differ after the same Apply", record)
		}
		if c := NewFSM(record); c.Digest() == a.Digest() {
			t.Errorf("record=%v: empty FSM has the digest of four entries", record)
		}
		if err := b.Restore(snap[:len(snap)-1]); !errors.Is(err, ErrSnapshot) {
			t.Errorf("record=%v: truncated snapshot: %v, want ErrSnapshot", record, err)
		}
	}
}
