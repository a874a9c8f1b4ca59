package btree

import "github.com/rdmakv/rdmakv/rdma"

// What a polled one-sided reader outside this package (kv's
// OrderedReader) needs to post its own reads: where a group's header and
// a node slot live, and the size of a header read.

// HeaderSize is the size of a group's btree header region.
const HeaderSize = hdrRegionSize

// HeaderRegion is the region of group g's btree header.
func HeaderRegion(g uint32) rdma.RegionID { return headerRegion(g) }

// SlotAddr is where node slot lives in group g's arena under the geometry
// of header h: its chunk region and the offset in it. A read of
// h.NodeSize bytes there returns the slot's bytes.
func (h Header) SlotAddr(g uint32, slot uint32) (rdma.RegionID, uint64) {
	per := uint32(h.ChunkSlots)
	return chunkRegion(g, int(slot/per)), uint64(slot%per) * uint64(h.NodeSize)
}

// PlantSkipFence plants the skipFence bug in c (tests of other packages
// only: the kv simulator's mutant of the one-sided ordered reader).
func PlantSkipFence(c *Cache) { c.knobs.skipFence = true }

// PlantStaleCacheAfterSplit plants the staleCacheAfterSplit bug in c
// (tests of other packages only).
func PlantStaleCacheAfterSplit(c *Cache) { c.knobs.staleCacheAfterSplit = true }
