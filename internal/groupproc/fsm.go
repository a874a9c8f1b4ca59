package groupproc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/broadcast"
)

// FSM is the members' state machine. It always keeps the number of
// delivered entries and a running hash of them (Digest); in record mode it
// also keeps every entry, so that tests can compare delivered sequences
// entry by entry. Its snapshot carries the same state, so a member that
// caught up by snapshot still has the whole sequence (record mode) or the
// same digest.
type FSM struct {
	mu      sync.Mutex
	record  bool
	index   uint64
	hash    uint64
	entries []string
}

// Digest is the FSM's summary: how many entries it delivered and the hash
// chain over them (equal digests at equal indices mean equal sequences).
type Digest struct {
	Index uint64 `json:"index"`
	Hash  uint64 `json:"hash"`
}

// ErrSnapshot: a snapshot handed to Restore is malformed.
var ErrSnapshot = errors.New("groupproc: malformed snapshot")

// NewFSM returns an empty FSM; record keeps every entry.
func NewFSM(record bool) *FSM { return &FSM{record: record} }

// chain folds one entry into the running hash (xxhash, seeded with the
// previous link: cheap enough that a 1000-byte benchmark measures the
// protocol rather than the FSM).
func chain(h uint64, data []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(h)
	d.Write(data)
	return d.Sum64()
}

// Apply implements broadcast.FSM.
func (f *FSM) Apply(index uint64, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if index != f.index+1 {
		// broadcast delivers 1, 2, ... after the last Restore; anything
		// else is a bug this harness exists to catch, so keep the evidence.
		panic(fmt.Sprintf("groupproc: apply index %d after %d", index, f.index))
	}
	f.index = index
	f.hash = chain(f.hash, data)
	if f.record {
		f.entries = append(f.entries, string(data))
	}
}

// Snapshot layout, little-endian:
//
//	[index u64][hash u64][record u8] then, if record, index times:
//	[len u32][bytes]
func (f *FSM) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, f.index)
	b = binary.LittleEndian.AppendUint64(b, f.hash)
	if !f.record {
		return append(b, 0)
	}
	b = append(b, 1)
	for _, e := range f.entries {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}

func (f *FSM) decode(s []byte) error {
	if len(s) < 17 {
		return fmt.Errorf("groupproc: snapshot of %d bytes: %w", len(s), ErrSnapshot)
	}
	index, hash, flag := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:]), s[16]
	if flag > 1 {
		return fmt.Errorf("groupproc: snapshot record flag %d: %w", flag, ErrSnapshot)
	}
	rec := flag == 1
	s = s[17:]
	var entries []string
	if rec {
		for range index {
			if len(s) < 4 || len(s) < 4+int(binary.LittleEndian.Uint32(s)) {
				return fmt.Errorf("groupproc: snapshot entry %d cut short: %w", len(entries)+1, ErrSnapshot)
			}
			n := int(binary.LittleEndian.Uint32(s))
			entries = append(entries, string(s[4:4+n]))
			s = s[4+n:]
		}
	}
	if len(s) != 0 {
		return fmt.Errorf("groupproc: %d stray bytes after the snapshot: %w", len(s), ErrSnapshot)
	}
	if f.record && !rec {
		return fmt.Errorf("groupproc: recording FSM restored from a digest-only snapshot: %w", ErrSnapshot)
	}
	if !f.record {
		entries = nil // a digest-only FSM keeps no entries
	}
	f.index, f.hash, f.entries = index, hash, entries
	return nil
}

// Snapshot implements broadcast.FSM: the state is small (a digest, or the
// test's entries), so the capture is a copy of its encoding.
func (f *FSM) Snapshot() (broadcast.FSMSnapshot, error) {
	b, err := f.snapshotBytes()
	return broadcast.BytesSnapshot(b), err
}

// snapshotBytes is the snapshot's encoding (what Restore takes).
func (f *FSM) snapshotBytes() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.encode(), nil
}

// Restore implements broadcast.FSM.
func (f *FSM) Restore(s []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.decode(s)
}

// Digest returns the count and hash of the entries delivered so far.
func (f *FSM) Digest() Digest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Digest{Index: f.index, Hash: f.hash}
}

// Entries returns a copy of the delivered entries (record mode; nil
// otherwise).
func (f *FSM) Entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.entries...)
}
