package groupproc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/hist"
)

// LoadSpec describes a closed-loop client at a member: it keeps Window
// proposals of Size bytes outstanding, for Warmup (not measured) and then
// Duration, or until the context ends.
type LoadSpec struct {
	Window   int           `json:"window"`
	Size     int           `json:"size"`
	Warmup   time.Duration `json:"warmup"`
	Duration time.Duration `json:"duration"`
	// Samples bounds the latencies kept for quantiles (the first ones of
	// the measured part); default 1<<21.
	Samples int `json:"samples,omitempty"`
	// Segments makes the load also time every completion, warm-up
	// included, into segments: the first, "start", begins with the load,
	// and each Mark (CmdMark) ends the current one and begins the next.
	// Each segment keeps a histogram (no sample bound) and its longest
	// latency and gap between completions, so that a benchmark can compare
	// the commit latency during an event with the same run's before it.
	Segments bool `json:"segments,omitempty"`
}

// SegmentResult is what a load measured in one segment (LoadSpec.Segments):
// the completions between its mark and the next one. Latencies are from a
// histogram (under 1.6% error), Max exactly.
type SegmentResult struct {
	Label   string        `json:"label"`
	StartNS int64         `json:"start_unix_ns"`
	EndNS   int64         `json:"end_unix_ns"`
	N       uint64        `json:"n"`      // delivered
	Failed  uint64        `json:"failed"` // failed proposals (not timed)
	OpsPerS float64       `json:"ops_per_s"`
	P50     time.Duration `json:"p50_ns"`
	P90     time.Duration `json:"p90_ns"`
	P99     time.Duration `json:"p99_ns"`
	P999    time.Duration `json:"p999_ns"`
	Max     time.Duration `json:"max_ns"`
	MaxAtNS int64         `json:"max_at_unix_ns"` // when the slowest proposal resolved
	// MaxGap is the longest time between two completions, the later one
	// in this segment: how long the client saw no proposal resolve.
	MaxGap     time.Duration `json:"max_gap_ns"`
	MaxGapAtNS int64         `json:"max_gap_at_unix_ns"`
}

// LoadResult is what a load measured: commit latency (Propose to resolved
// as delivered, at the proposing member) and throughput of the measured
// part. Failed proposals (e.g. ErrTimeout during an election) are counted
// apart and not timed.
type LoadResult struct {
	N        uint64        `json:"n"`
	P50      time.Duration `json:"p50_ns"`
	P99      time.Duration `json:"p99_ns"`
	OpsPerS  float64       `json:"ops_per_s"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	Failed   uint64        `json:"failed"`
	FirstErr string        `json:"first_err,omitempty"`
	// Segments: with LoadSpec.Segments, one per segment, in order.
	Segments []SegmentResult `json:"segments,omitempty"`
}

// Load runs a closed-loop client at this member (see LoadSpec). It submits
// with ProposeFunc, and every proposal after the first is made by a
// completion callback on the member's driver goroutine: the callback
// records the outcome and tops the window up, so the client costs no
// goroutine hand-off, channel or wake-up per message (the shape of an
// application that proposes from its own event loop), and the loader's
// state has one goroutine. A member resolves its proposals in the order
// they were made, so the start times wait in a FIFO ring of Window slots.
func (m *Member) Load(ctx context.Context, spec LoadSpec) (LoadResult, error) {
	if spec.Window <= 0 || spec.Size < 8 {
		return LoadResult{}, fmt.Errorf("groupproc: load: window %d must be positive and size %d at least 8", spec.Window, spec.Size)
	}
	if spec.Samples <= 0 {
		spec.Samples = 1 << 21
	}
	l := &loader{
		r:      m.r,
		data:   make([]byte, spec.Size),
		starts: make([]time.Time, spec.Window),
		lat:    make([]time.Duration, 0, min(spec.Samples, 1<<16)),
		spec:   spec,
		done:   make(chan struct{}),
	}
	l.done1 = l.complete // one method value for every proposal
	begin := time.Now()
	if spec.Segments {
		l.segs = []*segment{{label: "start", start: begin}}
		l.lastDone = begin
	}
	m.lmu.Lock()
	if m.loads == nil {
		m.loads = map[*loader]struct{}{}
	}
	m.loads[l] = struct{}{}
	m.lmu.Unlock()
	defer func() {
		m.lmu.Lock()
		delete(m.loads, l)
		m.lmu.Unlock()
	}()
	l.measureFrom = begin.Add(spec.Warmup)
	l.end = l.measureFrom.Add(spec.Duration)
	// The first proposal is the only one made here; its callback fills the
	// window. Its fields are handed over through the replica's lock.
	l.propose(begin)
	select {
	case <-l.done:
	case <-ctx.Done():
		cancelled := time.Now()
		l.stop.Store(true)
		// Every outstanding proposal resolves: delivered, or failed by
		// ProposeTimeout, or ErrStopped when the replica closes.
		t := time.NewTimer(drainBound(m.cfg.Tuning.ProposeTimeout))
		defer t.Stop()
		select {
		case <-l.done:
		case <-t.C:
			return LoadResult{}, errors.New("groupproc: load: outstanding proposals did not resolve after the load was stopped")
		}
		if l.stopped.IsZero() {
			l.stopped = cancelled
		}
	}
	res := finish(l.res, l.lat, l.measureFrom, l.stopped)
	if spec.Segments {
		l.takeMarks(time.Now()) // marks no completion saw
		end := l.stopped
		if end.IsZero() {
			end = time.Now()
		}
		for _, sg := range l.segs {
			res.Segments = append(res.Segments, sg.result(end))
		}
	}
	return res, nil
}

// Mark ends the current segment of every load running at this member with
// LoadSpec.Segments and begins one named label; it returns how many loads
// it marked.
func (m *Member) Mark(label string) int {
	now := time.Now()
	m.lmu.Lock()
	defer m.lmu.Unlock()
	n := 0
	for l := range m.loads {
		if l.spec.Segments {
			l.mmu.Lock()
			l.marks = append(l.marks, mark{label, now})
			l.mmu.Unlock()
			l.nmarks.Add(1)
			n++
		}
	}
	return n
}

// mark is a segment boundary on its way to the loader.
type mark struct {
	label string
	at    time.Time
}

// segment is one segment's record (driver goroutine only).
type segment struct {
	label      string
	start, end time.Time
	h          hist.Hist
	failed     uint64
	maxAt      time.Time
	maxGap     time.Duration
	maxGapAt   time.Time
}

func (s *segment) result(end time.Time) SegmentResult {
	if s.end.IsZero() {
		s.end = end
	}
	r := SegmentResult{Label: s.label, StartNS: s.start.UnixNano(), EndNS: s.end.UnixNano(), N: s.h.N(), Failed: s.failed,
		P50: s.h.Quantile(0.5), P90: s.h.Quantile(0.9), P99: s.h.Quantile(0.99), P999: s.h.Quantile(0.999),
		Max: s.h.Max(), MaxGap: s.maxGap}
	if d := s.end.Sub(s.start); d > 0 {
		r.OpsPerS = float64(r.N) / d.Seconds()
	}
	if !s.maxAt.IsZero() {
		r.MaxAtNS = s.maxAt.UnixNano()
	}
	if !s.maxGapAt.IsZero() {
		r.MaxGapAtNS = s.maxGapAt.UnixNano()
	}
	return r
}

// takeMarks begins the segments of the marks made so far (driver
// goroutine, or Load once the loader is done).
func (l *loader) takeMarks(now time.Time) {
	n := l.nmarks.Load()
	if n == l.seenMarks {
		return
	}
	l.mmu.Lock()
	ms := l.marks
	l.marks = nil
	l.mmu.Unlock()
	l.seenMarks += int64(len(ms))
	for _, mk := range ms {
		at := mk.at
		if at.After(now) {
			at = now // a completion at now follows the mark
		}
		cur := l.segs[len(l.segs)-1]
		cur.end = at
		l.segs = append(l.segs, &segment{label: mk.label, start: at})
	}
}

// timeSegment records a completion at now into the current segment.
func (l *loader) timeSegment(now, started time.Time, err error) {
	l.takeMarks(now)
	s := l.segs[len(l.segs)-1]
	if err != nil {
		s.failed++
	} else {
		lat := now.Sub(started)
		if max(lat, 0) > s.h.Max() || s.h.N() == 0 {
			s.maxAt = now
		}
		s.h.Record(lat)
	}
	if gap := now.Sub(l.lastDone); gap > s.maxGap {
		s.maxGap, s.maxGapAt = gap, now
	}
	l.lastDone = now
}

// loader is Load's state. After Load's first propose, only complete and
// the proposals it makes touch it (on the driver goroutine; a proposal
// that fails at once calls complete from inside ProposeFunc, on the same
// goroutine); Load reads it after done is closed.
type loader struct {
	r           *broadcast.Replica
	spec        LoadSpec
	data        []byte
	seq         uint64
	starts      []time.Time // FIFO of outstanding proposals' start times
	head, tail  int
	inflight    int
	done1       func(uint64, []byte, error)
	measureFrom time.Time
	end         time.Time
	stopped     time.Time // the end of the measured part
	res         LoadResult
	lat         []time.Duration
	stop        atomic.Bool
	closed      bool // done is closed
	done        chan struct{}

	// Segments (LoadSpec.Segments): marks arrive from Mark under mmu and
	// are counted in nmarks, so that a completion looks at the count only.
	segs      []*segment
	lastDone  time.Time
	seenMarks int64
	nmarks    atomic.Int64
	mmu       sync.Mutex
	marks     []mark
}

// propose submits the next message; now is its start time (the caller's
// clock reading: one per completion, which also ends the previous one).
func (l *loader) propose(now time.Time) {
	l.seq++
	binary.LittleEndian.PutUint64(l.data, l.seq) // distinct messages
	l.starts[l.tail] = now
	l.tail = (l.tail + 1) % len(l.starts)
	l.inflight++
	l.r.ProposeFunc(l.data, l.done1)
}

// complete is the proposals' callback: it counts and times the outcome if
// it falls in the measured part, then tops the window up unless the load
// is stopping. A proposal refused at once (ErrBusy: the window exceeds
// the replica's MaxPending; ErrStopped; ErrTooLarge) stops the load.
func (l *loader) complete(_ uint64, _ []byte, err error) {
	now := time.Now()
	started := l.starts[l.head]
	l.head = (l.head + 1) % len(l.starts)
	l.inflight--
	if !l.stop.Load() {
		if l.segs != nil {
			l.timeSegment(now, started, err)
		}
		measuring := !now.Before(l.measureFrom)
		switch {
		case err != nil:
			if measuring {
				l.res.Failed++
			}
			if l.res.FirstErr == "" {
				l.res.FirstErr = err.Error()
			}
		case measuring:
			l.res.N++
			if len(l.lat) < l.spec.Samples {
				l.lat = append(l.lat, now.Sub(started))
			}
		}
		if measuring && l.spec.Duration > 0 && !now.Before(l.end) {
			l.stopped = now // the end of the measured part; the drain is not counted
			l.stop.Store(true)
		}
		if errors.Is(err, broadcast.ErrBusy) || errors.Is(err, broadcast.ErrStopped) || errors.Is(err, broadcast.ErrTooLarge) {
			l.stop.Store(true)
		}
	}
	for !l.stop.Load() && l.inflight < len(l.starts) {
		l.propose(now)
	}
	if l.stop.Load() && l.inflight == 0 && !l.closed {
		l.closed = true
		close(l.done)
	}
}

// drainBound is how long a stopped load waits for its outstanding
// proposals: each resolves within the replica's ProposeTimeout.
func drainBound(proposeTimeout time.Duration) time.Duration {
	if proposeTimeout <= 0 {
		proposeTimeout = broadcast.DefaultProposeTimeout
	}
	return proposeTimeout + 5*time.Second
}

// finish computes the figures of a load measured from start to stopped.
func finish(res LoadResult, lat []time.Duration, start, stopped time.Time) LoadResult {
	if !stopped.After(start) {
		return res // stopped during the warm-up
	}
	res.Elapsed = stopped.Sub(start)
	res.OpsPerS = float64(res.N) / res.Elapsed.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50 = lat[len(lat)/2]
		res.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return res
}
