package wal

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// gatherRun drives a three-stream Sync Mux with a gather window through
// one writer's rounds (a leader's record at an idle log, its two
// followers' right after) on a device the test steps, and returns the
// gather's rules that failed, each with its prefix:
//
//	streams came: a batch held after every stream it waits for wrote
//	window:       a lone stream's batch held past GatherWindow
//	in flight:    a batch whose records came during a batch's fsync held
//	other starter: a batch held for the followers of another stream's round
//	durable:      a record reported synced before an fsync after it ended
func gatherRun(t *testing.T, knobs testingKnobs) []string {
	const win = 50 * time.Microsecond
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	mr, err := RecoverMux(mem, testDir, testMuxMember) // makes the directory
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, GatherWindow: win, SegmentBytes: 64 << 10}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	l, a, b := m.Stream(1, nil), m.Stream(2, nil), m.Stream(3, nil)
	var failed []string
	fail := func(f string, args ...any) { failed = append(failed, fmt.Sprintf(f, args...)) }
	// writes: how many batch writes the device was given so far.
	writes := func() int {
		n := 0
		for _, op := range append(slices.Clone(d.ran), d.queue...) {
			if op.Kind == IOWrite && op.Path != "" && op.Data != nil && len(op.Data) > segHdrSize {
				n++
			}
		}
		return n
	}
	// held: the open batch has records and did not start.
	held := func() bool { return len(m.w.open) > 0 }
	put := func(s *Stream, now time.Duration) uint64 {
		seq, ok := s.Append(RecEntry, []byte("v"))
		if !ok {
			t.Fatalf("stream %d: append refused: %v", s.ID(), s.Err())
		}
		return seq
	}
	var now time.Duration
	// idle runs the device and polls (the clock moving on) until every
	// record is synced.
	idle := func() {
		for i := 0; !m.Idle() && i < 100; i++ {
			if i == 20 && len(m.w.open) > 0 {
				m.Flush() // a planted unbounded hold (the window: checks it)
			}
			m.Poll(now)
			d.runAll()
			now += win / 2
		}
		m.Poll(now)
		if !m.Idle() {
			t.Fatalf("not idle at %v: open %d cur %v phase %d queue %d err %v holding %v from %v mnow %v wnow %v hold %v eager %v", now, len(m.w.open), m.w.cur != nil, m.w.phase, len(d.queue), m.w.Err(), m.w.holding, m.w.holdFrom, m.now, m.w.now, m.w.hold, m.w.openEager)
		}
	}
	now = time.Millisecond
	// The first round teaches the Mux who writes after an idle start:
	// nothing is expected yet, so the leader's batch starts alone.
	put(l, now)
	m.Poll(now)
	if held() {
		t.Fatalf("first round: the leader's batch did not start at once")
	}
	put(a, now)
	put(b, now)
	idle()

	// A round as at one writer: leader, then both followers.
	now += time.Millisecond
	w0 := writes()
	sl := put(l, now)
	m.Poll(now)
	if !held() {
		fail("gather: the leader's batch started before its followers wrote (rule not applied)")
	}
	if dl := l.NextDeadline(); dl != now+win {
		fail("gather: NextDeadline %v with the batch held from %v, want %v", dl, now, now+win)
	}
	put(a, now+time.Microsecond)
	m.Poll(now + time.Microsecond)
	sb := put(b, now+2*time.Microsecond)
	m.Poll(now + 2*time.Microsecond)
	if held() {
		fail("streams came: the batch is held after every expected stream wrote")
	}
	// Durability: nothing is synced until the batch's fsync completed.
	for d.step() {
		if l.Synced() >= sl || b.Synced() >= sb {
			fail("durable: synced before the batch's fsync completed")
		}
		m.Poll(now + 3*time.Microsecond)
	}
	m.Poll(now + 3*time.Microsecond)
	if l.Synced() < sl || b.Synced() < sb {
		fail("durable: leader synced %d (want %d), follower %d (want %d) after the batch's fsync", l.Synced(), sl, b.Synced(), sb)
	}
	if writes() != w0+1 {
		fail("streams came: %d batch writes for one gathered round, want 1", writes()-w0)
	}
	idle()

	// The window: the leader writes and no follower does.
	now += time.Millisecond
	w0 = writes()
	put(l, now)
	m.Poll(now)
	m.Poll(now + win - time.Microsecond)
	if !held() {
		fail("gather: the lone batch started %v into a %v window", win-time.Microsecond, win)
	}
	m.Poll(now + win)
	if held() || writes() != w0+1 {
		fail("window: a lone stream's batch still held %v after its first Poll (window %v)", win, win)
	}
	idle()
	if dl := l.NextDeadline(); dl != Never {
		fail("window: NextDeadline %v with nothing to do", dl)
	}
	// The round of one writer left the followers out of the next
	// expectation only if they did not write in it; they write now (late).
	put(a, now)
	put(b, now)
	idle()

	// In flight: records that came during a batch's fsync go at the next
	// Poll after it, held no further.
	now += time.Millisecond
	put(l, now)
	put(a, now)
	put(b, now)
	m.Poll(now)
	w0 = writes()
	put(l, now) // the next put's leader record, during that fsync
	d.runAll()
	m.Poll(now + time.Microsecond)
	if held() {
		fail("in flight: a batch whose record came during an fsync is held after it")
	}
	idle()
	// Two groups' leaders in one process, alternating: a batch waits for
	// the followers of its own leader's last round, not the other's.
	l2, a2, b2 := m.Stream(4, nil), m.Stream(5, nil), m.Stream(6, nil)
	now += time.Millisecond
	put(l2, now) // its first round: nothing known to wait for
	m.Poll(now)
	put(a2, now)
	put(b2, now)
	idle()
	for _, g := range [][3]*Stream{{l, a, b}, {l2, a2, b2}} {
		now += time.Millisecond
		put(g[0], now)
		m.Poll(now)
		put(g[1], now)
		put(g[2], now)
		m.Poll(now + time.Microsecond)
		if held() {
			fail("other starter: stream %d's batch held after its followers %d and %d wrote", g[0].ID(), g[1].ID(), g[2].ID())
		}
		idle()
	}
	nh, to := m.GatherStats()
	if nh == 0 || to == 0 {
		fail("gather: counters held %d, timed out %d: both must have moved", nh, to)
	}
	return failed
}

// The gather (Config.GatherWindow) and the planted bugs against its rules:
// a held batch must start once the streams it waits for wrote, or at the
// window's end, and never hold records that already waited for an fsync.
func TestMuxGather(t *testing.T) {
	if f := gatherRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("%q", f)
	}
	for _, c := range []struct {
		name  string
		knobs testingKnobs
		want  string
	}{
		{"gatherUnbounded", testingKnobs{gatherUnbounded: true}, "window:"},
		{"gatherKeepsHolding", testingKnobs{gatherKeepsHolding: true}, "streams came:"},
		{"gatherWhileBusy", testingKnobs{gatherWhileBusy: true}, "in flight:"},
		{"gatherSharedRound", testingKnobs{gatherSharedRound: true}, "other starter:"},
	} {
		f := gatherRun(t, c.knobs)
		if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, c.want) }) {
			t.Fatalf("planted %s: not caught by %q: %q", c.name, c.want, f)
		}
		t.Logf("planted %s caught: %q", c.name, f)
	}
}
