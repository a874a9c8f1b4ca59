package groupproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/broadcast"
)

// FSM is the members' state machine. It always keeps the number of
// delivered entries and a running hash of them (Digest); in record mode it
// also keeps every entry, so that tests can compare delivered sequences
// entry by entry. Its snapshot carries the same state, so a member that
// caught up by snapshot still has the whole sequence (record mode) or the
// same digest.
//
// # Ballast state
//
// An FSM made with a state size (Config.StateBytes, NewStateFSM) also
// carries that many bytes of ballast that is really part of the replicated
// state, so that benchmarks can catch members up with large snapshots: it
// is allocated at start in chunks (StateChunk bytes each, the last one
// shorter), filled deterministically (word k holds (k+1)*phi64), and Apply
// writes 8 bytes derived from the entry (the hash chain after it) into
// chunk (index-1) mod chunks, at word ((index-1) div chunks) mod its
// words. Every replica that applied the same entries therefore holds the
// same bytes (Digest.State hashes them).
//
// Snapshot captures the ballast copy on write: the capture holds the chunk
// slices as they are, and Apply copies a chunk before its first write
// after a capture while any capture is live (not Released), so a capture
// never changes while Persist reads it on another goroutine. Taking one
// costs a copy of the chunk table (and, in record mode, the entries'
// encoding), not of the state. Restore adopts the fetched bytes: the
// chunks are slices of the snapshot buffer, not copies.
type FSM struct {
	mu      sync.Mutex
	record  bool
	index   uint64
	hash    uint64
	entries []string

	stateBytes int64
	chunkSize  int
	chunks     [][]byte
	// Copy on write: gen counts captures; madeAt[c] is the gen at which
	// chunks[c] was last made (allocated, copied or restored). While live
	// captures exist, chunk c is shared with the newest one (and perhaps
	// older ones) unless madeAt[c] == gen.
	madeAt []uint64
	gen    uint64
	live   int
	stats  FSMStats
	knobs  fsmKnobs
}

// fsmKnobs are the planted bugs of the FSM's tests.
type fsmKnobs struct {
	// persistNoYield: Persist copies the chunks without yielding between
	// them (TestFSMPersistPreemptible: no goroutine runs on the process's
	// one P until it ends).
	persistNoYield bool
}

// StateChunk is the ballast's chunk size, the unit of copy on write: what
// one Apply may copy after a capture. 64 KiB copies in microseconds (a
// 1 MiB chunk took 0.3-3 ms to copy into fresh memory on the project's
// 2-core machine, a commit-latency spike per chunk); 4096 chunks make a
// 256 MiB state, whose capture copies a 96 KiB chunk table.
const StateChunk = 64 << 10

// Digest is the FSM's summary: how many entries it delivered and the hash
// chain over them (equal digests at equal indices mean equal sequences),
// and, with a ballast state, its size and a hash of its bytes (equal at
// equal indices if every replica's state is the same).
type Digest struct {
	Index      uint64 `json:"index"`
	Hash       uint64 `json:"hash"`
	StateBytes int64  `json:"state_bytes,omitempty"`
	State      uint64 `json:"state,omitempty"` // xxhash of the ballast, chunks in order
}

// FSMStats count what the FSM did with its snapshots (times are Unix
// nanoseconds, 0 if it never happened).
type FSMStats struct {
	StateBytes    int64  `json:"state_bytes"`
	Captures      uint64 `json:"captures"`        // Snapshot calls (Digest takes captures of its own, not counted)
	Live          int    `json:"live"`            // captures not released
	LastCaptureNS int64  `json:"last_capture_ns"` // how long the last Snapshot call took
	MaxCaptureNS  int64  `json:"max_capture_ns"`
	ChunkCopies   uint64 `json:"chunk_copies"` // copies on write
	CopiedBytes   uint64 `json:"copied_bytes"`
	MaxCopyNS     int64  `json:"max_copy_ns"` // the longest copy on write (one Apply's extra time)
	Persists      uint64 `json:"persists"`
	LastPersistNS int64  `json:"last_persist_ns"` // duration of the last Persist
	PersistedAt   int64  `json:"persisted_at"`    // when it ended
	CapturedAt    int64  `json:"captured_at"`     // when the last Snapshot was taken
	Restores      uint64 `json:"restores"`
	RestoredAt    int64  `json:"restored_at"`
}

// ErrSnapshot: a snapshot handed to Restore is malformed.
var ErrSnapshot = errors.New("groupproc: malformed snapshot")

// NewFSM returns an empty FSM; record keeps every entry.
func NewFSM(record bool) *FSM { return newFSM(record, 0, StateChunk) }

// NewStateFSM returns an FSM with a ballast state of stateBytes bytes (see
// FSM); record keeps every entry.
func NewStateFSM(record bool, stateBytes int64) *FSM {
	return newFSM(record, stateBytes, StateChunk)
}

// phi64 is 2^64 / the golden ratio: the ballast's fill multiplier.
const phi64 = 0x9E3779B97F4A7C15

func newFSM(record bool, stateBytes int64, chunk int) *FSM {
	f := &FSM{record: record, stateBytes: max(stateBytes, 0), chunkSize: chunk}
	f.stats.StateBytes = f.stateBytes
	var word uint64
	for left := f.stateBytes; left > 0; {
		n := int(min(left, int64(chunk)))
		c := make([]byte, n)
		i := 0
		for ; i+8 <= n; i += 8 {
			word++
			binary.LittleEndian.PutUint64(c[i:], word*phi64)
		}
		for ; i < n; i++ {
			c[i] = byte(i)
		}
		f.chunks = append(f.chunks, c)
		left -= int64(n)
	}
	f.madeAt = make([]uint64, len(f.chunks))
	return f
}

// chain folds one entry into the running hash (xxhash, seeded with the
// previous link: cheap enough that a 1000-byte benchmark measures the
// protocol rather than the FSM).
func chain(h uint64, data []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(h)
	d.Write(data)
	return d.Sum64()
}

// Apply implements broadcast.FSM; its result is nil.
func (f *FSM) Apply(e broadcast.Entry) []byte {
	index, data := e.Index, e.Data
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
	if len(f.chunks) > 0 {
		f.writeState(index)
	}
	return nil
}

// writeState writes the entry's 8 bytes into the ballast (f.mu held),
// copying the chunk first if a live capture shares it.
func (f *FSM) writeState(index uint64) {
	n := uint64(len(f.chunks))
	c := int((index - 1) % n)
	ch := f.chunks[c]
	if f.live > 0 && f.madeAt[c] != f.gen {
		t := time.Now()
		ch = bytes.Clone(ch)
		ch = ch[:len(ch):len(ch)]
		f.chunks[c], f.madeAt[c] = ch, f.gen
		f.stats.ChunkCopies++
		f.stats.CopiedBytes += uint64(len(ch))
		f.stats.MaxCopyNS = max(f.stats.MaxCopyNS, int64(time.Since(t)))
	}
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], f.hash)
	off := 0
	if words := len(ch) / 8; words > 0 {
		off = int((index-1)/n%uint64(words)) * 8
	}
	copy(ch[off:], w[:])
}

// Snapshot layout, little-endian:
//
//	[index u64][hash u64][record u8][state u64]
//	then, if record, index times: [len u32][bytes]
//	then the state's bytes (state of them: the ballast, chunks in order)
const headLen = 25

// encodeHead is the snapshot's encoding up to the state bytes (f.mu held).
func (f *FSM) encodeHead() []byte {
	b := binary.LittleEndian.AppendUint64(nil, f.index)
	b = binary.LittleEndian.AppendUint64(b, f.hash)
	if !f.record {
		b = append(b, 0)
		return binary.LittleEndian.AppendUint64(b, uint64(f.stateBytes))
	}
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(f.stateBytes))
	for _, e := range f.entries {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}

// decode validates snapshot s and, if it is well formed for this FSM,
// installs it (the ballast's chunks are slices of s). A malformed s leaves
// the FSM as it was.
func (f *FSM) decode(s []byte) error {
	if len(s) < headLen {
		return fmt.Errorf("groupproc: snapshot of %d bytes: %w", len(s), ErrSnapshot)
	}
	index, hash, flag := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:]), s[16]
	state := binary.LittleEndian.Uint64(s[17:])
	if flag > 1 {
		return fmt.Errorf("groupproc: snapshot record flag %d: %w", flag, ErrSnapshot)
	}
	if state != uint64(f.stateBytes) {
		return fmt.Errorf("groupproc: snapshot with a %d-byte state, this FSM's is %d bytes: %w", state, f.stateBytes, ErrSnapshot)
	}
	rec := flag == 1
	s = s[headLen:]
	var entries []string
	if rec {
		for range index {
			if len(s) < 4 || len(s)-4 < int(binary.LittleEndian.Uint32(s)) {
				return fmt.Errorf("groupproc: snapshot entry %d cut short: %w", len(entries)+1, ErrSnapshot)
			}
			n := int(binary.LittleEndian.Uint32(s))
			entries = append(entries, string(s[4:4+n]))
			s = s[4+n:]
		}
	}
	if uint64(len(s)) != state {
		return fmt.Errorf("groupproc: %d bytes after the snapshot's entries, want its %d-byte state: %w", len(s), state, ErrSnapshot)
	}
	if f.record && !rec {
		return fmt.Errorf("groupproc: recording FSM restored from a digest-only snapshot: %w", ErrSnapshot)
	}
	if !f.record {
		entries = nil // a digest-only FSM keeps no entries
	}
	f.index, f.hash, f.entries = index, hash, entries
	for c := range f.chunks {
		n := len(f.chunks[c])
		f.chunks[c] = s[:n:n]
		f.madeAt[c] = f.gen // shared with no capture
		s = s[n:]
	}
	return nil
}

// capture is the FSM's broadcast.FSMSnapshot: the encoded head and the
// ballast's chunks as they were when it was taken.
type capture struct {
	f        *FSM
	head     []byte
	chunks   [][]byte
	size     int
	released bool
}

// Size implements broadcast.FSMSnapshot.
func (c *capture) Size() int { return c.size }

// Persist implements broadcast.FSMSnapshot: it copies the head and the
// chunks into dst; Apply meanwhile writes copies of the chunks it touches.
func (c *capture) Persist(dst []byte) error {
	if len(dst) != c.size {
		return fmt.Errorf("groupproc: persist a %d-byte snapshot into %d bytes", c.size, len(dst))
	}
	t := time.Now()
	n := copy(dst, c.head)
	for _, ch := range c.chunks {
		n += copy(dst[n:], ch)
		// A loop of copies is all memmove, where the runtime cannot
		// preempt a goroutine: without a preemption point, a stop of the
		// world (a GC cycle the driver goroutine's allocations start, or
		// its mark termination) waits for the whole Persist, and so does
		// the polling goroutine (52 ms for 64 MiB into fresh memory).
		if !c.f.knobs.persistNoYield {
			runtime.Gosched()
		}
	}
	end := time.Now()
	c.f.mu.Lock()
	c.f.stats.Persists++
	c.f.stats.LastPersistNS = int64(end.Sub(t))
	c.f.stats.PersistedAt = end.UnixNano()
	c.f.mu.Unlock()
	return nil
}

// Release implements broadcast.FSMSnapshot: once no capture is live, Apply
// writes chunks in place again.
func (c *capture) Release() {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	c.chunks = nil
	f.live--
	f.stats.Live = f.live
	if f.live == 0 {
		for i := range f.madeAt {
			f.madeAt[i] = f.gen // nothing shares a chunk any more
		}
	}
}

// capture takes a capture (f.mu held).
func (f *FSM) capture() *capture {
	c := &capture{f: f, head: f.encodeHead(), chunks: append([][]byte(nil), f.chunks...)}
	c.size = len(c.head) + int(f.stateBytes)
	f.gen++
	f.live++
	f.stats.Live = f.live
	return c
}

// Snapshot implements broadcast.FSM: a copy-on-write capture (see FSM).
func (f *FSM) Snapshot() (broadcast.FSMSnapshot, error) {
	t := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.capture()
	f.stats.Captures++
	d := int64(time.Since(t))
	f.stats.LastCaptureNS, f.stats.MaxCaptureNS, f.stats.CapturedAt = d, max(f.stats.MaxCaptureNS, d), t.UnixNano()
	return c, nil
}

// snapshotBytes is the snapshot's encoding (what Restore takes).
func (f *FSM) snapshotBytes() ([]byte, error) {
	s, err := f.Snapshot()
	if err != nil {
		return nil, err
	}
	defer s.Release()
	b := make([]byte, s.Size())
	return b, s.Persist(b)
}

// Restore implements broadcast.FSM. The FSM keeps s: its ballast is slices
// of it.
func (f *FSM) Restore(s []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.decode(s); err != nil {
		return err
	}
	f.stats.Restores++
	f.stats.RestoredAt = time.Now().UnixNano()
	return nil
}

// Digest returns the count and hash of the entries delivered so far and,
// with a ballast, a hash of it: computed on demand from a capture, off the
// lock, so Apply goes on (copying on write) meanwhile.
func (f *FSM) Digest() Digest {
	f.mu.Lock()
	if len(f.chunks) == 0 {
		defer f.mu.Unlock()
		return Digest{Index: f.index, Hash: f.hash, StateBytes: f.stateBytes}
	}
	c := f.capture()
	f.mu.Unlock()
	defer c.Release()
	return c.digest()
}

// digest is the Digest of the state c captured.
func (c *capture) digest() Digest {
	d := Digest{Index: binary.LittleEndian.Uint64(c.head), Hash: binary.LittleEndian.Uint64(c.head[8:]), StateBytes: c.f.stateBytes}
	if len(c.chunks) > 0 {
		h := xxhash.New()
		for _, ch := range c.chunks {
			h.Write(ch)
		}
		d.State = h.Sum64()
	}
	return d
}

// Stats returns what the FSM did with its snapshots so far.
func (f *FSM) Stats() FSMStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Entries returns a copy of the delivered entries (record mode; nil
// otherwise).
func (f *FSM) Entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.entries...)
}
