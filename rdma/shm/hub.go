package shm

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The doorbell hub: one thread per process sleeps in the kernel for the
// doorbells of all the process's parked nodes, and holds no P meanwhile.
//
// A goroutine in a futex(2) system call keeps its P (the Go runtime's right
// to run Go code) until sysmon takes it back, and sysmon, idle, looks only
// every 10 ms. A process with several nodes (an embedded cluster: six
// replicas, six drivers) had its drivers parked in FUTEX_WAIT holding every
// P, so a goroutine made runnable meanwhile (a woken driver whose P was
// taken back, one that yielded while spinning, a timer's) waited up to
// 10 ms for sysmon: writes to an embedded cluster took ~10 ms (the default
// heartbeat, so it looked like a missed wake-up; none was). So when a
// process has more than one node open, its parked waiters park in the Go
// runtime (a channel) and the hub's one goroutine waits in FUTEX_WAITV
// (Linux 5.16)
// for all their seq words at once, then hands each rung waiter its wake-up.
// The hub enters that system call as one known to block (the runtime's
// entersyscallblock, as its own blocking sleeps do), which gives its P back
// at once: otherwise the hub itself would hold one of the Ps (of two, on
// a 2-core machine) for as long as anyone is parked.
// Ringers are unchanged, in this process or another: bump seq, FUTEX_WAKE
// if someone is parked. Without FUTEX_WAITV (older kernels, a seccomp
// filter that refuses it) every waiter sleeps in FUTEX_WAIT as before.

// hubWaiter is a parked doorbell wait registered with the hub: woken (ch)
// once the low word at addr no longer holds val.
type hubWaiter struct {
	addr *uint32
	val  uint32
	ch   chan struct{} // capacity 1
}

const hubMaxWaiters = futexWaitvMax - 1

// hub is the process's doorbell hub.
var hub struct {
	mu      sync.Mutex
	waiters []*hubWaiter
	running bool // a hub goroutine runs
	asleep  bool // it is in FUTEX_WAITV (or about to enter it)
	kick    uint32
}

// openNodes counts this process's open nodes; with at least hubMinNodes of
// them, parked waiters go through the hub. (A process with one node, a
// client or a replica of its own, parks at most a goroutine or two in
// FUTEX_WAIT, woken one hop sooner.)
var openNodes atomic.Int32

const hubMinNodes = 2

// useHub reports whether a wait about to park should park through the hub.
func useHub() bool {
	return openNodes.Load() >= hubMinNodes && hasWaitv()
}

// hubAdd registers w; false if the hub is full (the caller then parks in
// FUTEX_WAIT itself).
func hubAdd(w *hubWaiter) bool {
	hub.mu.Lock()
	if len(hub.waiters) >= hubMaxWaiters {
		hub.mu.Unlock()
		return false
	}
	hub.waiters = append(hub.waiters, w)
	kick := false
	switch {
	case !hub.running:
		hub.running = true
		go hubRun()
	case hub.asleep:
		// It waits on a list without w: make it take the new list.
		kickLocked()
		kick = true
	}
	hub.mu.Unlock()
	if kick {
		wakeHub()
	}
	return true
}

// hubRemove unregisters w (woken or not). A sleeping hub keeps waiting on
// w's word until something else wakes it: harmless, a ringer wakes that
// word only while some waiter is parked on it, and then it is registered.
// But the last waiter's leaving wakes the hub, which then ends: no thread
// stays in the kernel for nobody.
func hubRemove(w *hubWaiter) {
	hub.mu.Lock()
	kick := false
	for i, x := range hub.waiters {
		if x == w {
			last := len(hub.waiters) - 1
			hub.waiters[i] = hub.waiters[last]
			hub.waiters[last] = nil
			hub.waiters = hub.waiters[:last]
			if last == 0 && hub.asleep {
				kickLocked()
				kick = true
			}
			break
		}
	}
	hub.mu.Unlock()
	if kick {
		wakeHub()
	}
}

// kickLocked makes a sleeping hub return and rescan (hub.mu held; call
// wakeHub after unlocking).
func kickLocked() {
	atomic.AddUint32(&hub.kick, 1)
	hub.asleep = false
}

// wakeHub wakes the hub from its kick word.
func wakeHub() {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&hub.kick)), futexWake|futexPrivate, 1, 0, 0, 0)
}

// hubRun is the hub's goroutine: it wakes the waiters whose word moved,
// sleeps in FUTEX_WAITV on the others' words and the kick word, and ends
// when no waiter is left.
func hubRun() {
	var ws []futexWaitv
	for {
		hub.mu.Lock()
		ws = ws[:0]
		for i := 0; i < len(hub.waiters); {
			w := hub.waiters[i]
			if atomic.LoadUint32(w.addr) != w.val {
				select {
				case w.ch <- struct{}{}:
				default:
				}
				// woken: drop it (it also removes itself; either order)
				last := len(hub.waiters) - 1
				hub.waiters[i] = hub.waiters[last]
				hub.waiters[last] = nil
				hub.waiters = hub.waiters[:last]
				continue
			}
			ws = append(ws, futexWaitv{val: uint64(w.val), uaddr: uint64(uintptr(unsafe.Pointer(w.addr))), flags: futex2SizeU32})
			i++
		}
		if len(ws) == 0 {
			hub.running = false
			hub.mu.Unlock()
			return
		}
		ws = append(ws, futexWaitv{val: uint64(atomic.LoadUint32(&hub.kick)), uaddr: uint64(uintptr(unsafe.Pointer(&hub.kick))), flags: futex2SizeU32 | futex2Private})
		hub.asleep = true
		hub.mu.Unlock()
		// Returns on a wake of any word, at once (EAGAIN) if one already
		// moved, on a signal, or EFAULT if a node closed and its file was
		// unmapped meanwhile (its waiter is gone by then): all rescan.
		futexWaitvBlocking(unsafe.Pointer(&ws[0]), len(ws), nil)
		hub.mu.Lock()
		hub.asleep = false
		hub.mu.Unlock()
	}
}
