package wal

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

func appendN(t testing.TB, w *Writer, rng *rand.Rand, wr written, n, maxLen int) {
	t.Helper()
	for range n {
		seq := w.NextSeq()
		if len(w.open) == 0 {
			seq++ // the batch record takes the first seq
		}
		p := payload(rng, seq, rng.IntN(maxLen+1))
		got, ok := w.Append(RecEntry, p[:4], p[4:])
		if !ok || got != seq {
			t.Fatalf("append: seq %d ok %v, want seq %d (err %v)", got, ok, seq, w.Err())
		}
		wr[got] = p
	}
}

func TestRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	rng := rand.New(rand.NewPCG(1, 2))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync})
	wr := written{}
	for range 20 {
		appendN(t, w, rng, wr, 1+rng.IntN(10), 300)
		drain(t, w, d, 0)
	}
	if w.Err() != nil {
		t.Fatal(w.Err())
	}
	if w.Synced() != w.NextSeq()-1 {
		t.Fatalf("synced %d, next %d", w.Synced(), w.NextSeq())
	}
	c := fs.Clone()
	c.DropUnsynced()
	rec := mustRecover(t, c)
	wr.check(t, rec)
	if len(rec.Records) != len(wr) || rec.TornAt != nil || len(rec.Corrupt) != 0 {
		t.Fatalf("recovered %d records of %d (torn %v, corrupt %v)", len(rec.Records), len(wr), rec.TornAt, rec.Corrupt)
	}
	if rec.NextSeq != w.NextSeq() {
		t.Fatalf("recovered next seq %d, writer %d", rec.NextSeq, w.NextSeq())
	}
	st := w.Stats()
	if st.Batches != 20 || st.Segments != 1 || st.Fsyncs < 20 || st.FsyncLatency.N() != st.Fsyncs {
		t.Fatalf("stats %+v", st)
	}
}

func TestRotation(t *testing.T) {
	fs := vfs.NewMem()
	rng := rand.New(rand.NewPCG(3, 4))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096})
	wr := written{}
	for range 40 {
		appendN(t, w, rng, wr, 1+rng.IntN(4), 400)
		drain(t, w, d, 0)
	}
	// one batch larger than a segment
	appendN(t, w, rng, wr, 20, 600)
	drain(t, w, d, 0)
	if w.Err() != nil {
		t.Fatal(w.Err())
	}
	nseg := w.Stats().Segments
	if nseg < 4 {
		t.Fatalf("%d segments, want rotation", nseg)
	}
	rec := mustRecover(t, fs.Clone())
	wr.check(t, rec)
	if len(rec.Records) != len(wr) || len(rec.Segments) != nseg {
		t.Fatalf("recovered %d of %d records in %d segments (writer: %d)", len(rec.Records), len(wr), len(rec.Segments), nseg)
	}
	// DropBefore removes whole segments only.
	cut := rec.Segments[2].FirstSeq
	w.DropBefore(cut + 1)
	drain(t, w, d, 0)
	for w.dropDue() || w.phase != pIdle {
		w.Poll(0)
		d.runAll()
	}
	rec = mustRecover(t, fs.Clone())
	wr.check(t, rec)
	if len(rec.Segments) != nseg-2 || rec.Records[0].Seq != cut+1 || rec.Records[len(rec.Records)-1].Seq != w.NextSeq()-1 {
		t.Fatalf("after DropBefore(%d): %d segments (had %d), first seq %d", cut+1, len(rec.Segments), nseg, rec.Records[0].Seq)
	}
	for i := 1; i < len(rec.Records); i++ {
		if rec.Records[i].Seq <= rec.Records[i-1].Seq {
			t.Fatalf("records out of order")
		}
	}
}

func TestRestartAfterClose(t *testing.T) {
	fs := vfs.NewMem()
	rng := rand.New(rand.NewPCG(5, 6))
	wr := written{}
	for round := range 4 {
		fs.DropUnsynced() // a clean stop: everything was synced
		rec := mustRecover(t, fs)
		wr.check(t, rec)
		if len(rec.Records) != len(wr) || rec.TornAt != nil {
			t.Fatalf("round %d: recovered %d of %d (torn %v)", round, len(rec.Records), len(wr), rec.TornAt)
		}
		d := newTestDevice(fs)
		w := mustOpen(t, d, rec, Config{Mode: Sync, SegmentBytes: 8192})
		for range 10 {
			appendN(t, w, rng, wr, 1+rng.IntN(5), 500)
			drain(t, w, d, 0)
		}
		if w.Err() != nil {
			t.Fatal(w.Err())
		}
		d.x.Close()
	}
}

// An unsynced batch torn by a crash is cut back; everything synced stays;
// the writer continues after the cut and the next recovery is clean.
func TestTornTail(t *testing.T) {
	for seed := range uint64(20) {
		fs := vfs.NewMem()
		rng := rand.New(rand.NewPCG(seed, 7))
		d := newTestDevice(fs)
		w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 1 << 16})
		wr := written{}
		for range 5 {
			appendN(t, w, rng, wr, 3, 200)
			drain(t, w, d, 0)
		}
		synced := w.Synced()
		appendN(t, w, rng, wr, 30, 700) // several pages
		for w.phase != pSync {
			w.Poll(0)
			d.step()
		}
		fs.Crash(rng)
		rec := mustRecover(t, fs)
		wr.check(t, rec)
		got := seqs(rec)
		for s := range wr {
			if s <= synced && !got[s] {
				t.Fatalf("seed %d: synced seq %d lost", seed, s)
			}
		}
		if len(rec.Corrupt) != 0 {
			t.Fatalf("seed %d: corruption reported for a torn tail: %+v", seed, rec.Corrupt)
		}
		if rec.TornAt != nil {
			if len(rec.Warnings) == 0 || !strings.Contains(rec.Warnings[0], "torn tail") {
				t.Fatalf("seed %d: torn at %v without a warning: %q", seed, rec.TornAt, rec.Warnings)
			}
			ents, _ := fs.ReadDir(testDir)
			found := false
			for _, e := range ents {
				found = found || strings.Contains(e.Name(), ".torn-")
			}
			if !found {
				t.Fatalf("seed %d: no .torn- copy in %v", seed, ents)
			}
		}
		// drop what the tear left of the batch from the expectations
		for s := range wr {
			if s > synced && !got[s] {
				delete(wr, s)
			}
		}
		d = newTestDevice(fs)
		w = mustOpen(t, d, rec, Config{Mode: Sync, SegmentBytes: 1 << 16})
		appendN(t, w, rng, wr, 5, 300)
		drain(t, w, d, 0)
		fs.DropUnsynced()
		rec2 := mustRecover(t, fs)
		wr.check(t, rec2)
		if len(rec2.Records) != len(wr) || rec2.TornAt != nil || len(rec2.Corrupt) != 0 {
			t.Fatalf("seed %d: after the cut and more appends: %d of %d records (torn %v corrupt %v)", seed, len(rec2.Records), len(wr), rec2.TornAt, rec2.Corrupt)
		}
	}
}

// TestDropUnderLoad: DropBefore takes effect while records keep coming
// (in Sync a batch is sealed at every idle Poll, so a drop queued behind
// batches would never run and the log would grow behind its snapshots).
func TestDropUnderLoad(t *testing.T) {
	fs := vfs.NewMem()
	rng := rand.New(rand.NewPCG(5, 6))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, SegmentBytes: 4096})
	wr := written{}
	for range 30 {
		appendN(t, w, rng, wr, 2, 400)
		drain(t, w, d, 0)
	}
	nseg := w.Stats().Segments
	if nseg < 3 {
		t.Fatalf("%d segments, want rotation", nseg)
	}
	w.DropBefore(w.NextSeq())
	for i := 0; i < 200 && w.DropPending(); i++ {
		appendN(t, w, rng, wr, 1, 50) // a record at every Poll
		w.Poll(0)
		d.step()
	}
	if w.DropPending() || w.Err() != nil {
		t.Fatalf("DropBefore never ran under load: %d segments (had %d), err %v", w.Stats().Segments, nseg, w.Err())
	}
}

// TestUnsyncedBytes: UnsyncedBytes is Stats().UnsyncedBytes (the open
// batch and the one in flight), MaxUnsyncedBytes the Config's after
// defaults; both feed broadcast's Async back-pressure.
func TestUnsyncedBytes(t *testing.T) {
	fs := vfs.NewMem()
	rng := rand.New(rand.NewPCG(3, 4))
	d := newTestDevice(fs)
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Async})
	if w.MaxUnsyncedBytes() != 4<<20 {
		t.Fatalf("default MaxUnsyncedBytes %d, want 4 MiB", w.MaxUnsyncedBytes())
	}
	if w.UnsyncedBytes() != 0 {
		t.Fatalf("unsynced %d on an empty writer", w.UnsyncedBytes())
	}
	appendN(t, w, rng, written{}, 5, 300)
	if n := w.UnsyncedBytes(); n == 0 || n != w.Stats().UnsyncedBytes {
		t.Fatalf("unsynced %d after 5 appends, stats say %d", n, w.Stats().UnsyncedBytes)
	}
	w.Flush()
	drain(t, w, d, 0)
	if w.UnsyncedBytes() != 0 {
		t.Fatalf("unsynced %d after a flush", w.UnsyncedBytes())
	}
}

// TestSyncLazyRecord: in Sync mode a lazy record alone does not start a
// batch (no write, no fsync) until FsyncInterval after the batch opened;
// an eager record appended after it makes the batch due at once and takes
// the lazy one along; Flush starts a lazy-only batch at once.
func TestSyncLazyRecord(t *testing.T) {
	fs := vfs.NewMem()
	d := newTestDevice(fs)
	const ivl = 10 * time.Millisecond
	w := mustOpen(t, d, mustRecover(t, fs), Config{Mode: Sync, FsyncInterval: ivl})
	drain(t, w, d, 0) // nothing to do

	lazy, ok := w.AppendLazy(RecCommit, 0, []byte("commit-1"))
	if !ok {
		t.Fatal(w.Err())
	}
	if got := w.NextDeadline(); got != ivl {
		t.Fatalf("NextDeadline with a lazy record open = %v, want %v", got, ivl)
	}
	for now := time.Duration(0); now < ivl; now += time.Millisecond {
		w.Poll(now)
		d.runAll()
	}
	if n := len(d.ran); n != 0 || w.Synced() >= lazy {
		t.Fatalf("a lazy record alone started a batch before FsyncInterval: %d IOs, synced %d", n, w.Synced())
	}
	eager, _ := w.Append(RecEntry, []byte("entry"))
	if got := w.NextDeadline(); got > ivl-time.Millisecond {
		t.Fatalf("NextDeadline with an entry open = %v, want now", got)
	}
	drain(t, w, d, ivl-time.Millisecond)
	if w.Synced() < eager || w.Stats().Batches != 1 {
		t.Fatalf("synced %d (want %d, the lazy record %d with it), %d batches", w.Synced(), eager, lazy, w.Stats().Batches)
	}

	// A lazy record alone: synced FsyncInterval later, or at Flush.
	lazy, _ = w.AppendLazy(RecCommit, 0, []byte("commit-2"))
	w.Poll(ivl)
	d.runAll()
	w.Poll(ivl)
	if w.Synced() >= lazy {
		t.Fatalf("a lazy record synced without waiting")
	}
	drain(t, w, d, 2*ivl)
	if w.Synced() < lazy {
		t.Fatalf("a lazy record not synced FsyncInterval after its batch opened")
	}
	lazy, _ = w.AppendLazy(RecCommit, 0, []byte("commit-3"))
	w.Flush()
	drain(t, w, d, 2*ivl)
	if w.Synced() < lazy {
		t.Fatalf("Flush left a lazy record unsynced")
	}
}
