package btree

import "github.com/rdmakv/rdmakv/rdma"

// What a polled one-sided reader outside this package (kv's
// OrderedReader) needs to post its own reads: where a group's header and
// a node slot live, and the size of a header read.

// HeaderSize is the size of a group's btree header (the first bytes of
// its header region).
const HeaderSize = hdrRegionSize

// RegionSize is the size of a group's btree header region: the header,
// the directory area after it and the load area after that (a read of
// the whole region returns them all: DecodeDir(b[HeaderSize:]) decodes
// the tablets with their load).
const RegionSize = regionLen

// HeaderRegion is the region of group g's btree header.
func HeaderRegion(g uint32) rdma.RegionID { return headerRegion(g) }

// SlotAddr is where node slot lives in group g's arena under the geometry
// of header h: its chunk region and the offset in it. A read of
// h.NodeSize bytes there returns the slot's bytes.
func (h Header) SlotAddr(g uint32, slot uint32) (rdma.RegionID, uint64) {
	per := uint32(h.ChunkSlots)
	return chunkRegion(g, int(slot/per)), uint64(slot%per) * uint64(h.NodeSize)
}

// UsedSize is the used size a node image's header announces (the bytes
// it uses from its start, check word included), or 0 if b is too short to
// hold a header. Only a hint: the bytes are not validated (a one-sided
// reader that read fewer bytes than this reads the node again).
func UsedSize(b []byte) int {
	if len(b) < hdrSize {
		return 0
	}
	return int(leU16(b[offUsed:]))
}

// PlantSkipFence plants the skipFence bug in c (tests of other packages
// only: the kv simulator's mutant of the one-sided ordered reader).
func PlantSkipFence(c *Cache) { c.knobs.skipFence = true }

// PlantStaleCacheAfterSplit plants the staleCacheAfterSplit bug in c
// (tests of other packages only).
func PlantStaleCacheAfterSplit(c *Cache) { c.knobs.staleCacheAfterSplit = true }

// Listed returns up to n leaves that the cached level-1 node holding key
// lists after the leaf at slot (before it with reverse), nearest first,
// stopping at bound (nil: none): forward, at the first leaf whose range
// starts at or past bound; reverse, at the first whose range ends at or
// below it. These are the leaves a scan through that node reads next,
// which a one-sided reader posts together. With reverse and key nil the
// node is the rightmost cached level-1 node. nil if no such node lists
// slot. The ids are only hints: the scan checks every leaf it reads
// (stamp, fences, contiguity).
func (c *Cache) Listed(key, bound []byte, slot uint32, reverse bool, n int) []NodeID {
	var from *cached
	if key == nil && reverse {
		c.mu.RLock()
		if len(c.levels) > 0 && c.levels[0] != nil {
			if e, ok := c.levels[0].Max(); ok && e.highInf {
				from = e
			}
		}
		c.mu.RUnlock()
	} else if e := c.cover(key); e != nil && e.level == 1 {
		from = e
	}
	if from == nil {
		return nil
	}
	for i, id := range from.kids {
		if id.Slot() != slot {
			continue
		}
		var out []NodeID
		if reverse {
			// Child j covers [keys[j], keys[j+1]).
			for j := i - 1; j >= 0 && len(out) < n && (bound == nil || from.keys[j+1] > string(bound)); j-- {
				out = append(out, from.kids[j])
			}
		} else {
			for j := i + 1; j < len(from.kids) && len(out) < n && (bound == nil || from.keys[j] < string(bound)); j++ {
				out = append(out, from.kids[j])
			}
		}
		return out
	}
	return nil
}
