package kv

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestBackupCapturesMarkerState: a table applying a backup marker hands
// itself to OnBackup, whose capture holds exactly the state after the
// entries up to the marker, even when it is copied (Persist) only after
// later entries overwrote, deleted and added keys (their frees are
// deferred while the capture lives): restored into a fresh table it
// equals a table that applied only the entries before the marker. The
// marker's result is StatusOK at version index<<16; an expired marker,
// or a table without OnBackup, captures nothing.
func TestBackupCapturesMarkerState(t *testing.T) {
	before := func(tb *Table) {
		for i := range 40 {
			put(tb, uint64(i+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d-%s", i, make([]byte, i*7))})
		}
		put(tb, 41, Op{Kind: OpDelete, Key: []byte("k3")})
	}
	const markerAt = 42
	var got []BackupMarker
	var capture broadcast.FSMSnapshot
	cfg := restoreCfg
	cfg.OnBackup = func(tb *Table, m BackupMarker) {
		got = append(got, m)
		if tb.Applied() != m.Index {
			t.Errorf("OnBackup sees applied %d, marker index %d", tb.Applied(), m.Index)
		}
		s, err := tb.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		capture = s
	}
	tb, _ := soloTable(t, cfg)
	before(tb)
	res, err := DecodeResult(tb.Apply(broadcast.Entry{Index: markerAt, Data: AppendBackup(nil, 7, 0)}))
	if err != nil || res.Status != StatusOK || res.Version != markerAt<<16 || res.Count != 0 {
		t.Fatalf("marker result %+v, %v; want StatusOK at version %d<<16", res, err, markerAt)
	}
	if len(got) != 1 || got[0] != (BackupMarker{ID: 7, Index: markerAt}) {
		t.Fatalf("OnBackup got %+v, want one marker {7, index %d}", got, markerAt)
	}
	// After the marker: overwrite, delete, add, grow.
	for i := range 60 {
		put(tb, uint64(markerAt+1+i), Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%d", i%50), Value: fmt.Appendf(nil, "after%d", i)})
	}
	put(tb, markerAt+61, Op{Kind: OpDelete, Key: []byte("k5")})
	b := make([]byte, capture.Size())
	if err := capture.Persist(b); err != nil {
		t.Fatal(err)
	}
	capture.Release()

	want, _ := soloTable(t, restoreCfg)
	before(want)
	want.Apply(broadcast.Entry{Index: markerAt, Data: AppendBackup(nil, 7, 0)})
	restored, _ := soloTable(t, restoreCfg)
	if err := restored.Restore(b); err != nil {
		t.Fatal(err)
	}
	if ws, rs := stateOf(t, want), stateOf(t, restored); !ws.equal(rs) {
		t.Fatalf("the capture restores to %d records, want the %d records before the marker", len(rs.recs), len(ws.recs))
	}
	if restored.Applied() != markerAt {
		t.Fatalf("restored applied %d, want the marker's %d", restored.Applied(), markerAt)
	}

	// Expired: OnBackup still sees the marker (it decides); a table
	// without OnBackup applies it as a no-op.
	got = nil
	tb.Apply(broadcast.Entry{Index: 200, Data: AppendBackup(nil, 8, 12345)})
	if len(got) != 1 || got[0].Expires != 12345 || got[0].Index != 200 {
		t.Fatalf("OnBackup got %+v", got)
	}
	capture.Release()
	plain, _ := soloTable(t, restoreCfg)
	if r, _ := DecodeResult(plain.Apply(broadcast.Entry{Index: 1, Data: AppendBackup(nil, 9, 0)})); r.Status != StatusOK {
		t.Fatalf("a table without OnBackup: %+v", r)
	}
	// Malformed markers change nothing and capture nothing.
	for _, bad := range [][]byte{AppendBackup(nil, 0, 0), AppendBackup(nil, 1, 0)[:20], append(AppendBackup(nil, 1, 0), 0)} {
		got = nil
		if r, _ := DecodeResult(tb.Apply(broadcast.Entry{Index: 300, Data: bad})); r.Status != StatusMalformed || len(got) != 0 {
			t.Errorf("marker %x: %+v, OnBackup %v; want StatusMalformed and no call", bad, r, got)
		}
	}
}

// TestBackupImage: BackupImage's file passes the disk snapshot checks,
// is named for its index, and its state is TRAM's state of a new group
// (delivery count at the index) followed by the table's bytes.
func TestBackupImage(t *testing.T) {
	tb, _ := soloTable(t, restoreCfg)
	put(tb, 1, Op{Kind: OpPut, Key: []byte("a"), Value: []byte("1")})
	table := snapshotOf(t, tb)
	rc := testReplicaConfig(t)
	name, img, err := BackupImage(rc, 2, 1, 77, table)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := broadcast.DecodeSnapFile(img)
	if err != nil {
		t.Fatal(err)
	}
	// The header orders the state after the empty one (0,0): a member
	// that starts empty is behind it and gets its snapshot.
	if at := (broadcast.MsgHdr{Cnt: 77}); name != broadcast.SnapName(77, at) || ds.Index != 77 || ds.At != at || ds.Member != 2 {
		t.Fatalf("name %s, index %d, header %v, member %d", name, ds.Index, ds.At, ds.Member)
	}
	own := binary.LittleEndian.Uint64(ds.State)
	if got := ds.State[8+own:]; string(got) != string(table) {
		t.Fatalf("the state's application part is not the table's bytes")
	}
	if d := binary.LittleEndian.Uint64(ds.State[8+32:]); d != 77 {
		t.Fatalf("TRAM's delivery count %d, want 77", d)
	}
	img[len(img)/2] ^= 1
	if _, err := broadcast.DecodeSnapFile(img); err == nil {
		t.Fatal("a flipped byte passed the checks")
	}
}

// testReplicaConfig is a replica config of group 0 of a two-group tree.
func testReplicaConfig(t *testing.T) ReplicaConfig {
	t.Helper()
	tr, err := tree.FromParents([]int{-1, 0})
	if err != nil {
		t.Fatal(err)
	}
	return ReplicaConfig{Multicast: multicast.Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}},
		ClientNodes: []rdma.NodeID{100, 101}}}
}
