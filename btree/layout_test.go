package btree

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmakv/rdmakv/internal/planted"
)

// offsetsProperty is "" when the key-order walk of an accepted node n
// (through its offsets) visits exactly the entries that lie in it, each
// once: every offset is the start of an entry of the walk as the entries
// lie (layout 2's entries are in the order they were written, the offsets
// in key order). Otherwise it says which offset is not.
func offsetsProperty(n Node) string {
	var starts []int
	pit := physIter{leaf: n.Leaf, left: n.Count, rest: n.ents}
	for range n.Count {
		starts = append(starts, len(n.ents)-len(pit.rest))
		if !pit.next() {
			return fmt.Sprintf("entry %d does not fit", len(starts)-1)
		}
	}
	seen := map[int]bool{}
	for i := range n.Count {
		o := int(leU16(n.offs[offSize*i:]))
		if _, at := slices.BinarySearch(starts, o); !at {
			return fmt.Sprintf("offset %d (%d) is not an entry's start", i, o)
		}
		if seen[o] {
			return fmt.Sprintf("offset %d (%d) names an entry twice", i, o)
		}
		seen[o] = true
	}
	return ""
}

// craftedLeaf is a sealed leaf of three entries, keys "a" (whose value is
// the bytes of an entry of key "b"), "c" and "d", whose offsets name "a",
// the entry of "b" inside a's value, and "c": keys in order, inside the
// fences, every offset inside the entries, but not the node's entries
// ("b" is not one, "d" is missed). And the valid leaf it was made from.
func craftedLeaf() (crafted, valid []byte) {
	le := binary.LittleEndian
	inner := make([]byte, leafEnt+1)
	le.PutUint16(inner, 1)
	le.PutUint64(inner[6:], 7)
	inner[leafEnt] = 'b'
	m := &image{id: makeID(1, 1), stamp: 2, highInf: true,
		keys: [][]byte{[]byte("a"), []byte("c"), []byte("d")},
		vals: [][]byte{inner, []byte("x"), []byte("y")},
		vers: []uint64{3, 4, 5}}
	valid = make([]byte, 256)
	m.encode(valid)
	crafted = slices.Clone(valid)
	used := UsedSize(crafted)
	offs := used - checkSize - offSize*3
	le.PutUint16(crafted[offs:], 0)
	le.PutUint16(crafted[offs+2:], uint16(leafEnt+1))            // inside a's value
	le.PutUint16(crafted[offs+4:], uint16(leafEnt+1+len(inner))) // "c"
	le.PutUint64(crafted[used-checkSize:], nodeCheck(crafted[:used-checkSize]))
	return crafted, valid
}

// TestDecodeOffsetsEntries: Decode accepts a valid leaf and refuses a
// sealed leaf whose offsets, in key order and in bounds, name an entry
// that is not one of the node's (inside another's value) and miss one
// that is. The planted plantedDecodeAnyOffsets (Decode does not check
// that each offset starts an entry) accepts it, and offsetsProperty
// catches that as "not an entry's start".
func TestDecodeOffsetsEntries(t *testing.T) {
	planted.Run(t, func(t *testing.T, knob string) string {
		plantedDecodeAnyOffsets = knob == "plantedDecodeAnyOffsets"
		defer func() { plantedDecodeAnyOffsets = false }()
		crafted, valid := craftedLeaf()
		if _, err := Decode(valid, 0); err != nil {
			return fmt.Sprintf("valid leaf refused: %v", err)
		}
		n, err := Decode(crafted, 0)
		if err != nil {
			return ""
		}
		if p := offsetsProperty(n); p != "" {
			return p
		}
		return "crafted leaf accepted"
	}, []planted.Case{
		{Name: "none", Want: ""},
		{Name: "plantedDecodeAnyOffsets", Want: "not an entry's start"},
	})
}

// TestInsertWritesTail: an insert that fits its leaf (random keys into
// 4 KiB nodes, 100-byte values) changes only the leaf's header words and
// the bytes of its new entry, the offsets and the check word: no byte
// of the entries already there moves, whatever the new key's rank. The
// changed bytes past the header are at most the entry, its 2-byte
// offset, the other offsets, 7 of padding and the check word.
func TestInsertWritesTail(t *testing.T) {
	cfg := Config{NodeSize: 4096}
	a := NewArena(cfg.NodeSize, 64, nil)
	tr, err := New(cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 3))
	val := make([]byte, 100)
	checked, maxChanged := 0, 0
	for i := range 3000 {
		key := fmt.Appendf(nil, "k%08d", r.IntN(1e8))
		path := tr.descend(key)
		leaf := path[len(path)-1]
		before := slices.Clone(a.bytes(leaf.Slot()))
		nb, _ := decodeOwn(before, leaf)
		slots := a.Slots()
		existed, err := tr.Put(key, val, uint64(i+2)<<16, uint64(i+2))
		if err != nil {
			t.Fatal(err)
		}
		if existed || a.Slots() != slots {
			continue // a replace, or a split
		}
		after := a.bytes(leaf.Slot())
		changed := 0
		for j := hdrSize; j < len(after); j++ {
			if after[j] != before[j] {
				changed++
			}
		}
		// Bytes of the old entries that changed: any is a move.
		na, err := Decode(after, leaf)
		if err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		entStart := hdrSize + 2 + len(na.Low) + 2 + len(na.High)
		oldEnd := entStart + len(nb.ents) - (len(nb.ents) - dataLen(nb))
		for j := entStart; j < oldEnd; j++ {
			if after[j] != before[j] {
				t.Fatalf("insert %d of %q: byte %d of the old entries changed (%d bytes changed past the header)", i, key, j, changed)
			}
		}
		limit := leafEnt + len(key) + len(val) + offSize*(nb.Count+1) + 7 + checkSize
		if changed > limit {
			t.Fatalf("insert %d of %q: %d bytes changed past the header, at most %d expected", i, key, changed, limit)
		}
		checked++
		maxChanged = max(maxChanged, changed)
	}
	if checked < 1000 {
		t.Fatalf("only %d in-place inserts checked", checked)
	}
	t.Logf("%d in-place inserts, at most %d bytes past the header changed", checked, maxChanged)
}

// dataLen is the bytes n's entries take (without the padding after them).
func dataLen(n Node) int {
	pit := physIter{leaf: n.Leaf, left: n.Count, rest: n.ents}
	for pit.next() {
	}
	return len(n.ents) - len(pit.rest)
}
