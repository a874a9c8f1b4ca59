package client

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestSlotLockFiles checks the shm clients' slot claims: at most one
// holder of a slot at a time while holders remove their lock files as
// they release them (the race a removed-and-recreated lock file opens),
// and nothing left in the directory once every slot is released.
func TestSlotLockFiles(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	m := &cluster.Map{Name: "slots", Fabric: "shm", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100, 101}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	slotLockHook = func() { time.Sleep(20 * time.Microsecond) } // widen the race
	defer func() { slotLockHook = nil }()
	var holders [2]atomic.Int32
	var claims atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 300 {
				k, f, err := claimSlot(m)
				if err != nil {
					continue // both slots held
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("slot %d has %d holders", k, n)
				}
				claims.Add(1)
				holders[k].Add(-1)
				releaseSlot(f)
			}
		})
	}
	wg.Wait()
	if claims.Load() < 300 {
		t.Errorf("only %d claims succeeded", claims.Load())
	}
	dir := filepath.Join(os.TempDir(), "rdmakv-slots")
	left, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left behind: %d entries in %s", len(ents), dir)
	}
}
