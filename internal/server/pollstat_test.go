package server

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/poller"
)

// TestPollStatsAttribution: the longest Poll is kept with the counters'
// differences across it, since the start and in the recent windows, and
// the recent one forgets a Poll two windows old.
func TestPollStatsAttribution(t *testing.T) {
	var s pollStats
	w := poller.PassWindow
	a := pollMark{delivered: 10, walSeq: 5, captures: 1, capture: time.Millisecond, table: 900e3, index: 800e3}
	b := pollMark{delivered: 10, walSeq: 7, captures: 2, capture: 4 * time.Millisecond, meta: time.Microsecond,
		table: 3e6, index: 2.5e6, ordered: 1e5, store: 0}
	s.note(w/2, 5*time.Millisecond, a, b)
	s.note(w/2+1, time.Millisecond, b, pollMark{delivered: 500, walSeq: 7, captures: 2, capture: 4 * time.Millisecond, meta: time.Microsecond, table: 3e6, index: 2.5e6, ordered: 1e5})
	want := PollDetail{Us: 5000, WALRecords: 2, Captures: 1, CaptureUs: 3000, MetaUs: 1, TableUs: 2100, IndexUs: 1700, OrderedUs: 100}
	if s.max != want {
		t.Fatalf("max %+v, want %+v", s.max, want)
	}
	if got := s.recent(w / 2); got != want {
		t.Fatalf("recent %+v, want %+v", got, want)
	}
	// A window later: the previous window's Poll is still recent, and a
	// shorter one of the new window does not replace it.
	s.note(w/2+w, 2*time.Millisecond, b, b)
	if got := s.recent(w/2 + w); got.Us != 5000 {
		t.Fatalf("recent one window on: %v us, want 5000", got.Us)
	}
	// Two windows on: only the new window's.
	s.note(w/2+2*w+1, 3*time.Millisecond, b, b)
	if got := s.recent(w/2 + 2*w + 1); got.Us != 3000 || got.Captures != 0 {
		t.Fatalf("recent two windows on: %+v, want the 3 ms Poll alone", got)
	}
	if s.max.Us != 5000 {
		t.Fatalf("max forgot: %+v", s.max)
	}
	if got := s.recent(w/2 + 5*w); got.Us != 0 {
		t.Fatalf("recent long after the last Poll: %+v", got)
	}
}

// TestHistMaxUs: the highest bucket that grew, by its upper bound.
func TestHistMaxUs(t *testing.T) {
	a := &metrics.Float64Histogram{Counts: []uint64{1, 0, 2}, Buckets: []float64{0, 1e-6, 1e-3, 1}}
	b := &metrics.Float64Histogram{Counts: []uint64{1, 3, 2}, Buckets: a.Buckets}
	if got := histMaxUs(a, b); got != 1000 {
		t.Fatalf("got %v us, want 1000", got)
	}
	if got := histMaxUs(a, a); got != 0 {
		t.Fatalf("no growth: got %v", got)
	}
	if st := runtimeWindows.status(); st.GCCycles > 1<<40 {
		t.Fatalf("status %+v", st)
	}
}

// TestThreadCPU: the thread's CPU clock moves with work on it.
func TestThreadCPU(t *testing.T) {
	// One thread's clock both times: the scheduler may move an unlocked
	// goroutine between the reads (read 33.8 ms, then another thread's
	// 14.4 ms, under load).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a := threadCPU()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	if b := threadCPU(); b <= a || x == 0 {
		t.Fatalf("thread CPU %v then %v", a, b)
	}
}

// TestRunDelayOf: the run delay is schedstat's second field, in ns (0
// for a line it cannot read), and this thread's reads do not go back.
func TestRunDelayOf(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
	}{{"7764278 59631112 7\n", 59631112}, {"7764278\n", 0}, {"", 0}, {"1 x 2", 0}, {"1 -5 2", 0}} {
		if got := runDelayOf([]byte(c.line)); got != c.want {
			t.Errorf("runDelayOf(%q) = %v, want %v", c.line, got, c.want)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if a, b := threadRunDelay(), threadRunDelay(); b < a {
		t.Errorf("thread run delay %v then %v", a, b)
	}
}

// TestCPUClockKeepsThread: from a capture's first CPU clock read
// (Durable.cpuClock, broadcast's StatCPUClock) to the end of its Poll
// (unlockThread) the polling goroutine stays on one thread, so the reads
// around the capture are of one thread's clock, however often Go's
// scheduler takes the goroutine off its processor in between (here: it
// sleeps); after the Poll it may move again. Planted cpuUnlocked: the goroutine moves
// between the reads, and capture_cpu_us would mix two threads' clocks.
func TestCPUClockKeepsThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	for _, planted := range []bool{false, true} {
		between, after, locked := clockThreadMoves(planted)
		t.Logf("cpuUnlocked %v: the goroutine moved between the reads in %d of 20 captures, after the Poll in %d", planted, between, after)
		switch {
		case locked != 0:
			t.Errorf("cpuUnlocked %v: %d locks left after the Poll", planted, locked)
		case !planted && between > 0:
			t.Errorf("the polling goroutine moved to another thread between the capture's CPU clock reads in %d of 20 captures", between)
		case !planted && after == 0:
			t.Errorf("the polling goroutine never moved after its Polls: unlockThread left it locked")
		case planted && between == 0:
			t.Errorf("planted cpuUnlocked: the goroutine never moved between the reads (the test no longer provokes a move)")
		}
	}
}

// clockThreadMoves runs 20 mock capturing Polls on a goroutine; between
// the two CPU clock reads, and again after its unlockThread, each sleeps
// 20 times for a microsecond (a goroutine woken by a timer runs on
// whichever thread takes it up, most often another one here). It counts
// the Polls whose goroutine changed threads between the reads and after
// the Poll, and the locks left.
func clockThreadMoves(unlocked bool) (between, after, locked int) {
	d := &Durable{cpuUnlocked: unlocked}
	moved := func() bool {
		tid := unix.Gettid()
		for range 20 {
			time.Sleep(time.Microsecond)
			if unix.Gettid() != tid {
				return true
			}
		}
		return false
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			d.cpuClock()
			if moved() {
				between++
			}
			d.cpuClock()
			d.unlockThread()
			if moved() {
				after++
			}
		}
		locked = d.locked
	}()
	<-done
	return between, after, locked
}

// TestThreadDetail: a saving Poll's thread counters split its wall time
// into CPU, run delay and the rest, with the faults and switches; a Poll
// whose thread was not read, or read on two threads, has none, and
// noteSaving keeps the longest with them apart from the longest of all.
func TestThreadDetail(t *testing.T) {
	a := threadSched{ok: true, tid: 7, cpu: time.Millisecond, runDelay: 2 * time.Millisecond, minflt: 10, majflt: 1, nvcsw: 3, nivcsw: 4}
	b := threadSched{ok: true, tid: 7, cpu: 3 * time.Millisecond, runDelay: 7 * time.Millisecond, minflt: 15, majflt: 1, nvcsw: 5, nivcsw: 9}
	var d PollDetail
	threadDetail(&d, 10000, a, b)
	want := PollDetail{Thread: true, ThreadCPUUs: 2000, ThreadRunDelayUs: 5000, ThreadOffUs: 3000, ThreadMinFaults: 5, ThreadSleeps: 2, ThreadPreempted: 5}
	if d != want {
		t.Fatalf("threadDetail = %+v, want %+v", d, want)
	}
	moved := b
	moved.tid = 8
	for _, c := range [][2]threadSched{{a, moved}, {{}, b}, {a, {}}} {
		var d PollDetail
		if threadDetail(&d, 10000, c[0], c[1]); d.Thread {
			t.Fatalf("thread read on %+v and %+v: %+v", c[0], c[1], d)
		}
	}
	var s pollStats
	s.noteSaving(20*time.Millisecond, pollMark{}, pollMark{}) // not read
	s.noteSaving(10*time.Millisecond, pollMark{th: a}, pollMark{th: b})
	s.noteSaving(5*time.Millisecond, pollMark{th: a}, pollMark{th: b})
	if s.saving.Us != 20000 || s.saving.Thread {
		t.Fatalf("longest in a save: %+v", s.saving)
	}
	if s.savingRead.Us != 10000 || !s.savingRead.Thread || s.savingRead.ThreadOffUs != 3000 {
		t.Fatalf("longest in a save with its thread read: %+v", s.savingRead)
	}
}
