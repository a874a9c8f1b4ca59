package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// snapshotFiles is every file of dir with its current bytes.
func snapshotFiles(t *testing.T, fs vfs.FS) map[string][]byte {
	t.Helper()
	ents, err := fs.ReadDir(testDir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range ents {
		b, err := vfs.ReadFile(fs, testDir+"/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = b
	}
	return m
}

func sameFiles(a, b map[string][]byte) error {
	for name, x := range a {
		y, ok := b[name]
		if !ok {
			return fmt.Errorf("%s gone", name)
		}
		if !bytes.Equal(x, y) {
			return fmt.Errorf("%s changed", name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			return fmt.Errorf("%s appeared", name)
		}
	}
	return nil
}

// diskFullRun: ENOSPC when the next segment is preallocated. It returns
// the properties that failed: ErrDiskFull, the files as they were, appends
// refused; once space returns the batch goes through.
func diskFullRun(t *testing.T, knobs testingKnobs) []string {
	mem := vfs.NewMem()
	var noSpace atomic.Bool
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		if noSpace.Load() && op.Kind == errorfs.OpAllocate {
			return syscall.ENOSPC
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(9, 9))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096})
	w.knobs = knobs
	wr := written{}
	for w.Stats().Segments < 1 || w.segOff < 3000 {
		appendN(t, w, rng, wr, 2, 200)
		drain(t, w, d, 0)
	}
	var failed []string
	fail := func(format string, args ...any) { failed = append(failed, fmt.Sprintf(format, args...)) }
	before := snapshotFiles(t, mem)
	synced := w.Synced()
	noSpace.Store(true)
	appendN(t, w, rng, wr, 8, 300) // does not fit: rotation
	drain(t, w, d, 0)
	if !errors.Is(w.Err(), ErrDiskFull) {
		fail("Err() = %v, want ErrDiskFull", w.Err())
	}
	if err := sameFiles(before, snapshotFiles(t, mem)); err != nil {
		fail("files changed: %v", err)
	}
	if _, ok := w.Append(RecEntry, []byte("x")); ok {
		fail("append accepted while the disk is full")
	}
	if w.Synced() != synced {
		fail("synced moved to %d while full", w.Synced())
	}
	// Still full at the retry: still refused, files unchanged.
	w.Poll(w.retryAt)
	d.runAll()
	drain(t, w, d, w.retryAt)
	if !errors.Is(w.Err(), ErrDiskFull) || w.Stats().DiskFull < 2 {
		fail("second try: Err() = %v, DiskFull %d", w.Err(), w.Stats().DiskFull)
	}
	if err := sameFiles(before, snapshotFiles(t, mem)); err != nil {
		fail("files changed at the second try: %v", err)
	}
	noSpace.Store(false)
	w.Poll(w.retryAt)
	d.runAll()
	drain(t, w, d, w.retryAt)
	if w.Err() != nil || w.Synced() != w.NextSeq()-1 {
		fail("after space returned: Err() = %v, synced %d next %d", w.Err(), w.Synced(), w.NextSeq())
		return failed
	}
	appendN(t, w, rng, wr, 3, 100)
	drain(t, w, d, w.retryAt)
	mem.DropUnsynced()
	rec := mustRecover(t, mem)
	wr.check(t, rec)
	if len(rec.Records) != len(wr) || len(rec.Segments) != 2 {
		fail("recovered %d of %d records, %d segments", len(rec.Records), len(wr), len(rec.Segments))
	}
	return failed
}

func TestDiskFullOnRotation(t *testing.T) {
	if f := diskFullRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("disk full: %q", f)
	}
}

// The planted bug keepFailedSegment is caught by "files changed".
func TestDiskFullCatchesKeepFailedSegment(t *testing.T) {
	f := diskFullRun(t, testingKnobs{keepFailedSegment: true})
	if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "files changed") }) {
		t.Fatalf("keepFailedSegment not caught: %q", f)
	}
	t.Logf("keepFailedSegment caught: %q", f)
}

// shortWriteRun: a short write of a batch. The batch must be cut back
// (Truncate) and written again from its start; no half record is ever
// followed by another write. It returns the properties that failed.
func shortWriteRun(t *testing.T, knobs testingKnobs) []string {
	mem := vfs.NewMem()
	fs := errorfs.Wrap(mem, errorfs.OnNth(errorfs.OpWrite, 4, errorfs.ShortWrite(100)))
	rng := rand.New(rand.NewPCG(11, 11))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync})
	w.knobs = knobs
	wr := written{}
	for range 6 {
		appendN(t, w, rng, wr, 4, 200)
		drain(t, w, d, 0)
	}
	var failed []string
	fail := func(format string, args ...any) { failed = append(failed, fmt.Sprintf(format, args...)) }
	if w.Err() != nil {
		fail("Err() = %v", w.Err())
	}
	// The IOs: the short write at off (and the sync submitted with it),
	// then Truncate(off), then the same batch written again at off.
	writes := 0
	for i, op := range d.ran {
		if op.Kind != IOWrite {
			continue
		}
		if writes++; writes != 4 {
			continue
		}
		rest := d.ran[i+1:]
		if len(rest) > 0 && rest[0].Kind == IOSync {
			rest = rest[1:]
		}
		if len(rest) < 2 || rest[0].Kind != IOTruncate || rest[0].Off != op.Off {
			fail("after the short write at %d: %v, want a Truncate to %d", op.Off, kinds(rest[:min(len(rest), 4)]), op.Off)
			break
		}
		j := slices.IndexFunc(rest, func(o IO) bool { return o.Kind == IOWrite || o.Kind == IOSync })
		if j < 0 || rest[j].Kind != IOWrite || rest[j].Off != op.Off || !bytes.Equal(rest[j].Data, op.Data) {
			fail("after the cut: %v, want the same batch written again at %d", kinds(rest), op.Off)
		}
	}
	mem.DropUnsynced()
	rec := mustRecover(t, mem)
	wr.check(t, rec)
	if len(rec.Records) != len(wr) || rec.TornAt != nil || len(rec.Corrupt) > 0 {
		fail("read back: %d of %d records (torn %v, corrupt %v)", len(rec.Records), len(wr), rec.TornAt, rec.Corrupt)
	}
	return failed
}

func TestShortWriteRewrites(t *testing.T) {
	if f := shortWriteRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("short write: %q", f)
	}
}

// The planted bug ignoreShortWrite is caught by the read-back.
func TestShortWriteCatchesIgnore(t *testing.T) {
	f := shortWriteRun(t, testingKnobs{ignoreShortWrite: true})
	if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "read back:") }) {
		t.Fatalf("ignoreShortWrite not caught by the read-back: %q", f)
	}
	t.Logf("ignoreShortWrite caught: %q", f)
}

func kinds(ops []IO) []string {
	var s []string
	for _, op := range ops {
		s = append(s, fmt.Sprintf("%v@%d", op.Kind, op.Off))
	}
	return s
}

// syncFailRun: the 3rd fsync fails with EIO after the "kernel" dropped
// the dirty pages (fsyncgate). It returns the properties that failed.
func syncFailRun(t *testing.T, knobs testingKnobs) []string {
	mem := vfs.NewMem()
	var syncs atomic.Int32
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpSync && syncs.Add(1) == 3 {
			mem.DropDirty(op.Path)
			return syscall.EIO
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(13, 13))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync})
	w.knobs = knobs
	wr := written{}
	var failed []string
	var before uint64
	for i := range 6 {
		if w.Err() == nil {
			before = w.Synced()
			appendN(t, w, rng, wr, 3, 300)
		} else if _, ok := w.Append(RecEntry, []byte("late")); ok {
			failed = append(failed, "append accepted after fail-stop")
		}
		drain(t, w, d, 0)
		if i == 1 && !errors.Is(w.Err(), ErrFailStop) {
			failed = append(failed, fmt.Sprintf("Err() = %v after a failed fsync, want ErrFailStop", w.Err()))
		}
	}
	if errors.Is(w.Err(), ErrFailStop) && w.Synced() != before {
		failed = append(failed, fmt.Sprintf("Synced moved from %d to %d after a failed fsync", before, w.Synced()))
	}
	// Read back what the disk holds.
	if s, _ := wr.syncedLost(t, mem, w.Synced()); s != 0 {
		failed = append(failed, fmt.Sprintf("read back: seq %d <= Synced %d is not on the disk", s, w.Synced()))
	}
	return failed
}

func TestSyncErrorFailStop(t *testing.T) {
	if f := syncFailRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("EIO on fsync: %q", f)
	}
}

// The planted bug retrySync (sync again after a failed fsync) must be
// caught by reading back after the dropped pages.
func TestSyncErrorCatchesRetrySync(t *testing.T) {
	f := syncFailRun(t, testingKnobs{retrySync: true})
	if !slices.ContainsFunc(f, func(s string) bool { return len(s) > 10 && s[:10] == "read back:" }) {
		t.Fatalf("retrySync not caught by the read-back check: %q", f)
	}
	t.Logf("retrySync caught: %q", f)
}

// corruptRun writes 10 synced batches, flips a byte of a record of the
// 3rd, recovers, and returns the properties that failed.
func corruptRun(t *testing.T, knobs testingKnobs) []string {
	mem := vfs.NewMem()
	rng := rand.New(rand.NewPCG(17, 17))
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync})
	wr := written{}
	var third []uint64
	for i := range 10 {
		first := w.NextSeq() + 1
		appendN(t, w, rng, wr, 4, 200)
		if i == 2 {
			third = []uint64{first, w.NextSeq() - 1}
		}
		drain(t, w, d, 0)
	}
	rec := mustRecover(t, mem.Clone())
	var at Record
	for _, r := range rec.Records {
		if r.Seq == third[0]+1 {
			at = r
		}
	}
	path := testDir + "/" + SegName(at.Pos.Seg)
	sizeBefore, _ := mem.Stat(path)
	if err := mem.Corrupt(path, at.Pos.Off+recHdrSize+3, 0x10); err != nil {
		t.Fatal(err)
	}
	rec, err := recoverLog(mem, testDir, 7, knobs)
	if err != nil {
		t.Fatal(err)
	}
	wr.check(t, rec)
	var failed []string
	got := seqs(rec)
	covered := func(s uint64) bool {
		return slices.ContainsFunc(rec.Corrupt, func(c Corruption) bool { return c.FromSeq <= s && s <= c.ToSeq })
	}
	for s := range wr {
		if !got[s] && !covered(s) {
			failed = append(failed, fmt.Sprintf("synced seq %d lost without a corruption report covering it", s))
			break
		}
	}
	if len(rec.Corrupt) == 0 || !covered(at.Seq) {
		failed = append(failed, fmt.Sprintf("corruption of seq %d not reported: %+v", at.Seq, rec.Corrupt))
	}
	if rec.TornAt != nil {
		failed = append(failed, fmt.Sprintf("corruption below a valid batch cut as torn at %+v", *rec.TornAt))
	}
	if st, _ := mem.Stat(path); st.Size() != sizeBefore.Size() || !got[w.NextSeq()-1] {
		failed = append(failed, "the log was cut")
	}
	return failed
}

func TestRecoverCorruptNotCut(t *testing.T) {
	if f := corruptRun(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("corruption below a valid batch: %q", f)
	}
}

// The planted bug cutCorrupt (corruption treated as a torn tail) is caught.
func TestRecoverCatchesCutCorrupt(t *testing.T) {
	f := corruptRun(t, testingKnobs{cutCorrupt: true})
	if !slices.ContainsFunc(f, func(s string) bool { return len(s) > 10 && s[:10] == "synced seq" }) {
		t.Fatalf("cutCorrupt not caught as a lost synced record: %q", f)
	}
	t.Logf("cutCorrupt caught: %q", f)
}

// TestShortWriteThenSyncError: a batch's write is short and the sync
// submitted with it fails: the writer fail-stops (as after any failed
// sync) instead of cutting the batch back and writing it again, and
// Synced does not move.
func TestShortWriteThenSyncError(t *testing.T) {
	mem := vfs.NewMem()
	var short atomic.Bool
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		switch {
		case !short.Load():
		case op.Kind == errorfs.OpWrite:
			return errorfs.ShortWrite(10)
		case op.Kind == errorfs.OpSync:
			return syscall.EIO
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(23, 23))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync})
	wr := written{}
	appendN(t, w, rng, wr, 3, 200)
	drain(t, w, d, 0)
	before := w.Synced()
	short.Store(true)
	appendN(t, w, rng, wr, 3, 200)
	drain(t, w, d, 0)
	if !errors.Is(w.Err(), ErrFailStop) || w.Synced() != before {
		t.Fatalf("Err() = %v, Synced %d (was %d): want ErrFailStop and no move", w.Err(), w.Synced(), before)
	}
	for _, op := range d.ran {
		if op.Kind == IOTruncate {
			t.Fatalf("the batch was cut back after its sync failed: %v", kinds(d.ran))
		}
	}
}
