package kv

import (
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
)

// A replica that caught up by restoring a snapshot publishes when it did
// in its header's applied time (kvcli status's APPLIED AT), not the time
// of its last Apply before (0 for a fresh replica, shown as 00:00:00).
func TestRestoreSetsAppliedAt(t *testing.T) {
	src, _ := soloTable(t, restoreCfg)
	put(src, 1, Op{Kind: OpPut, Key: []byte("k"), Value: []byte("v")})
	put(src, 2, Op{Kind: OpPut, Key: []byte("k2"), Value: []byte("v2")})
	snap := snapshotOf(t, src)

	const restoredAt = int64(1_700_000_000_000_000_000)
	cfg := restoreCfg
	cfg.Clock = func() int64 { return restoredAt }
	dst, _ := soloTable(t, cfg)
	if h := dst.Header(); h.Applied != 0 || h.AppliedAt != 0 {
		t.Fatalf("fresh table's header: applied %d at %d, want 0 at 0", h.Applied, h.AppliedAt)
	}
	if err := dst.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if h := dst.Header(); h.Applied != 2 || h.AppliedAt != restoredAt {
		t.Fatalf("after Restore the header says applied %d at %d, want 2 at %d (the restore's time)", h.Applied, h.AppliedAt, restoredAt)
	}
	// An Apply after the restore moves it on as before.
	dst.Apply(broadcast.Entry{Index: 3})
	if h := dst.Header(); h.Applied != 3 {
		t.Fatalf("after Apply: applied %d, want 3", h.Applied)
	}
}
