package btree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fillAfter loads n keys of 16 bytes with 100-byte values into a tree of
// 4 KiB nodes in ascending order, each key displaced by up to window
// places (keys a concurrent load sends out of order), or in random order
// (window < 0), and returns its leaf fill after a Check.
func fillAfter(t *testing.T, n, window int, half bool) Stats {
	t.Helper()
	tr, err := New(Config{NodeSize: 4096, MaxKey: 64}, NewArena(4096, 256, nil), 1)
	if err != nil {
		t.Fatal(err)
	}
	tr.knobs.halfSplits = half
	r := rand.New(rand.NewPCG(uint64(n), uint64(window+2)))
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	switch {
	case window < 0:
		r.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	case window > 0:
		// Each key is late by up to window places: sorted by i + a
		// random delay.
		at := make([]float64, n)
		for i := range at {
			at[i] = float64(i) + r.Float64()*float64(window)
		}
		slices.SortFunc(order, func(a, b int) int { return cmpFloat(at[a], at[b]) })
	}
	val := make([]byte, 100)
	for i, k := range order {
		if _, err := tr.Put([]byte(fmt.Sprintf("k%015d", k)), val, uint64(i+2)<<16, uint64(i+2)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Check(); err != nil {
		t.Fatal(err)
	}
	return tr.Stats()
}

// TestRightFill: a load in ascending key order leaves leaves at least 85%
// full (the last node of each level splits at RightFill, 90%), also when
// keys come up to 8 places late, where halves leave them half full (the
// knob halfSplits: at most 55%); a load in random order fills them as
// halves do (about ln 2). (Keys later than the left node's free tenth
// holds, 16 places and more with these 30-entry leaves, split it in
// halves again: 0.80 at 16, 0.59 at 32, where halves give 0.54.)
func TestRightFill(t *testing.T) {
	const n = 20000
	for _, w := range []int{0, 8} {
		if st := fillAfter(t, n, w, false); st.LeafFill < 0.85 || st.Keys != n {
			t.Errorf("ascending load, window %d: leaf fill %.3f (%d leaves), want at least 0.85", w, st.LeafFill, st.Leaves)
		}
		if st := fillAfter(t, n, w, true); st.LeafFill > 0.55 {
			t.Errorf("ascending load, window %d, halves: leaf fill %.3f, want at most 0.55 (the test must see the difference)", w, st.LeafFill)
		}
	}
	ours, half := fillAfter(t, n, -1, false), fillAfter(t, n, -1, true)
	if ours.LeafFill < 0.6 || ours.LeafFill > 0.8 || ours.LeafFill < half.LeafFill-0.02 {
		t.Errorf("random load: leaf fill %.3f, halves %.3f; want about ln 2 for both", ours.LeafFill, half.LeafFill)
	}
}
