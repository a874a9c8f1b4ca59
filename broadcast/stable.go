package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
)

// StableState is what a replica keeps across restarts (its "disk"): the
// incarnation counter and the epoch it promised to join (E_new).
type StableState struct {
	// Incarnation counts boots; 0 means the replica never ran.
	Incarnation uint64
	// ENew is the highest epoch this replica voted for or joined.
	ENew Epoch
}

// Stable persists a StableState. A vote is recorded before it is published:
// the replica calls Save, and only then pushes a vote or an accept that
// raised E_new (docs/broadcast.md, "A vote is recorded before it is
// published").
type Stable interface {
	// Load returns the saved state, the zero state if nothing was saved.
	Load() (StableState, error)
	// Save records s durably before it returns.
	Save(s StableState) error
}

// MemStable is an in-memory Stable, for tests and the simulator (hand the
// same value to a restarted replica to model a disk that survived).
type MemStable struct {
	mu sync.Mutex
	s  StableState
}

// Load implements Stable.
func (m *MemStable) Load() (StableState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s, nil
}

// Save implements Stable.
func (m *MemStable) Save(s StableState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.s = s
	return nil
}

// FileStable is a Stable in one small file, replaced atomically (write a
// temporary file, fsync, rename, fsync the directory).
type FileStable struct {
	Path string
}

// stable file: [magic u32][incarnation u64][e_new u64][crc32 u32], little-endian.
const (
	stableMagic = 0x41435544 // "ACUD"
	stableLen   = 24
)

// ErrCorrupt: the stable file failed validation.
var ErrCorrupt = errors.New("broadcast: stable file corrupt")

// Load implements Stable.
func (f FileStable) Load() (StableState, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return StableState{}, nil
	}
	if err != nil {
		return StableState{}, fmt.Errorf("broadcast: load stable state: %w", err)
	}
	st, ok := decodeStable(b)
	if !ok {
		return StableState{}, fmt.Errorf("broadcast: load stable state from %s (%d bytes): %w", f.Path, len(b), ErrCorrupt)
	}
	return st, nil
}

// encodeStable lays out the stable file.
func encodeStable(s StableState) [stableLen]byte {
	var b [stableLen]byte
	binary.LittleEndian.PutUint32(b[0:], stableMagic)
	binary.LittleEndian.PutUint64(b[4:], s.Incarnation)
	binary.LittleEndian.PutUint64(b[12:], uint64(s.ENew))
	binary.LittleEndian.PutUint32(b[20:], crc32.ChecksumIEEE(b[:20]))
	return b
}

// decodeStable validates a stable file's bytes.
func decodeStable(b []byte) (StableState, bool) {
	if len(b) != stableLen || binary.LittleEndian.Uint32(b) != stableMagic || crc32.ChecksumIEEE(b[:20]) != binary.LittleEndian.Uint32(b[20:]) {
		return StableState{}, false
	}
	return StableState{Incarnation: binary.LittleEndian.Uint64(b[4:]), ENew: Epoch(binary.LittleEndian.Uint64(b[12:]))}, true
}

// Save implements Stable.
func (f FileStable) Save(s StableState) error {
	b := encodeStable(s)
	tmp := f.Path + ".tmp"
	fd, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("broadcast: save stable state: %w", err)
	}
	if _, err := fd.Write(b[:]); err != nil {
		fd.Close()
		return fmt.Errorf("broadcast: save stable state: %w", err)
	}
	if err := fd.Sync(); err != nil {
		fd.Close()
		return fmt.Errorf("broadcast: save stable state: fsync: %w", err)
	}
	if err := fd.Close(); err != nil {
		return fmt.Errorf("broadcast: save stable state: %w", err)
	}
	if err := os.Rename(tmp, f.Path); err != nil {
		return fmt.Errorf("broadcast: save stable state: %w", err)
	}
	d, err := os.Open(filepath.Dir(f.Path))
	if err != nil {
		return fmt.Errorf("broadcast: save stable state: open dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("broadcast: save stable state: fsync dir: %w", err)
	}
	return nil
}
