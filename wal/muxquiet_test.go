package wal

import (
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// An Async Mux's streams poll it without its mutex while nothing can
// happen (Mux.quietUntil): no IO in flight, the open batch's interval
// not over, no flush asked. The Polls that skip must not delay anything:
// the batch starts at the first Poll at or after its interval, a Flush
// starts it at the next Poll, and a record after a long idle spell is
// stamped with the skipping Polls' time (not the last locked Poll's: it
// would look late at once to Async's back-pressure).
//
// With SetDeviceContinues (the shared log's device continues the log
// after each completion) they skip while an IO is in flight as well.
func TestMuxQuietPolls(t *testing.T) {
	for _, cont := range []bool{false, true} {
		if f := muxQuietRun(t, testingKnobs{}, cont); f != "" {
			t.Fatalf("continues %v: %s", cont, f)
		}
	}
}

func TestMuxQuietPollsCatches(t *testing.T) {
	for _, c := range []struct {
		knobs testingKnobs
		want  string
	}{
		{testingKnobs{muxQuietKeepsFlush: true}, "flush:"},
		{testingKnobs{muxQuietStaleAppend: true}, "interval:"},
		{testingKnobs{muxQuietInFlight: true}, "synced:"},
	} {
		f := muxQuietRun(t, c.knobs, false)
		if !strings.Contains(f, c.want) {
			t.Errorf("planted %+v: got %q, want %q", c.knobs, f, c.want)
		}
	}
	// muxRun's check of the published value (every seed's run).
	for _, c := range []testingKnobs{{muxQuietStaleAppend: true}, {muxQuietInFlight: true}, {muxQuietAlways: true}} {
		caughtBy(t, c, 20, "quiet:")
	}
}

func muxQuietRun(t *testing.T, knobs testingKnobs, cont bool) string {
	const fi = 10 * time.Millisecond
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Async, FsyncInterval: fi, SegmentBytes: 1 << 16}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	now := time.Duration(0)
	if cont {
		m.SetDeviceContinues()
	}
	// runAll runs the device's queue; with cont, Continue after every
	// completion but a Quiet IO's, as the shared log's device does.
	runAll := func() {
		for len(d.queue) > 0 {
			quiet := d.queue[0].Quiet
			d.step()
			if cont && !quiet {
				m.Continue(now)
			}
		}
	}
	// A long idle spell: every Poll skips.
	s0 := m.Skipped()
	for now = 0; now < 5*time.Second; now += time.Millisecond {
		a.Poll(now)
		b.Poll(now)
	}
	if m.Skipped() == s0 {
		return "skips: no Poll of an idle log skipped"
	}
	a.Poll(now) // a replica's Poll polls its log first, then appends
	if seq, ok := a.Append(RecEntry, []byte("first")); !ok || seq != 1 {
		t.Fatalf("append: %d %v", seq, ok)
	}
	if o := a.OldestUnsynced(); o != now {
		return "clock: a record appended at " + now.String() + " after skipped Polls is stamped " + o.String()
	}
	// Before the interval: nothing goes out.
	opened := now
	for ; now < opened+fi; now += time.Millisecond {
		a.Poll(now)
		b.Poll(now)
		if len(d.queue) > 0 {
			return "interval: a batch went out at " + now.String() + ", before its interval"
		}
	}
	a.Poll(now)
	b.Poll(now)
	if len(d.queue) == 0 {
		return "interval: no batch at " + now.String() + ", the interval of a record appended at " + opened.String() + " ended"
	}
	if cont {
		// In flight: the Polls skip (the completion's Continue reaps).
		s1 := m.Skipped()
		a.Poll(now)
		if m.Skipped() == s1 {
			return "in flight: a Poll with an IO in flight did not skip"
		}
	}
	for i := 0; i < 50 && a.Synced() != 1; i++ {
		runAll()
		a.Poll(now)
	}
	if a.Synced() != 1 {
		return "synced: the batch's record is not synced after its completion"
	}
	// A Flush starts the open batch at the next Poll.
	b.Append(RecEntry, []byte("second"))
	b.Poll(now)
	b.Flush()
	b.Poll(now)
	a.Poll(now)
	if len(d.queue) == 0 {
		return "flush: no batch at the Poll after a Flush (the interval ends at " + (now + fi).String() + ")"
	}
	for i := 0; i < 50 && b.Synced() != 1; i++ {
		runAll()
		b.Poll(now)
	}
	if b.Synced() != 1 || !m.Idle() {
		return "flush: the flushed record is not synced"
	}
	return ""
}
