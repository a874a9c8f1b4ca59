package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	segMagic   = 0x57564b52 // "RKVW" little-endian
	segVersion = 1
	segHdrSize = 32
	// DefaultSegmentBytes is a segment's preallocated size.
	DefaultSegmentBytes = 64 << 20
)

type segHeader struct {
	member   uint64
	firstSeq uint64
	segseq   uint32
}

func putSegHeader(dst []byte, h segHeader) {
	binary.LittleEndian.PutUint32(dst[0:], segMagic)
	binary.LittleEndian.PutUint16(dst[4:], segVersion)
	binary.LittleEndian.PutUint16(dst[6:], 0)
	binary.LittleEndian.PutUint64(dst[8:], h.member)
	binary.LittleEndian.PutUint64(dst[16:], h.firstSeq)
	binary.LittleEndian.PutUint32(dst[24:], h.segseq)
	binary.LittleEndian.PutUint32(dst[28:], crc32.Checksum(dst[:28], castagnoli))
}

func parseSegHeader(b []byte) (segHeader, error) {
	if len(b) < segHdrSize {
		return segHeader{}, fmt.Errorf("short header (%d bytes)", len(b))
	}
	if binary.LittleEndian.Uint32(b[0:]) != segMagic {
		return segHeader{}, fmt.Errorf("bad magic")
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return segHeader{}, fmt.Errorf("header checksum mismatch")
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != segVersion {
		return segHeader{}, fmt.Errorf("version %d, want %d", v, segVersion)
	}
	return segHeader{member: binary.LittleEndian.Uint64(b[8:]), firstSeq: binary.LittleEndian.Uint64(b[16:]),
		segseq: binary.LittleEndian.Uint32(b[24:])}, nil
}

// SegName is the file name of segment segseq.
func SegName(segseq uint32) string { return fmt.Sprintf("%016x.seg", segseq) }

// parseSegName returns the segseq of a segment file name.
func parseSegName(name string) (uint32, bool) {
	hex, ok := strings.CutSuffix(name, ".seg")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(hex, 16, 32)
	if err != nil {
		return 0, false
	}
	return uint32(v), true
}

// SegInfo describes one segment of a recovered log.
type SegInfo struct {
	Seq      uint32 // segseq
	FirstSeq uint64 // seq of its first record (from its header)
	Path     string
	Size     int64 // file size
	End      int64 // offset after its last valid record
}

func segPath(dir string, segseq uint32) string { return filepath.Join(dir, SegName(segseq)) }
