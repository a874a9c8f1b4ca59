package groupproc

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
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

// Load runs a closed-loop client at this member (see LoadSpec). A member
// resolves its proposals in the order they were made, so the client waits
// for the oldest outstanding one and replaces it with a new one.
func (m *Member) Load(ctx context.Context, spec LoadSpec) (LoadResult, error) {
	if spec.Window <= 0 || spec.Size < 8 {
		return LoadResult{}, fmt.Errorf("groupproc: load: window %d must be positive and size %d at least 8", spec.Window, spec.Size)
	}
	if spec.Samples <= 0 {
		spec.Samples = 1 << 21
	}
	type out struct {
		p     *broadcast.Proposal
		start time.Time
	}
	data := make([]byte, spec.Size)
	seq := uint64(0)
	propose := func() out {
		seq++
		binary.LittleEndian.PutUint64(data, seq) // distinct messages
		return out{m.r.Propose(data), time.Now()}
	}
	q := make([]out, 0, spec.Window)
	for range spec.Window {
		q = append(q, propose())
	}
	var res LoadResult
	lat := make([]time.Duration, 0, min(spec.Samples, 1<<16))
	begin := time.Now()
	measureFrom := begin.Add(spec.Warmup)
	end := measureFrom.Add(spec.Duration)
	var start time.Time
	for head := 0; ; head = (head + 1) % spec.Window {
		o := q[head]
		select {
		case <-o.p.Done():
		case <-ctx.Done():
			return finish(res, lat, start), nil
		}
		now := time.Now()
		if _, err := o.p.Result(); err != nil {
			if !start.IsZero() {
				res.Failed++
			}
			if res.FirstErr == "" {
				res.FirstErr = err.Error()
			}
		} else if !now.Before(measureFrom) {
			if start.IsZero() {
				start = now
			} else {
				res.N++
				if len(lat) < spec.Samples {
					lat = append(lat, now.Sub(o.start))
				}
			}
		}
		if !start.IsZero() && spec.Duration > 0 && !now.Before(end) {
			return finish(res, lat, start), nil
		}
		q[head] = propose()
	}
}

func finish(res LoadResult, lat []time.Duration, start time.Time) LoadResult {
	if start.IsZero() {
		return res
	}
	res.Elapsed = time.Since(start)
	res.OpsPerS = float64(res.N) / res.Elapsed.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50 = lat[len(lat)/2]
		res.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return res
}
