package btree

import (
	"fmt"

	"github.com/rdmakv/rdmakv/internal/prefault"
)

// Arena is the memory nodes live in: fixed-size slots in chunks, with an
// incarnation per slot that is bumped when the slot is freed, so a node id
// (slot and incarnation) is never reused. Slot 0 is never handed out: id 0
// means no node. Slots are handed out deterministically (the free list
// last in, first out, then new slots in order), so replicas that apply the
// same changes lay out the same nodes.
//
// An arena belongs to its tree's writer; readers read its bytes only
// through Bytes (in a process) or one-sided reads of the regions its
// chunks are registered as (later stages).
type Arena struct {
	size   int
	per    int // slots per chunk
	chunks [][]byte
	inc    []uint32
	free   []uint32
	n      uint32 // slots handed out or freed, slot 0 included
	grow   func(n int) ([]byte, error)
	// limit bounds the chunks (0: no bound); room counts against it.
	limit int
	// cows are the snapshot captures being persisted (capture.go).
	cows []*cow
	// populated is the first new slot whose page alloc has not had the
	// kernel populate yet (populate.go); noPopulate: the kernel cannot.
	populated  uint32
	noPopulate bool
	// prefault is how many slots past the one alloc hands out the
	// faulter keeps mapped (0: off, populate windows on the poller
	// instead); asked is the first new slot not asked of it
	// (populate.go).
	prefault int
	asked    uint32
	faulter  *prefault.Faulter
	// unwritten is the last id alloc handed out from a new slot, until
	// its first install (0: none): its slot holds zeros, no node to
	// take out of the usage (Tree.install).
	unwritten NodeID
	knobs     testingKnobs
}

// NewArena returns an arena of nodeSize-byte slots, chunkSlots slots per
// chunk, whose chunks come from grow (nil: the Go heap).
func NewArena(nodeSize, chunkSlots int, grow func(n int) ([]byte, error)) *Arena {
	if grow == nil {
		grow = func(n int) ([]byte, error) { return make([]byte, n), nil }
	}
	return &Arena{size: nodeSize, per: chunkSlots, grow: grow, n: 1, inc: []uint32{0}}
}

// Bytes is the slot's memory (NodeSize bytes).
func (a *Arena) Bytes(slot uint32) []byte {
	if slot >= a.n {
		return nil
	}
	return a.bytes(slot)
}

func (a *Arena) bytes(slot uint32) []byte {
	c, o := int(slot)/a.per, int(slot)%a.per*a.size
	return a.chunks[c][o : o+a.size : o+a.size]
}

// Slots is the number of slots in use or free (the high-water mark).
func (a *Arena) Slots() int { return int(a.n) - 1 }

// Free is the number of free slots.
func (a *Arena) Free() int { return len(a.free) }

func (a *Arena) alloc() NodeID {
	if k := len(a.free); k > 0 {
		s := a.free[k-1]
		a.free = a.free[:k-1]
		return makeID(s, a.inc[s])
	}
	s := a.n
	if int(s)/a.per >= len(a.chunks) {
		b, err := a.grow(a.per * a.size)
		if err != nil {
			// The group's memory is full: a replica refuses writes before
			// this (later stages check room before applying).
			panic(fmt.Sprintf("btree: arena cannot grow: %v", err))
		}
		a.chunks = append(a.chunks, b)
	}
	if a.prefault > 0 {
		a.prefaultFrom(s)
	} else {
		a.populateFrom(s)
	}
	a.n++
	a.inc = append(a.inc, 1)
	a.unwritten = makeID(s, 1)
	return a.unwritten
}

func (a *Arena) release(id NodeID) {
	s := id.Slot()
	a.inc[s]++
	if a.inc[s] == 0 {
		a.inc[s] = 1
	}
	a.free = append(a.free, s)
}

// room is the number of slots alloc can still hand out: the free list,
// what the chunks already registered leave, and the chunks up to limit
// (-1: no bound).
func (a *Arena) room() int {
	if a.limit == 0 {
		return -1
	}
	return len(a.free) + a.limit*a.per - int(a.n)
}

// reset frees every slot at once, bumping each incarnation (so no pointer
// from before names a node after), and hands slots out again from 1 up:
// what a restore does before it bulk-loads a tree. The chunks stay.
func (a *Arena) reset() {
	a.breakCaptures()
	a.free = a.free[:0]
	for s := a.n - 1; s >= 1; s-- {
		a.inc[s]++
		if a.inc[s] == 0 {
			a.inc[s] = 1
		}
		a.free = append(a.free, s)
	}
}
