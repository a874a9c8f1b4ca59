package btree

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// checkPopulate hands out slots of an arena of 4 KiB slots in chunks of
// 40 (not a multiple of the 16-slot window, so windows are clipped) and
// reports the first broken rule of populateFrom's windows: each slot is
// in a window populated before it was handed out, and no window crosses
// the end of its chunk.
func checkPopulate(k testingKnobs) error {
	const per, slots = 40, 150
	a := NewArena(4096, per, nil)
	a.knobs = k
	type win struct{ from, to uint32 }
	var wins []win
	a.knobs.onPopulate = func(from, to uint32) { wins = append(wins, win{from, to}) }
	for range slots {
		s := a.alloc().Slot()
		in := false
		for _, w := range wins {
			in = in || (w.from <= s && s < w.to)
		}
		if !in {
			return fmt.Errorf("slot %d handed out before its page was populated (windows %v)", s, wins)
		}
	}
	for _, w := range wins {
		if w.from/per != (w.to-1)/per {
			return fmt.Errorf("window [%d, %d) crosses the end of chunk %d", w.from, w.to, w.from/per)
		}
	}
	// One madvise a window, not one a slot: 150 slots in chunks of 40
	// are 4 chunks of 3 windows each at most.
	if len(wins) > 12 {
		return fmt.Errorf("%d windows for %d slots", len(wins), slots)
	}
	return nil
}

func TestArenaPopulate(t *testing.T) {
	for _, c := range []struct {
		name string
		k    testingKnobs
		want string // "" passes
	}{
		{"correct", testingKnobs{}, ""},
		{"populateBehind", testingKnobs{populateBehind: true}, "handed out before its page was populated"},
		{"populatePastChunk", testingKnobs{populatePastChunk: true}, "crosses the end of chunk"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkPopulate(c.k)
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("planted %s: got %v, want an error with %q", c.name, err, c.want)
			}
		})
	}
}

// TestPopulateKeepsBytes: populate changes no byte, inside the range or
// next to it (it madvises only the whole pages inside b).
func TestPopulateKeepsBytes(t *testing.T) {
	b := make([]byte, 5*os.Getpagesize())
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	if err := populate(b[100 : len(b)-100]); err != nil {
		t.Skipf("MADV_POPULATE_WRITE not supported here: %v", err)
	}
	for i := range b {
		if b[i] != byte(i*7+1) {
			t.Fatalf("byte %d changed to %d", i, b[i])
		}
	}
	// An arena of real chunks: what alloc populates reads as zeros.
	a := NewArena(4096, 40, nil)
	for range 100 {
		id := a.alloc()
		for _, x := range a.bytes(id.Slot()) {
			if x != 0 {
				t.Fatalf("new slot %d is not zero", id.Slot())
			}
		}
	}
	if a.noPopulate {
		t.Fatal("populating was turned off on an arena of Go memory")
	}
}
