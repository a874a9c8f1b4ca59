package wal

import (
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// pollUntil polls w, parking on kick, until cond holds.
func pollUntil(t testing.TB, w *Writer, kick chan struct{}, now func() time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if w.Err() != nil {
			t.Fatalf("writer: %v", w.Err())
		}
		if time.Now().After(deadline) {
			t.Fatal("no progress in a minute")
		}
		if !w.Poll(now()) {
			select {
			case <-kick:
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// The production device on real files: records appended from the poller,
// synced by the device's goroutine, read back by Recover (run with -race).
func TestFileDeviceOS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	rng := rand.New(rand.NewPCG(21, 21))
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	wr := written{}
	for round := range 2 {
		rec, err := Recover(vfs.OS, dir, 7)
		if err != nil {
			t.Fatal(err)
		}
		wr.check(t, rec)
		if len(rec.Records) != len(wr) {
			t.Fatalf("round %d: recovered %d of %d", round, len(rec.Records), len(wr))
		}
		kick := make(chan struct{}, 1)
		dev := NewFileDevice(vfs.OS, func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		})
		w, err := Open(dev, Config{Dir: dir, Member: 7, Mode: Async, FsyncInterval: time.Millisecond, SegmentBytes: 1 << 16}, rec)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			w.Poll(now())
			appendN(t, w, rng, wr, 1+rng.IntN(5), 2000)
		}
		w.Flush()
		pollUntil(t, w, kick, now, w.Idle)
		if w.Synced() != w.NextSeq()-1 || w.Stats().Segments < 2 {
			t.Fatalf("synced %d next %d segments %d", w.Synced(), w.NextSeq(), w.Stats().Segments)
		}
		if err := dev.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Async: a batch starts when its oldest record is FsyncInterval old, or
// when MaxUnsyncedBytes are queued; not before.
func TestAsyncInterval(t *testing.T) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Async, FsyncInterval: 10 * time.Millisecond, MaxUnsyncedBytes: 8192})
	ms := time.Millisecond
	w.Poll(1 * ms)
	w.Append(RecEntry, []byte("a"))
	if got := w.OldestUnsynced(); got != 1*ms {
		t.Fatalf("OldestUnsynced %v, want 1ms", got)
	}
	if got := w.NextDeadline(); got != 11*ms {
		t.Fatalf("NextDeadline %v, want 11ms", got)
	}
	w.Poll(10 * ms)
	if len(d.queue) != 0 {
		t.Fatalf("a batch started at 10ms: %v", kinds(d.queue))
	}
	w.Poll(11 * ms)
	if len(d.queue) != 1 {
		t.Fatalf("no batch started at 11ms")
	}
	drain(t, w, d, 11*ms)
	if w.OldestUnsynced() != -1 || w.Synced() != 2 {
		t.Fatalf("OldestUnsynced %v synced %d", w.OldestUnsynced(), w.Synced())
	}
	// Size: 8 KiB queued starts a batch at once.
	w.Poll(20 * ms)
	for w.unsynced() < 8192 {
		w.Append(RecEntry, make([]byte, 1000))
	}
	if w.NextDeadline() != 20*ms {
		t.Fatalf("NextDeadline %v with MaxUnsyncedBytes queued", w.NextDeadline())
	}
	// Twice MaxUnsyncedBytes: Append refuses.
	for w.unsynced() < 16384-1100 {
		w.Append(RecEntry, make([]byte, 1000))
	}
	if _, ok := w.Append(RecEntry, make([]byte, 2000)); ok {
		t.Fatal("append beyond 2x MaxUnsyncedBytes accepted")
	}
	drain(t, w, d, 20*ms)
	if _, ok := w.Append(RecEntry, make([]byte, 2000)); !ok {
		t.Fatal("append refused after the sync")
	}
}

// TestFileDeviceOneKickPerBatch: a batch's write and sync go to the
// device together and wake the poller once, when the sync is done (the
// write is Quiet), not once per IO.
func TestFileDeviceOneKickPerBatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	rec, err := Recover(vfs.OS, dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	var kicks atomic.Int64
	kick := make(chan struct{}, 1)
	dev := NewFileDevice(vfs.OS, func() {
		kicks.Add(1)
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	defer dev.Close()
	w, err := Open(dev, Config{Dir: dir, Member: 7, Mode: Sync, SegmentBytes: 1 << 20}, rec)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	put := func() {
		seq, ok := w.Append(RecEntry, []byte("a record"))
		if !ok {
			t.Fatal(w.Err())
		}
		pollUntil(t, w, kick, now, func() bool { return w.Synced() >= seq })
	}
	put() // creates the segment
	const n = 20
	k0, b0 := kicks.Load(), w.Stats().Batches
	for range n {
		put()
	}
	if b := w.Stats().Batches - b0; b != n {
		t.Fatalf("%d batches for %d records appended one at a time", b, n)
	}
	if k := kicks.Load() - k0; k != n {
		t.Fatalf("%d kicks for %d batches, want one per batch", k, n)
	}
}
