package btree

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestInPlaceSameBytes: random puts (new keys, and old keys with values
// of other sizes) and deletes applied to two trees, one changing leaves
// in place and one through whole images (noInPlace), leave every slot of
// the two arenas byte for byte equal after every op, for several node
// sizes: the in-place path writes exactly what encode writes, so replicas
// stay identical whichever path an apply takes, and the in-place path is
// taken (most ops).
func TestInPlaceSameBytes(t *testing.T) {
	for _, g := range geometries {
		t.Run(fmt.Sprintf("node%d", g.cfg.NodeSize), func(t *testing.T) {
			inPlace, ops, err := inPlaceSameBytes(g.cfg, g.ops/2, g.keySpace, g.maxVal, testingKnobs{})
			if err != nil {
				t.Fatal(err)
			}
			if inPlace < ops/2 {
				t.Fatalf("%d of %d ops in place", inPlace, ops)
			}
			t.Logf("%d of %d ops in place", inPlace, ops)
		})
	}
}

// TestInPlaceCatchesStaleOffsets: the planted gapStaleOffsets (an insert
// in place leaves the offsets after the new entry where they were) is
// caught as a slot whose bytes differ from the image path's.
func TestInPlaceCatchesStaleOffsets(t *testing.T) {
	g := geometries[2]
	_, _, err := inPlaceSameBytes(g.cfg, 500, g.keySpace, g.maxVal, testingKnobs{gapStaleOffsets: true})
	mustCatch(t, "gapStaleOffsets", err, `slot \d+ differs`)
}

// inPlaceSameBytes applies ops random puts and deletes to a tree that
// changes leaves in place (with knobs) and to one that writes whole
// images (noInPlace), and compares every slot after every op: the first
// difference is the error. inPlace counts the ops made in place.
func inPlaceSameBytes(cfg Config, ops, keySpace, maxVal int, knobs testingKnobs) (inPlace, n int, err error) {
	r := rand.New(rand.NewPCG(uint64(cfg.NodeSize), 11))
	a1, a2 := NewArena(cfg.NodeSize, 64, nil), NewArena(cfg.NodeSize, 64, nil)
	t1, err := New(cfg, a1, 1)
	if err != nil {
		return 0, 0, err
	}
	t2, _ := New(cfg, a2, 1)
	t1.knobs = knobs
	t2.knobs.noInPlace = true
	writes := 0
	t1.knobs.onWrite = func() { writes++ }
	for i := 0; i < ops; i++ {
		stamp := uint64(i + 2)
		k := randKey(r, keySpace, cfg.MaxKey)
		before := writes
		if r.IntN(10) < 7 {
			v := randVal(r, maxVal)
			e1, err1 := t1.Put(k, v, stamp<<16, stamp)
			e2, err2 := t2.Put(k, v, stamp<<16, stamp)
			if e1 != e2 || (err1 == nil) != (err2 == nil) {
				return inPlace, ops, fmt.Errorf("op %d: put %q: %v %v, image path %v %v", i, k, e1, err1, e2, err2)
			}
		} else if t1.Delete(k, stamp) != t2.Delete(k, stamp) {
			return inPlace, ops, fmt.Errorf("op %d: delete %q answers differ", i, k)
		}
		if writes-before == 1 && t1.memoOK {
			inPlace++ // one node written and the descent kept: in place
		}
		if a1.n != a2.n || t1.root != t2.root || t1.len != t2.len {
			return inPlace, ops, fmt.Errorf("op %d: slots %d/%d roots %v/%v len %d/%d", i, a1.n, a2.n, t1.root, t2.root, t1.len, t2.len)
		}
		for s := uint32(1); s < a1.n; s++ {
			if !bytes.Equal(a1.bytes(s), a2.bytes(s)) {
				return inPlace, ops, fmt.Errorf("op %d on %q: slot %d differs\n in place %x\n image    %x", i, k, s, a1.bytes(s), a2.bytes(s))
			}
		}
	}
	return inPlace, ops, t1.Check()
}
