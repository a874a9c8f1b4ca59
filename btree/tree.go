package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Config is the geometry of a tree.
type Config struct {
	// NodeSize is the size of every node in bytes, a multiple of 64 in
	// [MinNodeSize, MaxNodeSize]. Default 4096.
	NodeSize int
	// MaxKey is the longest key in bytes. Default 256 (at most what fits:
	// see MaxInline).
	MaxKey int
}

// DefaultConfig is a 4 KiB node and 256-byte keys. Of 1, 2, 4 and 8 KiB,
// 4 KiB nodes cost an insert the least CPU (BenchmarkStoreApplyNodeSize;
// docs/btree.md, "Why 4 KiB").
var DefaultConfig = Config{NodeSize: 4096, MaxKey: 256}

func (c Config) withDefaults() Config {
	if c.NodeSize == 0 {
		c.NodeSize = DefaultConfig.NodeSize
	}
	if c.MaxKey == 0 {
		c.MaxKey = DefaultConfig.MaxKey
	}
	return c
}

// fixed is the overhead of a node that every split must leave room for:
// header, two fences of the longest key, the check word and rounding.
func (c Config) fixed() int { return hdrSize + 2*(2+c.MaxKey) + checkSize + 8 }

// maxEntry is the largest encoded entry. An overfull node holds at most
// NodeSize + maxEntry bytes, and splitting it by bytes leaves each half
// at most half of that plus one entry plus the fixed overhead, which fits
// in NodeSize when maxEntry <= (NodeSize - fixed) / 3.
func (c Config) maxEntry() int { return (c.NodeSize - c.fixed()) / 3 }

// MaxInline is the largest value a leaf holds with a key of MaxKey bytes.
func (c Config) MaxInline() int { return c.maxEntry() - offSize - leafEnt - c.MaxKey }

// Validate says what is wrong with the geometry, if anything.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.NodeSize < MinNodeSize || c.NodeSize > MaxNodeSize || c.NodeSize%64 != 0 {
		return fmt.Errorf("btree: node size %d: want a multiple of 64 in [%d, %d]", c.NodeSize, MinNodeSize, MaxNodeSize)
	}
	if c.MaxKey < 1 {
		return fmt.Errorf("btree: max key %d: want at least 1", c.MaxKey)
	}
	if c.MaxInline() < 8 || offSize+innerEnt+c.MaxKey > c.maxEntry() {
		return fmt.Errorf("btree: keys of up to %d bytes leave no room for values in nodes of %d bytes", c.MaxKey, c.NodeSize)
	}
	return nil
}

// ErrTooLarge is returned for a key or value beyond the tree's limits.
var ErrTooLarge = errors.New("btree: key or value too large")

// Tree is one B-link tree in an arena, changed only by its writer (the
// replica's apply, on one goroutine) and read by anyone through Decode and
// Lookup. Each change writes whole node images in an order that keeps
// every state between two writes correct for a reader that validates what
// it reads (see write and the methods' comments).
type Tree struct {
	cfg     Config
	a       *Arena
	root    NodeID
	scratch []byte
	// img and entBuf are splitInsert's: the image it builds, and the new
	// entry's bytes.
	img, entBuf []byte
	knobs       testingKnobs
	len         int
	// pairs is the entries' bytes in a snapshot section (pairSize),
	// kept by every change: a capture's size without a walk.
	pairs int
	// onFree, if set, takes the id of every node the tree unlinks
	// instead of releasing its slot at once (Store: the grace of
	// FreeAfter entries before a slot is reused).
	onFree func(NodeID)
	// memo is the last descent, valid until the next node write: an
	// apply looks a key up (its version before, its condition) and then
	// writes it, and the second descent is free.
	memoKey  []byte
	memoPath []NodeID
	memoOK   bool
	// shape counts the writes that may change a path (every node write
	// but a leaf's in place): a path kept by prefetch is the descent's
	// while shape is what it was (prefetch.go). pre are the paths kept
	// for the batch being applied, preCur the last one taken; sink sums
	// prefetch's loads.
	shape   uint64
	pre     []prePath
	preSeen []NodeID
	preCur  int
	sink    uint64
	// prefetchedKeys and prefetchUsed count the paths kept and the
	// applies that took one (StoreStats).
	// prefetchLate counts those taken after the tree's shape changed
	// (tests).
	prefetchedKeys, prefetchUsed, prefetchLate uint64
	// memos is the writer's index of its inner nodes by slot
	// (innermemo.go).
	memos map[uint32]*innerMemo
	// use is the tree's memory and split counts, kept at each node
	// write (Usage).
	use Usage
}

// Usage is what a tree's nodes take and how often they split, kept by
// the writer as it writes nodes (no walk: a replica's stats read it at
// any time). Leaves and Inner are the live nodes (written, not dead);
// LeafBytes the bytes the live leaves use (their used words: header,
// fences, offsets, entries, check word), so LeafBytes / (Leaves *
// NodeSize) is the leaves' fill. The split counts are since the tree
// was made (a restore makes a new tree).
type Usage struct {
	Leaves, Inner           int
	LeafBytes               int
	LeafSplits, InnerSplits uint64
}

// Usage is the tree's memory and split counts.
func (t *Tree) Usage() Usage { return t.use }

// account adds sign times slot's node to the usage, if slot holds node
// id alive: called with -1 before a write of id (a slot just taken holds
// another id, or zeros) and +1 after it.
func (t *Tree) account(slot []byte, id NodeID, sign int) {
	if NodeID(binary.LittleEndian.Uint64(slot[offID:])) != id {
		return
	}
	switch f := leU16(slot[offFlags:]); {
	case f&flagDead != 0:
	case f&flagLeaf != 0:
		t.use.Leaves += sign
		t.use.LeafBytes += sign * int(leU16(slot[offUsed:]))
	default:
		t.use.Inner += sign
	}
}

// New returns an empty tree (one empty leaf) in arena a, written at stamp.
func New(cfg Config, a *Arena, stamp uint64) (*Tree, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if a.size != cfg.NodeSize {
		return nil, fmt.Errorf("btree: arena of %d-byte slots for nodes of %d bytes", a.size, cfg.NodeSize)
	}
	t := &Tree{cfg: cfg, a: a, scratch: make([]byte, cfg.NodeSize)}
	root := &image{id: a.alloc(), stamp: stamp, highInf: true}
	t.write(root)
	t.root = root.id
	return t, nil
}

// Root is the id of the root node: where a reader without a cache starts.
func (t *Tree) Root() NodeID { return t.root }

// Len is the number of keys.
func (t *Tree) Len() int { return t.len }

// Config is the tree's geometry.
func (t *Tree) Config() Config { return t.cfg }

func (t *Tree) checkSizes(key, val []byte) error {
	if len(key) == 0 || len(key) > t.cfg.MaxKey {
		return fmt.Errorf("%w: key of %d bytes (1 to %d)", ErrTooLarge, len(key), t.cfg.MaxKey)
	}
	if len(val) > t.cfg.MaxInline() {
		return fmt.Errorf("%w: value of %d bytes (at most %d inline)", ErrTooLarge, len(val), t.cfg.MaxInline())
	}
	return nil
}

// load decodes node id into an image whose slices alias the arena. A
// failure is a bug of the writer: the writer's own nodes always validate.
func (t *Tree) load(id NodeID) *image {
	n, err := decodeOwn(t.a.bytes(id.Slot()), id)
	if err != nil {
		panic(fmt.Sprintf("btree: writer's node %v: %v", id, err))
	}
	m := &image{id: n.ID, next: n.Next, prev: n.Prev, stamp: n.Stamp, level: n.Level,
		highInf: n.HighInf, low: n.Low, high: n.High}
	// Room for the entry a caller inserts: no slice grows on the way.
	m.keys = make([][]byte, 0, n.Count+1)
	if n.Leaf {
		m.vals, m.vers = make([][]byte, 0, n.Count+1), make([]uint64, 0, n.Count+1)
	} else {
		m.kids = make([]NodeID, 0, n.Count+1)
	}
	it := n.Entries()
	for e, ok := it.next(); ok; e, ok = it.next() {
		m.keys = append(m.keys, e.Key)
		if n.Leaf {
			m.vals = append(m.vals, e.Value)
			m.vers = append(m.vers, e.Version)
		} else {
			m.kids = append(m.kids, e.Child)
		}
	}
	return m
}

// write seals m in scratch and copies it into its slot: the one place a
// node changes.
func (t *Tree) write(m *image) {
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	t.encode(t.scratch, m)
	t.install(m.id, t.scratch)
}

// install copies the sealed image img (NodeSize bytes) of node id into
// its slot (through Arena.beginWrite, for the captures), keeping the
// usage.
func (t *Tree) install(id NodeID, img []byte) {
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	slot := t.a.bytes(id.Slot())
	if id == t.a.unwritten || t.knobs.unwrittenAll {
		// A new slot's first write: its zeros are no node, and the
		// write below is the first access to its page (on this VM
		// a trap into the host), which a read here would make two
		// (branch bt3).
		t.a.unwritten = 0
	} else {
		t.account(slot, id, -1)
	}
	t.dropMemo(id.Slot())
	copy(t.a.beginWrite(id.Slot()), img)
	t.a.endWrite()
	t.account(slot, id, 1)
	if t.knobs.onWrite != nil {
		t.knobs.onWrite()
	}
}

func (t *Tree) encode(dst []byte, m *image) {
	if m.size() > len(dst) {
		panic(fmt.Sprintf("btree: node %v of %d bytes in a %d-byte slot", m.id, m.size(), len(dst)))
	}
	m.encode(dst)
}

// descend returns the path of node ids from the root to the leaf whose
// fences hold key, as the writer sees its own tree (no moves right: the
// writer's parents are always current). The caller does not change it.
func (t *Tree) descend(key []byte) []NodeID {
	if t.memoOK && string(key) == string(t.memoKey) {
		return t.memoPath
	}
	if path, exact := t.kept(key); exact {
		return path
	}
	// Room for a path of 4 levels (a group's million keys of 16 bytes in
	// 4 KiB nodes make 3), so that the path is one allocation, not one
	// per level.
	path := append(make([]NodeID, 0, 4), t.root)
	for {
		id := path[len(path)-1]
		if leU16(t.a.bytes(id.Slot())[offLevel:]) == 0 {
			if _, err := decodeOwn(t.a.bytes(id.Slot()), id); err != nil {
				panic(fmt.Sprintf("btree: writer's node %v: %v", id, err))
			}
			t.memoKey, t.memoPath, t.memoOK = append(t.memoKey[:0], key...), path, true
			return path
		}
		path = append(path, t.childFor(id, key))
	}
}

// Get looks key up in the writer's tree: its entry (value and version,
// aliasing the arena until the next change) and whether it is there.
func (t *Tree) Get(key []byte) (Entry, bool) {
	id := t.leafFor(key)
	n, _ := decodeOwn(t.a.bytes(id.Slot()), id)
	return n.Find(key)
}

// height is the number of levels (the root's level + 1).
func (t *Tree) height() int {
	n, err := decodeOwn(t.a.bytes(t.root.Slot()), t.root)
	if err != nil {
		panic(fmt.Sprintf("btree: writer's root %v: %v", t.root, err))
	}
	return n.Level + 1
}

// Put stores key -> val with its version, written at stamp. It reports
// whether the key was there before.
func (t *Tree) Put(key, val []byte, version, stamp uint64) (existed bool, err error) {
	_, existed, err = t.put(key, val, version, stamp)
	return existed, err
}

// put is Put that also returns the version the key had before (prev,
// when existed): a blind put's result needs no lookup of its own.
func (t *Tree) put(key, val []byte, version, stamp uint64) (prev uint64, existed bool, err error) {
	if err := t.checkSizes(key, val); err != nil {
		return 0, false, err
	}
	if handled, existed, prev := t.putInPlace(t.leafFor(key), key, val, version, stamp); handled {
		return prev, existed, nil
	}
	path := t.descend(key)
	if t.splitInsert(path, key, val, version, stamp) {
		return 0, false, nil
	}
	leaf := t.load(path[len(path)-1])
	i, found := slices.BinarySearchFunc(leaf.keys, key, cmp)
	if found {
		prev = leaf.vers[i]
		t.pairs += snapPairSize(len(key), len(val)) - snapPairSize(len(key), len(leaf.vals[i]))
		leaf.vals[i], leaf.vers[i] = val, version
	} else {
		leaf.keys = slices.Insert(leaf.keys, i, key)
		leaf.vals = slices.Insert(leaf.vals, i, val)
		leaf.vers = slices.Insert(leaf.vers, i, version)
		t.len++
		t.pairs += snapPairSize(len(key), len(val))
	}
	leaf.stamp = stamp
	t.store(leaf, path, stamp)
	return prev, found, nil
}

// store writes m (the last node of path, changed) back, splitting it and
// its ancestors as far as they overflow. Write order, for readers: a new
// node before anything points to it; the split node (now holding the lower
// half and linking to the new one) next; the old right neighbour's back
// link; the parent last. Between any two writes every key is reachable
// from the root a reader holds, through fences and right links.
func (t *Tree) store(m *image, path []NodeID, stamp uint64) {
	for lvl := len(path) - 1; ; lvl-- {
		if m.size() <= t.cfg.NodeSize {
			t.write(m)
			return
		}
		right, sep := t.split(m, stamp)
		if m.leaf() {
			t.use.LeafSplits++
		} else {
			t.use.InnerSplits++
		}
		if t.knobs.linkBeforeNode {
			t.write(m)
			t.write(right)
		} else {
			t.write(right)
			t.write(m)
		}
		if right.next != 0 && !t.relinkInPlace(right.next, right.id, stamp) {
			nb := t.load(right.next)
			nb.prev = right.id
			nb.stamp = stamp
			t.write(nb)
		}
		if lvl == 0 {
			root := &image{id: t.a.alloc(), stamp: stamp, level: m.level + 1, highInf: true,
				keys: [][]byte{nil, sep}, kids: []NodeID{m.id, right.id}}
			t.write(root)
			t.root = root.id
			return
		}
		if t.addChildInPlace(path[lvl-1], m.id, sep, right.id, stamp) {
			return
		}
		parent := t.load(path[lvl-1])
		i := slices.Index(parent.kids, m.id)
		if i < 0 {
			panic(fmt.Sprintf("btree: node %v is not a child of %v", m.id, parent.id))
		}
		parent.keys = slices.Insert(parent.keys, i+1, sep)
		parent.kids = slices.Insert(parent.kids, i+1, right.id)
		parent.stamp = stamp
		m = parent
	}
}

// split moves the upper half of m's entries (by bytes) into a new node to
// its right and returns it with the separator (the new node's low fence,
// copied: m's slices alias the slot that m is about to overwrite).
func (t *Tree) split(m *image, stamp uint64) (*image, []byte) {
	at := t.splitAt(m)
	sep := slices.Clone(m.keys[at])
	r := &image{id: t.a.alloc(), stamp: stamp, level: m.level, next: m.next, prev: m.id,
		low: sep, high: m.high, highInf: m.highInf}
	r.keys = slices.Clone(m.keys[at:])
	if m.leaf() {
		r.vals = slices.Clone(m.vals[at:])
		r.vers = slices.Clone(m.vers[at:])
		m.vals, m.vers = m.vals[:at], m.vers[:at]
	} else {
		r.kids = slices.Clone(m.kids[at:])
		m.kids = m.kids[:at]
	}
	m.keys = m.keys[:at]
	m.high, m.highInf = sep, false
	m.next = r.id
	m.stamp = stamp
	return r, sep
}

// RightFill is the share of an overfull node's entry bytes that a split
// of the last node of its level (no right sibling: where keys inserted in
// ascending order land) leaves in it, instead of half.
const RightFill = 0.9

// splitAt is the first entry that split moves to the new right node.
// Entries are cut by bytes: at half, or, when m is the last node of its
// level, after RightFill of them. A load in ascending key order (a
// sequence, a time series, kvbench's load) appends at the right end, and
// halves would leave every node it passes half full for good: the nodes
// it leaves behind are RightFill full instead, as B-trees split their
// rightmost page (PostgreSQL's fillfactor). Keys that arrive a little out
// of order still find room in the left node. Random inserts reach the last
// node of a level as rarely as any other, so their fill is unchanged.
// Either way each side keeps an entry, and the uneven cut is made only if
// both sides fit NodeSize (else: halves, which always fit).
func (t *Tree) splitAt(m *image) int {
	return t.cutAt(len(m.keys), m.entSize, func(j int) []byte { return m.keys[j] }, m.next == 0, len(m.low), len(m.high))
}

// cutAt is splitAt over count entries of the given sizes (offset
// included) and keys, of a node that is the last of its level (last)
// with fences of lowLen and highLen bytes.
func (t *Tree) cutAt(count int, size func(int) int, key func(int) []byte, last bool, lowLen, highLen int) int {
	sum := 0
	for i := range count {
		sum += size(i)
	}
	cut := func(target int) (int, int) {
		at, acc := 1, size(0)
		for at < count-1 && acc < target {
			acc += size(at)
			at++
		}
		return at, acc
	}
	if last && !t.knobs.halfSplits {
		at, acc := cut(int(RightFill * float64(sum)))
		fixed := hdrSize + 2 + 2 + len(key(at)) + checkSize + 7
		if fixed+lowLen+acc <= t.cfg.NodeSize && fixed+highLen+sum-acc <= t.cfg.NodeSize {
			return at
		}
	}
	at, _ := cut(sum / 2)
	return at
}

// Delete removes key, written at stamp, and reports whether it was there.
// A leaf left empty that has a left sibling under the same parent is
// merged into it: the leaf is first written dead (a reader that reaches it
// looks again), then the sibling takes its range, then the right
// neighbour's back link and the parent change, and the slot is freed
// (its incarnation bumped, so a late pointer to it never matches). An
// empty leaf that is its parent's first child stays: at most one per
// inner node.
func (t *Tree) Delete(key []byte, stamp uint64) bool {
	if len(key) == 0 || len(key) > t.cfg.MaxKey {
		return false
	}
	path := t.descend(key)
	if handled, found := t.deleteInPlace(path[len(path)-1], key, len(path) == 1, stamp); handled {
		return found
	}
	leaf := t.load(path[len(path)-1])
	i, found := slices.BinarySearchFunc(leaf.keys, key, cmp)
	if !found {
		return false
	}
	t.len--
	t.pairs -= snapPairSize(len(key), len(leaf.vals[i]))
	leaf.keys = slices.Delete(leaf.keys, i, i+1)
	leaf.vals = slices.Delete(leaf.vals, i, i+1)
	leaf.vers = slices.Delete(leaf.vers, i, i+1)
	leaf.stamp = stamp
	if len(leaf.keys) > 0 || len(path) == 1 {
		t.write(leaf)
		return true
	}
	parent := t.load(path[len(path)-2])
	pi := slices.Index(parent.kids, leaf.id)
	if pi <= 0 {
		t.write(leaf)
		return true
	}
	high, highInf, next := slices.Clone(leaf.high), leaf.highInf, leaf.next
	leaf.dead = true
	t.write(leaf)
	ls := t.load(parent.kids[pi-1])
	ls.high, ls.highInf, ls.next, ls.stamp = high, highInf, next, stamp
	t.write(ls)
	if next != 0 {
		nb := t.load(next)
		nb.prev, nb.stamp = ls.id, stamp
		t.write(nb)
	}
	parent.keys = slices.Delete(parent.keys, pi, pi+1)
	parent.kids = slices.Delete(parent.kids, pi, pi+1)
	parent.stamp = stamp
	t.write(parent)
	if t.onFree != nil {
		t.onFree(leaf.id)
	} else {
		t.a.release(leaf.id)
	}
	return true
}

// deleteKeys deletes keys (sorted, each in the tree), written at stamp,
// one write per leaf rather than per key: the keys of one leaf go in one
// image write. A leaf that would be left empty keeps one of them, which
// Delete then removes (with the merge of the empty leaf, as for any
// delete). The dropped tablets' garbage is deleted this way (garbage.go).
func (t *Tree) deleteKeys(keys [][]byte, stamp uint64) {
	for len(keys) > 0 {
		path := t.descend(keys[0])
		leaf := t.load(path[len(path)-1])
		n := 0
		for n < len(keys) && (leaf.highInf || string(keys[n]) < string(leaf.high)) {
			n++
		}
		batch := keys[:max(n, 1)]
		keys = keys[max(n, 1):]
		kk, kv, kver := leaf.keys[:0], leaf.vals[:0], leaf.vers[:0]
		var last []byte // the last key removed
		removed, j := 0, 0
		for i := range leaf.keys {
			k := leaf.keys[i]
			for j < len(batch) && string(batch[j]) < string(k) {
				j++
			}
			if j < len(batch) && string(batch[j]) == string(k) {
				removed++
				t.pairs -= snapPairSize(len(k), len(leaf.vals[i]))
				last = k
				continue
			}
			kk, kv, kver = append(kk, k), append(kv, leaf.vals[i]), append(kver, leaf.vers[i])
		}
		if removed == 0 {
			continue
		}
		t.len -= removed
		if len(kk) == 0 && len(path) > 1 {
			// Keep the last one for Delete, which merges the leaf.
			lastKey := slices.Clone(last)
			t.len++
			if removed > 1 {
				e, _ := t.Get(lastKey)
				t.pairs += snapPairSize(len(lastKey), len(e.Value))
				leaf = t.load(path[len(path)-1])
				i, _ := slices.BinarySearchFunc(leaf.keys, lastKey, cmp)
				leaf.keys, leaf.vals, leaf.vers = leaf.keys[i:i+1], leaf.vals[i:i+1], leaf.vers[i:i+1]
				leaf.stamp = stamp
				t.write(leaf)
			} else {
				e, _ := t.Get(lastKey)
				t.pairs += snapPairSize(len(lastKey), len(e.Value))
			}
			t.Delete(lastKey, stamp)
			continue
		}
		leaf.keys, leaf.vals, leaf.vers, leaf.stamp = kk, kv, kver, stamp
		t.write(leaf)
	}
}

// Ascend calls f for every key >= from in order, as the writer sees its
// tree, until f returns false.
func (t *Tree) Ascend(from []byte, f func(key, val []byte) bool) {
	t.ascend(from, func(e Entry) bool { return f(e.Key, e.Value) })
}

// ascend is Ascend with each entry's version.
func (t *Tree) ascend(from []byte, f func(Entry) bool) {
	path := t.descend(from)
	id := path[len(path)-1]
	for id != 0 {
		n, err := Decode(t.a.bytes(id.Slot()), id)
		if err != nil {
			panic(fmt.Sprintf("btree: writer's node %v: %v", id, err))
		}
		it := n.Entries()
		for e, ok := it.next(); ok; e, ok = it.next() {
			if string(e.Key) >= string(from) && !f(e) {
				return
			}
		}
		id = n.Next
	}
}
