package kv

import (
	"encoding/binary"
	"errors"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// Every layout of the table that another process reads is declared here,
// once, with one function each way (docs/kv.md, "Memory layout").
//
// A replica of group g registers, all at ids from regions.KV(g):
//
//	KV(g)+0            the header (hdrSize bytes)
//	KV(g)+1+gen%60     index generation gen: 2^logBuckets buckets
//	KV(g)+64+h         heap region h (h < maxHeaps): records
//
// Header (64 bytes; the promise word on its own, the rest sealed by a check
// word so a torn read is rejected):
//
//	0        8        16        24         32        40       48      56
//	[promise][serving][applied ][appliedAt ][geometry][inc     ][layout][check]
//
//	promise   E_new of this member (broadcast Config.OnPromise), written
//	          alone, before the member's vote is published
//	serving   the epoch this replica leads and serves linearizable gets in
//	          (its diff committed and applied here), 0 if none
//	applied   the index of the last entry applied to the table
//	appliedAt wall clock (Unix ns) when that entry was applied here (or
//	          the snapshot holding it restored); 0 before the first
//	geometry  [cur gen u16][cur log2 buckets u8][migrating u8]
//	          [old gen u16][old log2 buckets u8][flags u8]
//	          flags bit 0: catching up (the member restarted without
//	          its data and cannot vote until a leader's diff catches it
//	          up: broadcast Status.CatchingUp); the other bits are 0
//	inc       this table's incarnation (differs after a restart)
//	layout    counts every change of geometry or restore (by 2), and is
//	          odd while a request of several ops is being applied: a
//	          reader whose two header reads agree on one even value read
//	          one layout and no request half applied
//	check     xxhash of words 1..6
//
// Bucket (128 bytes): a header word, a spare word, then 7 slots of 16 bytes.
// Buckets 2k and 2k+1 form a pair that readers read with one 256-byte read.
//
//	0        8       16                                  128
//	[bflags ][0     ][slot 0][slot 1] ... [slot 6]
//
//	bflags bit 0: moved (the bucket was migrated to the next generation;
//	              its slots are frozen and readers look there)
//
// Slot (16 bytes, two words each written atomically; a reader may see them
// from two moments, and the record's own version tells):
//
//	0          8
//	[version  ][ref: fp u8 | units u16 | heap u8 | off/16 u32]
//
//	version   the unique version of the write that stored the record
//	          (entry index << 16 | op number); 0 is an empty slot
//	fp        8 bits of the key's hash
//	units     the record's size in 16-byte units (0xffff: larger; read the
//	          record's header for its size)
//	heap, off where the record starts
//
// Record (16-byte aligned; immutable once a slot points to it):
//
//	0         8              16
//	[version ][klen u32|vlen u32][key][value][zero pad to 8][check]
//
//	check     xxhash of everything before it
//
// A record validates when its check matches, its version equals the slot's
// version and its key is the key looked up: versions are never reused, so a
// validated record holds exactly the bytes of the write the index pointed
// to, whatever reuse its memory went through since.
const (
	hdrSize    = 64
	bucketSize = 128
	slotSize   = 16
	bucketHdr  = 16
	slotsPer   = (bucketSize - bucketHdr) / slotSize // 7
	recHdr     = 16
	recAlign   = 16
	maxHeaps   = 192
	maxGens    = 60
	unitsLarge = 0xffff

	hPromise   = 0
	hServing   = 8
	hApplied   = 16
	hAppliedAt = 24
	hGeometry  = 32
	hInc       = 40
	hLayout    = 48
	hCheck     = 56

	bMoved = 1

	// Flags in the geometry word's top byte.
	gfShift      = 56
	gfCatchingUp = 1 << gfShift
)

// Region ids of group g's table.
func headerRegion(g uint32) rdma.RegionID { return regions.KV(g) }

func indexRegion(g uint32, gen int) rdma.RegionID {
	return regions.KV(g) + 1 + rdma.RegionID(gen%maxGens)
}

func heapRegion(g uint32, h int) rdma.RegionID { return regions.KV(g) + 64 + rdma.RegionID(h) }

// Geometry is the shape of the index: its current generation and, while
// the table grows, the generation it migrates from.
type Geometry struct {
	Gen        int
	LogBuckets int
	Migrating  bool
	OldGen     int
	OldLog     int
}

func (g Geometry) word() uint64 {
	w := uint64(uint16(g.Gen)) | uint64(uint8(g.LogBuckets))<<16
	if g.Migrating {
		w |= 1<<24 | uint64(uint16(g.OldGen))<<32 | uint64(uint8(g.OldLog))<<48
	}
	return w
}

func geometryOf(w uint64) Geometry {
	g := Geometry{Gen: int(uint16(w)), LogBuckets: int(uint8(w >> 16))}
	if w>>24&1 != 0 {
		g.Migrating = true
		g.OldGen = int(uint16(w >> 32))
		g.OldLog = int(uint8(w >> 48))
	}
	return g
}

// Header is a decoded table header.
type Header struct {
	Promise   uint64 // the member's E_new (an epoch)
	Serving   uint64 // the epoch whose linearizable gets this replica serves, or 0
	Applied   uint64 // index of the last applied entry
	AppliedAt int64  // Unix ns of that application (or of the restore that brought it); 0: none yet
	Geometry  Geometry
	Inc       uint64
	Layout    uint64
	// CatchingUp: the member restarted without its data and cannot vote
	// until a leader's diff catches it up (broadcast Status.CatchingUp
	// when the header was published).
	CatchingUp bool
}

// encodeHeader writes h's sealed words (1..7) into b[0:64]; the promise word
// is written on its own (storePromise).
func encodeHeader(b []byte, h *Header) {
	var w [8]uint64
	w[1], w[2], w[3] = h.Serving, h.Applied, uint64(h.AppliedAt)
	w[4], w[5], w[6] = h.Geometry.word(), h.Inc, h.Layout
	if h.CatchingUp {
		w[4] |= gfCatchingUp
	}
	w[7] = headerCheck(&w)
	for i := 1; i < 8; i++ {
		binary.LittleEndian.PutUint64(b[i*8:], w[i])
	}
}

func headerCheck(w *[8]uint64) uint64 {
	var b [48]byte
	for i := 1; i < 7; i++ {
		binary.LittleEndian.PutUint64(b[(i-1)*8:], w[i])
	}
	return xxhash.Sum64(b[:]) | 1
}

var errTorn = errors.New("kv: torn or unwritten read")

// DecodeHeader decodes a header read from a replica (b holds 64 bytes). It
// fails when the sealed words do not check (torn, or not written yet).
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < hdrSize {
		return Header{}, errTorn
	}
	var w [8]uint64
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	if w[7] != headerCheck(&w) {
		return Header{}, errTorn
	}
	g := geometryOf(w[4])
	if w[4]&^gfCatchingUp != g.word() || g.LogBuckets > 40 || g.Migrating && (g.OldLog > 40 || g.OldLog >= g.LogBuckets) {
		return Header{}, errTorn
	}
	return Header{Promise: w[0], Serving: w[1], Applied: w[2], AppliedAt: int64(w[3]),
		Geometry: g, Inc: w[5], Layout: w[6], CatchingUp: w[4]&gfCatchingUp != 0}, nil
}

// sameLayout reports whether two header reads saw one layout of one table,
// with no request of several ops being applied (an odd layout).
func sameLayout(a, b *Header) bool {
	return a.Inc == b.Inc && a.Layout == b.Layout && a.Layout%2 == 0 && a.Geometry == b.Geometry
}

// Slot is a decoded index slot.
type Slot struct {
	Version uint64
	FP      uint8
	Units   uint16
	Heap    uint8
	Off     uint64 // byte offset in the heap region
}

func (s Slot) refWord() uint64 {
	return uint64(s.FP) | uint64(s.Units)<<8 | uint64(s.Heap)<<24 | (s.Off/recAlign)<<32
}

func slotOf(version, ref uint64) Slot {
	return Slot{Version: version, FP: uint8(ref), Units: uint16(ref >> 8), Heap: uint8(ref >> 24), Off: (ref >> 32) * recAlign}
}

// decodeSlot reads slot i of a bucket image.
func decodeSlot(bucket []byte, i int) Slot {
	off := bucketHdr + i*slotSize
	return slotOf(binary.LittleEndian.Uint64(bucket[off:]), binary.LittleEndian.Uint64(bucket[off+8:]))
}

// storeSlot writes slot i of a bucket in registered memory, ref first: a
// reader that sees the new version with the old ref (or the reverse) finds
// a record whose version differs, and retries.
func storeSlot(mem []byte, bucketOff, i int, s Slot) {
	off := bucketOff + bucketHdr + i*slotSize
	rdma.Store64(mem, off+8, s.refWord())
	rdma.Store64(mem, off, s.Version)
}

func clearSlot(mem []byte, bucketOff, i int) {
	off := bucketOff + bucketHdr + i*slotSize
	rdma.Store64(mem, off, 0)
	rdma.Store64(mem, off+8, 0)
}

// bucketMoved reports a bucket image's moved flag.
func bucketMoved(bucket []byte) bool {
	return binary.LittleEndian.Uint64(bucket)&bMoved != 0
}

// recordSize is the aligned size of a record with klen+vlen bytes.
func recordSize(klen, vlen int) int {
	return (recHdr + rdma.Round8(klen+vlen) + 8 + recAlign - 1) &^ (recAlign - 1)
}

// unitsOf is a record's size as a slot stores it.
func unitsOf(size int) uint16 {
	if u := size / recAlign; u < unitsLarge {
		return uint16(u)
	}
	return unitsLarge
}

// encodeRecord writes the record (version, key, value) into dst, which
// holds recordSize(len(key), len(value)) bytes.
func encodeRecord(dst []byte, version uint64, key, value []byte) {
	binary.LittleEndian.PutUint64(dst, version)
	binary.LittleEndian.PutUint64(dst[8:], uint64(uint32(len(key)))|uint64(uint32(len(value)))<<32)
	n := copy(dst[recHdr:], key)
	n += copy(dst[recHdr+n:], value)
	end := recHdr + rdma.Round8(n)
	clear(dst[recHdr+n : end])
	binary.LittleEndian.PutUint64(dst[end:], xxhash.Sum64(dst[:end]))
}

// RecordInfo is what a record's first 16 bytes say.
type RecordInfo struct {
	Version    uint64
	KLen, VLen int
}

// Size is the record's aligned size.
func (ri RecordInfo) Size() int { return recordSize(ri.KLen, ri.VLen) }

func recordInfo(b []byte) RecordInfo {
	w := binary.LittleEndian.Uint64(b[8:])
	return RecordInfo{Version: binary.LittleEndian.Uint64(b), KLen: int(uint32(w)), VLen: int(w >> 32)}
}

// DecodeRecord validates a record read from a replica and returns its key
// and value (slices of b). It fails when b is torn, too short, or holds no
// record.
func DecodeRecord(b []byte) (ri RecordInfo, key, value []byte, err error) {
	return decodeRecord(b, true)
}

// decodeRecord is DecodeRecord; check false skips the check word (a
// planted bug of TestSimTornMutants, never in production).
func decodeRecord(b []byte, check bool) (ri RecordInfo, key, value []byte, err error) {
	if len(b) < recHdr+8 {
		return ri, nil, nil, errTorn
	}
	ri = recordInfo(b)
	if ri.KLen < 0 || ri.VLen < 0 || ri.KLen > len(b) || ri.VLen > len(b) || recHdr+ri.KLen+ri.VLen+8 > len(b) {
		return ri, nil, nil, errTorn
	}
	end := recHdr + rdma.Round8(ri.KLen+ri.VLen)
	if end+8 > len(b) || check && binary.LittleEndian.Uint64(b[end:]) != xxhash.Sum64(b[:end]) {
		return ri, nil, nil, errTorn
	}
	key = b[recHdr : recHdr+ri.KLen]
	value = b[recHdr+ri.KLen : recHdr+ri.KLen+ri.VLen]
	return ri, key, value, nil
}

// Hashing: one xxhash of the key gives its hash slot (the group), its two
// candidate buckets in every generation, and its fingerprint.
func hashKey(key []byte) uint64 { return xxhash.Sum64(key) }

// HashSlot is the key's hash slot (of NumHashSlots).
func HashSlot(key []byte) int { return hashSlotOf(hashKey(key)) }

func hashSlotOf(h uint64) int { return int(h>>54) % NumHashSlots }

// NumHashSlots is the fixed number of hash slots keys map to; the cluster
// map assigns each slot to a group.
const NumHashSlots = 1024

func fpOf(h uint64) uint8 { return uint8(h >> 40) }

// candidates are the key's two buckets in a generation of 2^log buckets
// (log >= 2), in different pairs: a key lives in one of them or, when both
// are full, in one of their neighbours (b^1, RACE hashing's overflow bucket
// shared by two), so a reader reads the two aligned pairs of 256 bytes.
func candidates(h uint64, log int) (int, int) {
	mask := uint64(1)<<log - 1
	b1 := h & mask
	h2 := (h>>32 | h<<32) * 0x9e3779b97f4a7c15
	b2 := (h2 >> 20) & mask
	if b2>>1 == b1>>1 {
		b2 = b1 ^ 2
	}
	return int(b1), int(b2)
}

// places are the four buckets a key may live in, in the order an insert
// prefers them.
func places(h uint64, log int) [4]int {
	b1, b2 := candidates(h, log)
	return [4]int{b1, b2, b1 ^ 1, b2 ^ 1}
}

// pairOf is the first bucket of b's aligned pair.
func pairOf(b int) int { return b &^ 1 }
