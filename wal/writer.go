package wal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/internal/hist"
)

var (
	// ErrFailStop: a sync failed. The kernel may have dropped the unsynced
	// pages and cleared the error (PostgreSQL's "fsyncgate"), so nothing
	// written since the last good sync can be trusted and retrying is
	// unsafe: the Writer stops for good, Synced never moves again, and
	// the replica must exit. Err wraps it with the cause.
	ErrFailStop = errors.New("wal: fail-stop")
	// ErrDiskFull: a write or preallocation found no space. Nothing was
	// lost and the files are consistent (a half-written batch is cut
	// back); Append refuses until a retry succeeds (Config.DiskFullRetry).
	ErrDiskFull = errors.New("wal: disk full")
)

// Mode is when records count as synced enough.
type Mode uint8

const (
	// Async: a batch is written and fsynced when its oldest record is
	// FsyncInterval old or MaxUnsyncedBytes are queued.
	Async Mode = iota
	// Sync: a batch starts as soon as the previous one is synced (group
	// commit): records wait for one fsync at most plus the one in flight.
	// A batch of lazy records only (AppendLazy) waits as in Async. In a
	// Mux, a batch may first wait Config.GatherWindow for a second
	// stream's record.
	Sync
)

// Config of a Writer.
type Config struct {
	Dir              string        // the segments' directory
	Mode             Mode          // Async or Sync
	FsyncInterval    time.Duration // Async: the longest a record waits before its batch starts (default 10ms)
	SegmentBytes     int64         // a segment's preallocated size (default 64 MiB)
	MaxUnsyncedBytes int64         // a batch starts once this much is queued; Append refuses beyond 2x (default 4 MiB)
	Member           uint64        // written in every segment header, checked by Recover
	DiskFullRetry    time.Duration // after ErrDiskFull, the batch is tried again this long after (default 100ms)
	// LowSpaceBytes: a free-space answer (CheckSpace) below this is low
	// (SpaceLow): the next writes may find the disk full. Default: two
	// segments' preallocation plus twice MaxUnsyncedBytes (the most the
	// Writer queues), 136 MiB with the other defaults.
	LowSpaceBytes int64
	// GatherWindow (Sync mode, a Mux's log only; 0: off): a batch whose
	// first eager record was appended while no batch was in flight may
	// wait for the other streams of its records' groups (Mux.noteEager,
	// gather.go: until each appended or was polled through one whole Poll without), at
	// most this long from the first Poll that would have started it. At
	// one writer the leader's record would otherwise start a batch alone
	// and its followers' records, a Poll later, would wait for that
	// batch's fsync and then their own: two fsyncs in series per commit
	// instead of one.
	GatherWindow time.Duration
	// ZeroAhead: the bytes after the last segment's tail that the Writer
	// keeps written with zeros and synced (0: off; the servers' logs use
	// DefaultZeroAhead). A segment is preallocated (fallocate), and on ext4 and XFS the
	// first write into a preallocated block converts its extent to
	// written: a metadata change that each batch's fdatasync then
	// commits through the journal (kvbench disk: append+fdatasync about
	// twice written+fdatasync). Zeros written ahead of the tail, in
	// chunks of at most ZeroChunk at Polls that find the Writer with nothing to
	// write (never in front of a due batch, never while a Sync batch is
	// open; a batch that comes meanwhile waits for one chunk's write and
	// sync), make the batches' blocks written ones. Recovery reads the
	// same bytes either way (zeros), so the format does not change.
	ZeroAhead int64
}

const (
	// DefaultZeroAhead is the servers' Config.ZeroAhead.
	DefaultZeroAhead = 1 << 20
	// ZeroChunk is the most one zero-ahead write covers: the longest a
	// batch can wait behind one is this write and its sync.
	ZeroChunk = 256 << 10
)

// zeros is the zero-ahead writes' data (never written to).
var zeros = make([]byte, ZeroChunk)

func (c *Config) defaults() {
	if c.FsyncInterval <= 0 {
		c.FsyncInterval = 10 * time.Millisecond
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	c.SegmentBytes = max(c.SegmentBytes, 4096)
	if c.MaxUnsyncedBytes <= 0 {
		c.MaxUnsyncedBytes = 4 << 20
	}
	if c.DiskFullRetry <= 0 {
		c.DiskFullRetry = 100 * time.Millisecond
	}
	if c.LowSpaceBytes <= 0 {
		c.LowSpaceBytes = 2*c.SegmentBytes + 2*c.MaxUnsyncedBytes
	}
}

// Stats are the Writer's counters.
type Stats struct {
	Records       uint64    // records appended (Batch records excluded)
	Batches       uint64    // batches synced
	BytesWritten  uint64    // bytes of batches synced
	Segments      int       // live segment files
	SegmentBytes  int64     // their preallocated sizes, summed
	Fsyncs        uint64    // fsyncs completed (batches and new segments)
	FsyncLatency  hist.Hist // from submitting an fsync (a batch's: and its write) to the Poll that reaped it
	UnsyncedBytes int64     // bytes appended and not yet synced
	DiskFull      uint64    // batches that found no space
	ShortWrites   uint64    // batches rewritten after a short write
	RemoveErrors  uint64    // segments DropBefore could not remove
	SpaceChecks   uint64    // free-space queries answered (CheckSpace)
	ZeroWrites    uint64    // zero-ahead chunks written and synced (Config.ZeroAhead)
	ZeroBytes     uint64    // their bytes
	ZeroErrors    uint64    // zero-ahead writes that failed (the segment's zeroing stops; nothing else changes)
}

// Never is NextDeadline's "no deadline".
const Never = time.Duration(math.MaxInt64)

type phase uint8

const (
	pIdle phase = iota
	pCreate
	pAlloc
	pHdr
	pHdrSync
	pDirSync
	pAbortRemove
	pAbortDirSync
	pWrite
	pWriteFailed // the write failed; waiting for the sync submitted with it
	pSync
	pTrunc
	pRealloc
	pDropRemove
	pDropDirSync
	pSpace    // a free-space query (CheckSpace)
	pZero     // a zero-ahead write (Config.ZeroAhead), its sync right behind it
	pZeroSync // its sync
)

type batch struct {
	buf         []byte
	first, last uint64
	since       time.Duration
	// placement, decided when its job starts
	rotate bool
	seg    SegInfo // the segment it goes to (a new one if rotate)
	off    int64
	// what went wrong so far
	short   int
	noSpace bool
}

// Writer appends records and makes them durable in batches, one batch in
// flight. It is not safe for concurrent use: one poller calls everything.
type Writer struct {
	dev   Device
	cfg   Config
	knobs testingKnobs

	now     time.Duration
	failErr error // sticky
	fullErr error // while the disk is full
	retryAt time.Duration

	nextSeq      uint64
	synced       uint64
	lastBatchEnd uint64

	open      []byte // the open batch; its first batchRecSize bytes are the Batch record
	openFirst uint64
	openCount uint32
	openSince time.Duration
	openEager bool // a record other than AppendLazy's is open (Sync: the batch is due)
	flush     bool
	// The gather (Config.GatherWindow): hold is the owner's (the Mux's)
	// word, set before every Poll and NextDeadline, that the open batch
	// may wait for another stream; holding: a Poll found it due and held
	// it, from holdFrom on.
	hold     bool
	holding  bool
	holdFrom time.Duration
	// noHoldStart: this Poll may not start a hold's window (Mux.Continue,
	// polled from the device's goroutine, leaves a batch the gather
	// would hold to the streams' Polls).
	noHoldStart bool
	gathers     uint64 // batches a hold delayed
	gatherTO    uint64 // of them, those the window ended (no other stream came)

	cur   *batch // sealed: being written, or waiting for space
	spare []byte // the previous sealed batch's buffer, reused

	segs   []SegInfo // live segments, the last one written
	segCap int64     // the last segment's size (writes beyond grow it)
	segOff int64     // where the next batch goes in the last segment
	// zeroTo: the last segment's bytes below it are written (records or
	// zero-ahead) and synced; zeroEnd: where the zero-ahead write in
	// flight ends. The zero-ahead covers [max(zeroTo, segOff), segCap).
	zeroTo  int64
	zeroEnd int64

	phase    phase
	op       IO // the IO of the current phase
	syncOp   IO // pWrite: the batch's sync, submitted right behind its write
	writeErr error
	queued   []IO // submitted IOs the device has not accepted yet, in order
	tag      uint64
	submitAt time.Duration
	dropTo   uint64
	drops    []SegInfo
	doneBuf  []Done
	doneFree int64 // the Free of the completion being handled

	spaceWant bool  // CheckSpace: a query is to be issued
	space     Space // the last answer

	stats Stats
}

// Open returns a Writer that continues the recovered log rec (nil: an
// empty log; Config.Dir must exist).
func Open(dev Device, cfg Config, rec *Recovered) (*Writer, error) {
	cfg.defaults()
	w := &Writer{dev: dev, cfg: cfg, nextSeq: 1}
	if rec != nil {
		w.nextSeq = max(rec.NextSeq, 1)
		w.segs = append(w.segs, rec.Segments...)
		if n := len(w.segs); n > 0 {
			last := w.segs[n-1]
			if last.FirstSeq > w.nextSeq {
				return nil, fmt.Errorf("wal: last segment %s starts at seq %d, after the recovered end %d", last.Path, last.FirstSeq, w.nextSeq)
			}
			w.segOff = max(last.End, segHdrSize)
			w.segCap = max(last.Size, w.segOff)
			w.zeroTo = w.segOff
		}
	}
	w.synced = w.nextSeq - 1
	w.lastBatchEnd = w.nextSeq - 1
	for _, s := range w.segs {
		w.stats.SegmentBytes += s.Size
	}
	return w, nil
}

// Append copies a record of type typ whose payload is parts, concatenated,
// into the open batch and returns its seq. ok is false (nothing appended)
// while Err is not nil, and when the unsynced bytes would pass twice
// MaxUnsyncedBytes (the caller holds the record and retries after a Poll).
func (w *Writer) Append(typ RecType, parts ...[]byte) (seq uint64, ok bool) {
	return w.AppendFlags(typ, 0, parts...)
}

// AppendFlags is Append with the record's flags byte.
func (w *Writer) AppendFlags(typ RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool) {
	seq, ok = w.appendRec(typ, flags, parts)
	if ok {
		w.openEager = true
	}
	return seq, ok
}

// AppendLazy is AppendFlags for a record that need not reach the disk
// soon by itself (a hint, such as a commit point that recovery may also
// find lower): in Sync mode it does not make the open batch due; it goes
// with the next record appended otherwise, or FsyncInterval after the
// batch opened, or at Flush. In Async mode it is AppendFlags.
func (w *Writer) AppendLazy(typ RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool) {
	return w.appendRec(typ, flags, parts)
}

func (w *Writer) appendRec(typ RecType, flags uint8, parts [][]byte) (seq uint64, ok bool) {
	if w.failErr != nil || w.fullErr != nil || typ == RecBatch {
		return 0, false
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxRecord {
		return 0, false
	}
	sz := recSize(n)
	if len(w.open) > 0 && w.unsynced()+int64(sz) > 2*w.cfg.MaxUnsyncedBytes {
		return 0, false
	}
	if len(w.open) == 0 {
		if cap(w.open) < batchRecSize {
			w.open = make([]byte, 0, 64<<10)
		}
		w.open = w.open[:batchRecSize]
		w.openFirst = w.nextSeq
		w.nextSeq++
		w.openCount = 1
		w.openSince = w.now
		w.openEager = false
	}
	off := len(w.open)
	w.open = grow(w.open, sz)
	seq = w.nextSeq
	w.nextSeq++
	putRecord(w.open[off:], typ, flags, seq, parts...)
	w.openCount++
	w.stats.Records++
	return seq, true
}

func grow(b []byte, n int) []byte {
	if len(b)+n > cap(b) {
		nb := make([]byte, len(b), max(2*cap(b), len(b)+n))
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

func (w *Writer) unsynced() int64 {
	n := int64(len(w.open))
	if w.cur != nil {
		n += int64(len(w.cur.buf))
	}
	return n
}

// UnsyncedBytes is how many bytes are appended and not yet synced (the
// open batch and the one in flight): Stats().UnsyncedBytes, cheaply.
func (w *Writer) UnsyncedBytes() int64 { return w.unsynced() }

// MaxUnsyncedBytes is the Config's (after defaults): a batch starts once
// this much is queued, and Append refuses beyond twice it.
func (w *Writer) MaxUnsyncedBytes() int64 { return w.cfg.MaxUnsyncedBytes }

// Synced is the seq up to which every record is on disk.
func (w *Writer) Synced() uint64 { return w.synced }

// NextSeq is the seq the next appended record gets (a Batch record may
// take it first).
func (w *Writer) NextSeq() uint64 { return w.nextSeq }

// OldestUnsynced is the time (the Poll clock) at which the oldest record
// not yet synced was appended, or -1 if every record is synced. For the
// async back-pressure rule.
func (w *Writer) OldestUnsynced() time.Duration {
	switch {
	case w.cur != nil:
		return w.cur.since
	case len(w.open) > 0:
		return w.openSince
	}
	return -1
}

// Err is nil while the log works; ErrFailStop (wrapping the cause) for
// good after a failed sync or an unexpected error; ErrDiskFull while the
// disk has no space.
func (w *Writer) Err() error {
	if w.failErr != nil {
		return w.failErr
	}
	return w.fullErr
}

// Full reports that the disk was found full (Err is ErrDiskFull): Append
// refuses every record until a retry of the batch waiting for space
// succeeds (Config.DiskFullRetry). Nothing is lost meanwhile: what was
// appended before stays queued, in order, and is written by the retry.
func (w *Writer) Full() bool { return w.failErr == nil && w.fullErr != nil }

// Flush makes the next Polls write and sync everything appended so far
// without waiting for FsyncInterval (a clean stop). Idle reports when
// they did.
func (w *Writer) Flush() { w.flush = true }

// Idle reports that every appended record is synced and nothing is in
// flight.
func (w *Writer) Idle() bool {
	return w.cur == nil && len(w.open) == 0 && w.phase == pIdle
}

// DropBefore removes, in the background, the whole segments whose records
// all have seqs below seq (never the segment being written).
func (w *Writer) DropBefore(seq uint64) { w.dropTo = max(w.dropTo, seq) }

// Space is a free-space answer (CheckSpace).
type Space struct {
	N    uint64        // answers so far, this one included (0: none yet)
	At   time.Duration // the Poll clock when it arrived
	Free int64         // bytes an unprivileged writer can still allocate in Config.Dir's file system
	Err  error         // the query failed, or the file system cannot answer (vfs.ErrNoSpaceQuery)
}

// CheckSpace asks the device how much space the log's directory has left
// (IOStatFS: statfs on the device's goroutine, never on the poller; no
// disk IO). It goes out at a Poll with no batch due or in flight, and a
// later Poll has the answer (Space: N grows). Asking again before the
// answer arrived asks once.
func (w *Writer) CheckSpace() { w.spaceWant = true }

// Space is the last answer to CheckSpace.
func (w *Writer) Space() Space { return w.space }

// SpaceLow reports whether the answer s leaves the next writes at risk of
// finding the disk full: below Config.LowSpaceBytes, or no answer (the
// query failed, or the file system cannot say).
func (w *Writer) SpaceLow(s Space) bool { return s.Err != nil || s.Free < w.cfg.LowSpaceBytes }

// LowSpaceBytes is the Config's (after defaults).
func (w *Writer) LowSpaceBytes() int64 { return w.cfg.LowSpaceBytes }

// Stats returns the counters.
// BytesWritten is Stats().BytesWritten without copying Stats (its
// latency histogram is kilobytes): the replica reads it on every Poll.
func (w *Writer) BytesWritten() uint64 { return w.stats.BytesWritten }

func (w *Writer) Stats() Stats {
	s := w.stats
	s.Segments = len(w.segs)
	s.UnsyncedBytes = w.unsynced()
	return s
}

// NextDeadline is when the Writer next needs a Poll without a device
// completion: Never if nothing is due.
func (w *Writer) NextDeadline() time.Duration {
	switch {
	case w.failErr != nil:
		return Never
	case len(w.queued) > 0:
		return w.now
	case w.phase != pIdle:
		return Never
	case w.cur != nil:
		return w.retryAt
	case w.spaceWant:
		return w.now
	case len(w.open) > 0 && w.gatherOn() && w.holding:
		return min(w.holdFrom+w.cfg.GatherWindow, w.openSince+w.cfg.FsyncInterval)
	case len(w.open) > 0 && (w.cfg.Mode == Sync && w.openEager || w.flush || int64(len(w.open)) >= w.cfg.MaxUnsyncedBytes):
		return w.now
	case len(w.open) > 0:
		if w.dropDue() || w.zeroDue() {
			return w.now
		}
		return w.openSince + w.cfg.FsyncInterval
	case w.dropDue() || w.zeroDue():
		return w.now
	}
	return Never
}

// Segments returns the live segments, oldest first (a copy).
func (w *Writer) Segments() []SegInfo { return append([]SegInfo(nil), w.segs...) }

// DropPending: segments DropBefore covers are not all removed yet.
func (w *Writer) DropPending() bool {
	return w.dropDue() || w.phase == pDropRemove || w.phase == pDropDirSync
}

func (w *Writer) dropDue() bool {
	return len(w.segs) > 1 && w.segs[1].FirstSeq <= w.dropTo
}

// Poll reaps completions, moves the batch in flight along, and starts the
// next batch when it is due at now. It never blocks; it reports whether
// anything happened.
func (w *Writer) Poll(now time.Duration) bool {
	w.now = now
	progress := false
	w.doneBuf = w.dev.Reap(w.doneBuf[:0])
	for _, d := range w.doneBuf {
		if w.phase == pIdle || d.Tag != w.op.Tag {
			continue // a completion of an earlier Writer on the same device
		}
		progress = true
		w.doneFree = d.Free
		w.complete(d.Err)
	}
	if w.failErr != nil {
		return progress
	}
	if w.phase == pIdle {
		switch {
		case w.cur != nil:
			if now >= w.retryAt {
				w.startBatch()
				progress = true
			}
		case w.dropDue():
			// Before the next batch: under steady load (Sync seals a
			// batch at every idle Poll) a drop placed after it would
			// never run and the log would grow behind its snapshots.
			w.startDrop()
			progress = true
		case len(w.open) > 0 && (w.cfg.Mode == Sync && w.openEager && !w.held(now) || w.flush || now-w.openSince >= w.cfg.FsyncInterval ||
			int64(len(w.open)) >= w.cfg.MaxUnsyncedBytes):
			w.seal()
			w.startBatch()
			progress = true
		case w.spaceWant:
			w.spaceWant = false
			w.issue(pSpace)
			progress = true
		case w.zeroDue():
			w.issue(pZero)
			progress = true
		}
	}
	if len(w.queued) > 0 && w.flushQueue() {
		progress = true
	}
	return progress
}

// zeroDue: a zero-ahead chunk may go now (the Writer is idle and has no
// batch to write): the zeroed part after the tail has room for a whole
// chunk below ZeroAhead, or reaches the segment's end. Sync mode with a
// batch open never (it is due, or the gather holds it for a moment);
// Async with one open not yet due may (it waits for its interval
// anyway).
func (w *Writer) zeroDue() bool {
	if w.cfg.ZeroAhead <= 0 || len(w.segs) == 0 || w.cur != nil || w.fullErr != nil || w.flush ||
		len(w.open) > 0 && (w.cfg.Mode == Sync || int64(len(w.open)) >= w.cfg.MaxUnsyncedBytes) {
		return false
	}
	from := max(w.zeroTo, w.segOff)
	want := min(w.segCap, w.segOff+w.cfg.ZeroAhead)
	return from < w.segCap && (want-from >= w.zeroChunk() || want == w.segCap && from < want)
}

// zeroChunk is the size of a zero-ahead write: ZeroChunk, or ZeroAhead
// if less, in whole pages.
func (w *Writer) zeroChunk() int64 { return (min(ZeroChunk, w.cfg.ZeroAhead) + 4095) &^ 4095 }

// gatherOn: the open batch is one the gather may hold (Config.GatherWindow):
// Sync, due by an eager record, the owner says it may wait, and nothing
// else makes it due at once.
func (w *Writer) gatherOn() bool {
	return w.cfg.Mode == Sync && w.cfg.GatherWindow > 0 && w.hold && w.openEager && !w.flush &&
		int64(len(w.open)) < w.cfg.MaxUnsyncedBytes
}

// held reports that the gather holds the due open batch at now: the
// first Poll that finds it due starts the window.
func (w *Writer) held(now time.Duration) bool {
	if !w.gatherOn() {
		return false
	}
	if !w.holding {
		if w.noHoldStart {
			return true
		}
		w.holding, w.holdFrom = true, now
		w.gathers++
	}
	if w.knobs.gatherUnbounded {
		return true
	}
	if now-w.holdFrom >= w.cfg.GatherWindow {
		w.gatherTO++
		return false
	}
	return true
}

// GatherStats are the gather's counters (Config.GatherWindow): batches a
// Poll held, and how many of them the window's end released (no second
// stream's record came).
func (w *Writer) GatherStats() (held, timedOut uint64) { return w.gathers, w.gatherTO }

// seal closes the open batch: it becomes cur.
func (w *Writer) seal() {
	w.holding = false
	buf := w.open
	putBatch(buf, w.openFirst, w.openCount, w.lastBatchEnd)
	w.cur = &batch{buf: buf, first: w.openFirst, last: w.nextSeq - 1, since: w.openSince}
	w.open = w.spare[:0]
	w.spare = nil
	w.openEager = false
	if w.flush {
		w.flush = false
	}
}

func putBatch(buf []byte, first uint64, count uint32, prev uint64) {
	var p [batchPayload]byte
	putBatchInfo(p[:], BatchInfo{First: first, Count: count, Bytes: uint32(min(len(buf), math.MaxUint32)), PrevLast: prev})
	putRecord(buf[:batchRecSize], RecBatch, 0, first, p[:])
}

// startBatch decides where cur goes and issues its first IO.
func (w *Writer) startBatch() {
	b := w.cur
	b.noSpace = false
	n := int64(len(b.buf))
	if len(w.segs) == 0 || (w.segOff+n > w.segCap && w.segOff > segHdrSize) {
		next := uint32(1)
		if len(w.segs) > 0 {
			next = w.segs[len(w.segs)-1].Seq + 1
		}
		size := max(w.cfg.SegmentBytes, (segHdrSize+n+4095)&^4095)
		b.rotate = true
		b.seg = SegInfo{Seq: next, FirstSeq: b.first, Path: segPath(w.cfg.Dir, next), Size: size, End: segHdrSize}
		b.off = segHdrSize
		w.issue(pCreate)
		return
	}
	b.rotate = false
	b.seg = w.segs[len(w.segs)-1]
	b.off = w.segOff
	w.issue(pWrite)
}

func (w *Writer) startDrop() {
	w.drops = w.drops[:0]
	for len(w.segs) > 1 && w.segs[1].FirstSeq <= w.dropTo {
		w.drops = append(w.drops, w.segs[0])
		w.stats.SegmentBytes -= w.segs[0].Size
		w.segs = w.segs[1:]
	}
	w.issue(pDropRemove)
}

// submit hands op to the device, after the IOs it has not accepted yet.
func (w *Writer) submit(op IO) {
	w.queued = append(w.queued, op)
	w.flushQueue()
}

// flushQueue submits the queued IOs in order until the device refuses
// one; it reports whether it submitted any.
func (w *Writer) flushQueue() bool {
	k := 0
	for k < len(w.queued) && w.dev.Submit(w.queued[k]) {
		k++
	}
	n := copy(w.queued, w.queued[k:])
	clear(w.queued[n:])
	w.queued = w.queued[:n]
	return k > 0
}

// issue builds the IO of phase p and submits it. A batch's write goes
// with its sync right behind it (the device runs them in order): one
// wake-up of the poller per batch, not one per IO. The write is Quiet:
// the sync's completion, right after it, wakes the poller.
func (w *Writer) issue(p phase) {
	w.phase = p
	b := w.cur
	w.tag++
	op := IO{Tag: w.tag}
	switch p {
	case pCreate:
		op.Kind, op.Path = IOCreate, b.seg.Path
	case pAlloc:
		op.Kind, op.Path, op.Off, op.Len = IOAllocate, b.seg.Path, 0, b.seg.Size
	case pHdr:
		hdr := make([]byte, segHdrSize)
		putSegHeader(hdr, segHeader{member: w.cfg.Member, firstSeq: b.seg.FirstSeq, segseq: b.seg.Seq})
		op.Kind, op.Path, op.Data = IOWrite, b.seg.Path, hdr
	case pHdrSync, pSync:
		op.Kind, op.Path = IOSync, b.seg.Path
		w.submitAt = w.now
	case pDirSync, pAbortDirSync, pDropDirSync:
		op.Kind, op.Path = IOSyncDir, w.cfg.Dir
	case pAbortRemove:
		op.Kind, op.Path = IORemove, b.seg.Path
	case pWrite:
		op.Kind, op.Path, op.Off, op.Data, op.Quiet = IOWrite, b.seg.Path, b.off, b.buf, true
		w.tag++
		w.syncOp = IO{Tag: w.tag, Kind: IOSync, Path: b.seg.Path}
		w.submitAt = w.now
	case pTrunc:
		op.Kind, op.Path, op.Off = IOTruncate, b.seg.Path, b.off
	case pRealloc:
		op.Kind, op.Path, op.Off, op.Len = IOAllocate, b.seg.Path, b.off, b.seg.Size-b.off
	case pDropRemove:
		op.Kind, op.Path = IORemove, w.drops[0].Path
	case pSpace:
		op.Kind, op.Path = IOStatFS, w.cfg.Dir
	case pZero:
		seg := w.segs[len(w.segs)-1]
		from := max(w.zeroTo, w.segOff)
		if w.knobs.zeroAlignDown {
			from &^= 4095
		}
		// end on a page boundary, so that the next chunk starts on one
		w.zeroEnd = min(w.segCap, (from+w.zeroChunk())&^4095)
		op.Kind, op.Path, op.Off, op.Data, op.Quiet = IOWrite, seg.Path, from, zeros[:w.zeroEnd-from], true
		w.tag++
		w.syncOp = IO{Tag: w.tag, Kind: IOSync, Path: seg.Path}
	}
	w.op = op
	w.submit(op)
	if p == pWrite || p == pZero {
		w.submit(w.syncOp)
	}
}

func noSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) }

func (w *Writer) fail(what string, err error) {
	w.failErr = fmt.Errorf("%w: %s %s: %w", ErrFailStop, what, w.op.Path, err)
	w.phase = pIdle
}

// full ends the current batch job with ErrDiskFull (err is the cause
// when no lastErr set it); the batch is tried again later.
func (w *Writer) full(err error) {
	if w.fullErr == nil || !errors.Is(w.fullErr, ErrDiskFull) {
		w.fullErr = fmt.Errorf("%w: %s: %w", ErrDiskFull, filepath.Base(w.op.Path), err)
	}
	w.retryAt = w.now + w.cfg.DiskFullRetry
	w.stats.DiskFull++
	w.phase = pIdle
}

// complete handles the completion of the current IO.
func (w *Writer) complete(err error) {
	b := w.cur
	switch w.phase {
	case pCreate, pAlloc, pHdr:
		switch {
		case err == nil && w.phase == pCreate:
			w.issue(pAlloc)
		case err == nil && w.phase == pAlloc:
			w.issue(pHdr)
		case err == nil:
			w.issue(pHdrSync)
		case noSpace(err) || errors.Is(err, io.ErrShortWrite):
			b.noSpace = noSpace(err)
			if !b.noSpace {
				w.stats.ShortWrites++
			}
			w.lastErr(err)
			if w.knobs.keepFailedSegment {
				w.afterAbort()
				return
			}
			w.issue(pAbortRemove)
		default:
			w.fail("creating segment", err)
		}
	case pHdrSync:
		w.fsynced()
		if err != nil {
			w.fail("fsync of new segment", err)
			return
		}
		w.issue(pDirSync)
	case pDirSync:
		if err != nil {
			w.fail("fsync of directory", err)
			return
		}
		w.segs = append(w.segs, b.seg)
		w.stats.SegmentBytes += b.seg.Size
		w.segCap, w.segOff, w.zeroTo = b.seg.Size, segHdrSize, segHdrSize
		w.issue(pWrite)
	case pAbortRemove:
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.fail("removing unfinished segment", err)
			return
		}
		w.issue(pAbortDirSync)
	case pAbortDirSync:
		if err != nil {
			w.fail("fsync of directory", err)
			return
		}
		w.afterAbort()
	case pWrite:
		if w.knobs.ignoreShortWrite && errors.Is(err, io.ErrShortWrite) {
			err = nil
		}
		switch {
		case err == nil:
			w.phase, w.op = pSync, w.syncOp // submitted with the write
		case noSpace(err) || errors.Is(err, io.ErrShortWrite):
			// The batch may be half on the file: cut it back so that
			// no half record is ever followed by a new one, once the
			// sync submitted with the write is done.
			w.phase, w.op, w.writeErr = pWriteFailed, w.syncOp, err
		default:
			w.fail("writing batch", err)
		}
	case pWriteFailed:
		w.fsynced()
		if err != nil {
			// Fail-stop as for any failed sync: the kernel may have
			// dropped dirty pages of earlier writes too.
			w.fail("fsync", err)
			return
		}
		err = w.writeErr
		w.writeErr = nil
		b.noSpace = noSpace(err)
		if !b.noSpace {
			w.stats.ShortWrites++
		}
		w.lastErr(err)
		w.issue(pTrunc)
	case pTrunc:
		if err != nil {
			w.fail("cutting back a failed batch", err)
			return
		}
		// the blocks after the cut are preallocated again, unwritten
		w.zeroTo = min(w.zeroTo, b.off)
		if b.off < b.seg.Size {
			w.issue(pRealloc)
			return
		}
		w.afterAbort()
	case pRealloc:
		if err != nil && !noSpace(err) {
			w.fail("preallocating after a failed batch", err)
			return
		}
		if err != nil {
			b.noSpace = true
			w.lastErr(err)
		}
		w.afterAbort()
	case pSync:
		w.fsynced()
		if err != nil {
			if w.knobs.retrySync {
				w.issue(pSync)
				return
			}
			w.fail("fsync", err)
			return
		}
		w.synced = b.last
		w.lastBatchEnd = b.last
		w.segOff = b.off + int64(len(b.buf))
		if w.segOff > w.segCap {
			w.segCap = w.segOff
			w.segs[len(w.segs)-1].Size = w.segCap
		}
		w.segs[len(w.segs)-1].End = w.segOff
		w.stats.Batches++
		w.stats.BytesWritten += uint64(len(b.buf))
		w.spare = b.buf
		w.cur = nil
		w.fullErr = nil
		w.phase = pIdle
	case pDropRemove:
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.stats.RemoveErrors++
		}
		w.drops = w.drops[1:]
		if len(w.drops) > 0 {
			w.issue(pDropRemove)
			return
		}
		w.issue(pDropDirSync)
	case pDropDirSync:
		if err != nil {
			w.fail("fsync of directory", err)
			return
		}
		w.phase = pIdle
	case pZero:
		// Zeros after the tail: nothing recovery needs is in them, so a
		// failed write only stops this segment's zeroing (a later write
		// there finds the same error, or not). The sync submitted with
		// it runs anyway.
		w.phase, w.op, w.writeErr = pZeroSync, w.syncOp, err
	case pZeroSync:
		w.phase = pIdle
		if err != nil {
			// Fail-stop as for any failed sync: the kernel may have
			// dropped other dirty pages of the file with the error.
			w.fail("fsync", err)
			return
		}
		if w.writeErr != nil {
			w.writeErr = nil
			w.stats.ZeroErrors++
			w.zeroTo = w.segCap
			return
		}
		w.stats.ZeroWrites++
		w.stats.ZeroBytes += uint64(w.zeroEnd - max(w.zeroTo, w.segOff))
		w.zeroTo = w.zeroEnd
	case pSpace:
		// A failed query is an answer too (SpaceLow), never a log
		// failure: nothing was written.
		w.space = Space{N: w.space.N + 1, At: w.now, Free: w.doneFree, Err: err}
		w.stats.SpaceChecks++
		w.phase = pIdle
	}
}

// lastErr remembers the error that made the current batch start again.
func (w *Writer) lastErr(err error) {
	if noSpace(err) {
		w.fullErr = fmt.Errorf("%w: %s: %w", ErrDiskFull, filepath.Base(w.op.Path), err)
	}
}

// afterAbort: the files are consistent again after a failed write or
// rotation; wait for space, or write the batch again at once after a
// short write (at most 3 times in a row, then wait as for space).
func (w *Writer) afterAbort() {
	b := w.cur
	if b.noSpace {
		w.full(syscall.ENOSPC)
		return
	}
	b.short++
	if b.short > 3 {
		w.fullErr = fmt.Errorf("%w: %s: %d short writes in a row: %w", ErrDiskFull, filepath.Base(w.op.Path), b.short, io.ErrShortWrite)
		w.full(nil)
		b.short = 0
		return
	}
	w.phase = pIdle
	w.startBatch()
}

func (w *Writer) fsynced() {
	w.stats.Fsyncs++
	w.stats.FsyncLatency.Record(w.now - w.submitAt)
}
