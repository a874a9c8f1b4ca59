package multicast

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"github.com/rdmakv/rdmakv/multicast/tree"
)

// regionMem returns n zeroed bytes, 8-aligned as region memory is (the
// header word is read with rdma.Load64).
func regionMem(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

const sentinel = 0xa5

func sentinelBuf(n int) []byte { return bytes.Repeat([]byte{sentinel}, n) }

// TestCopyRecordLength: the leader copies a client's record out of its
// ring slot by the length in the slot's header word. It copies only the
// record (not the rest of the slot), and a header that claims a length
// beyond the slot, or beyond what was written, is refused without reading
// out of range, even in the last slot of a region.
func TestCopyRecordLength(t *testing.T) {
	const slotSize = 256
	const slots = 2
	mem := regionMem(slots * slotSize)
	last := (slots - 1) * slotSize // the region's last slot: reading past it would be out of range
	rec := record{pos: 3, id: MsgID{Client: 1, Inc: 2, Seq: 3}, dst: tree.Of(0), reply: Addr{Node: 4, Region: 5}, payload: []byte("hello, record")}
	size := recordSize(len(rec.payload))

	t.Run("valid record, only its bytes copied", func(t *testing.T) {
		clear(mem)
		encodeRecord(mem[last:], &rec)
		for i := last + size; i < len(mem); i++ {
			mem[i] = 0x5a // stale bytes of an earlier, longer record
		}
		dst := sentinelBuf(slotSize)
		got, err := copyRecord(dst, mem, last, slotSize, rec.pos)
		if err != nil {
			t.Fatalf("valid record refused: %v", err)
		}
		if got.id != rec.id || got.dst != rec.dst || got.reply != rec.reply || !bytes.Equal(got.payload, rec.payload) {
			t.Fatalf("decoded %+v, wrote %+v", got, rec)
		}
		if !bytes.Equal(dst[:size], mem[last:last+size]) {
			t.Fatalf("copied record differs from the slot's")
		}
		for i := size; i < slotSize; i++ {
			if dst[i] != sentinel {
				t.Fatalf("copied %d bytes or more of a %d-byte slot for a %d-byte record (byte %d changed to %#x)", i+1, slotSize, size, i, dst[i])
			}
		}
	})

	t.Run("length beyond the slot", func(t *testing.T) {
		for _, n := range []uint32{uint32(maxPayload(slotSize) + 1), slotSize, 1 << 20, 1<<32 - 1} {
			clear(mem)
			encodeRecord(mem[last:], &rec)
			putLen(mem[last:], n)
			dst := sentinelBuf(slotSize)
			_, err := copyRecord(dst, mem, last, slotSize, rec.pos)
			if err == nil || errors.Is(err, errNoRecord) {
				t.Fatalf("length %d: got %v, want the malformed-length error", n, err)
			}
			if !bytes.Equal(dst, sentinelBuf(slotSize)) {
				t.Fatalf("length %d: a refused record was copied", n)
			}
		}
	})

	t.Run("length beyond what was written", func(t *testing.T) {
		// the header claims more than the client wrote: the check word is
		// not where the length says, so the slot reads as not (yet) valid
		for _, n := range []uint32{uint32(len(rec.payload)) + 8, uint32(maxPayload(slotSize))} {
			clear(mem)
			encodeRecord(mem[last:], &rec)
			putLen(mem[last:], n)
			if _, err := copyRecord(sentinelBuf(slotSize), mem, last, slotSize, rec.pos); !errors.Is(err, errNoRecord) {
				t.Fatalf("length %d over a %d-byte payload: got %v, want errNoRecord", n, len(rec.payload), err)
			}
		}
		// a record whose write landed only in part (its check word not yet)
		clear(mem)
		b := encodeRecord(make([]byte, slotSize), &rec)
		copy(mem[last:], b[:len(b)-recCheck])
		if _, err := copyRecord(sentinelBuf(slotSize), mem, last, slotSize, rec.pos); !errors.Is(err, errNoRecord) {
			t.Fatalf("partly written record: got %v, want errNoRecord", err)
		}
	})

	t.Run("another position or a shorter length", func(t *testing.T) {
		clear(mem)
		encodeRecord(mem[last:], &rec)
		if _, err := copyRecord(sentinelBuf(slotSize), mem, last, slotSize, rec.pos+slots); !errors.Is(err, errNoRecord) {
			t.Fatalf("record of position %d taken as %d: %v", rec.pos, rec.pos+slots, err)
		}
		putLen(mem[last:], uint32(len(rec.payload)-8))
		if _, err := copyRecord(sentinelBuf(slotSize), mem, last, slotSize, rec.pos); !errors.Is(err, errNoRecord) {
			t.Fatalf("shortened length: got %v, want errNoRecord", err)
		}
	})
}

func putLen(slot []byte, n uint32) {
	slot[28], slot[29], slot[30], slot[31] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
}

// FuzzCopyRecord: copyRecord reads a slot another process writes. On any
// slot bytes it agrees with decodeRecord on a copy of the whole slot (the
// leader's former read): the same record or a refusal, and never reads
// out of range (the slot is the last of its region here).
func FuzzCopyRecord(f *testing.F) {
	rec := record{pos: 7, id: MsgID{Client: 3, Inc: 9, Seq: 11}, dst: tree.Of(1, 2), reply: Addr{Node: 5, Region: 6}, payload: []byte("hello")}
	f.Add(encodeRecord(make([]byte, 128), &rec), uint64(7))
	long := rec
	long.payload = bytes.Repeat([]byte("x"), maxPayload(128))
	f.Add(encodeRecord(make([]byte, 128), &long), uint64(7))
	over := encodeRecord(make([]byte, 128), &rec)
	putLen(over, 1000)
	f.Add(over, uint64(7))
	torn := encodeRecord(make([]byte, 128), &rec)
	putLen(torn, 13)
	f.Add(torn, uint64(7))
	f.Fuzz(func(t *testing.T, slot []byte, pos uint64) {
		slotSize := pad8(max(len(slot), recHdr+recCheck))
		mem := regionMem(slotSize)
		copy(mem, slot)
		whole := append([]byte(nil), mem...)
		want, werr := decodeRecord(whole, pos)
		dst := sentinelBuf(slotSize)
		got, gerr := copyRecord(dst, mem, 0, slotSize, pos)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("whole-slot decode: %v; record copy: %v", werr, gerr)
		}
		if gerr != nil {
			return
		}
		if got.pos != want.pos || got.id != want.id || got.dst != want.dst || got.reply != want.reply || !bytes.Equal(got.payload, want.payload) {
			t.Fatalf("record copy %+v, whole-slot decode %+v", got, want)
		}
		for i := recordSize(len(got.payload)); i < slotSize; i++ {
			if dst[i] != sentinel {
				t.Fatalf("byte %d copied beyond the %d-byte record", i, recordSize(len(got.payload)))
			}
		}
	})
}
