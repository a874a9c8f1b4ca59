package groupproc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
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
	return finish(l.res, l.lat, l.measureFrom, l.stopped), nil
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
	done1       func(uint64, error)
	measureFrom time.Time
	end         time.Time
	stopped     time.Time // the end of the measured part
	res         LoadResult
	lat         []time.Duration
	stop        atomic.Bool
	closed      bool // done is closed
	done        chan struct{}
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
func (l *loader) complete(_ uint64, err error) {
	now := time.Now()
	started := l.starts[l.head]
	l.head = (l.head + 1) % len(l.starts)
	l.inflight--
	if !l.stop.Load() {
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
