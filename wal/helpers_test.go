package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// testDevice runs IOs only when the test says so, on the test's goroutine.
type testDevice struct {
	x     *Executor
	queue []IO
	done  []Done
	ran   []IO // every IO run, in order
}

func newTestDevice(fs vfs.FS) *testDevice { return &testDevice{x: NewExecutor(fs)} }

func (d *testDevice) Submit(op IO) bool { d.queue = append(d.queue, op); return true }

func (d *testDevice) Reap(dst []Done) []Done {
	dst = append(dst, d.done...)
	d.done = d.done[:0]
	return dst
}

// step runs the head IO; false if none is queued.
func (d *testDevice) step() bool {
	if len(d.queue) == 0 {
		return false
	}
	op := d.queue[0]
	d.queue = d.queue[1:]
	d.ran = append(d.ran, op)
	d.done = append(d.done, d.x.Run(op))
	return true
}

func (d *testDevice) runAll() {
	for d.step() {
	}
}

// drain polls w and runs its IOs until it is idle or failed.
func drain(t testing.TB, w *Writer, d *testDevice, now time.Duration) {
	t.Helper()
	for i := 0; w.phase != pIdle || len(w.queued) > 0 || (w.failErr == nil && !w.Idle() && (w.fullErr == nil || w.now >= w.retryAt)); i++ {
		if i > 1e6 {
			t.Fatalf("writer never idle")
		}
		w.Poll(now)
		d.runAll()
	}
	w.Poll(now)
}

// payload is a record's test payload: its seq and random bytes.
func payload(rng *rand.Rand, seq uint64, n int) []byte {
	b := make([]byte, max(n, 8))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	copy(b, fmt.Sprintf("%08x", seq&0xffffffff))
	return b
}

const testDir = "/d/wal"

func mustRecover(t testing.TB, fs vfs.FS) *Recovered {
	t.Helper()
	rec, err := Recover(fs, testDir, 7)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	return rec
}

func mustOpen(t testing.TB, d Device, rec *Recovered, cfg Config) *Writer {
	t.Helper()
	cfg.Dir, cfg.Member = testDir, 7
	if cfg.SegmentBytes == 0 {
		cfg.SegmentBytes = 1 << 16
	}
	w, err := Open(d, cfg, rec)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return w
}

// written is what a test appended: seq -> payload.
type written map[uint64][]byte

func (wr written) check(t testing.TB, rec *Recovered) {
	t.Helper()
	for _, r := range rec.Records {
		want, ok := wr[r.Seq]
		if !ok || !bytes.Equal(want, r.Data) || r.Type != RecEntry {
			t.Fatalf("recovered a record that was not written: seq %d type %d (%d bytes; written: %v)", r.Seq, r.Type, len(r.Data), ok)
		}
	}
}

// syncedLost drops what mem holds unsynced, recovers it and checks that
// every recovered record was written (wr.check), and returns the first
// record at or below synced that wr holds and the disk lost (0: none),
// with what it recovered.
func (wr written) syncedLost(t testing.TB, mem *vfs.Mem, synced uint64) (uint64, *Recovered) {
	t.Helper()
	mem.DropUnsynced()
	rec := mustRecover(t, mem)
	wr.check(t, rec)
	got := seqs(rec)
	for s := uint64(1); s <= synced; s++ {
		if _, ok := wr[s]; ok && !got[s] {
			return s, rec
		}
	}
	return 0, rec
}

// seqs of the recovered records.
func seqs(rec *Recovered) map[uint64]bool {
	m := map[uint64]bool{}
	for _, r := range rec.Records {
		m[r.Seq] = true
	}
	return m
}
