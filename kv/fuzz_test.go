package kv

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
)

// Fuzz targets for every decoder of bytes another process wrote: the
// header, records and slots clients read one-sided, the requests, staged
// parts and results of the wire, and the snapshots a replica restores
// (records and staged requests). Each checks
// properties, not only the absence of panics: what decodes re-encodes to
// the same bytes, what is encoded decodes back, what is corrupted is
// rejected, and a failed Restore leaves the table as it was.

// words reads b (zero-padded to 64 bytes) as eight little-endian words.
func words(b []byte) (w [8]uint64) {
	var p [hdrSize]byte
	copy(p[:], b)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(p[i*8:])
	}
	return w
}

// headerFrom makes a header DecodeHeader accepts from arbitrary bytes.
func headerFrom(b []byte) Header {
	w := words(b)
	g := Geometry{Gen: int(uint16(w[4])), LogBuckets: int(uint8(w[4]>>16)) % 41}
	if w[4]>>24&1 != 0 && g.LogBuckets > 0 {
		g.Migrating = true
		g.OldGen = int(uint16(w[4] >> 32))
		g.OldLog = int(uint8(w[4]>>48)) % g.LogBuckets
	}
	return Header{Promise: w[0], Serving: w[1], Applied: w[2], AppliedAt: int64(w[3]),
		Geometry: g, Inc: w[5], Layout: w[6], CatchingUp: w[4]&gfCatchingUp != 0}
}

// headerBytes is h's full encoding, promise word included.
func headerBytes(h Header) []byte {
	b := make([]byte, hdrSize)
	binary.LittleEndian.PutUint64(b, h.Promise)
	encodeHeader(b, &h)
	return b
}

// checkDecodedHeader checks what DecodeHeader promises of a header it
// accepted from b: the geometry bounds, and that b's words 1..7 are
// exactly encodeHeader's encoding of it (its promise word is b's word 0).
func checkDecodedHeader(t *testing.T, b []byte, h Header) {
	t.Helper()
	g := h.Geometry
	if g.LogBuckets > 40 || g.Migrating && (g.OldLog > 40 || g.OldLog >= g.LogBuckets) {
		t.Fatalf("accepted geometry %+v out of bounds", g)
	}
	if w := binary.LittleEndian.Uint64(b); h.Promise != w {
		t.Fatalf("promise %#x, word 0 is %#x", h.Promise, w)
	}
	if enc := headerBytes(h); !bytes.Equal(enc, b[:hdrSize]) {
		t.Fatalf("decoded %+v\n  from %x\n  which encodes to %x", h, b[:hdrSize], enc)
	}
}

func FuzzHeader(f *testing.F) {
	for _, h := range []Header{
		{},
		{Promise: 5, Serving: 5, Applied: 1, AppliedAt: 1_700_000_000_000_000_000, Geometry: Geometry{LogBuckets: 10}, Inc: 42},
		{Promise: 7, Serving: 0, Applied: 1 << 40, AppliedAt: -1, Geometry: Geometry{Gen: 3, LogBuckets: 13, Migrating: true, OldGen: 2, OldLog: 12}, Inc: ^uint64(0), Layout: 9},
		{Promise: 1, Serving: 1, Applied: 77, Geometry: Geometry{Gen: 65535, LogBuckets: 40, Migrating: true, OldGen: 65534, OldLog: 39}, Inc: 3, Layout: 1 << 50},
		{Geometry: Geometry{Gen: 1, LogBuckets: 1, Migrating: true, OldGen: 0, OldLog: 0}},
		{Serving: 9, Geometry: Geometry{Gen: 59, LogBuckets: 2}, Layout: 2},
		{Promise: 4, Applied: 0, Geometry: Geometry{LogBuckets: 10}, Inc: 8, CatchingUp: true},
		{Promise: 6, Applied: 12, Geometry: Geometry{Gen: 2, LogBuckets: 11, Migrating: true, OldGen: 1, OldLog: 10}, Inc: 9, Layout: 4, CatchingUp: true},
	} {
		f.Add(headerBytes(h))
	}
	f.Add(make([]byte, hdrSize)) // an unwritten header
	f.Add([]byte{1, 2, 3})

	f.Fuzz(func(t *testing.T, b []byte) {
		// The bytes as read: accepted only if they are an encoding.
		h, err := DecodeHeader(b)
		if len(b) < hdrSize && err == nil {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if err == nil {
			checkDecodedHeader(t, b, h)
		}
		if len(b) >= hdrSize {
			// The same words 0..6 sealed with the check word a writer
			// computes: accepted only if in bounds and canonical (the
			// geometry word is what geometryOf's result encodes to, with
			// at most the catching-up flag in its top byte).
			s := bytes.Clone(b[:hdrSize])
			w := words(s)
			binary.LittleEndian.PutUint64(s[hCheck:], headerCheck(&w))
			h, err := DecodeHeader(s)
			g := geometryOf(w[4])
			inBounds := g.LogBuckets <= 40 && (!g.Migrating || g.OldLog < g.LogBuckets) && g.word() == w[4]&^gfCatchingUp
			if err == nil {
				checkDecodedHeader(t, s, h)
			} else if inBounds {
				t.Fatalf("rejected %x (geometry %+v in bounds): %v", s, g, err)
			}
		}

		// A valid header made of the input's bits round-trips, and
		// every single bit flip of its sealed words 1..7 is rejected.
		want := headerFrom(b)
		enc := headerBytes(want)
		got, err := DecodeHeader(enc)
		if err != nil || got != want {
			t.Fatalf("encoded %+v, decoded %+v, %v", want, got, err)
		}
		for bit := 8 * hServing; bit < 8*hdrSize; bit++ {
			enc[bit/8] ^= 1 << (bit % 8)
			if h, err := DecodeHeader(enc); err == nil {
				t.Fatalf("flip of bit %d (word %d) of %+v accepted as %+v", bit%64, bit/64, want, h)
			}
			enc[bit/8] ^= 1 << (bit % 8)
		}
		// The promise word is not sealed: it may change alone.
		enc[0] ^= 0x80
		if got, err := DecodeHeader(enc); err != nil || got.Promise != want.Promise^0x80 {
			t.Fatalf("promise changed alone: %+v, %v", got, err)
		}
	})
}

// sliceAt reports where s starts in b: -1 if s does not lie inside b, -2
// if s is empty (it holds no bytes of anything).
func sliceAt(b, s []byte) int {
	if len(s) == 0 {
		return -2
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	if p < base || p+uintptr(len(s)) > base+uintptr(len(b)) {
		return -1
	}
	return int(p - base)
}

// coveredLen is how many bytes of a record its check word covers,
// itself included.
func coveredLen(klen, vlen int) int { return recHdr + rdma.Round8(klen+vlen) + 8 }

func FuzzRecord(f *testing.F) {
	for _, s := range []struct {
		ver  uint64
		k, v string
	}{
		{1, "", ""},
		{1 << 16, "key", "value"},
		{42<<16 | 3, "k", ""},
		{^uint64(0), "12345678", "1234567"},
		{7, "a-key-of-some-length", string(bytes.Repeat([]byte{0xab}, 300))},
	} {
		rec := make([]byte, recordSize(len(s.k), len(s.v)))
		encodeRecord(rec, s.ver, []byte(s.k), []byte(s.v))
		f.Add(s.ver, []byte(s.k), []byte(s.v), rec)
	}
	f.Add(uint64(0), []byte{}, []byte{}, make([]byte, 32))
	f.Add(uint64(0), []byte("x"), []byte("y"), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})

	f.Fuzz(func(t *testing.T, version uint64, key, value, raw []byte) {
		// Arbitrary bytes: when accepted, the key and value sit where the
		// layout says, inside the bytes the check covers.
		ri, k, v, err := DecodeRecord(raw)
		if err == nil {
			if ri.KLen != len(k) || ri.VLen != len(v) {
				t.Fatalf("info %+v with a %d-byte key and %d-byte value", ri, len(k), len(v))
			}
			n := coveredLen(ri.KLen, ri.VLen)
			if n > len(raw) {
				t.Fatalf("accepted %d bytes holding a record that covers %d", len(raw), n)
			}
			if at := sliceAt(raw, k); at != -2 && at != recHdr {
				t.Fatalf("key at %d of the input, want %d", at, recHdr)
			}
			if at := sliceAt(raw, v); at != -2 && at != recHdr+ri.KLen {
				t.Fatalf("value at %d of the input, want %d", at, recHdr+ri.KLen)
			}
			if ri.Version != binary.LittleEndian.Uint64(raw) {
				t.Fatalf("version %#x, word 0 is %#x", ri.Version, binary.LittleEndian.Uint64(raw))
			}
			// The covered prefix is the record: it decodes alone.
			ri2, k2, v2, err := DecodeRecord(raw[:n])
			if err != nil || ri2 != ri || !bytes.Equal(k2, k) || !bytes.Equal(v2, v) {
				t.Fatalf("the record's %d covered bytes alone: %+v, %v", n, ri2, err)
			}
		} else if len(k) != 0 || len(v) != 0 {
			t.Fatalf("rejected (%v) but returned a key or value", err)
		}

		// A record built by encodeRecord decodes to what it holds (keys
		// and values of up to 4 KiB: longer ones only make runs slow).
		key, value = key[:min(len(key), 4096)], value[:min(len(value), 4096)]
		size := recordSize(len(key), len(value))
		rec := make([]byte, size)
		for i := range rec {
			rec[i] = 0xa5 // encodeRecord must not depend on zeroed memory
		}
		encodeRecord(rec, version, key, value)
		check := func(b []byte, what string) {
			t.Helper()
			ri, k, v, err := DecodeRecord(b)
			if err != nil || ri.Version != version || !bytes.Equal(k, key) || !bytes.Equal(v, value) {
				t.Fatalf("%s: decoded version %#x key %q value %q, %v; want version %#x key %q value %q",
					what, ri.Version, k, v, err, version, key, value)
			}
			if ri.Size() != size {
				t.Fatalf("%s: size %d, want %d", what, ri.Size(), size)
			}
		}
		check(rec, "record")
		check(append(bytes.Clone(rec), key...), "record followed by other bytes")
		n := coveredLen(len(key), len(value))
		// The alignment bytes after the check word are not covered: a
		// read of the covered bytes alone (a heap region's end) decodes.
		for l := n; l < size; l++ {
			check(rec[:l], fmt.Sprintf("record cut to %d of %d bytes after its check word", l, size))
		}
		// Any shorter read is torn.
		for l := range n {
			if _, _, _, err := DecodeRecord(rec[:l]); err == nil {
				t.Fatalf("record of %d covered bytes cut to %d accepted", n, l)
			}
		}
		// Any bit flip in the covered bytes is rejected (every bit of
		// short records; of long ones, the header, the check word and a
		// sample of the rest).
		flip := func(bit int) {
			rec[bit/8] ^= 1 << (bit % 8)
			if ri, k, v, err := DecodeRecord(rec); err == nil {
				t.Fatalf("flip of bit %d of %d covered bytes accepted: version %#x key %q value %q", bit, n, ri.Version, k, v)
			}
			rec[bit/8] ^= 1 << (bit % 8)
		}
		if n <= 256 {
			for bit := range 8 * n {
				flip(bit)
			}
		} else {
			for bit := range 8 * recHdr {
				flip(bit)
			}
			for bit := 8 * (n - 8); bit < 8*n; bit++ {
				flip(bit)
			}
			rng := rand.New(rand.NewPCG(version, uint64(n)))
			for range 256 {
				flip(rng.IntN(8 * n))
			}
		}
	})
}

// fuzzBytes hands out an input's bytes, then zeros.
type fuzzBytes []byte

func (b *fuzzBytes) byte() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

func (b *fuzzBytes) take(n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b.byte()
	}
	return out
}

func (b *fuzzBytes) u64() uint64 { return binary.LittleEndian.Uint64(b.take(8)) }

// opsFrom makes 1..4 valid ops from arbitrary bytes.
func opsFrom(in []byte) []Op {
	b := fuzzBytes(in)
	ops := make([]Op, 1+b.byte()%4)
	for i := range ops {
		c := b.byte()
		op := Op{Kind: OpPut, Cmp: c % 3}
		if c&0x80 != 0 {
			op.Kind = OpDelete
		}
		op.Key = b.take(1 + int(b.byte()%20)) // keys have at least one byte
		if op.Kind == OpPut {
			op.Value = b.take(int(b.byte() % 40))
		}
		if op.Cmp == CmpValue {
			op.CmpValue = b.take(int(b.byte() % 20))
		}
		if c&0x40 != 0 {
			op.CmpVersion = b.u64()
		}
		ops[i] = op
	}
	return ops
}

func sameOps(a, b []Op) bool {
	return slices.EqualFunc(a, b, func(x, y Op) bool {
		return x.Kind == y.Kind && x.Cmp == y.Cmp && x.CmpVersion == y.CmpVersion &&
			bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) && bytes.Equal(x.CmpValue, y.CmpValue)
	})
}

func FuzzRequest(f *testing.F) {
	for _, ops := range [][]Op{
		{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}},
		{{Kind: OpDelete, Key: []byte("a-longer-key")}},
		{{Kind: OpPut, Cmp: CmpVersion, CmpVersion: 5 << 16, Key: []byte("12345678"), Value: []byte{}}},
		{{Kind: OpPut, Cmp: CmpValue, Key: []byte("k"), Value: []byte("new"), CmpValue: []byte("old")},
			{Kind: OpDelete, Cmp: CmpValue, CmpVersion: 1, Key: []byte("other")},
			{Kind: OpPut, Key: []byte{}, Value: bytes.Repeat([]byte{1}, 17)}},
	} {
		f.Add(AppendRequest(nil, ops))
	}
	f.Add([]byte{reqFormat, 0, 0, 0})
	f.Add([]byte{reqFormat, 0, 1, 0, OpPut, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := DecodeRequest(b, nil)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v is not ErrMalformed", err)
		}
		if err == nil {
			if len(ops) == 0 || len(ops) > 0xffff {
				t.Fatalf("accepted a request of %d ops", len(ops))
			}
			for i, op := range ops {
				switch {
				case op.Kind != OpPut && op.Kind != OpDelete && op.Kind != OpMerge:
					t.Fatalf("op %d: kind %d", i, op.Kind)
				case op.Cmp > CmpExists || op.Cmp == CmpExists && op.CmpVersion != 0:
					t.Fatalf("op %d: cmp %d (version %d)", i, op.Cmp, op.CmpVersion)
				case op.Kind == OpMerge && op.Cmp != CmpNone && op.Cmp != CmpExists:
					t.Fatalf("op %d: a merge with cmp %d", i, op.Cmp)
				case op.Kind == OpDelete && len(op.Value) != 0:
					t.Fatalf("op %d: a delete with a %d-byte value", i, len(op.Value))
				case op.Cmp != CmpValue && len(op.CmpValue) != 0:
					t.Fatalf("op %d: cmp %d with a %d-byte cmp value", i, op.Cmp, len(op.CmpValue))
				}
				for _, s := range [][]byte{op.Key, op.Value, op.CmpValue} {
					if sliceAt(b, s) == -1 {
						t.Fatalf("op %d: a slice outside the request", i)
					}
					if cap(s) != len(s) {
						t.Fatalf("op %d: a %d-byte slice with capacity %d (an append would write into the request)", i, len(s), cap(s))
					}
				}
			}
			if enc := AppendRequest(nil, ops); !bytes.Equal(enc, b) {
				t.Fatalf("accepted a non-canonical request:\n  input   %x\n  encodes %x", b, enc)
			}
			if n := RequestSize(ops); n != len(b) {
				t.Fatalf("RequestSize %d of a %d-byte request", n, len(b))
			}
			// Decoding into a slice with room gives the same ops.
			again, err := DecodeRequest(b, make([]Op, 2, 8))
			if err != nil || !sameOps(again, ops) {
				t.Fatalf("decoding into a reused slice: %v", err)
			}
		}

		// Valid ops made of the input encode and decode back.
		want := opsFrom(b)
		enc := AppendRequest([]byte("prefix"), want)
		if !bytes.HasPrefix(enc, []byte("prefix")) || len(enc) != len("prefix")+RequestSize(want) {
			t.Fatalf("AppendRequest wrote %d bytes after the prefix, RequestSize %d", len(enc)-len("prefix"), RequestSize(want))
		}
		got, err := DecodeRequest(enc[len("prefix"):], nil)
		if err != nil || !sameOps(got, want) {
			t.Fatalf("encoded %+v\n  decoded %+v, %v", want, got, err)
		}
	})
}

// FuzzResult: a result decodes only from the bytes encodeResult writes
// for it (a refusal names a known limit and carries no count or
// versions; other statuses no limit), and every result encodes and
// decodes back to itself.
func FuzzResult(f *testing.F) {
	for _, r := range []Result{
		{},
		{Status: StatusOK, Count: 3, Version: 9 << 16, Prev: 4 << 16},
		{Status: StatusCondFailed, FailedOp: 2},
		{Status: StatusCondFailed, FailedOp: 0xffff},
		{Status: StatusMalformed},
		{Status: StatusOK, Count: 1<<32 - 1, Version: ^uint64(0), Prev: ^uint64(0)},
		refused(LimitKey, 1, 1024, 1124),
		refused(LimitValue, 0, 1<<20, 1<<20+1),
		refused(LimitRequest, 0, 1<<20+5120, 1<<22),
		refused(LimitMulti, MaxMulti, MaxMulti, 0xffff),
		refused(LimitHeap, 0, maxHeaps<<26, maxHeaps<<26),
		refused(LimitStages, 0, MaxStages, 1<<20),
	} {
		f.Add(encodeResult(make([]byte, resSize), &r), r.Status, uint16(r.FailedOp), uint32(r.Count), r.Version, r.Prev, r.Limit)
	}
	f.Add([]byte{2, 0}, uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))
	f.Add(append([]byte{maxStatus + 1}, make([]byte, resSize-1)...), uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))
	f.Add(append([]byte{StatusRefused, 0}, make([]byte, resSize-2)...), uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))
	f.Add(append([]byte{StatusRefused, maxLimit + 1}, make([]byte, resSize-2)...), uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))
	f.Add(append([]byte{StatusRefused, LimitKey, 0, 0, 1}, make([]byte, resSize-5)...), uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))
	f.Add(append([]byte{StatusOK, LimitKey}, make([]byte, resSize-2)...), uint8(0), uint16(0), uint32(0), uint64(0), uint64(0), uint8(0))

	f.Fuzz(func(t *testing.T, b []byte, status uint8, failed uint16, count uint32, version, prev uint64, limit uint8) {
		r, err := DecodeResult(b)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v is not ErrMalformed", err)
		}
		if err == nil {
			switch r.Status {
			case StatusOK, StatusCondFailed, StatusMalformed, StatusMoved, StatusMixed, StatusMoving:
				if r.Limit != 0 || r.Max != 0 || r.Size != 0 {
					t.Fatalf("status %d with a limit: %+v", r.Status, r)
				}
			case StatusRefused:
				if r.Limit < 1 || r.Limit > maxLimit || strings.HasPrefix(LimitName(r.Limit), "limit ") || r.Count != 0 || r.Version != 0 || r.Prev != 0 {
					t.Fatalf("refusal %+v: an unnamed limit, or a count or versions", r)
				}
			default:
				t.Fatalf("status %d", r.Status)
			}
			if enc := encodeResult(make([]byte, resSize), &r); !bytes.Equal(enc, b) {
				t.Fatalf("decoded %+v from %x, which encodes to %x", r, b, enc)
			}
		}

		want := Result{Status: status % (maxStatus + 1), FailedOp: int(failed), Count: int(count), Version: version, Prev: prev}
		if want.Status == StatusRefused {
			want = Result{Status: StatusRefused, FailedOp: int(failed), Limit: limit%maxLimit + 1, Max: version, Size: prev}
		}
		enc := encodeResult(make([]byte, 64), &want)
		if len(enc) != resSize {
			t.Fatalf("encoded %d bytes", len(enc))
		}
		if got, err := DecodeResult(enc); err != nil || got != want {
			t.Fatalf("encoded %+v, decoded %+v, %v", want, got, err)
		}
	})
}

func FuzzStaged(f *testing.F) {
	id := StageID{Client: 3, Inc: 1 << 40, Stage: 7}
	f.Add(AppendPart(nil, id, 10, 0, []byte("0123456789")))
	f.Add(AppendPart(nil, id, 100, 60, []byte("the middle")))
	f.Add(AppendPart(nil, StageID{Client: ^uint32(0), Inc: ^uint64(0), Stage: ^uint64(0)}, 1<<20, 1<<20-1, []byte{1}))
	f.Add(AppendCommit(nil, id, 100))
	f.Add(AppendCommit(nil, id, 0)[:31])
	f.Add(AppendPart(nil, id, 10, 5, nil)) // an empty part
	f.Add(AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k")}}))

	f.Fuzz(func(t *testing.T, b []byte) {
		format, id, total, off, part, err := decodeStaged(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			if part != nil {
				t.Fatalf("rejected (%v) but returned a part", err)
			}
		} else {
			var enc []byte
			switch format {
			case partFormat:
				if len(part) == 0 || off < 0 || off+len(part) > total {
					t.Fatalf("part [%d, +%d) of %d", off, len(part), total)
				}
				if sliceAt(b, part) != PartOverhead {
					t.Fatalf("part at %d of the message, want %d", sliceAt(b, part), PartOverhead)
				}
				enc = AppendPart(nil, id, total, off, part)
			case commitFormat:
				if off != 0 || len(part) != 0 {
					t.Fatalf("commit with offset %d and %d bytes", off, len(part))
				}
				enc = AppendCommit(nil, id, total)
			default:
				t.Fatalf("format %d accepted", format)
			}
			if total < 0 || uint64(total) > math.MaxUint32 {
				t.Fatalf("total %d", total)
			}
			if !bytes.Equal(enc, b) {
				t.Fatalf("accepted a non-canonical message:\n  input   %x\n  encodes %x", b, enc)
			}
		}

		// Messages made of the input encode and decode back.
		in := fuzzBytes(b)
		id = StageID{Client: binary.LittleEndian.Uint32(in.take(4)), Inc: in.u64(), Stage: in.u64()}
		total = int(binary.LittleEndian.Uint32(in.take(4)))
		off = 0
		if total > 0 {
			off = int(binary.LittleEndian.Uint32(in.take(4))) % total
		}
		part = []byte(in)[:min(len(in), total-off)]
		if len(part) > 0 {
			gf, gid, gtotal, goff, gpart, err := decodeStaged(AppendPart(nil, id, total, off, part))
			if err != nil || gf != partFormat || gid != id || gtotal != total || goff != off || !bytes.Equal(gpart, part) {
				t.Fatalf("part %v [%d, +%d) of %d decoded as format %d %v [%d, +%d) of %d, %v",
					id, off, len(part), total, gf, gid, goff, len(gpart), gtotal, err)
			}
		}
		gf, gid, gtotal, _, _, err := decodeStaged(AppendCommit(nil, id, total))
		if err != nil || gf != commitFormat || gid != id || gtotal != total {
			t.Fatalf("commit %v of %d decoded as format %d %v of %d, %v", id, total, gf, gid, gtotal, err)
		}
	})
}

func FuzzSlot(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint8(0), uint16(0), uint8(0), uint64(0), uint8(0))
	f.Add(uint64(5<<16|1), uint64(0xdeadbeef_01020304), uint8(0x9c), uint16(3), uint8(1), uint64(4096), uint8(3))
	f.Add(^uint64(0), ^uint64(0), uint8(0xff), uint16(unitsLarge), uint8(maxHeaps-1), uint64(1<<36-16), uint8(6))

	f.Fuzz(func(t *testing.T, version, ref uint64, fp uint8, units uint16, heap uint8, off uint64, i uint8) {
		s := Slot{Version: version, FP: fp, Units: units, Heap: heap, Off: off % (1 << 36) &^ (recAlign - 1)}
		if got := slotOf(version, s.refWord()); got != s {
			t.Fatalf("slot %+v: ref %#x decodes to %+v", s, s.refWord(), got)
		}
		// Every ref word is some slot's.
		if got := slotOf(version, ref).refWord(); got != ref {
			t.Fatalf("ref %#x decodes to %+v, which encodes to %#x", ref, slotOf(version, ref), got)
		}
		// Through a bucket: storeSlot, then decodeSlot of the image; the
		// other slots and the bucket header are untouched.
		// rdma.Store64 wants 8-byte aligned memory, as registered memory is.
		var aligned [bucketSize / 8]uint64
		bucket := unsafe.Slice((*byte)(unsafe.Pointer(&aligned[0])), bucketSize)
		for j := range bucket {
			bucket[j] = byte(j)
		}
		orig := bytes.Clone(bucket)
		k := int(i % slotsPer)
		storeSlot(bucket, 0, k, s)
		if got := decodeSlot(bucket, k); got != s {
			t.Fatalf("slot %d stored %+v, read %+v", k, s, got)
		}
		at := bucketHdr + k*slotSize
		if !bytes.Equal(bucket[:at], orig[:at]) || !bytes.Equal(bucket[at+slotSize:], orig[at+slotSize:]) {
			t.Fatalf("storing slot %d changed bytes outside it", k)
		}
		clearSlot(bucket, 0, k)
		if got := decodeSlot(bucket, k); got != (Slot{}) {
			t.Fatalf("cleared slot reads %+v", got)
		}
	})
}

// Restore.

// restoreCfg is the table FuzzRestore restores into: small, so that
// restores grow it and fill heap regions; its MaxRequest (a staged
// request's bound) is 6 KiB.
var restoreCfg = TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10}

type snapRec struct {
	version uint64
	value   string
}

// snapStage is a staged request as a snapshot holds it.
type snapStage struct {
	id   StageID
	buf  string
	have int
}

// snapContents is what a snapshot holds, in its order.
type snapContents struct {
	keys    []string
	recs    []snapRec
	stages  []snapStage
	applied uint64
}

// parseSnapshot is the snapshot format as documented (table.go), for a
// table whose MaxRequest is maxRequest: version 2, or version 1 (no
// ordered section length).
func parseSnapshot(b []byte, maxRequest int) (c snapContents, err error) {
	if len(b) < 32 || binary.LittleEndian.Uint64(b) != snapMagic && binary.LittleEndian.Uint64(b) != snapMagicV1 {
		return c, errors.New("bad header")
	}
	v1 := binary.LittleEndian.Uint64(b) == snapMagicV1
	count := binary.LittleEndian.Uint64(b[8:])
	log := binary.LittleEndian.Uint64(b[16:])
	c.applied = binary.LittleEndian.Uint64(b[24:])
	if log < 2 || log > 30 {
		return c, fmt.Errorf("log2 buckets %d", log)
	}
	p := 32
	for n := uint64(0); n < count; n++ {
		ri, k, v, err := DecodeRecord(b[p:])
		if err != nil {
			return c, fmt.Errorf("record %d at byte %d: %v", n, p, err)
		}
		if ri.Size() > len(b)-p {
			return c, fmt.Errorf("record %d at byte %d overruns", n, p)
		}
		c.recs = append(c.recs, snapRec{ri.Version, string(v)})
		c.keys = append(c.keys, string(k))
		p += ri.Size()
	}
	if len(b)-p < 8 {
		return c, errors.New("no staged requests count")
	}
	nst := binary.LittleEndian.Uint64(b[p:])
	p += 8
	perClient := map[uint32]int{}
	for n := uint64(0); n < nst; n++ {
		if len(b)-p < 40 {
			return c, fmt.Errorf("staged request %d at byte %d truncated", n, p)
		}
		w := func(k int) uint64 { return binary.LittleEndian.Uint64(b[p+8*k:]) }
		client, total, have := w(0), w(3), w(4)
		if client > math.MaxUint32 || total > uint64(maxRequest) || have > total || pad8(int(total)) > len(b)-p-40 {
			return c, fmt.Errorf("staged request %d at byte %d: client %#x, %d of %d bytes", n, p, client, have, total)
		}
		if perClient[uint32(client)]++; perClient[uint32(client)] > MaxStages {
			return c, fmt.Errorf("more than %d staged requests of client %d", MaxStages, client)
		}
		if bytes.ContainsFunc(b[p+40+int(total):p+40+pad8(int(total))], func(r rune) bool { return r != 0 }) {
			return c, fmt.Errorf("staged request %d at byte %d: padding not zero", n, p)
		}
		id := StageID{uint32(client), w(1), w(2)}
		for _, o := range c.stages {
			if o.id == id {
				return c, fmt.Errorf("staged request %+v twice", id)
			}
		}
		c.stages = append(c.stages, snapStage{id, string(b[p+40 : p+40+int(total)]), int(have)})
		p += 40 + pad8(int(total))
	}
	// The ordered section: empty for a table without an ordered part,
	// absent in version 1.
	if v1 {
		if p != len(b) {
			return c, fmt.Errorf("%d trailing bytes", len(b)-p)
		}
		return c, nil
	}
	if len(b)-p < 8 {
		return c, errors.New("no ordered section length")
	}
	if n := binary.LittleEndian.Uint64(b[p:]); n != 0 {
		return c, fmt.Errorf("an ordered section of %d bytes", n)
	}
	p += 8
	if p != len(b) {
		return c, fmt.Errorf("%d trailing bytes", len(b)-p)
	}
	return c, nil
}

// snapshotOf is a table's snapshot bytes (Snapshot, Persist).
func snapshotOf(t testing.TB, tb *Table) []byte {
	t.Helper()
	s, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	b := make([]byte, s.Size())
	if err := s.Persist(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// tableState is a table's records (key -> record) and staged requests
// (ordered by client, as Snapshot lists them).
type tableState struct {
	recs   map[string]snapRec
	stages []snapStage
}

func (a tableState) equal(b tableState) bool {
	return maps.Equal(a.recs, b.recs) && slices.Equal(a.stages, b.stages)
}

// stateOf reads a table's state from its own snapshot; a key held twice
// fails.
func stateOf(t testing.TB, tb *Table) tableState {
	t.Helper()
	c, err := parseSnapshot(snapshotOf(t, tb), tb.cfg.MaxRequest)
	if err != nil {
		t.Fatalf("the table's own snapshot does not parse: %v", err)
	}
	s := tableState{recs: map[string]snapRec{}, stages: c.stages}
	for i, k := range c.keys {
		if _, dup := s.recs[k]; dup {
			t.Fatalf("the table holds key %q twice", k)
		}
		s.recs[k] = c.recs[i]
	}
	return s
}

// tableWith is a restoreCfg table with keys key-0..key-(n-1) put (for n >
// 2, one overwritten, one deleted, and two requests staged: one whole but
// not committed, one partial); migrating, it is left growing.
func tableWith(t testing.TB, n int, migrating bool) (*Table, *GroupReader) {
	t.Helper()
	tb, r := soloTable(t, restoreCfg)
	idx := uint64(0)
	for i := range n {
		idx++
		put(tb, idx, Op{Kind: OpPut, Key: fmt.Appendf(nil, "key-%d", i), Value: fmt.Appendf(nil, "value-%d-%s", i, bytes.Repeat([]byte{'x'}, i%5*7))})
	}
	if n > 2 {
		idx++
		put(tb, idx, Op{Kind: OpPut, Key: []byte("key-1"), Value: []byte("again")})
		idx++
		put(tb, idx, Op{Kind: OpDelete, Key: []byte("key-2")})
		for _, m := range [][]byte{
			AppendPart(nil, StageID{Client: 3, Inc: 1, Stage: 1}, 100, 40, []byte("a part of a request")),
			AppendPart(nil, StageID{Client: 1, Inc: 2, Stage: 9}, 5, 0, []byte("whole")),
		} {
			idx++
			if res, err := DecodeResult(tb.Apply(broadcast.Entry{Index: idx, Data: m})); err != nil || res.Status != StatusOK {
				t.Fatalf("staging: %+v, %v", res, err)
			}
		}
	}
	if migrating {
		for i := n; !tb.Stats().Migrating; i++ {
			idx++
			put(tb, idx, Op{Kind: OpPut, Key: fmt.Appendf(nil, "key-%d", i), Value: []byte("v")})
		}
	}
	return tb, r
}

// checkGets reads every key of want, and the keys of absent, through r.
func checkGets(t *testing.T, r *GroupReader, want map[string]snapRec, absent []string, what string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		for _, mode := range []Consistency{Linearizable, StaleOK} {
			g, err := r.Get([]byte(k), mode)
			if err != nil || !g.Found || string(g.Value) != want[k].value || g.Version != want[k].version {
				t.Fatalf("%s: get %q (%v): found %v version %#x value %q, %v; want version %#x value %q",
					what, k, mode, g.Found, g.Version, g.Value, err, want[k].version, want[k].value)
			}
		}
	}
	for _, k := range absent {
		if _, ok := want[k]; ok {
			continue
		}
		if g, err := r.Get([]byte(k), Linearizable); err != nil || g.Found {
			t.Fatalf("%s: get %q: found %v (value %q), %v; want absent", what, k, g.Found, g.Value, err)
		}
	}
}

// snapshotFrom builds a snapshot from a recipe of arbitrary bytes, its
// records sealed with valid checks (which random mutation of the raw
// bytes almost never produces), so that what Restore does with
// well-formed records is explored: duplicate keys, version 0, records no
// heap region holds, a count that disagrees, a corrupt record, staged
// requests of every shape.
//
//	recipe: [log2 buckets % 12][count delta][applied][trailing zeros % 4]
//	        then entries, each a record or a staged request:
//	record: [flags][version hi][version lo][klen][key bytes][vlen][bit u16]
//	staged: [flags|8][client][inc][stage][total][have]
//	flags:  1 the key: klen % 8 bytes of the recipe, mapped to "abc" (so
//	          duplicates are likely); otherwise "key-<i>", distinct
//	        2 a large value: vlen KiB (otherwise vlen % 48 bytes)
//	        4 corrupt: flip the bit'th bit (mod the bits the check covers)
//	        8 a staged request of client%4 (+2^32 with flag 16), total*29
//	          bytes, have*29 of them
//
// The record count is the number of records plus the count delta (int8 >>
// 5: mostly 0).
func snapshotFrom(in []byte) []byte {
	b := fuzzBytes(in)
	log := b.byte() % 12
	delta := int(int8(b.byte())) >> 5
	applied := b.byte()
	trailing := int(b.byte() % 4)
	var recs [][]byte
	stages := binary.LittleEndian.AppendUint64(nil, 0)
	nst := 0
	for i := 0; len(b) > 0 && i < 48; i++ {
		flags := b.byte()
		if flags&8 != 0 {
			client := uint64(b.byte() % 4)
			if flags&16 != 0 {
				client |= 1 << 32
			}
			inc, stage := uint64(b.byte()), uint64(b.byte())
			total, have := int(b.byte())*29, int(b.byte())*29
			for _, w := range []uint64{client, inc, stage, uint64(total), uint64(have)} {
				stages = binary.LittleEndian.AppendUint64(stages, w)
			}
			for j := range pad8(total) {
				if j < total {
					stages = append(stages, byte(j+i))
				} else {
					stages = append(stages, 0)
				}
			}
			nst++
			continue
		}
		version := uint64(b.byte())<<8 | uint64(b.byte())
		klen := int(b.byte() % 8)
		key := fmt.Appendf(nil, "key-%d", i)
		if flags&1 != 0 {
			key = b.take(klen)
			for j := range key {
				key[j] = 'a' + key[j]%3
			}
		}
		vlen := int(b.byte())
		if flags&2 != 0 {
			vlen <<= 10
		} else {
			vlen %= 48
		}
		value := make([]byte, vlen)
		for j := range value {
			value[j] = byte(i + j)
		}
		rec := make([]byte, recordSize(len(key), len(value)))
		encodeRecord(rec, version, key, value)
		bit := int(binary.LittleEndian.Uint16(b.take(2)))
		if flags&4 != 0 {
			bit %= 8 * coveredLen(len(key), len(value))
			rec[bit/8] ^= 1 << (bit % 8)
		}
		recs = append(recs, rec)
	}
	binary.LittleEndian.PutUint64(stages, uint64(nst))
	snap := make([]byte, 32)
	binary.LittleEndian.PutUint64(snap, snapMagic)
	binary.LittleEndian.PutUint64(snap[8:], uint64(max(0, len(recs)+delta)))
	binary.LittleEndian.PutUint64(snap[16:], uint64(log))
	binary.LittleEndian.PutUint64(snap[24:], uint64(applied))
	for _, r := range recs {
		snap = append(snap, r...)
	}
	snap = append(snap, stages...)
	snap = append(snap, make([]byte, 8)...) // no ordered section
	return append(snap, make([]byte, trailing)...)
}

func FuzzRestore(f *testing.F) {
	// Real snapshots: an empty table, tables with keys and staged
	// requests, one migrating (LogBuckets 2, MigrateStep 1), one with a
	// value of a large class.
	for i, c := range []struct {
		n         int
		migrating bool
	}{{0, false}, {3, false}, {6, false}, {12, true}} {
		tb, _ := tableWith(f, c.n, c.migrating)
		if c.migrating && !tb.Stats().Migrating {
			f.Fatal("the seed table is not migrating")
		}
		f.Add(false, uint8(i%3), snapshotOf(f, tb))
	}
	tb, _ := tableWith(f, 2, false)
	put(tb, 100, Op{Kind: OpPut, Key: []byte("big"), Value: bytes.Repeat([]byte{7}, 1000)})
	f.Add(false, uint8(0), snapshotOf(f, tb))
	f.Add(false, uint8(1), []byte{})
	// Recipes (snapshotFrom): valid ones, and flawed ones that Restore
	// must reject without a change.
	f.Add(true, uint8(2), []byte{2, 0, 9, 0, 0, 0, 1, 3, 5})
	f.Add(true, uint8(0), []byte{3, 0, 9, 0, 0, 0, 1, 0, 5, 0, 0, 0, 0, 2, 0, 10, 0, 0, 0, 0, 3, 0, 20, 0, 0})
	f.Add(true, uint8(1), []byte{2, 0, 9, 0, 1, 0, 1, 2, 0, 1, 3, 0, 0, 1, 0, 2, 2, 0, 2, 3, 0, 0}) // keys "ab", "ac"
	f.Add(true, uint8(2), []byte{2, 0, 9, 0, 0, 0, 1, 0, 5, 0, 0, 2, 0, 2, 0, 1, 0, 0})             // a 1 KiB value
	f.Add(true, uint8(0), []byte{2, 0, 9, 0, 0, 0, 1, 0, 5, 0, 0, 8, 1, 1, 1, 3, 2, 8, 2, 1, 2, 0, 0})
	f.Add(true, uint8(1), []byte{2, 0, 9, 0, 8, 1, 1, 1, 3, 4})   // have > total
	f.Add(true, uint8(2), []byte{2, 0, 9, 0, 24, 1, 1, 1, 3, 2})  // client >= 2^32
	f.Add(true, uint8(0), []byte{2, 0, 9, 0, 8, 1, 1, 1, 250, 2}) // total > MaxRequest
	nine := []byte{2, 0, 9, 0}                                    // MaxStages+1 staged requests of client 1
	for i := range MaxStages + 1 {
		nine = append(nine, 8, 1, 1, byte(i), 1, 1)
	}
	f.Add(true, uint8(1), nine)
	f.Add(true, uint8(0), []byte{2, 0, 9, 0, 0, 0, 1, 0, 5, 0, 0, 4, 0, 2, 0, 8, 77, 0}) // a flipped bit
	f.Add(true, uint8(1), []byte{2, 0xe0, 9, 0, 0, 0, 1, 0, 5, 0, 0})                    // count one short
	f.Add(true, uint8(2), []byte{2, 0, 9, 3, 0, 0, 1, 0, 5, 0, 0})                       // trailing bytes

	f.Fuzz(checkRestore)
}

// checkRestore is FuzzRestore's check of one input.
func checkRestore(t *testing.T, recipe bool, base uint8, snap []byte) {
	if recipe {
		snap = snapshotFrom(snap)
	}
	if len(snap) >= 24 && binary.LittleEndian.Uint64(snap[16:]) > 14 && binary.LittleEndian.Uint64(snap[16:]) <= 30 {
		// Restore registers an index of 2^log buckets first: a 32-byte
		// snapshot saying 2^27 maps 16 GiB, which only makes runs slow.
		t.Skip("an index of more than 2^14 buckets")
	}
	// The table restored into: a few keys and staged requests, growing
	// (LogBuckets 2, MigrateStep 1), or empty.
	var tb *Table
	var r *GroupReader
	switch base % 3 {
	case 0:
		tb, r = tableWith(t, 5, false)
	case 1:
		tb, r = tableWith(t, 12, true)
	case 2:
		tb, r = tableWith(t, 0, false)
	}
	before := stateOf(t, tb)
	beforeSnap := snapshotOf(t, tb)
	beforeLen, beforeHdr := tb.Len(), tb.Header()
	known := []string{"key-0", "key-1", "key-2", "key-3", "key-4", "key-5", "key-20", "a", "ab", "after"}

	err := tb.Restore(snap)
	c, perr := parseSnapshot(snap, tb.cfg.MaxRequest)
	if err != nil {
		// Nothing changed.
		if got := tb.Len(); got != beforeLen {
			t.Fatalf("failed Restore (%v) changed Len from %d to %d", err, beforeLen, got)
		}
		if h := tb.Header(); h != beforeHdr {
			t.Fatalf("failed Restore (%v) changed the header from %+v to %+v", err, beforeHdr, h)
		}
		if got := stateOf(t, tb); !got.equal(before) {
			t.Fatalf("failed Restore (%v) changed the table from %+v to %+v", err, before, got)
		}
		if got := snapshotOf(t, tb); !bytes.Equal(got, beforeSnap) {
			t.Fatalf("failed Restore (%v) changed the snapshot bytes", err)
		}
		checkGets(t, r, before.recs, known, fmt.Sprintf("after a failed Restore (%v)", err))
		// And the table still works.
		put(tb, 1000, Op{Kind: OpPut, Key: []byte("after"), Value: []byte("ok")})
		before.recs["after"] = snapRec{1000 << 16, "ok"}
		checkGets(t, r, before.recs, nil, "a put after a failed Restore")
		// A snapshot that is well-formed, with distinct keys and
		// versions, whose records fit a heap region, is accepted.
		if perr == nil && wellFormed(c) {
			t.Fatalf("Restore rejected a well-formed snapshot of %d records, %d staged requests: %v", len(c.recs), len(c.stages), err)
		}
		return
	}

	// Accepted: the snapshot is well-formed and the table holds
	// exactly its records and staged requests.
	if perr != nil {
		t.Fatalf("Restore accepted a snapshot that does not parse: %v", perr)
	}
	want := tableState{recs: map[string]snapRec{}, stages: slices.Clone(c.stages)}
	slices.SortStableFunc(want.stages, func(a, b snapStage) int { return cmp.Compare(a.id.Client, b.id.Client) })
	for i, k := range c.keys {
		if _, dup := want.recs[k]; dup {
			t.Fatalf("Restore accepted a snapshot holding key %q twice (Len now %d)", k, tb.Len())
		}
		want.recs[k] = c.recs[i]
	}
	for i, rec := range c.recs {
		if rec.version == 0 {
			t.Fatalf("Restore accepted record %d (key %q) with version 0, the empty slot's (Len now %d, the table holds %d)",
				i, c.keys[i], tb.Len(), len(stateOf(t, tb).recs))
		}
	}
	if got := stateOf(t, tb); !got.equal(want) {
		t.Fatalf("restored %+v, the snapshot holds %+v", got, want)
	}
	if n, _ := tb.Staged(); tb.Len() != len(want.recs) || n != len(want.stages) {
		t.Fatalf("restored Len %d, Staged %d; the snapshot holds %d records, %d staged requests", tb.Len(), n, len(want.recs), len(want.stages))
	}
	h := tb.Header()
	if h.Applied != c.applied || h.Layout == beforeHdr.Layout || h.Geometry.Migrating {
		t.Fatalf("header after Restore %+v (before %+v), snapshot applied %d", h, beforeHdr, c.applied)
	}
	checkGets(t, r, want.recs, known, "after Restore")

	// Its snapshot restores into a third table with the same state.
	again := snapshotOf(t, tb)
	tb3, r3 := soloTable(t, restoreCfg)
	if err := tb3.Restore(again); err != nil {
		t.Fatalf("the restored table's own snapshot does not restore: %v", err)
	}
	if got := stateOf(t, tb3); !got.equal(want) || tb3.Len() != len(want.recs) {
		t.Fatalf("restored again: %+v (Len %d), want %+v", got, tb3.Len(), want)
	}
	checkGets(t, r3, want.recs, known, "restored again")
}

// wellFormed reports whether a parsed snapshot's records are what a table
// could have written (distinct keys of 1 to MaxKey bytes, values within
// MaxValue, nonzero versions) and fit restoreCfg's heap regions.
func wellFormed(c snapContents) bool {
	seen := map[string]bool{}
	total := 0
	maxKey := cmp.Or(restoreCfg.MaxKey, DefaultMaxKey)
	for i, rec := range c.recs {
		size := recordSize(len(c.keys[i]), len(rec.value))
		if seen[c.keys[i]] || rec.version == 0 || classOf(size) > restoreCfg.HeapRegionSize ||
			len(c.keys[i]) == 0 || len(c.keys[i]) > maxKey || len(rec.value) > restoreCfg.MaxValue {
			return false
		}
		seen[c.keys[i]] = true
		total += classOf(size)
	}
	return total <= maxHeaps/2*restoreCfg.HeapRegionSize
}

// FuzzMulti: a multi request (combined single-key ops) decodes only from
// its canonical encoding and within MaxMulti ops; a multi result decodes
// only from what the table encodes.
func FuzzMulti(f *testing.F) {
	f.Add(AppendMulti(nil, []Op{{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}, {Kind: OpDelete, Key: []byte("b"), Cmp: CmpVersion, CmpVersion: 7}}))
	f.Add(AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("a")}}))
	f.Add([]byte{4, 0, 0, 0})
	// A multi result with an applied op and a refused one.
	mres := []byte{StatusOK, 0, 2, 0, 0, 0, 0, 0}
	for _, r := range []Result{{Status: StatusOK, Count: 1, Version: 7 << 16}, refused(LimitKey, 0, 1024, 1124)} {
		mres = append(mres, encodeResult(make([]byte, resSize), &r)...)
	}
	f.Add(mres)
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := DecodeMulti(b, nil)
		if err == nil {
			if len(ops) == 0 || len(ops) > MaxMulti {
				t.Fatalf("accepted %d ops", len(ops))
			}
			if re := AppendMulti(nil, ops); !bytes.Equal(re, b) {
				t.Fatalf("decoded %x, re-encoded %x", b, re)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v is not ErrMalformed", err)
		}
		rs, err := DecodeMultiResult(b, nil)
		if err == nil {
			out := []byte{StatusOK, 0, byte(len(rs)), byte(len(rs) >> 8), 0, 0, 0, 0}
			for i := range rs {
				var buf [resSize]byte
				out = append(out, encodeResult(buf[:], &rs[i])...)
			}
			if !bytes.Equal(out, b) {
				t.Fatalf("result %x re-encoded as %x", b, out)
			}
		}
	})
}
