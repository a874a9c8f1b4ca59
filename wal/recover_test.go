package wal

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// A DiffBegin without its DiffEnd at the end of the log is cut with what
// follows it; a finished diff is kept.
func TestRecoverDropsUnfinishedDiff(t *testing.T) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync})
	app := func(typ RecType, s string) uint64 {
		seq, ok := w.Append(typ, []byte(s))
		if !ok {
			t.Fatal(w.Err())
		}
		return seq
	}
	app(RecEntry, "e1")
	app(RecDiffBegin, "d1")
	app(RecEntry, "d1e1")
	app(RecDiffEnd, "d1")
	drain(t, w, d, 0)
	app(RecEntry, "e2")
	begin := app(RecDiffBegin, "d2")
	app(RecEntry, "d2e1")
	drain(t, w, d, 0)
	app(RecEntry, "d2e2") // another batch, still no DiffEnd
	drain(t, w, d, 0)
	rec := mustRecover(t, mem)
	if rec.DroppedDiff != 3 || rec.NextSeq != begin || len(rec.Records) != 5 {
		t.Fatalf("dropped %d, next %d (DiffBegin at %d), %d records", rec.DroppedDiff, rec.NextSeq, begin, len(rec.Records))
	}
	if last := rec.Records[len(rec.Records)-1]; string(last.Data) != "e2" {
		t.Fatalf("last record %q", last.Data)
	}
	// The cut is on disk: the writer continues at the DiffBegin's seq and
	// the next recovery sees no trace of the dropped diff.
	d = newTestDevice(mem)
	w = mustOpen(t, d, rec, Config{Mode: Sync})
	app(RecEntry, "e3")
	drain(t, w, d, 0)
	mem.DropUnsynced()
	rec = mustRecover(t, mem)
	if rec.DroppedDiff != 0 || len(rec.Records) != 6 || string(rec.Records[5].Data) != "e3" || rec.TornAt != nil || len(rec.Corrupt) > 0 {
		t.Fatalf("after continuing: %d records, dropped %d, torn %v, corrupt %v", len(rec.Records), rec.DroppedDiff, rec.TornAt, rec.Corrupt)
	}
}

// A last segment with no valid header and no data is an unfinished
// rotation: removed. A gap in the segment numbers is an error.
func TestRecoverSegments(t *testing.T) {
	mem := vfs.NewMem()
	rng := rand.New(rand.NewPCG(23, 23))
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync, SegmentBytes: 4096})
	wr := written{}
	for w.Stats().Segments < 3 {
		appendN(t, w, rng, wr, 3, 500)
		drain(t, w, d, 0)
	}
	f, err := mem.OpenFile(testDir+"/"+SegName(4), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Allocate(0, 4096)
	f.Close()
	rec := mustRecover(t, mem)
	wr.check(t, rec)
	if len(rec.Segments) != 3 || len(rec.Records) != len(wr) || len(rec.Warnings) != 1 || !strings.Contains(rec.Warnings[0], "unfinished rotation") {
		t.Fatalf("%d segments, %d records, warnings %q", len(rec.Segments), len(rec.Records), rec.Warnings)
	}
	if _, err := mem.Stat(testDir + "/" + SegName(4)); err == nil {
		t.Fatal("the unfinished segment is still there")
	}
	if err := mem.Remove(testDir + "/" + SegName(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := Recover(mem, testDir, 7); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing segment 2") {
		t.Fatalf("recover with segment 2 gone: %v", err)
	}
	if _, err := Recover(mem, testDir, 8); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("recover as another member: %v", err)
	}
}

// recoverCounting recovers through a file layer that counts the bytes
// read.
func recoverCounting(t *testing.T, fs vfs.FS, knobs testingKnobs) (*Recovered, int64) {
	t.Helper()
	var read int64
	cfs := errorfs.Wrap(fs, errorfs.Func(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpRead {
			read += op.Len
		}
		return nil
	}))
	rec, err := recoverLog(cfs, testDir, 7, knobs)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	return rec, read
}

// Recover reads the written part of a preallocated segment and a bounded
// probe of zeros after it, not the whole preallocated tail: the bytes it
// reads do not depend on the segment size. A torn batch whose first page
// never reached the disk (zeros, then the rest of the batch) is still
// found by the probe and cut with its warning.
func TestRecoverReadsWrittenPart(t *testing.T) {
	if f := readsWrittenPart(t, testingKnobs{}); len(f) > 0 {
		t.Fatalf("%q", f)
	}
}

// The planted bug noZeroProbe (stop at the first zero header) is caught:
// the torn batch after a zero page stays in the log.
func TestRecoverReadsWrittenPartCatchesNoZeroProbe(t *testing.T) {
	f := readsWrittenPart(t, testingKnobs{noZeroProbe: true})
	if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "torn batch after a zero page not cut") }) {
		t.Fatalf("noZeroProbe not caught: %q", f)
	}
	t.Logf("noZeroProbe caught: %q", f)
}

func readsWrittenPart(t *testing.T, knobs testingKnobs) (failed []string) {
	var read [2]int64
	var end int64
	for i, segBytes := range []int64{16 << 20, 64 << 20} {
		mem := vfs.NewMem()
		rng := rand.New(rand.NewPCG(5, 5))
		d := newTestDevice(mem)
		w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync, SegmentBytes: segBytes})
		wr := written{}
		for range 4 { // few syncs: a Mem sync copies the whole file
			appendN(t, w, rng, wr, 50, 200)
			drain(t, w, d, 0)
		}
		rec, n := recoverCounting(t, mem, knobs)
		wr.check(t, rec)
		if len(rec.Records) != len(wr) || len(rec.Segments) != 1 || rec.Segments[0].Size != segBytes || rec.TornAt != nil {
			t.Fatalf("%d MiB segment: %d records of %d, segments %+v, torn %v", segBytes>>20, len(rec.Records), len(wr), rec.Segments, rec.TornAt)
		}
		read[i], end = n, rec.Segments[0].End
	}
	if read[0] != read[1] || read[1] > end+zeroProbe+readChunk {
		failed = append(failed, fmt.Sprintf("read %d bytes of a 16 MiB segment and %d of a 64 MiB one, holding %d bytes (want the same, at most %d)",
			read[0], read[1], end, end+zeroProbe+readChunk))
	}

	// A batch torn with its first page lost: zeros at the end of the log,
	// then the rest of the batch.
	mem := vfs.NewMem()
	rng := rand.New(rand.NewPCG(6, 6))
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync, SegmentBytes: 64 << 20})
	wr := written{}
	for range 3 {
		appendN(t, w, rng, wr, 20, 200)
		drain(t, w, d, 0)
	}
	end = mustRecover(t, mem.Clone()).Segments[0].End
	f, err := mem.OpenFile(testDir+"/"+SegName(1), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := payload(rng, 99, 3000)
	if _, err := f.WriteAt(junk, (end+4096)&^4095); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	rec, _ := recoverCounting(t, mem, knobs)
	wr.check(t, rec)
	if len(rec.Records) != len(wr) {
		failed = append(failed, fmt.Sprintf("%d records of %d after the torn batch", len(rec.Records), len(wr)))
	}
	if rec.TornAt == nil || rec.TornAt.Off != end || len(rec.Warnings) == 0 || !strings.Contains(rec.Warnings[0], "torn tail") {
		failed = append(failed, fmt.Sprintf("torn batch after a zero page not cut: torn at %v (end %d), warnings %q", rec.TornAt, end, rec.Warnings))
	}
	return failed
}
