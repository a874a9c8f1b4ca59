package btree

import (
	"fmt"
	"testing"
)

// TestStoreEarlySplit: while the group owns fewer than EarlySplit
// tablets, a tablet splits past FirstTabletMax keys; once it owns
// EarlySplit, only past TabletMax. Without EarlySplit, FirstTabletMax
// does nothing. After a tablet leaves (a move's drop), the group splits
// early again. Every split keeps the tablets' cover and counts exact.
func TestStoreEarlySplit(t *testing.T) {
	for _, early := range []int{0, 3} {
		s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, TabletMax: 1000, EarlySplit: early, FirstTabletMax: 50, Tablets: []Tablet{All}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		idx := uint64(0)
		for i := range 400 {
			idx++
			if st := status(t, s.Apply(idx, putReq(fmt.Sprintf("k%04d", i), "v"))); st != StatusOK {
				t.Fatal(st)
			}
		}
		want := 1
		if early > 0 {
			want = early
		}
		if len(s.Tablets()) != want {
			t.Fatalf("early %d: %d tablets %v, want %d", early, len(s.Tablets()), s.Counts(), want)
		}
		sum := 0
		for _, n := range s.Counts() {
			sum += n
		}
		if sum != 400 {
			t.Fatalf("counts %v sum to %d", s.Counts(), sum)
		}
		if early == 0 {
			continue
		}
		// The last tablet leaves: the group owns 2 < 3, and splits again
		// at the next put past FirstTabletMax in a tablet.
		last := s.Tablets()[2]
		idx++
		s.Apply(idx, ctlReq(CtlFreeze, 1, last.Gen+1, last))
		idx++
		s.Apply(idx, ctlReq(CtlDrop, 1, last.Gen+1, last))
		if len(s.Tablets()) != 2 {
			t.Fatalf("after the drop: %+v", s.Tablets())
		}
		for i := range 30 {
			idx++
			s.Apply(idx, putReq(fmt.Sprintf("k0000a%02d", i), "v"))
		}
		if len(s.Tablets()) != 3 {
			t.Fatalf("no early split after the drop: %v", s.Counts())
		}
	}
}
