package btree

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/kv/opwire"
)

// Ordered requests: the bytes a client multicasts to the group owning the
// keys and the bytes the group's Store returns. They reuse kv's request
// encoding (kv/ops.go: the same op header, padding and kinds; the layout
// is package kv/opwire, which both encode and decode through), under
// format byte RequestFormat, so that kv.Table routes them here by their
// first byte (kv.OrderedFormat) without importing this package:
//
//	[format u8 = 5][0 u8][count u16] then count ops:
//	op: [kind u8][cmp u8][space u8][0 u8][klen u32][vlen u32][clen u32][cver u64]
//	    [key][value][cmp value], each padded to 8
//
// kind and cmp are kv's (OpPut, OpDelete, OpMerge; CmpNone, CmpVersion,
// CmpValue, CmpExists, with kv's meanings), plus two reads that go through
// the log: OpGet (key) and OpScan (key: the first key, empty for the
// start of the keyspace; value: the end, exclusive, empty for the end of
// the keyspace; cver: the most pairs wanted, 0 for no limit). A read is
// the only op of its request.
//
// space is 0 for an op on the ordered keyspace and SpaceHashed for an op
// on the hashed one: a request mixing both is refused whole with
// StatusMixed (docs/btree.md). The writes of a request are applied
// atomically, every condition checked first, as kv applies a batch.
//
// A multi request carries independent single-key writes that a client
// combined into one message (as kv's multi request, format 4, does for
// hashed keys): the same layout with flags FlagMulti in the second byte,
//
//	[format u8 = 5][flags u8 = 1][count u16] then count ops, as above
//
// of at most MaxMulti writes (no reads). Each op is applied on its own, in
// order, with its own condition, as a request of that one op would be
// (op i's version is index<<16 | i), and gets its own result: one op's
// failure (its condition, StatusMoved, a limit, StatusMixed for a hashed
// op) never stops its neighbours. Its result is kv's multi result,
//
//	[status u8 = StatusOK][0 u8][count u16][0 u32] then count results of 24 bytes
//
// (each a write's result, below, for that one op), or one result of 24
// bytes refusing the whole message: StatusMalformed, or StatusRefused with
// LimitMulti for more than MaxMulti ops.
//
// A write's result is kv's result, byte for byte (kv.DecodeResult reads
// it), with two statuses more: StatusMoved (an op's key is not in a
// tablet this group owns: nothing applied, failed op names it) and
// StatusMixed. A read's result:
//
//	[status u8][more u8][0 u16][count u32][index u64][0 u64] then count pairs:
//	pair: [klen u32][vlen u32][version u64][key][value], each padded to 8
//
// index is the entry the read was applied at; more is 1 when a scan
// stopped at the result's byte bound (StoreConfig.MaxResult) before its
// limit or its end: the caller scans again from after the last key.
const (
	RequestFormat = 5
	// FlagMulti in a request's second byte: its ops are independent
	// (a multi request).
	FlagMulti = 1
	// MaxMulti bounds the ops of a multi request (kv.MaxMulti).
	MaxMulti = 32

	resSize = 24

	// SpaceHashed marks an op on the hashed keyspace (refused here).
	SpaceHashed = 1
)

// Op kinds (kv's writes and the ordered reads) and conditions (kv's).
const (
	OpPut    = 1
	OpDelete = 2
	OpMerge  = 3
	OpGet    = 8
	OpScan   = 9

	CmpNone    = 0
	CmpVersion = 1
	CmpValue   = 2
	CmpExists  = 3
)

// Result statuses: kv's four, and the two an ordered request adds.
const (
	StatusOK         = 0
	StatusCondFailed = 1
	StatusMalformed  = 2
	StatusRefused    = 3
	// StatusMoved: the key of op FailedOp lies in no tablet this group
	// owns (the client's directory is stale, or the key moved); nothing
	// applied. The client refreshes its directory and sends again.
	StatusMoved = 4
	// StatusMixed: the request holds ops on hashed keys (op FailedOp is
	// the first) besides ordered ones; nothing applied.
	StatusMixed = 5
)

// Limits (kv's numbering) of a StatusRefused result.
const (
	LimitKey   = 1
	LimitValue = 2
	// LimitMulti: a multi request of more than MaxMulti ops.
	LimitMulti = 4
	// LimitHeap: the group's node arena is full (StoreConfig.MaxChunks).
	LimitHeap = 5
)

// Op is one operation of an ordered request.
type Op struct {
	Kind       uint8
	Cmp        uint8
	Hashed     bool // an op on the hashed keyspace
	Key        []byte
	Value      []byte // OpScan: the end (exclusive, empty: none)
	CmpVersion uint64 // OpScan: the limit (0: none)
	CmpValue   []byte
}

// ErrMalformedRequest is returned for request bytes that do not decode.
var ErrMalformedRequest = errors.New("btree: malformed request")

func pad8(n int) int { return (n + 7) &^ 7 }

// RequestSize is the encoded size of a request (or a multi request)
// holding ops.
func RequestSize(ops []Op) int {
	n := opwire.ReqHdr
	for i := range ops {
		n += opwire.Size(ops[i].Key, ops[i].Value, ops[i].CmpValue)
	}
	return n
}

// AppendRequest appends the ordered request of ops to dst (its writes
// applied atomically).
func AppendRequest(dst []byte, ops []Op) []byte { return appendOps(dst, 0, ops) }

// AppendMulti appends the multi request of ops (independent writes, at
// most MaxMulti) to dst.
func AppendMulti(dst []byte, ops []Op) []byte { return appendOps(dst, FlagMulti, ops) }

func appendOps(dst []byte, flags byte, ops []Op) []byte {
	dst = opwire.AppendRequestHeader(dst, RequestFormat, flags, len(ops))
	for i := range ops {
		op := &ops[i]
		space := byte(0)
		if op.Hashed {
			space = SpaceHashed
		}
		dst = opwire.AppendOp(dst, op.Kind, op.Cmp, space, op.CmpVersion, op.Key, op.Value, op.CmpValue)
	}
	return dst
}

// DecodeRequest decodes an ordered request into ops (reusing their
// capacity); keys and values are slices of b. It accepts exactly what
// AppendRequest writes for valid ops: kinds and conditions as above, a
// merge's value a fielded value, a read alone in its request.
func DecodeRequest(b []byte, ops []Op) ([]Op, error) { return decodeOps(b, 0, ops) }

// DecodeMulti decodes a multi request: what AppendMulti writes for valid
// writes (no reads), any number of them (Store.Apply refuses more than
// MaxMulti with LimitMulti, so that the client learns why).
func DecodeMulti(b []byte, ops []Op) ([]Op, error) { return decodeOps(b, FlagMulti, ops) }

// IsMulti reports whether b is (the header of) a multi request.
func IsMulti(b []byte) bool { return len(b) >= 2 && b[0] == RequestFormat && b[1] == FlagMulti }

func decodeOps(b []byte, flags byte, ops []Op) ([]Op, error) {
	ops = ops[:0]
	d, n, err := opwire.NewDecoder(b, RequestFormat, flags, ErrMalformedRequest)
	if err != nil {
		return ops, err
	}
	for range n {
		h, err := d.Header()
		if err != nil {
			return ops, err
		}
		op := Op{Kind: h.Kind, Cmp: h.Cmp, Hashed: h.Space == SpaceHashed, CmpVersion: h.CmpVersion}
		read := op.Kind == OpGet || op.Kind == OpScan
		switch {
		case op.Kind != OpPut && op.Kind != OpDelete && op.Kind != OpMerge && !read,
			op.Cmp > CmpExists, h.Space > SpaceHashed, h.Pad != 0,
			op.Kind == OpMerge && op.Cmp != CmpNone && op.Cmp != CmpExists,
			op.Cmp == CmpExists && op.CmpVersion != 0,
			read && op.Cmp != CmpNone,
			op.Kind == OpGet && op.CmpVersion != 0:
			return ops, fmt.Errorf("%w: op kind %d cmp %d space %d", ErrMalformedRequest, op.Kind, op.Cmp, h.Space)
		}
		if op.Key, op.Value, op.CmpValue, err = d.Parts(h); err != nil {
			return ops, err
		}
		switch {
		case len(op.Key) == 0 && op.Kind != OpScan:
			return ops, fmt.Errorf("%w: empty key", ErrMalformedRequest)
		case (op.Kind == OpDelete || op.Kind == OpGet) && len(op.Value) != 0, op.Cmp != CmpValue && len(op.CmpValue) != 0:
			return ops, fmt.Errorf("%w: stray bytes", ErrMalformedRequest)
		case op.Kind == OpScan && len(op.Value) != 0 && string(op.Value) <= string(op.Key):
			return ops, fmt.Errorf("%w: a scan whose end is not after its start", ErrMalformedRequest)
		}
		if op.Kind == OpMerge {
			if err := fielded.Valid(op.Value); err != nil {
				return ops, fmt.Errorf("%w: a merge's fields: %w", ErrMalformedRequest, err)
			}
		}
		ops = append(ops, op)
	}
	if err := d.End(); err != nil {
		return ops, err
	}
	for i := range ops {
		switch read := ops[i].Kind == OpGet || ops[i].Kind == OpScan; {
		case read && flags == FlagMulti:
			return ops, fmt.Errorf("%w: a read in a multi request", ErrMalformedRequest)
		case read && len(ops) != 1:
			return ops, fmt.Errorf("%w: a read with other ops", ErrMalformedRequest)
		}
	}
	return ops, nil
}

// multiHdr is the size of a multi result's header.
const multiHdr = 8

// MultiResultSize is the result size of a multi request of MaxMulti ops.
const MultiResultSize = multiHdr + MaxMulti*resSize

// appendMultiHeader appends the header of a multi result of n results.
func appendMultiHeader(dst []byte, n int) []byte {
	return append(dst, StatusOK, 0, byte(n), byte(n>>8), 0, 0, 0, 0)
}

// DecodeMultiResult decodes a multi request's result into rs (reusing its
// capacity): one result per op. A result refusing the whole message (24
// bytes: StatusMalformed, or StatusRefused with LimitMulti) is an error;
// so is anything else that is not exactly a header and its results.
func DecodeMultiResult(b []byte, rs []Result) ([]Result, error) {
	rs = rs[:0]
	if len(b) == resSize {
		r, err := DecodeResult(b)
		if err == nil {
			return rs, fmt.Errorf("%w: the group refused the whole multi request (status %d, limit %d)", ErrMalformedRequest, r.Status, r.Limit)
		}
	}
	if len(b) < multiHdr || b[0] != StatusOK || b[1] != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return rs, fmt.Errorf("%w: multi result of %d bytes", ErrMalformedRequest, len(b))
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n == 0 || len(b) != multiHdr+n*resSize {
		return rs, fmt.Errorf("%w: multi result of %d bytes for %d ops", ErrMalformedRequest, len(b), n)
	}
	for i := range n {
		r, err := DecodeResult(b[multiHdr+i*resSize : multiHdr+(i+1)*resSize])
		if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// Result is a write request's outcome (kv.Result's fields).
type Result struct {
	Status   uint8
	FailedOp int
	Count    int
	Version  uint64
	Prev     uint64
	Limit    uint8
	Max      uint64
	Size     uint64
}

// AppendResult appends r's 24 bytes, as kv encodes a result.
func AppendResult(dst []byte, r *Result) []byte {
	var b [resSize]byte
	b[0] = r.Status
	binary.LittleEndian.PutUint16(b[2:], uint16(r.FailedOp))
	if r.Status == StatusRefused {
		b[1] = r.Limit
		binary.LittleEndian.PutUint64(b[8:], r.Max)
		binary.LittleEndian.PutUint64(b[16:], r.Size)
	} else {
		binary.LittleEndian.PutUint32(b[4:], uint32(r.Count))
		binary.LittleEndian.PutUint64(b[8:], r.Version)
		binary.LittleEndian.PutUint64(b[16:], r.Prev)
	}
	return append(dst, b[:]...)
}

// DecodeResult decodes a write request's result.
func DecodeResult(b []byte) (Result, error) {
	if len(b) != resSize || b[0] > StatusMoving || b[0] != StatusRefused && b[1] != 0 ||
		b[0] == StatusRefused && (b[1] == 0 || binary.LittleEndian.Uint32(b[4:]) != 0) {
		return Result{}, fmt.Errorf("%w: result of %d bytes", ErrMalformedRequest, len(b))
	}
	r := Result{Status: b[0], FailedOp: int(binary.LittleEndian.Uint16(b[2:]))}
	if r.Status == StatusRefused {
		r.Limit, r.Max, r.Size = b[1], binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])
		return r, nil
	}
	r.Count = int(binary.LittleEndian.Uint32(b[4:]))
	r.Version, r.Prev = binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])
	return r, nil
}

// Pair is one key of a read's result.
type Pair struct {
	Key, Value []byte
	Version    uint64
}

// ReadResult is a read's outcome.
type ReadResult struct {
	Status   uint8 // StatusOK, StatusMoved, StatusMalformed
	FailedOp int
	More     bool   // a scan stopped at the result's byte bound
	Index    uint64 // the entry the read was applied at
	Pairs    []Pair
}

func pairSize(k, v []byte) int { return 16 + pad8(len(k)) + pad8(len(v)) }

func appendReadHeader(dst []byte, status uint8, failed int, more bool, count int, index uint64) []byte {
	var b [resSize]byte
	b[0] = status
	if more {
		b[1] = 1
	}
	binary.LittleEndian.PutUint16(b[2:], uint16(failed))
	binary.LittleEndian.PutUint32(b[4:], uint32(count))
	binary.LittleEndian.PutUint64(b[8:], index)
	return append(dst, b[:]...)
}

func appendPair(dst []byte, k, v []byte, version uint64) []byte {
	var h [16]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(k)))
	binary.LittleEndian.PutUint32(h[4:], uint32(len(v)))
	binary.LittleEndian.PutUint64(h[8:], version)
	dst = append(dst, h[:]...)
	for _, b := range [][]byte{k, v} {
		dst = append(dst, b...)
		dst = append(dst, make([]byte, pad8(len(b))-len(b))...)
	}
	return dst
}

// DecodeReadResult decodes a read's result; pairs alias b.
func DecodeReadResult(b []byte) (ReadResult, error) {
	var r ReadResult
	if len(b) < resSize || b[0] > StatusMoving || b[1] > 1 || binary.LittleEndian.Uint64(b[16:]) != 0 {
		return r, fmt.Errorf("%w: read result of %d bytes", ErrMalformedRequest, len(b))
	}
	r.Status, r.More = b[0], b[1] == 1
	r.FailedOp = int(binary.LittleEndian.Uint16(b[2:]))
	n := int(binary.LittleEndian.Uint32(b[4:]))
	r.Index = binary.LittleEndian.Uint64(b[8:])
	p := resSize
	if n > (len(b)-p)/16 {
		return r, fmt.Errorf("%w: %d pairs in %d bytes", ErrMalformedRequest, n, len(b))
	}
	for range n {
		if len(b)-p < 16 {
			return r, fmt.Errorf("%w: truncated pair", ErrMalformedRequest)
		}
		kl, vl := int(binary.LittleEndian.Uint32(b[p:])), int(binary.LittleEndian.Uint32(b[p+4:]))
		ver := binary.LittleEndian.Uint64(b[p+8:])
		p += 16
		if kl < 0 || vl < 0 || pad8(kl) > len(b)-p || pad8(kl)+pad8(vl) > len(b)-p {
			return r, fmt.Errorf("%w: truncated pair", ErrMalformedRequest)
		}
		k := b[p : p+kl : p+kl]
		v := b[p+pad8(kl) : p+pad8(kl)+vl : p+pad8(kl)+vl]
		if !zeroPad(b[p+kl:p+pad8(kl)]) || !zeroPad(b[p+pad8(kl)+vl:p+pad8(kl)+pad8(vl)]) {
			return r, fmt.Errorf("%w: padding not zero", ErrMalformedRequest)
		}
		p += pad8(kl) + pad8(vl)
		r.Pairs = append(r.Pairs, Pair{Key: k, Value: v, Version: ver})
	}
	if p != len(b) {
		return r, fmt.Errorf("%w: %d trailing bytes", ErrMalformedRequest, len(b)-p)
	}
	return r, nil
}
