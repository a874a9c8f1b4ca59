package wal

import (
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// TestDiskFullOnCreate: the disk is full when the first segment is
// created (open with O_CREAT finds no space, no file is made: a full
// directory or no free inode). The writer cuts back (the removal of the
// segment it never made finds no file: not an error) and waits for space
// (ErrDiskFull, Full), never fail-stop; once space returns the records
// queued meanwhile go through and recover.
func TestDiskFullOnCreate(t *testing.T) {
	mem := vfs.NewMem()
	var noSpace atomic.Bool
	noSpace.Store(true)
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		if noSpace.Load() && op.Kind == errorfs.OpOpen {
			return syscall.ENOSPC
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(5, 5))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096})
	wr := written{}
	appendN(t, w, rng, wr, 3, 100)
	drain(t, w, d, 0)
	if !errors.Is(w.Err(), ErrDiskFull) || errors.Is(w.Err(), ErrFailStop) || !w.Full() {
		t.Fatalf("Err() = %v (Full %v), want ErrDiskFull and not fail-stop", w.Err(), w.Full())
	}
	if _, ok := w.Append(RecEntry, []byte("x")); ok {
		t.Fatal("append accepted while the disk is full")
	}
	noSpace.Store(false)
	w.Poll(w.retryAt)
	d.runAll()
	drain(t, w, d, w.retryAt)
	if w.Err() != nil || w.Full() || w.Synced() != w.NextSeq()-1 {
		t.Fatalf("after space returned: Err() = %v, synced %d next %d", w.Err(), w.Synced(), w.NextSeq())
	}
	mem.DropUnsynced()
	rec := mustRecover(t, mem)
	wr.check(t, rec)
	if len(rec.Records) != len(wr) {
		t.Fatalf("recovered %d of %d records", len(rec.Records), len(wr))
	}
}
