package shm

import (
	"bytes"
	"errors"
	"testing"
)

// Node and region files are written by other processes (possibly dead,
// possibly of another program); their headers are decoded before any
// access. Both targets check that a header the decoder accepts is exactly
// what the encoder writes for it, and that a region header's bounds keep
// every later access inside the file.

func FuzzNodeHeader(f *testing.F) {
	b := make([]byte, nodeFileSize)
	encodeNodeHeader(b, nodeHeader{id: 7, owner: 12345})
	f.Add(b[:64])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, head []byte) {
		if len(head) > nodeFileSize {
			head = head[:nodeFileSize]
		}
		b := make([]byte, nodeFileSize)
		copy(b, head)
		h, err := decodeNodeHeader(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		out := make([]byte, nodeFileSize)
		encodeNodeHeader(out, h)
		if !bytes.Equal(out[:32], b[:32]) {
			t.Fatalf("node header %x re-encodes as %x", b[:32], out[:32])
		}
	})
}

func FuzzRegionHeader(f *testing.F) {
	b := make([]byte, regionTableOff)
	encodeRegionHeader(b, regionHeader{size: 4096, node: 3, region: 9, owner: 77, slots: regionSlots, dataOff: regionDataOff})
	f.Add(b, int64(regionDataOff+4096))
	f.Add(b, int64(regionDataOff))
	f.Add(b[:40], int64(64))
	// A peer table so large that its byte size wraps around 2^64.
	huge := make([]byte, regionTableOff)
	encodeRegionHeader(huge, regionHeader{slots: 1 << 59, dataOff: 1 << 59})
	f.Add(huge, int64(1<<59))
	f.Fuzz(func(t *testing.T, head []byte, fileSize int64) {
		h, err := decodeRegionHeader(head, int(fileSize))
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		switch {
		case h.slots <= 0 || h.dataOff < regionTableOff:
			t.Fatalf("accepted %d slots with data at %d", h.slots, h.dataOff)
		case (h.dataOff-regionTableOff)/regionSlotSize < h.slots:
			t.Fatalf("peer table of %d slots overlaps data at %d", h.slots, h.dataOff)
		case h.size < 0 || int64(h.dataOff)+int64(h.size) > fileSize || fileSize-(int64(h.dataOff)+int64(h.size)) >= hugePageSize:
			// The data ends inside the file, followed by less than one
			// huge page of padding (a region on huge pages).
			t.Fatalf("data at %d of %d bytes in a %d-byte file", h.dataOff, h.size, fileSize)
		}
		out := make([]byte, regionTableOff)
		encodeRegionHeader(out, h)
		// The closed word (40..48) is state, not header: the owner sets it.
		in := append([]byte(nil), head[:regionTableOff]...)
		copy(in[regionClosedW:regionClosedW+8], out[regionClosedW:regionClosedW+8])
		if !bytes.Equal(out, in) {
			t.Fatalf("region header %x re-encodes as %x", in, out)
		}
	})
}
