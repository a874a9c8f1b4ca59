package server

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/poller"
)

// RuntimeStatus is what the Go runtime did to the process's goroutines
// lately (the last 1 to 2 seconds, poller.PassWindow): the pauses that
// stop every goroutine, the pollers too, and how long runnable goroutines
// waited for a processor. A poller pass longer than its replicas' polls
// (poll_max) is one of these. Figures are the upper bounds of the
// runtime's histogram buckets, so they overstate by up to the bucket's
// width.
type RuntimeStatus struct {
	// GCStopMaxUs is the longest time a stop-the-world of the garbage
	// collector took to stop every goroutine (one in a long
	// non-preemptible call, such as a copy of many megabytes, holds the
	// others stopped meanwhile); GCPauseMaxUs the longest whole pause,
	// stopping included. OtherStop/OtherPause: the same for the other
	// stops (profiles, ReadMemStats).
	GCStopMaxUs     float64 `json:"gc_stop_max_us"`
	GCPauseMaxUs    float64 `json:"gc_pause_max_us"`
	OtherStopMaxUs  float64 `json:"other_stop_max_us"`
	OtherPauseMaxUs float64 `json:"other_pause_max_us"`
	// SchedLatencyMaxUs is the longest a goroutine waited, runnable, for
	// a processor.
	SchedLatencyMaxUs float64 `json:"sched_latency_max_us"`
	GCCycles          uint64  `json:"gc_cycles"` // garbage collections in the window
}

var rtMetrics = []string{
	"/sched/pauses/stopping/gc:seconds",
	"/sched/pauses/total/gc:seconds",
	"/sched/pauses/stopping/other:seconds",
	"/sched/pauses/total/other:seconds",
	"/sched/latencies:seconds",
	"/gc/cycles/total:gc-cycles",
}

// rtWindows reads the runtime's cumulative histograms and keeps the
// reading at the start of the current and of the previous window, so
// that any reader gets the events of the last 1 to 2 windows.
type rtWindows struct {
	mu        sync.Mutex
	cur, prev []metrics.Sample // readings at the windows' starts
	start     time.Time        // the current window's
	havePrev  bool
}

// runtimeWindows is the process's (ProcessStatus.Runtime).
var runtimeWindows rtWindows

func readRuntime() []metrics.Sample {
	s := make([]metrics.Sample, len(rtMetrics))
	for i, n := range rtMetrics {
		s[i].Name = n
	}
	metrics.Read(s)
	return s
}

// status returns the runtime's figures since the start of the previous
// window (or of the process's first reading).
func (w *rtWindows) status() RuntimeStatus {
	now := readRuntime()
	w.mu.Lock()
	defer w.mu.Unlock()
	t := time.Now()
	switch {
	case w.cur == nil:
		w.cur, w.start = now, t
	case t.Sub(w.start) >= 2*poller.PassWindow:
		w.prev, w.cur, w.start, w.havePrev = now, now, t, true
	case t.Sub(w.start) >= poller.PassWindow:
		w.prev, w.cur, w.start, w.havePrev = w.cur, now, t, true
	}
	base := w.cur
	if w.havePrev {
		base = w.prev
	}
	var st RuntimeStatus
	for i := range now {
		switch now[i].Value.Kind() {
		case metrics.KindFloat64Histogram:
			m := histMaxUs(base[i].Value.Float64Histogram(), now[i].Value.Float64Histogram())
			switch i {
			case 0:
				st.GCStopMaxUs = m
			case 1:
				st.GCPauseMaxUs = m
			case 2:
				st.OtherStopMaxUs = m
			case 3:
				st.OtherPauseMaxUs = m
			case 4:
				st.SchedLatencyMaxUs = m
			}
		case metrics.KindUint64:
			st.GCCycles = now[i].Value.Uint64() - base[i].Value.Uint64()
		}
	}
	return st
}

// histMaxUs is the upper bound (µs) of the highest bucket whose count
// grew from a to b (the lower bound for the last, unbounded one).
func histMaxUs(a, b *metrics.Float64Histogram) float64 {
	for i := len(b.Counts) - 1; i >= 0; i-- {
		if i < len(a.Counts) && b.Counts[i] > a.Counts[i] {
			up := b.Buckets[i+1]
			if math.IsInf(up, 1) {
				up = b.Buckets[i]
			}
			return up * 1e6
		}
	}
	return 0
}
