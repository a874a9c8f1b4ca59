package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// References (issue 19: each entry written once per process). The
// replicas of a process that share its log write the same entry each:
// the leader when it broadcasts it (Acuerdo, Fig. 4 l.40) and every
// follower when it accepts it (Fig. 5 l.49), as the same payload
// (broadcast's walEntry: epoch, counter, id and data, nothing of the
// replica's own). The Mux finds such a payload itself, with no knowledge
// of the protocol: a stream record whose payload (length, xxhash64, then
// the bytes) equals that of a record already in the open batch is
// written as a reference to it,
//
//	[stream header, byte 6 = 1][target global seq u64][length u32][0 u32][xxhash64 of the payload u64]
//
// 64 bytes on the disk against the payload's size. The stream header is
// the reference's own (its stream, type, flags and stream seq); only the
// payload is the target's. The target is always an earlier record of the
// same batch, a whole record, never a reference or a marker: a batch is
// written into one segment and reaches the disk as one write, so the
// reference and its target are in one segment, dropped together
// (DropBefore drops whole segments), and a torn or corrupt tail that
// keeps the reference keeps its target (the records lost run from the
// bad one to the next batch; the target comes first). RecoverMux checks
// each of these (resolveRef): a reference that names a record outside its
// batch or segment, a missing one, one that is not a whole record, or one
// whose payload's length or hash differs, is ErrCorrupt.
const (
	muxRefFlag = 1  // byte 6 of a reference's stream header
	muxRefSize = 24 // a reference's payload
	// muxRefMin: shorter payloads are written whole (a commit record;
	// not worth a hash).
	muxRefMin = 64
	refSlots  = 256 // the open batch's table (direct mapped by hash)
)

// refSlot is a whole record of the open batch in the table.
type refSlot struct {
	batch uint64 // the Writer's openFirst when it was appended
	hash  uint64
	g     uint64 // its global seq
	off   int    // its payload's offset in the Writer's open batch
	n     int
}

// refTable finds payloads equal to a record of the open batch. A slot of
// an earlier batch is stale (its batch tag differs); a collision only
// loses a match, never makes a wrong one (the bytes are compared).
type refTable struct {
	slots [refSlots]refSlot
	// counters (RefStats)
	refs, saved uint64
}

func hashParts(parts [][]byte) uint64 {
	if len(parts) == 1 {
		return xxhash.Sum64(parts[0])
	}
	var d xxhash.Digest
	d.Reset()
	for _, p := range parts {
		d.Write(p)
	}
	return d.Sum64()
}

func equalParts(b []byte, parts [][]byte) bool {
	for _, p := range parts {
		if len(p) > len(b) || !bytes.Equal(b[:len(p)], p) {
			return false
		}
		b = b[len(p):]
	}
	return len(b) == 0
}

// findRef returns the global seq of a whole record of the open batch
// whose payload is parts (n bytes, hash h).
func (m *Mux) findRef(h uint64, n int, parts [][]byte) (uint64, bool) {
	w := m.w
	sl := &m.ref.slots[h%refSlots]
	if m.knobs.muxRefAcrossBatches {
		// planted: length and hash alone, of whatever batch
		return sl.g, sl.g != 0 && sl.hash == h && sl.n == n
	}
	if len(w.open) == 0 || sl.batch != w.openFirst || sl.hash != h || sl.n != n {
		return 0, false
	}
	return sl.g, equalParts(w.open[sl.off:sl.off+n], parts)
}

// noteRef enters the whole record just appended (global seq g, payload
// of n bytes, hash h) in the table.
func (m *Mux) noteRef(h uint64, n int, g uint64) {
	w := m.w
	off := len(w.open) - recSize(muxHdrSize+n) + recHdrSize + muxHdrSize
	m.ref.slots[h%refSlots] = refSlot{batch: w.openFirst, hash: h, g: g, off: off, n: n}
}

func putMuxRef(dst []byte, g uint64, n int, h uint64) {
	binary.LittleEndian.PutUint64(dst[0:], g)
	binary.LittleEndian.PutUint32(dst[8:], uint32(n))
	binary.LittleEndian.PutUint32(dst[12:], 0)
	binary.LittleEndian.PutUint64(dst[16:], h)
}

// MuxRef is a decoded reference's payload.
type MuxRef struct {
	Target uint64 // the global seq of the record whose payload it is
	Len    uint32
	Hash   uint64 // xxhash64 of that payload
}

// ParseMuxRef decodes a reference's payload (MuxRecord.Data of a
// MuxRecord with Ref set): ok is false if its length is not 24, its
// reserved word is not zero, or its target is 0.
func ParseMuxRef(b []byte) (MuxRef, bool) {
	if len(b) != muxRefSize || binary.LittleEndian.Uint32(b[12:]) != 0 {
		return MuxRef{}, false
	}
	r := MuxRef{Target: binary.LittleEndian.Uint64(b[0:]), Len: binary.LittleEndian.Uint32(b[8:]), Hash: binary.LittleEndian.Uint64(b[16:])}
	if r.Target == 0 {
		return MuxRef{}, false
	}
	return r, true
}

// RefStats: stream records the Mux wrote as references, and the log
// bytes they saved (the whole records' sizes less the references').
func (m *Mux) RefStats() (refs, savedBytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ref.refs, m.ref.saved
}

// resolveRef returns the payload the reference m (recs[i], the log's
// record) names: the payload of an earlier whole record of the same
// batch (the last batch that starts at or below recs[i]; batches: the
// first global seqs of the batches Recover read, in order) and segment,
// of the reference's length and hash. Anything else is ErrCorrupt.
func resolveRef(recs []Record, i int, batches []uint64, m MuxRecord, knobs testingKnobs) ([]byte, error) {
	r := recs[i]
	bad := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: stream %d seq %d (global seq %d at %+v): a reference %s", ErrCorrupt, m.Stream, m.Seq, r.Seq, r.Pos, fmt.Sprintf(format, args...))
	}
	ref, ok := ParseMuxRef(m.Data)
	if !ok {
		return bad("malformed")
	}
	b := sort.Search(len(batches), func(k int) bool { return batches[k] > r.Seq }) - 1
	if b < 0 || ref.Target < batches[b] || ref.Target >= r.Seq {
		first := uint64(0)
		if b >= 0 {
			first = batches[b]
		}
		return bad("to global seq %d, not earlier in its batch (global seqs %d..)", ref.Target, first)
	}
	// Records are in seq order; a batch's records have consecutive seqs.
	j := i - int(r.Seq-ref.Target)
	if j < 0 || recs[j].Seq != ref.Target {
		j = sort.Search(i, func(k int) bool { return recs[k].Seq >= ref.Target })
		if j >= i || recs[j].Seq != ref.Target {
			return bad("to global seq %d, which is missing", ref.Target)
		}
	}
	if knobs.muxRefWrongTarget {
		// planted: the whole record before the target
		for k := j - 1; k >= 0; k-- {
			if x, ok := ParseMuxRecord(recs[k].Data); ok && !x.Ref && x.Type != recMarker {
				j = k
				break
			}
		}
	}
	t := recs[j]
	if t.Pos.Seg != r.Pos.Seg {
		return bad("to global seq %d in segment %d, not its own %d", ref.Target, t.Pos.Seg, r.Pos.Seg)
	}
	tm, ok := ParseMuxRecord(t.Data)
	if !ok || t.Type != RecMux || tm.Ref || tm.Type == recMarker {
		return bad("to global seq %d, which is not a whole stream record", ref.Target)
	}
	if knobs.muxRefNoCheck {
		return tm.Data, nil
	}
	if len(tm.Data) != int(ref.Len) || xxhash.Sum64(tm.Data) != ref.Hash {
		return bad("to global seq %d does not match it (length %d, want %d; or its hash)", ref.Target, len(tm.Data), ref.Len)
	}
	return tm.Data, nil
}
