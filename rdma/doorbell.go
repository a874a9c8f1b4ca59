package rdma

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSpin is the default spin budget before a doorbell wait parks.
// 100 µs covers one put's round trip through a group on shm (client ->
// leader -> followers -> leader -> client), so a steady writer's threads
// find their next message while still spinning instead of parking and
// being woken (a futex wake and a run-queue wait per hop). Measured
// against 20 µs on the embedded 2x3 cluster (docs/benchmarks.md): one
// writer's put p50 112 -> 31 µs, 64 writers 94 k -> 138 k puts/s, OS
// context switches per put at one writer ~3.4 -> ~1.0 (client) and ~2.7
// -> ~1.2 (replicas); an idle cluster's CPU did not grow (it parks after
// the budget and heartbeats are 10 ms apart).
const DefaultSpin = 100 * time.Microsecond

// LocalDoorbell is a Doorbell for waiters and ringers in one process: the
// ring is an atomic counter, a parked waiter sleeps on a channel, so a wake
// costs a goroutine hand-off and no system call. The mem and tcp fabrics
// use it (shm's doorbells are futexes that other processes ring).
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

	sets localSets // the WaitSets that wait for it
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
	d.ringSets()
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
	start := Mono()
	hit := d.spinSeq(seq, start+min(d.spin, timeout))
	if d.spin > 0 {
		NoteSpin(hit)
	}
	if hit {
		return true
	}
	left := timeout - (Mono() - start)
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
				NotePark(true)
				return true
			}
		case <-t.C:
			rang := d.seq.Load() != seq
			NotePark(rang)
			return rang
		}
	}
}

// spinSeq spins until seq moves or the Mono clock passes deadline, like
// SpinUntil with the condition inlined (no indirect call per try).
func (d *LocalDoorbell) spinSeq(seq uint64, deadline time.Duration) bool {
	for i := 1; ; i++ {
		if d.seq.Load() != seq {
			return true
		}
		if i%spinCheck == 0 {
			if Mono() >= deadline {
				return d.seq.Load() != seq
			}
			runtime.Gosched()
		}
	}
}

// spinCheck is how many tries a spin makes between looks at the clock
// (each followed by a yield).
const spinCheck = 16

// monoStart is Mono's origin.
var monoStart = time.Now()

// Mono is a monotonic clock (time since a fixed origin in this process).
// It costs one read of the runtime's monotonic clock: time.Since of a
// time.Time that carries a monotonic reading skips the wall clock that
// time.Now also reads, so spin loops and drivers use it for deadlines.
func Mono() time.Duration { return time.Since(monoStart) }

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
	deadline := Mono() + budget
	for i := 1; ; i++ {
		if cond() {
			return true
		}
		if i%spinCheck == 0 {
			if Mono() >= deadline {
				return cond()
			}
			runtime.Gosched()
		}
	}
}
