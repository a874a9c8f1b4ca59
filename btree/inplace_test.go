package btree

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestInPlaceSameBytes: random puts (new keys, and old keys with values
// of other sizes) and deletes applied to two trees, one changing leaves
// in place and one through whole images (noInPlace), leave every slot of
// the two arenas the same node after every op (sameNode: the same
// header, used size and entries in key order; layout 2 lets the in-place
// path lay entries in the order they were written, the image path in key
// order), each valid (Decode), for several node sizes; and the in-place
// path is taken (most ops).
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
			verified := map[uint32][2]uint64{}
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
					// Decode only slots whose check words changed since
					// they were last found the same.
					w := [2]uint64{checkWord(a1.bytes(s)), checkWord(a2.bytes(s))}
					if verified[s] == w {
						continue
					}
					verified[s] = w
					if err := sameNode(a1.bytes(s), a2.bytes(s)); err != nil {
						t.Fatalf("op %d on %q: slot %d: %v\n in place %x\n image    %x", i, k, s, err, a1.bytes(s), a2.bytes(s))
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

// sameNode is nil when the node images a and b (a slot's bytes) hold the
// same node: both empty slots, or both valid (Decode) with the same header
// words, fences, used size and entries in key order. Their entries may lie
// in other orders (layout 2).
func sameNode(a, b []byte) error {
	if bytes.Equal(a, b) {
		return nil
	}
	na, ea := Decode(a, 0)
	nb, eb := Decode(b, 0)
	if ea != nil || eb != nil {
		return fmt.Errorf("decode: %v, %v", ea, eb)
	}
	if UsedSize(a) != UsedSize(b) {
		return fmt.Errorf("used %d, %d", UsedSize(a), UsedSize(b))
	}
	if na.ID != nb.ID || na.Stamp != nb.Stamp || na.Next != nb.Next || na.Prev != nb.Prev ||
		na.Level != nb.Level || na.Leaf != nb.Leaf || na.HighInf != nb.HighInf || na.Dead != nb.Dead ||
		na.Count != nb.Count || !bytes.Equal(na.Low, nb.Low) || !bytes.Equal(na.High, nb.High) {
		return fmt.Errorf("headers %+v, %+v", na, nb)
	}
	ia, ib := na.Entries(), nb.Entries()
	for j := range na.Count {
		x, _ := ia.Next()
		y, _ := ib.Next()
		if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || x.Version != y.Version || x.Child != y.Child {
			return fmt.Errorf("entry %d: %+v, %+v", j, x, y)
		}
	}
	if !bytes.Equal(a[UsedSize(a):], b[UsedSize(b):]) {
		return fmt.Errorf("bytes past used differ")
	}
	return nil
}

// checkWord is the check word of a slot's node (0 for an empty slot).
func checkWord(b []byte) uint64 {
	u := UsedSize(b)
	if u < checkSize || u > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[u-checkSize:])
}
