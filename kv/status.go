package kv

import (
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// What a monitoring reader (client.Status, kvcli status) needs to read a
// replica's table header one-sided: its region, its size, a read that
// retries torn images, and what the geometry says of the index's size.

// HeaderSize is the size of a table header (see layout.go).
const HeaderSize = hdrSize

// HeaderRegion is the region holding group g's table header on each of
// its replicas.
func HeaderRegion(g uint32) rdma.RegionID { return headerRegion(g) }

// ReadHeader reads group g's table header over c (a Conn to one of the
// group's replicas) and decodes it, reading again while the image is torn
// (the replica rewrites the header as it applies entries), until timeout.
// c must have no other signalled op outstanding.
func ReadHeader(c rdma.Conn, g uint32, timeout time.Duration) (Header, error) {
	var buf [hdrSize]byte
	deadline := time.Now().Add(timeout)
	for tries := 1; ; tries++ {
		left := time.Until(deadline)
		if left <= 0 {
			left = time.Millisecond
		}
		if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(g), Buf: buf[:]}, left); err != nil {
			return Header{}, err
		}
		h, err := DecodeHeader(buf[:])
		if err == nil {
			return h, nil
		}
		if time.Now().After(deadline) {
			return Header{}, fmt.Errorf("kv: group %d's header on node %d: %w after %d reads", g, c.Peer(), err, tries)
		}
		if tries%64 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// IndexSlots is the number of slots of the index's current generation:
// its capacity in keys.
func (g Geometry) IndexSlots() int { return (1 << g.LogBuckets) * slotsPer }
