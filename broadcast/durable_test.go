package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
	"github.com/rdmakv/rdmakv/wal"
)

func recEntry(seq uint64, h MsgHdr, flags uint8, data string) wal.Record {
	b := make([]byte, 32+len(data))
	binary.LittleEndian.PutUint64(b[0:], uint64(h.E))
	binary.LittleEndian.PutUint64(b[8:], h.Cnt)
	copy(b[32:], data)
	return wal.Record{Type: wal.RecEntry, Flags: flags, Seq: seq, Data: b}
}

func recDiff(seq uint64, h, base MsgHdr, n int) (begin wal.Record, end wal.Record) {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint64(b[0:], uint64(h.E))
	binary.LittleEndian.PutUint64(b[8:], h.Cnt)
	binary.LittleEndian.PutUint64(b[16:], uint64(base.E))
	binary.LittleEndian.PutUint64(b[24:], base.Cnt)
	binary.LittleEndian.PutUint32(b[32:], uint32(n))
	e := make([]byte, 16)
	copy(e, b[:16])
	return wal.Record{Type: wal.RecDiffBegin, Seq: seq, Data: b}, wal.Record{Type: wal.RecDiffEnd, Seq: seq + uint64(n) + 1, Data: e}
}

func recCommit(seq uint64, h MsgHdr, index uint64) wal.Record {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint64(b[0:], uint64(h.E))
	binary.LittleEndian.PutUint64(b[8:], h.Cnt)
	binary.LittleEndian.PutUint64(b[16:], index)
	return wal.Record{Type: wal.RecCommit, Seq: seq, Data: b}
}

// TestRecoverChecksLog: Recover accepts the logs this package writes and
// refuses, with ErrLogCorrupt, records out of its format; a log with
// corruption is not replayed (Repair).
func TestRecoverChecksLog(t *testing.T) {
	e1 := Epoch(1)
	begin, end := recDiff(2, MsgHdr{E: e1}, MsgHdr{}, 1)
	good := []wal.Record{begin, recEntry(3, MsgHdr{E: 0, Cnt: 0}, recInDiff, "x"), end,
		recEntry(5, MsgHdr{E: e1, Cnt: 1}, 0, "a"), recCommit(6, MsgHdr{E: e1, Cnt: 1}, 1)}
	rc, err := Recover(&wal.Recovered{Records: good, NextSeq: 7})
	if err != nil || rc.Repair || rc.Entries != 2 || rc.Diffs != 1 || rc.Commits != 1 {
		t.Fatalf("good log: %+v, %v", rc, err)
	}
	if rc, err := Recover(nil); err != nil || rc.Repair {
		t.Fatalf("no log: %+v, %v", rc, err)
	}
	bad := map[string][]wal.Record{
		"entry flagged in a diff outside one": {recEntry(2, MsgHdr{E: e1, Cnt: 1}, recInDiff, "a")},
		"diff entry not flagged":              {begin, recEntry(3, MsgHdr{}, 0, "x"), end},
		"diff end without begin":              {end},
		"diff missing an entry":               {begin, end},
		"unfinished diff":                     {begin, recEntry(3, MsgHdr{}, recInDiff, "x")},
		"short entry":                         {{Type: wal.RecEntry, Seq: 2, Data: make([]byte, 8)}},
		"unknown type":                        {{Type: 42, Seq: 2}},
		"short commit":                        {{Type: wal.RecCommit, Seq: 2, Data: make([]byte, 8)}},
	}
	for name, recs := range bad {
		if _, err := Recover(&wal.Recovered{Records: recs}); !errors.Is(err, ErrLogCorrupt) {
			t.Errorf("%s: Recover returned %v, want ErrLogCorrupt", name, err)
		}
	}
	// A log that does not start at its first record (truncated behind a
	// disk snapshot, not built yet) is refused.
	if _, err := Recover(&wal.Recovered{Segments: []wal.SegInfo{{Seq: 3, Path: "wal/3.seg", FirstSeq: 900}}}); !errors.Is(err, ErrLogCorrupt) {
		t.Errorf("truncated log: %v, want ErrLogCorrupt", err)
	}
	// Corruption: not replayed, the member catches up from the group.
	rc, err = Recover(&wal.Recovered{Records: good, Corrupt: []wal.Corruption{{Path: "wal/1.seg", FromSeq: 4, ToSeq: 4, Reason: "crc"}}})
	if err != nil || !rc.Repair || !strings.Contains(rc.Reason, "catching up") || rc.recs != nil {
		t.Fatalf("corrupt log: %+v, %v", rc, err)
	}
}

func recSnapMark(seq uint64, at MsgHdr, index uint64) wal.Record {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b[0:], uint64(at.E))
	binary.LittleEndian.PutUint64(b[8:], at.Cnt)
	binary.LittleEndian.PutUint64(b[16:], index)
	return wal.Record{Type: wal.RecSnapMark, Seq: seq, Data: b}
}

// TestRecoverSnapMark: a diff that installed a network snapshot logs a
// small SnapMark naming the disk snapshot it was saved as (not the
// snapshot itself). Recovery replays it when snap/ holds that snapshot
// (or a newer one), and boots catching up (Repair) when it does not: the
// snapshot was never durable (nothing from the diff on was acknowledged)
// or the disk lost it.
func TestRecoverSnapMark(t *testing.T) {
	e1, e2 := Epoch(1), Epoch(2)
	at := MsgHdr{E: e1, Cnt: 7}
	begin, end := recDiff(2, MsgHdr{E: e2}, at, 2)
	end.Seq = 6
	recs := func() []wal.Record {
		return []wal.Record{begin, recSnapMark(3, at, 7), recEntry(4, MsgHdr{E: e1, Cnt: 8}, recInDiff, "x"),
			recEntry(5, MsgHdr{E: e1, Cnt: 9}, recInDiff, "y"), end}
	}
	for _, tc := range []struct {
		name   string
		snap   *DiskSnap
		repair bool
	}{
		{"no snapshot on disk", nil, true},
		{"an older snapshot only", &DiskSnap{At: MsgHdr{E: e1, Cnt: 3}, Index: 3}, true},
		{"the snapshot it names", &DiskSnap{At: at, Index: 7}, false},
		{"a newer snapshot", &DiskSnap{At: MsgHdr{E: e2, Cnt: 4}, Index: 12}, false},
		// Above the one it names but below the diff's epoch: taken
		// before the diff replaced the state (its removal after the
		// install did not reach the disk); it may hold entries the
		// group lost (kv's async-staggered seed 208).
		{"a snapshot the diff replaced", &DiskSnap{At: MsgHdr{E: e1, Cnt: 10}, Index: 10}, true},
		// At one of the diff's entries: taken after the diff, at a
		// commit point inside it (or before it, the same entries: one
		// header, one entry): the group's state.
		{"a snapshot at one of the diff's entries", &DiskSnap{At: MsgHdr{E: e1, Cnt: 9}, Index: 9}, false},
	} {
		rc, err := RecoverFrom(&wal.Recovered{Records: recs(), NextSeq: 7}, tc.snap)
		if err != nil || rc.Repair != tc.repair {
			t.Errorf("%s: %+v, %v; want Repair %v", tc.name, rc, err, tc.repair)
			continue
		}
		if tc.repair && !strings.Contains(rc.Reason, SnapName(7, at)) {
			t.Errorf("%s: reason %q does not name the snapshot", tc.name, rc.Reason)
		}
	}
	// Planted: the snapshot the diff replaced is replayed over.
	rc, err := recoverFrom(&wal.Recovered{Records: recs(), NextSeq: 7}, &DiskSnap{At: MsgHdr{E: e1, Cnt: 10}, Index: 10}, recoverKnobs{staleSnapUsed: true})
	if err != nil || rc.Repair {
		t.Errorf("planted staleSnapUsed: %+v, %v; want it replayed (the rule off)", rc, err)
	}
	// A SnapMark whose snapshot never became durable (the member booted
	// catching up), then a later diff whose snapshot is on disk: the
	// later install supersedes everything before its DiffBegin.
	at2 := MsgHdr{E: e1, Cnt: 5}
	begin2, end2 := recDiff(7, MsgHdr{E: Epoch(3)}, at2, 0)
	later := append(recs(), begin2, recSnapMark(8, at2, 5), end2)
	later[len(later)-1].Seq = 9
	rc, err = RecoverFrom(&wal.Recovered{Records: later, NextSeq: 10}, &DiskSnap{At: at2, Index: 5})
	if err != nil || rc.Repair || len(rc.recs) != 3 || rc.recs[0].Seq != 7 {
		t.Errorf("a stale SnapMark before a durable one: %+v, %v; want the records from seq 7", rc, err)
	}
	// Repair's held (a Repair member's Acpt in a recovery election): what
	// the log accepted before the first diff whose snapshot is missing
	// (two such diffs here), at least the loaded snapshot's header.
	b1, e1d := recDiff(3, MsgHdr{E: e2}, at, 0)
	b2, e2d := recDiff(6, MsgHdr{E: Epoch(3)}, MsgHdr{E: e1, Cnt: 9}, 0)
	e2d.Seq = 8
	twice := []wal.Record{recEntry(1, MsgHdr{E: e1, Cnt: 1}, 0, "a"), recEntry(2, MsgHdr{E: e1, Cnt: 2}, 0, "b"),
		b1, recSnapMark(4, at, 7), e1d, b2, recSnapMark(7, MsgHdr{E: e1, Cnt: 9}, 9), e2d}
	e1d.Seq = 5
	twice[4] = e1d
	for _, tc := range []struct {
		snap *DiskSnap
		want MsgHdr
	}{
		{nil, MsgHdr{E: e1, Cnt: 2}},
		{&DiskSnap{At: MsgHdr{E: e1, Cnt: 1}, Index: 1}, MsgHdr{E: e1, Cnt: 2}},
		{&DiskSnap{At: MsgHdr{E: e1, Cnt: 3}, Index: 3}, MsgHdr{E: e1, Cnt: 3}},
	} {
		rc, err := RecoverFrom(&wal.Recovered{Records: slices.Clone(twice), NextSeq: 9}, tc.snap)
		if err != nil || !rc.Repair || rc.held != tc.want {
			t.Errorf("two installs never durable, snapshot %v: Repair %v, held %v, %v; want Repair, held %v", tc.snap, rc.Repair, rc.held, err, tc.want)
		}
	}
	// The old format (the whole snapshot in the record) is refused.
	old := recs()
	old[1].Data = append(old[1].Data, make([]byte, 64)...)
	if _, err := RecoverFrom(&wal.Recovered{Records: old, NextSeq: 7}, &DiskSnap{At: at, Index: 7}); !errors.Is(err, ErrLogCorrupt) {
		t.Errorf("whole-snapshot record: %v, want ErrLogCorrupt", err)
	}
}

// TestDurabilityConfig: Sync and Async need a WAL and Snapshots, Memory
// takes none; FsyncInterval defaults to 10 ms.
func TestDurabilityConfig(t *testing.T) {
	base := Config{Self: 1, Members: []rdma.NodeID{1, 2, 3}}
	for _, tc := range []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"async without wal", func(c *Config) { c.Durability = Async }, "async needs a WAL"},
		{"async without snapshots", func(c *Config) { c.Durability, c.WAL = Async, &wal.Writer{} }, "needs Snapshots"},
		{"negative fsync interval", func(c *Config) { c.FsyncInterval = -1 }, "fsync interval"},
		{"sync without wal", func(c *Config) { c.Durability = Sync }, "needs a WAL"},
		{"sync without snapshots", func(c *Config) { c.Durability, c.WAL = Sync, &wal.Writer{} }, "needs Snapshots"},
		{"memory with wal", func(c *Config) { c.WAL = &wal.Writer{} }, "durability memory"},
		{"unknown", func(c *Config) { c.Durability = 7 }, "unknown"},
	} {
		c := base
		tc.mod(&c)
		_, err := c.withDefaults()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig saying %q", tc.name, err, tc.want)
		}
	}
	c, err := base.withDefaults()
	if err != nil {
		t.Fatalf("memory: %v", err)
	}
	if c.FsyncInterval != 10*time.Millisecond {
		t.Errorf("default FsyncInterval %v, want 10ms", c.FsyncInterval)
	}
}

// TestSimSyncCorruptLog: a member whose log has a corrupt record below
// its last batch (a flipped byte in a synced record, planted while it is
// down) does not replay it: it boots catching up (Status.Repair), takes
// the leader's diff, and the group loses nothing (the simulator's checks:
// total order, acknowledged lost, liveness).
func TestSimSyncCorruptLog(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	repaired := 0
	for seed := uint64(1); seed <= 20; seed++ {
		var stats simStats
		o := simOpts{n: 3, until: window, durability: Sync, promiseCheck: true, maxLog: 24, stats: &stats, script: func(h *simRun) {
			id := rdma.NodeID(1 + seed%3)
			h.s.At(8*time.Millisecond, func() {
				if !h.s.Live(id) {
					return
				}
				if err := h.s.Crash(id); err != nil {
					h.c.fail("crash %d: %v", id, err)
					return
				}
				h.down[id] = true
				// Rot only below the last batch (a corrupt last batch
				// looks torn and is cut: plan §6, "tail rot"): try the
				// flip on a copy first.
				// (A log with no durable segment yet, the first
				// election being late, is left alone.)
				clone := h.s.Disk(id).Files()
				planted := false
				if err := corruptFirstRecord(clone); err == nil {
					rec, err := wal.Recover(clone, "wal", uint64(id))
					planted = err == nil && len(rec.Corrupt) > 0
				}
				if planted {
					if err := corruptFirstRecord(h.s.Disk(id)); err != nil {
						h.c.fail("corrupt %d: %v", id, err)
					}
				}
				h.s.At(10*time.Millisecond, func() {
					if err := h.s.Restart(id, true); err != nil {
						h.c.fail("restart %d: %v", id, err)
					}
					p := h.procs[id]
					switch {
					case !planted:
					case !p.r.Status().Repair || !p.r.Status().CatchingUp:
						h.c.fail("node %d restarted from a corrupt log without Repair and catching up: %+v", id, p.r.Status())
					default:
						repaired++
					}
					delete(h.down, id)
				})
			})
		}}
		if err := runSim(sim.Seed{Seed: seed}, o, new(Counters)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if repaired == 0 {
		t.Fatalf("no seed restarted a member from a corrupt log")
	}
	t.Logf("%d members restarted from a corrupt log, caught up", repaired)
}

// corruptFirstRecord flips the type byte of the first record after the
// first Batch record of the first segment, durably.
func corruptFirstRecord(fs vfs.FS) error {
	ents, err := fs.ReadDir("wal")
	if err != nil || len(ents) == 0 {
		return fmt.Errorf("no log: %v", err)
	}
	f, err := fs.OpenFile(filepath.Join("wal", ents[0].Name()), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const at = 32 + 48 + 4 // segment header, Batch record, the next record's type
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		return err
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, at); err != nil {
		return err
	}
	return f.Sync()
}

// TestSimSyncFailStop: an EIO on a member's sync fail-stops its writer;
// the replica stops (Status.DiskErr wraps ErrDisk and wal.ErrFailStop,
// nothing more is acknowledged), the group goes on without it, and,
// restarted from what its disk kept, it catches up; nothing acknowledged
// is lost.
func TestSimSyncFailStop(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	stopped := 0
	for seed := uint64(1); seed <= 20; seed++ {
		// The failed sync is among a member's first 10 (about one per
		// entry: Commit records ride with entries), so that it comes
		// while faults and proposals run (window), not after the run
		// checks that elections stopped (the first election, whose
		// votes wait for their stable saves, ends 1-2 ms into it).
		o := simOpts{n: 3, until: window, durability: Sync, promiseCheck: true, maxLog: 24,
			failNode: rdma.NodeID(1 + seed%3), failSync: 4 + int(seed)/3, stopped: &stopped}
		if err := runSim(sim.Seed{Seed: seed}, o, new(Counters)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if stopped < 15 {
		t.Fatalf("only %d of 20 seeds stopped a member on its failed sync", stopped)
	}
	t.Logf("%d members stopped on a failed sync and came back", stopped)
}

// TestSimSyncSnapDiskFull: a member whose disk is full when it saves the
// snapshot a diff installed stops (ErrDisk wrapping wal.ErrDiskFull: its
// log already names the snapshot) without acknowledging the diff; the
// harness restarts it from its disk, which boots catching up (the log's
// last SnapMark names a snapshot that is not there) or from before the
// diff, and nothing acknowledged is lost.
func TestSimSyncSnapDiskFull(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	stopped := 0
	for seed := uint64(1); seed <= 10; seed++ {
		// longDown: one member is down long enough to need a snapshot
		// when it comes back (its second incarnation, whose disk is full).
		o := simOpts{n: 3, until: 4 * window, longDown: true, durability: Sync, promiseCheck: true, maxLog: 16,
			ballast: 64 << 10, maxUnsynced: 16 << 10, fullSnap: 2, stopped: &stopped}
		if err := runSim(sim.Seed{Seed: seed}, o, new(Counters)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if stopped == 0 {
		t.Fatal("no seed stopped a member on a full disk while saving a snapshot a diff installed")
	}
	t.Logf("%d members stopped on a full disk and came back", stopped)
}

// TestSimSyncFsyncsPerEntry: in Sync mode with proposals far apart (one
// writer: each entry commits before the next is proposed), every member
// syncs about once per entry. A Commit record does not start a batch of
// its own (it rides with the next entries: walCommit, AppendLazy); with
// the eagerCommit knob each entry costs two fsyncs per member, the
// entry's and the commit's, and the next entry's batch waits for the
// second.
func TestSimSyncFsyncsPerEntry(t *testing.T) {
	simNoRace(t)
	run := func(knobs testingKnobs) float64 {
		var stats simStats
		for seed := uint64(1); seed <= 5; seed++ {
			o := simOpts{knobs: knobs, n: 3, until: 60 * time.Millisecond, durability: Sync, promiseCheck: true, maxLog: 24,
				proposeEvery: 12 * time.Millisecond, stats: &stats}
			if err := runSim(sim.Seed{Seed: seed}, o, new(Counters)); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if stats.delivered < 20 {
			t.Fatalf("only %d entries delivered", stats.delivered)
		}
		return float64(stats.fsyncs) / float64(3*stats.delivered)
	}
	lazy, eager := run(testingKnobs{}), run(testingKnobs{eagerCommit: true})
	t.Logf("fsyncs per entry per member: %.2f (eager commit records: %.2f)", lazy, eager)
	if lazy > 1.3 {
		t.Errorf("%.2f fsyncs per entry per member, want about 1 (a Commit record syncs on its own)", lazy)
	}
	if eager < 1.6 {
		t.Errorf("the eagerCommit knob gives %.2f fsyncs per entry per member, want about 2 (the test does not see the cost it guards)", eager)
	}
}
