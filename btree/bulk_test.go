package btree

import (
	"fmt"
	"testing"
)

// TestLoad: a bulk load over node sizes, fills and entry counts builds a
// tree that checks, holds exactly the entries (values and versions), fills
// its leaves near the fill asked for, and takes the slots bulkSlots said;
// Put and Delete work on it afterwards.
func TestLoad(t *testing.T) {
	singleNoRace(t)
	for _, ns := range []int{256, 1024, 4096} {
		for _, fill := range []float64{0.5, 0.7, 1} {
			for _, n := range []int{0, 1, 7, 300, 3000} {
				t.Run(fmt.Sprintf("node%d/fill%v/n%d", ns, fill, n), func(t *testing.T) {
					cfg := Config{NodeSize: ns, MaxKey: 16}
					var ents []KVV
					for i := range n {
						ents = append(ents, KVV{Key: fmt.Appendf(nil, "key%06d", i), Value: fmt.Appendf(nil, "v%d", i*i), Version: uint64(i + 1)})
					}
					a := NewArena(ns, 8, nil)
					tr, err := Load(cfg, a, ents, fill, 42)
					if err != nil {
						t.Fatal(err)
					}
					if err := tr.Check(); err != nil {
						t.Fatal(err)
					}
					if a.Slots() != cfg.withDefaults().bulkSlots(ents, fill) {
						t.Fatalf("%d slots, bulkSlots says %d", a.Slots(), cfg.bulkSlots(ents, fill))
					}
					i := 0
					tr.ascend(nil, func(e Entry) bool {
						if string(e.Key) != string(ents[i].Key) || string(e.Value) != string(ents[i].Value) || e.Version != ents[i].Version {
							t.Fatalf("entry %d: %q=%q@%d, want %q", i, e.Key, e.Value, e.Version, ents[i].Key)
						}
						i++
						return true
					})
					if i != n || tr.Len() != n {
						t.Fatalf("%d entries, Len %d, want %d", i, tr.Len(), n)
					}
					if st := tr.Stats(); st.Leaves >= 8 && (st.LeafFill > fill+0.01 || st.LeafFill < fill-0.25) {
						t.Fatalf("leaf fill %.2f for a load at %.2f", st.LeafFill, fill)
					}
					for i := range n / 2 {
						tr.Delete(ents[2*i].Key, 50)
					}
					if _, err := tr.Put([]byte("zz"), []byte("new"), 51, 51); err != nil {
						t.Fatal(err)
					}
					if err := tr.Check(); err != nil {
						t.Fatalf("after changes: %v", err)
					}
				})
			}
		}
	}
}

// Load refuses entries out of order or too large.
func TestLoadRefuses(t *testing.T) {
	cfg := Config{NodeSize: 256, MaxKey: 8}
	for _, ents := range [][]KVV{
		{{Key: []byte("b"), Version: 1}, {Key: []byte("a"), Version: 1}},
		{{Key: []byte("a"), Version: 1}, {Key: []byte("a"), Version: 1}},
		{{Key: []byte("123456789"), Version: 1}},
		{{Key: []byte("a"), Value: make([]byte, 500), Version: 1}},
	} {
		if _, err := Load(cfg, NewArena(256, 8, nil), ents, 0.7, 1); err == nil {
			t.Fatalf("loaded %+v", ents)
		}
	}
}
