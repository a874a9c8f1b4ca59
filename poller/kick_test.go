package poller

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// countTask never makes progress and never asks for a deadline: its
// poller parks until a kick (or MaxPark) ends the park.
type countTask struct{ polls atomic.Int64 }

func (t *countTask) Poll(time.Duration) bool     { t.polls.Add(1); return false }
func (t *countTask) NextDeadline() time.Duration { return never }

// kickFault runs a group of two pollers, one idle task on each and parks
// of an hour, waits until both parked, kicks the group once and reports
// what went wrong ("" if both tasks were polled again after the kick).
// wait bounds the wait for a poller that the kick should have woken.
func kickFault(t *testing.T, cfg GroupConfig, wait time.Duration) string {
	cfg.Pollers, cfg.MaxPark, cfg.Hold = 2, time.Hour, -1
	g := NewGroup(cfg)
	tasks := []*countTask{{}, {}}
	for i, tk := range tasks {
		g.AddTo(i, tk) // no doorbell: only a kick ends the park
	}
	stop := runGroup(t, g)
	defer stop()
	parked := func() bool {
		for _, s := range g.Stats() {
			if s.Parks == 0 {
				return false
			}
		}
		return true
	}
	for end := time.Now().Add(30 * time.Second); !parked(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the pollers never parked: %+v", g.Stats())
		}
	}
	// Both parked for an hour: their tasks are polled again only once
	// something wakes their pollers.
	before := []int64{tasks[0].polls.Load(), tasks[1].polls.Load()}
	g.Kick()
	for end := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
		woken := 0
		for i, tk := range tasks {
			if tk.polls.Load() > before[i] {
				woken++
			}
		}
		if woken == len(tasks) {
			return ""
		}
		if time.Now().After(end) {
			return fmt.Sprintf("kick: %d of %d pollers polled their task after Group.Kick (polls before %v, after %d %d)", woken, len(tasks), before, tasks[0].polls.Load(), tasks[1].polls.Load())
		}
	}
}

// TestGroupKick: one Group.Kick wakes every poller of the group (the
// shared log's completion relies on it to reach every replica's poller
// with one wake each). Planted kickFirstOnly is caught.
func TestGroupKick(t *testing.T) {
	if f := kickFault(t, GroupConfig{}, 30*time.Second); f != "" {
		t.Fatal(f)
	}
	// The mutant's second poller sleeps for its hour: a short wait tells.
	if f := kickFault(t, GroupConfig{kickFirstOnly: true}, 300*time.Millisecond); f == "" || f[:5] != "kick:" {
		t.Fatalf("planted kickFirstOnly: the check said %q, want a poller not woken", f)
	}
}
