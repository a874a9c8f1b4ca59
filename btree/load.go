package btree

import (
	"encoding/binary"
	"math"

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
//	[dirver  ][count  ][garbage] then count entries, one per tablet of
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
//	garbage u32: the group's garbage keys (Store.Garbage: keys of
//	        dropped tablets not deleted yet), 2^32-1 if more; the
//	        balancer sends CtlCollect to a group where it is not 0.
//	        Republished when it changes. A reader older than this
//	        field wanted 0 there: it takes no load from a group with
//	        garbage (as from a torn area), and its balancer then goes
//	        by key count for that round
//
// Only write ops are counted: gets and scans are one-sided and no
// replica sees them, so a tablet's load is its writes.
const (
	loadHdr   = 16
	loadEnt   = 16
	LoadBytes = loadHdr + loadEnt*MaxTablets + checkSize
)

// encodeLoad writes the load area of tablets (at directory version
// dirVer, counts their key counts; garbage the group's garbage keys)
// into b (at least LoadBytes long).
func encodeLoad(b []byte, dirVer uint64, tablets []Tablet, counts []int, garbage int) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], dirVer)
	le.PutUint32(b[8:], uint32(len(tablets)))
	le.PutUint32(b[12:], uint32(min(max(garbage, 0), math.MaxUint32)))
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
// version, its entries' (writes, keys) pairs and the group's garbage
// keys, false if it is torn or malformed.
func decodeLoad(b []byte) (dirVer uint64, writes, keys []uint64, garbage uint64, ok bool) {
	le := binary.LittleEndian
	if len(b) < loadHdr+checkSize {
		return 0, nil, nil, 0, false
	}
	n := int(le.Uint32(b[8:]))
	if n > MaxTablets {
		return 0, nil, nil, 0, false
	}
	end := loadHdr + loadEnt*n
	if end+checkSize > len(b) || xxhash.Sum64(b[:end]) != le.Uint64(b[end:]) {
		return 0, nil, nil, 0, false
	}
	writes, keys = make([]uint64, n), make([]uint64, n)
	for i := range n {
		writes[i], keys[i] = le.Uint64(b[loadHdr+loadEnt*i:]), le.Uint64(b[loadHdr+loadEnt*i+8:])
	}
	return le.Uint64(b), writes, keys, uint64(le.Uint32(b[12:])), true
}

// DecodeGarbage is the group's garbage key count published in its load
// area (b: the bytes from HeaderSize of its header region, as DecodeDir
// takes them), false if the area is torn or b is short. Any version of
// the area will do: the count is a hint the balancer acts on (it sends
// CtlCollect, whose answer is exact).
func DecodeGarbage(b []byte) (uint64, bool) {
	if len(b) < DirBytes+LoadBytes {
		return 0, false
	}
	_, _, _, g, ok := decodeLoad(b[DirBytes : DirBytes+LoadBytes])
	return g, ok
}

// attachLoad sets the tablets' Writes, Keys and HasLoad from the load
// area b if it is whole and belongs to the tablets' directory version;
// otherwise it leaves them without load (HasLoad false).
func attachLoad(b []byte, version uint64, tablets []Tablet) {
	v, writes, keys, _, ok := decodeLoad(b)
	if !ok || v != version || len(writes) != len(tablets) {
		return
	}
	for i := range tablets {
		tablets[i].Writes, tablets[i].Keys, tablets[i].HasLoad = writes[i], keys[i], true
	}
}

// publishLoad writes the load area of tablets (directory version
// dirVer, key counts counts, the group's garbage keys garbage).
func (r *Regions) publishLoad(dirVer uint64, tablets []Tablet, counts []int, garbage int) {
	encodeLoad(r.hdr.Bytes()[hdrRegionSize+DirBytes:regionLen], dirVer, tablets, counts, garbage)
}
