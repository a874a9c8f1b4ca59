package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/zeebo/xxh3"
)

// Every byte of a tree node that another process reads is declared here,
// once, with one function each way (docs/dev/btree-plan.md, section 2).
//
// A node is NodeSize bytes in a slot of the group's node arena. A new
// node is built in a scratch image, sealed, then copied into its slot; a
// change of one entry (inplace.go) writes the header, the bytes from the
// change on and the check word. Either way a reader sees a sealed node or
// bytes whose check word does not match. Layout 2 (layout 1, before,
// kept the entries in key order and the offsets before them, so an
// insert moved every entry):
//
//	0      8       16      24      32       34       36      38      40
//	[id   ][stamp ][next  ][prev  ][level  ][count  ][used  ][flags ]
//	40: [low len u16][low fence][high len u16][high fence]
//	    [entry][entry] ... (count entries, back to back, in the order
//	                        they were written)
//	    [zero padding, 0 to 7 bytes]
//	    [off 0 u16] ... [off count-1 u16]  (in key order)
//	    [check u64]                        (ends at used)
//	    zero to NodeSize
//
//	id     the node's id: arena slot (low 32 bits) and the slot's
//	       incarnation (high 32 bits, bumped each time the slot is freed),
//	       so a reader that followed an old pointer never accepts another
//	       node's bytes; 0 is no node
//	stamp  the index of the last apply that wrote this node
//	next   the right sibling on the same level (B-link), 0 at the right end
//	prev   the left sibling on the same level, 0 at the left end
//	level  0 for leaves, parents one more than their children
//	count  the number of entries
//	used   the bytes from 0 to the end of the check word (8-aligned)
//	flags  bit 0 leaf, bit 1 high fence is +inf, bit 2 dead (the slot was
//	       freed: a reader holding a pointer to it must look again)
//	fences the node holds keys k with low <= k < high (bytes.Compare);
//	       the lowest node of a level has the empty low fence
//	entry  the entries tile the bytes from the end of the high fence to
//	       the padding, with no gap, but in no particular order: an
//	       insert appends its entry after the last one written (a split
//	       and the whole-image path write them in key order)
//	off    where the entry of key rank i starts, counted from the first
//	       entry's first byte: the offsets are in key order, so a search
//	       bisects them (Find, ChildFor) and an iteration follows them.
//	       They sit at the end, just before the check word, at a place
//	       used and count give (used - 8 - 2*count), so an insert rewrites
//	       only its entry, the offsets and the check word, not the
//	       entries. Decode checks that the offsets are the entries'
//	       starts, each once, in key order. Replicas apply the same
//	       changes in the same order, so they still write the same bytes
//	check  of bytes [0, used-8), cut into segments of 128 bytes: the sum
//	       of each segment's XXH3 (64 bits, seeded by the segment's
//	       index), xor checkTag: nodeCheck. A change re-hashes only the
//	       segments it writes (the header's and those from its first
//	       byte on)
//
// Leaf entry:
//
//	[klen u16][vlen u32][version u64][key][value]
//
//	version  the version of the write that stored the value (kv's: entry
//	         index << 16 | op number), for compare-and-swap
//
// Inner entry; child i (of the entry of key rank i) holds [key i, key
// i+1), the last child up to the node's high fence, and key 0 equals the
// low fence:
//
//	[klen u16][child id u64][key]
const (
	offID    = 0
	offStamp = 8
	offNext  = 16
	offPrev  = 24
	offLevel = 32
	offCount = 34
	offUsed  = 36
	offFlags = 38
	hdrSize  = 40

	checkSize = 8
	leafEnt   = 14 // klen u16 + vlen u32 + version u64
	innerEnt  = 10 // klen u16 + child u64
	offSize   = 2  // an entry's offset (off i), besides its entry

	// checkTag is xored into every node's check word (layout 2): a
	// reader of layout 1 (offsets before the entries) finds no node's
	// check word right and reads every node as torn, never as entries it
	// would misplace; its last byte, 3, marks the check word made of
	// segments (a reader of one XXH3 over the node sees every node torn
	// too).
	checkTag = 0x4c41594f55543203 // "LAYOUT2\x03" (big-endian)

	// segSize is the bytes of a check word's segment (nodeCheck): 128,
	// XXH3's cheapest length range for more than a few words (17-128
	// bytes), two cache lines.
	segSize = 128
	// segSeed spreads the segments' seeds (index+1 times an odd
	// constant, XXH3's PRIME64_1).
	segSeed = 0x9E3779B185EBCA87

	flagLeaf    = 1
	flagHighInf = 2
	flagDead    = 4

	// MinNodeSize and MaxNodeSize bound Config.NodeSize.
	MinNodeSize = 256
	MaxNodeSize = 32 << 10
)

// NodeID names a node: its arena slot and the slot's incarnation.
type NodeID uint64

func makeID(slot, inc uint32) NodeID { return NodeID(uint64(inc)<<32 | uint64(slot)) }

// Slot is the arena slot of the node.
func (id NodeID) Slot() uint32 { return uint32(id) }

// Inc is the incarnation of the slot the id names.
func (id NodeID) Inc() uint32 { return uint32(id >> 32) }

func (id NodeID) String() string { return fmt.Sprintf("%d.%d", id.Slot(), id.Inc()) }

// Errors of node validation. A reader that gets one of them reads again
// (ErrTorn, ErrNotNode), moves right, or looks one level up (ErrStale);
// it never answers from the node.
var (
	// ErrTorn: the check word does not match the bytes (a read that
	// overlapped a write, or corruption).
	ErrTorn = errors.New("btree: node check failed (torn or corrupt read)")
	// ErrNotNode: the slot does not hold the node the pointer named (it
	// was freed or reused since).
	ErrNotNode = errors.New("btree: slot holds another node")
	// ErrMalformed: the bytes pass the check but do not decode (a bug in
	// the writer, never a race).
	ErrMalformed = errors.New("btree: malformed node")
)

// Node is a decoded, validated view of a node image. Its slices alias the
// bytes it was decoded from.
type Node struct {
	ID      NodeID
	Stamp   uint64
	Next    NodeID
	Prev    NodeID
	Level   int
	Leaf    bool
	HighInf bool
	Dead    bool
	Low     []byte
	High    []byte // meaningless when HighInf
	Count   int
	offs    []byte // the entries' offsets, u16 each, in key order
	ents    []byte // the entries, as written, and the padding after them
}

// Decode validates b as the image of node want (want 0 accepts any id)
// and returns its view: the check word, the id, the header, the fences,
// and every entry (lengths in bounds, keys sorted and inside the fences,
// zero padding). It never panics on any input. Readers on the hot path use
// decodeRead, which trusts the check word for the entries (the writer
// sealed them; Check and the fuzz targets hold the writer to Decode).
func Decode(b []byte, want NodeID) (Node, error) {
	n, err := decodeRead(b, want)
	if err != nil {
		return n, err
	}
	// Walk the entries as they lie: every length in bounds, count of
	// them, then only the zero padding (less than 8 bytes) before the
	// offsets.
	starts := make([]int, 0, n.Count)
	pit := physIter{leaf: n.Leaf, left: n.Count, rest: n.ents}
	for range n.Count {
		starts = append(starts, len(n.ents)-len(pit.rest))
		if !pit.next() {
			return n, ErrMalformed
		}
	}
	if len(pit.rest) >= 8 {
		return n, ErrMalformed
	}
	for _, c := range pit.rest {
		if c != 0 {
			return n, ErrMalformed
		}
	}
	// Then in key order, through the offsets: each the start of an
	// entry, the keys strictly rising (so no entry twice: with count
	// offsets, each entry once), inside the fences.
	var prev []byte
	for i := 0; i < n.Count; i++ {
		if _, at := slices.BinarySearch(starts, int(leU16(n.offs[offSize*i:]))); !at && !plantedDecodeAnyOffsets {
			return n, ErrMalformed // an offset into the middle of an entry
		}
		e, ok := n.entryAt(i)
		if !ok {
			return n, ErrMalformed
		}
		if i > 0 && string(e.Key) <= string(prev) {
			return n, ErrMalformed
		}
		if !n.Leaf && i == 0 && string(e.Key) != string(n.Low) {
			return n, ErrMalformed
		}
		if string(e.Key) < string(n.Low) || (!n.HighInf && string(e.Key) >= string(n.High)) {
			return n, ErrMalformed
		}
		prev = e.Key
	}
	return n, nil
}

// decodeRead is Decode without the walk over the entries: the check word,
// id, header and fences. Its entries are still read with bounds checks
// (an iterator stops at Count or at the first entry that does not fit),
// so no input makes it or the iteration panic.
func decodeRead(b []byte, want NodeID) (Node, error) { return decodeHeader(b, want, true) }

// decodeOwn is decodeRead without the check word: the writer's view of its
// own nodes (only it writes them, and never while it reads them), which
// the apply path reads several times per write. Tree.Check validates them.
func decodeOwn(b []byte, want NodeID) (Node, error) { return decodeHeader(b, want, false) }

func decodeHeader(b []byte, want NodeID, check bool) (Node, error) {
	var n Node
	if len(b) < hdrSize+4+checkSize {
		return n, ErrTorn
	}
	used := int(binary.LittleEndian.Uint16(b[offUsed:]))
	if used == 0 && want != 0 {
		// A slot this replica never wrote (or zeroed): no node, and no
		// torn one that a read again would fix. A cached pointer into
		// another replica's tree names such slots after a leader change
		// to a replica whose tree was restored (bulk-loaded: its own
		// node ids): as a freed node, the walk drops the cached node
		// that named it (read again, ErrTorn, it looped until the call
		// gave up, every call).
		return n, ErrNotNode
	}
	if used < hdrSize+4+checkSize || used > len(b) || used%8 != 0 {
		return n, ErrTorn
	}
	if check && nodeCheck(b[:used-checkSize]) != binary.LittleEndian.Uint64(b[used-checkSize:]) {
		return n, ErrTorn
	}
	n.ID = NodeID(binary.LittleEndian.Uint64(b[offID:]))
	if want != 0 && n.ID != want {
		return n, ErrNotNode
	}
	n.Stamp = binary.LittleEndian.Uint64(b[offStamp:])
	n.Next = NodeID(binary.LittleEndian.Uint64(b[offNext:]))
	n.Prev = NodeID(binary.LittleEndian.Uint64(b[offPrev:]))
	n.Level = int(binary.LittleEndian.Uint16(b[offLevel:]))
	n.Count = int(binary.LittleEndian.Uint16(b[offCount:]))
	f := binary.LittleEndian.Uint16(b[offFlags:])
	n.Leaf = f&flagLeaf != 0
	n.HighInf = f&flagHighInf != 0
	n.Dead = f&flagDead != 0
	if n.Leaf != (n.Level == 0) || (!n.Leaf && n.Count == 0) {
		return n, ErrMalformed
	}
	body := b[hdrSize : used-checkSize]
	var ok bool
	if n.Low, body, ok = fence(body); !ok {
		return n, ErrMalformed
	}
	if n.High, body, ok = fence(body); !ok {
		return n, ErrMalformed
	}
	if len(body) < offSize*n.Count {
		return n, ErrMalformed
	}
	k := len(body) - offSize*n.Count
	n.ents, n.offs = body[:k], body[k:]
	return n, nil
}

func fence(b []byte) (f, rest []byte, ok bool) {
	if len(b) < 2 {
		return nil, nil, false
	}
	l := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+l {
		return nil, nil, false
	}
	return b[2 : 2+l], b[2+l:], true
}

// Covers reports whether key lies inside the node's fences.
func (n *Node) Covers(key []byte) bool {
	return string(key) >= string(n.Low) && (n.HighInf || string(key) < string(n.High))
}

// Entry is one entry of a node: a key and, in a leaf, its value, in an
// inner node the child holding [Key, next entry's Key).
type Entry struct {
	Key     []byte
	Value   []byte
	Version uint64 // leaves: the version of the write that stored Value
	Child   NodeID
}

// Entries iterates the node's entries in key order.
func (n *Node) Entries() EntryIter {
	return EntryIter{leaf: n.Leaf, left: n.Count, offs: n.offs, ents: n.ents}
}

// EntryIter walks a node's entries in key order, through the offsets.
type EntryIter struct {
	leaf bool
	left int    // entries not yet returned
	offs []byte // the offsets not yet followed
	ents []byte
}

// Next returns the next entry, false at the end.
func (it *EntryIter) Next() (Entry, bool) { return it.next() }

func (it *EntryIter) next() (Entry, bool) {
	if it.left <= 0 || len(it.offs) < offSize {
		return Entry{}, false
	}
	it.left--
	o := int(leU16(it.offs))
	it.offs = it.offs[offSize:]
	if o > len(it.ents) {
		return Entry{}, false
	}
	e, _, ok := entryFrom(it.ents[o:], it.leaf)
	return e, ok
}

// entryFrom decodes the entry at the start of b and its size, false if
// it does not fit in b.
func entryFrom(b []byte, leaf bool) (e Entry, size int, ok bool) {
	if leaf {
		if len(b) < leafEnt {
			return e, 0, false
		}
		kl := int(binary.LittleEndian.Uint16(b))
		vl := int(binary.LittleEndian.Uint32(b[2:]))
		if vl < 0 || len(b)-leafEnt < kl || len(b)-leafEnt-kl < vl {
			return e, 0, false
		}
		e.Version = binary.LittleEndian.Uint64(b[6:])
		e.Key = b[leafEnt : leafEnt+kl]
		e.Value = b[leafEnt+kl : leafEnt+kl+vl]
		return e, leafEnt + kl + vl, true
	}
	if len(b) < innerEnt {
		return e, 0, false
	}
	kl := int(binary.LittleEndian.Uint16(b))
	if len(b)-innerEnt < kl {
		return e, 0, false
	}
	e.Child = NodeID(binary.LittleEndian.Uint64(b[2:]))
	e.Key = b[innerEnt : innerEnt+kl]
	return e, innerEnt + kl, true
}

// physIter walks a node's entries as they lie (Decode's walk).
type physIter struct {
	leaf bool
	left int
	rest []byte
}

func (it *physIter) next() bool {
	if it.left <= 0 {
		return false
	}
	it.left--
	_, size, ok := entryFrom(it.rest, it.leaf)
	if ok {
		it.rest = it.rest[size:]
	}
	return ok
}

// entryAt is entry i (i < Count) through its offset, false if it does
// not fit the node (a malformed node: readers never panic on one).
func (n *Node) entryAt(i int) (Entry, bool) {
	o := int(leU16(n.offs[2*i:]))
	if o > len(n.ents) {
		return Entry{}, false
	}
	e, _, ok := entryFrom(n.ents[o:], n.Leaf)
	return e, ok
}

// keyAt is the key of entry i (i < Count), false if it does not fit.
func (n *Node) keyAt(i int) ([]byte, bool) {
	o := int(leU16(n.offs[2*i:]))
	hdr := innerEnt
	if n.Leaf {
		hdr = leafEnt
	}
	if o > len(n.ents)-hdr {
		return nil, false
	}
	kl := int(leU16(n.ents[o:]))
	if kl > len(n.ents)-o-hdr {
		return nil, false
	}
	return n.ents[o+hdr : o+hdr+kl], true
}

// search is the number of entries whose key is at most key (a binary
// search over the offsets), and whether the last of them equals key.
// A malformed entry ends it with ok false.
func (n *Node) search(key []byte) (i int, eq, ok bool) {
	lo, hi := 0, n.Count
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		k, fits := n.keyAt(mid)
		if !fits {
			return 0, false, false
		}
		switch c := cmp(k, key); {
		case c == 0:
			return mid + 1, true, true
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return lo, false, true
}

// Find looks key up in a leaf: its entry and whether it is there.
func (n *Node) Find(key []byte) (Entry, bool) {
	i, eq, ok := n.search(key)
	if !ok || !eq {
		return Entry{}, false
	}
	return n.entryAt(i - 1)
}

// ChildFor returns the child of an inner node that holds key (key must lie
// inside the node's fences): the child of the last entry whose key is at
// most key (0 if none, or the node is malformed).
func (n *Node) ChildFor(key []byte) NodeID {
	i, _, ok := n.search(key)
	if !ok || i == 0 {
		return 0
	}
	e, fits := n.entryAt(i - 1)
	if !fits {
		return 0
	}
	return e.Child
}

// lastChild is an inner node's rightmost child.
func (n *Node) lastChild() NodeID {
	if n.Count == 0 {
		return 0
	}
	e, _ := n.entryAt(n.Count - 1)
	return e.Child
}

func cmp(a, b []byte) int {
	switch {
	case string(a) < string(b):
		return -1
	case string(a) > string(b):
		return 1
	}
	return 0
}

// image is a node under construction, in the writer's scratch memory.
type image struct {
	id, next, prev NodeID
	stamp          uint64
	level          int
	highInf, dead  bool
	low, high      []byte
	keys, vals     [][]byte // leaf
	vers           []uint64 // leaf
	kids           []NodeID // inner
}

func (m *image) leaf() bool { return m.level == 0 }

// entSize is the bytes entry i takes: its offset and the entry.
func (m *image) entSize(i int) int {
	if m.leaf() {
		return offSize + leafEnt + len(m.keys[i]) + len(m.vals[i])
	}
	return offSize + innerEnt + len(m.keys[i])
}

// size is the encoded size of the image, check word included, rounded up
// to 8.
func (m *image) size() int {
	s := hdrSize + 2 + len(m.low) + 2 + len(m.high) + checkSize
	for i := range m.keys {
		s += m.entSize(i)
	}
	return (s + 7) &^ 7
}

// encode writes the sealed image into dst (len(dst) >= m.size()) and
// zeroes the rest of dst.
func (m *image) encode(dst []byte) {
	le := binary.LittleEndian
	le.PutUint64(dst[offID:], uint64(m.id))
	le.PutUint64(dst[offStamp:], m.stamp)
	le.PutUint64(dst[offNext:], uint64(m.next))
	le.PutUint64(dst[offPrev:], uint64(m.prev))
	le.PutUint16(dst[offLevel:], uint16(m.level))
	le.PutUint16(dst[offCount:], uint16(len(m.keys)))
	var f uint16
	if m.leaf() {
		f |= flagLeaf
	}
	if m.highInf {
		f |= flagHighInf
	}
	if m.dead {
		f |= flagDead
	}
	le.PutUint16(dst[offFlags:], f)
	p := hdrSize
	p = putBytes(dst, p, m.low)
	if m.highInf {
		p = putBytes(dst, p, nil)
	} else {
		p = putBytes(dst, p, m.high)
	}
	for i, k := range m.keys {
		le.PutUint16(dst[p:], uint16(len(k)))
		if m.leaf() {
			le.PutUint32(dst[p+2:], uint32(len(m.vals[i])))
			le.PutUint64(dst[p+6:], m.vers[i])
			p += leafEnt
			p += copy(dst[p:], k)
			p += copy(dst[p:], m.vals[i])
		} else {
			le.PutUint64(dst[p+2:], uint64(m.kids[i]))
			p += innerEnt
			p += copy(dst[p:], k)
		}
	}
	// The entries lie in key order: their offsets are their starts.
	used, offs := tailAt(p, len(m.keys))
	clear(dst[p:offs])
	for i, o := 0, 0; i < len(m.keys); i++ {
		le.PutUint16(dst[offs+offSize*i:], uint16(o))
		o += m.entSize(i) - offSize
	}
	seal(dst, used)
}

// tailAt is where a node whose entries end at dataEnd, with count of
// them, ends (used) and where its offsets start.
func tailAt(dataEnd, count int) (used, offs int) {
	used = (dataEnd + offSize*count + checkSize + 7) &^ 7
	return used, used - checkSize - offSize*count
}

// seal writes used and the check word of the node image dst, and zeroes
// dst past used.
func seal(dst []byte, used int) {
	binary.LittleEndian.PutUint16(dst[offUsed:], uint16(used))
	binary.LittleEndian.PutUint64(dst[used-checkSize:], nodeCheck(dst[:used-checkSize]))
	clear(dst[used:])
}

func leU16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// nodeCheck is a node's check word over its bytes b (all it uses before
// the word): the sum (mod 2^64) over the segments of segSize bytes that
// b falls into (the last one shorter) of each segment's XXH3 seeded by
// its index, xor checkTag. A 64-bit hash of every byte, as one XXH3 of
// the whole node was, but made of parts: a writer that changes some
// segments takes their old hashes out of the sum and puts their new ones
// in, without reading the segments it does not change (Tree.seal). A
// torn read (segments of two images, or a segment half written) passes
// only if the hashes of what it mixed cancel out, with probability
// 2^-64; the seed is the segment's index, so segments that trade places
// change the sum too.
func nodeCheck(b []byte) uint64 {
	var s uint64
	for k := 0; k*segSize < len(b); k++ {
		s += segHash(k, b[k*segSize:min(len(b), (k+1)*segSize)])
	}
	return s ^ checkTag
}

// segHash is segment k's part of a node's check word.
func segHash(k int, seg []byte) uint64 {
	if plantedCheckUnseeded {
		return xxh3.Hash(seg)
	}
	return xxh3.HashSeed(seg, uint64(k+1)*segSeed)
}

func putBytes(dst []byte, p int, b []byte) int {
	binary.LittleEndian.PutUint16(dst[p:], uint16(len(b)))
	return p + 2 + copy(dst[p+2:], b)
}
