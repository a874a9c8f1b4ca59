package kv

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/kv/opwire"
)

// Requests and results: the bytes a client multicasts and the bytes each
// group's Apply returns in the reply (docs/kv.md, "Requests").
//
// A request is a list of operations, applied in order and atomically by
// each destination group (a group applies the operations on the keys it
// owns and skips the others):
//
//	[format u8 = 1][0 u8][count u16] then count ops:
//	op: [kind u8][cmp u8][0 u16][klen u32][vlen u32][clen u32][cver u64]
//	    [key][value][cmp value], each padded to 8
//
// kind is OpPut, OpDelete or OpMerge. cmp is a condition on the key's current
// state, checked before any op of the request is applied: CmpNone,
// CmpVersion (the current version equals cver; 0 means absent) or CmpValue
// (the current value equals the cmp value; absent when cver is 1, for
// "must not exist") or CmpExists (the key has a value; cver is 0). If any condition fails, the group applies nothing.
//
// An OpMerge's value is a fielded value (package kv/fielded): the group
// owning the key sets those fields in the key's value, leaving the others
// (an absent key takes the value as it is). Its cmp is CmpNone or
// CmpExists (then a failed request's Prev, 0, tells an absent key from a
// value that is not fielded, when the merge is the request's first op). If the
// key's value, as the request's earlier ops leave it, is not a fielded
// value, the request fails with StatusCondFailed naming the merge (nothing
// applied); a merged value longer than MaxValue is refused (LimitValue,
// size the merged value's), as is a request whose merged records the heap
// cannot hold. Unlike the other limits, these depend on the key's value,
// so only the group owning the key sees them: in a request spanning
// groups, the other groups still apply their ops.
//
// A result (one per group; at most 64 bytes):
//
//	[status u8][0 u8][failed op u16][count u32][version u64][prev version u64]
//	[status u8 = StatusRefused][limit u8][failed op u16][0 u32][max u64][size u64]
//
// status is StatusOK, StatusCondFailed, StatusMalformed or StatusRefused
// (failed op: the first op whose condition failed, of those this group
// owns, or the first op breaking a limit); version is the version the
// request's writes got here (entry index << 16 | op number of the first
// write); prev version is the version the first op's key had before
// (0: absent), when this group owns it. A refused request's result names
// the limit (LimitKey...), the replica's value of it (max) and what the
// request had (size).
const (
	reqFormat = 1
	resSize   = 24
)

// Op kinds and conditions.
const (
	OpPut    = 1
	OpDelete = 2
	// OpMerge sets the fields its value names in the key's fielded value
	// (see above, and docs/kv.md "Fielded values").
	OpMerge = 3

	CmpNone    = 0
	CmpVersion = 1
	CmpValue   = 2
	// CmpExists: the key has a value (CmpVersion 0).
	CmpExists = 3
)

// Result statuses.
const (
	StatusOK         = 0
	StatusCondFailed = 1
	// StatusMalformed: the request did not decode, or a commit named a
	// staged request this group holds incomplete; nothing applied.
	StatusMalformed = 2
	// StatusRefused: the request (in a multi request: the op) breaks a
	// limit of the replica, named by Result.Limit; nothing applied. Every
	// replica of every group refuses the same requests for LimitKey,
	// LimitValue, LimitRequest and LimitMulti: the checks cover every op
	// of the request, not only the group's own.
	StatusRefused = 3
)

// Limits a replica enforces (Result.Limit of a StatusRefused result).
const (
	// LimitKey: a key longer than TableConfig.MaxKey.
	LimitKey = 1
	// LimitValue: a value longer than TableConfig.MaxValue.
	LimitValue = 2
	// LimitRequest: a request, or a request sent in parts, of more bytes
	// than TableConfig.MaxRequest.
	LimitRequest = 3
	// LimitMulti: a multi request of more than MaxMulti ops.
	LimitMulti = 4
	// LimitHeap: the table's heap cannot hold the request's records (its
	// heap regions are all in use).
	LimitHeap = 5
	// LimitStages: a commit named a staged request the group does not
	// hold: a client slot has at most MaxStages staged at once, and a
	// newer one evicted it (Max is MaxStages, Size the request's bytes).
	LimitStages = 6

	maxLimit = LimitStages
)

// LimitName is the name of a limit: max_key and max_value as the cluster
// config spells them, and max_request, max_multi, max_stages, heap.
func LimitName(l uint8) string {
	switch l {
	case LimitKey:
		return "max_key"
	case LimitValue:
		return "max_value"
	case LimitRequest:
		return "max_request"
	case LimitMulti:
		return "max_multi"
	case LimitHeap:
		return "heap"
	case LimitStages:
		return "max_stages"
	}
	return fmt.Sprintf("limit %d", l)
}

// Op is one operation of a request.
type Op struct {
	Kind  uint8
	Cmp   uint8
	Key   []byte
	Value []byte
	// CmpVersion for CmpVersion (0: the key must be absent); for CmpValue,
	// 1 means the key must be absent and CmpValue is ignored.
	CmpVersion uint64
	CmpValue   []byte
}

// ErrMalformed is returned for request or result bytes that do not decode.
var ErrMalformed = errors.New("kv: malformed request")

func pad8(n int) int { return (n + 7) &^ 7 }

// RequestSize is the encoded size of a request holding ops.
func RequestSize(ops []Op) int {
	n := opwire.ReqHdr
	for i := range ops {
		n += opwire.Size(ops[i].Key, ops[i].Value, ops[i].CmpValue)
	}
	return n
}

// AppendRequest appends the encoding of ops to dst.
func AppendRequest(dst []byte, ops []Op) []byte { return appendOps(dst, reqFormat, ops) }

// A multi request (format 4) carries independent single-key operations
// that a client combined into one message: each is applied on its own,
// with its own condition, in order, and gets its own result. Its layout
// is a request's with format 4; its result is
//
//	[status u8 = StatusOK][0 u8][count u16][0 u32] then count results of 24 bytes
//
// (each as a request's result, for that one op).
const (
	multiFormat = 4
	// MaxMulti bounds the operations of a multi request, so that its
	// result fits MultiResultSize.
	MaxMulti = 32
)

// MultiResultSize is the result size of a multi request of MaxMulti ops:
// the groups' MaxResult must be at least this.
const MultiResultSize = 8 + MaxMulti*resSize

// AppendMulti appends the encoding of a multi request of ops (at most
// MaxMulti) to dst.
func AppendMulti(dst []byte, ops []Op) []byte { return appendOps(dst, multiFormat, ops) }

// DecodeMultiResult decodes a multi request's result into rs.
func DecodeMultiResult(b []byte, rs []Result) ([]Result, error) {
	rs = rs[:0]
	if len(b) < 8 || b[0] != StatusOK || b[1] != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		if len(b) == resSize {
			r, err := DecodeResult(b)
			if err == nil && r.Status == StatusMalformed {
				return rs, fmt.Errorf("%w: the group refused the multi request", ErrMalformed)
			}
		}
		return rs, fmt.Errorf("%w: multi result of %d bytes", ErrMalformed, len(b))
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if len(b) != 8+n*resSize {
		return rs, fmt.Errorf("%w: multi result of %d bytes for %d ops", ErrMalformed, len(b), n)
	}
	for i := range n {
		r, err := DecodeResult(b[8+i*resSize : 8+(i+1)*resSize])
		if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func appendOps(dst []byte, format byte, ops []Op) []byte {
	dst = opwire.AppendRequestHeader(dst, format, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		dst = opwire.AppendOp(dst, op.Kind, op.Cmp, 0, op.CmpVersion, op.Key, op.Value, op.CmpValue)
	}
	return dst
}

// DecodeRequest decodes a request into ops (reusing its capacity); keys and
// values are slices of b.
func DecodeRequest(b []byte, ops []Op) ([]Op, error) { return decodeOps(b, reqFormat, ops) }

// DecodeMulti decodes a multi request.
func DecodeMulti(b []byte, ops []Op) ([]Op, error) {
	ops, err := decodeOps(b, multiFormat, ops)
	if err == nil && len(ops) > MaxMulti {
		return ops[:0], fmt.Errorf("%w: %d ops in a multi request, limit %d", ErrMalformed, len(ops), MaxMulti)
	}
	return ops, err
}

func decodeOps(b []byte, format byte, ops []Op) ([]Op, error) {
	ops = ops[:0]
	d, n, err := opwire.NewDecoder(b, format, 0, ErrMalformed)
	if err != nil {
		return ops, err
	}
	for range n {
		h, err := d.Header()
		if err != nil {
			return ops, err
		}
		op := Op{Kind: h.Kind, Cmp: h.Cmp, CmpVersion: h.CmpVersion}
		if op.Kind != OpPut && op.Kind != OpDelete && op.Kind != OpMerge || op.Cmp > CmpExists || h.Space != 0 || h.Pad != 0 ||
			op.Kind == OpMerge && op.Cmp != CmpNone && op.Cmp != CmpExists || op.Cmp == CmpExists && op.CmpVersion != 0 {
			return ops, fmt.Errorf("%w: op kind %d cmp %d", ErrMalformed, op.Kind, op.Cmp)
		}
		if op.Key, op.Value, op.CmpValue, err = d.Parts(h); err != nil {
			return ops, err
		}
		if len(op.Key) == 0 {
			return ops, fmt.Errorf("%w: empty key", ErrMalformed)
		}
		if op.Kind == OpDelete && len(op.Value) != 0 || op.Cmp != CmpValue && len(op.CmpValue) != 0 {
			return ops, fmt.Errorf("%w: stray bytes", ErrMalformed)
		}
		if op.Kind == OpMerge {
			if err := fielded.Valid(op.Value); err != nil {
				return ops, fmt.Errorf("%w: a merge's fields: %w", ErrMalformed, err)
			}
		}
		ops = append(ops, op)
	}
	return ops, d.End()
}

// ResultSize is the size of a request's result (and of a multi
// request's result when the group refused the whole message).
const ResultSize = resSize

// Result is one group's outcome of a request.
type Result struct {
	Status   uint8
	FailedOp int    // StatusCondFailed, StatusRefused: the index of the first failed op
	Count    int    // ops applied here
	Version  uint64 // the version of this group's first write
	Prev     uint64 // the first op's key's version before (0: absent), if owned here
	// StatusRefused: which limit (LimitKey...), the replica's value of
	// it, and the size the request had (bytes; ops for LimitMulti).
	Limit     uint8
	Max, Size uint64
}

func refused(limit uint8, op int, max, size int) Result {
	return Result{Status: StatusRefused, Limit: limit, FailedOp: op, Max: uint64(max), Size: uint64(size)}
}

func encodeResult(dst []byte, r *Result) []byte {
	dst = dst[:resSize]
	dst[0], dst[1] = r.Status, 0
	binary.LittleEndian.PutUint16(dst[2:], uint16(r.FailedOp))
	if r.Status == StatusRefused {
		dst[1] = r.Limit
		binary.LittleEndian.PutUint32(dst[4:], 0)
		binary.LittleEndian.PutUint64(dst[8:], r.Max)
		binary.LittleEndian.PutUint64(dst[16:], r.Size)
		return dst
	}
	binary.LittleEndian.PutUint32(dst[4:], uint32(r.Count))
	binary.LittleEndian.PutUint64(dst[8:], r.Version)
	binary.LittleEndian.PutUint64(dst[16:], r.Prev)
	return dst
}

// DecodeResult decodes a group's result bytes.
func DecodeResult(b []byte) (Result, error) {
	if len(b) != resSize || b[0] > maxStatus {
		return Result{}, fmt.Errorf("%w: result of %d bytes", ErrMalformed, len(b))
	}
	if b[0] == StatusRefused {
		if b[1] == 0 || b[1] > maxLimit || binary.LittleEndian.Uint32(b[4:]) != 0 {
			return Result{}, fmt.Errorf("%w: refusal naming limit %d", ErrMalformed, b[1])
		}
		return Result{Status: StatusRefused, Limit: b[1], FailedOp: int(binary.LittleEndian.Uint16(b[2:])),
			Max: binary.LittleEndian.Uint64(b[8:]), Size: binary.LittleEndian.Uint64(b[16:])}, nil
	}
	if b[1] != 0 {
		return Result{}, fmt.Errorf("%w: result of %d bytes", ErrMalformed, len(b))
	}
	return Result{Status: b[0], FailedOp: int(binary.LittleEndian.Uint16(b[2:])), Count: int(binary.LittleEndian.Uint32(b[4:])),
		Version: binary.LittleEndian.Uint64(b[8:]), Prev: binary.LittleEndian.Uint64(b[16:])}, nil
}

// Requests larger than one client slot travel in parts (docs/kv.md,
// "Large values"): the client multicasts parts to the request's groups,
// each group stages their bytes in its replicated state, and a commit
// message applies the staged request as if it had come whole. Parts carry
// their offset, so they may be delivered in any order; each is delivered
// once (TRAM's exactly-once). The values thus pass through the log, split
// into slot-sized records, and sit in the staging area only until the
// commit.
//
//	0                      4           8         16          24          28           32
//	[format u8 = 2][0][0 u16][client u32][inc u64][stage u64][total u32][offset u32][bytes]   part
//	[format u8 = 3][0][0 u16][client u32][inc u64][stage u64][total u32][0 u32]               commit
//
// (client, inc, stage) names the staged request: the client's slot and
// incarnation, and a number the client does not reuse in the incarnation.
// A group holds at most MaxStages staged requests per client slot; a
// commit naming one it does not hold (evicted) is refused (LimitStages).
const (
	partFormat   = 2
	commitFormat = 3
)

// StageID names a staged request.
type StageID struct {
	Client uint32
	Inc    uint64
	Stage  uint64
}

// AppendPart appends a part message carrying req[off:off+n].
func AppendPart(dst []byte, id StageID, total int, off int, part []byte) []byte {
	var h [32]byte
	h[0] = partFormat
	binary.LittleEndian.PutUint32(h[4:], id.Client)
	binary.LittleEndian.PutUint64(h[8:], id.Inc)
	binary.LittleEndian.PutUint64(h[16:], id.Stage)
	binary.LittleEndian.PutUint32(h[24:], uint32(total))
	binary.LittleEndian.PutUint32(h[28:], uint32(off))
	dst = append(dst, h[:32]...)
	return append(dst, part...)
}

// AppendCommit appends the commit message of a staged request.
func AppendCommit(dst []byte, id StageID, total int) []byte {
	var h [32]byte
	h[0] = commitFormat
	binary.LittleEndian.PutUint32(h[4:], id.Client)
	binary.LittleEndian.PutUint64(h[8:], id.Inc)
	binary.LittleEndian.PutUint64(h[16:], id.Stage)
	binary.LittleEndian.PutUint32(h[24:], uint32(total))
	return append(dst, h[:]...)
}

// PartOverhead is the bytes a part message adds to the request bytes it
// carries.
const PartOverhead = 32

// decodeStaged decodes a part or commit message.
func decodeStaged(b []byte) (format uint8, id StageID, total, off int, part []byte, err error) {
	if len(b) < 32 || b[1] != 0 || b[2] != 0 || b[3] != 0 {
		return 0, id, 0, 0, nil, fmt.Errorf("%w: staged message of %d bytes", ErrMalformed, len(b))
	}
	format = b[0]
	id = StageID{Client: binary.LittleEndian.Uint32(b[4:]), Inc: binary.LittleEndian.Uint64(b[8:]), Stage: binary.LittleEndian.Uint64(b[16:])}
	total = int(binary.LittleEndian.Uint32(b[24:]))
	off = int(binary.LittleEndian.Uint32(b[28:]))
	part = b[32:]
	switch {
	case format == commitFormat && (off != 0 || len(part) != 0):
		return 0, id, 0, 0, nil, fmt.Errorf("%w: commit with %d bytes", ErrMalformed, len(part))
	case format == partFormat && (off > total || len(part) > total-off || len(part) == 0):
		return 0, id, 0, 0, nil, fmt.Errorf("%w: part [%d, +%d) of %d", ErrMalformed, off, len(part), total)
	case format != partFormat && format != commitFormat:
		return 0, id, 0, 0, nil, fmt.Errorf("%w: format %d", ErrMalformed, format)
	}
	return format, id, total, off, part, nil
}
