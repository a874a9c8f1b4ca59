package btree

import "encoding/binary"

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

func (t *Tree) inPlace(id NodeID) (inPlaceLeaf, bool) {
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
	if err != nil || !n.Leaf {
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
		l.dataEnd = l.entBase + last + leafEnt + len(e.Key) + len(e.Value)
	}
	return l, true
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
	copy(l.slot[:hdrSize], b[:hdrSize])
	copy(l.slot[lo:max(used, oldUsed)], b[lo:max(used, oldUsed)])
	if t.knobs.onWrite != nil {
		t.knobs.onWrite()
	}
}

// putInPlace stores key -> val in leaf id in place, if the leaf has room:
// handled false (nothing changed) if it must split. The writer's descent
// memo stays valid (no inner node changes).
func (t *Tree) putInPlace(id NodeID, key, val []byte, version, stamp uint64) (handled, existed bool) {
	l, ok := t.inPlace(id)
	if !ok {
		return false, false
	}
	i, eq, ok := l.n.search(key)
	if !ok {
		return false, false
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
			return false, false
		}
		copy(l.b[pos+ns:], l.b[pos+os:l.dataEnd])
		le.PutUint32(l.b[pos+2:], uint32(len(val)))
		le.PutUint64(l.b[pos+6:], version)
		copy(l.b[pos+leafEnt+len(key):], val)
		for j := i + 1; j < l.n.Count; j++ {
			l.setOff(j, l.off(j)+d)
		}
		t.seal(&l, l.offsPos+offSize*(i+1), l.n.Count, l.dataEnd+d, stamp)
		return true, true
	}
	// Insert at i: offsets i.. and entries ..i-1 move by one offset,
	// entries i.. by the offset and the new entry.
	if (l.dataEnd+offSize+ns+checkSize+7)&^7 > len(l.b) {
		return false, false
	}
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
	p := pos + offSize
	le.PutUint16(l.b[p:], uint16(len(key)))
	le.PutUint32(l.b[p+2:], uint32(len(val)))
	le.PutUint64(l.b[p+6:], version)
	copy(l.b[p+leafEnt:], key)
	copy(l.b[p+leafEnt+len(key):], val)
	t.seal(&l, l.offsPos+offSize*i, l.n.Count+1, l.dataEnd+offSize+ns, stamp)
	t.len++
	return true, false
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
	return true, true
}
