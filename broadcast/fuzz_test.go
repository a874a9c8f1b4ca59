package broadcast

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// Fuzz targets for every decoder of bytes another process wrote: ring
// records and SST rows (peers write them into our memory), diff entries,
// fetched snapshots, and the stable file. Each checks a property, not only
// the absence of panics.

// aligned copies b into a fresh allocation (8-aligned, as region memory
// is), cut to a multiple of 8 bytes.
func aligned(b []byte) []byte {
	out := make([]byte, len(b)&^7)
	copy(out, b)
	return out
}

// FuzzDecodeRecord: whatever a ring holds, decodeRecord never panics, and
// a record it accepts lies inside the ring at the expected position.
func FuzzDecodeRecord(f *testing.F) {
	ring := make([]byte, 256)
	copy(ring[recHdr:], "hello")
	encodeRecord(ring, recHeader{len: 5, kind: kMsg, sinc: 1, rinc: 2, seq: 0, hdr: MsgHdr{E: 7, Cnt: 3}})
	f.Add(ring, uint16(0), uint64(0))
	f.Add(ring, uint16(8), uint64(0))
	f.Add(make([]byte, 64), uint16(0), uint64(0))
	f.Add([]byte{255, 255, 255, 255, 2, 0, 0, 0}, uint16(0), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, off uint16, seq uint64) {
		mem := aligned(b)
		o := int(off) &^ 7
		if o > len(mem) {
			return
		}
		h, size, ok := decodeRecord(mem, o, seq, 1, 2)
		if !ok {
			return
		}
		switch {
		case size != recSize(h.len):
			t.Fatalf("size %d for a %d-byte payload", size, h.len)
		case o+size > len(mem):
			t.Fatalf("record at %d of %d bytes overruns a %d-byte ring", o, size, len(mem))
		case h.kind < kPad || h.kind > kSnapshot:
			t.Fatalf("accepted kind %d", h.kind)
		case h.seq != seq:
			t.Fatalf("accepted seq %d at position %d", h.seq, seq)
		}
	})
}

// FuzzTornRecord: a record encodeRecord wrote is accepted with its header
// and payload; the same record with any one byte changed, or cut short by
// the end of the ring, is not (a write still landing, or a torn one).
func FuzzTornRecord(f *testing.F) {
	f.Add([]byte("payload"), uint8(kMsg), uint64(0), uint64(MakeEpoch(0, 1)), uint64(1), uint8(1), uint8(1), uint16(0), uint16(3), uint8(1), uint8(0), uint8(0))
	f.Add([]byte{}, uint8(kPad), uint64(1<<20), uint64(5), uint64(9), uint8(3), uint8(4), uint16(8), uint16(40), uint8(0x80), uint8(4), uint8(2))
	f.Add(bytes.Repeat([]byte{0xff}, 1000), uint8(kDiffEnd), uint64(7), uint64(5), uint64(9), uint8(0), uint8(255), uint16(64), uint16(1000), uint8(0xff), uint8(200), uint8(5))
	f.Fuzz(func(t *testing.T, payload []byte, kind uint8, seq, e, cnt uint64, sinc, rinc uint8, off, at uint16, mask, cut, tail uint8) {
		if len(payload) > 4096 {
			payload = payload[:4096]
		}
		// Incarnations whose low bytes are sinc and rinc, the high ones
		// from the other fuzzed words.
		si, ri := e<<8|uint64(sinc), cnt<<8|uint64(rinc)
		h := recHeader{len: len(payload), kind: kPad + kind%kSnapshot, sinc: si, rinc: ri, seq: seq, hdr: MsgHdr{E: Epoch(e), Cnt: cnt}}
		o := int(off%1024) &^ 7
		size := recSize(h.len)
		mem := make([]byte, o+size+int(tail)*8)
		copy(mem[o+recHdr:], payload)
		if n := encodeRecord(mem[o:], h); n != size {
			t.Fatalf("encodeRecord wrote %d bytes, recSize says %d", n, size)
		}
		got, gotSize, ok := decodeRecord(mem, o, seq, si, ri)
		if !ok || got != h || gotSize != size {
			t.Fatalf("encoded %+v (%d bytes), decoded %+v (%d bytes, ok %v)", h, size, got, gotSize, ok)
		}
		if p := mem[o+recHdr : o+recHdr+got.len]; !bytes.Equal(p, payload) {
			t.Fatalf("payload %x decoded as %x", payload, p)
		}
		// The ring ends 8 to size bytes early (in whole words: rings are).
		short := 8 * (1 + int(cut)%(size/8))
		// Another incarnation of either side, even with the same low
		// byte, does not accept it.
		if _, _, ok := decodeRecord(mem, o, seq, si+256, ri); ok {
			t.Fatalf("a record of sender incarnation %d accepted as one of %d", si, si+256)
		}
		if _, _, ok := decodeRecord(mem, o, seq, si, ri^1<<20); ok {
			t.Fatalf("a record for receiver incarnation %d accepted by %d", ri, ri^1<<20)
		}
		if _, _, ok := decodeRecord(mem[:o+size-short], o, seq, si, ri); ok {
			t.Fatalf("accepted a %d-byte record in a ring cut %d bytes short", size, short)
		}
		if mask == 0 {
			mask = 1
		}
		k := o + int(at)%size
		mem[k] ^= mask
		if _, _, ok := decodeRecord(mem, o, seq, si, ri); ok {
			t.Fatalf("accepted the %d-byte record with byte %d xored with %#x", size, k-o, mask)
		}
	})
}

// FuzzRow: a row sealed for slot (t, i) validates there and only there,
// and not with any one bit flipped; a row of incarnation 0 (never written)
// never validates.
func FuzzRow(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint64(3), uint64(1), uint64(5), uint8(0), uint8(0), uint8(3), uint16(0))
	f.Add(uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint8(1), uint8(2), uint8(5), uint16(511))
	f.Fuzz(func(t *testing.T, w0, w1, w2, inc, w4 uint64, tt, i, n uint8, flip uint16) {
		nn := 1 + int(n)%9
		tb, ib := int(tt)%nTables, int(i)%nn
		mem := make([]byte, sstSize(nn))
		r := row{w0, w1, w2, inc, w4}
		encodeRow(mem[rowOffset(tb, ib, nn):], &r, tb, ib)
		got, ok := decodeRow(mem, tb, ib, nn)
		if ok != (inc != 0) || got != r {
			t.Fatalf("row %v at (%d,%d) decoded as %v, valid %v", r, tb, ib, got, ok)
		}
		// The same bytes in every other slot are rejected: a row cannot be
		// misplaced.
		src := append([]byte(nil), mem[rowOffset(tb, ib, nn):][:rowSize]...)
		for t2 := 0; t2 < nTables; t2++ {
			for i2 := 0; i2 < nn; i2++ {
				if t2 == tb && i2 == ib {
					continue
				}
				copy(mem[rowOffset(t2, i2, nn):], src)
				if _, ok := decodeRow(mem, t2, i2, nn); ok {
					t.Fatalf("row sealed for (%d,%d) validates at (%d,%d)", tb, ib, t2, i2)
				}
			}
		}
		bit := int(flip) % (rowSize * 8)
		mem[rowOffset(tb, ib, nn)+bit/8] ^= 1 << (bit % 8)
		if _, ok := decodeRow(mem, tb, ib, nn); ok {
			t.Fatalf("row validates with bit %d flipped", bit)
		}
	})
}

// FuzzDiffEntry: getDiffEntry never panics on a diff payload and never
// reads past it; what it accepts re-encodes to the same header and data.
// It accepts any padding bytes (they are inside the record's checksum, so
// they are what the leader wrote) and a last entry without its padding.
func FuzzDiffEntry(f *testing.F) {
	e := &entry{hdr: MsgHdr{E: MakeEpoch(1, 2), Cnt: 9}, id: proposalID{origin: 2, oinc: 3, pseq: 4}, data: []byte("abc")}
	b := make([]byte, diffEntrySize(e))
	putDiffEntry(b, e)
	f.Add(b)
	f.Add(b[:diffEntryHdr+3])
	f.Add(make([]byte, diffEntryHdr))
	f.Add(make([]byte, diffEntryHdr-1))
	f.Fuzz(func(t *testing.T, src []byte) {
		e, size, ok := getDiffEntry(src)
		if !ok {
			return
		}
		n := diffEntryHdr + len(e.data)
		if size > len(src) || size < n {
			t.Fatalf("entry of %d data bytes has size %d in %d bytes", len(e.data), size, len(src))
		}
		if dlen := binary.LittleEndian.Uint64(src[32:]); dlen != uint64(len(e.data)) {
			t.Fatalf("data of %d bytes, length field %d", len(e.data), dlen)
		}
		out := make([]byte, diffEntrySize(e))
		putDiffEntry(out, e)
		if !bytes.Equal(out[:n], src[:n]) {
			t.Fatalf("entry %x re-encodes as %x", src[:n], out[:n])
		}
	})
}

// FuzzSnapshot: a fetched snapshot meta region either fails with
// errBadSnapshot or is exactly the encoding of what it decoded to (one
// encoding per snapshot), names the group's members in order, decodes
// again to the same snapshot, and its keyed table restores and captures
// unchanged.
func FuzzSnapshot(f *testing.F) {
	members := []rdma.NodeID{1, 2, 3}
	f.Add(encodeSnapMeta(members, snapMeta{index: 42, table: []tableRec{{1, 2}, {3, 4}, {5, 6}}, region: 7, off: 8, size: 9, stateCheck: 10}), uint8(2))
	f.Add(encodeSnapMeta(members[:1], snapMeta{table: []tableRec{{}}}), uint8(0))
	f.Add(encodeSnapMeta(members, snapMeta{index: 42, table: []tableRec{{1, 2}, {3, 4}, {5, 6}}, region: 7, off: 8, size: 9, stateCheck: 10,
		keys: []keySnap{{client: 9, seq: 1, index: 3, result: []byte("abc")}, {client: 2, seq: 7, index: 5, big: true}, {client: 4, seq: 2, index: 42, result: make([]byte, 16)}}}), uint8(2))
	f.Add(make([]byte, 16), uint8(0))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255}, uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		members := make([]rdma.NodeID, 1+int(n)%9)
		for k := range members {
			members[k] = rdma.NodeID(k + 1)
		}
		m, err := decodeSnapMeta(b, members)
		if err != nil {
			if !errors.Is(err, errBadSnapshot) {
				t.Fatalf("error %v does not wrap errBadSnapshot", err)
			}
			return
		}
		if m.off+m.size < m.off {
			t.Fatalf("accepted a state at %d+%d that wraps", m.off, m.size)
		}
		if got := encodeSnapMeta(members, m); !bytes.Equal(got, b) {
			t.Fatalf("snapshot meta %x re-encodes as %x", b, got)
		}
		// Round trip: the encoding decodes to the same snapshot, and a
		// table restored from it captures the same key records.
		m2, err := decodeSnapMeta(encodeSnapMeta(members, m), members)
		if err != nil || !reflect.DeepEqual(m2, m) {
			t.Fatalf("snapshot %+v round-trips as %+v, %v", m, m2, err)
		}
		var kt keyTable
		kt.restore(m.keys, len(m.keys))
		if got := kt.capture(); !reflect.DeepEqual(got, m.keys) {
			t.Fatalf("key table %+v restores and captures as %+v", m.keys, got)
		}
	})
}

// FuzzStableFile: a stable file FileStable.Load reads either fails with
// ErrCorrupt or holds exactly the bytes FileStable.Save writes for the
// state it loaded (one encoding per state: nothing a corrupt file says is
// taken for a state it does not encode).
func FuzzStableFile(f *testing.F) {
	good := encodeStable(StableState{Incarnation: 3, ENew: MakeEpoch(2, 1)})
	f.Add(good[:])
	f.Add(good[:23])
	f.Add(append(good[:], 0))
	f.Add([]byte{})
	dir := f.TempDir()
	in := FileStable{Path: filepath.Join(dir, "in")}
	out := FileStable{Path: filepath.Join(dir, "out")}
	fd, err := os.Create(in.Path)
	if err != nil {
		f.Fatal(err)
	}
	defer fd.Close()
	f.Fuzz(func(t *testing.T, b []byte) {
		// Rewritten in place, not truncated to 0 first: ext4 flushes a
		// file truncated to 0 when it is closed (3x this target's time).
		if _, err := fd.WriteAt(b, 0); err != nil {
			t.Fatal(err)
		}
		if err := fd.Truncate(int64(len(b))); err != nil {
			t.Fatal(err)
		}
		s, err := in.Load()
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("loading %x: error %v does not wrap ErrCorrupt", b, err)
			}
			return
		}
		if err := out.Save(s); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(out.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("stable file %x loads as %+v, which saves as %x", b, s, got)
		}
	})
}
