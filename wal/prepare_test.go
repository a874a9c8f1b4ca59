package wal

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// prepareRun drives a FileDevice woken by Prepare (a spin of an hour, so
// that the IOs always come within it) and returns what failed:
//
//	prepare: the IOs after a Prepare were not taken by the woken goroutine
//	order:   an IO lost, or completed out of its submit order
//	data:    the file does not hold the writes in their order
//	close:   Close did not end a spinning goroutine
func prepareRun(t *testing.T, knobs deviceKnobs) []string {
	var failed []string
	fail := func(f string, args ...any) { failed = append(failed, fmt.Sprintf(f, args...)) }
	mem := vfs.NewMem()
	if err := mem.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	kick := make(chan struct{}, 64)
	d := newFileDevice(mem, func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}, knobs)
	d.SetPrepareSpin(time.Hour)
	d.Prepare()
	for len(d.prep) > 0 { // the goroutine took the token: it spins
		runtime.Gosched()
	}
	ops := []IO{{Kind: IOCreate, Path: "/d/f", Tag: 1}}
	var want []byte
	for i := range 3 {
		b := bytes.Repeat([]byte{byte('a' + i)}, 100)
		ops = append(ops, IO{Kind: IOWrite, Path: "/d/f", Off: int64(len(want)), Data: b, Tag: uint64(2 + i)})
		want = append(want, b...)
	}
	ops = append(ops, IO{Kind: IOSync, Path: "/d/f", Tag: 5})
	for _, op := range ops {
		if !d.Submit(op) {
			t.Fatal("submit refused")
		}
	}
	var done []Done
	// Completions come in order: the last op's ends the wait (a skipped
	// op's never comes).
	for deadline := time.Now().Add(10 * time.Second); len(done) < len(ops) && (len(done) == 0 || done[len(done)-1].Tag != ops[len(ops)-1].Tag) && time.Now().Before(deadline); {
		select {
		case <-kick:
		case <-time.After(time.Millisecond):
		}
		done = d.Reap(done)
	}
	var tags []uint64
	for _, c := range done {
		if c.Err != nil {
			fail("order: IO %d failed: %v", c.Tag, c.Err)
		}
		tags = append(tags, c.Tag)
	}
	if !slices.Equal(tags, []uint64{1, 2, 3, 4, 5}) {
		fail("order: completions %v, want 1-5 in order", tags)
	}
	if got, err := vfs.ReadFile(mem, "/d/f"); err != nil || !bytes.Equal(got, want) {
		fail("data: the file holds %q (%v), want %q", got, err, want)
	}
	if st := d.Stats(); st.Prepares != 1 || st.PrepareHits != 1 {
		fail("prepare: %d prepares, %d hits after one Prepare and its IOs, want 1 and 1", st.Prepares, st.PrepareHits)
	}
	// Prepare while idle again, then Close: the spinning goroutine ends.
	d.Prepare()
	for len(d.prep) > 0 {
		runtime.Gosched()
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		fail("close: Close did not return in a minute with the goroutine prepared")
	}
	return failed
}

// TestFileDevicePrepare: a prepared device runs the IOs that follow in
// order, as woken ones; the planted bugs are caught.
func TestFileDevicePrepare(t *testing.T) {
	if f := prepareRun(t, deviceKnobs{}); len(f) > 0 {
		t.Fatalf("%q", f)
	}
	for _, c := range []struct {
		name  string
		knobs deviceKnobs
		want  string
	}{
		{"prepareIgnored", deviceKnobs{prepareIgnored: true}, "prepare:"},
		{"prepareSkipsOp", deviceKnobs{prepareSkipsOp: true}, "order:"},
	} {
		f := prepareRun(t, c.knobs)
		if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, c.want) }) {
			t.Fatalf("planted %s: not caught by %q: %q", c.name, c.want, f)
		}
		t.Logf("planted %s caught: %q", c.name, f)
	}
}

// prepDevice is a testDevice that counts Prepare calls.
type prepDevice struct {
	*testDevice
	prepares int
}

func (d *prepDevice) Prepare() { d.prepares++ }

// muxPrepareRun steps a Mux (mode) over a prepDevice through one
// writer's puts (a leader's record, its followers') and returns what
// failed:
//
//	prepare: a Sync batch opened at an idle log did not prepare the device
//	once:    a batch prepared the device more than once
//	busy:    a batch whose record came while one was in flight prepared it
//	async:   an Async log prepared its device
func muxPrepareRun(t *testing.T, knobs testingKnobs, mode Mode) []string {
	var failed []string
	fail := func(f string, args ...any) { failed = append(failed, fmt.Sprintf(f, args...)) }
	mem := vfs.NewMem()
	d := &prepDevice{testDevice: newTestDevice(mem)}
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: mode, GatherWindow: 50 * time.Microsecond, SegmentBytes: 64 << 10}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	l, a, b := m.Stream(1, nil), m.Stream(2, nil), m.Stream(3, nil)
	for _, s := range []*Stream{l, a, b} {
		s.JoinGroup(1)
	}
	put := func(s *Stream) {
		if _, ok := s.Append(RecEntry, []byte("v")); !ok {
			t.Fatalf("stream %d: append refused: %v", s.ID(), s.Err())
		}
	}
	var now time.Duration
	idle := func() {
		for i := 0; !m.Idle() && i < 100; i++ {
			now += time.Millisecond
			m.Poll(now)
			d.runAll()
		}
		if !m.Idle() {
			t.Fatal("the log did not get idle")
		}
	}
	idle()
	sync := mode == Sync
	for round := 1; round <= 3; round++ {
		p0 := d.prepares
		put(l)
		if sync && d.prepares != p0+1 {
			fail("prepare: round %d: the leader's record at an idle log prepared the device %d times", round, d.prepares-p0)
		}
		put(a)
		put(b)
		if sync && d.prepares != p0+1 {
			fail("once: round %d: the batch of three records prepared the device %d times", round, d.prepares-p0)
		}
		m.Poll(now) // the batch starts: its write is queued
		p1 := d.prepares
		put(l) // the next put's record, while that batch is in flight
		if d.prepares != p1 {
			fail("busy: round %d: a record during the batch's write prepared the device", round)
		}
		idle()
	}
	if !sync && d.prepares != 0 {
		fail("async: an Async log prepared its device %d times", d.prepares)
	}
	return failed
}

// TestMuxPrepare: a Sync Mux prepares a Preparer device once a batch,
// for the batches opened at an idle log only; an Async one never.
func TestMuxPrepare(t *testing.T) {
	for _, mode := range []Mode{Sync, Async} {
		if f := muxPrepareRun(t, testingKnobs{}, mode); len(f) > 0 {
			t.Fatalf("mode %v: %q", mode, f)
		}
	}
	for _, c := range []struct {
		name  string
		knobs testingKnobs
		want  string
	}{
		{"prepareWhileBusy", testingKnobs{prepareWhileBusy: true}, "busy:"},
		{"prepareEveryRecord", testingKnobs{prepareEveryRecord: true}, "once:"},
	} {
		f := muxPrepareRun(t, c.knobs, Sync)
		if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, c.want) }) {
			t.Fatalf("planted %s: not caught by %q: %q", c.name, c.want, f)
		}
		t.Logf("planted %s caught: %q", c.name, f)
	}
}
