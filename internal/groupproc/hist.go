package groupproc

import (
	"math/bits"
	"time"
)

// latHist is a log-linear latency histogram in nanoseconds (the shape of
// kvbench's): values below 128 are counted exactly, larger ones in 64
// buckets per power of two (under 1.6% relative error). Record allocates
// nothing, so a load's per-segment figures do not disturb what it times.
type latHist struct {
	counts   [histBuckets]uint64
	n        uint64
	min, max uint64
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	histBuckets = (64 - histSubBits) * histSub
)

func histBucket(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // v>>e is in [histSub, 2*histSub)
	return (e+1)*histSub + int(v>>e) - histSub
}

func histLower(i int) uint64 {
	if i < 2*histSub {
		return uint64(i)
	}
	e := i/histSub - 1
	return uint64(i%histSub+histSub) << e
}

func (h *latHist) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histBucket(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.n++
}

// quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding it, clamped to the observed range; 0 if empty.
func (h *latHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := min(uint64(q*float64(h.n)), h.n-1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			lo, hi := histLower(i), histLower(i+1)-1
			return time.Duration(min(max(lo+(hi-lo)/2, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
