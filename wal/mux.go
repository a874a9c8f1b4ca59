package wal

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// One log per process (docs/dev/durability-plan.md, "One log per
// process"): a Mux keeps the records of several streams (a process's
// replicas) in one log, so that one fdatasync covers every stream's batch.
//
// It is a layer over one Writer, whose batches, segments, torn-tail and
// corruption rules it keeps as they are: every stream record is one
// Writer record of type RecMux whose payload starts with a 16-byte stream
// header,
//
//	[stream u32][type u8][flags u8][0 u16][stream seq u64]
//
// followed by the stream's payload. The Writer's seq (the global seq)
// rises by one per record of any stream; each stream has its own seq that
// rises by one per record of that stream, the seq its handle returns and
// its Recovered names, as its own log would. A record of type 0 is a
// marker: "the stream's next record has stream seq S" (a stream whose
// records were all dropped keeps its next seq in the log that way, and a
// stream whose unfinished diff recovery dropped says that it continues at
// the diff's seq, voiding the dropped records that are still in the file).
// A record whose header has byte 6 set to 1 is a reference: its payload
// is an earlier record's of the same batch (muxref.go).

// RecMux is the Writer record type of a Mux's stream records.
const RecMux RecType = 8

// MuxMember is set in a Mux's Config.Member (the segments' header): a
// per-replica Recover of a Mux's directory, or RecoverMux of a replica's,
// fails on the member check instead of misreading the records.
const MuxMember = uint64(1) << 63

const (
	muxHdrSize = 16
	recMarker  = RecType(0) // a stream record of type 0: the stream's next seq
)

// MuxRecord is a decoded stream record header.
type MuxRecord struct {
	Stream uint32
	Type   RecType
	Flags  uint8
	Seq    uint64 // the stream's seq (a marker's: the stream's next seq)
	// Ref: the record is a reference (byte 6 of its header is 1): Data
	// is its 24-byte reference (ParseMuxRef), not the payload.
	Ref  bool
	Data []byte
}

func putMuxHdr(dst []byte, stream uint32, typ RecType, flags uint8, seq uint64) {
	binary.LittleEndian.PutUint32(dst[0:], stream)
	dst[4], dst[5], dst[6], dst[7] = byte(typ), flags, 0, 0
	binary.LittleEndian.PutUint64(dst[8:], seq)
}

// ParseMuxRecord decodes the payload of a RecMux record: ok is false if it
// is too short, its reserved bytes are not zero (byte 6 may be 1: a
// reference), its type is RecBatch, its seq is 0, a marker carries data,
// or a reference is a marker or its payload is not 24 bytes.
func ParseMuxRecord(b []byte) (MuxRecord, bool) {
	if len(b) < muxHdrSize || b[6] > muxRefFlag || b[7] != 0 {
		return MuxRecord{}, false
	}
	r := MuxRecord{Stream: binary.LittleEndian.Uint32(b[0:]), Type: RecType(b[4]), Flags: b[5],
		Seq: binary.LittleEndian.Uint64(b[8:]), Ref: b[6] == muxRefFlag, Data: b[muxHdrSize:len(b):len(b)]}
	if r.Type == RecBatch || r.Type == RecMux || r.Seq == 0 || r.Type == recMarker && (len(r.Data) != 0 || r.Flags != 0 || r.Ref) ||
		r.Ref && len(r.Data) != muxRefSize {
		return MuxRecord{}, false
	}
	return r, true
}

// MuxRecovered is what RecoverMux read back: the log as Recover read it
// and each stream's records split out of it.
type MuxRecovered struct {
	Log *Recovered
	// Streams are each stream's records, as its own log would have
	// recovered them: Records in stream seq order with the stream's seqs,
	// NextSeq, Corrupt in stream seqs, DroppedDiff; Segments are the
	// Mux's segments with FirstSeq the stream seq of the stream's first
	// record at or after the segment's start (its NextSeq if none).
	Streams map[uint32]*Recovered
	// Warnings are the log's and the split's lines to log.
	Warnings []string

	info  map[uint32]*muxStreamRec
	holes []Corruption
}

// For is stream id's Recovered: Streams[id], or, for a stream the log
// holds nothing of, an empty log that starts at seq 1, with a
// corruption report if the log lost records to corruption (they may
// have been the stream's: a stream's records can all be in a corrupt
// range, and its absence is then no proof that it had none).
func (mr *MuxRecovered) For(id uint32) *Recovered {
	if r, ok := mr.Streams[id]; ok {
		return r
	}
	r := &Recovered{NextSeq: 1}
	for _, c := range mr.holes {
		r.Corrupt = append(r.Corrupt, Corruption{At: c.At, Path: c.Path, FromSeq: 1, ToSeq: math.MaxUint64,
			Reason: fmt.Sprintf("stream %d: none of its records read; some may be in the log's corrupt range (global seqs %d..%d: %s)", id, c.FromSeq, c.ToSeq, c.Reason)})
	}
	for _, g := range mr.Log.Segments {
		g.FirstSeq = 1
		r.Segments = append(r.Segments, g)
	}
	return r
}

type muxStreamRec struct {
	evidence uint64 // global seq of the last record or marker of the stream kept
	rewind   bool   // an unfinished diff was dropped: Open writes a marker
	holes    int    // corruption ranges passed when its last record was read
	has      bool   // a record or marker was read
}

// RecoverMux reads the Mux log in dir: Recover, then the split of its
// records by stream (member must have MuxMember set). A record that is not
// a stream record, or a stream whose seqs jump with no corruption to
// explain it, is ErrCorrupt (the log was not written by a Mux, or a Mux
// bug mixed streams).
func RecoverMux(fsys vfs.FS, dir string, member uint64) (*MuxRecovered, error) {
	return recoverMux(fsys, dir, member, testingKnobs{})
}

func recoverMux(fsys vfs.FS, dir string, member uint64, knobs testingKnobs) (*MuxRecovered, error) {
	if member&MuxMember == 0 {
		return nil, fmt.Errorf("wal: member %d of a mux log lacks MuxMember", member)
	}
	rec, err := recoverLog(fsys, dir, member, knobs)
	if err != nil {
		return nil, err
	}
	return splitMux(rec, knobs)
}

func splitMux(rec *Recovered, knobs testingKnobs) (*MuxRecovered, error) {
	mr := &MuxRecovered{Log: rec, Streams: map[uint32]*Recovered{}, info: map[uint32]*muxStreamRec{}}
	mr.Warnings = append(mr.Warnings, rec.Warnings...)
	// Corruption that lost records (global seqs), in order.
	var holes []Corruption
	for _, c := range rec.Corrupt {
		if c.ToSeq >= c.FromSeq {
			holes = append(holes, c)
		}
	}
	slices.SortFunc(holes, func(a, b Corruption) int { return cmpU64(a.FromSeq, b.FromSeq) })
	mr.holes = holes
	passed := 0
	stream := func(id uint32) (*Recovered, *muxStreamRec) {
		if knobs.muxMixStreams {
			id &= 0xff
		}
		s, ok := mr.Streams[id]
		if !ok {
			s = &Recovered{NextSeq: 1}
			mr.Streams[id] = s
			mr.info[id] = &muxStreamRec{}
		}
		return s, mr.info[id]
	}
	lost := func(id uint32, s *Recovered, in *muxStreamRec, to uint64) {
		c := holes[in.holes]
		if knobs.muxHideLoss {
			return
		}
		s.Corrupt = append(s.Corrupt, Corruption{At: c.At, Path: c.Path, FromSeq: s.NextSeq, ToSeq: to,
			Reason: fmt.Sprintf("stream %d: records may be in the log's corrupt range (global seqs %d..%d: %s)", id, c.FromSeq, c.ToSeq, c.Reason)})
	}
	for i, r := range rec.Records {
		for passed < len(holes) && holes[passed].ToSeq < r.Seq {
			passed++
		}
		if r.Type != RecMux {
			return nil, fmt.Errorf("%w: record seq %d at %+v has type %d in a mux log", ErrCorrupt, r.Seq, r.Pos, r.Type)
		}
		m, ok := ParseMuxRecord(r.Data)
		if !ok {
			return nil, fmt.Errorf("%w: record seq %d at %+v: malformed stream header", ErrCorrupt, r.Seq, r.Pos)
		}
		if m.Ref {
			var err error
			if m.Data, err = resolveRef(rec.Records, i, rec.batches, m, knobs); err != nil {
				return nil, err
			}
		}
		s, in := stream(m.Stream)
		switch {
		case !in.has:
			// The stream's first record kept: segments before it may
			// have been dropped, so it may start at any seq; a hole
			// before it may have taken some of its records.
			if in.holes < passed && m.Seq > 1 {
				in.holes = 0
				s.NextSeq = 1
				lost(m.Stream, s, in, m.Seq-1)
			}
		case m.Type == recMarker && m.Seq <= s.NextSeq:
			// a pin (== next) or a rewind: the records at and above it
			// are void (an unfinished diff recovery dropped)
			k := len(s.Records)
			for k > 0 && s.Records[k-1].Seq >= m.Seq {
				k--
			}
			s.Records = s.Records[:k]
		case m.Seq != s.NextSeq:
			if in.holes == passed {
				return nil, fmt.Errorf("%w: stream %d: record seq %d (global seq %d at %+v) follows seq %d with no corruption between", ErrCorrupt, m.Stream, m.Seq, r.Seq, r.Pos, s.NextSeq-1)
			}
			if m.Seq < s.NextSeq {
				return nil, fmt.Errorf("%w: stream %d: record seq %d (global seq %d at %+v) after seq %d", ErrCorrupt, m.Stream, m.Seq, r.Seq, r.Pos, s.NextSeq-1)
			}
			lost(m.Stream, s, in, m.Seq-1)
		}
		in.has, in.holes, in.evidence = true, passed, r.Seq
		s.NextSeq = m.Seq
		if m.Type != recMarker {
			s.Records = append(s.Records, Record{Type: m.Type, Flags: m.Flags, Seq: m.Seq, Data: m.Data, Pos: r.Pos})
			s.NextSeq = m.Seq + 1
		}
	}
	// A stream whose last record comes before a hole may have lost
	// records in it (it may also have had none there: unknowable).
	ids := make([]uint32, 0, len(mr.Streams))
	for id := range mr.Streams {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the warnings' order
	for _, id := range ids {
		s, in := mr.Streams[id], mr.info[id]
		if in.holes < len(holes) {
			lost(id, s, in, math.MaxUint64)
		}
	}
	for _, id := range ids {
		s, in := mr.Streams[id], mr.info[id]
		if len(s.Corrupt) == 0 {
			dropStreamDiff(id, s, in, mr)
		}
		// Segments in the stream's seqs.
		k := 0
		for _, g := range rec.Segments {
			for k < len(s.Records) && s.Records[k].Pos.Seg < g.Seq {
				k++
			}
			first := s.NextSeq
			if k < len(s.Records) {
				first = s.Records[k].Seq
			}
			si := g
			si.FirstSeq = first
			s.Segments = append(s.Segments, si)
		}
		s.TornAt, s.TornRecords = rec.TornAt, rec.TornRecords
	}
	return mr, nil
}

// dropStreamDiff: a DiffBegin without its DiffEnd at the end of a
// stream's records is dropped with what follows it (Recover's rule, per
// stream); the records stay in the file until their segment is dropped,
// and the Mux that continues the log writes a marker that voids them.
func dropStreamDiff(id uint32, s *Recovered, in *muxStreamRec, mr *MuxRecovered) {
	i := len(s.Records) - 1
	for ; i >= 0; i-- {
		if s.Records[i].Type == RecDiffEnd {
			return
		}
		if s.Records[i].Type == RecDiffBegin {
			break
		}
	}
	if i < 0 {
		return
	}
	s.DroppedDiff = len(s.Records) - i
	s.NextSeq = s.Records[i].Seq
	mr.Warnings = append(mr.Warnings, fmt.Sprintf("wal: stream %d: dropped an unfinished diff at seq %d (%d records)", id, s.NextSeq, s.DroppedDiff))
	s.Records = s.Records[:i]
	in.rewind = true
	// Its last record kept lies before the diff (its global seq is not
	// kept here): no evidence until the marker OpenMux writes is synced,
	// which holds back the drop of the segments before it meanwhile.
	in.evidence = 0
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Mux is one log shared by several streams. Its Stream handles offer
// what broadcast uses of a Writer; they may be called from different
// goroutines (a mutex guards the Mux; appends copy into the shared batch
// under it; the getters a poller calls most read what the Mux published
// under it, without taking it: publish).
type Mux struct {
	mu    sync.Mutex
	w     *Writer
	knobs testingKnobs
	now   time.Duration
	// prep: the device, in Sync mode, if it is a Preparer (the batch
	// that opens at an idle log prepares it: Stream.append).
	prep Preparer

	streams []*Stream // in creation order; Stream.idx
	byID    map[uint32]*Stream
	// segs: per live segment of w, each stream's first stream seq at or
	// after the segment's start (index: Stream.idx; missing: 1).
	segs    []muxSeg
	lastSeg uint32
	parts   [][]byte
	hdr     [muxHdrSize]byte
	markHdr [muxHdrSize]byte
	refBuf  [muxRefSize]byte

	kicks atomic.Pointer[[]func()]

	ref refTable // the open batch's whole records (muxref.go)

	// The gather (Config.GatherWindow; gather.go).
	gather gatherState

	// Continue's counters (ContinueStats); lastContinued: the first
	// global seq of the last batch it started.
	continues, continued, lastContinued uint64

	// The log's state the streams' pollers ask for most (UnsyncedBytes,
	// Err, Full), published under mu by publish and read without it.
	pubUnsynced atomic.Int64
	pubErr      atomic.Bool
	pubFull     atomic.Bool

	// The streams' Polls that need not take the mutex (Async; quietUntil).
	// quietUntil: a Poll before this time (the Poll clock) would find
	// the log as the last one left it, with nothing to do: no IO in
	// flight or queued (so no completion can come), nothing due before
	// it (the open batch's interval, a flush, a drop, a space query);
	// 0: none of that holds, poll. Published under mu by every method
	// that changes the Writer (publishQuiet); a Stream's Poll before it
	// returns without the mutex (Stream.skipNow, Stream.skips).
	quietUntil atomic.Int64
	// devContinues: the device calls Continue after every completion but
	// a Quiet IO's (SetDeviceContinues), so an IO in flight does not end
	// quietUntil: its completion's Continue republishes it.
	devContinues bool
}

type muxSeg struct {
	seq    uint32
	firstG uint64
	first  []uint64
}

// Stream is one stream's handle on a Mux.
type Stream struct {
	m   *Mux
	id  uint32
	idx int

	next, synced uint64
	mark         uint64 // DropBefore's
	records      uint64
	bytes        uint64 // bytes of its records synced, as its own log would hold them (a reference: its target's size)
	appended     uint64 // bytes of its records appended (as bytes)
	pend         []muxPend
	head         int
	evidence     uint64        // global seq of its last synced record or marker
	markerG      uint64        // global seq of its marker in flight (0: none)
	polledSynced atomic.Uint64 // Synced at its last Poll (Poll's report)
	// skipNow: the latest time a Poll of it returned without the mutex
	// (Mux.quietUntil), which the next locked method takes for the
	// Writer's clock (the records' append times), as if it had polled;
	// skips counts those Polls. Written by its poller only.
	skipNow atomic.Int64
	skips   atomic.Uint64

	// pub: what its poller asks for between (and within) Polls, published
	// under the Mux's mutex (Mux.publish) and read without it: the getters
	// below (OldestUnsynced, Synced, NextSeq, BytesWritten) are called for
	// every record a replica reads from a ring (Async's back-pressure) and
	// several times a Poll; taking the Mux's mutex for each made its cache
	// line bounce between the process's pollers and the device's goroutine.
	pub streamPub
}

// streamPub is a Stream's published state (Stream.pub).
type streamPub struct {
	oldest              atomic.Int64 // OldestUnsynced (-1: none)
	synced, next, bytes atomic.Uint64
}

type muxPend struct {
	g, s  uint64
	at    time.Duration
	bytes uint64
}

// OpenMux returns a Mux that continues the recovered log rec (nil: an
// empty log). cfg.Member must have MuxMember set. Every stream rec holds
// has its handle (Stream); a stream whose unfinished diff recovery
// dropped gets its marker appended first.
func OpenMux(dev Device, cfg Config, rec *MuxRecovered) (*Mux, error) {
	if cfg.Member&MuxMember == 0 {
		return nil, fmt.Errorf("wal: member %d of a mux log lacks MuxMember", cfg.Member)
	}
	var lrec *Recovered
	if rec != nil {
		lrec = rec.Log
	}
	w, err := Open(dev, cfg, lrec)
	if err != nil {
		return nil, err
	}
	m := &Mux{w: w, byID: map[uint32]*Stream{}}
	if p, ok := dev.(Preparer); ok && cfg.Mode == Sync {
		m.prep = p
	}
	m.gather.starter = -1
	m.kicks.Store(&[]func(){})
	for _, g := range w.segs {
		m.segs = append(m.segs, muxSeg{seq: g.Seq, firstG: g.FirstSeq})
		m.lastSeg = g.Seq
	}
	if rec != nil {
		ids := make([]uint32, 0, len(rec.Streams))
		for id := range rec.Streams {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			sr, in := rec.Streams[id], rec.info[id]
			s := m.stream(id)
			s.next = sr.NextSeq
			s.synced = s.next - 1
			s.polledSynced.Store(s.synced)
			s.evidence = in.evidence
			for j := range m.segs {
				if j < len(sr.Segments) {
					m.segs[j].first[s.idx] = sr.Segments[j].FirstSeq
				}
			}
		}
		for _, id := range ids {
			if rec.info[id].rewind {
				s := m.byID[id]
				if !m.appendMarker(s) {
					return nil, fmt.Errorf("wal: stream %d: the marker of its dropped diff was refused: %v", id, w.Err())
				}
			}
		}
	}
	m.publish()
	m.publishQuiet()
	return m, nil
}

// Stream returns the handle of stream id, made if new (its first record
// gets stream seq 1). kick, if not nil, is called (from the device's
// goroutine) after every completion of the Mux's device: every stream's
// poller must look, since one sync covers them all.
func (m *Mux) Stream(id uint32, kick func()) *Stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stream(id)
	if kick != nil {
		nk := append(append([]func(){}, *m.kicks.Load()...), kick)
		m.kicks.Store(&nk)
	}
	return s
}

func (m *Mux) stream(id uint32) *Stream {
	if s, ok := m.byID[id]; ok {
		return s
	}
	s := &Stream{m: m, id: id, idx: len(m.streams), next: 1, mark: 1}
	m.streams = append(m.streams, s)
	m.byID[id] = s
	for j := range m.segs {
		m.segs[j].first = append(m.segs[j].first, 1)
	}
	m.publishStream(s)
	return s
}

// Kick calls every stream's kick: the Mux's device calls it after a
// completion (NewFileDevice(fs, m.Kick) through a closure).
func (m *Mux) Kick() {
	for _, k := range *m.kicks.Load() {
		k()
	}
}

// Continue polls the log from its device's goroutine, right after a
// completion (the shared log's device calls it, then Kick): it reaps the
// completion, moves every stream's Synced, and starts the next batch at
// once, so that the device goes from one batch's fsync to the next
// batch's write without waiting for a poller to be scheduled (under CPU
// load that wait was longer than the fsync). It is a Poll at now (at
// least the latest time any Poll gave; 0: that time), with one
// difference: it never starts the gather's window (Config.GatherWindow),
// which is the streams' Polls' to start at their own time; a batch the
// gather would hold waits for them. What counts as synced is the
// Writer's rule, whoever polls.
func (m *Mux) Continue(now time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.continues++
	if m.knobs.continueNoStart {
		return false
	}
	m.w.noHoldStart = true
	tag := m.w.tag
	p := m.poll(now)
	m.w.noHoldStart = false
	if m.w.tag != tag && m.w.cur != nil && (m.w.phase == pWrite || m.w.phase == pCreate) && m.w.cur.first > m.lastContinued {
		m.continued++ // this Continue started a batch
		m.lastContinued = m.w.cur.first
	}
	return p
}

// ContinueStats: completions the device continued (Continue calls), and
// of them those that started the next batch (the rest found nothing due:
// every record appended was in the batch that ended, or the gather held
// the open one).
func (m *Mux) ContinueStats() (calls, started uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.continues, m.continued
}

// Writer is the Mux's log (its Stats, Segments; not to append to).
func (m *Mux) Writer() *Writer { return m.w }

// Poll polls the log: Stream.Poll of any stream does it.
func (m *Mux) Poll(now time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poll(now)
}

func (m *Mux) poll(now time.Duration) bool {
	m.catchUpClock()
	m.now = max(m.now, now)
	m.w.hold = m.wanted(true)
	to := m.w.gatherTO
	p := m.w.Poll(m.now)
	if m.w.gatherTO != to {
		m.gatherTimedOut()
	}
	m.trackSegs()
	synced := m.w.Synced()
	for _, s := range m.streams {
		for s.head < len(s.pend) && s.pend[s.head].g <= synced {
			e := s.pend[s.head]
			s.synced, s.bytes, s.evidence = e.s, e.bytes, max(s.evidence, e.g)
			s.head++
		}
		if s.head == len(s.pend) {
			s.pend, s.head = s.pend[:0], 0
		} else if s.head > 1024 && s.head > len(s.pend)/2 {
			n := copy(s.pend, s.pend[s.head:])
			s.pend, s.head = s.pend[:n], 0
		}
		if s.markerG != 0 && s.markerG <= synced {
			s.evidence, s.markerG = max(s.evidence, s.markerG), 0
		}
	}
	m.planDrop()
	m.publish()
	m.publishQuiet()
	return p
}

// trackSegs notes the stream seqs at the start of a segment the Writer
// added, and forgets the segments it dropped. A segment is added (its
// directory synced) before its first batch is synced, so the records at
// or after its first global seq are all still pending when this runs.
func (m *Mux) trackSegs() {
	k := 0
	for k < len(m.segs) && (len(m.w.segs) == 0 || m.segs[k].seq < m.w.segs[0].Seq) {
		k++
	}
	if k > 0 {
		m.segs = append(m.segs[:0], m.segs[k:]...)
	}
	for _, g := range m.w.segs {
		if g.Seq <= m.lastSeg {
			continue
		}
		ms := muxSeg{seq: g.Seq, firstG: g.FirstSeq, first: make([]uint64, len(m.streams))}
		for _, s := range m.streams {
			p := s.pend[s.head:]
			i := sort.Search(len(p), func(i int) bool { return p[i].g >= g.FirstSeq })
			if i < len(p) {
				ms.first[s.idx] = p[i].s
			} else {
				ms.first[s.idx] = s.next
			}
		}
		m.segs = append(m.segs, ms)
		m.lastSeg = g.Seq
	}
}

// planDrop asks the Writer to drop the segments every stream is done
// with: segment j and those before it go once, for every stream, its
// records in them are below its DropBefore mark and its last synced
// record or marker lies after them (so that its next seq survives). A
// stream that holds a drop back only by the second gets a marker.
func (m *Mux) planDrop() {
	n := len(m.segs)
	if n < 2 || len(m.w.segs) != n {
		return
	}
	j := n - 1 // drop the segments before index j
	for _, s := range m.streams {
		for j > 0 && m.segs[j].first[s.idx] > s.mark {
			j--
		}
	}
	if m.knobs.muxDropOwnMark && len(m.streams) > 0 {
		// planted: the drop follows one stream's mark (the highest)
		j = n - 1
		s := m.lastMarked()
		for j > 0 && m.segs[j].first[s.idx] > s.mark {
			j--
		}
	}
	if j == 0 {
		return
	}
	target := j
	for _, s := range m.streams {
		if s.next == 1 || m.knobs.muxNoEvidence {
			continue // no record yet: nothing to keep
		}
		k := target
		for k > 0 && m.segs[k].firstG > s.evidence {
			k--
		}
		if k < j && s.markerG == 0 {
			m.appendMarker(s)
		}
		target = min(target, k)
	}
	if target > 0 {
		m.w.DropBefore(m.segs[target].firstG)
	}
}

func (m *Mux) lastMarked() *Stream {
	best := m.streams[0]
	for _, s := range m.streams {
		if s.mark > 1 && s.mark >= best.mark {
			best = s
		}
	}
	return best
}

func (m *Mux) appendMarker(s *Stream) bool {
	putMuxHdr(m.markHdr[:], s.id, recMarker, 0, s.next)
	g, ok := m.w.AppendLazy(RecMux, 0, m.markHdr[:])
	if ok {
		s.markerG = g
	}
	return ok
}

// publish stores what the getters read without the mutex (Stream.pub,
// pubUnsynced, pubErr, pubFull): every method that changes it calls it
// before unlocking (poll, Stream.append, OpenMux, stream). A value is
// stored only when it changed, so that a Poll that moved nothing writes no
// cache line the other pollers read.
func (m *Mux) publish() {
	if m.knobs.muxStalePub {
		return // planted: the getters keep what they read first
	}
	for _, s := range m.streams {
		m.publishStream(s)
	}
	m.publishLog()
}

func (m *Mux) publishLog() {
	if u := m.w.unsynced(); m.pubUnsynced.Load() != u {
		m.pubUnsynced.Store(u)
	}
	if e := m.w.Err() != nil; m.pubErr.Load() != e {
		m.pubErr.Store(e)
	}
	if f := m.w.Full(); m.pubFull.Load() != f {
		m.pubFull.Store(f)
	}
}

// publishQuiet stores quietUntil (Mux.quietUntil) from the Writer's
// state: only in Async (in Sync every eager record is due at once, and
// the gather counts the streams' Polls), with no IO in flight (unless
// the device continues the log after each completion:
// SetDeviceContinues) or waiting to be submitted, and no failure, when
// the Writer's next deadline is later than its clock (while an IO is in
// flight it is Never: the completion's Continue publishes again). Writer.Poll before
// that deadline would then do nothing (its cases are the deadline's:
// NextDeadline), and so would the rest of Mux.poll: the streams' synced
// marks move only with completions, and a drop is planned from marks
// that DropBefore changes (it publishes 0: the next Poll plans).
func (m *Mux) publishQuiet() {
	q := int64(0)
	w := m.w
	if w.cfg.Mode == Async && (w.phase == pIdle || m.devContinues || m.knobs.muxQuietInFlight) && w.failErr == nil && len(w.queued) == 0 {
		if d := w.NextDeadline(); d > w.now {
			q = int64(d)
		}
	}
	if m.knobs.muxQuietAlways {
		q = int64(Never)
	}
	if m.quietUntil.Load() != q {
		m.quietUntil.Store(q)
	}
}

// SetDeviceContinues tells the Mux that its device calls Continue after
// every completion of an IO that is not Quiet (the shared log's device
// does): the streams' Polls may then skip the mutex while an IO is in
// flight too (Mux.quietUntil), since that completion's Continue reaps it
// and republishes. Call it once the device calls Continue: an Async log
// polls first, reaping what completed before (whose Continue may have
// been missed), so that nothing in flight now can complete unseen.
func (m *Mux) SetDeviceContinues() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.devContinues = true
	if m.w.cfg.Mode == Async { // Sync never skips (publishQuiet)
		m.poll(m.now)
	}
}

// catchUpClock takes the latest time a Stream's Poll skipped at for the
// Writer's clock (locked methods that append or poll call it first).
func (m *Mux) catchUpClock() {
	if m.w.cfg.Mode != Async {
		return // quietUntil is 0 in Sync: no Stream Poll skips
	}
	for _, s := range m.streams {
		if n := time.Duration(s.skipNow.Load()); n > m.now {
			m.now = n
			m.w.now = max(m.w.now, n)
		}
	}
}

// Skipped is how many Stream Polls returned without the mutex
// (quietUntil; any goroutine).
func (m *Mux) Skipped() uint64 {
	m.mu.Lock()
	streams := m.streams
	m.mu.Unlock()
	n := uint64(0)
	for _, s := range streams {
		n += s.skips.Load()
	}
	return n
}

func (m *Mux) publishStream(s *Stream) {
	o := time.Duration(-1)
	if s.head < len(s.pend) {
		o = s.pend[s.head].at
	}
	p := &s.pub
	if int64(o) != p.oldest.Load() {
		p.oldest.Store(int64(o))
	}
	if p.synced.Load() != s.synced {
		p.synced.Store(s.synced)
	}
	if p.next.Load() != s.next {
		p.next.Store(s.next)
	}
	if p.bytes.Load() != s.bytes {
		p.bytes.Store(s.bytes)
	}
}

// GatherStats is the log's Writer.GatherStats (any goroutine).
func (m *Mux) GatherStats() (held, timedOut uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w.GatherStats()
}

// ID is the stream's id.
func (s *Stream) ID() uint32 { return s.id }

// Append is Writer.Append for the stream: seq is its stream seq.
func (s *Stream) Append(typ RecType, parts ...[]byte) (seq uint64, ok bool) {
	return s.append(typ, 0, false, parts)
}

// AppendFlags is Writer.AppendFlags for the stream.
func (s *Stream) AppendFlags(typ RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool) {
	return s.append(typ, flags, false, parts)
}

// AppendLazy is Writer.AppendLazy for the stream.
func (s *Stream) AppendLazy(typ RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool) {
	return s.append(typ, flags, true, parts)
}

func (s *Stream) append(typ RecType, flags uint8, lazy bool, parts [][]byte) (uint64, bool) {
	if typ == RecBatch || typ == recMarker || typ == RecMux {
		return 0, false
	}
	m := s.m
	// A Sync batch opened at an idle log prepares the device (after the
	// mutex: the wake is a system call): its Submit comes later in this
	// pass or, held by the gather, after the group's other streams wrote.
	prep := false
	defer func() {
		if prep {
			m.prep.Prepare()
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.catchUpClock()
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	putMuxHdr(m.hdr[:], s.id, typ, flags, s.next)
	var h, target uint64
	isRef := false
	if n >= muxRefMin {
		h = hashParts(parts)
		target, isRef = m.findRef(h, n, parts)
	}
	if isRef {
		// the payload is a record's of the open batch: a reference
		m.hdr[6] = muxRefFlag
		putMuxRef(m.refBuf[:], target, n, h)
		m.parts = append(m.parts[:0], m.hdr[:], m.refBuf[:])
	} else {
		m.parts = append(append(m.parts[:0], m.hdr[:]), parts...)
	}
	var g uint64
	var ok bool
	if lazy {
		g, ok = m.w.AppendLazy(RecMux, 0, m.parts...)
	} else {
		g, ok = m.w.AppendFlags(RecMux, 0, m.parts...)
	}
	clear(m.parts)
	if !ok {
		return 0, false
	}
	if !m.knobs.muxQuietStaleAppend {
		m.publishQuiet() // a first record opens the batch: its interval starts
	}
	switch {
	case isRef:
		m.ref.refs++
		m.ref.saved += uint64(recSize(muxHdrSize+n) - recSize(muxHdrSize+muxRefSize))
	case n >= muxRefMin:
		m.noteRef(h, n, g)
	}
	if !lazy {
		opens := m.gather.batch != m.w.openFirst
		m.noteEager(s)
		prep = m.prep != nil && (opens && (m.w.cur == nil || m.knobs.prepareWhileBusy) || m.knobs.prepareEveryRecord)
	}
	seq := s.next
	s.next++
	s.records++
	s.appended += uint64(recSize(muxHdrSize + n))
	s.pend = append(s.pend, muxPend{g: g, s: seq, at: m.w.now, bytes: s.appended})
	if !m.knobs.muxStalePub {
		m.publishStream(s)
		m.publishLog()
	}
	return seq, true
}

// Poll polls the Mux (any stream's poller may); it reports whether the
// log moved or the stream's Synced did since its last Poll.
func (s *Stream) Poll(now time.Duration) bool {
	m := s.m
	if q := m.quietUntil.Load(); q != 0 && int64(now) < q && s.pub.synced.Load() == s.polledSynced.Load() {
		// Nothing to do before q (publishQuiet): no completion can
		// come, nothing is due. Keep the clock for the next append.
		if int64(now) > s.skipNow.Load() {
			s.skipNow.Store(int64(now))
		}
		s.skips.Add(1)
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gatherPolled(s)
	p := m.poll(now)
	if s.synced != s.polledSynced.Load() {
		s.polledSynced.Store(s.synced)
		p = true
	}
	return p
}

// Synced is the stream seq up to which every record of the stream is on
// disk.
func (s *Stream) Synced() uint64 { return s.pub.synced.Load() }

// NextSeq is the stream seq its next record gets.
func (s *Stream) NextSeq() uint64 { return s.pub.next.Load() }

// DropBefore lets the Mux drop the segments whose records of this stream
// all have stream seqs below seq, once every other stream lets it too.
func (s *Stream) DropBefore(seq uint64) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.mark = max(s.mark, seq)
	s.m.quietUntil.Store(0) // the next Poll plans the drop
}

// OldestUnsynced is when (the Poll clock) the stream's oldest record not
// yet synced was appended, or -1.
func (s *Stream) OldestUnsynced() time.Duration { return time.Duration(s.pub.oldest.Load()) }

// Err is the log's (shared by every stream: a failed sync stops them all).
func (s *Stream) Err() error {
	if !s.m.pubErr.Load() {
		return nil
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.m.w.Err()
}

// Full is the log's Writer.Full.
func (s *Stream) Full() bool { return s.m.pubFull.Load() }

// Flush flushes the log (every stream's records).
func (s *Stream) Flush() { s.m.Flush() }

// CheckSpace is the log's Writer.CheckSpace.
func (s *Stream) CheckSpace() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.w.CheckSpace()
	s.m.publishQuiet()
}

// Space is the log's last free-space answer.
func (s *Stream) Space() Space { s.m.mu.Lock(); defer s.m.mu.Unlock(); return s.m.w.Space() }

// SpaceLow is the log's Writer.SpaceLow.
func (s *Stream) SpaceLow(sp Space) bool { return s.m.w.SpaceLow(sp) }

// NextDeadline is the log's Writer.NextDeadline.
func (s *Stream) NextDeadline() time.Duration {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.w.hold = s.m.gatherWanted()
	return s.m.w.NextDeadline()
}

// BytesWritten is the bytes of the stream's records synced.
func (s *Stream) BytesWritten() uint64 { return s.pub.bytes.Load() }

// Stats are the log's, but Records, BytesWritten and UnsyncedBytes are
// the stream's.
func (s *Stream) Stats() Stats {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	st := s.m.w.Stats()
	st.Records, st.BytesWritten, st.UnsyncedBytes = s.records, s.bytes, int64(s.appended-s.bytes)
	return st
}

// UnsyncedBytes is the log's bytes appended and not yet synced (every
// stream's: the queue is shared, and the Writer refuses records once it
// passes twice MaxUnsyncedBytes).
func (s *Stream) UnsyncedBytes() int64 { return s.m.pubUnsynced.Load() }

// MaxUnsyncedBytes is the log's Writer.MaxUnsyncedBytes.
func (s *Stream) MaxUnsyncedBytes() int64 { return s.m.w.MaxUnsyncedBytes() }

// Idle reports that every record of the stream is synced (other streams'
// may not be).
func (s *Stream) Idle() bool {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.head == len(s.pend)
}

// Stats are the log's Writer.Stats (every stream's records, batches and
// fsyncs), read under the Mux's lock (any goroutine).
func (m *Mux) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w.Stats()
}

// Idle reports that every record of every stream is synced and nothing
// is in flight.
func (m *Mux) Idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w.Idle()
}

// Flush is the log's Writer.Flush.
func (m *Mux) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.catchUpClock()
	m.w.Flush()
	if !m.knobs.muxQuietKeepsFlush {
		m.publishQuiet()
	}
}
