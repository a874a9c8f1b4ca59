package server

import (
	"runtime/metrics"
	"testing"
	"time"

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
	a := threadCPU()
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	if b := threadCPU(); b <= a || x == 0 {
		t.Fatalf("thread CPU %v then %v", a, b)
	}
}
