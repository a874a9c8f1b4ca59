// Package hist is a log-linear latency histogram in nanoseconds, shared by
// kvbench's measurements and groupproc's load segments: values below 128
// are counted exactly, larger ones in 64 buckets per power of two (under
// 1.6% relative error). Record allocates nothing, so per-op timing does
// not disturb what it measures.
package hist

import (
	"math/bits"
	"time"
)

// Hist counts observations; the zero value is empty and ready.
type Hist struct {
	counts   [buckets]uint64
	n        uint64
	sum      uint64
	min, max uint64
}

const (
	subBits = 6
	sub     = 1 << subBits // buckets per power of two
	buckets = (64 - subBits) * sub
)

// bucket maps a value to its bucket index.
func bucket(v uint64) int {
	if v < 2*sub {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1 // v>>e is in [sub, 2*sub)
	return (e+1)*sub + int(v>>e) - sub
}

// lower is the smallest value of bucket i; the bucket holds values up to
// lower(i+1)-1.
func lower(i int) uint64 {
	if i < 2*sub {
		return uint64(i)
	}
	e := i/sub - 1
	return uint64(i%sub+sub) << e
}

// Record adds one observation (negative durations count as 0).
func (h *Hist) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucket(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.n++
	h.sum += v
}

// Quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding it, clamped to the observed range; 0 if empty.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := min(uint64(q*float64(h.n)), h.n-1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			lo, hi := lower(i), lower(i+1)-1
			v := lo + (hi-lo)/2
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// N is the number of observations.
func (h *Hist) N() uint64 { return h.n }

// Max is the largest observation (exact), 0 if empty.
func (h *Hist) Max() time.Duration { return time.Duration(h.max) }

// Min is the smallest observation (exact), 0 if empty.
func (h *Hist) Min() time.Duration { return time.Duration(h.min) }

// Mean is the mean observation, 0 if empty.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Reset empties the histogram.
func (h *Hist) Reset() { *h = Hist{} }

// CountBelow is how many observations fell in the buckets below d's (for
// a Prometheus histogram's cumulative counts, to the bucket's precision).
func (h *Hist) CountBelow(d time.Duration) uint64 {
	b := bucket(uint64(max(d, 0)))
	var n uint64
	for _, c := range h.counts[:b] {
		n += c
	}
	return n
}

// Sum is the sum of the observations.
func (h *Hist) Sum() time.Duration { return time.Duration(h.sum) }
