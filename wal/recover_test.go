package wal

import (
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
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
