package wal

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// zeroRun writes batches through a Sync Writer with Config.ZeroAhead
// over several segments, a power cut (DropUnsynced) after each batch's
// sync, and reads the log back. noSpace: every zero-ahead write (the
// only writes of 8 KiB or more here) fails with ENOSPC. It returns the
// properties that failed and the Writer's stats.
func zeroRun(t *testing.T, knobs testingKnobs, noSpace bool) ([]string, Stats) {
	mem := vfs.NewMem()
	var fsys vfs.FS = mem
	if noSpace {
		fsys = errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
			if op.Kind == errorfs.OpWrite && op.Len >= 8192 {
				return syscall.ENOSPC
			}
			return nil
		}))
	}
	rng := rand.New(rand.NewPCG(5, 5))
	d := newTestDevice(fsys)
	w := mustOpen(t, d, mustRecover(t, fsys), Config{Mode: Sync, ZeroAhead: 16 << 10})
	w.knobs = knobs
	wr := written{}
	var failed []string
	for range 150 {
		appendN(t, w, rng, wr, 3, 300)
		// a zero-ahead write never goes before a due batch
		w.Poll(0)
		if len(d.queue) == 0 || d.queue[0].Kind != IOWrite && d.queue[0].Kind != IOCreate || d.queue[0].Len > 0 {
			failed = append(failed, fmt.Sprintf("due batch: first IO %v", kinds(d.queue)))
			break
		}
		if !slices.ContainsFunc(d.queue, func(op IO) bool { return op.Kind == IOCreate }) && d.queue[0].Off != w.segOff {
			failed = append(failed, fmt.Sprintf("due batch: written at %d, the tail is %d", d.queue[0].Off, w.segOff))
			break
		}
		drain(t, w, d, 0)
		if err := w.Err(); err != nil {
			failed = append(failed, fmt.Sprintf("Err: %v", err))
			break
		}
	}
	s, rec := wr.syncedLost(t, mem, w.Synced())
	if s != 0 {
		failed = append(failed, fmt.Sprintf("recovered: seq %d <= Synced %d is not on the disk", s, w.Synced()))
	}
	if len(rec.Corrupt) > 0 {
		failed = append(failed, fmt.Sprintf("recovered: corruption %+v", rec.Corrupt))
	}
	return failed, w.Stats()
}

// TestZeroAhead: zeros written after the tail (Config.ZeroAhead) reach
// every segment, never go before a due batch, and leave every synced
// record readable.
func TestZeroAhead(t *testing.T) {
	f, st := zeroRun(t, testingKnobs{}, false)
	if len(f) > 0 {
		t.Fatalf("%q", f)
	}
	if st.Segments < 2 || st.ZeroWrites < uint64(2*st.Segments) || st.ZeroErrors != 0 {
		t.Fatalf("%d segments, %d zero-ahead writes (%d B), %d errors: want two or more per segment, no error", st.Segments, st.ZeroWrites, st.ZeroBytes, st.ZeroErrors)
	}
	t.Logf("%d segments, %d zero-ahead writes, %d B", st.Segments, st.ZeroWrites, st.ZeroBytes)
}

// The planted zeroAlignDown (zeros from the tail's page start) must be
// caught by the read-back.
func TestZeroAheadCatchesAlignDown(t *testing.T) {
	f, _ := zeroRun(t, testingKnobs{zeroAlignDown: true}, false)
	if !slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "recovered:") }) {
		t.Fatalf("zeroAlignDown not caught by the read-back: %q", f)
	}
	t.Logf("zeroAlignDown caught: %q", f)
}

// A zero-ahead write that finds no space is no disk-full: the log keeps
// writing (nothing refused, Err nil), that segment's zeroing stops, and
// every synced record reads back.
func TestZeroAheadNoSpace(t *testing.T) {
	f, st := zeroRun(t, testingKnobs{}, true)
	if len(f) > 0 {
		t.Fatalf("%q", f)
	}
	if st.ZeroErrors == 0 || st.ZeroWrites != 0 || st.DiskFull != 0 {
		t.Fatalf("zero-ahead writes %d, errors %d, disk full %d: want 0, some, 0", st.ZeroWrites, st.ZeroErrors, st.DiskFull)
	}
}
