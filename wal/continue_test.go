package wal

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// continueRun drives a two-stream Sync Mux whose device continues the log
// as the shared log's FileDevice does (after each completion that is not
// Quiet, Mux.Continue on the device's side), on a device the test steps,
// and returns the rules that failed, each with its prefix:
//
//	continued: records appended during a batch's fsync were not written
//	           and synced by the device alone (no stream's Poll between)
//	durable:   a record reported synced before the fsync of its batch ended
func continueRun(t *testing.T, knobs testingKnobs) []string {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	mr, err := RecoverMux(mem, testDir, testMuxMember) // makes the directory
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 64 << 10}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	var failed []string
	fail := func(f string, args ...any) { failed = append(failed, fmt.Sprintf(f, args...)) }
	put := func(s *Stream) uint64 {
		seq, ok := s.Append(RecEntry, []byte("v"))
		if !ok {
			t.Fatalf("stream %d: append refused: %v", s.ID(), s.Err())
		}
		return seq
	}
	// step runs the device's next IO and, as the shared log's device
	// does, continues the log unless the IO was Quiet; it returns the IO.
	step := func() IO {
		if len(d.queue) == 0 {
			return IO{}
		}
		op := d.queue[0]
		d.step()
		if !op.Quiet {
			m.Continue(0)
		}
		return op
	}
	// The first batch (the segment's creation with it), polled.
	now := time.Millisecond
	a1 := put(a)
	b1 := put(b)
	m.Poll(now)
	for i := 0; m.w.Synced() == 0; i++ { // setup: the test polls too
		if i > 100 {
			t.Fatal("the first batch never synced")
		}
		step()
		m.Poll(now)
	}
	if a.Synced() != a1 || b.Synced() != b1 {
		fail("continued: the first batch: synced a %d b %d, want %d %d", a.Synced(), b.Synced(), a1, b1)
	}
	// Rounds: a batch in flight, records appended during its fsync, and
	// from then on only the device steps: no stream polls.
	for round := range 5 {
		x := put(a)
		now += time.Millisecond
		m.Poll(now) // starts x's batch (its write and sync queued)
		if len(d.queue) != 2 || d.queue[0].Kind != IOWrite || d.queue[1].Kind != IOSync {
			t.Fatalf("round %d: queued %v, want a write and its sync", round, d.queue)
		}
		if op := step(); op.Kind != IOWrite {
			t.Fatalf("round %d: ran %v", round, op.Kind)
		}
		// during the fsync: the other stream's record and one more of a's
		y, x2 := put(b), put(a)
		if a.Synced() >= x || b.Synced() >= y {
			fail("durable: round %d: synced a %d b %d before their batch's fsync ran (records %d, %d)", round, a.Synced(), b.Synced(), x, y)
		}
		step() // the fsync of x's batch; the device continues the log
		if a.Synced() < x {
			fail("continued: round %d: the device's completion left a at %d, its record %d synced", round, a.Synced(), x)
		}
		if b.Synced() >= y || a.Synced() >= x2 {
			fail("durable: round %d: synced a %d b %d once x's batch ended; y %d and x2 %d were not in it", round, a.Synced(), b.Synced(), y, x2)
		}
		for i := 0; i < 4 && len(d.queue) > 0; i++ {
			op := step()
			if op.Kind == IOWrite && (b.Synced() >= y || a.Synced() >= x2) {
				fail("durable: round %d: synced a %d b %d after the next batch's write, before its fsync", round, a.Synced(), b.Synced())
			}
		}
		if b.Synced() != y || a.Synced() != x2 {
			fail("continued: round %d: without a stream's Poll the records appended during the fsync stayed unsynced (a %d of %d, b %d of %d)", round, a.Synced(), x2, b.Synced(), y)
			muxDrain(t, m, d, now) // let the next round start clean
		}
	}
	if err := m.w.Err(); err != nil {
		t.Fatal(err)
	}
	if calls, started := m.ContinueStats(); !knobs.continueNoStart && (calls == 0 || started < 5) {
		fail("continued: ContinueStats %d calls, %d batches started, want 5 started (one a round)", calls, started)
	}
	return failed
}

// TestMuxContinue: the shared log's device continues the log itself: the
// records appended while a batch's fsync ran are written and synced right
// after it, with no stream's Poll in between, and nothing counts as synced
// before the fsync of its batch ends. Planted continueNoStart (Continue
// does nothing: the next batch waits for a poller) is caught as
// "continued:".
func TestMuxContinue(t *testing.T) {
	if f := continueRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("failed: %q", f)
	}
	f := continueRun(t, testingKnobs{continueNoStart: true})
	if len(f) == 0 || !strings.HasPrefix(f[0], "continued:") {
		t.Fatalf("planted continueNoStart: want a 'continued:' failure, got %q", f)
	}
	for _, s := range f {
		if strings.HasPrefix(s, "durable:") {
			t.Fatalf("planted continueNoStart: a durability failure %q", s)
		}
	}
	t.Logf("continueNoStart caught: %q", f[0])
}
