package multicast

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// Memory layout (docs/multicast.md, "Memory layout"). Every replica of
// group g registers, at ids regions.Multicast(g)+k:
//
//	+0 clients: one 32-byte header per client slot c, at c*32:
//	     [inc u64][reply node u32 | reply region u32][retry u64][0]
//	     written by client c only: inc is its incarnation (0: none), the
//	     reply address where the group's leader writes its replies, and
//	     retry the sequence number whose reply it misses (a re-send request)
//	+1 input rings of the clients: client c's ring at c*ClientSlots*SlotSize,
//	     ClientSlots slots of SlotSize bytes; the client writes position p
//	     into slot p mod ClientSlots
//	+2 the parent ring: ParentSlots slots of SlotSize bytes; the parent
//	     group's leader writes the message it assigned position p into
//	     slot p mod ParentSlots
//	+3 credits: one word per child (in tree.Children order): the parent-ring
//	     position the child group consumed and committed, written by the
//	     child's leader (flow control for the parent ring, and where
//	     re-forwarding starts)
//
// A ring slot holds one record, written with one write:
//
//	 0 pos     u64  position in this ring (1, 2, ...; 0 = empty)
//	 8 inc     u64  the client's incarnation
//	16 seq     u64  the client's sequence number (1, 2, ... per incarnation)
//	24 client  u32  the client's slot
//	28 len     u32  payload length
//	32 dst     u64  destination groups (tree.Set)
//	40 rnode   u32  reply node
//	44 rregion u32  reply region
//	48 payload      len bytes, zero padded to a multiple of 8
//	48+pad8(len)    check u64: xxhash of bytes [0, 48+pad8(len)) mixed with the slot's position
//
// The check word ends the record, so a reader that copies the slot and
// finds the check valid has the whole record (a torn or stale slot fails
// it; the poller waits until it validates: ARCHITECTURE.md's canary rule).
//
// A client registers one reply region of ReplyRegionSize bytes:
//
//	reply slot (g, s) at (g*Window + s mod Window)*replySlot(MaxResult):
//	 0 seq   u64
//	 8 inc   u64  the client incarnation the reply is for
//	16 index u64  g's delivery index of the message
//	24 len   u32  result length
//	28 flags u32  replyTruncated: the result was longer than MaxResult;
//	              replyFrom: bits 8-31 hold the low 24 bits of the node id
//	              of the replica that wrote it (g's leader then);
//	              replyDiskFull: no reply but a notice (index 0, no
//	              result): g's leader cannot log the message for now
//	              (its group's disks are full) and leaves it in the ring,
//	              so it may still be delivered once space returns; the
//	              real reply, if any, overwrites it
//	32 result     len bytes, zero padded to a multiple of 8
//	32+pad8(len)  check u64
//	hello words, one per group at Groups*Window*replySlot + g*8: the
//	  incarnation group g has registered for this client (its reset entry
//	  committed and applied)
const (
	regClients = 0
	regRings   = 1
	regParent  = 2
	regCredits = 3
	numRegions = 4

	clientHdrSize = 32
	hInc          = 0
	hAddr         = 8
	hRetry        = 16

	recHdr   = 48
	recCheck = 8

	replyHdr       = 32
	replyTruncated = 1
	replyFrom      = 2
	replyDiskFull  = 4 // not a reply: a notice that the leader refuses the message for now (disk full)
	replyFromShift = 8
)

// replyFromBits are a reply's flags naming node id as its writer.
func replyFromBits(id rdma.NodeID) uint32 { return replyFrom | uint32(id)<<replyFromShift }

// replyWriter is the low 24 bits of the node id of the replica that wrote
// a reply with flags, if it says.
func replyWriter(flags uint32) (uint32, bool) {
	return flags >> replyFromShift, flags&replyFrom != 0
}

func init() {
	if numRegions > regions.MulticastIDs {
		panic("multicast: more regions than the scheme gives a group")
	}
}

func pad8(n int) int { return (n + 7) &^ 7 }

// recordSize is the bytes a record with an n-byte payload takes.
func recordSize(n int) int { return recHdr + pad8(n) + recCheck }

// maxPayload is the largest payload a slot of slotSize bytes holds.
func maxPayload(slotSize int) int { return slotSize - recHdr - recCheck }

// replySlot is the size of one reply slot.
func replySlot(maxResult int) int { return replyHdr + pad8(maxResult) + 8 }

// Addr is where a client's replies go: a node and a region on it.
type Addr struct {
	Node   rdma.NodeID
	Region rdma.RegionID
}

func (a Addr) word() uint64 { return uint64(a.Node)<<32 | uint64(a.Region) }

func addrOf(w uint64) Addr { return Addr{Node: rdma.NodeID(w >> 32), Region: rdma.RegionID(uint32(w))} }

// MsgID identifies a multicast message: the client slot, the client's
// incarnation and its sequence number in that incarnation.
type MsgID struct {
	Client uint32
	Inc    uint64
	Seq    uint64
}

func (id MsgID) String() string { return fmt.Sprintf("c%d.%d#%d", id.Client, id.Inc, id.Seq) }

// record is a decoded ring record; payload aliases the buffer it was
// decoded from.
type record struct {
	pos     uint64
	id      MsgID
	dst     tree.Set
	reply   Addr
	payload []byte
}

func recKey(pos uint64) uint64 { return pos * 0x9e3779b97f4a7c15 }

// encodeRecord writes r into dst (at least recordSize(len(payload)) bytes)
// and returns the record's bytes.
func encodeRecord(dst []byte, r *record) []byte {
	n := len(r.payload)
	end := recHdr + pad8(n)
	b := dst[:end+recCheck]
	le := binary.LittleEndian
	le.PutUint64(b[0:], r.pos)
	le.PutUint64(b[8:], r.id.Inc)
	le.PutUint64(b[16:], r.id.Seq)
	le.PutUint32(b[24:], r.id.Client)
	le.PutUint32(b[28:], uint32(n))
	le.PutUint64(b[32:], uint64(r.dst))
	le.PutUint64(b[40:], r.reply.word())
	copy(b[recHdr:], r.payload)
	clear(b[recHdr+n : end])
	le.PutUint64(b[end:], xxhash.Sum64(b[:end])^recKey(r.pos))
	return b
}

// errNoRecord: the slot does not (yet) hold a valid record at the wanted
// position.
var errNoRecord = errors.New("multicast: no valid record")

// decodeRecord decodes the record at position pos from slot (a copy of a
// ring slot; payload aliases it). It fails with errNoRecord if the slot
// holds another position, is torn or empty, and with a descriptive error
// if it is malformed (a length beyond the slot).
func decodeRecord(slot []byte, pos uint64) (record, error) {
	le := binary.LittleEndian
	if len(slot) < recHdr+recCheck || le.Uint64(slot) != pos || pos == 0 {
		return record{}, errNoRecord
	}
	n := int(le.Uint32(slot[28:]))
	end := recHdr + pad8(n)
	if n < 0 || end+recCheck > len(slot) || end < recHdr {
		return record{}, fmt.Errorf("multicast: record at position %d: payload length %d beyond its %d-byte slot", pos, n, len(slot))
	}
	if le.Uint64(slot[end:]) != xxhash.Sum64(slot[:end])^recKey(pos) {
		return record{}, errNoRecord
	}
	return record{
		pos:     pos,
		id:      MsgID{Client: le.Uint32(slot[24:]), Inc: le.Uint64(slot[8:]), Seq: le.Uint64(slot[16:])},
		dst:     tree.Set(le.Uint64(slot[32:])),
		reply:   addrOf(le.Uint64(slot[40:])),
		payload: slot[recHdr : recHdr+n],
	}, nil
}

// copyRecord copies the record in the ring slot of slotSize bytes at
// mem[off:] (region memory, written concurrently by its peer) into dst (at
// least slotSize bytes) and decodes it as position pos; payload aliases
// dst. Only the record's bytes are copied, not the slot: its length is read
// from the slot's header word first, and a length that does not fit the
// slot is refused as decodeRecord refuses it, without reading past the
// record's bytes. If the copy holds another length than the word read (the
// slot was rewritten between the two reads) the slot counts as torn
// (errNoRecord); otherwise the check word, verified on the copy, says the
// copy is one whole record, exactly as for a whole-slot copy.
func copyRecord(dst, mem []byte, off, slotSize int, pos uint64) (record, error) {
	n := int(rdma.Load64(mem, off+24) >> 32) // [client u32][len u32], little-endian host
	if n < 0 || n > maxPayload(slotSize) {
		return record{}, fmt.Errorf("multicast: record at position %d: payload length %d beyond its %d-byte slot", pos, n, slotSize)
	}
	size := recordSize(n)
	copy(dst[:size], mem[off:off+size])
	if int(leU32(dst[28:])) != n {
		return record{}, errNoRecord
	}
	return decodeRecord(dst[:size], pos)
}

// reply is one destination group's outcome for a message.
type reply struct {
	seq, inc, index uint64
	flags           uint32
	result          []byte
}

func replyKey(g tree.Group, seq uint64) uint64 { return (uint64(g)<<40 ^ seq) * 0xc2b2ae3d27d4eb4f }

// encodeReply writes rp for group g into dst and returns its bytes.
func encodeReply(dst []byte, g tree.Group, rp *reply) []byte {
	n := len(rp.result)
	end := replyHdr + pad8(n)
	b := dst[:end+8]
	le := binary.LittleEndian
	le.PutUint64(b[0:], rp.seq)
	le.PutUint64(b[8:], rp.inc)
	le.PutUint64(b[16:], rp.index)
	le.PutUint32(b[24:], uint32(n))
	le.PutUint32(b[28:], rp.flags)
	copy(b[replyHdr:], rp.result)
	clear(b[replyHdr+n : end])
	le.PutUint64(b[end:], xxhash.Sum64(b[:end])^replyKey(g, rp.seq))
	return b
}

// decodeReply decodes g's reply for (inc, seq) from a copy of its slot;
// result aliases slot. ok is false if the slot holds no valid reply for
// exactly that message.
func decodeReply(slot []byte, g tree.Group, inc, seq uint64) (rp reply, ok bool) {
	le := binary.LittleEndian
	if len(slot) < replyHdr+8 || le.Uint64(slot) != seq || le.Uint64(slot[8:]) != inc {
		return reply{}, false
	}
	n := int(le.Uint32(slot[24:]))
	end := replyHdr + pad8(n)
	if n < 0 || end < replyHdr || end+8 > len(slot) {
		return reply{}, false
	}
	if le.Uint64(slot[end:]) != xxhash.Sum64(slot[:end])^replyKey(g, seq) {
		return reply{}, false
	}
	return reply{seq: seq, inc: inc, index: le.Uint64(slot[16:]), flags: le.Uint32(slot[28:]), result: slot[replyHdr : replyHdr+n]}, true
}

// Log entries: the Data of the Acuerdo entry that orders a message (TRAM
// Alg. 2 step "ordering": the tuple <source, positions, message>; the
// timestamp is Acuerdo's header).
//
//	 0 kind     u8   entryMessage, entryReset (entryBatch: below)
//	 1 src      u8   srcClient, srcParent
//	 2 nfwd     u16  number of child positions
//	 4 client   u32  the client slot (entryReset, srcClient)
//	 8 pos      u64  the consumed input position (entryReset: the incarnation)
//	16 nfwd x u64    the parent-ring position assigned in each child that
//	                 tree.Next(g, dst) names, in ascending child order
//	then, entryMessage: the record (header and payload, no check word)
//	      entryReset:   [reply addr u64]
//
// A batch entry orders several messages in one Acuerdo entry (the leader
// puts every message one scan finds into one, Config.MaxBatch):
//
//	0 kind     u8   entryBatch
//	1 0        u8
//	2 count    u16  number of sub-entries (>= 1)
//	4 0        u32
//	8 count x  sub-entries, each a whole entryMessage entry as above,
//	           zero padded to a multiple of 8
//
// Each sub-entry is applied exactly as the message entry it is (its own
// source position, child positions and dedup), in order. Resets are
// never in a batch.
const (
	entryMessage = 1
	entryReset   = 2
	entryBatch   = 3

	srcClient = 0
	srcParent = 1

	entryHdr = 16
	batchHdr = 8
)

// messageEntrySize is the size of a message entry with nfwd child
// positions and an n-byte payload (unpadded).
func messageEntrySize(nfwd, n int) int { return entryHdr + 8*nfwd + recHdr + n }

// logEntry is a decoded log entry; fwd, rec.payload and subs alias the
// entry.
type logEntry struct {
	kind   uint8
	src    uint8
	client uint32
	pos    uint64 // entryReset: the incarnation
	fwd    []byte // nfwd x u64
	rec    record // entryMessage
	addr   Addr   // entryReset
	count  int    // entryBatch: the number of sub-entries
	subs   []byte // entryBatch: the padded sub-entries (nextSub walks them)
}

func (e *logEntry) fwdPos(i int) uint64 { return binary.LittleEndian.Uint64(e.fwd[i*8:]) }

// appendMessageEntry appends the entry ordering rec (read from src at
// position pos) with child positions fwd to b.
func appendMessageEntry(b []byte, src uint8, client uint32, pos uint64, fwd []uint64, rec *record) []byte {
	le := binary.LittleEndian
	b = append(b, entryMessage, src)
	b = le.AppendUint16(b, uint16(len(fwd)))
	b = le.AppendUint32(b, client)
	b = le.AppendUint64(b, pos)
	for _, p := range fwd {
		b = le.AppendUint64(b, p)
	}
	b = le.AppendUint64(b, rec.pos)
	b = le.AppendUint64(b, rec.id.Inc)
	b = le.AppendUint64(b, rec.id.Seq)
	b = le.AppendUint32(b, rec.id.Client)
	b = le.AppendUint32(b, uint32(len(rec.payload)))
	b = le.AppendUint64(b, uint64(rec.dst))
	b = le.AppendUint64(b, rec.reply.word())
	return append(b, rec.payload...)
}

// appendBatchHeader appends the header of a batch entry of count
// sub-entries to b; appendBatchSub appends each.
func appendBatchHeader(b []byte, count int) []byte {
	b = append(b, entryBatch, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(count))
	return append(b, 0, 0, 0, 0)
}

// appendBatchSub appends one sub-entry of a batch: the message entry
// appendMessageEntry writes, zero padded to a multiple of 8.
func appendBatchSub(b []byte, src uint8, client uint32, pos uint64, fwd []uint64, rec *record) []byte {
	start := len(b)
	b = appendMessageEntry(b, src, client, pos, fwd, rec)
	for (len(b)-start)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

// subSize is the unpadded size of the message entry at the start of b,
// from its header words, or -1 if b is too short to say.
func subSize(b []byte) int {
	if len(b) < entryHdr {
		return -1
	}
	nfwd := int(binary.LittleEndian.Uint16(b[2:]))
	off := entryHdr + nfwd*8
	if len(b) < off+recHdr {
		return -1
	}
	return messageEntrySize(nfwd, int(binary.LittleEndian.Uint32(b[off+28:])))
}

// nextSub splits the first sub-entry off the sub-entries of a batch that
// decodeEntry accepted: the sub-entry (unpadded) and the rest.
func nextSub(subs []byte) (sub, rest []byte) {
	n := subSize(subs)
	return subs[:n], subs[pad8(n):]
}

func appendResetEntry(b []byte, client uint32, inc uint64, addr Addr) []byte {
	le := binary.LittleEndian
	b = append(b, entryReset, srcClient, 0, 0)
	b = le.AppendUint32(b, client)
	b = le.AppendUint64(b, inc)
	return le.AppendUint64(b, addr.word())
}

// decodeEntry decodes a log entry. Entries come from this group's own
// leaders through Acuerdo (checksummed), so an error means a bug or a
// version mismatch; it is reported, never applied.
func decodeEntry(b []byte) (logEntry, error) {
	le := binary.LittleEndian
	if len(b) < entryHdr {
		return logEntry{}, fmt.Errorf("multicast: log entry of %d bytes", len(b))
	}
	e := logEntry{kind: b[0], src: b[1], client: le.Uint32(b[4:]), pos: le.Uint64(b[8:])}
	nfwd := int(le.Uint16(b[2:]))
	switch e.kind {
	case entryReset:
		if len(b) != entryHdr+8 || e.src != srcClient || nfwd != 0 {
			return logEntry{}, fmt.Errorf("multicast: reset entry of %d bytes, source %d, %d positions", len(b), e.src, nfwd)
		}
		e.addr = addrOf(le.Uint64(b[entryHdr:]))
		return e, nil
	case entryBatch:
		return decodeBatch(b)
	case entryMessage:
	default:
		return logEntry{}, fmt.Errorf("multicast: log entry of unknown kind %d", e.kind)
	}
	if e.src != srcClient && e.src != srcParent {
		return logEntry{}, fmt.Errorf("multicast: log entry from unknown source kind %d", e.src)
	}
	off := entryHdr + nfwd*8
	if len(b) < off+recHdr {
		return logEntry{}, fmt.Errorf("multicast: message entry of %d bytes with %d positions", len(b), nfwd)
	}
	e.fwd = b[entryHdr:off]
	h := b[off:]
	n := int(le.Uint32(h[28:]))
	if len(h) != recHdr+n {
		return logEntry{}, fmt.Errorf("multicast: message entry payload %d bytes, header says %d", len(h)-recHdr, n)
	}
	e.rec = record{
		pos:     le.Uint64(h),
		id:      MsgID{Client: le.Uint32(h[24:]), Inc: le.Uint64(h[8:]), Seq: le.Uint64(h[16:])},
		dst:     tree.Set(le.Uint64(h[32:])),
		reply:   addrOf(le.Uint64(h[40:])),
		payload: h[recHdr:],
	}
	return e, nil
}

// decodeBatch validates a whole batch entry (every sub-entry a valid
// message entry, padding zero, nothing after the last), so that Apply
// either applies all of it or panics before applying any.
func decodeBatch(b []byte) (logEntry, error) {
	if len(b) < batchHdr {
		return logEntry{}, fmt.Errorf("multicast: batch entry of %d bytes", len(b))
	}
	count := int(binary.LittleEndian.Uint16(b[2:]))
	if b[1] != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 || count == 0 {
		return logEntry{}, fmt.Errorf("multicast: batch entry header %x", b[:batchHdr])
	}
	subs := b[batchHdr:]
	for i, rest := 0, subs; i < count || len(rest) > 0; i++ {
		if i == count {
			return logEntry{}, fmt.Errorf("multicast: batch entry of %d sub-entries has %d bytes after them", count, len(rest))
		}
		n := subSize(rest)
		if n < 0 || pad8(n) > len(rest) {
			return logEntry{}, fmt.Errorf("multicast: batch entry: sub-entry %d of %d truncated (%d bytes left)", i, count, len(rest))
		}
		if rest[0] != entryMessage {
			return logEntry{}, fmt.Errorf("multicast: batch entry: sub-entry %d of kind %d", i, rest[0])
		}
		if _, err := decodeEntry(rest[:n]); err != nil {
			return logEntry{}, fmt.Errorf("multicast: batch entry: sub-entry %d: %w", i, err)
		}
		for _, c := range rest[n:pad8(n)] {
			if c != 0 {
				return logEntry{}, fmt.Errorf("multicast: batch entry: sub-entry %d: padding not zero", i)
			}
		}
		rest = rest[pad8(n):]
	}
	return logEntry{kind: entryBatch, count: count, subs: subs}, nil
}

func leU32(b []byte) uint32     { return binary.LittleEndian.Uint32(b) }
func putU64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
