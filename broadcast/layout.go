package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
)

// Memory layout (docs/broadcast.md, "Memory layout"). Every member registers:
//
//	region RegionBase+0: the SST region
//	  rows, one 64-byte row per (table, member), table-major:
//	    offset (t*n + i)*64, t = 0 AcceptSST, 1 CommitSST, 2 VoteSST
//	    AcceptSST row: [epoch][cnt][fetched]  [incarnation][0]              [0][0][check]
//	    CommitSST row: [epoch][cnt][heartbeat][incarnation][delivered index][follows][0][check]
//	    VoteSST row:   [e_new][acpt epoch][acpt cnt][incarnation][0]        [0][0][check]
//	  ring acknowledgements, one word per member at 3*n*64 + i*8:
//	    [sender inc tag u8 | receiver inc tag u8 | consumed bytes u48]
//	    written by member i: how far it consumed the ring this node writes to it
//	    (the sender's flow control; one word, so it needs no checksum)
//	region RegionBase+1+i: the incoming ring from member i (RingSize bytes)
//	region RegionBase+1+n+i: the snapshot this node serves to member i
//
// A row is written by its owner only, with one write of the whole row, and
// fetched (AcceptSST) counts the snapshot bytes the member fetched so far:
// the leader sees a long transfer progress and does not restart it.
// follows (CommitSST) is the epoch whose leader the member hears now: a
// follower's E_cur while its leader's heartbeat moves, a leader's own
// epoch while a majority follows it, else 0 (docs/broadcast.md, "Pre-vote
// and leader stickiness"). check = xxhash(words 0..6) mixed with the row's slot, so a torn or
// misplaced row is rejected and the reader keeps its last valid copy. Rows
// are monotonic within an incarnation.
const (
	rowSize  = 64
	rowWords = 8

	tAccept = 0
	tCommit = 1
	tVote   = 2
	nTables = 3

	wHeartbeat   = 2 // CommitSST: the failure detector's counter (Fig. 6 l.93-95)
	wIncarnation = 3
	wIndex       = 4 // CommitSST: the member's delivered count (its commit index)
	wAckFull     = 4 // AcceptSST (Sync, Async): 1 while the member's log finds its disk full (durable.go, updateFull)
	wForced      = 4 // VoteSST: 1 for an operator's forced vote (ForceLead), else 0
	wFollows     = 5 // CommitSST: the epoch whose leader this member hears now (0: none); pre-vote and leader stickiness
	wSeen        = 5 // VoteSST (Async): the highest commit index this member saw (its Commit records')
	wFromDisk    = 6 // VoteSST (Async): 1 while this member, restarted without its memory, waits for a recovery election (awaitsRecovery)
	wCheck       = 7
)

type row [rowWords]uint64

func sstSize(n int) int { return nTables*n*rowSize + n*8 }

func rowOffset(t, i, n int) int { return (t*n + i) * rowSize }

func ackOffset(i, n int) int { return nTables*n*rowSize + i*8 }

func rowCheck(r *row, t, i int) uint64 {
	var b [56]byte
	for k := 0; k < 7; k++ {
		binary.LittleEndian.PutUint64(b[k*8:], r[k])
	}
	return xxhash.Sum64(b[:]) ^ (uint64(t)<<8|uint64(i))*0x9e3779b97f4a7c15
}

// encodeRow seals r (sets its check word) and writes it to dst[0:64].
func encodeRow(dst []byte, r *row, t, i int) {
	r[wCheck] = rowCheck(r, t, i)
	encodeSealed(dst, r)
}

// encodeSealed writes a row whose check word is set to dst[0:64].
func encodeSealed(dst []byte, r *row) {
	for k := 0; k < rowWords; k++ {
		binary.LittleEndian.PutUint64(dst[k*8:], r[k])
	}
}

// rowUnchanged reports whether the row at (t, i) is the valid row last
// decoded into *last (seen true): a new row always brings a new check word,
// so one load tells. A row that did not validate is looked at again in full.
func rowUnchanged(mem []byte, t, i, n int, last *row, seen bool) bool {
	return seen && rdma.Load64(mem, rowOffset(t, i, n)+wCheck*8) == last[wCheck]
}

// decodeRow reads the row at (t, i) from SST memory and reports whether it
// is valid (written and not torn).
func decodeRow(mem []byte, t, i, n int) (row, bool) {
	var r row
	off := rowOffset(t, i, n)
	for k := 0; k < rowWords; k++ {
		r[k] = rdma.Load64(mem, off+k*8)
	}
	return r, r[wIncarnation] != 0 && r[wCheck] == rowCheck(&r, t, i)
}

const ackMask = 1<<48 - 1

func ackWord(sinc, rinc uint64, consumed uint64) uint64 {
	return (sinc&0xff)<<56 | (rinc&0xff)<<48 | consumed&ackMask
}

// liftAck turns an acknowledged 48-bit cursor into an absolute one, given
// the sender's absolute write position sent (consumed <= sent).
func liftAck(a, sent uint64) uint64 {
	return sent - ((sent - a) & ackMask)
}

// Ring records. One record is written with one RDMA write:
//
//	0        4      5      6      7    8          16          24        32
//	[len u32][kind u8][sinc u8][rinc u8][0][seq u64][epoch u64][cnt u64][payload, len bytes, zero-padded to 8][check u64]
//
// seq is the record's absolute position in the ring (bytes written since the
// ring was reset), sinc and rinc the low bytes of the sender's and receiver's
// incarnations, and check is xxhash of everything before it keyed with both
// full incarnations (recKey): a record still landing, an older record at the
// same offset, or a record of another pair of incarnations (also one whose
// low bytes match: incarnations chosen by a rejoining member need not count
// up by one) is not accepted. A kPad record sends the reader to offset 0;
// if fewer than recHdr+8 bytes remain before the end, the reader wraps
// without one.
const (
	recHdr = 32

	kPad      = 1 // continue at offset 0
	kMsg      = 2 // Acuerdo Fig. 4 message: (epoch, cnt) + entry payload
	kForward  = 3 // a proposal forwarded to the leader of epoch
	kDiffPart = 4 // part of a diff; applied when the kDiffEnd part arrives
	kDiffEnd  = 5 // last part of a diff with header (epoch, cnt)
	kSnapshot = 6 // a snapshot to fetch with one-sided reads, base of the next diff
)

func recSize(payload int) int { return recHdr + rdma.Round8(payload) + 8 }

type recHeader struct {
	len        int
	kind       uint8
	sinc, rinc uint64 // the sender's and receiver's incarnations (their low bytes are in the record)
	seq        uint64
	hdr        MsgHdr
}

// recKey keys a record's check word with both full incarnations.
func recKey(sinc, rinc uint64) uint64 {
	return (sinc*0x9e3779b97f4a7c15 ^ rinc*0xc2b2ae3d27d4eb4f) | 1
}

// encodeRecord writes a record with payload already placed at
// dst[recHdr:recHdr+h.len] and returns its size; dst must hold recSize(h.len)
// bytes.
func encodeRecord(dst []byte, h recHeader) int {
	w0 := uint64(uint32(h.len)) | uint64(h.kind)<<32 | uint64(uint8(h.sinc))<<40 | uint64(uint8(h.rinc))<<48
	binary.LittleEndian.PutUint64(dst[0:], w0)
	binary.LittleEndian.PutUint64(dst[8:], h.seq)
	binary.LittleEndian.PutUint64(dst[16:], uint64(h.hdr.E))
	binary.LittleEndian.PutUint64(dst[24:], h.hdr.Cnt)
	end := recHdr + rdma.Round8(h.len)
	clear(dst[recHdr+h.len : end])
	binary.LittleEndian.PutUint64(dst[end:], xxhash.Sum64(dst[:end])^recKey(h.sinc, h.rinc))
	return end + 8
}

// decodeRecord validates the record at mem[off:] (a ring of len(mem) bytes)
// that should sit at absolute ring position seq, written by sender
// incarnation sinc for receiver incarnation rinc, and returns its header and
// size. ok is false while no complete valid record is there.
func decodeRecord(mem []byte, off int, seq, sinc, rinc uint64) (h recHeader, size int, ok bool) {
	if len(mem)-off < recHdr+8 || rdma.Load64(mem, off+8) != seq {
		return h, 0, false
	}
	w0 := rdma.Load64(mem, off)
	h.len = int(uint32(w0))
	h.kind = uint8(w0 >> 32)
	h.sinc, h.rinc = sinc, rinc
	if h.kind < kPad || h.kind > kSnapshot || h.len > len(mem) || uint8(w0>>40) != uint8(sinc) || uint8(w0>>48) != uint8(rinc) {
		return h, 0, false
	}
	size = recSize(h.len)
	if size > len(mem)-off {
		return h, 0, false
	}
	end := off + size - 8
	if rdma.Load64(mem, end) != xxhash.Sum64(mem[off:end])^recKey(sinc, rinc) {
		return h, 0, false
	}
	h.seq = rdma.Load64(mem, off+8)
	h.hdr = MsgHdr{E: Epoch(rdma.Load64(mem, off+16)), Cnt: rdma.Load64(mem, off+24)}
	return h, size, true
}

// Entry payloads.
//
//	kMsg, kForward payload:  [origin u32][oinc u32][pseq u64][data ...]
//	kDiffPart/kDiffEnd payload: [base epoch u64][base cnt u64][flags u64] then entries
//	  entry: [epoch u64][cnt u64][origin u32][oinc u32][pseq u64][dlen u64][data, zero-padded to 8]
//	a keyed proposal's (ProposeKeyed) pseq word has bit 63 set (keyedBit), and its
//	data starts with its key: [client u64][seq u64][the proposal's data ...]
//	kSnapshot payload: [meta region u64][meta size u64][meta xxhash u64][commit epoch u64][commit cnt u64]
//
// (origin, oinc, pseq) names a proposal: the node that proposed it, the low
// 32 bits of that node's incarnation, and its sequence number there
// (1, 2, ...). pseq 0 names no proposal: an entry a leader appended
// (Replica.Append), which no proposal resolves on and no per-proposer
// table records. A keyed proposal's entry carries its Key in the first
// keyLen bytes of its data (flagged by keyedBit in the pseq word), so the
// Log, the forward path, messages and diffs move it as they move any data
// and unkeyed entries are unchanged.
const (
	entryMeta     = 16
	diffHdr       = 24
	diffEntryHdr  = 40
	snapRecLen    = 40
	diffSnapshot  = 1  // flags: the diff's base is the fetched snapshot
	diffReset     = 2  // flags (Async): install the snapshot even if your commit point looks ahead of it (leader.go startSync)
	snapMetaWords = 2  // snapshot meta region: [index u64][ntable u64][table ...][state location][keys]
	snapTableRec  = 16 // one member's record in the snapshot's table

	keyedBit   = 1 << 63 // in a proposal's pseq word: its data starts with its Key
	keyLen     = 16      // [client u64][seq u64]
	snapKeyRec = 32      // a keyed client's record in a snapshot, before its result
	keyFlagBig = 1       // the result was longer than maxKeptResult and is not kept
)

// maxProposal is the largest proposal data for records of at most
// maxRecord payload bytes (a multiple of 8): the tightest record that
// carries a proposal is a diff part holding it alone, a diffHdr part header
// and one diffEntryHdr entry header before the data; a message or forwarded
// record needs only entryMeta. This is the one place the limit is derived.
func maxProposal(maxRecord int) int { return maxRecord - diffHdr - diffEntryHdr }

type proposalID struct {
	origin rdma.NodeID
	oinc   uint32
	pseq   uint64
}

func putMeta(dst []byte, id proposalID) {
	binary.LittleEndian.PutUint32(dst[0:], uint32(id.origin))
	binary.LittleEndian.PutUint32(dst[4:], id.oinc)
	binary.LittleEndian.PutUint64(dst[8:], id.pseq)
}

func getMeta(src []byte) proposalID {
	return proposalID{
		origin: rdma.NodeID(binary.LittleEndian.Uint32(src[0:])),
		oinc:   binary.LittleEndian.Uint32(src[4:]),
		pseq:   binary.LittleEndian.Uint64(src[8:]),
	}
}

func diffEntrySize(e *entry) int { return diffEntryHdr + rdma.Round8(len(e.data)) }

func putDiffEntry(dst []byte, e *entry) int {
	binary.LittleEndian.PutUint64(dst[0:], uint64(e.hdr.E))
	binary.LittleEndian.PutUint64(dst[8:], e.hdr.Cnt)
	putMeta(dst[16:], e.id)
	binary.LittleEndian.PutUint64(dst[32:], uint64(len(e.data)))
	n := copy(dst[diffEntryHdr:], e.data)
	end := diffEntryHdr + rdma.Round8(n)
	clear(dst[diffEntryHdr+n : end])
	return end
}

// getDiffEntry decodes one entry from src (a validated record's payload);
// ok is false if src is malformed.
func getDiffEntry(src []byte) (e *entry, size int, ok bool) {
	if len(src) < diffEntryHdr {
		return nil, 0, false
	}
	dlen := binary.LittleEndian.Uint64(src[32:])
	if dlen > uint64(len(src)-diffEntryHdr) {
		return nil, 0, false
	}
	e = &entry{
		hdr:  MsgHdr{E: Epoch(binary.LittleEndian.Uint64(src[0:])), Cnt: binary.LittleEndian.Uint64(src[8:])},
		id:   getMeta(src[16:]),
		data: append([]byte(nil), src[diffEntryHdr:diffEntryHdr+int(dlen)]...),
	}
	size = diffEntryHdr + rdma.Round8(int(dlen))
	return e, min(size, len(src)), true
}

// A snapshot (what a member behind the pruned log fetches) is two regions
// of the leader's: a small meta region, announced by a kSnapshot record
// (region, size, xxhash of it, commit point), and the state the meta
// region points to, in a region of the leader's (the FSM's bytes written
// there by FSMSnapshot.Persist, off the polling goroutine) or in the FSM's
// own registered memory (RegionSnapshot). Meta region:
//
//	[index u64][n u64] then n table records, one per member in Members order:
//	  [member u32][oinc u32][pseq u64]
//	then [state region u64][state offset u64][state size u64][state xxhash u64]
//	then [nkeys u64] and nkeys key records, oldest last delivery first (strictly
//	increasing index):
//	  [client u64][seq u64][index u64][rlen u32][flags u32][result, rlen bytes, zero-padded to 8]
//
// index is the number of entries the snapshot covers, the table each
// member's last delivered proposal (the duplicate filter), the four state
// words where the FSM's state is and its checksum, and the key records the
// keyed-proposal table (keyed.go): each client's last delivered Seq, the
// index it was delivered at and the result the FSM returned (flags
// keyFlagBig: longer than maxKeptResult, not kept; rlen is then 0).
const snapStateWords = 4

// snapMeta is a decoded meta region.
type snapMeta struct {
	index      uint64
	table      []tableRec
	region     rdma.RegionID
	off        uint64
	size       uint64
	stateCheck uint64
	keys       []keySnap
}

// keySnap is one keyed client's record in a snapshot.
type keySnap struct {
	client, seq, index uint64
	result             []byte // nil when empty or not kept
	big                bool   // the result was longer than maxKeptResult
}

// snapMetaSize is the size of a meta region's fixed part (everything but
// the key records) for a group of n.
func snapMetaSize(n int) int { return snapMetaWords*8 + n*snapTableRec + snapStateWords*8 + 8 }

// maxSnapMetaSize bounds a meta region whose key table holds at most
// maxKeys records.
func maxSnapMetaSize(n, maxKeys int) uint64 {
	return uint64(snapMetaSize(n)) + uint64(maxKeys)*(snapKeyRec+maxKeptResult)
}

// errBadSnapshot: a fetched snapshot failed validation. It is traced, not
// installed, and the leader's re-sync sends another; no API returns it.
var errBadSnapshot = errors.New("broadcast: malformed snapshot")

// encodeSnapMeta lays out a snapshot's meta region for the given members.
func encodeSnapMeta(members []rdma.NodeID, m snapMeta) []byte {
	n := len(members)
	size := snapMetaSize(n)
	for _, k := range m.keys {
		size += snapKeyRec + rdma.Round8(len(k.result))
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint64(b[0:], m.index)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	for k, t := range m.table {
		w := b[snapMetaWords*8+k*snapTableRec:]
		binary.LittleEndian.PutUint32(w[0:], uint32(members[k]))
		binary.LittleEndian.PutUint32(w[4:], t.oinc)
		binary.LittleEndian.PutUint64(w[8:], t.pseq)
	}
	w := b[snapMetaWords*8+n*snapTableRec:]
	binary.LittleEndian.PutUint64(w[0:], uint64(m.region))
	binary.LittleEndian.PutUint64(w[8:], m.off)
	binary.LittleEndian.PutUint64(w[16:], m.size)
	binary.LittleEndian.PutUint64(w[24:], m.stateCheck)
	binary.LittleEndian.PutUint64(w[32:], uint64(len(m.keys)))
	w = w[40:]
	for _, k := range m.keys {
		binary.LittleEndian.PutUint64(w[0:], k.client)
		binary.LittleEndian.PutUint64(w[8:], k.seq)
		binary.LittleEndian.PutUint64(w[16:], k.index)
		binary.LittleEndian.PutUint32(w[24:], uint32(len(k.result)))
		if k.big {
			binary.LittleEndian.PutUint32(w[28:], keyFlagBig)
		}
		copy(w[snapKeyRec:], k.result)
		w = w[snapKeyRec+rdma.Round8(len(k.result)):]
	}
	return b
}

// decodeSnapMeta validates a fetched meta region against this group's
// members. Errors wrap errBadSnapshot.
func decodeSnapMeta(b []byte, members []rdma.NodeID) (m snapMeta, err error) {
	n := len(members)
	if len(b) < snapMetaSize(n) {
		return m, fmt.Errorf("broadcast: snapshot meta of %d bytes for %d members, want %d: %w", len(b), n, snapMetaSize(n), errBadSnapshot)
	}
	m.index = binary.LittleEndian.Uint64(b[0:])
	if nt := binary.LittleEndian.Uint64(b[8:]); nt != uint64(n) {
		return m, fmt.Errorf("broadcast: snapshot table of %d records for %d members: %w", nt, n, errBadSnapshot)
	}
	m.table = make([]tableRec, n)
	for k := range m.table {
		w := b[snapMetaWords*8+k*snapTableRec:]
		if id := rdma.NodeID(binary.LittleEndian.Uint32(w[0:])); id != members[k] {
			return snapMeta{}, fmt.Errorf("broadcast: snapshot table record %d is for node %d, member %d is node %d: %w", k, id, k, members[k], errBadSnapshot)
		}
		m.table[k] = tableRec{oinc: binary.LittleEndian.Uint32(w[4:]), pseq: binary.LittleEndian.Uint64(w[8:])}
	}
	w := b[snapMetaWords*8+n*snapTableRec:]
	rw := binary.LittleEndian.Uint64(w[0:])
	if m.region = rdma.RegionID(rw); uint64(m.region) != rw {
		return snapMeta{}, fmt.Errorf("broadcast: snapshot state region %#x is no region id: %w", rw, errBadSnapshot)
	}
	m.off = binary.LittleEndian.Uint64(w[8:])
	m.size = binary.LittleEndian.Uint64(w[16:])
	m.stateCheck = binary.LittleEndian.Uint64(w[24:])
	if m.off+m.size < m.off {
		return snapMeta{}, fmt.Errorf("broadcast: snapshot state at %d+%d wraps: %w", m.off, m.size, errBadSnapshot)
	}
	if m.keys, err = decodeSnapKeys(b[snapMetaSize(n):], binary.LittleEndian.Uint64(w[32:]), m.index); err != nil {
		return snapMeta{}, err
	}
	return m, nil
}

// decodeSnapKeys decodes and validates nkeys key records filling b
// exactly, in the one encoding encodeSnapMeta writes: clients and Seqs
// nonzero, clients distinct, indices strictly increasing and at most the
// snapshot's index, results at most maxKeptResult bytes and zero-padded,
// a result not kept only with rlen 0. Results alias b.
func decodeSnapKeys(b []byte, nkeys, index uint64) ([]keySnap, error) {
	if nkeys > uint64(len(b))/snapKeyRec {
		return nil, fmt.Errorf("broadcast: snapshot of %d key records in %d bytes: %w", nkeys, len(b), errBadSnapshot)
	}
	if nkeys == 0 {
		if len(b) != 0 {
			return nil, fmt.Errorf("broadcast: snapshot meta has %d bytes after its key table: %w", len(b), errBadSnapshot)
		}
		return nil, nil
	}
	keys := make([]keySnap, nkeys)
	seen := make(map[uint64]bool, nkeys)
	var last uint64
	for i := range keys {
		if len(b) < snapKeyRec {
			return nil, fmt.Errorf("broadcast: snapshot key record %d truncated: %w", i, errBadSnapshot)
		}
		k := keySnap{client: binary.LittleEndian.Uint64(b[0:]), seq: binary.LittleEndian.Uint64(b[8:]), index: binary.LittleEndian.Uint64(b[16:])}
		rlen := int(binary.LittleEndian.Uint32(b[24:]))
		flags := binary.LittleEndian.Uint32(b[28:])
		switch {
		case k.client == 0 || k.seq == 0 || seen[k.client]:
			return nil, fmt.Errorf("broadcast: snapshot key record %d: client %d seq %d: %w", i, k.client, k.seq, errBadSnapshot)
		case k.index <= last || k.index > index:
			return nil, fmt.Errorf("broadcast: snapshot key record %d at index %d (previous %d, snapshot %d): %w", i, k.index, last, index, errBadSnapshot)
		case rlen > maxKeptResult || flags > keyFlagBig || flags == keyFlagBig && rlen != 0:
			return nil, fmt.Errorf("broadcast: snapshot key record %d: result of %d bytes, flags %#x: %w", i, rlen, flags, errBadSnapshot)
		case len(b)-snapKeyRec < rdma.Round8(rlen):
			return nil, fmt.Errorf("broadcast: snapshot key record %d truncated: %w", i, errBadSnapshot)
		}
		seen[k.client], last = true, k.index
		k.big = flags == keyFlagBig
		end := snapKeyRec + rdma.Round8(rlen)
		for _, c := range b[snapKeyRec+rlen : end] {
			if c != 0 {
				return nil, fmt.Errorf("broadcast: snapshot key record %d: padding not zero: %w", i, errBadSnapshot)
			}
		}
		if rlen > 0 {
			k.result = b[snapKeyRec : snapKeyRec+rlen : snapKeyRec+rlen]
		}
		keys[i] = k
		b = b[end:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("broadcast: snapshot meta has %d bytes after its key table: %w", len(b), errBadSnapshot)
	}
	return keys, nil
}
