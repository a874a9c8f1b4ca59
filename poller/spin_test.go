package poller

import (
	"testing"
	"time"
)

const us = time.Microsecond

// slowStream drives b as a poller that sees a message every gap: each
// message ends the current spin (a hit, if the budget covers gap) or the
// park after it. It returns the spin hits and the probes started.
func slowStream(b *spinBudget, gap time.Duration, n int) (hits, probes int) {
	for range n {
		if b.probing {
			probes++
		}
		if b.cur >= gap {
			b.spun(true)
			hits++
			continue
		}
		spun := b.cur
		if spun > 0 {
			b.spun(false)
		}
		b.parked(true, gap, gap-spun)
	}
	return hits, probes
}

// TestSpinBudgetSlowMode: the rule before the probe (the noProbe knob)
// leaves a stream a little slower than the full budget in the slow mode
// (every message a missed spin, a park and a wake); the probe catches it
// and keeps catching it.
func TestSpinBudgetSlowMode(t *testing.T) {
	for _, gap := range []time.Duration{150 * us, 190 * us, 390 * us} {
		b := newSpinBudget(100 * us)
		b.noProbe = true
		slowStream(&b, gap, 10)
		if hits, _ := slowStream(&b, gap, 1000); hits != 0 {
			t.Fatalf("rule without probes, messages %v apart: %d spin hits of 1000; want the slow mode (none)", gap, hits)
		}

		b = newSpinBudget(100 * us)
		slowStream(&b, gap, 10)
		hits, probes := slowStream(&b, gap, 1000)
		if hits != 1000 || probes > 0 {
			t.Fatalf("with probes, messages %v apart: %d of 1000 caught spinning, %d probes started in steady state; want all caught, no new probe", gap, hits, probes)
		}
		if b.cur < gap || b.cur > probeSpans*100*us {
			t.Fatalf("budget after a caught stream %v apart: %v, want within [%v, %v]", gap, b.cur, gap, probeSpans*100*us)
		}
	}
}

// TestSpinBudgetProbeBackoff: when spinning does not catch the stream
// (its gap exceeds any probe), probes back off to one per
// maxProbeBackoff near misses.
func TestSpinBudgetProbeBackoff(t *testing.T) {
	b := newSpinBudget(100 * us)
	probes := 0
	for range 10000 {
		// every message arrives just after the spin ended: a near miss
		// whatever the budget
		if b.probing {
			probes++
		}
		spun := b.cur
		if spun > 0 {
			b.spun(false)
		}
		b.parked(true, spun+150*us, 150*us)
	}
	if max := 10000/maxProbeBackoff + 20; probes > max {
		t.Fatalf("%d probes in 10000 missed near misses, want at most %d", probes, max)
	}
	if probes == 0 {
		t.Fatal("no probe at all")
	}
}

// TestSpinBudgetIdle: parks that deadlines end, and rings further apart
// than probeSpans budgets, never start a probe; the budget reaches 0.
func TestSpinBudgetIdle(t *testing.T) {
	b := newSpinBudget(100 * us)
	for i := range 1000 {
		if b.probing {
			t.Fatalf("a probe after %d idle parks", i)
		}
		if b.cur > 0 {
			b.spun(false)
		}
		if i%3 == 0 {
			b.parked(true, 10*time.Millisecond, 10*time.Millisecond) // a far ring
		} else {
			b.parked(false, time.Millisecond, time.Millisecond) // a deadline
		}
	}
	if b.cur != 0 {
		t.Fatalf("idle budget %v, want 0", b.cur)
	}
	// a ring within the full budget restores it
	b.parked(true, 50*us, 50*us)
	if b.cur != 100*us {
		t.Fatalf("budget after a ring within it %v, want 100 µs", b.cur)
	}
	// a budget of 0 (Spin < 0) never spins
	z := newSpinBudget(0)
	slowStream(&z, 190*us, 100)
	if z.cur != 0 || z.probing {
		t.Fatalf("a never-spinning poller's budget %v probing %v", z.cur, z.probing)
	}
}
