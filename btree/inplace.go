package btree

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// In-place changes of a node (the common apply: a put that fits in its
// leaf, a delete that leaves the leaf some key, a separator added to a
// parent, a neighbour's new left link). Instead of decoding the node into
// an image of slices and encoding it whole, the writer builds in its
// scratch only the header and the bytes from the first that change on
// (layout.go, layout 2): an insert appends its entry after the last
// entry written, so that is the entry, the offsets (in key order, one
// more) and the check word; a delete or a resize moves the entries
// written after the changed one. The check word is a hash over the whole
// node, computed over the new header, the slot's bytes that stay and the
// new bytes, without copying the slot (seal). Then the writer copies
// into the slot the header and the new bytes. The contents are what
// encode writes for the same entries (TestInPlaceSameBytes); the order
// the entries lie in is the order they were written, which every replica
// repeats.
//
// Why readers still see whole nodes: a reader validates a node by its
// check word, a hash of every byte the node uses, and the slot changes
// only by the copies at the end. A read that overlaps them copies a mix
// of the old and the new node, which hashes to neither check word but
// with probability 2^-64, so it is refused as torn and read again, as a
// read that overlapped the whole-image copy this replaces. The new bytes
// are built in scratch rather than in the slot so that the window in
// which the slot holds neither node stays one short copy: a writer
// preempted in the middle of its moves would otherwise leave the node
// unreadable for a whole time slice (TestRemoteReadsRacingWriter's
// readers gave up after 32 torn reads in a row when the moves were made
// in the slot). The stamp changes with the node, since scans validate it
// too (a leaf stamped after a scan's applied index is refused).

// inPlaceLeaf is the writer's view of a node's bytes for an in-place
// change: the slot, where the entries and the offsets start, and the end
// of the last entry written.
type inPlaceLeaf struct {
	slot    []byte // the slot
	n       Node   // its view (aliasing the slot)
	used    int
	entBase int // entry 0's region: the first byte after the fences
	offsPos int // the first offset's position
	dataEnd int // the end of the entries (the last one written)
}

func (t *Tree) inPlace(id NodeID) (inPlaceLeaf, bool) { return t.inPlaceNode(id, true) }

// inPlaceNode is inPlace for a leaf (leaf true) or any node (false). It
// copies the slot's header into scratch, where the change is made.
func (t *Tree) inPlaceNode(id NodeID, leaf bool) (inPlaceLeaf, bool) {
	if t.knobs.noInPlace {
		return inPlaceLeaf{}, false
	}
	slot := t.a.bytes(id.Slot())
	n, err := decodeOwn(slot, id)
	if err != nil || leaf && !n.Leaf {
		return inPlaceLeaf{}, false
	}
	l := inPlaceLeaf{slot: slot, n: n, used: int(leU16(slot[offUsed:]))}
	l.entBase = hdrSize + 2 + len(n.Low) + 2 + len(n.High)
	l.offsPos = l.used - checkSize - offSize*n.Count
	l.dataEnd = l.entBase
	// The entry written last is the one at the highest offset.
	last := -1
	for i := range n.Count {
		last = max(last, int(leU16(n.offs[offSize*i:])))
	}
	if last >= 0 {
		if last > len(n.ents) {
			return inPlaceLeaf{}, false
		}
		_, size, ok := entryFrom(n.ents[last:], n.Leaf)
		if !ok {
			return inPlaceLeaf{}, false
		}
		l.dataEnd = l.entBase + last + size
	}
	copy(t.scratch[:hdrSize], slot[:hdrSize])
	return l, true
}

// off is offset i (key rank i) as the slot holds it.
func (l *inPlaceLeaf) off(i int) int { return int(leU16(l.slot[l.offsPos+offSize*i:])) }

// size is the size of the entry at offset o.
func (l *inPlaceLeaf) size(o int) int {
	_, s, _ := entryFrom(l.slot[l.entBase+o:l.dataEnd], l.n.Leaf)
	return s
}

// relinkInPlace makes node id's left link prev, stamped stamp, changing
// only its header words and check word (a split's old right neighbour,
// whose entries stay): false if not done (noInPlace). The contents are
// what loading the node, setting prev and stamp and encoding it would
// write.
func (t *Tree) relinkInPlace(id, prev NodeID, stamp uint64) bool {
	l, ok := t.inPlaceNode(id, false)
	if !ok {
		return false
	}
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	binary.LittleEndian.PutUint64(t.scratch[offPrev:], uint64(prev))
	t.seal(&l, l.used-checkSize, l.used-checkSize, l.n.Count, l.used, stamp)
	return true
}

// addChildInPlace inserts into inner node id, stamped stamp, the entry
// (sep, right) just after the entry of its child left (a split of left
// moved the keys from sep on to right), if it fits: false (nothing
// changed) if it does not, if left's entry is not the one before sep's
// place, or with noInPlace. The contents are what the image path (load,
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
	if used, _ := tailAt(l.dataEnd+ns, l.n.Count+1); used > len(l.slot) {
		return false
	}
	t.memoOK = t.memoOK && t.knobs.keepDescentMemo
	t.shape++
	le := binary.LittleEndian
	b := t.scratch
	p := l.dataEnd
	le.PutUint16(b[p:], uint16(len(sep)))
	le.PutUint64(b[p+2:], uint64(right))
	copy(b[p+innerEnt:], sep)
	t.appendSeal(&l, i, ns, stamp)
	return true
}

// appendSeal seals the insert of the entry of ns bytes that the caller
// wrote in scratch at l.dataEnd, at key rank i: the entries stay, the
// offsets gain the new entry's at rank i.
func (t *Tree) appendSeal(l *inPlaceLeaf, i, ns int, stamp uint64) {
	b := t.scratch
	count := l.n.Count + 1
	end := l.dataEnd + ns
	used, offs := tailAt(end, count)
	clear(b[end:offs])
	old := l.slot[l.offsPos : l.offsPos+offSize*l.n.Count]
	copy(b[offs:], old[:offSize*i])
	binary.LittleEndian.PutUint16(b[offs+offSize*i:], uint16(l.dataEnd-l.entBase))
	copy(b[offs+offSize*(i+1):], old[offSize*i:])
	t.seal(l, l.dataEnd, used-checkSize, count, used, stamp)
}

// seal finishes an in-place change. The new node is scratch's header,
// the slot's bytes [hdrSize, lo), scratch's [lo, hi), the slot's [hi,
// used-8) (only when used is the slot's: the tail stays), and the check
// word. seal writes count, used and stamp into scratch's header, the
// check word into scratch, and copies into the slot the header, [lo, hi)
// and the check word, and zeroes what the slot no longer uses.
//
// The check word (nodeCheck: a sum of the hashes of 128-byte segments)
// is the slot's old one with the old hashes of the segments the change
// wrote taken out and their new ones put in (checkAfter): the header's
// segment and those from lo's on. The segments before lo are not read,
// which is what the layout is for: an insert writes its entry, the
// offsets and the check word at the end of the node, so it reads and
// hashes a few segments, not the leaf.
func (t *Tree) seal(l *inPlaceLeaf, lo, hi, count, used int, stamp uint64) {
	le := binary.LittleEndian
	b := t.scratch
	le.PutUint16(b[offCount:], uint16(count))
	le.PutUint16(b[offUsed:], uint16(used))
	if !t.knobs.inPlaceOldStamp {
		le.PutUint64(b[offStamp:], stamp)
	}
	end := used - checkSize
	if t.knobs.sealWhole || hi < end && used != l.used {
		copy(b[hdrSize:lo], l.slot[hdrSize:lo])
		copy(b[hi:end], l.slot[hi:end])
		le.PutUint64(b[end:], nodeCheck(b[:end]))
	} else {
		le.PutUint64(b[end:], t.checkAfter(l, lo, hi, end))
	}
	t.account(l.slot, l.n.ID, -1)
	t.a.beginWrite(l.n.ID.Slot())
	copy(l.slot[:hdrSize], b[:hdrSize])
	copy(l.slot[lo:hi], b[lo:hi])
	copy(l.slot[end:used], b[end:used])
	if l.used > used {
		clear(l.slot[used:l.used])
	}
	t.a.endWrite()
	t.account(l.slot, l.n.ID, 1)
	if t.knobs.onWrite != nil {
		t.knobs.onWrite()
	}
}

// checkAfter is the check word of seal's new node (hashed bytes [0,
// end)) from the slot's old one: the segments that changed are the
// header's (0) and those from lo's on, to hi's when the tail stays
// (end is the old one's: hi < end), else to the end of the old node
// (their old hashes) and of the new one (their new hashes).
func (t *Tree) checkAfter(l *inPlaceLeaf, lo, hi, end int) uint64 {
	const S = segSize
	oldEnd := l.used - checkSize
	sum := binary.LittleEndian.Uint64(l.slot[oldEnd:]) ^ checkTag
	k0 := lo / S
	if t.knobs.sealSkipLoSegment {
		k0++
	}
	oldK, newK := (oldEnd+S-1)/S, (end+S-1)/S
	if hi < end {
		oldK = (hi + S - 1) / S
		newK = oldK
	}
	if k0 > 0 {
		sum -= segHash(0, l.slot[:min(S, oldEnd)])
		sum += segHash(0, t.newBytes(l, 0, min(S, end), lo, hi))
	}
	for k := k0; k < oldK; k++ {
		sum -= segHash(k, l.slot[k*S:min(oldEnd, (k+1)*S)])
	}
	for k := k0; k < newK; k++ {
		sum += segHash(k, t.newBytes(l, k*S, min(end, (k+1)*S), lo, hi))
	}
	return sum ^ checkTag
}

// newBytes is seal's new node's bytes [from, to) (at most a segment),
// gathered from its pieces: scratch's header, the slot's bytes up to lo,
// scratch's [lo, hi), the slot's after.
func (t *Tree) newBytes(l *inPlaceLeaf, from, to, lo, hi int) []byte {
	if from >= lo && to <= hi {
		return t.scratch[from:to]
	}
	d := t.segBuf[:to-from]
	for p := from; p < to; {
		src, e := l.slot, to
		switch {
		case p < hdrSize:
			src, e = t.scratch, hdrSize
		case p < lo:
			e = lo
		case p < hi:
			src, e = t.scratch, hi
		}
		e = min(e, to)
		copy(d[p-from:], src[p:e])
		p = e
	}
	return d
}

// moveSeal seals a change that replaces the entry at offset rel (key
// rank i) and the entries written after it: scratch holds at
// entBase+rel the replacement (ns bytes; 0 for a delete, whose rank i
// then leaves the offsets), the caller having left the room; moveSeal
// copies the later entries after it, shifted by ns - os (os: the old
// entry's size), and writes the offsets, shifted alike.
func (t *Tree) moveSeal(l *inPlaceLeaf, i, rel, os, ns int, del bool, stamp uint64) bool {
	b := t.scratch
	pos := l.entBase + rel
	d := ns - os
	end := l.dataEnd + d
	count := l.n.Count
	if del {
		count--
	}
	used, offs := tailAt(end, count)
	if used > len(l.slot) {
		return false
	}
	copy(b[pos+ns:end], l.slot[pos+os:l.dataEnd])
	clear(b[end:offs])
	le := binary.LittleEndian
	k := offs
	for j := range l.n.Count {
		o := l.off(j)
		if j == i && del {
			continue
		}
		if o > rel {
			o += d
		}
		le.PutUint16(b[k:], uint16(o))
		k += offSize
	}
	t.seal(l, pos, used-checkSize, count, used, stamp)
	return true
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
	b := t.scratch
	ns := leafEnt + len(key) + len(val)
	entry := func(p int) {
		le.PutUint16(b[p:], uint16(len(key)))
		le.PutUint32(b[p+2:], uint32(len(val)))
		le.PutUint64(b[p+6:], version)
		copy(b[p+leafEnt:], key)
		copy(b[p+leafEnt+len(key):], val)
	}
	if eq {
		// Replace the entry of rank i-1: in its place when the size
		// stays, else the entries written after it move.
		i--
		rel := l.off(i)
		pos := l.entBase + rel
		os := l.size(rel)
		if ns > os {
			if used, _ := tailAt(l.dataEnd+ns-os, l.n.Count); used > len(l.slot) {
				return false, false, 0
			}
		}
		prev = le.Uint64(l.slot[pos+6:])
		entry(pos)
		if ns == os {
			t.seal(&l, pos, pos+ns, l.n.Count, l.used, stamp)
		} else if !t.moveSeal(&l, i, rel, os, ns, false, stamp) {
			return false, false, 0
		}
		t.pairs += snapPairSize(len(key), len(val)) - snapPairSize(len(key), os-leafEnt-len(key))
		return true, true, prev
	}
	// Insert at rank i: the entry goes after the last one written.
	if used, _ := tailAt(l.dataEnd+ns, l.n.Count+1); used > len(l.slot) {
		return false, false, 0
	}
	entry(l.dataEnd)
	t.appendSeal(&l, i, ns, stamp)
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
	rel := l.off(i)
	os := l.size(rel)
	t.moveSeal(&l, i, rel, os, 0, true, stamp)
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
	var err error
	i, eq, ok := l.n.search(key)
	if used, _ := tailAt(l.dataEnd+leafEnt+len(key)+len(val), l.n.Count+1); !ok || eq || used <= t.cfg.NodeSize {
		return false // (putInPlace inserts what fits)
	}
	// The halves are built from a copy of the leaf: the leaf's slot is
	// written before the right half when linkBeforeNode.
	b := t.scratch
	copy(b[:l.used], l.slot[:l.used])
	l.slot = b[:len(l.slot)]
	if l.n, err = decodeOwn(l.slot, id); err != nil {
		return false
	}
	le := binary.LittleEndian
	ne := slices.Grow(t.entBuf[:0], leafEnt+len(key)+len(val))[:leafEnt]
	le.PutUint16(ne, uint16(len(key)))
	le.PutUint32(ne[2:], uint32(len(val)))
	le.PutUint64(ne[6:], version)
	ne = append(append(ne, key...), val...)
	t.entBuf = ne
	old := func(k int) []byte {
		o := l.off(k)
		return l.slot[l.entBase+o : l.entBase+o+l.size(o)]
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
	for j := from; j < to; j++ {
		p += copy(dst[p:], ent(j))
	}
	used, offs := tailAt(p, to-from)
	clear(dst[p:offs])
	for j, o := from, 0; j < to; j++ {
		le.PutUint16(dst[offs+offSize*(j-from):], uint16(o))
		o += len(ent(j))
	}
	seal(dst, used)
}
