package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/wal"
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
// temporary file, fsync it, rename it over the old one, fsync the
// directory: a crash leaves either the old file or the new one). Its Save
// blocks for all of that; AsyncFileStable runs the same steps off the
// polling goroutine.
type FileStable struct {
	Path string
	// FS is the file system (nil: the operating system's).
	FS vfs.FS
}

func (f FileStable) fs() vfs.FS {
	if f.FS == nil {
		return vfs.OS
	}
	return f.FS
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
	b, err := vfs.ReadFile(f.fs(), f.Path)
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

// stableOps are a save's IOs, in two phases: the temporary file written
// and synced (a failure there leaves the stable file as it was: a full
// disk is retried), then, only once the first phase succeeded, the rename
// over the stable file and the directory's sync.
func (f FileStable) stableOps(b []byte) (write, install [3]wal.IO) {
	tmp := f.Path + ".tmp"
	write = [3]wal.IO{
		{Kind: wal.IOCreate, Path: tmp, Quiet: true},
		{Kind: wal.IOWrite, Path: tmp, Data: b, Quiet: true},
		{Kind: wal.IOSync, Path: tmp},
	}
	install = [3]wal.IO{
		{Kind: wal.IORename, Path: tmp, To: f.Path, Quiet: true},
		{Kind: wal.IOSyncDir, Path: filepath.Dir(f.Path)},
	}
	return write, install
}

// Save implements Stable: it returns once s is durable.
func (f FileStable) Save(s StableState) error {
	b := encodeStable(s)
	x := wal.NewExecutor(f.fs())
	defer x.Close()
	write, install := f.stableOps(b[:])
	for _, op := range append(write[:], install[:]...) {
		if op.Kind == 0 {
			continue
		}
		if err := x.Do(op); err != nil {
			return fmt.Errorf("broadcast: save stable state: %s %s: %w", op.Kind, op.Path, err)
		}
	}
	return nil
}

// AsyncStable is a Stable that also saves without blocking, the way the
// log's records are written: the replica starts a save (SaveAsync) and
// goes on polling; a later Poll reaps its completion (Saved), and only
// then publishes the vote or the accept that needed it (docs/broadcast.md,
// "A vote is recorded before it is published"). New still calls Save (the
// replica is not on a poller yet).
type AsyncStable interface {
	Stable
	// SaveAsync starts saving s, or, while a save runs, makes s the one
	// saved after it (replacing one that waited: only the latest
	// matters). It never blocks.
	SaveAsync(s StableState)
	// Saved appends the saves that completed since the last call, in
	// the order they ran. A save whose Err is nil is durable.
	Saved(dst []StableSaved) []StableSaved
}

// StableSaved is a completed asynchronous save.
type StableSaved struct {
	State StableState
	Err   error
}

// AsyncFileStable is a FileStable whose asynchronous saves go through a
// wal.Device of their own (in production a wal.FileDevice whose kick is
// the replica's doorbell; in the simulator a sim.DiskDevice): a vote
// waits for its own small file, never behind the log's batches or a disk
// snapshot's writes queued on the log's device. One save runs at a time;
// a save asked for meanwhile waits, and a later one replaces it.
type AsyncFileStable struct {
	FileStable
	dev wal.Device

	cur, next *StableState // the save running (nil: none), the one after it
	phase     int          // cur's: 1 writing the temporary file, 2 installing it
	tag       uint64       // the phase's IOs' tag (one per phase submitted)
	left      int          // the phase's IOs not completed yet
	err       error        // cur's first error
	buf       [stableLen]byte
	done      []StableSaved
	reaped    []wal.Done
}

// NewAsyncFileStable returns f saving asynchronously through dev (which
// it does not close).
func NewAsyncFileStable(f FileStable, dev wal.Device) *AsyncFileStable {
	return &AsyncFileStable{FileStable: f, dev: dev}
}

// SaveAsync implements AsyncStable.
func (a *AsyncFileStable) SaveAsync(s StableState) {
	if a.cur != nil {
		a.next = &s
		return
	}
	a.start(s)
}

func (a *AsyncFileStable) start(s StableState) {
	a.cur, a.next, a.err = &s, nil, nil
	a.buf = encodeStable(s)
	a.submitPhase(1)
}

// submitPhase submits phase p's IOs, tagged with p. The device is the
// stable state's own and holds at most three of them: a refusal is a
// bug of its owner, reported as the save's error.
func (a *AsyncFileStable) submitPhase(p int) {
	a.phase, a.left = p, 0
	a.tag++
	write, install := a.stableOps(a.buf[:])
	ops := write
	if p == 2 {
		ops = install
	}
	for _, op := range ops {
		if op.Kind == 0 {
			continue
		}
		op.Tag = a.tag
		if !a.dev.Submit(op) {
			a.err = fmt.Errorf("broadcast: save stable state: the device refused %s %s", op.Kind, op.Path)
			a.finish()
			return
		}
		a.left++
	}
}

// finish reports cur and starts next.
func (a *AsyncFileStable) finish() {
	a.done = append(a.done, StableSaved{State: *a.cur, Err: a.err})
	a.cur = nil
	if a.next != nil {
		a.start(*a.next)
	}
}

// Saved implements AsyncStable.
func (a *AsyncFileStable) Saved(dst []StableSaved) []StableSaved {
	if a.cur != nil {
		a.reaped = a.dev.Reap(a.reaped[:0])
		for _, d := range a.reaped {
			if a.cur == nil || d.Tag != a.tag {
				continue // an IO of a phase that a refusal ended
			}
			if d.Err != nil && a.err == nil {
				step := "write the temporary file"
				if a.phase == 2 {
					step = "install it"
				}
				a.err = fmt.Errorf("broadcast: save stable state to %s: %s: %w", a.Path, step, d.Err)
			}
			if a.left--; a.left > 0 {
				continue
			}
			if a.err != nil || a.phase == 2 {
				a.finish()
			} else {
				a.submitPhase(2)
			}
		}
	}
	dst = append(dst, a.done...)
	a.done = a.done[:0]
	return dst
}

// stableSaves is the replica's side of its stable state's saves. With a
// Stable that saves synchronously (MemStable, the simulator's stores),
// saveENew calls Save where the protocol needs it and the vote or accept
// goes out in the same Poll, as it always did. With an AsyncStable the
// save runs off the polling goroutine: the step that needs E_new >= e
// (setVote, recoverENew, acceptDiff) asks for it and is retried on later
// Polls until a save holding e or more has completed; the Poll that reaps
// the completion (the device wakes the poller) publishes it.
type stableSaves struct {
	async AsyncStable // nil: Save blocks
	saved Epoch       // the highest E_new a completed save holds (this incarnation)
	asked Epoch       // the highest E_new handed to SaveAsync and not failed
	asks  []stableAsk // asked, not completed yet, in order
	// full: the last save found the disk full (ENOSPC, EDQUOT): no new
	// save is asked for before retryAt. Nothing is published meanwhile.
	full    bool
	retryAt time.Duration
	fullErr error
	err     error // a save failed otherwise: the replica stopped (ErrDisk)
	buf     []StableSaved
	// maxTook is the longest asynchronous save, ask to completion reaped.
	maxTook time.Duration
}

type stableAsk struct {
	e  Epoch
	at time.Duration
}

// saveENew reports whether E_new = e is durable, so that a vote or an
// accept that promises e may be published now. With an AsyncStable it
// asks for a save of e (unless one of e or more runs already) and reports
// false until one completed. A synchronous Stable saves e before it
// returns; a failed save is not published.
func (r *Replica) saveENew(e Epoch) bool {
	s := &r.saves
	if s.err != nil {
		return false
	}
	if s.async == nil {
		if err := r.stable.Save(StableState{Incarnation: r.inc, ENew: e}); err != nil {
			r.tracef("node %d: save e_new: %v", r.self, err)
			r.stableFailed(err)
			return false
		}
		s.saved = max(s.saved, e)
		return true
	}
	if e <= s.saved {
		return true
	}
	if e > s.asked && r.now >= s.retryAt {
		s.async.SaveAsync(StableState{Incarnation: r.inc, ENew: e})
		s.asked = e
		s.asks = append(s.asks, stableAsk{e: e, at: r.now})
		r.tracef("node %d saves e_new %v", r.self, e)
	}
	if r.knobs.publishAsked && e <= s.asked {
		return true // planted: published once asked, before it is durable
	}
	return false
}

// stableFailed handles a failed save: a full disk is retried (nothing is
// published meanwhile: the vote or accept waits); anything else stops
// the replica, as a failed fsync of the log does (the kernel may have
// dropped what it could not write back: never retry and carry on).
func (r *Replica) stableFailed(err error) {
	s := &r.saves
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		if !s.full {
			r.ctr.StableSavesFull++
		}
		s.full, s.fullErr = true, err
		s.retryAt = r.now + r.cfg.ElectionTimeout/8
		return
	}
	s.err = fmt.Errorf("%w: member %d: stable state: %w", ErrDisk, r.self, err)
	r.tracef("node %d stops: %v", r.self, s.err)
}

// reapStable takes the asynchronous saves that completed (Poll, first).
func (r *Replica) reapStable() {
	s := &r.saves
	if s.async == nil || s.err != nil || len(s.asks) == 0 {
		return
	}
	s.buf = s.async.Saved(s.buf[:0])
	for _, d := range s.buf {
		e := d.State.ENew
		var at time.Duration = -1
		k := 0
		for ; k < len(s.asks) && s.asks[k].e <= e; k++ {
			if s.asks[k].e == e {
				at = s.asks[k].at
			}
		}
		if d.Err != nil {
			if e >= s.asked {
				s.asked = s.saved // ask again (after retryAt on a full disk)
			}
			s.asks = s.asks[k:]
			r.stableFailed(d.Err)
			if s.err != nil {
				return
			}
			continue
		}
		s.asks = s.asks[k:]
		s.saved = max(s.saved, e)
		s.full, s.fullErr = false, nil
		r.ctr.StableSaves++
		if at >= 0 {
			took := r.now - at
			r.ctr.StableSaveNanos += uint64(took)
			s.maxTook = max(s.maxTook, took)
		}
		r.tracef("node %d saved e_new %v", r.self, e)
	}
}

// stableWaiting reports that a step waits for an asynchronous save whose
// completion wakes the poller.
func (r *Replica) stableWaiting() bool {
	s := &r.saves
	return s.async != nil && s.err == nil && len(s.asks) > 0
}

// promised is the epoch below which the replica accepts nothing: E_new,
// or the E_new of an asynchronous save asked for and not consumed yet,
// which may be on disk already. A member must never accept entries of an
// epoch below what its disk promises: restarted, it would publish that
// promise (a vote with no accepted header) having forgotten them.
func (r *Replica) promised() Epoch { return max(r.eNew, r.saves.asked) }

// adoptSaved (end of Poll) takes a completed save that no step used (the
// vote or the diff that asked for it no longer stands) as our promise:
// the disk holds it, so we keep it and publish it as a restarted member
// publishes the promise its disk kept, with no accepted header (a vote for
// another member's epoch with our Accepted would be one its candidate
// never cast, which it could join and win with a log it does not hold),
// or, for our own epoch, as our vote; and we elect past the epoch we
// followed or led (we no longer accept it).
func (r *Replica) adoptSaved() {
	s := &r.saves
	if s.async == nil || s.err != nil || len(s.asks) > 0 || s.saved <= r.eNew {
		return
	}
	r.tracef("node %d keeps e_new %v: saved, and no longer needed by the step that asked", r.self, s.saved)
	r.setENew(s.saved)
	r.vote = Vote{ENew: s.saved}
	if s.saved.Leader() == r.self {
		r.vote.Acpt = r.accepted
	}
	if r.role != Electing {
		r.startElection(false)
	}
}
