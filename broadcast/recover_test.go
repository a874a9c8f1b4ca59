package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/wal"
)

// The disk kv's async-staggered seed 208 left (node 6 there, member 1
// here): the member had delivered entries 1-34 of epoch eOld and held a
// disk snapshot at (eOld, 34); an async whole-group recovery lost entry
// 34, and the new leader of eNew rolled the member back with a diff that
// installed its snapshot at (eOld, 28) (the group's entries 29-33 in the
// diff). The installed snapshot was saved in snap/ and the SnapMark
// names it; the crash came before the old file's removal reached the
// disk.
var (
	staleMembers = []rdma.NodeID{1, 2, 3}
	staleOld     = MakeEpoch(1, 2)
	staleNew     = MakeEpoch(2, 3)
	staleNamed   = MsgHdr{E: staleOld, Cnt: 28}
	staleAt      = MsgHdr{E: staleOld, Cnt: 34}
)

// groupEntry is the group's entry i (1-based); the member's lost 34th was
// "lost34".
func groupEntry(i int) string { return fmt.Sprintf("g%d", i) }

// writeSnapFile writes (synced, with its directory) the disk snapshot of
// a logFSM that delivered seq, at header at.
func writeSnapFile(t *testing.T, fs vfs.FS, dir string, at MsgHdr, seq []string) string {
	t.Helper()
	var s logSnap
	for _, d := range seq {
		s.seq = append(s.seq, []byte(d))
	}
	state := make([]byte, s.Size())
	if err := s.Persist(state); err != nil {
		t.Fatal(err)
	}
	index := uint64(len(seq))
	meta := encodeSnapMeta(staleMembers, snapMeta{index: index, table: make([]tableRec, len(staleMembers)), size: uint64(len(state)), stateCheck: hashChunked(state)})
	p := filepath.Join(dir, SnapName(index, at))
	if err := vfs.WriteFile(fs, p, encodeSnapFile(index, at, 1, 0, meta, state)); err != nil {
		t.Fatal(err)
	}
	if err := syncSnap(fs, dir, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func walRec(typ wal.RecType, flags uint8, words ...uint64) (wal.RecType, uint8, []byte) {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return typ, flags, b
}

// staleDisk lays out the disk: both snapshot files, and the log from the
// rolling-back diff on (the log below the old snapshot was dropped).
// committed: the log also holds the new leader's first entry, g34, and a
// Commit record at it (index 34); without, the member crashed before any
// Commit record after the diff, and recovers to the installed snapshot.
// It returns the group's state that recovery must give back.
func staleDisk(t *testing.T, committed bool) (m *vfs.Mem, want []string) {
	t.Helper()
	m = newDataFS(t)
	var group, member []string
	for i := 1; i <= 34; i++ {
		group = append(group, groupEntry(i))
	}
	member = append(slices.Clone(group[:33]), "lost34")
	writeSnapFile(t, m, "snap", staleNamed, group[:28])
	writeSnapFile(t, m, "snap", staleAt, member)

	l := newTestLog(t, m)
	diffHdr := MsgHdr{E: staleNew}
	l.diffBegin(diffHdr, staleNamed, 5)
	l.snapMark(staleNamed, 28)
	for c := 29; c <= 33; c++ {
		l.entry(MsgHdr{E: staleOld, Cnt: uint64(c)}, recInDiff, groupEntry(c))
	}
	l.diffEnd(diffHdr)
	want = group[:28]
	if committed {
		l.entry(MsgHdr{E: staleNew, Cnt: 1}, 0, groupEntry(34))
		l.commit(MsgHdr{E: staleNew, Cnt: 1}, 34)
		want = group
	}
	l.sync()
	m.DropUnsynced()
	return m, want
}

// newDataFS is an in-memory disk with a replica's snap/ and wal/.
func newDataFS(t *testing.T) *vfs.Mem {
	t.Helper()
	m := vfs.NewMem()
	for _, d := range []string{"snap", "wal"} {
		if err := m.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// testLog writes member 1's log records into wal/ as this package does.
type testLog struct {
	t    *testing.T
	w    *wal.Writer
	d    *stepDevice
	last uint64
}

func newTestLog(t *testing.T, fs vfs.FS) *testLog {
	t.Helper()
	d := newStepDevice(fs)
	w, err := wal.Open(d, wal.Config{Dir: "wal", Mode: wal.Sync, Member: 1, SegmentBytes: 64 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testLog{t: t, w: w, d: d}
}

func (l *testLog) app(typ wal.RecType, flags uint8, parts ...[]byte) {
	seq, ok := l.w.AppendFlags(typ, flags, parts...)
	if !ok {
		l.t.Fatalf("append: %v", l.w.Err())
	}
	l.last = seq
}

func (l *testLog) entry(h MsgHdr, flags uint8, data string) {
	typ, fl, b := walRec(wal.RecEntry, flags, uint64(h.E), h.Cnt, 0, 0)
	l.app(typ, fl, b, []byte(data))
}

func (l *testLog) diffBegin(hdr, base MsgHdr, entries int) {
	l.app(walRec(wal.RecDiffBegin, 0, uint64(hdr.E), hdr.Cnt, uint64(base.E), base.Cnt, uint64(entries)))
}

func (l *testLog) snapMark(at MsgHdr, index uint64) {
	l.app(walRec(wal.RecSnapMark, 0, uint64(at.E), at.Cnt, index))
}

func (l *testLog) diffEnd(hdr MsgHdr) { l.app(walRec(wal.RecDiffEnd, 0, uint64(hdr.E), hdr.Cnt)) }

func (l *testLog) commit(h MsgHdr, index uint64) {
	l.app(walRec(wal.RecCommit, 0, uint64(h.E), h.Cnt, index, index))
}

// sync writes and syncs every record appended.
func (l *testLog) sync() {
	for i := 0; i < 1000 && l.w.Synced() < l.last; i++ {
		l.w.Poll(0)
		l.d.step()
	}
	if l.w.Synced() < l.last || l.w.Err() != nil {
		l.t.Fatalf("log synced to %d of %d: %v", l.w.Synced(), l.last, l.w.Err())
	}
}

// bootFrom recovers member 1 from m as internal/server.OpenDurable does
// (the log, then the snapshot it continues) and starts its replica.
func bootFrom(t *testing.T, m *vfs.Mem, k recoverKnobs) (r *Replica, fsm *logFSM, warn []string, err error) {
	t.Helper()
	rec, err := wal.Recover(m, "wal", 1)
	if err != nil {
		t.Fatal(err)
	}
	snap, warn, err := loadFor(m, "snap", rec, k)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := recoverFrom(rec, snap, k)
	if err != nil {
		return nil, nil, warn, err
	}
	logDev, snapDev := wal.Share(newStepDevice(m))
	w, err := wal.Open(logDev, wal.Config{Dir: "wal", Mode: wal.Sync, Member: 1, SegmentBytes: 64 << 10}, rec)
	if err != nil {
		t.Fatal(err)
	}
	f := mem.New(mem.Options{})
	node, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	stable := &MemStable{}
	if err := stable.Save(StableState{Incarnation: 1, ENew: staleNew}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Self: 1, Members: staleMembers, Start: StartExisting, Durability: Sync, WAL: w, Recovery: rc,
		Snapshots: NewSnapStore(snapDev, "snap", 1, snap)}
	fsm = &logFSM{}
	r, err = New(cfg, node, fsm, stable)
	if err == nil {
		t.Cleanup(func() { r.Close() })
		// The replica must not hold what it replayed: the log's read
		// buffers and the snapshot's image would stay for its life.
		if rc.recs != nil || rc.snap != nil {
			t.Errorf("kept: after New the recovery still holds %d log records and snapshot %v", len(rc.recs), rc.snap != nil)
		}
	}
	return r, fsm, warn, err
}

// checkStart is the property: the replica started from its disk (not
// catching up) with exactly the group's state ("state:"), and did not
// boot catching up ("repair:").
func checkStart(r *Replica, fsm *logFSM, err error, want []string) error {
	if err != nil {
		return fmt.Errorf("state: the replica did not start: %w", err)
	}
	var got []string
	for _, d := range fsm.seq {
		got = append(got, string(d))
	}
	if st := r.Status(); st.Repair {
		return fmt.Errorf("repair: it boots catching up (%d entries delivered)", len(got))
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("state: it delivered %d entries %q, the group's state is %d entries %q", len(got), got, len(want), want)
	}
	return nil
}

// TestRecoverStaleSnapshot: a disk that holds a snapshot the log's last
// diff replaced (above the one its SnapMark names, below the diff) beside
// the named one: recovery removes the stale file (a warning line says
// so), starts from the named snapshot and replays the log after the
// mark, delivering exactly the group's committed entries, without
// catching up from the group (a whole group in that state could not).
// Planted staleSnapUsed (the log not consulted: the stale file chosen and
// replayed over) is caught by "state:": with a Commit record after the
// diff the replay refuses to start (the seed-208 symptom, log corrupt),
// without one it starts with the lost entry delivered.
func TestRecoverStaleSnapshot(t *testing.T) {
	stale := filepath.Join("snap", SnapName(34, staleAt))
	for _, committed := range []bool{true, false} {
		m, want := staleDisk(t, committed)
		r, fsm, warn, err := bootFrom(t, m, recoverKnobs{})
		if err := checkStart(r, fsm, err, want); err != nil {
			t.Fatalf("committed %v: %v", committed, err)
		}
		if len(warn) != 1 || !StaleWarning(warn[0]) || !strings.Contains(warn[0], stale) || !strings.Contains(warn[0], SnapName(28, staleNamed)) {
			t.Errorf("committed %v: warnings %q, want one naming the stale file removed and the snapshot recovery starts from", committed, warn)
		}
		m.DropUnsynced() // the removal is durable
		if names := snapNames(t, m); slices.Contains(names, filepath.Base(stale)) {
			t.Errorf("committed %v: after a crash snap/ still holds the stale file: %q", committed, names)
		}
		if st := r.Status(); !st.FromDisk || st.Index != uint64(len(want)) {
			t.Errorf("committed %v: status from disk %v index %d, want from disk at %d", committed, st.FromDisk, st.Index, len(want))
		}

		m, want = staleDisk(t, committed)
		r, fsm, _, err = bootFrom(t, m, recoverKnobs{staleSnapUsed: true})
		err = checkStart(r, fsm, err, want)
		if err == nil || !strings.HasPrefix(err.Error(), "state:") {
			t.Fatalf("committed %v: planted staleSnapUsed not caught by state: (%v)", committed, err)
		}
		if committed && !errors.Is(err, ErrLogCorrupt) {
			t.Errorf("committed %v: planted staleSnapUsed: %v, want the replay's log corrupt", committed, err)
		}
		t.Logf("committed %v: planted staleSnapUsed caught: %v", committed, err)
	}
}

// TestRecoverStaleNamedMissing: the Repair fallback stays for a named
// snapshot that really is missing (here: set aside as corrupt): the stale
// file is removed all the same, and the member boots catching up, the
// reason naming the snapshot.
func TestRecoverStaleNamedMissing(t *testing.T) {
	m, _ := staleDisk(t, true)
	named := filepath.Join("snap", SnapName(28, staleNamed))
	b, err := vfs.ReadFile(m, named)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := vfs.WriteFile(m, named, b); err != nil {
		t.Fatal(err)
	}
	r, fsm, warn, err := bootFrom(t, m, recoverKnobs{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Status().Repair || len(fsm.seq) != 0 {
		t.Fatalf("status %+v, %d delivered: want Repair, nothing delivered", r.Status(), len(fsm.seq))
	}
	if len(warn) != 2 || !StaleWarning(warn[0]) || StaleWarning(warn[1]) || !strings.Contains(warn[1], "corrupt") {
		t.Errorf("warnings %q: want the stale file's removal, then the named one set aside", warn)
	}
	if names := snapNames(t, m); len(names) != 1 || names[0] != filepath.Base(named)+".broken" {
		t.Errorf("snap/ holds %q, want only the named snapshot set aside", names)
	}
}

func snapNames(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	ents, err := fs.ReadDir("snap")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestNetSaveAfterDiffSynced: the snapshot a diff installed goes to the
// store (whose save removes the files it replaced) only once the diff's
// records are synced. Before, a crash could find the replaced file gone
// and a log that does not name the install yet, so that recovery would
// start from the installed snapshot below a log that continues the
// removed one ("recoverable:"). Async writer here: its records wait for a
// Flush, which diskSnapPoll asks for once the image is ready. Planted
// netSaveUnsynced is caught.
func TestNetSaveAfterDiffSynced(t *testing.T) {
	for _, planted := range []bool{false, true} {
		m := newDataFS(t)
		var member []string
		for i := 1; i <= 34; i++ {
			member = append(member, groupEntry(i))
		}
		writeSnapFile(t, m, "snap", staleAt, member)
		snap, _, err := LoadFor(m, "snap", nil)
		if err != nil || snap == nil {
			t.Fatalf("LoadFor: %v, %v", snap, err)
		}
		d := newStepDevice(m)
		logDev, snapDev := wal.Share(d)
		w, err := wal.Open(logDev, wal.Config{Dir: "wal", Mode: wal.Async, FsyncInterval: time.Hour, Member: 1, SegmentBytes: 64 << 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := &Replica{cfg: Config{Members: staleMembers, Snapshots: NewSnapStore(snapDev, "snap", 1, snap)}, dur: &durable{w: w}}
		r.knobs.netSaveUnsynced = planted
		r.runPersist = func(func()) {} // the image is built below
		r.walDiff(MsgHdr{E: staleNew}, staleNamed, nil, staleNamed, 28, []byte("meta"), []byte("state"))
		ns := r.dur.net
		ns.img = encodeSnapFile(ns.index, ns.at, 1, 0, []byte("meta"), []byte("state"))
		ns.done.Store(true)
		var failed error
		check := func(when string) {
			img := m.Clone()
			img.DropUnsynced()
			rec, err := wal.Recover(img, "wal", 1)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(snapNames(t, img), SnapName(34, staleAt)) || lastInstall(rec.Records).ok {
				return
			}
			failed = fmt.Errorf("recoverable: %s: a crash finds %s removed and a log that does not name the install (%d records): recovery would start from %q", when, SnapName(34, staleAt), len(rec.Records), snapNames(t, img))
		}
		for i := 0; i < 40 && failed == nil; i++ {
			r.diskSnapPoll()
			w.Poll(0)
			d.step()
			check(fmt.Sprintf("IO %d, the diff not synced", i))
		}
		w.Flush()
		for i := 0; i < 60 && failed == nil && r.dur.netSaves == 0; i++ {
			r.diskSnapPoll()
			w.Poll(0)
			d.step()
			check(fmt.Sprintf("IO %d after the flush", i))
		}
		switch {
		case !planted && failed != nil:
			t.Fatalf("as written: %v", failed)
		case !planted && (r.dur.netSaves != 1 || r.dur.gate != 0 || w.Synced() < ns.end):
			t.Fatalf("as written: saves %d, gate %d, synced %d of %d: want the snapshot saved once the diff synced", r.dur.netSaves, r.dur.gate, w.Synced(), ns.end)
		case planted && (failed == nil || !strings.HasPrefix(failed.Error(), "recoverable:")):
			t.Fatalf("planted netSaveUnsynced not caught by recoverable: (%v)", failed)
		case planted:
			t.Logf("planted netSaveUnsynced caught: %v", failed)
		}
	}
}

// repairedDisk lays out the disk of a member that booted in Repair and
// was then repaired by a plain diff, and crashed again: a disk snapshot
// at (e1,2) (g1-g2; the log below it dropped); the first incarnation's
// last diff, of epoch eMid, installed the group's snapshot at (e1,5)
// (g1-g5) with g6 at (eMid,1), and the crash came before that snapshot
// was durable (its file is missing). The member booted in Repair (empty:
// the log not replayed), and the leader of staleNew synced it from its
// commit point, nothing: a diff with base 0 that holds the whole Log,
// g1-g6 (nothing pruned, so no snapshot); then g7 at (staleNew,1),
// committed. It returns the group's state recovery must give back.
func repairedDisk(t *testing.T) (m *vfs.Mem, want []string) {
	t.Helper()
	m = newDataFS(t)
	for i := 1; i <= 7; i++ {
		want = append(want, groupEntry(i))
	}
	e1, eMid := staleOld, MakeEpoch(2, 1)
	writeSnapFile(t, m, "snap", MsgHdr{E: e1, Cnt: 2}, want[:2])
	l := newTestLog(t, m)
	l.diffBegin(MsgHdr{E: eMid, Cnt: 1}, MsgHdr{E: e1, Cnt: 5}, 1)
	l.snapMark(MsgHdr{E: e1, Cnt: 5}, 5) // never durable
	l.entry(MsgHdr{E: eMid, Cnt: 1}, recInDiff, groupEntry(6))
	l.diffEnd(MsgHdr{E: eMid, Cnt: 1})
	// The second incarnation, in Repair.
	l.diffBegin(MsgHdr{E: staleNew}, MsgHdr{}, 6)
	for c := 1; c <= 5; c++ {
		l.entry(MsgHdr{E: e1, Cnt: uint64(c)}, recInDiff, groupEntry(c))
	}
	l.entry(MsgHdr{E: eMid, Cnt: 1}, recInDiff, groupEntry(6))
	l.diffEnd(MsgHdr{E: staleNew})
	l.entry(MsgHdr{E: staleNew, Cnt: 1}, 0, groupEntry(7))
	l.commit(MsgHdr{E: staleNew, Cnt: 1}, 7)
	l.sync()
	m.DropUnsynced()
	return m, want
}

// TestRecoverRepairedByPlainDiff: a member in Repair (its log's last
// SnapMark names a snapshot that never became durable) that a leader
// repaired with a plain diff from base 0 (Fig. 7 l.119-123 from its
// empty commit point, nothing pruned) keeps that SnapMark as its log's
// last; the diff replaced the whole Log, so it supersedes every record
// before it. A second crash must boot it from its disk with the group's
// state, not in Repair again (which it would until its next disk
// snapshot or install: "repair: it boots catching up").
func TestRecoverRepairedByPlainDiff(t *testing.T) {
	m, want := repairedDisk(t)
	r, fsm, warn, err := bootFrom(t, m, recoverKnobs{})
	if err := checkStart(r, fsm, err, want); err != nil {
		t.Fatal(err)
	}
	if len(warn) > 0 {
		t.Errorf("warnings %q, want none", warn)
	}
	if st := r.Status(); !st.FromDisk || st.Index != uint64(len(want)) {
		t.Errorf("status from disk %v index %d, want from disk at %d", st.FromDisk, st.Index, len(want))
	}
}
