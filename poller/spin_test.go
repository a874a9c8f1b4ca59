package poller

import (
	"fmt"
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

// holdRuleFault drives the held-park rule (spinBudget.hold) through a
// stream, an idle poller and a stream that stops, and returns the first
// rule it breaks ("" for none): a held park only right after a park that
// a ring ended within holdMax, never after a deadline, never with
// holdMax 0.
func holdRuleFault(mk func(holdMax time.Duration) spinBudget) string {
	b := mk(time.Millisecond)
	// A stream: parks ended by rings a few hundred µs apart.
	b.parked(true, 300*us, 300*us)
	for range 100 {
		if !b.hold {
			return "a stream's next park does not hold"
		}
		if d := b.spin(); d != 0 {
			return fmt.Sprintf("spins %v before a held park", d)
		}
		b.parked(true, 300*us, 300*us)
	}
	// A ring after longer than holdMax: the stream is gone.
	b.parked(true, 5*time.Millisecond, 5*time.Millisecond)
	if b.hold {
		return "held after a park that a far ring ended"
	}
	if b.spin() != b.cur || b.cur == 0 {
		return fmt.Sprintf("spins %v before a blocking park (budget %v)", b.spin(), b.cur)
	}
	// Idle: parks ended by deadlines, near (a timer) or far (heartbeats).
	for i := range 100 {
		d := 10 * time.Millisecond
		if i%2 == 0 {
			d = 200 * us
		}
		b.parked(false, d, d)
		if b.hold {
			return "held after a park that a deadline ended"
		}
	}
	// A group that never holds.
	z := mk(0)
	for range 10 {
		z.parked(true, 100*us, 100*us)
		if z.hold {
			return "held with holdMax 0"
		}
	}
	return ""
}

// TestHoldRule: the held-park rule holds only while a stream flows, and
// a poller about to hold does not spin; the planted holdAfterTimeout (a
// short park that a deadline ended also holds the next) and holdSpins (a
// spin before a held park) are caught.
func TestHoldRule(t *testing.T) {
	if f := holdRuleFault(func(m time.Duration) spinBudget {
		b := newSpinBudget(100 * us)
		b.holdMax = m
		return b
	}); f != "" {
		t.Fatalf("held-park rule: %s", f)
	}
	f := holdRuleFault(func(m time.Duration) spinBudget {
		b := newSpinBudget(100 * us)
		b.holdMax, b.holdAfterTimeout = m, true
		return b
	})
	if f != "held after a park that a deadline ended" {
		t.Fatalf("planted holdAfterTimeout: the rule check said %q, want the deadline rule broken", f)
	}
	f = holdRuleFault(func(m time.Duration) spinBudget {
		b := newSpinBudget(100 * us)
		b.holdMax, b.holdSpins = m, true
		return b
	})
	if f != "spins 100µs before a held park" {
		t.Fatalf("planted holdSpins: the rule check said %q, want a spin before a held park", f)
	}
}
