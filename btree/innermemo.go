package btree

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// The writer's index of its inner nodes (the descent's searches). A
// writer descends its own tree on every write (Tree.descend, and the
// batch prefetch's descent of every key), and a search of an inner node
// in place bisects its offsets and compares whole keys that lie on as
// many lines as it probes: at 4 KiB, the level-1 searches and their
// lines were a fifth of an ordered insert's apply (BenchmarkApplyInsertTwin,
// docs/dev/btree-plan.md, branch bt1g). innerMemo is an inner node's
// keys as the search needs them: the prefix every key of the node shares
// (skipped), then each key's next 8 bytes as a big-endian word, in
// order, with the children: a bisection over a few lines of words, and a
// whole comparison only between keys whose words are equal. It is the
// writer's private memory, never read by another process, and made
// from the node's bytes; every write of a node's slot (install, seal)
// drops its memo, so a memo is always its node's current keys (planted
// memoKeepOnWrite: TestInnerMemo).
//
// The prefix is the one the node's keys from its second on share: an
// inner node's first key is often shorter than the rest (the leftmost
// node of a level has the empty key, below every key), and a prefix that
// had to cover it would be empty, every key's word then its first 8
// bytes, alike in all keys that share those (kvbench's "\x01k0000..."),
// and every search of the root would end in the node's bisection
// (branch bt3; planted memoPrefixFromFirst: TestInnerMemoWords). A
// first key without the prefix is below every key with it (the keys are
// in order), so it is kept whole (low) and its word is 0.
type innerMemo struct {
	id     NodeID
	prefix string
	// low is the first key when it lacks the prefix (lowOut).
	low    string
	lowOut bool
	heads  []uint64
	kids   []NodeID
	// slow counts the searches that ended in the node's bisection
	// (words equal), for TestInnerMemoWords.
	slow int
}

// head is the first 8 bytes of b as a big-endian word, zero-padded:
// head(a) < head(b) implies a < b (bytes.Compare), and the reverse.
func head(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b)
	}
	var w [8]byte
	copy(w[:], b)
	return binary.BigEndian.Uint64(w[:])
}

// newInnerMemo indexes inner node n. fromFirst plants a bug (knob
// memoPrefixFromFirst): the prefix is the one all keys share, the first
// included (the memo stays right, its searches slow).
func newInnerMemo(n *Node, fromFirst bool) *innerMemo {
	m := &innerMemo{id: n.ID, heads: make([]uint64, 0, n.Count+8), kids: make([]NodeID, 0, n.Count+8)}
	if n.Count > 0 {
		first, _ := n.keyAt(0)
		from := first
		if n.Count > 1 && !fromFirst {
			from, _ = n.keyAt(1)
		}
		last, _ := n.keyAt(n.Count - 1)
		p := 0
		for p < len(from) && p < len(last) && from[p] == last[p] {
			p++
		}
		m.prefix = string(from[:p])
		m.lowOut = len(first) < p || string(first[:p]) != m.prefix
		if m.lowOut {
			m.low = string(first)
		}
	}
	p := len(m.prefix)
	it := n.Entries()
	for e, ok := it.next(); ok; e, ok = it.next() {
		if len(m.heads) == 0 && m.lowOut {
			m.heads = append(m.heads, 0) // (low: below every key with the prefix)
		} else {
			m.heads = append(m.heads, head(e.Key[p:]))
		}
		m.kids = append(m.kids, e.Child)
	}
	return m
}

// add puts into the memo the key sep and its child at rank i: what
// addChildInPlace wrote into the node. False (the memo is no longer
// the node's) if sep lacks the prefix: a key past the last one need not
// have it. anyKey plants a bug (knob memoAddAnyKey): such a separator
// keeps the memo, its word taken from the wrong bytes.
func (m *innerMemo) add(i int, sep []byte, child NodeID, anyKey bool) bool {
	p := len(m.prefix)
	if i == 0 && m.lowOut {
		return false // (a new first key: low would be another)
	}
	if len(sep) < p || string(sep[:p]) != m.prefix {
		if !anyKey {
			return false
		}
		p = min(p, len(sep))
	}
	m.heads = slices.Insert(m.heads, i, head(sep[p:]))
	m.kids = slices.Insert(m.kids, i, child)
	return true
}

// childFor is Node.ChildFor over the memo of node n (its bytes, read
// only when key's word equals a key's): the child of the last key at or
// below key, 0 if key is below every key.
func (m *innerMemo) childFor(key []byte, node []byte, lowPlanted bool) NodeID {
	p := len(m.prefix)
	i := 0
	switch {
	case len(key) >= p && string(key[:p]) == m.prefix:
		h := head(key[p:])
		lo, hi := 0, len(m.heads)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if m.heads[mid] <= h {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo > 0 && m.heads[lo-1] == h {
			// Keys whose words equal key's: the node's bisection
			// (rare: a key and its neighbour alike in 8 bytes past
			// the prefix).
			m.slow++
			n, _ := decodeOwn(node, m.id)
			return n.ChildFor(key)
		}
		i = lo
	case string(key) > m.prefix:
		i = len(m.kids)
	case m.lowOut && string(key) >= m.low && !lowPlanted:
		i = 1 // (at or past the first key, below the second)
	}
	if i == 0 {
		return 0
	}
	return m.kids[i-1]
}

// childFor is the child of the writer's inner node id that holds key,
// through the node's memo (made if it has none).
func (t *Tree) childFor(id NodeID, key []byte) NodeID {
	if m := t.memos[id.Slot()]; m != nil && m.id == id && !t.knobs.noInnerMemo {
		return m.childFor(key, t.a.bytes(id.Slot()), t.knobs.memoLowIgnored)
	}
	n, err := decodeOwn(t.a.bytes(id.Slot()), id)
	if err != nil {
		panic(fmt.Sprintf("btree: writer's node %v: %v", id, err))
	}
	if n.Leaf || t.knobs.noInnerMemo {
		return n.ChildFor(key)
	}
	m := newInnerMemo(&n, t.knobs.memoPrefixFromFirst)
	if t.memos == nil {
		t.memos = make(map[uint32]*innerMemo)
	}
	t.memos[id.Slot()] = m
	return m.childFor(key, t.a.bytes(id.Slot()), t.knobs.memoLowIgnored)
}

// hasMemo reports whether inner node id has a current memo (the
// prefetch need not touch its lines).
func (t *Tree) hasMemo(id NodeID) bool {
	m := t.memos[id.Slot()]
	return m != nil && m.id == id && !t.knobs.noInnerMemo
}

// takeMemo is id's current memo, dropped from the memos (nil if none):
// a change that updates the memo puts it back (putMemo) after its write.
func (t *Tree) takeMemo(id NodeID) *innerMemo {
	if !t.hasMemo(id) {
		return nil
	}
	m := t.memos[id.Slot()]
	delete(t.memos, id.Slot())
	return m
}

// dropMemo forgets slot's memo: called at every write of the slot.
func (t *Tree) dropMemo(slot uint32) {
	if t.memos != nil && !t.knobs.memoKeepOnWrite {
		delete(t.memos, slot)
	}
}
