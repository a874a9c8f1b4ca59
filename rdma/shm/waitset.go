package shm

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// A poller that owns the replicas of several nodes parks once for all of
// them: one FUTEX_WAITV (Linux 5.16) over every node's seq word and a
// private kick word, built once, with an absolute CLOCK_MONOTONIC timeout.
// Ringers are unchanged, in this process or another: bump seq, FUTEX_WAKE
// if someone is parked (the set bumps each node's parked word around its
// park). Without FUTEX_WAITV (older kernels, a seccomp filter that refuses
// it) the set sleeps in FUTEX_WAIT on its first node's word, looking at
// the others at least every millisecond.
//
// Every futex sleep of this package enters the kernel as a system call
// known to block (the runtime's entersyscallblock, as its own blocking
// sleeps do), which gives the goroutine's P back at once. A goroutine in a
// plain futex(2) call keeps its P until sysmon takes it back, and sysmon,
// idle, looks only every 10 ms: a process whose pollers and waiters all
// slept holding the Ps left a goroutine made runnable meanwhile waiting up
// to 10 ms.

// futexWaitv is struct futex_waitv (linux/futex.h).
type futexWaitv struct {
	val      uint64
	uaddr    uint64
	flags    uint32
	reserved uint32
}

const (
	futexWaitBitset = 9          // FUTEX_WAIT_BITSET: absolute CLOCK_MONOTONIC timeout
	futexBitsetAny  = 0xffffffff // FUTEX_BITSET_MATCH_ANY
	futex2SizeU32   = 0x02       // FUTEX2_SIZE_U32
	futex2Private   = 128        // FUTEX2_PRIVATE
	futexWaitvMax   = 128        // FUTEX_WAITV_MAX
	futexPrivate    = 128        // FUTEX_PRIVATE_FLAG for futex(2)
	sysFutexWaitv   = 449        // the same number on every Linux architecture
	clockMonotonic  = 1          // CLOCK_MONOTONIC
)

// hasWaitv reports whether the kernel takes FUTEX_WAITV: an empty list is
// EINVAL where it exists, ENOSYS (or a seccomp refusal) where not.
var hasWaitv = sync.OnceValue(func() bool {
	_, _, e := unix.Syscall6(sysFutexWaitv, 0, 0, 0, 0, 0, 0)
	return e == unix.EINVAL
})

// noWaitv forces the FUTEX_WAIT fallback (tests).
var noWaitv atomic.Bool

// holdWaits makes every Wait a WaitHolding (tests: the WaitSet
// conformance cases run on held parks).
var holdWaits atomic.Bool

// monoBase is CLOCK_MONOTONIC minus rdma.Mono: the Go runtime's monotonic
// clock is CLOCK_MONOTONIC on Linux, so the difference is constant.
var monoBase = sync.OnceValue(func() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano()) - rdma.Mono()
})

// absTimespec is the CLOCK_MONOTONIC time of the rdma.Mono time t.
func absTimespec(t time.Duration) unix.Timespec {
	return unix.NsecToTimespec(int64(monoBase() + t))
}

// The runtime's own entry and exit of a system call known to block: the P
// is handed off at entry (sysmon is not waited for) and taken again, or
// another one, at exit. Reached by linkname; the runtime keeps both for
// such callers (see go.dev/issue/67401).
//
//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()

//go:linkname entersyscall runtime.entersyscall
func entersyscall()

// futexWaitvBlocking is FUTEX_WAITV on n entries at ws until the absolute
// CLOCK_MONOTONIC time at ts, with the goroutine's P given back while it
// sleeps. Nosplit and a raw system call between the two runtime calls:
// nothing may grow the stack or preempt in between.
//
//go:nosplit
//go:norace
func futexWaitvBlocking(ws unsafe.Pointer, n int, ts unsafe.Pointer) {
	entersyscallblock()
	unix.RawSyscall6(sysFutexWaitv, uintptr(ws), uintptr(n), 0, uintptr(ts), clockMonotonic, 0)
	exitsyscall()
}

// futexWaitvHolding is futexWaitvBlocking keeping the goroutine's P
// (a plain system call: WaitHolding).
//
//go:nosplit
//go:norace
func futexWaitvHolding(ws unsafe.Pointer, n int, ts unsafe.Pointer) {
	entersyscall()
	unix.RawSyscall6(sysFutexWaitv, uintptr(ws), uintptr(n), 0, uintptr(ts), clockMonotonic, 0)
	exitsyscall()
}

// futexWaitBlocking is FUTEX_WAIT_BITSET (any bit; op adds
// FUTEX_PRIVATE_FLAG or not) on the word at addr while it holds val, until
// the absolute CLOCK_MONOTONIC time at ts, with the P given back (as
// futexWaitvBlocking).
//
//go:nosplit
//go:norace
func futexWaitBlocking(addr unsafe.Pointer, op uintptr, val uint32, ts unsafe.Pointer) {
	entersyscallblock()
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(addr), op, uintptr(val), uintptr(ts), 0, futexBitsetAny)
	exitsyscall()
}

// waitSet is the shm rdma.WaitSet.
type waitSet struct {
	dbs    []*doorbell
	ws     []futexWaitv // one per doorbell, then the kick word
	open   []bool       // per doorbell: not closed (its word is in ws)
	ts     unix.Timespec
	kick   uint32 // bumped by Kick; a private futex word
	dummy  uint32 // a closed doorbell's entry waits here (never rung)
	parked atomic.Bool
	seen   uint32 // kick when the last Wait returned
	waitv  bool
}

var (
	_ rdma.WaitSetter     = (*doorbell)(nil)
	_ rdma.HoldingWaitSet = (*waitSet)(nil)
)

// NewWaitSet implements rdma.WaitSetter: a set over shm doorbells (nil
// if one is of another fabric). Over more than futexWaitvMax-1 doorbells
// it waits on the first ones and looks at the rest every millisecond.
func (d *doorbell) NewWaitSet(dbs []rdma.Doorbell) rdma.WaitSet {
	s := &waitSet{waitv: hasWaitv() && !noWaitv.Load()}
	for _, db := range dbs {
		sd, ok := db.(*doorbell)
		if !ok {
			return nil
		}
		s.dbs = append(s.dbs, sd)
	}
	s.ws = make([]futexWaitv, min(len(s.dbs), futexWaitvMax-1)+1)
	s.open = make([]bool, len(s.dbs))
	for i := range s.ws[:len(s.ws)-1] {
		s.ws[i].flags = futex2SizeU32
	}
	k := &s.ws[len(s.ws)-1]
	k.uaddr = uint64(uintptr(unsafe.Pointer(&s.kick)))
	k.flags = futex2SizeU32 | futex2Private
	return s
}

// Snapshot implements rdma.WaitSet.
func (s *waitSet) Snapshot(dst []uint64) []uint64 {
	for _, d := range s.dbs {
		dst = append(dst, d.Seq())
	}
	return dst
}

// changed reports whether a doorbell moved from snap or a Kick came; the
// caller holds every doorbell's read lock.
func (s *waitSet) changed(snap []uint64) bool {
	if atomic.LoadUint32(&s.kick) != s.seen {
		return true
	}
	for i, d := range s.dbs {
		if d.closed.Load() {
			// Closing (its close waits for our read lock: let it
			// finish) or closed with a later Seq than snap.
			if d.nf != nil || d.lastSeq != snap[i] {
				return true
			}
			continue
		}
		if rdma.Load64(d.nf, nodeSeqW) != snap[i] {
			return true
		}
	}
	return false
}

// Wait implements rdma.WaitSet.
func (s *waitSet) Wait(snap []uint64, deadline time.Duration) bool {
	return s.waitFor(snap, deadline, holdWaits.Load())
}

// WaitHolding implements rdma.HoldingWaitSet: Wait in FUTEX_WAITV as a
// plain system call, which keeps the goroutine's P. Without FUTEX_WAITV
// it is Wait.
func (s *waitSet) WaitHolding(snap []uint64, deadline time.Duration) bool {
	return s.waitFor(snap, deadline, true)
}

func (s *waitSet) waitFor(snap []uint64, deadline time.Duration, hold bool) bool {
	for _, d := range s.dbs {
		d.mu.RLock()
	}
	woken := s.wait(snap, deadline, hold)
	for _, d := range s.dbs {
		d.mu.RUnlock()
	}
	s.seen = atomic.LoadUint32(&s.kick)
	return woken
}

func (s *waitSet) wait(snap []uint64, deadline time.Duration, hold bool) bool {
	if s.changed(snap) {
		return true
	}
	if deadline <= 0 || deadline <= rdma.Mono() {
		return false
	}
	// Announce the park (each node's parked word, our own flag for Kick),
	// then look once more: a ringer bumps seq before it looks at parked.
	for i, d := range s.dbs {
		s.open[i] = !d.closed.Load()
		if s.open[i] {
			announcePark(d.nf)
		}
	}
	s.parked.Store(true)
	woken := s.park(snap, deadline, hold)
	s.parked.Store(false)
	for i, d := range s.dbs {
		if s.open[i] {
			rdma.Add64(d.nf, nodeParkedW, ^uint64(0))
		}
	}
	return woken
}

// park sleeps until a word moves or deadline; the doorbells are announced
// parked. hold: FUTEX_WAITV keeps the P (WaitHolding).
func (s *waitSet) park(snap []uint64, deadline time.Duration, hold bool) bool {
	n := len(s.ws) - 1
	for i := range s.ws[:n] {
		d := s.dbs[i]
		if s.open[i] {
			s.ws[i].uaddr = uint64(uintptr(unsafe.Pointer(&d.nf[nodeSeqW:][:8][0])))
			s.ws[i].val = uint64(uint32(snap[i]))
		} else {
			s.ws[i].uaddr = uint64(uintptr(unsafe.Pointer(&s.dummy)))
			s.ws[i].val = 0
		}
	}
	s.ws[n].val = uint64(s.seen)
	for !s.changed(snap) {
		now := rdma.Mono()
		if now >= deadline {
			return false
		}
		// Several doorbells beyond what one wait covers: look again
		// every millisecond.
		until := min(deadline, now+time.Hour) // no overflow for a far deadline
		if !s.waitv && len(s.dbs) > 1 || len(s.dbs) > n {
			until = min(deadline, now+time.Millisecond)
		}
		s.ts = absTimespec(until)
		// Both return at once (EAGAIN) if a word no longer holds its
		// value, on a wake, on a signal (EINTR) or at the timeout: all
		// recheck.
		switch {
		case s.waitv && hold:
			futexWaitvHolding(unsafe.Pointer(&s.ws[0]), len(s.ws), unsafe.Pointer(&s.ts))
		case s.waitv:
			futexWaitvBlocking(unsafe.Pointer(&s.ws[0]), len(s.ws), unsafe.Pointer(&s.ts))
		case n > 0 && s.open[0]:
			futexWaitBlocking(unsafe.Pointer(&s.dbs[0].nf[nodeSeqW:][:8][0]), futexWaitBitset, uint32(snap[0]), unsafe.Pointer(&s.ts))
		default:
			futexWaitBlocking(unsafe.Pointer(&s.kick), futexWaitBitset|futexPrivate, s.seen, unsafe.Pointer(&s.ts))
		}
	}
	return true
}

// Kick implements rdma.WaitSet.
func (s *waitSet) Kick() {
	atomic.AddUint32(&s.kick, 1)
	if !s.parked.Load() {
		return
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&s.kick)), futexWake|futexPrivate, 1, 0, 0, 0)
	if !s.waitv && len(s.dbs) > 0 {
		// The fallback sleeps on the first doorbell's word (or on the
		// kick word when that doorbell is closed).
		d := s.dbs[0]
		d.mu.RLock()
		if !d.closed.Load() {
			futex(d.nf, nodeSeqW, futexWake, 1<<31-1, nil)
		}
		d.mu.RUnlock()
	}
}

// Close implements rdma.WaitSet.
func (s *waitSet) Close() {}
