package sim_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/sim"
	"github.com/rdmakv/rdmakv/wal"
)

// diskDo submits ops on dev and runs the sim until they completed.
func diskDo(t *testing.T, s *sim.Sim, dev *sim.DiskDevice, ops ...wal.IO) {
	t.Helper()
	for i, op := range ops {
		op.Tag = uint64(i + 1)
		if !dev.Submit(op) {
			t.Fatal("submit refused")
		}
	}
	var done []wal.Done
	for range 1000 {
		if done = dev.Reap(done); len(done) == len(ops) {
			break
		}
		run(t, s, 100*time.Microsecond)
	}
	if len(done) != len(ops) {
		t.Fatalf("%d of %d IOs completed", len(done), len(ops))
	}
	for i, d := range done {
		if d.Tag != uint64(i+1) || d.Err != nil {
			t.Fatalf("IO %d (%v): completion %+v", i, ops[i].Kind, d)
		}
	}
}

func pages(n int, fill func(p int) byte) []byte {
	b := make([]byte, n*vfs.PageSize)
	for i := range b {
		b[i] = fill(i / vfs.PageSize)
	}
	return b
}

// crashRun writes 16 pages and syncs them, overwrites them without a sync,
// crashes node 2 and restarts it with its disk: it returns the file.
func crashRun(t *testing.T, seed uint64) []byte {
	s := twoNodes(t, sim.Options{Seed: seed})
	disk := s.Disk(2)
	if err := disk.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	dev := proc(s, 2).env.DiskDevice()
	const f = "/d/f"
	diskDo(t, s, dev,
		wal.IO{Kind: wal.IOCreate, Path: f},
		wal.IO{Kind: wal.IOWrite, Path: f, Data: pages(16, func(int) byte { return 'A' })},
		wal.IO{Kind: wal.IOSync, Path: f},
		wal.IO{Kind: wal.IOSyncDir, Path: "/d"},
		wal.IO{Kind: wal.IOWrite, Path: f, Data: pages(16, func(p int) byte { return byte(0x80 | p) })})
	if err := s.Crash(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(2, true); err != nil {
		t.Fatal(err)
	}
	b, err := vfs.ReadFile(s.Disk(2), f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// At a crash each unsynced page is kept or lost whole, the last written
// page keeps a prefix of whole sectors, and over seeds both outcomes and
// several tear points occur.
func TestDiskCrashLosesUnsyncedPages(t *testing.T) {
	kept, lost := 0, 0
	tears := map[int]bool{}
	for seed := range uint64(24) {
		b := crashRun(t, seed)
		if len(b) != 16*vfs.PageSize {
			t.Fatalf("seed %d: file is %d bytes", seed, len(b))
		}
		for p := range 16 {
			pg := b[p*vfs.PageSize : (p+1)*vfs.PageSize]
			nw := byte(0x80 | p)
			if p == 15 {
				k := bytes.IndexByte(pg, 'A')
				if k < 0 {
					k = vfs.PageSize
				}
				if k%vfs.SectorSize != 0 || !bytes.Equal(pg[:k], bytes.Repeat([]byte{nw}, k)) || bytes.ContainsFunc(pg[k:], func(r rune) bool { return r != 'A' }) {
					t.Fatalf("seed %d: last page is not a sector prefix of the new write over the old bytes (first old byte at %d)", seed, k)
				}
				tears[k/vfs.SectorSize] = true
				continue
			}
			switch {
			case bytes.Equal(pg, bytes.Repeat([]byte{nw}, vfs.PageSize)):
				kept++
			case bytes.Equal(pg, bytes.Repeat([]byte{'A'}, vfs.PageSize)):
				lost++
			default:
				t.Fatalf("seed %d: page %d is neither the synced nor the new bytes", seed, p)
			}
		}
	}
	if kept == 0 || lost == 0 || len(tears) < 3 {
		t.Fatalf("over 24 seeds: %d pages kept, %d lost, tear points %v: the model draws nothing", kept, lost, tears)
	}
	t.Logf("unsynced pages kept %d, lost %d; tear points (sectors) seen %v", kept, lost, tears)
}

// The same seed leaves the same bytes; different seeds differ.
func TestDiskDeterministic(t *testing.T) {
	distinct := map[string]bool{}
	for seed := range uint64(6) {
		a, b := crashRun(t, seed), crashRun(t, seed)
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two runs left different bytes", seed)
		}
		distinct[string(a)] = true
	}
	if len(distinct) < 2 {
		t.Fatal("six seeds left the same bytes")
	}
}

// A rename (and a remove) is lost at a crash unless SyncDir made it
// durable; a file's bytes need its Sync.
func TestDiskRenameNeedsSyncDir(t *testing.T) {
	s := twoNodes(t, sim.Options{Seed: 5})
	if err := s.Disk(2).MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	crash := func() {
		t.Helper()
		if err := s.Crash(2); err != nil {
			t.Fatal(err)
		}
		if err := s.Restart(2, true); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		_, err := s.Disk(2).Stat(name)
		return err == nil
	}
	dev := proc(s, 2).env.DiskDevice()
	diskDo(t, s, dev,
		wal.IO{Kind: wal.IOCreate, Path: "/d/tmp"},
		wal.IO{Kind: wal.IOWrite, Path: "/d/tmp", Data: []byte("snapshot")},
		wal.IO{Kind: wal.IOSync, Path: "/d/tmp"},
		wal.IO{Kind: wal.IOSyncDir, Path: "/d"},
		wal.IO{Kind: wal.IORename, Path: "/d/tmp", To: "/d/final"})
	if !exists("/d/final") || exists("/d/tmp") {
		t.Fatal("rename not visible before the crash")
	}
	crash()
	if exists("/d/final") || !exists("/d/tmp") {
		t.Fatal("a rename without SyncDir survived the crash")
	}
	dev = proc(s, 2).env.DiskDevice()
	diskDo(t, s, dev,
		wal.IO{Kind: wal.IORename, Path: "/d/tmp", To: "/d/final"},
		wal.IO{Kind: wal.IOSyncDir, Path: "/d"})
	crash()
	if b, err := vfs.ReadFile(s.Disk(2), "/d/final"); err != nil || string(b) != "snapshot" || exists("/d/tmp") {
		t.Fatalf("after rename + SyncDir and a crash: %q, %v (tmp exists %v)", b, err, exists("/d/tmp"))
	}
	dev = proc(s, 2).env.DiskDevice()
	diskDo(t, s, dev, wal.IO{Kind: wal.IORemove, Path: "/d/final"})
	crash()
	if !exists("/d/final") {
		t.Fatal("a remove without SyncDir survived the crash")
	}
	// A created file whose directory was never synced is gone.
	dev = proc(s, 2).env.DiskDevice()
	diskDo(t, s, dev,
		wal.IO{Kind: wal.IOCreate, Path: "/d/new"},
		wal.IO{Kind: wal.IOWrite, Path: "/d/new", Data: []byte("x")},
		wal.IO{Kind: wal.IOSync, Path: "/d/new"})
	crash()
	if exists("/d/new") {
		t.Fatal("a created file survived the crash without SyncDir")
	}
}

// IOs queued on the device when the node crashes never happen, and a
// Sync takes its virtual latency.
func TestDiskDeviceCrashDropsQueued(t *testing.T) {
	s := twoNodes(t, sim.Options{Seed: 6})
	s.Disk(2).SetSyncLatency(time.Millisecond, time.Millisecond)
	if err := s.Disk(2).MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	dev := proc(s, 2).env.DiskDevice()
	diskDo(t, s, dev, wal.IO{Kind: wal.IOCreate, Path: "/d/f"}, wal.IO{Kind: wal.IOSyncDir, Path: "/d"})
	start := s.Now()
	dev.Submit(wal.IO{Kind: wal.IOSync, Path: "/d/f", Tag: 1})
	dev.Submit(wal.IO{Kind: wal.IOWrite, Path: "/d/f", Data: []byte("late"), Tag: 2})
	run(t, s, 500*time.Microsecond)
	if d := dev.Reap(nil); len(d) != 0 {
		t.Fatalf("a 1ms sync completed after %v", s.Now()-start)
	}
	if err := s.Crash(2); err != nil {
		t.Fatal(err)
	}
	run(t, s, 5*time.Millisecond)
	if d := dev.Reap(nil); len(d) != 0 {
		t.Fatalf("IOs completed after the crash: %+v", d)
	}
	if err := s.Restart(2, true); err != nil {
		t.Fatal(err)
	}
	if b, err := vfs.ReadFile(s.Disk(2), "/d/f"); err != nil || len(b) != 0 {
		t.Fatalf("file after the crash: %q, %v", b, err)
	}
}

// The wal Writer over the sim disk: after a crash at a random moment every
// synced record is recovered and nothing is reported corrupt.
func TestDiskWALCrash(t *testing.T) {
	for seed := range uint64(12) {
		s := twoNodes(t, sim.Options{Seed: seed})
		rng := rand.New(rand.NewPCG(seed, 1))
		disk := s.Disk(2)
		written := map[uint64]string{}
		var synced uint64
		for round := range 3 {
			rec, err := wal.Recover(disk, "/wal", 2)
			if err != nil {
				t.Fatal(err)
			}
			got := map[uint64]bool{}
			for _, r := range rec.Records {
				if written[r.Seq] != string(r.Data) {
					t.Fatalf("seed %d round %d: recovered seq %d that was not written", seed, round, r.Seq)
				}
				got[r.Seq] = true
			}
			for sq := range written {
				if sq <= synced && !got[sq] {
					t.Fatalf("seed %d round %d: synced seq %d lost (torn %v corrupt %v)", seed, round, sq, rec.TornAt, rec.Corrupt)
				}
				if !got[sq] {
					delete(written, sq)
				}
			}
			if len(rec.Corrupt) > 0 {
				t.Fatalf("seed %d: corruption after a crash: %+v", seed, rec.Corrupt)
			}
			w, err := wal.Open(proc(s, 2).env.DiskDevice(), wal.Config{Dir: "/wal", Member: 2, Mode: wal.Sync, SegmentBytes: 16 << 10}, rec)
			if err != nil {
				t.Fatal(err)
			}
			steps := 20 + rng.IntN(200)
			for range steps {
				for range rng.IntN(4) {
					p := fmt.Sprintf("rec-%d-%x", rng.Uint64(), make([]byte, rng.IntN(900)))
					sq, ok := w.Append(wal.RecEntry, []byte(p))
					if !ok {
						t.Fatal(w.Err())
					}
					written[sq] = p
				}
				w.Poll(s.Now())
				synced = w.Synced()
				run(t, s, time.Duration(20+rng.IntN(200))*time.Microsecond)
			}
			if err := s.Crash(2); err != nil {
				t.Fatal(err)
			}
			if err := s.Restart(2, true); err != nil {
				t.Fatal(err)
			}
		}
	}
}
