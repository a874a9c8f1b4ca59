package rdma

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSpin is the default spin budget before a doorbell wait parks. On a
// 2-core machine several busy pollers starve each other, so it is short.
const DefaultSpin = 20 * time.Microsecond

// LocalDoorbell is a Doorbell for waiters and ringers in one process: the
// ring is an atomic counter, a parked waiter sleeps on a channel, so a wake
// costs a goroutine hand-off and no system call. Fabrics whose nodes share a
// process (mem, tcp, and the in-process side of shm) use it.
//
// No lost wake-ups: a waiter announces itself in parked before its last look
// at seq, a ringer bumps seq before looking at parked (both sequentially
// consistent), so one of them sees the other.
type LocalDoorbell struct {
	seq    atomic.Uint64
	parked atomic.Int32
	wake   chan struct{}
	spin   time.Duration

	mu    sync.Mutex // guards timer (one reusable timer for the usual single waiter)
	timer *time.Timer
}

// NewLocalDoorbell returns a doorbell that spins for spin before parking
// (0 parks at once; negative means DefaultSpin).
func NewLocalDoorbell(spin time.Duration) *LocalDoorbell {
	if spin < 0 {
		spin = DefaultSpin
	}
	return &LocalDoorbell{wake: make(chan struct{}, 64), spin: spin}
}

// Seq implements Doorbell.
func (d *LocalDoorbell) Seq() uint64 { return d.seq.Load() }

// Ring implements Doorbell.
func (d *LocalDoorbell) Ring() {
	d.seq.Add(1)
	for n := d.parked.Load(); n > 0; n-- {
		select {
		case d.wake <- struct{}{}:
		default:
			return
		}
	}
}

// Wait implements Doorbell.
func (d *LocalDoorbell) Wait(seq uint64, timeout time.Duration) bool {
	if d.seq.Load() != seq {
		return true
	}
	if timeout <= 0 {
		return false
	}
	start := time.Now()
	if SpinUntil(func() bool { return d.seq.Load() != seq }, min(d.spin, timeout)) {
		return true
	}
	left := timeout - time.Since(start)
	if left <= 0 {
		return false
	}
	d.parked.Add(1)
	defer d.parked.Add(-1)
	if d.seq.Load() != seq {
		return true
	}
	var t *time.Timer
	owned := d.mu.TryLock()
	if owned {
		if d.timer == nil {
			d.timer = time.NewTimer(left)
		} else {
			d.timer.Reset(left)
		}
		t = d.timer
		defer func() { t.Stop(); d.mu.Unlock() }()
	} else {
		t = time.NewTimer(left)
		defer t.Stop()
	}
	for {
		select {
		case <-d.wake:
			if d.seq.Load() != seq {
				return true
			}
		case <-t.C:
			return d.seq.Load() != seq
		}
	}
}

// SpinUntil calls cond until it returns true or budget has passed, yielding
// the processor between tries so that a spinner cannot starve the goroutine
// it waits for. It reports cond's last result.
func SpinUntil(cond func() bool, budget time.Duration) bool {
	if cond() {
		return true
	}
	if budget <= 0 {
		return false
	}
	deadline := time.Now().Add(budget)
	for i := 1; ; i++ {
		if cond() {
			return true
		}
		if i%16 == 0 {
			if time.Now().After(deadline) {
				return cond()
			}
			runtime.Gosched()
		}
	}
}
