package btree

import (
	"errors"
	"slices"
)

// ErrChanged: a leaf the scan read was written after the applied index
// the scan started from. The caller reads the group's applied index again
// and scans again; the pairs read so far are not an answer.
var ErrChanged = errors.New("btree: a leaf changed during the scan; scan again")

// KV is one pair of a scan. Its slices are the scan's own copies.
type KV struct {
	Key, Value []byte
	Version    uint64
}

// Scan appends to dst the pairs with start <= key < end (end nil: no
// bound), in key order, at most limit of them (limit <= 0: no limit), as
// of the tree's state after entry applied: it accepts a leaf only when
// it validates, its stamp is at most applied, and its low fence is the
// previous leaf's high fence. Leaves are taken from the cached level-1
// node that holds start, in its order (in a client, read together), and
// through right links where that list ends or is stale. Any leaf stamped
// after applied fails the whole scan with ErrChanged.
//
// Why this is the state at applied: a leaf stamped <= applied was not
// written by any later apply, so it holds what it held after applied;
// contiguous leaves from the one holding start cover the range without a
// gap; so every pair returned, and every key absent, is as of applied,
// which the caller read from the group before the scan began.
func (c *Cache) Scan(read ReadFunc, root NodeID, applied uint64, start, end []byte, limit int, dst []KV) ([]KV, int, error) {
	out := dst
	reads := 0
	// src is the cached node whose pointers the next ids come from (its
	// list of leaves from start on, or the one pointer findLeaf took
	// from it); a leaf that shows the list stale drops it.
	var src *cached
	var queue []NodeID
	if from := c.cover(start); from != nil && from.level == 1 {
		src, queue = from, slices.Clone(from.kids[from.childIndex(start):])
	}
	var prev *Node
	// stuck counts the reads since the last leaf the scan accepted.
	for stuck := 0; stuck < maxSteps; stuck++ {
		var id NodeID
		listed := false
		switch {
		case len(queue) > 0:
			id, queue, listed = queue[0], queue[1:], true
		case prev != nil:
			id = prev.Next
		default:
			leaf, used, n, err := c.findLeaf(read, root, start)
			reads += n
			if err != nil {
				return dst, reads, err
			}
			id, src, listed = leaf, used, used != nil
		}
		b, err := read(id.Slot())
		reads++
		if err != nil {
			return dst, reads, err
		}
		n, err := decodeRead(b, id)
		if err == nil && n.Dead {
			err = ErrNotNode
		}
		if err == nil && (n.Level != 0 || (prev == nil && string(start) < string(n.Low))) {
			err = ErrStale
		}
		if err == nil && prev != nil && string(n.Low) != string(prev.High) && !c.knobs.skipContiguity {
			err = ErrStale // a gap or an overlap: the list was stale
		}
		if errors.Is(err, ErrStale) || errors.Is(err, ErrNotNode) {
			if listed && src != nil {
				c.drop(src) // the cached parent is out of date
				src, queue = nil, nil
				continue // on from prev's right link, or descend again
			}
			// Through a right link or a fresh descent: the tree changed
			// after the leaves read so far were written.
			return dst, reads, ErrChanged
		}
		if err != nil {
			return dst, reads, err
		}
		if n.Stamp > applied && !c.knobs.skipStamp {
			return dst, reads, ErrChanged
		}
		if prev == nil && !n.Covers(start) {
			// start lies right of this leaf: a split moved it there.
			if n.Next == 0 {
				return dst, reads, ErrMalformed
			}
			if listed && src != nil && !c.knobs.keepStaleParent {
				// The cached parent predates the split (maybe many:
				// inserts at the right end split the last leaf again
				// and again, and nothing else refreshes a cache that
				// only scans use). Drop it and descend again, reading
				// the parent afresh, rather than walk a chain of right
				// links that grows with every split, on every scan.
				c.drop(src)
				src, queue = nil, nil
				continue
			}
			queue = []NodeID{n.Next}
			src = nil
			continue
		}
		it := n.Entries()
		for e, ok := it.next(); ok; e, ok = it.next() {
			if string(e.Key) < string(start) {
				continue
			}
			if end != nil && string(e.Key) >= string(end) {
				return out, reads, nil
			}
			out = append(out, KV{Key: slices.Clone(e.Key), Value: slices.Clone(e.Value), Version: e.Version})
			if limit > 0 && len(out)-len(dst) >= limit {
				return out, reads, nil
			}
		}
		if n.HighInf || (end != nil && string(n.High) >= string(end)) {
			return out, reads, nil
		}
		prev = &n // n aliases b, the read's own copy
		stuck = 0
	}
	return dst, reads, ErrRetry
}

// findLeaf returns the id of the leaf holding key, descending from the
// cache or the root and caching the inner nodes it reads, and the cached
// node the id came from when it took it from the cache without reading
// the parent (the caller drops it if the leaf shows it stale).
func (c *Cache) findLeaf(read ReadFunc, root NodeID, key []byte) (NodeID, *cached, int, error) {
	reads := 0
	for attempt := 0; attempt < maxAttempts; attempt++ {
		from := c.cover(key)
		id, level := root, -1
		if from != nil {
			id, level = from.child(key), from.level-1
		}
		_, leaf, n, moved, err := c.down(read, id, level, key, false, false)
		reads += n
		switch {
		case err == nil && n == 0:
			return leaf, from, reads, nil // the cached level-1 node named it
		case err == nil:
			if moved && from != nil && !c.knobs.keepStaleParent {
				// Its pointer led to a node a split had cut (the leaf
				// found by moving right stands): drop it, as Lookup
				// does, or every later descent walks the same links.
				c.drop(from)
			}
			return leaf, nil, reads, nil
		case retryable(err):
			if from != nil {
				c.drop(from)
			}
		default:
			return 0, nil, reads, err
		}
	}
	return 0, nil, reads, ErrRetry
}

// ReverseScan appends to dst the pairs with start <= key < end (end nil:
// no bound) in descending key order, at most limit of them (limit <= 0:
// no limit), as of the state after entry applied, under Scan's rules:
// each leaf validates, is stamped at most applied, and its high fence is
// the low fence of the leaf read before it (to its right). It starts at
// the leaf holding end (the rightmost leaf when end is nil) and walks
// left through prev links, which a split or merge rewrites in the same
// apply as the rest of the change.
func (c *Cache) ReverseScan(read ReadFunc, root NodeID, applied uint64, start, end []byte, limit int, dst []KV) ([]KV, int, error) {
	out := dst
	reads := 0
	var id NodeID
	var src *cached
	first := func() error {
		var n int
		var err error
		if end == nil {
			id, n, err = c.lastLeaf(read, root)
			src = nil
		} else {
			id, src, n, err = c.findLeaf(read, root, end)
		}
		reads += n
		return err
	}
	if err := first(); err != nil {
		return dst, reads, err
	}
	var right *Node // the leaf read before this one, to its right
	var ents []Entry
	for stuck := 0; stuck < maxSteps; stuck++ {
		b, err := read(id.Slot())
		reads++
		if err != nil {
			return dst, reads, err
		}
		n, err := decodeRead(b, id)
		if err == nil && (n.Dead || n.Level != 0) {
			err = ErrNotNode
		}
		if err == nil && right == nil {
			if end != nil && string(end) < string(n.Low) {
				err = ErrStale
			} else if !n.HighInf && (end == nil || string(end) >= string(n.High)) {
				if src != nil && !c.knobs.keepStaleParent {
					// The cached parent predates the split: drop it
					// and descend again rather than walk right links
					// (see Scan).
					c.drop(src)
					if err := first(); err != nil {
						return dst, reads, err
					}
					continue
				}
				id = n.Next // end lies right of this leaf: a split moved it
				continue
			}
		}
		if err == nil && right != nil && (n.HighInf || string(n.High) != string(right.Low)) {
			err = ErrChanged // a prev link older than applied's state
		}
		if errors.Is(err, ErrStale) || errors.Is(err, ErrNotNode) {
			if right == nil && src != nil {
				c.drop(src)
				if err := first(); err != nil {
					return dst, reads, err
				}
				continue
			}
			return dst, reads, ErrChanged
		}
		if err != nil {
			return dst, reads, err
		}
		if n.Stamp > applied && !c.knobs.skipStamp {
			return dst, reads, ErrChanged
		}
		ents = ents[:0]
		it := n.Entries()
		for e, ok := it.next(); ok; e, ok = it.next() {
			ents = append(ents, e)
		}
		for i := len(ents) - 1; i >= 0; i-- {
			k := ents[i].Key
			if end != nil && string(k) >= string(end) {
				continue
			}
			if string(k) < string(start) {
				return out, reads, nil
			}
			out = append(out, KV{Key: slices.Clone(k), Value: slices.Clone(ents[i].Value), Version: ents[i].Version})
			if limit > 0 && len(out)-len(dst) >= limit {
				return out, reads, nil
			}
		}
		if string(n.Low) <= string(start) || n.Prev == 0 {
			return out, reads, nil
		}
		right, id, stuck = &n, n.Prev, 0
	}
	return dst, reads, ErrRetry
}

// lastLeaf returns the rightmost leaf, descending from the root through
// last children (and right links, if a split moved the right end).
func (c *Cache) lastLeaf(read ReadFunc, root NodeID) (NodeID, int, error) {
	_, id, reads, _, err := c.down(read, root, -1, nil, true, false)
	if errors.Is(err, ErrNotNode) || errors.Is(err, ErrStale) {
		err = ErrChanged // the root was freed or replaced under the scan
	}
	return id, reads, err
}
