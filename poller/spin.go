package poller

import "time"

// spinBudget is a poller's adaptive spin budget: how long it spins for
// the next ring before it parks. Pure (the poller hands it the durations
// it measured), so that tests drive it without a clock.
//
// A spin that found nothing halves the budget (an idle poller soon parks
// at once); a park shorter than the full budget that a ring ended (a
// full spin would have caught it) restores it.
//
// The single writer's slow mode: a steady stream whose messages arrive a
// little further apart than the full budget (one writer against two
// groups: a leader's next message comes after the client was woken for
// its reply and posted again) makes every spin miss, and each message
// costs a park and a futex wake in each process, which keeps the round
// trip, and so the gap, long; a missed full spin followed by a short
// park restores the budget, so each message also pays a full spin. The
// probe: a ring that ended a park gap after the poller went idle, with
// the full budget < gap <= probeSpans full budgets, is a near miss;
// after two in a row the next spin is a probe: it spins for 5/4 of the
// last gap once. A probe that catches the next ring keeps its budget
// (the stream is caught without a wake, and its round trips can shorten
// back under the full budget); one that misses backs the probes off: the
// next one only after 1, 2, 4 ... 64 more near misses, so a machine where
// spinning does not shorten the gap pays at most one probe in 64
// messages. Idle pollers' parks end by deadlines (timeouts, heartbeats)
// or far rings, not near misses: they never probe. Everything else is
// the rule before the probe.
type spinBudget struct {
	full time.Duration // the configured budget (0: never spin)
	cur  time.Duration // the next spin's budget

	near    int  // near misses in a row
	probing bool // cur is a probe's
	wait    int  // near misses still to skip before the next probe
	backoff int  // the last wait set (0 after a probe hit)

	noProbe bool // testing knob: the rule before the probe

	// Held parks (poller.go): holdMax is the group's Hold (0: the group
	// never holds); hold, whether the next park holds the P: after a
	// park that a ring ended within holdMax, so only while a stream
	// flows.
	holdMax time.Duration
	hold    bool
	// notNow: the group does not hold now (its spare P given back:
	// GroupConfig.SpareP); the poller spins as before a blocking park.
	notNow bool

	holdAfterTimeout bool // testing knob (planted bug): a park that timed out holds the next
	holdSpins        bool // testing knob (planted bug): a poller spins before a held park
}

// probeSpans bounds a probe's spin and a near miss's gap, in full
// budgets.
const probeSpans = 4

// maxProbeBackoff bounds the near misses skipped after a probe that
// missed.
const maxProbeBackoff = 64

func newSpinBudget(full time.Duration) spinBudget {
	return spinBudget{full: full, cur: full}
}

// spin is the next spin's budget: cur, or none when the next park holds.
// A held park is cheap to enter and to wake from (no P hand-off, no
// thread woken for it), so a spin saves little there, and it costs a
// core: one writer's round trip on two cores has three threads that want
// one (the client waiting for its reply, the poller with the message, the
// other group's poller waiting for its next ring), and a poller spinning
// 100 µs without yielding held one of them while the other waited (one
// writer 3-4x slower: docs/dev/write-path-plan.md, "Held parks and one
// writer").
func (b *spinBudget) spin() time.Duration {
	if b.hold && !b.notNow && !b.holdSpins {
		return 0
	}
	return b.cur
}

// spun records a spin phase of the current budget: hit, a ring ended it.
func (b *spinBudget) spun(hit bool) {
	probing := b.probing
	b.probing = false
	if hit {
		if probing {
			b.backoff, b.wait = 0, 0
		}
		return
	}
	if probing {
		b.backoff = min(max(1, 2*b.backoff), maxProbeBackoff)
		b.wait = b.backoff
	}
	if b.cur /= 2; b.cur < time.Microsecond {
		b.cur = 0
	}
}

// parked records a park: rang, a ring (not a deadline) ended it; gap,
// the time from the poller going idle (the spin before the park
// included) to its end; parkedFor, the park's own part of it.
func (b *spinBudget) parked(rang bool, gap, parkedFor time.Duration) {
	b.hold = b.holdMax > 0 && (rang || b.holdAfterTimeout) && parkedFor < b.holdMax
	if !rang {
		b.near = 0
		return
	}
	if parkedFor < b.full {
		b.cur = b.full
	}
	if b.noProbe {
		return
	}
	if gap <= b.full || gap > probeSpans*b.full {
		b.near = 0
		return
	}
	if b.near++; b.near < 2 {
		return
	}
	if b.wait > 0 {
		b.wait--
		return
	}
	b.near = 0
	b.cur = min(gap+gap/4, probeSpans*b.full)
	b.probing = true
}

// density is a poller's view of how its stream loads it, for a group
// that takes its spare P only while needed (GroupConfig.SpareP, "The
// spare P on demand" in poller.go). Pure: the poller hands it each busy
// spell (from the end of a park or spin to the start of the next one)
// as the number of its passes that made progress, so that tests drive
// it without a clock.
//
// One writer's stream gives a poller one message per wake: a spell of a
// few passes, then the poller is idle until the client's next request,
// a round trip later (a spin catches it). Many writers give it batches:
// passes that find work back to back, between parks that a spin would
// not have caught (the client needs the core to post the next batch).
// A spell is busy when denseProgress or more of its passes made
// progress; the poller is dense after a window of densityWindow spells
// with at least denseEnter busy ones, and sparse again after denseQuiet
// windows in a row with at most denseLeave each (the band between them
// keeps the mode, and so does a quiet window among busy ones: no
// flapping on a stream at the border). Measured per park (2026-11-27, brief hrule,
// kvbench kv --embedded): busy spells are 0.2-1% of one writer's, 12-35%
// of 64 writers' (with held parks or without, at SCHED_RR or under load
// 30), none of an idle cluster's heartbeats. A spell's length told them
// apart as well at SCHED_RR, but not idle from busy under load (a
// heartbeat's spell took 128 µs to 1 ms there). With one quiet window
// enough to leave, 64 writers under load flapped every 0.1-0.5 s (each
// switch a stop of the world).
type density struct {
	n, busy int  // spells and busy ones in the current window
	quiet   int  // quiet windows in a row (at most denseLeave busy)
	dense   bool // the last decided mode

	enterOnOne   bool // testing knob (planted bug): one busy spell makes it dense
	noHysteresis bool // testing knob (planted bug): one threshold for both ways
	leaveOnOne   bool // testing knob (planted bug): one quiet window makes it sparse
}

const (
	densityWindow = 32
	denseEnter    = 6 // busy spells of a window that make a sparse poller dense
	denseLeave    = 1 // busy spells at most of a quiet window
	denseQuiet    = 4 // quiet windows in a row that make a dense poller sparse
	denseProgress = 16
)

// spell records a busy spell of progress passes that made progress, and
// reports whether the mode (dense) changed.
func (m *density) spell(progress int) bool {
	busy := progress >= denseProgress
	if busy {
		m.busy++
	}
	m.n++
	if m.enterOnOne && busy && !m.dense {
		m.dense, m.n, m.busy = true, 0, 0
		return true
	}
	if m.n < densityWindow {
		return false
	}
	was := m.dense
	switch {
	case m.noHysteresis:
		m.dense = m.busy >= denseEnter
	case m.busy >= denseEnter:
		m.dense, m.quiet = true, 0
	case m.busy <= denseLeave:
		if m.quiet++; m.quiet >= denseQuiet || m.leaveOnOne {
			m.dense = false
		}
	default:
		m.quiet = 0
	}
	m.n, m.busy = 0, 0
	return m.dense != was
}
