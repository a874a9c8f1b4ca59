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
	singleNoRace(t)
	for _, g := range geometries {
		t.Run(fmt.Sprintf("node%d", g.cfg.NodeSize), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(g.cfg.NodeSize), 11))
			a1, a2 := NewArena(g.cfg.NodeSize, 64, nil), NewArena(g.cfg.NodeSize, 64, nil)
			t1, err := New(g.cfg, a1, 1)
			if err != nil {
				t.Fatal(err)
			}
			t2, _ := New(g.cfg, a2, 1)
			t2.knobs.noInPlace = true
			writes := 0
			t1.knobs.onWrite = func() { writes++ }
			inPlace := 0
			ops := g.ops / 2
			for i := 0; i < ops; i++ {
				stamp := uint64(i + 2)
				k := randKey(r, g.keySpace, g.cfg.MaxKey)
				before := writes
				var n1 int
				if r.IntN(10) < 7 {
					v := randVal(r, g.maxVal)
					e1, err1 := t1.Put(k, v, stamp<<16, stamp)
					e2, err2 := t2.Put(k, v, stamp<<16, stamp)
					if e1 != e2 || (err1 == nil) != (err2 == nil) {
						t.Fatalf("op %d: put %q: %v %v, image path %v %v", i, k, e1, err1, e2, err2)
					}
				} else if t1.Delete(k, stamp) != t2.Delete(k, stamp) {
					t.Fatalf("op %d: delete %q answers differ", i, k)
				}
				n1 = writes - before
				if n1 == 1 && t1.memoOK {
					inPlace++ // one node written and the descent kept: in place
				}
				if a1.n != a2.n || t1.root != t2.root || t1.len != t2.len {
					t.Fatalf("op %d: slots %d/%d roots %v/%v len %d/%d", i, a1.n, a2.n, t1.root, t2.root, t1.len, t2.len)
				}
				for s := uint32(1); s < a1.n; s++ {
					if !bytes.Equal(a1.bytes(s), a2.bytes(s)) {
						t.Fatalf("op %d on %q: slot %d differs\n in place %x\n image    %x", i, k, s, a1.bytes(s), a2.bytes(s))
					}
				}
			}
			if err := t1.Check(); err != nil {
				t.Fatal(err)
			}
			if inPlace < ops/2 {
				t.Fatalf("%d of %d ops in place", inPlace, ops)
			}
			t.Logf("%d of %d ops in place", inPlace, ops)
		})
	}
}
