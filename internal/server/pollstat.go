package server

import (
	"time"

	"github.com/rdmakv/rdmakv/broadcast"

	"github.com/rdmakv/rdmakv/poller"
)

// PollDetail is one Poll of a replica and what it did in it, for the
// longest ones /status shows (issue 19: which step of which replica holds
// its poller up while a disk snapshot is written). The counters are read
// before and after every Poll (fields, no clock); the durations of the
// capture and store steps are timed inside (broadcast.SnapWork,
// kv.SnapshotWork), the rest of the Poll is not: Us minus the timed steps
// is the delivery (Applied entries), the log work (WALRecords), the
// messages, and any time the goroutine did not run (Go's scheduler
// preempting it, the garbage collector, the OS).
type PollDetail struct {
	Us         float64 `json:"us"`          // the whole Poll
	Applied    uint64  `json:"applied"`     // entries delivered to the table
	WALRecords uint64  `json:"wal_records"` // log records appended
	Captures   uint64  `json:"captures"`    // disk snapshot captures (0 or 1)
	// CaptureUs is the FSM capture (multicast state, table, ordered
	// part); TableUs the table's part of it, IndexUs the copy of its
	// index, OrderedUs the ordered part's capture; the multicast part is
	// CaptureUs - TableUs. MetaUs: broadcast's own state captured with
	// it (the keyed table).
	CaptureUs float64 `json:"capture_us"`
	MetaUs    float64 `json:"meta_us"`
	// CaptureCPUUs is the polling thread's CPU time in the capture: its
	// own work, without the time it waited for a processor.
	CaptureCPUUs float64 `json:"capture_cpu_us"`
	// CaptureRunDelayUs is the polling thread's time in the capture
	// runnable on the OS's run queue, not running (schedstat): what the
	// OS's scheduler took. The rest of CaptureUs, less the CPU and this,
	// the thread slept (a page fault waiting on a lock or the disk, or
	// the goroutine waiting for Go's scheduler).
	CaptureRunDelayUs float64 `json:"capture_run_delay_us"`
	TableUs           float64 `json:"table_us"`
	IndexUs           float64 `json:"index_us"`
	OrderedUs         float64 `json:"ordered_us"`
	// StoreUs: a persisted snapshot handed to the store, the log dropped
	// below a durable one.
	StoreUs float64 `json:"snap_store_us"`
	// StableSaves: saves of the stable state on the polling goroutine
	// (a write and two fsyncs each), StableUs their time: a Stable that
	// is not an AsyncStable (an AsyncFileStable saves off the poller:
	// broadcast's Counters.StableSaves and Status.StableSaveMax count
	// those).
	StableSaves uint64  `json:"stable_saves"`
	StableUs    float64 `json:"stable_us"`
	// Thread: the Poll overlapped a save from its start, and its
	// goroutine was locked to its thread for it, whose counters were read
	// before and after (threadSched): ThreadCPUUs is the thread's time on
	// a CPU, ThreadRunDelayUs its time runnable on the OS's run queue
	// (the cores busy with other threads); the rest of Us, ThreadOffUs,
	// it was neither: asleep (a page fault's read, a lock) or its
	// goroutine waiting in Go's scheduler for a processor (a locked
	// thread sleeps meanwhile). ThreadMinFaults and ThreadMajFaults are
	// its page faults, ThreadSleeps its voluntary context switches,
	// ThreadPreempted the OS's preemptions of it (involuntary).
	Thread           bool    `json:"thread"`
	ThreadCPUUs      float64 `json:"thread_cpu_us"`
	ThreadRunDelayUs float64 `json:"thread_run_delay_us"`
	ThreadOffUs      float64 `json:"thread_off_us"`
	ThreadMinFaults  int64   `json:"thread_min_faults"`
	ThreadMajFaults  int64   `json:"thread_maj_faults"`
	ThreadSleeps     int64   `json:"thread_sleeps"`
	ThreadPreempted  int64   `json:"thread_preempted"`
}

// timedStable counts a replica's stable saves and their time (Save runs
// on the polling goroutine).
type timedStable struct {
	broadcast.Stable
	saves uint64
	took  time.Duration
}

func (s *timedStable) Save(st broadcast.StableState) error {
	t0 := time.Now()
	err := s.Stable.Save(st)
	s.saves++
	s.took += time.Since(t0)
	return err
}

// timedAsyncStable is a timedStable over an AsyncStable: its Save (at
// boot) is timed, its asynchronous saves run off the poller.
type timedAsyncStable struct {
	*timedStable
	a broadcast.AsyncStable
}

func (s timedAsyncStable) SaveAsync(st broadcast.StableState) { s.a.SaveAsync(st) }

func (s timedAsyncStable) Saved(dst []broadcast.StableSaved) []broadcast.StableSaved {
	return s.a.Saved(dst)
}

// pollMark is the counters pollStats reads around a Poll.
type pollMark struct {
	delivered, walSeq, captures, saves uint64
	capture, meta, store, cpu, stable  time.Duration
	runDelay                           time.Duration
	table, index, ordered              int64
	th                                 threadSched // read only around a watched Poll (Replica.Poll)
}

// pollStats keeps a replica's longest Poll since the start and in the
// last poller.PassWindow to 2 x PassWindow, with what each did, and its
// longest Poll that overlapped a disk snapshot's save in the process
// (polling goroutine).
type pollStats struct {
	max, cur, prev PollDetail
	window         time.Duration
	saving         PollDetail
	savingRead     PollDetail // the longest of those with its thread read (Thread)
}

func (p *Replica) mark() pollMark {
	b := p.r.Multicast().Broadcast()
	sw, kw := b.SnapWork(), p.r.Table().SnapshotWork()
	m := pollMark{delivered: b.Delivered(), captures: sw.Captures, capture: sw.Capture, meta: sw.Meta, store: sw.Store, cpu: sw.CaptureCPU, runDelay: sw.CaptureRunDelay,
		table: kw.Total, index: kw.Index, ordered: kw.Ordered}
	if p.dur != nil {
		m.walSeq = p.dur.WAL.NextSeq()
	}
	if p.stable != nil {
		m.saves, m.stable = p.stable.saves, p.stable.took
	}
	return m
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// note records a Poll at now that took d, between marks a and b.
func (s *pollStats) note(now, d time.Duration, a, b pollMark) {
	if now-s.window >= poller.PassWindow {
		if now-s.window >= 2*poller.PassWindow {
			s.cur = PollDetail{}
		}
		s.prev, s.cur, s.window = s.cur, PollDetail{}, now
	}
	x := us(d)
	if x <= s.cur.Us && x <= s.max.Us {
		return
	}
	det := detail(x, a, b)
	if x > s.cur.Us {
		s.cur = det
	}
	if x > s.max.Us {
		s.max = det
	}
}

// detail is a Poll of x µs between marks a and b.
func detail(x float64, a, b pollMark) PollDetail {
	return PollDetail{Us: x, Applied: b.delivered - a.delivered, WALRecords: b.walSeq - a.walSeq,
		Captures: b.captures - a.captures, CaptureUs: us(b.capture - a.capture), MetaUs: us(b.meta - a.meta), CaptureCPUUs: us(b.cpu - a.cpu), CaptureRunDelayUs: us(b.runDelay - a.runDelay), StableSaves: b.saves - a.saves, StableUs: us(b.stable - a.stable), StoreUs: us(b.store - a.store),
		TableUs: us(time.Duration(b.table - a.table)), IndexUs: us(time.Duration(b.index - a.index)),
		OrderedUs: us(time.Duration(b.ordered - a.ordered))}
}

// threadDetail adds to det what the polling thread did between a and b
// (readThreadSched before and after a Poll of x µs on one thread); none
// if either read failed or the two are of different threads.
func threadDetail(det *PollDetail, x float64, a, b threadSched) {
	if !a.ok || !b.ok || a.tid != b.tid {
		return
	}
	det.Thread = true
	det.ThreadCPUUs, det.ThreadRunDelayUs = us(max(b.cpu-a.cpu, 0)), us(max(b.runDelay-a.runDelay, 0))
	det.ThreadOffUs = max(x-det.ThreadCPUUs-det.ThreadRunDelayUs, 0)
	det.ThreadMinFaults, det.ThreadMajFaults = b.minflt-a.minflt, b.majflt-a.majflt
	det.ThreadSleeps, det.ThreadPreempted = b.nvcsw-a.nvcsw, b.nivcsw-a.nivcsw
}

// noteSaving records a Poll that took d, between marks a and b, that
// overlapped a disk snapshot's save in the process (the longest since
// the start: saving).
func (s *pollStats) noteSaving(d time.Duration, a, b pollMark) {
	x := us(d)
	if x <= s.saving.Us && x <= s.savingRead.Us {
		return
	}
	det := detail(x, a, b)
	threadDetail(&det, x, a.th, b.th)
	if x > s.saving.Us {
		s.saving = det
	}
	if det.Thread && x > s.savingRead.Us {
		s.savingRead = det
	}
}

// recent is the longest Poll of the last 1 to 2 windows at now.
func (s *pollStats) recent(now time.Duration) PollDetail {
	switch {
	case now-s.window >= 2*poller.PassWindow:
		return PollDetail{}
	case now-s.window >= poller.PassWindow:
		return s.cur
	case s.prev.Us > s.cur.Us:
		return s.prev
	}
	return s.cur
}
