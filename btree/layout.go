package btree

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// Every byte of a tree node that another process reads is declared here,
// once, with one function each way (docs/dev/btree-plan.md, section 2).
//
// A node is NodeSize bytes in a slot of the group's node arena. It is
// written whole (built in a scratch image, sealed, then copied into its
// slot), so a reader sees either a sealed image or bytes whose check word
// does not match:
//
//	0      8       16      24      32       34       36      38      40
//	[id   ][stamp ][next  ][prev  ][level  ][count  ][used  ][flags ]
//	40: [low len u16][low fence][high len u16][high fence]
//	    [off 0 u16] ... [off count-1 u16]
//	    [entry 0][entry 1] ... [entry count-1]
//	    [zero padding to 8][check u64]            (ends at used)
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
//	off    where entry i starts, counted from entry 0's first byte: the
//	       entries are variable-sized, and these offsets let a search
//	       bisect them (Find, ChildFor) instead of walking them in order.
//	       Entries lie in key order, back to back (off 0 is 0, off i+1
//	       is off i plus entry i's size), so a node's bytes are a
//	       function of its contents: every replica writes the same bytes
//	       (Decode checks it)
//	check  XXH3 (64 bits) of bytes [0, used-8): nodeCheck
//
// Leaf entry, sorted by key:
//
//	[klen u16][vlen u32][version u64][key][value]
//
//	version  the version of the write that stored the value (kv's: entry
//	         index << 16 | op number), for compare-and-swap
//
// Inner entry, sorted by key; child i holds [key i, key i+1), the last
// child up to the node's high fence, and key 0 equals the low fence:
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
	offs    []byte // the entries' offsets, u16 each
	ents    []byte // the entries, in order
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
	// Walk the entries once: every length in bounds and the keys sorted,
	// inside the fences.
	it := n.Entries()
	var prev []byte
	for i := 0; i < n.Count; i++ {
		if int(leU16(n.offs[2*i:])) != len(n.ents)-len(it.rest) {
			return n, ErrMalformed // entries not back to back, in order
		}
		e, ok := it.next()
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
	// What follows the entries is the zero padding to 8 bytes.
	if len(it.rest) >= 8 {
		return n, ErrMalformed
	}
	for _, c := range it.rest {
		if c != 0 {
			return n, ErrMalformed
		}
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
	n.offs, n.ents = body[:offSize*n.Count], body[offSize*n.Count:]
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
func (n *Node) Entries() EntryIter { return EntryIter{leaf: n.Leaf, left: n.Count, rest: n.ents} }

// EntryIter walks a node's entries.
type EntryIter struct {
	leaf bool
	left int // entries not yet returned
	rest []byte
}

// Next returns the next entry, false at the end.
func (it *EntryIter) Next() (Entry, bool) { return it.next() }

func (it *EntryIter) next() (Entry, bool) {
	var e Entry
	b := it.rest
	if it.left <= 0 {
		return e, false
	}
	it.left--
	if it.leaf {
		if len(b) < leafEnt {
			return e, false
		}
		kl := int(binary.LittleEndian.Uint16(b))
		vl := int(binary.LittleEndian.Uint32(b[2:]))
		if vl < 0 || len(b)-leafEnt < kl || len(b)-leafEnt-kl < vl {
			return e, false
		}
		e.Version = binary.LittleEndian.Uint64(b[6:])
		e.Key = b[leafEnt : leafEnt+kl]
		e.Value = b[leafEnt+kl : leafEnt+kl+vl]
		it.rest = b[leafEnt+kl+vl:]
		return e, true
	}
	if len(b) < innerEnt {
		return e, false
	}
	kl := int(binary.LittleEndian.Uint16(b))
	if len(b)-innerEnt < kl {
		return e, false
	}
	e.Child = NodeID(binary.LittleEndian.Uint64(b[2:]))
	e.Key = b[innerEnt : innerEnt+kl]
	it.rest = b[innerEnt+kl:]
	return e, true
}

// entryAt is entry i (i < Count) through its offset, false if it does
// not fit the node (a malformed node: readers never panic on one).
func (n *Node) entryAt(i int) (Entry, bool) {
	o := int(leU16(n.offs[2*i:]))
	if o > len(n.ents) {
		return Entry{}, false
	}
	it := EntryIter{leaf: n.Leaf, left: 1, rest: n.ents[o:]}
	return it.next()
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
	it := n.Entries()
	var child NodeID
	for e, ok := it.next(); ok; e, ok = it.next() {
		child = e.Child
	}
	return child
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
	offs := p
	p += offSize * len(m.keys)
	base := p
	for i, k := range m.keys {
		le.PutUint16(dst[offs+offSize*i:], uint16(p-base))
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
	used := (p + checkSize + 7) &^ 7
	clear(dst[p : used-checkSize])
	le.PutUint16(dst[offUsed:], uint16(used))
	le.PutUint64(dst[used-checkSize:], nodeCheck(dst[:used-checkSize]))
	clear(dst[used:])
}

func leU16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// nodeCheck is a node's check word over its bytes b (all it uses before
// the word). XXH3, not the XXH64 (xxhash) of the other check words: every
// node read (each warm lookup's leaf, each leaf of a scan) hashes the
// node's used bytes, and XXH3's vectorized loop does that several times
// faster (BenchmarkNodeCheck); both are 64-bit hashes of every byte, so
// a torn read (a mix of two images) passes either with probability 2^-64.
func nodeCheck(b []byte) uint64 { return xxh3.Hash(b) }

func putBytes(dst []byte, p int, b []byte) int {
	binary.LittleEndian.PutUint16(dst[p:], uint16(len(b)))
	return p + 2 + copy(dst[p+2:], b)
}
