package shm

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// Futex operations (linux/futex.h), deliberately without FUTEX_PRIVATE_FLAG:
// the word lives in a MAP_SHARED file mapping and waiters and wakers are in
// different processes.
const futexWake = 1

// ringNode rings the doorbell of the node whose node file is mapped at nf:
// bump seq, then wake parked waiters. A waiter announces itself in parked
// before its last look at seq, so either it sees the new seq or the ringer
// sees it parked; a spinning target costs the ringer no system call.
//
// With the owner's featWakeOnce (layout.go), a ring skips the wake call
// when an earlier ring made one since the last waiter announced itself:
// every waiter parked then is woken already.
func ringNode(nf []byte) {
	rdma.Add64(nf, nodeSeqW, 1)
	if rdma.Load64(nf, nodeParkedW) == 0 {
		return
	}
	if rdma.Load64(nf, nodeFeatW)&featWakeOnce != 0 {
		if rdma.Load64(nf, nodeWokenW) != 0 || rdma.CAS64(nf, nodeWokenW, 0, 1) != 0 {
			rdma.NoteWakeSkipped()
			return
		}
	}
	n, _ := futex(nf, nodeSeqW, futexWake, 1<<31-1, nil)
	rdma.NoteWake(n)
}

// announcePark adds a waiter to nf's parked count and clears woken: a
// ring after it makes a wake call (see wakeOnce in layout.go). The
// caller looks at seq once more before it sleeps.
func announcePark(nf []byte) {
	rdma.Add64(nf, nodeParkedW, 1)
	if !skipClearWoken {
		rdma.Store64(nf, nodeWokenW, 0)
	}
}

// skipClearWoken is a testing knob: a planted bug (a waiter that does not
// clear woken loses wake-ups; TestWakeOnceLostWakeup catches it).
var skipClearWoken bool

// futex calls futex(2) on the low 32 bits of the word at nf[off:]; n is
// its result (FUTEX_WAKE: the threads woken).
func futex(nf []byte, off int, op uintptr, val uint32, ts *unix.Timespec) (n int, e unix.Errno) {
	addr := unsafe.Pointer(&nf[off:][:8][0])
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(addr), op, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	return int(r), e
}

// doorbell is a node's rdma.Doorbell: the seq word of its node file, which
// peers in any process ring with Notify writes.
type doorbell struct {
	spin time.Duration

	// mu is held for reading by Wait and Seq while they use nf, and for
	// writing by close before the node file is unmapped.
	mu      sync.RWMutex
	nf      []byte
	closed  atomic.Bool
	lastSeq uint64 // Seq after close
}

var _ rdma.Doorbell = (*doorbell)(nil)

// Seq implements rdma.Doorbell.
func (d *doorbell) Seq() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return d.lastSeq
	}
	return rdma.Load64(d.nf, nodeSeqW)
}

// Ring implements rdma.Doorbell.
func (d *doorbell) Ring() {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if !d.closed.Load() {
		ringNode(d.nf)
	}
}

// Wait implements rdma.Doorbell. It spins for the node's spin budget, then
// parks in FUTEX_WAIT (handing its P back). Closing the node rings it once; after that nothing
// rings, so Wait with the final Seq sleeps out its timeout.
func (d *doorbell) Wait(seq uint64, timeout time.Duration) bool {
	d.mu.RLock()
	if d.closed.Load() {
		last := d.lastSeq
		d.mu.RUnlock()
		if seq != last {
			return true
		}
		time.Sleep(max(timeout, 0))
		return false
	}
	defer d.mu.RUnlock()
	nf := d.nf
	changed := func() bool { return rdma.Load64(nf, nodeSeqW) != seq || d.closed.Load() }
	if changed() {
		return true
	}
	if timeout <= 0 {
		return false
	}
	deadline := rdma.Mono() + timeout
	if d.spin > 0 {
		hit := rdma.SpinUntil(changed, min(d.spin, timeout))
		rdma.NoteSpin(hit)
		if hit {
			return true
		}
	}
	announcePark(nf)
	defer rdma.Add64(nf, nodeParkedW, ^uint64(0))
	addr := unsafe.Pointer(&nf[nodeSeqW:][:8][0])
	for !changed() {
		now := rdma.Mono()
		if now >= deadline {
			rdma.NotePark(false)
			return false
		}
		ts := absTimespec(min(deadline, now+time.Hour)) // no overflow for a far deadline
		// Returns at once (EAGAIN) if the low word no longer holds seq, on
		// a wake, on a signal (EINTR) or at the timeout: all recheck. The
		// P is handed back while it sleeps (see waitset.go).
		futexWaitBlocking(addr, futexWaitBitset, uint32(seq), unsafe.Pointer(&ts))
	}
	rdma.NotePark(true)
	return true
}

// close makes the doorbell inert: it wakes every waiter (through the node
// file's seq), waits for them to leave, and returns; the caller may then
// unmap the node file.
func (d *doorbell) close() {
	d.closed.Store(true)
	ringNode(d.nf)
	d.mu.Lock()
	d.lastSeq = rdma.Load64(d.nf, nodeSeqW)
	d.nf = nil
	d.mu.Unlock()
}
