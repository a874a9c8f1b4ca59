package btree

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	tbtree "github.com/tidwall/btree"
)

// sampleNodes builds a small tree and returns the images of its nodes
// (leaves and inner nodes, full and empty).
func sampleNodes(t testing.TB) [][]byte {
	cfg := Config{NodeSize: 512, MaxKey: 32}
	a := NewArena(cfg.NodeSize, 16, nil)
	tr, err := New(cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	out := [][]byte{slices.Clone(a.Bytes(tr.Root().Slot()))}
	for i := 0; i < 200; i++ {
		if _, err := tr.Put([]byte(fmt.Sprintf("key-%03d", i*7%200)), []byte(fmt.Sprintf("v%d", i)), uint64(i+2), uint64(i+2)); err != nil {
			t.Fatal(err)
		}
	}
	for s := uint32(1); s <= uint32(a.Slots()); s++ {
		out = append(out, slices.Clone(a.Bytes(s)))
	}
	return out
}

// FuzzDecode: Decode and the readers' decodeRead never panic; whatever
// Decode accepts is self-consistent (entries in order, inside the fences,
// as many as its count).
func FuzzDecode(f *testing.F) {
	for _, b := range sampleNodes(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// The readers' decode: whatever it accepts, walking, finding and
		// descending through it never panics and stops within Count.
		if n, err := decodeRead(b, 0); err == nil {
			it := n.Entries()
			seen := 0
			for _, ok := it.Next(); ok; _, ok = it.Next() {
				seen++
			}
			if seen > n.Count {
				t.Fatalf("walked %d entries of %d", seen, n.Count)
			}
			n.Find([]byte("key-100"))
			if !n.Leaf {
				n.ChildFor([]byte("key-100"))
			}
		}
		n, err := Decode(b, 0)
		if err != nil {
			return
		}
		it := n.Entries()
		var prev []byte
		for i := 0; i < n.Count; i++ {
			e, ok := it.Next()
			if !ok {
				t.Fatalf("accepted node ends after %d of %d entries", i, n.Count)
			}
			if i > 0 && string(e.Key) <= string(prev) {
				t.Fatalf("accepted node with unsorted keys %q, %q", prev, e.Key)
			}
			if !n.Covers(e.Key) {
				t.Fatalf("accepted node with key %q outside its fences", e.Key)
			}
			prev = e.Key
		}
		if _, ok := it.Next(); ok {
			t.Fatal("accepted node has more entries than its count")
		}
	})
}

// TestDecodeRejectsFlips: flipping any bit of any byte a node's check word
// covers, or of the check word, makes Decode refuse the image; and a node
// read through a pointer of another incarnation is refused.
func TestDecodeRejectsFlips(t *testing.T) {
	for _, b := range sampleNodes(t) {
		n, err := Decode(b, 0)
		if err != nil {
			t.Fatal(err)
		}
		used := int(binary.LittleEndian.Uint16(b[offUsed:]))
		for i := 0; i < used; i++ {
			for bit := 0; bit < 8; bit++ {
				c := slices.Clone(b)
				c[i] ^= 1 << bit
				if _, err := Decode(c, n.ID); err == nil {
					t.Fatalf("node %v: flip of bit %d of byte %d accepted", n.ID, bit, i)
				}
			}
		}
		if _, err := Decode(b, makeID(n.ID.Slot(), n.ID.Inc()+1)); err != ErrNotNode {
			t.Fatalf("node %v read as another incarnation: %v", n.ID, err)
		}
	}
}

// FuzzTreeOps: a sequence of puts and deletes decoded from the input,
// applied to a tree of small nodes and to tidwall/btree, leaves the two
// equal and the tree's structure valid.
func FuzzTreeOps(f *testing.F) {
	f.Add([]byte("\x01a\x02bb\x01c\x00a\x01dd\x01ee\x01ff\x01gg\x01hh"))
	f.Add(slices.Repeat([]byte("\x01kk\x01k\x01kkk\x00k"), 40))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg := Config{NodeSize: 256, MaxKey: 16}
		a := NewArena(cfg.NodeSize, 16, nil)
		tr, err := New(cfg, a, 1)
		if err != nil {
			t.Fatal(err)
		}
		var model tbtree.Map[string, string]
		for i := 0; len(b) >= 2; i++ {
			op, kl := b[0], int(b[1])%cfg.MaxKey+1
			b = b[2:]
			if len(b) < kl {
				break
			}
			k := b[:kl]
			b = b[kl:]
			if op%3 == 0 {
				got := tr.Delete(k, uint64(i+2))
				if _, had := model.Delete(string(k)); got != had {
					t.Fatalf("delete %q: %v, model %v", k, got, had)
				}
				continue
			}
			v := []byte(fmt.Sprintf("%d", i))
			if _, err := tr.Put(k, v, uint64(i+2), uint64(i+2)); err != nil {
				t.Fatal(err)
			}
			model.Set(string(k), string(v))
		}
		if err := tr.Check(); err != nil {
			t.Fatal(err)
		}
		var got, want []string
		tr.Ascend(nil, func(k, v []byte) bool { got = append(got, string(k)+"="+string(v)); return true })
		model.Scan(func(k, v string) bool { want = append(want, k+"="+v); return true })
		if !slices.Equal(got, want) {
			t.Fatalf("tree %v, model %v", got, want)
		}
	})
}

// linearFind and linearChild are the node searches by a walk over the
// entries in order (the searches before the offsets): the reference the
// binary searches are held to.
func linearFind(n *Node, key []byte) (Entry, bool) {
	it := n.Entries()
	for e, ok := it.next(); ok; e, ok = it.next() {
		switch c := cmp(e.Key, key); {
		case c == 0:
			return e, true
		case c > 0:
			return Entry{}, false
		}
	}
	return Entry{}, false
}

func linearChild(n *Node, key []byte) NodeID {
	it := n.Entries()
	var child NodeID
	for e, ok := it.next(); ok; e, ok = it.next() {
		if string(e.Key) > string(key) {
			break
		}
		child = e.Child
	}
	return child
}

// FuzzSearch: a leaf and an inner node built from the input's keys
// (sorted, deduplicated), searched for every key, a key between each two
// and keys past both ends: Find and ChildFor (binary searches over the
// entries' offsets) answer exactly as the linear walks, and so does the
// cache's copy of the inner node (childIndex).
func FuzzSearch(f *testing.F) {
	f.Add([]byte("\x03abc\x01b\x02bb\x04zzzz\x01a"))
	f.Add(slices.Repeat([]byte("\x02k1\x03k22\x01k"), 10))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		const size = 4096
		var keys [][]byte
		for len(b) > 0 {
			kl := int(b[0])%12 + 1
			b = b[1:]
			if len(b) < kl {
				break
			}
			keys = append(keys, b[:kl])
			b = b[kl:]
		}
		slices.SortFunc(keys, cmp)
		keys = slices.CompactFunc(keys, func(a, b []byte) bool { return cmp(a, b) == 0 })
		leaf := &image{id: makeID(1, 0), highInf: true}
		inner := &image{id: makeID(2, 0), level: 1, highInf: true}
		for i, k := range keys {
			m := &image{level: 0, highInf: true, keys: append(slices.Clone(leaf.keys), k),
				vals: append(slices.Clone(leaf.vals), []byte{byte(i)}), vers: append(slices.Clone(leaf.vers), uint64(i+1))}
			if m.size() > size {
				break
			}
			leaf.keys, leaf.vals, leaf.vers = m.keys, m.vals, m.vers
		}
		// An inner node's first key is its low fence.
		if len(leaf.keys) > 0 {
			inner.low = leaf.keys[0]
			leaf.low = leaf.keys[0]
			for i, k := range leaf.keys {
				inner.keys = append(inner.keys, k)
				inner.kids = append(inner.kids, makeID(uint32(i+10), 1))
			}
		}
		probes := [][]byte{nil, {0}, {0xff, 0xff, 0xff}}
		for _, k := range leaf.keys {
			probes = append(probes, k, append(slices.Clone(k), 0), k[:len(k)-1])
		}
		for _, m := range []*image{leaf, inner} {
			if m.leaf() == false && len(m.keys) == 0 {
				continue
			}
			buf := make([]byte, size)
			m.encode(buf)
			n, err := Decode(buf, m.id)
			if err != nil {
				t.Fatalf("%d keys: %v", len(m.keys), err)
			}
			var c *cached
			if !n.Leaf {
				Cache := NewCache(1 << 20)
				Cache.add(&n)
				c = Cache.cover(n.Low)
			}
			for _, p := range probes {
				if n.Leaf {
					e, ok := n.Find(p)
					we, wok := linearFind(&n, p)
					if ok != wok || ok && (!slices.Equal(e.Key, we.Key) || !slices.Equal(e.Value, we.Value) || e.Version != we.Version) {
						t.Fatalf("Find(%q) = %q %v, linear %q %v", p, e.Key, ok, we.Key, wok)
					}
					continue
				}
				if !n.Covers(p) {
					continue
				}
				if got, want := n.ChildFor(p), linearChild(&n, p); got != want {
					t.Fatalf("ChildFor(%q) = %v, linear %v", p, got, want)
				}
				if got, want := c.child(p), linearChild(&n, p); got != want {
					t.Fatalf("cached child(%q) = %v, linear %v", p, got, want)
				}
			}
		}
	})
}
