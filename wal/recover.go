package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/rdmakv/rdmakv/internal/prefault"
	"github.com/rdmakv/rdmakv/internal/vfs"
)

// ErrCorrupt is wrapped by Recover's errors about a log it cannot read
// (a missing segment, another member's segment).
var ErrCorrupt = errors.New("wal: corrupt log")

// Corruption is a place where records were lost to corruption: the
// invalid record at At and every record up to the next valid batch.
type Corruption struct {
	At      Pos
	Path    string
	FromSeq uint64 // first seq lost
	ToSeq   uint64 // last seq lost (ToSeq < FromSeq: none, junk between records)
	Reason  string
}

// Recovered is what Recover read back.
type Recovered struct {
	// Records in seq order (Batch records left out). A seq missing from
	// the sequence lies in a Corrupt range.
	Records []Record
	// NextSeq is the seq the Writer continues with.
	NextSeq uint64
	// TornAt is where a torn tail was cut (nil if none); TornRecords how
	// many records of the torn batch were cut (-1: unknown, its Batch
	// record was torn).
	TornAt      *Pos
	TornRecords int
	// Corrupt lists the corruption found: never cut, for the caller to
	// repair.
	Corrupt []Corruption
	// DroppedDiff is how many records of a DiffBegin without its DiffEnd
	// at the end of the log were cut (with the DiffBegin).
	DroppedDiff int
	// Segments are the live segments, for Open.
	Segments []SegInfo
	// Warnings are the lines to log (torn tail, unfinished rotation).
	Warnings []string

	// batches: the first seqs of the batches read, in order (a Mux's
	// references name a record of their own batch).
	batches []uint64
}

type rseg struct {
	info    SegInfo
	f       vfs.File
	base    int64  // the file offset of data[0]
	data    []byte // the chunk of the file the scan is in
	hdr     segHeader
	hdrErr  error
	entered bool // the scan reached it (its header was checked)
}

// readChunk is the least Recover reads of a segment at a time.
const readChunk = 4 << 20

// zeroProbe is how many zero bytes after the last valid record of a
// segment Recover reads before it calls them the preallocated tail and
// stops (it reads no further: a 64 MiB segment holding a few records
// costs a few records and zeroProbe to recover). It is twice the Writer's
// default MaxUnsyncedBytes, the largest batch unless one record is bigger
// (and a batch whose Batch record survived is probed to its end): the
// bytes of a batch torn by a crash lie within it, so a torn tail is still
// found and cut. A run of zeros longer than zeroProbe in the middle of
// the log (a lost write) is taken for the end of the segment.
const zeroProbe = 8 << 20

// window makes data hold the file's bytes [from, end) (fewer at the end
// of the file). A new chunk starts at from and holds at least readChunk
// bytes; the records parsed from the old chunk keep it, so no byte is
// read twice and only a record cut by a chunk's end is copied.
func (s *rseg) window(from, end int64) error {
	end = max(min(end, s.info.Size), from)
	if from >= s.base && end <= s.base+int64(len(s.data)) {
		return nil
	}
	n := max(0, min(s.info.Size-from, max(end-from, readChunk)))
	buf := make([]byte, n)
	// Its pages mapped at once, not one fault a page in the read (issue
	// 19: a restart reads hundreds of megabytes of log).
	prefault.Populate(buf)
	have := int64(0)
	if from >= s.base && from < s.base+int64(len(s.data)) {
		have = int64(copy(buf, s.data[from-s.base:]))
	}
	got, err := s.f.ReadAt(buf[have:], from+have)
	if err == io.EOF {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("wal: reading %s: %w", s.info.Path, err)
	}
	if int64(got) < n-have {
		// the file is shorter than its Stat said
		s.info.Size = from + have + int64(got)
	}
	s.base, s.data = from, buf[:have+int64(got)]
	return nil
}

// at returns the loaded bytes from off (window must cover off).
func (s *rseg) at(off int64) []byte { return s.data[min(off-s.base, int64(len(s.data))):] }

// loadAll makes data hold the whole file (base 0): for the rare paths
// (corruption, a torn tail, an unfinished rotation) that look at all of it.
func (s *rseg) loadAll() error {
	if s.base == 0 && int64(len(s.data)) == s.info.Size {
		return nil
	}
	s.base, s.data = 0, nil
	return s.window(0, s.info.Size)
}

// Recover reads the log in dir (creating dir if needed): it checks every
// segment, returns the valid records in seq order, cuts a torn tail back
// (keeping the cut bytes in "<segment>.torn-<seq>"), drops a diff that was
// never finished, and reports corruption without cutting it. member must
// match the segments' headers. It runs before the Writer is opened.
//
// It reads what it checks: each segment in chunks up to its last record
// and zeroProbe bytes of zeros after it, not the rest of the preallocated
// file (a 64 MiB segment holding a few records costs a few records and
// the probe); only corruption or a torn tail makes it read the later
// segments whole.
func Recover(fsys vfs.FS, dir string, member uint64) (*Recovered, error) {
	return recoverLog(fsys, dir, member, testingKnobs{})
}

func recoverLog(fsys vfs.FS, dir string, member uint64, knobs testingKnobs) (*Recovered, error) {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var segs []*rseg
	defer func() {
		for _, s := range segs {
			s.f.Close()
		}
	}()
	for _, e := range ents {
		seq, ok := parseSegName(e.Name())
		if !ok || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			return nil, err
		}
		s := &rseg{info: SegInfo{Seq: seq, Path: path, End: segHdrSize}, f: f}
		segs = append(segs, s)
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		s.info.Size = st.Size()
		if err := s.window(0, segHdrSize); err != nil {
			return nil, err
		}
		s.hdr, s.hdrErr = parseSegHeader(s.data)
		if s.hdrErr == nil && s.hdr.segseq != seq {
			s.hdrErr = fmt.Errorf("header names segment %d", s.hdr.segseq)
		}
		if s.hdrErr == nil && s.hdr.member != member {
			return nil, fmt.Errorf("%w: %s belongs to member %d, not %d", ErrCorrupt, path, s.hdr.member, member)
		}
		s.info.FirstSeq = s.hdr.firstSeq
	}
	slices.SortFunc(segs, func(a, b *rseg) int { return int(int64(a.info.Seq) - int64(b.info.Seq)) })
	for i := 1; i < len(segs); i++ {
		if segs[i].info.Seq != segs[i-1].info.Seq+1 {
			return nil, fmt.Errorf("%w: missing segment %d (between %s and %s)", ErrCorrupt, segs[i-1].info.Seq+1,
				filepath.Base(segs[i-1].info.Path), filepath.Base(segs[i].info.Path))
		}
	}
	rec := &Recovered{NextSeq: 1}
	// An unfinished rotation: the last segment's header never made it.
	if n := len(segs); n > 0 && segs[n-1].hdrErr != nil {
		if err := segs[n-1].loadAll(); err != nil {
			return nil, err
		}
	}
	if n := len(segs); n > 0 && segs[n-1].hdrErr != nil && allZero(segs[n-1].data[min(segHdrSize, len(segs[n-1].data)):]) {
		s := segs[n-1]
		s.f.Close()
		if err := fsys.Remove(s.info.Path); err != nil {
			return nil, err
		}
		if err := fsys.SyncDir(dir); err != nil {
			return nil, err
		}
		rec.Warnings = append(rec.Warnings, fmt.Sprintf("wal: removed %s: an unfinished rotation (%v, no data)", filepath.Base(s.info.Path), s.hdrErr))
		segs = segs[:n-1]
	}
	if len(segs) == 0 {
		return rec, nil
	}
	sc := scanner{fsys: fsys, dir: dir, segs: segs, rec: rec, knobs: knobs}
	if segs[0].hdrErr == nil {
		sc.expected = segs[0].hdr.firstSeq
	}
	if err := sc.scan(); err != nil {
		return nil, err
	}
	if err := sc.dropUnfinishedDiff(); err != nil {
		return nil, err
	}
	rec.NextSeq = max(sc.expected, 1)
	// What was read may be only in the page cache (a process crash, not
	// a power cut): make it durable before anyone acts on it.
	for _, s := range sc.segs {
		rec.Segments = append(rec.Segments, s.info)
		if knobs.noRecoverSync {
			continue
		}
		if err := syncFile(fsys, s.info.Path); err != nil {
			return nil, err
		}
	}
	if knobs.noRecoverSync {
		return rec, nil
	}
	if err := fsys.SyncDir(dir); err != nil {
		return nil, err
	}
	return rec, nil
}

type scanner struct {
	fsys     vfs.FS
	dir      string
	segs     []*rseg
	rec      *Recovered
	knobs    testingKnobs
	expected uint64 // seq of the next valid record (0 before the first if unknown)
	batch    BatchInfo
	inBatch  bool
	batchAt  Pos // where the Batch record of batch is

	resumeSeg int
	resumeOff int64
}

func (sc *scanner) scan() error {
	si, off := 0, int64(segHdrSize)
	for si < len(sc.segs) {
		s := sc.segs[si]
		if !s.entered {
			s.entered = true
			if s.hdrErr != nil {
				sc.rec.Corrupt = append(sc.rec.Corrupt, Corruption{At: Pos{Seg: s.info.Seq}, Path: s.info.Path,
					FromSeq: 1, ToSeq: 0, Reason: "segment header: " + s.hdrErr.Error()})
			}
			if si > 0 && s.hdrErr == nil && s.hdr.firstSeq != sc.expected {
				// records between the segments are missing
				if done, err := sc.invalid(si, off, fmt.Sprintf("segment starts at seq %d, want %d", s.hdr.firstSeq, sc.expected)); done || err != nil {
					return err
				}
				si, off = sc.resumeSeg, sc.resumeOff
				continue
			}
		}
		end, err := sc.cleanEnd(si, off)
		if err != nil {
			return err
		}
		if end {
			// the clean end of this segment's data
			si, off = si+1, segHdrSize
			continue
		}
		r, sz, ok := parseRecord(s.at(off))
		reason := "checksum or length mismatch"
		if ok && sc.expected != 0 && r.Seq != sc.expected {
			ok, reason = false, fmt.Sprintf("seq %d, want %d", r.Seq, sc.expected)
		}
		var bi BatchInfo
		if ok && r.Type == RecBatch {
			if bi, ok = parseBatchInfo(r.Data); !ok || bi.First != r.Seq {
				ok, reason = false, "bad batch record"
			}
		}
		if !ok {
			if done, err := sc.invalid(si, off, reason); done || err != nil {
				return err
			}
			si, off = sc.resumeSeg, sc.resumeOff
			continue
		}
		r.Pos = Pos{Seg: s.info.Seq, Off: off}
		if r.Type == RecBatch {
			sc.batch, sc.inBatch, sc.batchAt = bi, true, r.Pos
			sc.rec.batches = append(sc.rec.batches, r.Seq)
		} else {
			sc.rec.Records = append(sc.rec.Records, r)
		}
		sc.expected = r.Seq + 1
		off += int64(sz)
		s.info.End = off
	}
	return nil
}

// cleanEnd reports whether (si, off) is the clean end of segment si's
// data: the end of the file, or only zeros after it. It reads what the
// record at off needs and, where that starts with a zero header, probes
// zeroProbe bytes (or to the end of the batch being read, if that is
// farther) rather than the whole preallocated tail.
func (sc *scanner) cleanEnd(si int, off int64) (bool, error) {
	s := sc.segs[si]
	if err := s.window(off, off+recHdrSize); err != nil {
		return false, err
	}
	hdr := s.at(off)
	if len(hdr) == 0 {
		return true, nil
	}
	hdr = hdr[:min(recHdrSize, len(hdr))]
	if !allZero(hdr) {
		// a record: read it all (with its padding) for parseRecord
		if len(hdr) == recHdrSize {
			if n := binary.LittleEndian.Uint32(hdr[16:]); n <= MaxRecord {
				return false, s.window(off, off+int64(recSize(int(n))))
			}
		}
		return false, nil
	}
	if sc.knobs.noZeroProbe {
		return true, nil
	}
	probe := off + zeroProbe
	if sc.inBatch && sc.batchAt.Seg == s.info.Seq && sc.batch.First+uint64(sc.batch.Count) > sc.expected {
		// inside a batch that is not complete: a torn batch's bytes
		// may be anywhere up to its end
		probe = max(probe, sc.batchAt.Off+int64(sc.batch.Bytes))
	}
	if err := s.window(off, probe); err != nil {
		return false, err
	}
	b := s.at(off)
	return allZero(b[:min(probe-off, int64(len(b)))]), nil
}

// invalid handles the invalid record at (si, off): corruption if a valid
// batch follows (scanning resumes there: resumeSeg, resumeOff), else a
// torn tail, cut back (done).
func (sc *scanner) invalid(si int, off int64, reason string) (done bool, err error) {
	fsi, foff, fseq, found, err := sc.nextBatch(si, off)
	if err != nil {
		return true, err
	}
	s := sc.segs[si]
	if found && !sc.knobs.cutCorrupt {
		sc.rec.Corrupt = append(sc.rec.Corrupt, Corruption{At: Pos{Seg: s.info.Seq, Off: off}, Path: s.info.Path,
			FromSeq: sc.expected, ToSeq: fseq - 1, Reason: reason})
		sc.rec.Warnings = append(sc.rec.Warnings, fmt.Sprintf("wal: corrupt record at %s+%d (%s): seqs %d..%d lost, a valid batch follows at %s+%d",
			filepath.Base(s.info.Path), off, reason, sc.expected, int64(fseq)-1, filepath.Base(sc.segs[fsi].info.Path), foff))
		sc.resumeSeg, sc.resumeOff = fsi, foff
		sc.expected = fseq
		return false, nil
	}
	cut := -1
	if sc.inBatch && sc.batch.First+uint64(sc.batch.Count) > sc.expected {
		cut = int(sc.batch.First + uint64(sc.batch.Count) - sc.expected)
	}
	sc.rec.TornRecords = cut
	if err := sc.cut(si, off); err != nil {
		return true, err
	}
	what := "an unfinished batch"
	if cut >= 0 {
		what = fmt.Sprintf("%d records", cut)
	}
	sc.rec.Warnings = append(sc.rec.Warnings, fmt.Sprintf("wal: torn tail at %s+%d (seq %d, %s): cut back %s",
		filepath.Base(s.info.Path), off, sc.expected, reason, what))
	sc.rec.TornAt = &Pos{Seg: s.info.Seq, Off: off}
	return true, nil
}

// nextBatch looks for a valid Batch record with a seq not below expected
// at or after (si, off), 8-byte aligned, in this segment and the later
// ones.
func (sc *scanner) nextBatch(si int, off int64) (int, int64, uint64, bool, error) {
	for ; si < len(sc.segs); si, off = si+1, segHdrSize {
		if err := sc.segs[si].loadAll(); err != nil {
			return 0, 0, 0, false, err
		}
		d := sc.segs[si].data
		for q := off; q+batchRecSize <= int64(len(d)); q += 8 {
			if d[q+4] != byte(RecBatch) {
				continue
			}
			r, _, ok := parseRecord(d[q:])
			if !ok || r.Type != RecBatch || r.Seq < sc.expected {
				continue
			}
			if bi, ok := parseBatchInfo(r.Data); ok && bi.First == r.Seq {
				return si, q, r.Seq, true, nil
			}
		}
	}
	return 0, 0, 0, false, nil
}

// cut makes (si, off) the end of the log: the bytes from there, and the
// later segments, are kept aside as "<segment>.torn-<seq>" and the
// segment is cut and zeroed (a segment left with no record is set aside
// whole, unless it is the first).
func (sc *scanner) cut(si int, off int64) error {
	s := sc.segs[si]
	if err := s.loadAll(); err != nil {
		return err
	}
	aside := func(p string) string { return fmt.Sprintf("%s.torn-%d", p, sc.expected) }
	for _, later := range sc.segs[si+1:] {
		if err := sc.fsys.Rename(later.info.Path, aside(later.info.Path)); err != nil {
			return err
		}
	}
	sc.segs = sc.segs[:si+1]
	if off == segHdrSize && si > 0 {
		if err := sc.fsys.Rename(s.info.Path, aside(s.info.Path)); err != nil {
			return err
		}
		sc.segs = sc.segs[:si]
		return sc.fsys.SyncDir(sc.dir)
	}
	tail := s.data[min(off, int64(len(s.data))):]
	for len(tail) > 0 && tail[len(tail)-1] == 0 {
		tail = tail[:len(tail)-1]
	}
	if len(tail) > 0 {
		if err := vfs.WriteFile(sc.fsys, aside(s.info.Path), tail); err != nil {
			return err
		}
	}
	f, err := sc.fsys.OpenFile(s.info.Path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(off)
	if err == nil && s.info.Size > off {
		err = f.Allocate(off, s.info.Size-off)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	clear(s.data[off:])
	s.info.End = off
	return sc.fsys.SyncDir(sc.dir)
}

func syncFile(fsys vfs.FS, path string) error {
	f, err := fsys.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// dropUnfinishedDiff cuts a DiffBegin with no DiffEnd after it, and what
// follows it: the diff was never accepted.
func (sc *scanner) dropUnfinishedDiff() error {
	recs := sc.rec.Records
	i := len(recs) - 1
	for ; i >= 0; i-- {
		if recs[i].Type == RecDiffEnd {
			return nil
		}
		if recs[i].Type == RecDiffBegin {
			break
		}
	}
	if i < 0 {
		return nil
	}
	at := recs[i].Pos
	si := slices.IndexFunc(sc.segs, func(s *rseg) bool { return s.info.Seq == at.Seg })
	if si < 0 {
		return fmt.Errorf("wal: internal: segment %d of a record not found", at.Seg)
	}
	sc.expected = recs[i].Seq
	if err := sc.cut(si, at.Off); err != nil {
		return err
	}
	sc.rec.DroppedDiff = len(recs) - i
	sc.rec.Records = recs[:i]
	sc.rec.Warnings = append(sc.rec.Warnings, fmt.Sprintf("wal: dropped an unfinished diff at %s+%d (seq %d, %d records)",
		filepath.Base(sc.segs[len(sc.segs)-1].info.Path), at.Off, recs[i].Seq, len(recs)-i))
	return nil
}
