// Package wal is rdmakv's write-ahead log: records appended by one writer,
// grouped into batches, each batch written and fsynced before the next one
// starts, into preallocated segment files; and the recovery that reads
// them back, cuts a torn tail and reports corruption.
//
// The Writer is a pure state machine polled with the caller's clock: it
// never blocks and never reads the time, and talks to the disk only
// through a Device (Submit an IO, Reap its completion later, in order).
// NewFileDevice runs the IOs on a goroutine over a vfs.FS; the simulator
// runs them over its virtual disk with seeded latencies, so the same Writer
// runs in production and in the simulator.
//
// On-disk format (docs/dev/durability-plan.md §3.1): a segment file
// "<segseq %016x>.seg" starts with a 32-byte header (magic "RKVW",
// version, member, first seq, segseq, CRC32C) followed by records, each
// 8-byte aligned: [crc32c u32][type u8][flags u8][0 u16][seq u64][len u32]
// [0 u32][payload][pad], the CRC (Castagnoli) covering bytes 4..24+len;
// seq rises by one per record across segments. The first record of every
// batch is a Batch record ([first seq][count][bytes][previous batch's last
// seq]); zero bytes after the last record end a segment's data.
//
// Because only one batch is ever in flight, only the last batch can be
// torn by a crash: Recover calls an invalid record with no valid Batch
// record after it a torn tail (cut back, with a copy of the cut bytes),
// and an invalid record followed by a valid batch corruption (reported,
// never cut).
package wal

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
)

// RecType is a record's type. The log's user (broadcast) gives the types
// above Batch their meaning; Recover knows only Batch, and that a DiffBegin
// without its DiffEnd at the end of the log is dropped.
type RecType uint8

const (
	RecBatch     RecType = 1 // first record of every batch (written by the Writer)
	RecEntry     RecType = 2
	RecDiffBegin RecType = 3
	RecDiffEnd   RecType = 4
	RecCommit    RecType = 5
	RecSnapMark  RecType = 6
	RecPad       RecType = 7
)

const (
	recHdrSize   = 24
	batchPayload = 24
	batchRecSize = recHdrSize + batchPayload
	// MaxRecord is the largest payload a record may carry.
	MaxRecord = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recSize is the aligned size of a record with an n-byte payload.
func recSize(n int) int { return (recHdrSize + n + 7) &^ 7 }

// Pos is a place in the log: a segment and an offset in its file.
type Pos struct {
	Seg uint32
	Off int64
}

// Record is one recovered record. Data aliases the recovered segment's
// bytes: copy what must outlive the Recovered.
type Record struct {
	Type  RecType
	Flags uint8
	Seq   uint64
	Data  []byte
	Pos   Pos
}

// putRecord writes a record at the start of dst (len(dst) >= recSize) and
// returns its size. The padding is zeroed.
func putRecord(dst []byte, typ RecType, flags uint8, seq uint64, parts ...[]byte) int {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	sz := recSize(n)
	dst = dst[:sz]
	dst[4] = byte(typ)
	dst[5] = flags
	dst[6], dst[7] = 0, 0
	binary.LittleEndian.PutUint64(dst[8:], seq)
	binary.LittleEndian.PutUint32(dst[16:], uint32(n))
	binary.LittleEndian.PutUint32(dst[20:], 0)
	off := recHdrSize
	for _, p := range parts {
		off += copy(dst[off:], p)
	}
	clear(dst[off:])
	binary.LittleEndian.PutUint32(dst[0:], crc32.Checksum(dst[4:recHdrSize+n], castagnoli))
	return sz
}

// parseRecord reads the record at b[0:]: ok if its length fits in b and
// its CRC matches. size is the aligned size.
func parseRecord(b []byte) (r Record, size int, ok bool) {
	if len(b) < recHdrSize {
		return r, 0, false
	}
	n := binary.LittleEndian.Uint32(b[16:])
	if int64(n) > int64(len(b)-recHdrSize) || n > MaxRecord {
		return r, 0, false
	}
	if crc32.Checksum(b[4:recHdrSize+int(n)], castagnoli) != binary.LittleEndian.Uint32(b) {
		return r, 0, false
	}
	r = Record{Type: RecType(b[4]), Flags: b[5], Seq: binary.LittleEndian.Uint64(b[8:]), Data: b[recHdrSize : recHdrSize+int(n) : recHdrSize+int(n)]}
	size = recSize(int(n))
	if size > len(b) {
		// the padding is cut off at the end of the file: still a record
		size = len(b)
	}
	return r, size, true
}

// BatchInfo is a Batch record's payload.
type BatchInfo struct {
	First    uint64 // seq of the Batch record itself
	Count    uint32 // records in the batch, the Batch record included
	Bytes    uint32 // bytes of the batch
	PrevLast uint64 // last seq of the previous batch (0 if none)
}

func putBatchInfo(dst []byte, bi BatchInfo) {
	binary.LittleEndian.PutUint64(dst[0:], bi.First)
	binary.LittleEndian.PutUint32(dst[8:], bi.Count)
	binary.LittleEndian.PutUint32(dst[12:], bi.Bytes)
	binary.LittleEndian.PutUint64(dst[16:], bi.PrevLast)
}

func parseBatchInfo(b []byte) (BatchInfo, bool) {
	if len(b) != batchPayload {
		return BatchInfo{}, false
	}
	return BatchInfo{First: binary.LittleEndian.Uint64(b[0:]), Count: binary.LittleEndian.Uint32(b[8:]),
		Bytes: binary.LittleEndian.Uint32(b[12:]), PrevLast: binary.LittleEndian.Uint64(b[16:])}, true
}

var zeroPage [4096]byte

// allZero reports whether b holds only zeros (a page at a time: Recover
// probes megabytes of a segment's preallocated tail).
func allZero(b []byte) bool {
	for len(b) >= len(zeroPage) {
		if !bytes.Equal(b[:len(zeroPage)], zeroPage[:]) {
			return false
		}
		b = b[len(zeroPage):]
	}
	return bytes.Equal(b, zeroPage[:len(b)])
}
