package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestDurableTablesPrefaultSpare: a durable replica's table keeps a spare
// for its captures' index copies, pre-faulted off the polling goroutine
// (kv.TableConfig.PrefaultSpare, issue 19); a memory-mode one does not
// (its captures are rare: a member behind the log), so it pays no spare
// before its first capture.
func TestDurableTablesPrefaultSpare(t *testing.T) {
	for _, mode := range []broadcast.Durability{broadcast.Memory, broadcast.Sync} {
		t.Run(mode.String(), func(t *testing.T) {
			m := &cluster.Map{Name: "prefault", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
			if err := m.Fill(); err != nil {
				t.Fatal(err)
			}
			p, stop := startDurableMode(t, m, t.TempDir(), mode, nil)
			defer stop()
			c := openClient(t, p, m)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			val := strings.Repeat("x", 1000)
			for i := range 200 { // 200 KB of log: disk snapshots every 64 KiB in sync mode
				if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte(val)); err != nil {
					t.Fatalf("put k%d: %v", i, err)
				}
			}
			for i := range 3 {
				var st kv.Stats
				if err := p.Do(0, i, func(r *kv.Replica) { st = r.Table().Stats() }); err != nil {
					t.Fatal(err)
				}
				t.Logf("replica %d: %d spares pre-faulted, %d captures into a fresh index copy", i, st.SparePrefaults, st.FreshIndexCopies)
				if got := st.SparePrefaults > 0; got != (mode != broadcast.Memory) {
					t.Errorf("replica %d in %v mode: %d spares pre-faulted", i, mode, st.SparePrefaults)
				}
			}
		})
	}
}
