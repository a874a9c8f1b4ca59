package hist

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestHistQuantiles checks the histogram's quantiles against the exact
// ones of random samples: within the bucket resolution (1/64).
func TestHistQuantiles(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Hist
	var vals []int64
	for range 100000 {
		v := int64(r.ExpFloat64() * 5000)
		vals = append(vals, v)
		h.Record(time.Duration(v))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		exact := float64(vals[int(q*float64(len(vals)))])
		got := float64(h.Quantile(q))
		if d := got - exact; d > exact/64+1 || -d > exact/64+1 {
			t.Errorf("q%.3f = %v, exact %v", q, got, exact)
		}
	}
	if top := time.Duration(vals[len(vals)-1]); h.Quantile(1) > top {
		t.Errorf("quantile(1) = %v, above the largest sample %v", h.Quantile(1), top)
	}
}

// TestHistExact: counts, min, max and mean are exact, and Reset empties.
func TestHistExact(t *testing.T) {
	var h Hist
	for _, v := range []time.Duration{5, 1000, -3, 70000} {
		h.Record(v)
	}
	if h.N() != 4 || h.Min() != 0 || h.Max() != 70000 || h.Mean() != (5+1000+0+70000)/4 {
		t.Errorf("n %d min %v max %v mean %v", h.N(), h.Min(), h.Max(), h.Mean())
	}
	h.Reset()
	if h.N() != 0 || h.Quantile(0.5) != 0 {
		t.Errorf("after Reset: n %d, p50 %v", h.N(), h.Quantile(0.5))
	}
}
