package rdma

import "sync/atomic"

// WaitStats counts a process's doorbell waits (Doorbell.Wait of every
// fabric's doorbells in this process; a poller's WaitSet counts its own,
// poller.PollerStats): how many spun, how many of those a ring ended
// within the spin, and how many parked. A client's reaper waits here, so
// spin hits against parks per op say whether a waiter catches its reply
// spinning or pays a park and a wake for it.
type WaitStats struct {
	Spins     uint64 // waits that spun (the seq had not moved at the call)
	SpinHits  uint64 // spins a ring ended (no park)
	Parks     uint64 // waits that parked (after a spin or at once)
	ParkWakes uint64 // parks a ring ended (the rest timed out)
	// Rings of this process that found a waiter announced (a wake system
	// call on shm), and those of them that woke no thread (the waiter was
	// already woken, or had not slept yet).
	Wakes, WakesNone uint64
	// WakesSkipped: rings that found a waiter announced but made no wake
	// call, an earlier ring's call having woken it (shm's wakeOnce).
	WakesSkipped uint64
}

var waitStats struct {
	spins, spinHits, parks, parkWakes atomic.Uint64
	wakes, wakesNone, wakesSkipped    atomic.Uint64
}

// DoorbellWaits returns the process's doorbell wait counts since it
// started.
func DoorbellWaits() WaitStats {
	return WaitStats{Spins: waitStats.spins.Load(), SpinHits: waitStats.spinHits.Load(),
		Parks: waitStats.parks.Load(), ParkWakes: waitStats.parkWakes.Load(),
		Wakes: waitStats.wakes.Load(), WakesNone: waitStats.wakesNone.Load(), WakesSkipped: waitStats.wakesSkipped.Load()}
}

// NoteSpin counts a doorbell wait's spin phase and whether a ring ended
// it (for fabrics' doorbells).
func NoteSpin(hit bool) {
	waitStats.spins.Add(1)
	if hit {
		waitStats.spinHits.Add(1)
	}
}

// NotePark counts a doorbell wait's park and whether a ring ended it.
func NotePark(rang bool) {
	waitStats.parks.Add(1)
	if rang {
		waitStats.parkWakes.Add(1)
	}
}

// NoteWake counts a ring's wake call and how many threads it woke.
func NoteWake(woken int) {
	waitStats.wakes.Add(1)
	if woken == 0 {
		waitStats.wakesNone.Add(1)
	}
}

// NoteWakeSkipped counts a ring that made no wake call because an
// earlier one's had woken the parked waiters.
func NoteWakeSkipped() { waitStats.wakesSkipped.Add(1) }
