package broadcast

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
	"github.com/rdmakv/rdmakv/wal"
)

// stepDevice runs IOs only when the test says so (as wal's testDevice).
type stepDevice struct {
	x     *wal.Executor
	queue []wal.IO
	done  []wal.Done
}

func newStepDevice(fs vfs.FS) *stepDevice { return &stepDevice{x: wal.NewExecutor(fs)} }

func (d *stepDevice) Submit(op wal.IO) bool { d.queue = append(d.queue, op); return true }

func (d *stepDevice) Reap(dst []wal.Done) []wal.Done {
	dst = append(dst, d.done...)
	d.done = d.done[:0]
	return dst
}

// step runs the head IO and returns its kind (0: none queued).
func (d *stepDevice) step() wal.IOKind {
	if len(d.queue) == 0 {
		return 0
	}
	op := d.queue[0]
	d.queue = d.queue[1:]
	d.done = append(d.done, wal.Done{Tag: op.Tag, Err: d.x.Do(op)})
	return op.Kind
}

// drive polls the store and runs its IOs until it is idle.
func drive(t *testing.T, s *SnapStore, d *stepDevice) (saved int) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if s.Poll(0) {
			saved++
		}
		if d.step() == 0 && !s.Busy() {
			return saved
		}
	}
	t.Fatal("snapshot store never went idle")
	return saved
}

const snapDir = "data/snap"

func snapState(i int) (meta, state []byte) {
	return []byte(fmt.Sprintf("meta-%d", i)), bytes.Repeat([]byte{byte(i)}, 5000+i)
}

// saveSnap saves snapshot i (index 100*i, header (i, i)) and runs it to the end.
func saveSnap(t *testing.T, s *SnapStore, d *stepDevice, i int) {
	t.Helper()
	meta, state := snapState(i)
	if !s.Save(0, uint64(100*i), MsgHdr{E: Epoch(i), Cnt: uint64(i)}, meta, state) {
		t.Fatal("Save refused")
	}
	drive(t, s, d)
}

// checkSnap asserts that dir's newest valid snapshot is snapshot i.
func checkSnap(t *testing.T, fs vfs.FS, i int) {
	t.Helper()
	got, warn, err := LoadNewest(fs, snapDir)
	if err != nil || got == nil {
		t.Fatalf("LoadNewest: %v, %v (warnings %q)", got, err, warn)
	}
	meta, state := snapState(i)
	if got.Index != uint64(100*i) || got.At != (MsgHdr{E: Epoch(i), Cnt: uint64(i)}) ||
		!bytes.Equal(got.Meta, meta) || !bytes.Equal(got.State, state) {
		t.Fatalf("LoadNewest = index %d at %v (%d meta, %d state bytes), want snapshot %d", got.Index, got.At, len(got.Meta), len(got.State), i)
	}
}

func newSnapFS(t *testing.T) *vfs.Mem {
	m := vfs.NewMem()
	if err := m.MkdirAll(snapDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("data"); err != nil {
		t.Fatal(err)
	}
	// a log segment beside it, which no snapshot operation may touch
	if err := vfs.WriteFile(m, "data/wal.seg", []byte("log bytes")); err != nil {
		t.Fatal(err)
	}
	return m
}

func snapFiles(t *testing.T, fs vfs.FS) []string {
	ents, err := fs.ReadDir(snapDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestSnapStoreRoundTrip(t *testing.T) {
	m := newSnapFS(t)
	d := newStepDevice(m)
	s := NewSnapStore(d, snapDir, 7, nil)
	if _, _, ok := s.Newest(); ok {
		t.Fatal("a new store has a snapshot")
	}
	saveSnap(t, s, d, 1)
	saveSnap(t, s, d, 2)
	if idx, at, ok := s.Newest(); !ok || idx != 200 || at != (MsgHdr{E: 2, Cnt: 2}) || s.Saves() != 2 {
		t.Fatalf("Newest = %d %v %v, saves %d", idx, at, ok, s.Saves())
	}
	checkSnap(t, m, 2)
	if names := snapFiles(t, m); len(names) != 1 || names[0] != SnapName(200, MsgHdr{E: 2, Cnt: 2}) {
		t.Fatalf("snap dir holds %q, want only the newest snapshot", names)
	}
	// what is durable is the same: a crash right now changes nothing
	m.DropUnsynced()
	checkSnap(t, m, 2)
}

// TestSnapStoreDiskFull: ENOSPC while writing the snapshot abandons it:
// the store has not failed, the old snapshot and the log are intact, no
// tmp file is left, and a later save succeeds.
func TestSnapStoreDiskFull(t *testing.T) {
	m := newSnapFS(t)
	full := true
	fs := errorfs.Wrap(m, errorfs.Func(func(op errorfs.Op) error {
		if full && op.Kind == errorfs.OpWrite && strings.Contains(op.Path, "tmp-") && op.Len > 6000 {
			return syscall.ENOSPC
		}
		return nil
	}))
	d := newStepDevice(fs)
	s := NewSnapStore(d, snapDir, 7, nil)
	full = false
	saveSnap(t, s, d, 1)
	full = true
	meta, state := snapState(2)
	state = append(state, make([]byte, 2000)...)
	if !s.Save(0, 200, MsgHdr{E: 2, Cnt: 2}, meta, state) {
		t.Fatal("Save refused")
	}
	if drive(t, s, d) != 0 {
		t.Fatal("a snapshot that hit ENOSPC counted as saved")
	}
	if s.Err() != nil || !errors.Is(s.FullErr(), wal.ErrDiskFull) {
		t.Fatalf("Err %v, FullErr %v: want no fail-stop and ErrDiskFull", s.Err(), s.FullErr())
	}
	if idx, _, _ := s.Newest(); idx != 100 {
		t.Fatalf("Newest index %d after the failed save, want 100", idx)
	}
	if names := snapFiles(t, m); len(names) != 1 || names[0] != SnapName(100, MsgHdr{E: 1, Cnt: 1}) {
		t.Fatalf("snap dir holds %q after ENOSPC, want the old snapshot only", names)
	}
	if b, err := vfs.ReadFile(m, "data/wal.seg"); err != nil || string(b) != "log bytes" {
		t.Fatalf("the log file changed: %q %v", b, err)
	}
	m.DropUnsynced()
	checkSnap(t, m, 1)
	full = false
	d = newStepDevice(fs)
	s.dev = d
	saveSnap(t, s, d, 3)
	if s.FullErr() != nil || s.Saves() != 2 {
		t.Fatalf("save after space came back: FullErr %v saves %d", s.FullErr(), s.Saves())
	}
	checkSnap(t, m, 3)
}

// TestSnapStoreSyncEIO: a failed fdatasync of the snapshot stops the store
// (fail-stop, never retried) and the old snapshot stays the newest.
func TestSnapStoreSyncEIO(t *testing.T) {
	m := newSnapFS(t)
	fs := errorfs.Wrap(m, errorfs.OnNth(errorfs.OpSync, 2, syscall.EIO))
	d := newStepDevice(fs)
	s := NewSnapStore(d, snapDir, 7, nil)
	saveSnap(t, s, d, 1)
	saveSnap(t, s, d, 2)
	if !errors.Is(s.Err(), wal.ErrFailStop) || !errors.Is(s.Err(), syscall.EIO) {
		t.Fatalf("Err = %v, want wal.ErrFailStop wrapping EIO", s.Err())
	}
	if s.Save(0, 300, MsgHdr{E: 3, Cnt: 3}, nil, nil) {
		t.Fatal("a failed store accepted another save")
	}
	if idx, _, _ := s.Newest(); idx != 100 || s.Saves() != 1 {
		t.Fatalf("Newest index %d saves %d after EIO, want 100, 1", idx, s.Saves())
	}
	m.DropUnsynced()
	checkSnap(t, m, 1)
}

// TestSnapStoreCrashBeforeDirSync: a crash between the rename and the
// directory fsync keeps the old snapshot (the new name was not durable).
func TestSnapStoreCrashBeforeDirSync(t *testing.T) {
	m := newSnapFS(t)
	d := newStepDevice(m)
	s := NewSnapStore(d, snapDir, 7, nil)
	saveSnap(t, s, d, 1)
	meta, state := snapState(2)
	s.Save(0, 200, MsgHdr{E: 2, Cnt: 2}, meta, state)
	for {
		s.Poll(0)
		k := d.step()
		if k == 0 {
			t.Fatal("the save ended before its rename")
		}
		if k == wal.IORename {
			break
		}
	}
	if s.Poll(0) || s.Saves() != 1 {
		t.Fatal("the snapshot counted as saved before the directory fsync")
	}
	m.DropUnsynced()
	checkSnap(t, m, 1)
	// the crash left the tmp file's name undone too: nothing to clean
	if names := snapFiles(t, m); len(names) != 1 {
		t.Fatalf("snap dir holds %q", names)
	}
}

// TestSnapStoreCorruptFallsBack: LoadNewest sets aside a corrupt newest
// snapshot (renamed .broken, a warning naming both files) and returns the
// older one; a leftover tmp file is removed.
func TestSnapStoreCorruptFallsBack(t *testing.T) {
	m := newSnapFS(t)
	for i := 1; i <= 2; i++ {
		meta, state := snapState(i)
		at := MsgHdr{E: Epoch(i), Cnt: uint64(i)}
		if err := vfs.WriteFile(m, filepath.Join(snapDir, SnapName(uint64(100*i), at)), encodeSnapFile(uint64(100*i), at, 7, 0, meta, state)); err != nil {
			t.Fatal(err)
		}
	}
	if err := vfs.WriteFile(m, filepath.Join(snapDir, "tmp-9"), []byte("half")); err != nil {
		t.Fatal(err)
	}
	newest := filepath.Join(snapDir, SnapName(200, MsgHdr{E: 2, Cnt: 2}))
	if err := m.Corrupt(newest, 100, 0x10); err != nil { // a byte of the meta/state
		t.Fatal(err)
	}
	got, warn, err := LoadNewest(m, snapDir)
	if err != nil || got == nil || got.Index != 100 {
		t.Fatalf("LoadNewest = %+v, %v", got, err)
	}
	if len(warn) != 1 || !strings.Contains(warn[0], "check word mismatch") || !strings.Contains(warn[0], "falling back to") {
		t.Fatalf("warnings %q", warn)
	}
	names := snapFiles(t, m)
	want := []string{SnapName(100, MsgHdr{E: 1, Cnt: 1}), SnapName(200, MsgHdr{E: 2, Cnt: 2}) + ".broken"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("snap dir holds %q, want %q", names, want)
	}
	// every single-byte flip of a file is caught by one of its checks
	meta, state := snapState(3)
	img := encodeSnapFile(300, MsgHdr{E: 3, Cnt: 3}, 7, 0, meta, state)
	for off := 0; off < len(img); off += 7 {
		b := bytes.Clone(img)
		b[off] ^= 0x01
		if _, err := decodeSnapFile(b); !errors.Is(err, ErrSnapCorrupt) {
			t.Fatalf("a flipped bit at %d of %d: decode err %v", off, len(img), err)
		}
	}
}

// checkRecoverable is the "recoverable:" property for a snapshot store:
// after a crash that keeps only what was synced, the disk still yields
// the newest snapshot the store declared durable (the log below it may
// already be gone).
func checkRecoverable(fs vfs.FS, s *SnapStore) error {
	idx, _, ok := s.Newest()
	if !ok {
		return nil
	}
	got, warn, err := LoadNewest(fs, snapDir)
	if err != nil {
		return fmt.Errorf("recoverable: load: %v", err)
	}
	if got == nil {
		return fmt.Errorf("recoverable: the store declared snapshot index %d durable; after the crash the disk has no valid snapshot (warnings %q)", idx, warn)
	}
	if got.Index < idx {
		return fmt.Errorf("recoverable: the store declared snapshot index %d durable; after the crash the newest valid one is index %d (warnings %q)", idx, got.Index, warn)
	}
	return nil
}

// crashAfter runs the save in flight for n IOs, then crashes the disk
// (unsynced writes dropped); it reports whether the save counted.
func crashAfter(s *SnapStore, d *stepDevice, m *vfs.Mem, n int) (saved bool) {
	for range n {
		saved = s.Poll(0) || saved
		d.step()
	}
	saved = s.Poll(0) || saved
	m.DropUnsynced()
	return saved
}

// TestSnapStoreRenameBeforeSync: the planted bug renameBeforeSync (the
// rename and dir fsync before the data's fdatasync, counted durable then)
// is caught by "recoverable:"; the store as written passes it at every
// crash point.
func TestSnapStoreRenameBeforeSync(t *testing.T) {
	for _, planted := range []bool{false, true} {
		var failed error
		for crashAt := 1; crashAt <= 8 && failed == nil; crashAt++ {
			m := newSnapFS(t)
			d := newStepDevice(m)
			s := NewSnapStore(d, snapDir, 7, nil)
			saveSnap(t, s, d, 1)
			s.knobs.renameBeforeSync = planted
			meta, state := snapState(2)
			s.Save(0, 200, MsgHdr{E: 2, Cnt: 2}, meta, state)
			crashAfter(s, d, m, crashAt)
			failed = checkRecoverable(m, s)
		}
		switch {
		case !planted && failed != nil:
			t.Fatalf("the store as written: %v", failed)
		case planted && (failed == nil || !strings.HasPrefix(failed.Error(), "recoverable:")):
			t.Fatalf("renameBeforeSync not caught by recoverable: (%v)", failed)
		case planted:
			t.Logf("renameBeforeSync caught: %v", failed)
		}
	}
}

// TestSnapStoreSharedDevice: the store and a log writer share one device
// through wal.Share; each sees only its own completions. The log's
// segments are 64 KiB, as in the package's other tests of a log on the
// in-memory file system: a default 64 MiB segment there is a 64 MiB
// buffer that each of the writer's syncs and DropUnsynced copied whole.
func TestSnapStoreSharedDevice(t *testing.T) {
	m := newSnapFS(t)
	if err := m.MkdirAll("data/wal", 0o755); err != nil {
		t.Fatal(err)
	}
	d := newStepDevice(m)
	logDev, snapDev := wal.Share(d)
	w, err := wal.Open(logDev, wal.Config{Dir: "data/wal", Mode: wal.Sync, Member: 7, SegmentBytes: 64 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSnapStore(snapDev, snapDir, 7, nil)
	var seq uint64
	for i := 0; i < 5; i++ {
		seq, _ = w.Append(wal.RecEntry, []byte(fmt.Sprintf("entry %d", i)))
	}
	meta, state := snapState(1)
	s.Save(0, 100, MsgHdr{E: 1, Cnt: 1}, meta, state)
	for i := 0; i < 200 && (w.Synced() < seq || s.Busy()); i++ {
		w.Poll(0)
		s.Poll(0)
		d.step()
	}
	if w.Err() != nil || s.Err() != nil || w.Synced() < seq || s.Saves() != 1 {
		t.Fatalf("writer synced %d of %d (err %v), store saves %d (err %v)", w.Synced(), seq, w.Err(), s.Saves(), s.Err())
	}
	m.DropUnsynced()
	checkSnap(t, m, 1)
	rec, err := wal.Recover(m, "data/wal", 7)
	if err != nil || len(rec.Records) != 5 {
		t.Fatalf("log recovered %v records, err %v", rec, err)
	}
}

// TestRecoverFromSnapshot: a log cut below a disk snapshot (its first
// segment starts after seq 1, and may begin inside a diff whose start was
// dropped) is refused without the snapshot and accepted with it, the
// dropped diff's tail left out.
func TestRecoverFromSnapshot(t *testing.T) {
	e1 := Epoch(1)
	_, end := recDiff(2, MsgHdr{E: e1}, MsgHdr{}, 1)
	cutLog := func() *wal.Recovered {
		return &wal.Recovered{
			Segments: []wal.SegInfo{{Path: "wal/0000000000000002.seg", FirstSeq: 3}},
			Records: []wal.Record{recEntry(3, MsgHdr{E: 0, Cnt: 1}, recInDiff, "x"), end,
				recEntry(5, MsgHdr{E: e1, Cnt: 1}, 0, "a"), recCommit(6, MsgHdr{E: e1, Cnt: 1}, 1)},
			NextSeq: 7,
		}
	}
	if _, err := Recover(cutLog()); !errors.Is(err, ErrLogCorrupt) {
		t.Fatalf("a log starting at seq 3 without a snapshot: %v, want ErrLogCorrupt", err)
	}
	snap := &DiskSnap{Path: "snap/x.snap", Index: 1, At: MsgHdr{E: e1, Cnt: 0}}
	rc, err := RecoverFrom(cutLog(), snap)
	if err != nil || rc.Repair || len(rc.recs) != 2 || rc.recs[0].Seq != 5 || rc.Entries != 1 || rc.Commits != 1 || rc.snap != snap {
		t.Fatalf("RecoverFrom = %+v, %v: want the entry and the commit after the dropped diff's tail", rc, err)
	}
}

// TestSnapStoreRemovesLeftovers: snapshot files a crash left behind
// (older than the newest) are removed after the next save.
func TestSnapStoreRemovesLeftovers(t *testing.T) {
	m := newSnapFS(t)
	for i := 1; i <= 2; i++ {
		meta, state := snapState(i)
		at := MsgHdr{E: Epoch(i), Cnt: uint64(i)}
		if err := vfs.WriteFile(m, filepath.Join(snapDir, SnapName(uint64(100*i), at)), encodeSnapFile(uint64(100*i), at, 7, 0, meta, state)); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := LoadNewest(m, snapDir)
	if err != nil || got == nil || got.Index != 200 || len(got.Older) != 1 {
		t.Fatalf("LoadNewest = %+v, %v", got, err)
	}
	d := newStepDevice(m)
	s := NewSnapStore(d, snapDir, 7, got)
	saveSnap(t, s, d, 3)
	if names := snapFiles(t, m); len(names) != 1 || names[0] != SnapName(300, MsgHdr{E: 3, Cnt: 3}) {
		t.Fatalf("snap dir holds %q, want only the newest snapshot", names)
	}
	checkSnap(t, m, 3)
}

// TestSnapStoreStaleRemovedFirst: a save below the store's files (a
// snapshot a diff installed over the state it replaced) removes them,
// durably (unlink, dir fsync), before it reports the save durable: the
// replica's gate passes the diff's SnapMark at that report, and from
// then on no crash may bring back a file the diff replaced ("stale:").
// The planted staleRemovedLate (their removal after the report, unsynced,
// as any old file's) is caught at some crash point. A save above the old
// files costs no extra dir fsync.
func TestSnapStoreStaleRemovedFirst(t *testing.T) {
	named, stale := MsgHdr{E: 1, Cnt: 28}, MsgHdr{E: 1, Cnt: 34}
	for _, planted := range []bool{false, true} {
		var failed error
		for crashAt := 1; crashAt <= 12 && failed == nil; crashAt++ {
			m := newSnapFS(t)
			d := newStepDevice(m)
			s := NewSnapStore(d, snapDir, 7, nil)
			meta, state := snapState(1)
			if !s.Save(0, 34, stale, meta, state) {
				t.Fatal("Save refused")
			}
			drive(t, s, d)
			s.knobs.staleRemovedLate = planted
			meta, state = snapState(2)
			s.Save(0, 28, named, meta, state)
			saved := crashAfter(s, d, m, crashAt)
			if err := checkRecoverable(m, s); err != nil {
				t.Fatalf("planted %v, crash at %d: %v", planted, crashAt, err)
			}
			if !saved {
				continue
			}
			for _, n := range snapFiles(t, m) {
				if f := parseSnapName(n); f.ok && named.Less(f.at) {
					failed = fmt.Errorf("stale: crash at IO %d: the store reported %s durable (the gate passes the diff that installed it), yet the disk holds %s", crashAt, SnapName(28, named), n)
				}
			}
		}
		switch {
		case !planted && failed != nil:
			t.Fatalf("the store as written: %v", failed)
		case planted && (failed == nil || !strings.HasPrefix(failed.Error(), "stale:")):
			t.Fatalf("staleRemovedLate not caught by stale: (%v)", failed)
		case planted:
			t.Logf("staleRemovedLate caught: %v", failed)
		}
	}

	// A save above the old file: one dir fsync (the rename's), the old
	// file's removal after the save counts.
	m := newSnapFS(t)
	d := newStepDevice(m)
	s := NewSnapStore(d, snapDir, 7, nil)
	saveSnap(t, s, d, 1)
	meta, state := snapState(2)
	s.Save(0, 200, MsgHdr{E: 2, Cnt: 2}, meta, state)
	var kinds []wal.IOKind
	for i := 0; i < 100; i++ {
		s.Poll(0)
		k := d.step()
		if k == 0 && !s.Busy() {
			break
		}
		if k != 0 {
			kinds = append(kinds, k)
		}
	}
	want := []wal.IOKind{wal.IOCreate, wal.IOWrite, wal.IOSync, wal.IORename, wal.IOSyncDir, wal.IORemove}
	if !slices.Equal(kinds, want) {
		t.Errorf("a save above the old file ran %v, want %v", kinds, want)
	}
}
