package btree

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// In-place changes of a leaf (the common apply: a put that fits, a delete
// that leaves the leaf some key). Instead of decoding the leaf into an
// image of slices and encoding it whole, the writer copies the leaf's
// used bytes into its scratch, moves the bytes after the change there
// (memmove), writes the one entry and the header words that change
// (count, used, stamp), zeroes what the node no longer uses, seals it with
// a fresh check word over [0, used-8), and copies into the slot only what
// changed: the header and the bytes from the change to the end. The
// bytes are exactly what encode writes for the new contents (every
// replica writes the same bytes; TestInPlaceSameBytes).
//
// Why readers still see whole nodes: a reader validates a node by its
// check word, a hash of every byte the node uses, and the slot changes
// only by the two copies at the end. A read that overlaps them copies a
// mix of the old and the new node, which hashes to neither check word
// but with probability 2^-64, so it is refused as torn and read again,
// as a read that overlapped the whole-image copy this replaces. The
// edits are made in scratch rather than in the slot so that the window in
// which the slot holds neither node stays one short copy: a writer
// preempted in the middle of its moves would otherwise leave the node
// unreadable for a whole time slice (TestRemoteReadsRacingWriter's
// readers gave up after 32 torn reads in a row when the moves were made
// in the slot). The stamp changes with the node, since scans validate it
// too (a leaf stamped after a scan's applied index is refused). The hash
// costs a few hundred nanoseconds per 4 KiB node; what the in-place path
// saves is the decode into slices and their allocations and the
// re-encode.

// inPlaceLeaf is the writer's view of a leaf's bytes for an in-place
// change: where the offsets and the entries start, and the entries' end.
type inPlaceLeaf struct {
	slot    []byte // the slot
	b       []byte // the writer's scratch, holding the slot's bytes
	n       Node
	offsPos int // the first offset's position in the slot
	entBase int // entry 0's first byte
	dataEnd int // the last entry's end
}

func (t *Tree) inPlace(id NodeID) (inPlaceLeaf, bool) { return t.inPlaceNode(id, true) }

// inPlaceNode is inPlace for a leaf (leaf true) or any node (false: an
// inner node's entries end at their keys).
func (t *Tree) inPlaceNode(id NodeID, leaf bool) (inPlaceLeaf, bool) {
	if t.knobs.noInPlace {
		return inPlaceLeaf{}, false
	}
	slot := t.a.bytes(id.Slot())
	used := int(leU16(slot[offUsed:]))
	if used > len(slot) {
		return inPlaceLeaf{}, false
	}
	b := t.scratch
	copy(b[:used], slot[:used])
	n, err := decodeOwn(b, id)
	if err != nil || leaf && !n.Leaf {
		return inPlaceLeaf{}, false
	}
	l := inPlaceLeaf{slot: slot, b: b, n: n}
	l.offsPos = hdrSize + 2 + len(n.Low) + 2 + len(n.High)
	l.entBase = l.offsPos + offSize*n.Count
	l.dataEnd = l.entBase
	if n.Count > 0 {
		last := int(leU16(n.offs[offSize*(n.Count-1):]))
		e, ok := n.entryAt(n.Count - 1)
		if !ok {
			return inPlaceLeaf{}, false
		}
		if n.Leaf {
			l.dataEnd = l.entBase + last + leafEnt + len(e.Key) + len(e.Value)
		} else {
			l.dataEnd = l.entBase + last + innerEnt + len(e.Key)
		}
	}
	return l, true
}

// relinkInPlace makes node id's left link prev, stamped stamp, changing
// only its header words and check word (a split's old right neighbour,
// whose entries stay): false if not done (noInPlace). The bytes are what
// loading the node, setting prev and stamp and encoding it would write.
func (t *Tree) relinkInPlace(id, prev NodeID, stamp uint64) bool {
	l, ok := t.inPlaceNode(id, false)
	if !ok {
		return false
	}
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	binary.LittleEndian.PutUint64(l.b[offPrev:], uint64(prev))
	used := (l.dataEnd + checkSize + 7) &^ 7
	t.seal(&l, used-checkSize, l.n.Count, l.dataEnd, stamp)
	return true
}

// addChildInPlace inserts into inner node id, stamped stamp, the entry
// (sep, right) just after the entry of its child left (a split of left
// moved the keys from sep on to right), if it fits: false (nothing
// changed) if it does not, if left's entry is not the one before sep's
// place, or with noInPlace. The bytes are what the image path (load,
// insert, encode) writes.
func (t *Tree) addChildInPlace(id, left NodeID, sep []byte, right NodeID, stamp uint64) bool {
	l, ok := t.inPlaceNode(id, false)
	if !ok || l.n.Leaf {
		return false
	}
	i, eq, ok := l.n.search(sep)
	if !ok || eq || i == 0 {
		return false
	}
	if e, fits := l.n.entryAt(i - 1); !fits || e.Child != left {
		return false
	}
	ns := innerEnt + len(sep)
	if (l.dataEnd+offSize+ns+checkSize+7)&^7 > len(l.b) {
		return false
	}
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	le := binary.LittleEndian
	p := l.openGap(i, ns)
	le.PutUint16(l.b[p:], uint16(len(sep)))
	le.PutUint64(l.b[p+2:], uint64(right))
	copy(l.b[p+innerEnt:], sep)
	m := t.takeMemo(id)
	t.seal(&l, l.offsPos+offSize*i, l.n.Count+1, l.dataEnd+offSize+ns, stamp)
	if m != nil && m.add(i, sep, right, t.knobs.memoAddAnyKey) {
		// The node's memo gains the entry too (a split of a leaf
		// under it would otherwise cost a new memo of every key).
		t.memos[id.Slot()] = m
	}
	return true
}

// off and setOff read and write offset i.
func (l *inPlaceLeaf) off(i int) int { return int(leU16(l.b[l.offsPos+offSize*i:])) }
func (l *inPlaceLeaf) setOff(i, v int) {
	binary.LittleEndian.PutUint16(l.b[l.offsPos+offSize*i:], uint16(v))
}

// seal writes the header words that change, zeroes the bytes between
// the entries' new end and the check word and those past the new used,
// writes the check word, and copies what changed into the slot: the
// header and the bytes from lo (the first the change moved or wrote) to
// the further of the old and the new used.
func (t *Tree) seal(l *inPlaceLeaf, lo, count, dataEnd int, stamp uint64) {
	le := binary.LittleEndian
	b := l.b
	oldUsed := int(leU16(b[offUsed:]))
	used := (dataEnd + checkSize + 7) &^ 7
	le.PutUint16(b[offCount:], uint16(count))
	le.PutUint16(b[offUsed:], uint16(used))
	if !t.knobs.inPlaceOldStamp {
		le.PutUint64(b[offStamp:], stamp)
	}
	clear(b[dataEnd : used-checkSize])
	if oldUsed > used {
		clear(b[used:oldUsed])
	}
	le.PutUint64(b[used-checkSize:], nodeCheck(b[:used-checkSize]))
	t.account(l.slot, l.n.ID, -1)
	t.dropMemo(l.n.ID.Slot())
	t.a.beginWrite(l.n.ID.Slot())
	copy(l.slot[:hdrSize], b[:hdrSize])
	copy(l.slot[lo:max(used, oldUsed)], b[lo:max(used, oldUsed)])
	t.a.endWrite()
	t.account(l.slot, l.n.ID, 1)
	if t.knobs.onWrite != nil {
		t.knobs.onWrite()
	}
}

// putInPlace stores key -> val in leaf id in place, if the leaf has room:
// handled false (nothing changed) if it must split. prev is the key's
// version before, when it existed. The writer's descent memo stays valid
// (no inner node changes).
func (t *Tree) putInPlace(id NodeID, key, val []byte, version, stamp uint64) (handled, existed bool, prev uint64) {
	l, ok := t.inPlace(id)
	if !ok {
		return false, false, 0
	}
	i, eq, ok := l.n.search(key)
	if !ok {
		return false, false, 0
	}
	le := binary.LittleEndian
	ns := leafEnt + len(key) + len(val)
	if eq {
		// Replace entry i-1: the entries after it move by the change in
		// size.
		i--
		pos := l.entBase + l.off(i)
		os := leafEnt + len(key) + int(le.Uint32(l.b[pos+2:]))
		d := ns - os
		if (l.dataEnd+d+checkSize+7)&^7 > len(l.b) {
			return false, false, 0
		}
		prev = le.Uint64(l.b[pos+6:])
		copy(l.b[pos+ns:], l.b[pos+os:l.dataEnd])
		le.PutUint32(l.b[pos+2:], uint32(len(val)))
		le.PutUint64(l.b[pos+6:], version)
		copy(l.b[pos+leafEnt+len(key):], val)
		for j := i + 1; j < l.n.Count; j++ {
			l.setOff(j, l.off(j)+d)
		}
		t.seal(&l, l.offsPos+offSize*(i+1), l.n.Count, l.dataEnd+d, stamp)
		t.pairs += snapPairSize(len(key), len(val)) - snapPairSize(len(key), os-leafEnt-len(key))
		return true, true, prev
	}
	// Insert at i: offsets i.. and entries ..i-1 move by one offset,
	// entries i.. by the offset and the new entry.
	if (l.dataEnd+offSize+ns+checkSize+7)&^7 > len(l.b) {
		return false, false, 0
	}
	p := l.openGap(i, ns)
	le.PutUint16(l.b[p:], uint16(len(key)))
	le.PutUint32(l.b[p+2:], uint32(len(val)))
	le.PutUint64(l.b[p+6:], version)
	copy(l.b[p+leafEnt:], key)
	copy(l.b[p+leafEnt+len(key):], val)
	t.seal(&l, l.offsPos+offSize*i, l.n.Count+1, l.dataEnd+offSize+ns, stamp)
	t.len++
	t.pairs += snapPairSize(len(key), len(val))
	return true, false, 0
}

// deleteInPlace removes key from leaf id in place when the leaf keeps
// another key (or is the root): handled false (nothing changed)
// otherwise, or when key is not there (found false).
func (t *Tree) deleteInPlace(id NodeID, key []byte, root bool, stamp uint64) (handled, found bool) {
	l, ok := t.inPlace(id)
	if !ok {
		return false, false
	}
	i, eq, ok := l.n.search(key)
	if !ok {
		return false, false
	}
	if !eq {
		return true, false
	}
	if l.n.Count == 1 && !root {
		return false, true
	}
	i--
	pos := l.entBase + l.off(i)
	os := leafEnt + len(key) + int(binary.LittleEndian.Uint32(l.b[pos+2:]))
	// Offsets i+1.. and entries ..i-1 move down by one offset, entries
	// i+1.. by the offset and the removed entry.
	copy(l.b[l.offsPos+offSize*i:], l.b[l.offsPos+offSize*(i+1):pos])
	copy(l.b[pos-offSize:], l.b[pos+os:l.dataEnd])
	for j := i; j < l.n.Count-1; j++ {
		l.setOff(j, l.off(j)-os)
	}
	t.seal(&l, l.offsPos+offSize*i, l.n.Count-1, l.dataEnd-offSize-os, stamp)
	t.len--
	t.pairs -= snapPairSize(len(key), os-leafEnt-len(key))
	return true, true
}

// splitInsert inserts key -> val (a key leaf path[last] does not hold,
// which has no room for it) by splitting the leaf as store does, but
// builds the two halves from the leaf's bytes: entries are copied as they
// are, not decoded into an image and encoded again. The writes, their
// order and their bytes are store's (TestInPlaceSameBytes): the new right
// node, the leaf, the old right neighbour's link, the parent (or a new
// root). False (nothing changed) with noInPlace, or for a key the leaf
// holds.
func (t *Tree) splitInsert(path []NodeID, key, val []byte, version, stamp uint64) bool {
	id := path[len(path)-1]
	l, ok := t.inPlace(id)
	if !ok {
		return false
	}
	i, eq, ok := l.n.search(key)
	if !ok || eq || (l.dataEnd+offSize+leafEnt+len(key)+len(val)+checkSize+7)&^7 <= t.cfg.NodeSize {
		return false // (putInPlace inserts what fits)
	}
	le := binary.LittleEndian
	ne := slices.Grow(t.entBuf[:0], leafEnt+len(key)+len(val))[:leafEnt]
	le.PutUint16(ne, uint16(len(key)))
	le.PutUint32(ne[2:], uint32(len(val)))
	le.PutUint64(ne[6:], version)
	ne = append(append(ne, key...), val...)
	t.entBuf = ne
	old := func(k int) []byte {
		end := l.dataEnd
		if k+1 < l.n.Count {
			end = l.entBase + l.off(k+1)
		}
		return l.b[l.entBase+l.off(k) : end]
	}
	ent := func(j int) []byte {
		switch {
		case j < i:
			return old(j)
		case j == i:
			return ne
		}
		return old(j - 1)
	}
	keyOf := func(j int) []byte {
		e := ent(j)
		return e[leafEnt : leafEnt+int(le.Uint16(e))]
	}
	count := l.n.Count + 1
	at := t.cutAt(count, func(j int) int { return offSize + len(ent(j)) }, keyOf, l.n.Next == 0, len(l.n.Low), len(l.n.High))
	sep := slices.Clone(keyOf(at))
	rid := t.a.alloc()
	if t.img == nil {
		t.img = make([]byte, t.cfg.NodeSize)
	}
	right := func() {
		encodeLeaf(t.img, rid, stamp, l.n.Next, id, l.n.HighInf, sep, l.n.High, at, count, ent)
		t.install(rid, t.img)
	}
	left := func() {
		encodeLeaf(t.img, id, stamp, rid, l.n.Prev, false, l.n.Low, sep, 0, at, ent)
		t.install(id, t.img)
	}
	if t.knobs.linkBeforeNode {
		left()
		right()
	} else {
		right()
		left()
	}
	next := l.n.Next // l's bytes are reused by what follows
	t.len++
	t.pairs += snapPairSize(len(key), len(val))
	t.use.LeafSplits++
	if next != 0 && !t.relinkInPlace(next, rid, stamp) {
		nb := t.load(next)
		nb.prev, nb.stamp = rid, stamp
		t.write(nb)
	}
	if len(path) == 1 {
		root := &image{id: t.a.alloc(), stamp: stamp, level: 1, highInf: true,
			keys: [][]byte{nil, sep}, kids: []NodeID{id, rid}}
		t.write(root)
		t.root = root.id
		return true
	}
	if t.addChildInPlace(path[len(path)-2], id, sep, rid, stamp) {
		return true
	}
	parent := t.load(path[len(path)-2])
	pi := slices.Index(parent.kids, id)
	if pi < 0 {
		panic(fmt.Sprintf("btree: node %v is not a child of %v", id, parent.id))
	}
	parent.keys = slices.Insert(parent.keys, pi+1, sep)
	parent.kids = slices.Insert(parent.kids, pi+1, rid)
	parent.stamp = stamp
	t.store(parent, path[:len(path)-1], stamp)
	return true
}

// encodeLeaf writes into dst the sealed image of leaf id with entries
// ent(from) .. ent(to-1) (each entry's bytes as they lie in a node), as
// image.encode writes the same leaf.
func encodeLeaf(dst []byte, id NodeID, stamp uint64, next, prev NodeID, highInf bool, low, high []byte, from, to int, ent func(int) []byte) {
	le := binary.LittleEndian
	le.PutUint64(dst[offID:], uint64(id))
	le.PutUint64(dst[offStamp:], stamp)
	le.PutUint64(dst[offNext:], uint64(next))
	le.PutUint64(dst[offPrev:], uint64(prev))
	le.PutUint16(dst[offLevel:], 0)
	le.PutUint16(dst[offCount:], uint16(to-from))
	f := uint16(flagLeaf)
	if highInf {
		f |= flagHighInf
		high = nil
	}
	le.PutUint16(dst[offFlags:], f)
	p := putBytes(dst, hdrSize, low)
	p = putBytes(dst, p, high)
	offs := p
	p += offSize * (to - from)
	base := p
	for j := from; j < to; j++ {
		le.PutUint16(dst[offs+offSize*(j-from):], uint16(p-base))
		p += copy(dst[p:], ent(j))
	}
	used := (p + checkSize + 7) &^ 7
	clear(dst[p : used-checkSize])
	le.PutUint16(dst[offUsed:], uint16(used))
	le.PutUint64(dst[used-checkSize:], nodeCheck(dst[:used-checkSize]))
	clear(dst[used:])
}

// openGap makes room in l's image for a new entry of ns bytes at index i
// (its offset slot and its bytes: entries i.. move right by the slot and
// the entry) and returns where the entry's bytes go. The caller checked
// that the node has room.
func (l *inPlaceLeaf) openGap(i, ns int) int {
	rel := l.dataEnd - l.entBase // the new entry's offset
	if i < l.n.Count {
		rel = l.off(i)
	}
	pos := l.entBase + rel
	copy(l.b[pos+offSize+ns:], l.b[pos:l.dataEnd])
	copy(l.b[l.offsPos+offSize*(i+1):], l.b[l.offsPos+offSize*i:pos])
	l.setOff(i, rel)
	for j := i + 1; j <= l.n.Count; j++ {
		l.setOff(j, l.off(j)+ns)
	}
	return pos + offSize
}
