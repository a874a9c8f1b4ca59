package poller

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// densityFault drives the density rule (density.spell) through the
// streams it tells apart and returns the first rule it breaks ("" for
// none): one writer's stream (spells of a few passes, a long one now
// and then) never turns dense; many writers' (a third of the spells
// busy) turn dense within two windows and stay; a stream at the border
// (3 busy spells a window) keeps the mode it found, and so does a dense
// stream with a quiet window in three; an idle poller (heartbeat passes)
// turns sparse within denseQuiet+1 windows.
func densityFault(knobs func(*density)) string {
	d := &density{}
	knobs(d)
	// One writer: spells of 2-15 passes that made progress, one of 16+
	// in 100.
	for i := range 10000 {
		prog := 2 + i%14
		if i%100 == 99 {
			prog = 20
		}
		d.spell(prog)
		if d.dense {
			return fmt.Sprintf("one writer's stream turned dense after %d spells", i+1)
		}
	}
	// Many writers: every third spell busy (16+ passes that made
	// progress).
	for i := range 2 * densityWindow {
		if i%3 == 0 {
			d.spell(20)
		} else {
			d.spell(3)
		}
	}
	if !d.dense {
		return "many writers' stream not dense after two windows"
	}
	flips := 0
	border := func() {
		for i := range 20 * densityWindow {
			prog := 3
			if i%densityWindow < 3 {
				prog = 16
			}
			if d.spell(prog) {
				flips++
			}
		}
	}
	border()
	if !d.dense || flips != 0 {
		return fmt.Sprintf("a border stream (3 busy spells a window) left dense: %d changes", flips)
	}
	// Dense, with a quiet window (one busy spell) in three.
	for w := range 30 {
		for i := range densityWindow {
			prog := 3
			if i == 0 || w%3 != 0 && i < 8 {
				prog = 16
			}
			if d.spell(prog) {
				flips++
			}
		}
	}
	if !d.dense || flips != 0 {
		return fmt.Sprintf("a dense stream with a quiet window in three left dense: %d changes", flips)
	}
	// Idle: heartbeat passes.
	for range (denseQuiet + 1) * densityWindow {
		d.spell(1)
	}
	if d.dense {
		return "an idle poller still dense after denseQuiet+1 windows"
	}
	border()
	if d.dense || flips != 0 {
		return fmt.Sprintf("a border stream (3 busy spells a window) turned a sparse poller dense: %d changes", flips)
	}
	return ""
}

// TestDensityRule: the rule tells one writer from many and keeps its
// mode on a stream between its thresholds; the planted enterOnOne (one
// busy spell makes a poller dense), noHysteresis (one threshold both
// ways) and leaveOnOne (one quiet window makes it sparse) are caught.
func TestDensityRule(t *testing.T) {
	if f := densityFault(func(*density) {}); f != "" {
		t.Fatalf("density rule: %s", f)
	}
	if f := densityFault(func(d *density) { d.enterOnOne = true }); f != "one writer's stream turned dense after 100 spells" {
		t.Fatalf("planted enterOnOne: the check said %q, want one writer's stream dense", f)
	}
	if f := densityFault(func(d *density) { d.noHysteresis = true }); f != "a border stream (3 busy spells a window) left dense: 1 changes" {
		t.Fatalf("planted noHysteresis: the check said %q, want a border stream leaving dense", f)
	}
	if f := densityFault(func(d *density) { d.leaveOnOne = true }); f != "a dense stream with a quiet window in three left dense: 20 changes" {
		t.Fatalf("planted leaveOnOne: the check said %q, want a dense stream leaving dense", f)
	}
}

// burstTask makes progress for burst passes after each wake (a poller
// pass that makes none ends the burst), as many writers' batches do.
type burstTask struct {
	burst atomic.Int64
	left  int64
}

func (b *burstTask) Poll(time.Duration) bool {
	if b.left > 0 {
		b.left--
		return true
	}
	b.left = b.burst.Load() // the next wake's burst
	return false
}
func (*burstTask) NextDeadline() time.Duration { return never }

// procsLog is a GOMAXPROCS stand-in that records the settings.
type procsLog struct {
	mu  sync.Mutex
	cur int
	set []int
}

func (l *procsLog) procs(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.cur
	if n > 0 {
		l.cur = n
		l.set = append(l.set, n)
	}
	return old
}

func (l *procsLog) get() (int, []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur, append([]int(nil), l.set...)
}

// spareFault runs a SpareP group of one poller (GOMAXPROCS 1 in the
// stand-in) through a dense stream, then a sparse one, and returns the
// first rule it breaks: the group takes its spare P (GOMAXPROCS 2) and
// holds while the stream is dense, and gives the P back and stops
// holding once it thins.
func spareFault(t *testing.T, cfg GroupConfig) string {
	l := &procsLog{cur: 1}
	s := &holdSet{want: 1 << 62, enough: make(chan struct{})}
	cfg.Pollers, cfg.MaxPark, cfg.Spin, cfg.SpareP, cfg.procs = 1, time.Hour, -1, true, l.procs
	g := NewGroup(cfg)
	task := &burstTask{}
	task.burst.Store(20) // 20 passes of progress a wake: every spell busy
	g.Add(task, holdNode{holdBell{s}})
	runGroup(t, g)
	waitFor := func(what string, ok func() bool) bool {
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if ok() {
				return true
			}
		}
		t.Logf("not within 30 s: %s", what)
		return false
	}
	if !waitFor("dense", g.Holding) {
		return "a dense stream did not take the spare P"
	}
	if cur, _ := l.get(); cur != 2 {
		return fmt.Sprintf("holding with GOMAXPROCS %d, want 2", cur)
	}
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if !waitFor("held parks", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.held > held+10 }) {
		return "a dense stream's parks do not hold"
	}
	task.burst.Store(1) // one message a wake
	// 20 windows of sparse spells: at most 2 busy ones in a window gives
	// the P back (the first window may be the dense stream's)
	parks := func() uint64 { return g.Stats()[0].Parks }
	from := parks()
	if !waitFor("20 windows of parks", func() bool { return parks() >= from+20*densityWindow }) {
		return "the poller stopped parking"
	}
	if cur, set := l.get(); g.Holding() || cur != 1 {
		return fmt.Sprintf("kept the spare P after the stream thinned (GOMAXPROCS %d, settings %v, holding %v)", cur, set, g.Holding())
	}
	s.mu.Lock()
	held = s.held
	s.mu.Unlock()
	from = parks()
	waitFor("parks", func() bool { return parks() >= from+100 })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != held {
		return fmt.Sprintf("%d held parks with the spare P given back", s.held-held)
	}
	return ""
}

// TestSpareP: a SpareP group takes its spare P only while a poller's
// stream is dense; the planted spareStays (the P kept once taken) is
// caught.
func TestSpareP(t *testing.T) {
	if f := spareFault(t, GroupConfig{}); f != "" {
		t.Fatalf("spare P: %s", f)
	}
	f := spareFault(t, GroupConfig{spareStays: true})
	want := "kept the spare P after the stream thinned (GOMAXPROCS 2, settings [2], holding true)"
	if f != want {
		t.Fatalf("planted spareStays: the check said %q, want %q", f, want)
	}
}
