package main

import (
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram in nanoseconds: values below 128
// are counted exactly, larger ones in 64 buckets per power of two (under
// 1.6% relative error). Record allocates nothing, so per-op timing does not
// disturb what it measures.
type hist struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      uint64
	min, max uint64
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits // buckets per power of two
	histBuckets = (64 - histSubBits) * histSub
)

// histBucket maps a value to its bucket index.
func histBucket(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // v>>e is in [histSub, 2*histSub)
	return (e+1)*histSub + int(v>>e) - histSub
}

// histLower is the smallest value of bucket i; the bucket holds values up
// to histLower(i+1)-1.
func histLower(i int) uint64 {
	if i < 2*histSub {
		return uint64(i)
	}
	e := i/histSub - 1
	return uint64(i%histSub+histSub) << e
}

// record adds one observation.
func (h *hist) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histBucket(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
}

// quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding it, clamped to the observed range.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if rank >= h.n {
		rank = h.n - 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			lo, hi := histLower(i), histLower(i+1)-1
			v := lo + (hi-lo)/2
			v = min(max(v, h.min), h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

// reset empties the histogram.
func (h *hist) reset() { *h = hist{} }
