package main

import (
	"encoding/binary"

	"github.com/rdmakv/rdmakv/rdma"
)

// Regions of one fabric measurement. Measurement k uses region ids
// k*regionsPerK + role on both nodes, so every measurement starts from
// fresh, zeroed memory.
const (
	regPingPong = 1 // on both nodes: the word the other node writes
	regRing     = 2 // on the target: ring header and slots
	regCredits  = 3 // on the initiator: the consumer's head

	regionsPerK = 4
)

func regionID(k, role int) rdma.RegionID { return rdma.RegionID(k*regionsPerK + role) }

// Ping-pong region (regPingPong), 64 bytes:
//
//	[0,8)   the last sequence number the other node wrote (1, 2, 3, ...)
//	[8,64)  unused: the word has its cache line to itself
const pingPongSize = 64

// Ring (regRing on the target) and credits (regCredits on the initiator):
//
//	ring:    0        8                 64                64+size          64+slots*size
//	         +--------+-----------------+-----------------+---- ... -------+
//	         | tail   | (cache line)    | slot 0          | slot 1 ...     |
//	         +--------+-----------------+-----------------+---- ... -------+
//	slot:    0        8                       size-8      size
//	         +--------+-----------  ...  -----+-----------+
//	         | seq    | filler (0xA5)         | seq       |
//	         +--------+-----------  ...  -----+-----------+
//	credits: [0,8) head
//
// tail counts messages published, head messages consumed. Message m (from
// 0) goes to slot m mod slots and carries seq m+1 in its first and last
// word, so the consumer sees a slot that is stale or only partly written.
// The producer writes a batch of slots unsignaled, then tail with Notify;
// the consumer validates every slot up to tail and writes head back; the
// producer waits for head when the ring is full.
const (
	ringHeader  = 64
	minSlotSize = 16
)

// ringSize is the size of a ring region.
func ringSize(slots, size int) int { return ringHeader + slots*size }

// slotOffset is where message m's slot starts in the ring region.
func slotOffset(m uint64, slots, size int) int {
	return ringHeader + int(m%uint64(slots))*size
}

// encodeSlot fills buf, one slot, for message sequence number seq.
func encodeSlot(buf []byte, seq uint64) {
	binary.NativeEndian.PutUint64(buf, seq)
	binary.NativeEndian.PutUint64(buf[len(buf)-8:], seq)
}

// fillSlot writes the filler of a slot buffer once; encodeSlot then only
// touches the sequence words.
func fillSlot(buf []byte) {
	for i := 8; i < len(buf)-8; i++ {
		buf[i] = 0xA5
	}
}

// decodeSlot returns the sequence numbers in the first and last word of
// the slot at off in the ring region's memory.
func decodeSlot(mem []byte, off, size int) (first, last uint64) {
	return rdma.Load64(mem, off), rdma.Load64(mem, off+size-8)
}

// putWord encodes an 8-byte word for a write.
func putWord(buf *[8]byte, v uint64) { binary.NativeEndian.PutUint64(buf[:], v) }
