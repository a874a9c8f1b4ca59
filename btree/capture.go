package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Snapshot captures (issue 19): Capture, on the polling goroutine, copies
// only metadata (the tablets, the root, the arena's chunk list, the
// section's size and key count) and registers the capture with the arena;
// from then on, until the capture is persisted or released, the writer
// saves the image a node slot held at capture before its first write to
// it (copy on write, one node at a time, under the capture's lock).
// Persist, off the polling goroutine, walks the tree from the captured
// root, reading each node from its saved image if it has one and from the
// arena otherwise (under the same lock, so a read never overlaps a
// write), and writes exactly the section Snapshot would have written at
// capture. A node reachable at capture is never changed without being
// saved first: every slot write goes through Arena.beginWrite (Tree.write
// and the in-place seal), and a slot is only reused after it is freed,
// then written. A restore (Arena.reset) breaks the capture: its Persist
// fails rather than read the new tree.
//
// Memory: a capture keeps, at most, one image per node slot written
// while it is being persisted (NodeSize bytes each): at worst a copy of
// the tree, when every node changes before Persist reaches it.

// cow is a capture's saved node images (shared by the writer and Persist).
type cow struct {
	mu     sync.Mutex
	limit  uint32            // slots handed out at capture: later ones are no node of it
	saved  map[uint32][]byte // slot -> its image at capture
	broken bool              // the arena was reset (a restore)
	done   atomic.Bool       // persisted or released: the writer stops saving
}

// beginWrite returns slot's memory for a write by the tree's writer:
// every live capture saves the slot's image first, and holds its lock
// until endWrite, so that no Persist reads the slot in the middle of the
// write.
func (a *Arena) beginWrite(slot uint32) []byte {
	b := a.bytes(slot)
	if len(a.cows) == 0 {
		return b
	}
	live := a.cows[:0]
	for _, c := range a.cows {
		if !c.done.Load() {
			live = append(live, c)
		}
	}
	clear(a.cows[len(live):])
	a.cows = live
	for _, c := range a.cows {
		c.mu.Lock()
		if _, ok := c.saved[slot]; !ok && c.saved != nil && slot < c.limit {
			c.saved[slot] = slices.Clone(b)
		}
	}
	return b
}

// endWrite ends the write beginWrite began.
func (a *Arena) endWrite() {
	for _, c := range a.cows {
		c.mu.Unlock()
	}
}

// breakCaptures detaches every live capture: their Persist fails (a
// restore is replacing every node).
func (a *Arena) breakCaptures() {
	for _, c := range a.cows {
		c.mu.Lock()
		c.broken = true
		c.mu.Unlock()
	}
	clear(a.cows)
	a.cows = a.cows[:0]
}

// Capture is a Store's state at one point, for a snapshot section:
// Size now, Persist later on any goroutine (once), Release when done.
type Capture struct {
	cow     *cow
	chunks  [][]byte // the arena's chunks at capture
	per     int      // slots per chunk
	node    int      // node size
	root    NodeID
	tablets []Tablet // copies, with the garbage ranges (garbage.go)
	// dirVer and ownVer are the store's directory and ownership
	// versions at capture (the section's header, snapshot.go).
	dirVer, ownVer, verOff uint64
	keys                   int // the tree's keys
	size                   int // the section's bytes
	persist                atomic.Bool
	reads                  int // Persist's node reads
	knobs                  testingKnobs
}

// SectionCapture is what kv.Table takes of its ordered part for a
// snapshot (kv.OrderedCapture: the same interface type).
type SectionCapture = interface {
	Size() int
	Persist(dst []byte) error
	Release()
}

// CaptureSection is Capture as kv.Ordered takes it.
func (s *Store) CaptureSection() SectionCapture { return s.Capture() }

// Capture captures the store's snapshot section (polling goroutine): a
// copy of its metadata, O(tablets + chunks), not of its entries.
func (s *Store) Capture() *Capture {
	a := s.a
	c := &Capture{cow: &cow{limit: a.n, saved: map[uint32][]byte{}}, chunks: slices.Clone(a.chunks), per: a.per,
		node: a.size, root: s.t.root, keys: s.t.len, knobs: s.knobs}
	c.size = 40 + s.t.pairs
	c.dirVer, c.ownVer, c.verOff = s.dirVer, s.ownVer, s.verOff
	for _, tb := range s.sectionTablets() {
		c.tablets = append(c.tablets, Tablet{Low: slices.Clone(tb.Low), High: slices.Clone(tb.High), HighInf: tb.HighInf,
			State: tb.State, Gen: tb.Gen, To: tb.To})
		c.size += 40 + pad8(len(tb.Low)) + pad8(len(tb.High))
	}
	a.cows = append(a.cows, c.cow)
	return c
}

// Size is the section's length in bytes.
func (c *Capture) Size() int { return c.size }

// Release ends the capture (the writer stops saving images for it).
func (c *Capture) Release() {
	c.cow.done.Store(true)
	c.cow.mu.Lock()
	c.cow.saved = nil
	c.cow.mu.Unlock()
}

// errCaptureBroken: a restore replaced the tree while it was persisted.
var errCaptureBroken = errors.New("btree: the store was restored while its snapshot was being written")

// read copies node id's image at capture into dst. Every 64 reads it
// yields its processor: Persist runs beside the pollers, which must not
// wait for it for a scheduler time slice when they are runnable.
func (c *Capture) read(id NodeID, dst []byte) (Node, error) {
	if c.reads++; c.reads%64 == 0 {
		runtime.Gosched()
	}
	k := c.cow
	s := id.Slot()
	if s == 0 || s >= k.limit || int(s)/c.per >= len(c.chunks) {
		return Node{}, fmt.Errorf("btree: snapshot: node %v outside the captured arena", id)
	}
	k.mu.Lock()
	if k.broken {
		k.mu.Unlock()
		return Node{}, errCaptureBroken
	}
	if img, ok := k.saved[s]; ok && !c.knobs.persistLive {
		copy(dst, img)
	} else {
		o := int(s) % c.per * c.node
		copy(dst, c.chunks[int(s)/c.per][o:o+c.node])
	}
	k.mu.Unlock()
	return Decode(dst, id)
}

// Persist writes the section (Size bytes) of the state at capture into
// dst: the bytes Store.Snapshot returned then. Any goroutine, once.
func (c *Capture) Persist(dst []byte) error {
	if c.persist.Swap(true) {
		return errors.New("btree: a capture persisted twice")
	}
	defer c.Release()
	if len(dst) != c.size {
		return fmt.Errorf("btree: a snapshot section of %d bytes into %d", c.size, len(dst))
	}
	le := binary.LittleEndian
	b := dst[:0]
	b = le.AppendUint64(b, snapMagic)
	b = le.AppendUint32(b, uint32(len(c.tablets)))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, c.dirVer)
	b = le.AppendUint64(b, c.ownVer)
	b = le.AppendUint64(b, c.verOff)
	buf := make([]byte, c.node)
	keys := 0
	for _, tb := range c.tablets {
		var at int
		b, at = appendTabletHeader(b, tb)
		// Descend to the leaf holding Low, then walk right.
		id := c.root
		for {
			n, err := c.read(id, buf)
			if err != nil {
				return err
			}
			if n.Leaf {
				break
			}
			id = n.ChildFor(tb.Low)
		}
		count := 0
	walk:
		for id != 0 {
			n, err := c.read(id, buf)
			if err != nil {
				return err
			}
			it := n.Entries()
			for e, ok := it.next(); ok; e, ok = it.next() {
				if string(e.Key) < string(tb.Low) {
					continue
				}
				if !tb.Contains(e.Key) {
					break walk
				}
				if len(b)+snapPairSize(len(e.Key), len(e.Value)) > len(dst) {
					return fmt.Errorf("btree: snapshot: the captured tree holds more than the %d bytes counted at capture", c.size)
				}
				b = appendPair(b, e.Key, e.Value, e.Version)
				count++
			}
			id = n.Next
		}
		le.PutUint64(b[at:], uint64(count))
		keys += count
	}
	if len(b) != c.size || keys != c.keys {
		// The counts kept by the applies disagree with the tree (or a
		// key lies outside every tablet): no snapshot rather than a
		// wrong one.
		return fmt.Errorf("btree: snapshot: walked %d keys in %d bytes, counted %d in %d at capture", keys, len(b), c.keys, c.size)
	}
	return nil
}

// snapPairSize is an entry's bytes in a snapshot section (appendPair).
func snapPairSize(klen, vlen int) int { return 16 + pad8(klen) + pad8(vlen) }
