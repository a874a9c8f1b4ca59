package wal

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// spaceAnswer asks w for free space and polls it until the answer came.
func spaceAnswer(t *testing.T, w *Writer, d *testDevice) Space {
	t.Helper()
	n := w.Space().N
	w.CheckSpace()
	for i := 0; w.Space().N == n; i++ {
		if i > 100 {
			t.Fatal("no free-space answer")
		}
		w.Poll(0)
		d.runAll()
	}
	return w.Space()
}

// TestCheckSpace: a free-space query (IOStatFS) goes to the device and
// comes back with a later Poll: the errorfs Space injector's bytes left
// (low below Config.LowSpaceBytes, not above), 0 when the injector says
// ENOSPC (a full disk), an error (low: the caller probes) when the file
// system cannot answer; it writes nothing and syncs nothing (no record,
// no fsync), and a query asked while a batch is due waits for it.
func TestCheckSpace(t *testing.T) {
	mem := vfs.NewMem()
	space := errorfs.ENOSPCAfter(1 << 40)
	full := false
	fs := errorfs.Wrap(mem, errorfs.Any(errorfs.Func(func(op errorfs.Op) error {
		if full && op.Kind == errorfs.OpStatFS {
			return syscall.ENOSPC
		}
		return nil
	}), space))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096, MaxUnsyncedBytes: 1 << 20})
	if got, want := w.LowSpaceBytes(), int64(2*4096+2<<20); got != want {
		t.Fatalf("LowSpaceBytes %d, want %d (two segments and twice the queue)", got, want)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	appendN(t, w, rng, written{}, 3, 100)
	w.CheckSpace() // with a batch due: the batch goes first
	drain(t, w, d, 0)
	w.Poll(0)
	d.runAll()
	w.Poll(0)
	if n := len(d.ran); n < 2 || d.ran[n-1].Kind != IOStatFS || d.ran[n-2].Kind != IOSync || w.Space().N != 1 {
		t.Fatalf("IOs %v, answers %d: want the batch's sync, then one statfs", d.ran, w.Space().N)
	}
	sp := spaceAnswer(t, w, d)
	if sp.Err == nil || sp.N != 2 || !w.SpaceLow(sp) {
		t.Fatalf("answer %+v over Any (not a Space): want an error (no free-space query below), N 2, low", sp)
	}

	// Directly over a Space injector: its bytes left.
	fs = errorfs.Wrap(mem, space)
	d = newTestDevice(fs)
	w = mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096, MaxUnsyncedBytes: 1 << 20})
	fsyncs, synced := w.Stats().Fsyncs, w.Synced()
	sp = spaceAnswer(t, w, d)
	if sp.Err != nil || sp.Free != space.Left() || sp.Free < 1<<39 || w.SpaceLow(sp) {
		t.Fatalf("answer %+v: want the injector's %d free, not low", sp, space.Left())
	}
	if w.Stats().Fsyncs != fsyncs || w.Synced() != synced || w.Stats().SpaceChecks != 1 {
		t.Fatalf("a free-space query wrote or synced: %+v", w.Stats())
	}
	for _, op := range d.ran {
		if op.Kind != IOStatFS {
			t.Fatalf("the query ran %v", op.Kind)
		}
	}
	space.MaybeError(errorfs.Op{Kind: errorfs.OpAllocate, Len: space.Left() - w.LowSpaceBytes() + 1})
	if sp = spaceAnswer(t, w, d); sp.Err != nil || sp.Free != w.LowSpaceBytes()-1 || !w.SpaceLow(sp) {
		t.Fatalf("answer %+v: want %d free, low", sp, w.LowSpaceBytes()-1)
	}

	// A full disk reports 0 free.
	full = true
	fs = errorfs.Wrap(vfs.OS, errorfs.Func(func(op errorfs.Op) error {
		if full && op.Kind == errorfs.OpStatFS {
			return syscall.ENOSPC
		}
		return nil
	}))
	dir := t.TempDir()
	d = newTestDevice(fs)
	w, err := Open(d, Config{Dir: dir, Member: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sp = spaceAnswer(t, w, d); sp.Err != nil || sp.Free != 0 || !w.SpaceLow(sp) {
		t.Fatalf("armed ENOSPC: answer %+v, want 0 free, low", sp)
	}
	full = false
	if sp = spaceAnswer(t, w, d); sp.Err != nil || sp.Free <= 0 {
		t.Fatalf("the OS's statfs of %s: %+v, want some space", dir, sp)
	}
	if sp.N != 2 {
		t.Fatalf("N %d after two answers", sp.N)
	}
	// A directory that is not there: an error, low.
	w.cfg.Dir = filepath.Join(dir, "gone")
	if sp = spaceAnswer(t, w, d); !errors.Is(sp.Err, os.ErrNotExist) || !w.SpaceLow(sp) || w.Err() != nil {
		t.Fatalf("statfs of a missing dir: %+v (writer %v), want ENOENT, low, the writer unharmed", sp, w.Err())
	}
}
