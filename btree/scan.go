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
	var w ScanWalk
	c.BeginScan(&w, root, applied, start, end, limit, false, dst)
	err := w.Run(read)
	if err != nil {
		return dst, w.Reads, err
	}
	return w.Pairs, w.Reads, nil
}

// ScanWalk is a scan (Cache.Scan or ReverseScan) that its caller may
// resume: Run returns the error of a read that failed with the walk's
// state kept, and the next Run starts with that same read. A one-sided
// reader that posts the read the walk asks for and runs the walk again
// once it lands thus takes each node once per scan, instead of walking
// again over every node read so far after each round trip (quadratic in
// the scan's leaves). The descent to the first leaf, which needs a few
// inner nodes, starts again from the cache (which took the inner nodes
// read so far) when a read stops it.
type ScanWalk struct {
	c          *Cache
	root       NodeID
	applied    uint64
	start, end []byte
	limit      int
	reverse    bool
	dst        int // len of the caller's dst: the pairs before the scan's
	// Pairs are the caller's dst and the pairs found so far (all of them
	// once Run returns nil).
	Pairs []KV
	// Reads counts the node reads the walk made (each Run's).
	Reads int
	// Leaves counts the leaves whose pairs the walk took, Entries the
	// entries those leaves hold (all of them, taken or not): a caller
	// that reads leaves ahead sizes its reads with Entries/Leaves.
	Leaves, Entries int

	done bool
	err  error
	// readStopped: the last error came from a read, the state kept.
	readStopped bool
	// alias: pairs alias the bytes read (AliasReads).
	alias bool

	// Forward: the cached node the next ids come from (see Scan), the
	// ids it lists still to read, the last leaf taken.
	src   *cached
	queue []NodeID
	prev  *Node
	stuck int
	// prevNode holds the last leaf taken (prev, or right in reverse).
	prevNode Node
	// The read under way: its id and whether the list named it.
	pend       NodeID
	pendListed bool
	havePend   bool
	// Reverse: whether the first leaf is still to be found, the leaf
	// read before this one (to its right), and scratch.
	needFirst bool
	right     *Node
	ents      []Entry
}

// BeginScan starts w: a scan (reverse: ReverseScan) of Scan's arguments.
func (c *Cache) BeginScan(w *ScanWalk, root NodeID, applied uint64, start, end []byte, limit int, reverse bool, dst []KV) {
	*w = ScanWalk{c: c, root: root, applied: applied, start: start, end: end, limit: limit, reverse: reverse,
		dst: len(dst), Pairs: dst, queue: w.queue[:0], ents: w.ents[:0], needFirst: true}
	if reverse {
		return
	}
	if from := c.cover(start); from != nil && from.level == 1 {
		w.src, w.queue = from, append(w.queue, from.kids[from.childIndex(start):]...)
	}
}

// AliasReads makes the pairs' keys and values alias the bytes the walk's
// ReadFunc returned instead of copying them: for a caller whose reads each
// land in a buffer of their own that nothing writes again while it uses
// the pairs (a one-sided reader's; an arena's bytes are not). Call it after
// BeginScan.
func (w *ScanWalk) AliasReads() { w.alias = true }

// pair appends the pair of e to the scan's.
func (w *ScanWalk) pair(e *Entry) {
	if w.alias {
		w.Pairs = append(w.Pairs, KV{Key: e.Key[:len(e.Key):len(e.Key)], Value: e.Value[:len(e.Value):len(e.Value)], Version: e.Version})
		return
	}
	w.Pairs = append(w.Pairs, KV{Key: slices.Clone(e.Key), Value: slices.Clone(e.Value), Version: e.Version})
}

// ResumeKey is, for a forward scan past its first leaf, the low fence of
// the leaf it goes on with (the last leaf's high fence); nil otherwise. A
// caller that reads leaves ahead looks up the cached level-1 node listing
// that leaf with it (Listed), past the level-1 node the scan started in.
func (w *ScanWalk) ResumeKey() []byte {
	if w.reverse || w.prev == nil || w.prev.HighInf {
		return nil
	}
	return w.prev.High
}

// Run advances the walk: nil when the scan is done (Pairs), a read's
// error with the walk stopped at that read (Run again to retry it), or
// why the scan failed (ErrChanged, ErrRetry, ErrMalformed, ErrTorn: the
// walk is over).
func (w *ScanWalk) Run(read ReadFunc) error {
	if w.done {
		return w.err
	}
	var err error
	if w.reverse {
		err = w.runReverse(read)
	} else {
		err = w.runForward(read)
	}
	if err == nil || !w.readStopped {
		w.done, w.err = true, err
	}
	w.readStopped = false
	return err
}

// readFailed records that read failed with the walk's state kept.
func (w *ScanWalk) readFailed(err error) error {
	w.readStopped = true
	return err
}

func (w *ScanWalk) runForward(read ReadFunc) error {
	c, start, end := w.c, w.start, w.end
	for ; w.stuck < maxSteps; w.stuck++ {
		if !w.havePend {
			var id NodeID
			listed := false
			switch {
			case len(w.queue) > 0:
				id, w.queue, listed = w.queue[0], w.queue[1:], true
			case w.prev != nil:
				id = w.prev.Next
			default:
				leaf, used, n, err := c.findLeaf(read, w.root, start)
				w.Reads += n
				if err != nil {
					if retryable(err) || errors.Is(err, ErrMalformed) {
						return err
					}
					return w.readFailed(err) // a read's: findLeaf runs again
				}
				id, w.src, listed = leaf, used, used != nil
			}
			w.pend, w.pendListed, w.havePend = id, listed, true
		}
		id, listed := w.pend, w.pendListed
		b, err := read(id.Slot())
		w.Reads++
		if err != nil {
			return w.readFailed(err)
		}
		w.havePend = false
		n, err := decodeRead(b, id)
		if err == nil && n.Dead {
			err = ErrNotNode
		}
		if err == nil && (n.Level != 0 || (w.prev == nil && string(start) < string(n.Low))) {
			err = ErrStale
		}
		if err == nil && w.prev != nil && string(n.Low) != string(w.prev.High) && !c.knobs.skipContiguity {
			err = ErrStale // a gap or an overlap: the list was stale
		}
		if errors.Is(err, ErrStale) || errors.Is(err, ErrNotNode) {
			if listed && w.src != nil {
				c.drop(w.src) // the cached parent is out of date
				w.src, w.queue = nil, nil
				continue // on from prev's right link, or descend again
			}
			// Through a right link or a fresh descent: the tree changed
			// after the leaves read so far were written.
			return ErrChanged
		}
		if err != nil {
			return err
		}
		if n.Stamp > w.applied && !c.knobs.skipStamp {
			return ErrChanged
		}
		if w.prev == nil && !n.Covers(start) {
			// start lies right of this leaf: a split moved it there.
			if n.Next == 0 {
				return ErrMalformed
			}
			if listed && w.src != nil && !c.knobs.keepStaleParent {
				// The cached parent predates the split (maybe many:
				// inserts at the right end split the last leaf again
				// and again, and nothing else refreshes a cache that
				// only scans use). Drop it and descend again, reading
				// the parent afresh, rather than walk a chain of right
				// links that grows with every split, on every scan.
				c.drop(w.src)
				w.src, w.queue = nil, nil
				continue
			}
			w.queue = append(w.queue[:0], n.Next)
			w.src = nil
			continue
		}
		w.Leaves++
		w.Entries += n.Count
		it := n.Entries()
		for e, ok := it.next(); ok; e, ok = it.next() {
			if string(e.Key) < string(start) {
				continue
			}
			if end != nil && string(e.Key) >= string(end) {
				return nil
			}
			w.pair(&e)
			if w.limit > 0 && len(w.Pairs)-w.dst >= w.limit {
				return nil
			}
		}
		if n.HighInf || (end != nil && string(n.High) >= string(end)) {
			return nil
		}
		// n aliases b, the read's own copy; kept in the walk, not on
		// the heap (a leaf read allocated a Node).
		w.prevNode = n
		w.prev = &w.prevNode
		w.stuck = -1
	}
	return ErrRetry
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
	var w ScanWalk
	c.BeginScan(&w, root, applied, start, end, limit, true, dst)
	err := w.Run(read)
	if err != nil {
		return dst, w.Reads, err
	}
	return w.Pairs, w.Reads, nil
}

// first finds the reverse scan's first leaf (the one holding end, or the
// rightmost): w.pend, and the cached node that named it (w.src).
func (w *ScanWalk) first(read ReadFunc) error {
	var n int
	var err error
	if w.end == nil {
		w.pend, n, err = w.c.lastLeaf(read, w.root)
		w.src = nil
	} else {
		w.pend, w.src, n, err = w.c.findLeaf(read, w.root, w.end)
	}
	w.Reads += n
	if err != nil && !retryable(err) && !errors.Is(err, ErrChanged) && !errors.Is(err, ErrMalformed) {
		return w.readFailed(err) // a read's: the descent runs again
	}
	if err == nil {
		w.needFirst = false
	}
	return err
}

func (w *ScanWalk) runReverse(read ReadFunc) error {
	c, start, end := w.c, w.start, w.end
	for ; w.stuck < maxSteps; w.stuck++ {
		if w.needFirst {
			if err := w.first(read); err != nil {
				return err
			}
		}
		id := w.pend
		b, err := read(id.Slot())
		w.Reads++
		if err != nil {
			return w.readFailed(err)
		}
		n, err := decodeRead(b, id)
		if err == nil && (n.Dead || n.Level != 0) {
			err = ErrNotNode
		}
		if err == nil && w.right == nil {
			if end != nil && string(end) < string(n.Low) {
				err = ErrStale
			} else if !n.HighInf && (end == nil || string(end) >= string(n.High)) {
				if w.src != nil && !c.knobs.keepStaleParent {
					// The cached parent predates the split: drop it
					// and descend again rather than walk right links
					// (see Scan).
					c.drop(w.src)
					w.needFirst = true
					continue
				}
				w.pend = n.Next // end lies right of this leaf: a split moved it
				continue
			}
		}
		if err == nil && w.right != nil && (n.HighInf || string(n.High) != string(w.right.Low)) {
			err = ErrChanged // a prev link older than applied's state
		}
		if errors.Is(err, ErrStale) || errors.Is(err, ErrNotNode) {
			if w.right == nil && w.src != nil {
				c.drop(w.src)
				w.needFirst = true
				continue
			}
			return ErrChanged
		}
		if err != nil {
			return err
		}
		if n.Stamp > w.applied && !c.knobs.skipStamp {
			return ErrChanged
		}
		w.Leaves++
		w.Entries += n.Count
		w.ents = w.ents[:0]
		it := n.Entries()
		for e, ok := it.next(); ok; e, ok = it.next() {
			w.ents = append(w.ents, e)
		}
		for i := len(w.ents) - 1; i >= 0; i-- {
			k := w.ents[i].Key
			if end != nil && string(k) >= string(end) {
				continue
			}
			if string(k) < string(start) {
				return nil
			}
			w.pair(&w.ents[i])
			if w.limit > 0 && len(w.Pairs)-w.dst >= w.limit {
				return nil
			}
		}
		if string(n.Low) <= string(start) || n.Prev == 0 {
			return nil
		}
		w.prevNode = n
		w.right, w.pend, w.stuck = &w.prevNode, n.Prev, -1
	}
	return ErrRetry
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
