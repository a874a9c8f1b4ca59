package btree

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// The load area: each tablet's write count and key count, published
// after the directory area in the group's header region so that a
// client reads them one-sided with the tablets (one read of RegionSize
// bytes: the header, the directory area, the load area). The tablet
// balancer (client.Balancer) measures each tablet's load as the change
// of its write count between two of its rounds (docs/btree.md, "Who
// decides").
//
// Load area, at byte hdrRegionSize+DirBytes of the header region
// (LoadBytes bytes; rewritten in place at each publication after writes,
// sealed by its own check word):
//
//	0         8        12       16
//	[dirver  ][count  ][0      ] then count entries, one per tablet of
//	                             the directory area of version dirver,
//	                             in its order:
//	  [writes u64][keys u64]
//	[check u64]  (at 16+16*count; xxhash of the bytes before it)
//
//	dirver  the version of the tablets the counts belong to: a reader
//	        takes the counts only if it equals the version of the
//	        directory area it read (the two areas are written at
//	        different moments, and a drop publishes its directory area
//	        alone, in the middle of its apply)
//	writes  Tablet.Writes: write ops applied to the tablet's keys since
//	        it came to this group (a hint: a restore starts it from 0)
//	keys    the keys the tablet holds
//
// Only write ops are counted: gets and scans are one-sided and no
// replica sees them, so a tablet's load is its writes.
const (
	loadHdr   = 16
	loadEnt   = 16
	LoadBytes = loadHdr + loadEnt*MaxTablets + checkSize
)

// encodeLoad writes the load area of tablets (at directory version
// dirVer, counts their key counts) into b (at least LoadBytes long).
func encodeLoad(b []byte, dirVer uint64, tablets []Tablet, counts []int) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], dirVer)
	le.PutUint32(b[8:], uint32(len(tablets)))
	le.PutUint32(b[12:], 0)
	p := loadHdr
	for i, tb := range tablets {
		le.PutUint64(b[p:], tb.Writes)
		var keys uint64
		if i < len(counts) && counts[i] > 0 {
			keys = uint64(counts[i])
		}
		le.PutUint64(b[p+8:], keys)
		p += loadEnt
	}
	le.PutUint64(b[p:], xxhash.Sum64(b[:p]))
}

// decodeLoad validates the load area b and returns its directory
// version and its entries' (writes, keys) pairs, false if it is torn or
// malformed.
func decodeLoad(b []byte) (dirVer uint64, writes, keys []uint64, ok bool) {
	le := binary.LittleEndian
	if len(b) < loadHdr+checkSize {
		return 0, nil, nil, false
	}
	n := int(le.Uint32(b[8:]))
	if n > MaxTablets || le.Uint32(b[12:]) != 0 {
		return 0, nil, nil, false
	}
	end := loadHdr + loadEnt*n
	if end+checkSize > len(b) || xxhash.Sum64(b[:end]) != le.Uint64(b[end:]) {
		return 0, nil, nil, false
	}
	writes, keys = make([]uint64, n), make([]uint64, n)
	for i := range n {
		writes[i], keys[i] = le.Uint64(b[loadHdr+loadEnt*i:]), le.Uint64(b[loadHdr+loadEnt*i+8:])
	}
	return le.Uint64(b), writes, keys, true
}

// attachLoad sets the tablets' Writes, Keys and HasLoad from the load
// area b if it is whole and belongs to the tablets' directory version;
// otherwise it leaves them without load (HasLoad false).
func attachLoad(b []byte, version uint64, tablets []Tablet) {
	v, writes, keys, ok := decodeLoad(b)
	if !ok || v != version || len(writes) != len(tablets) {
		return
	}
	for i := range tablets {
		tablets[i].Writes, tablets[i].Keys, tablets[i].HasLoad = writes[i], keys[i], true
	}
}

// publishLoad writes the load area of tablets (directory version
// dirVer, key counts counts).
func (r *Regions) publishLoad(dirVer uint64, tablets []Tablet, counts []int) {
	encodeLoad(r.hdr.Bytes()[hdrRegionSize+DirBytes:regionLen], dirVer, tablets, counts)
}
