package btree

import (
	"errors"
	"sync"
	"sync/atomic"
	"unsafe"

	tbtree "github.com/tidwall/btree"
)

// Cache is a client's cache of a tree's inner nodes (DynaTree's client
// cache, Alg. 1 line 4 and Alg. 2), safe for concurrent use. It holds
// decoded copies of inner nodes, one ordered index per level keyed by each
// node's low fence, so "which cached node holds key, deepest level first"
// is one ordered search per level. That range question is why it is a
// tidwall/btree index and not a hash cache such as ristretto: a hash
// finds a node by id, not by the key range it covers. Leaves are never
// cached; a warm lookup is a local search down to a level-1 node and one
// leaf read.
//
// Cached nodes may be stale. Nothing a cached node says is an answer: it
// only names the node to read next, and what is read is checked (Decode,
// fences, level). A pointer that leads to a node that no longer holds the
// key drops the cached node it came from, one level at a time (Alg. 2
// lines 9-12, without its recursive drop of children: a child that is
// still valid stays useful). A split needs no drop: the reader moves right
// through the sibling link, and the node read there joins the cache.
//
// The cache is bounded by MaxBytes of decoded nodes, evicting by the clock
// algorithm (a node used since the hand last passed gets another round).
type Cache struct {
	mu       sync.RWMutex
	maxBytes int
	bytes    int
	levels   []*tbtree.BTreeG[*cached] // index by level-1
	ring     []*cached                 // clock order
	hand     int
	stats    CacheStats // Drops and Evicted, under mu
	// Counted without the lock: every lookup adds to them.
	lookups, reads, warm atomic.Uint64
	knobs                testingKnobs // skipFence, skipContiguity, skipStamp
}

// CacheStats counts what lookups did.
type CacheStats struct {
	Lookups uint64 // lookups answered
	Reads   uint64 // node reads they made, retries included
	Warm    uint64 // lookups that started from a cached level-1 node
	Drops   uint64 // cached nodes dropped on a stale pointer
	Evicted uint64 // cached nodes evicted for room
	Nodes   int    // nodes cached now
	Bytes   int    // their decoded size
}

type cached struct {
	id      NodeID
	level   int
	low     string
	high    string
	highInf bool
	keys    []string
	kids    []NodeID
	size    int
	ring    int         // position in ring
	used    atomic.Bool // set by lookups under the read lock
}

func (c *cached) covers(key []byte) bool {
	return string(key) >= c.low && (c.highInf || string(key) < c.high)
}

func (c *cached) child(key []byte) NodeID { return c.kids[c.childIndex(key)] }

// childIndex is the index of the child that holds key: the last whose key
// is at most key (0 if none), by binary search.
func (c *cached) childIndex(key []byte) int {
	lo, hi := 1, len(c.keys)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if string(key) < c.keys[mid] {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo - 1
}

// NewCache returns a cache of at most maxBytes of decoded inner nodes (0
// caches nothing: every lookup reads from the root).
func NewCache(maxBytes int) *Cache { return &Cache{maxBytes: maxBytes} }

// Stats returns the counters.
func (c *Cache) Stats() CacheStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s := c.stats
	s.Nodes, s.Bytes = len(c.ring), c.bytes
	s.Lookups, s.Reads, s.Warm = c.lookups.Load(), c.reads.Load(), c.warm.Load()
	return s
}

// cover returns the deepest cached node that holds key, or nil.
func (c *Cache) cover(key []byte) *cached {
	f := finders.Get().(*finder)
	defer finders.Put(f)
	// The pivot's low fence aliases key: it is only compared, never kept.
	f.pivot.low = unsafe.String(unsafe.SliceData(key), len(key))
	defer func() { f.pivot.low, f.hit = "", nil }()
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, lv := range c.levels {
		if lv == nil {
			continue
		}
		f.hit = nil
		lv.Descend(&f.pivot, f.found)
		if f.hit != nil && f.hit.covers(key) {
			f.hit.used.Store(true)
			return f.hit
		}
	}
	return nil
}

// finder is cover's scratch, pooled so that a warm lookup allocates
// nothing: the pivot it searches with and the callback that keeps the
// node found.
type finder struct {
	pivot cached
	hit   *cached
	found func(*cached) bool
}

var finders = sync.Pool{New: func() any {
	f := &finder{}
	f.found = func(n *cached) bool { f.hit = n; return false }
	return f
}}

func byLow(a, b *cached) bool { return a.low < b.low }

// add caches the inner node n (replacing the entry of the same level and
// low fence).
func (c *Cache) add(n *Node) {
	if c.maxBytes == 0 || n.Leaf {
		return
	}
	e := &cached{id: n.ID, level: n.Level, low: string(n.Low), highInf: n.HighInf}
	e.used.Store(true)
	if !n.HighInf {
		e.high = string(n.High)
	}
	e.size = 96 + len(e.low) + len(e.high)
	it := n.Entries()
	for x, ok := it.next(); ok; x, ok = it.next() {
		e.keys = append(e.keys, string(x.Key))
		e.kids = append(e.kids, x.Child)
		e.size += 24 + len(x.Key)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.levels) < n.Level {
		c.levels = append(c.levels, nil)
	}
	lv := c.levels[n.Level-1]
	if lv == nil {
		lv = tbtree.NewBTreeGOptions(byLow, tbtree.Options{NoLocks: true})
		c.levels[n.Level-1] = lv
	}
	if old, ok := lv.Set(e); ok {
		c.unring(old)
	}
	e.ring = len(c.ring)
	c.ring = append(c.ring, e)
	c.bytes += e.size
	for c.bytes > c.maxBytes && len(c.ring) > 1 {
		c.evictOne()
	}
}

func (c *Cache) unring(e *cached) {
	last := c.ring[len(c.ring)-1]
	c.ring[e.ring] = last
	last.ring = e.ring
	c.ring = c.ring[:len(c.ring)-1]
	c.bytes -= e.size
	if c.hand >= len(c.ring) {
		c.hand = 0
	}
}

func (c *Cache) evictOne() {
	for {
		if c.hand >= len(c.ring) {
			c.hand = 0
		}
		e := c.ring[c.hand]
		if e.used.Load() {
			e.used.Store(false)
			c.hand++
			continue
		}
		c.levels[e.level-1].Delete(e)
		c.unring(e)
		c.stats.Evicted++
		return
	}
}

// drop removes e if it is still the cached node for its level and fence.
func (c *Cache) drop(e *cached) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lv := c.levels[e.level-1]
	if cur, ok := lv.Get(e); ok && cur == e {
		lv.Delete(e)
		c.unring(e)
		c.stats.Drops++
	}
}

// maxAttempts bounds the descents of one lookup: each failed attempt
// dropped a cached node or met a node being written.
const maxAttempts = 32

// Lookup finds key in the tree whose root is root (the id the group
// publishes; any older root also works, through right links), starting
// from the deepest cached node that holds key, reading the nodes below it
// through read and caching the inner ones. It answers only from a leaf
// that validated and holds key inside its fences. reads counts the node
// reads made.
func (c *Cache) Lookup(read ReadFunc, root NodeID, key []byte) (e Entry, found bool, reads int, err error) {
	return c.LookupHinted(read, root, key, nil)
}

// Hint carries a lookup's local search of the cache (the cached node it
// starts from and the child it names) from one run of LookupHinted to the
// next run of the same lookup: a polled reader runs a lookup again once
// the leaf read it stopped for lands, and need not search the cache
// again. It is only a hint, as every cached node is: what the descent
// reads is checked. The zero Hint is empty; Reset empties it (for another
// key or root).
type Hint struct {
	set   bool
	from  *cached
	id    NodeID
	level int
}

// Reset empties h.
func (h *Hint) Reset() { *h = Hint{} }

// LookupHinted is Lookup, taking its first descent's start from h if h is
// set and recording it there if not (h nil: Lookup). The caller resets h
// whenever key or root changes.
func (c *Cache) LookupHinted(read ReadFunc, root NodeID, key []byte, h *Hint) (e Entry, found bool, reads int, err error) {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		var from *cached
		id, level := root, -1
		if h != nil && h.set && attempt == 0 {
			from, id, level = h.from, h.id, h.level
		} else {
			if from = c.cover(key); from != nil {
				id, level = from.child(key), from.level-1
			}
			if h != nil {
				*h = Hint{set: true, from: from, id: id, level: level}
			}
		}
		v, ok, n, moved, err := c.descend(read, id, level, key)
		reads += n
		if from != nil && (moved || (n == 1 && (errors.Is(err, ErrStale) || errors.Is(err, ErrNotNode))) || errors.Is(err, ErrRetry)) {
			// The cached node is stale: its pointer led to a node that no
			// longer holds the key, or to one whose range a split cut
			// (the answer found by moving right stands). Drop it, one
			// level: the next lookup reads a fresh copy through its
			// parent.
			c.drop(from)
		}
		if err != nil && !retryable(err) {
			return Entry{}, false, reads, err // the fabric's, or a malformed node
		}
		if err == nil {
			c.lookups.Add(1)
			c.reads.Add(uint64(reads))
			if from != nil && from.level == 1 {
				c.warm.Add(1)
			}
			return v, ok, reads, nil
		}
	}
	return Entry{}, false, reads, ErrRetry
}

// descend is Lookup below its starting pointer (see the free function
// Lookup): down to the leaf, then the key looked up in it.
func (c *Cache) descend(read ReadFunc, id NodeID, level int, key []byte) (val Entry, found bool, reads int, moved bool, err error) {
	n, _, reads, moved, err := c.down(read, id, level, key, false, true)
	if err != nil {
		return Entry{}, false, reads, moved, err
	}
	v, ok := n.Find(key)
	return v, ok, reads, moved, nil
}

// down is the one descent of the client: Lookup's, Scan's to its first
// leaf and ReverseScan's to its last. It starts at node id, which the
// pointer it came from expects at level (-1: unknown), and goes down to
// the leaf that holds key (with toEnd, the rightmost leaf), caching each
// inner node it reads. With readLeaf it reads and returns the leaf (n);
// otherwise it returns the leaf's id (leaf) unread, as soon as an inner
// node names it (at once when level is 0). moved reports a move right on
// the first node read: the pointer it started from predates a split.
//
// A node is accepted only if it validates, is live, sits at the level its
// pointer expected and has key at or above its low fence (ErrStale
// otherwise: the pointer is stale); key at or past its high fence moves
// right through next (B-link), which only a split can have made
// necessary.
func (c *Cache) down(read ReadFunc, id NodeID, level int, key []byte, toEnd, readLeaf bool) (n Node, leaf NodeID, reads int, moved bool, err error) {
	first := true
	for reads < maxSteps {
		if level == 0 && !readLeaf {
			return Node{}, id, reads, moved, nil
		}
		b, err := read(id.Slot())
		reads++
		if err != nil {
			return Node{}, 0, reads, moved, err
		}
		n, err := decodeRead(b, id)
		if err != nil {
			return Node{}, 0, reads, moved, err
		}
		if n.Dead {
			return Node{}, 0, reads, moved, ErrNotNode
		}
		if n.Leaf && c.knobs.skipFence && !toEnd {
			return n, id, reads, moved, nil
		}
		if n.Leaf && c.knobs.staleCacheAfterSplit && !toEnd && string(key) >= string(n.Low) {
			return n, id, reads, moved, nil
		}
		if (level >= 0 && n.Level != level) || (!toEnd && string(key) < string(n.Low)) {
			return Node{}, 0, reads, moved, ErrStale
		}
		if toEnd && !n.HighInf || !toEnd && !n.Covers(key) {
			if n.Next == 0 {
				return Node{}, 0, reads, moved, ErrMalformed
			}
			id = n.Next // B-link: a split moved key's range to the right
			moved = moved || first
			continue
		}
		if n.Leaf {
			return n, id, reads, moved, nil
		}
		c.add(&n)
		if toEnd {
			id = n.lastChild()
		} else {
			id = n.ChildFor(key)
		}
		level, first = n.Level-1, false
	}
	return Node{}, 0, reads, moved, ErrRetry
}

// retryable reports whether a lookup that met err may descend again:
// what it read was being written, freed, or reached through a stale
// pointer.
func retryable(err error) bool {
	return errors.Is(err, ErrTorn) || errors.Is(err, ErrNotNode) || errors.Is(err, ErrStale) || errors.Is(err, ErrRetry)
}
