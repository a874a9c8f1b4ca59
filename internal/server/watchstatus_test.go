package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

// watched is what Watch reads of a status: its log lines' fields and
// Ready's answer.
func watched(s server.ReplicaStatus) string {
	ok, why := s.Ready()
	return fmt.Sprintf("g%d n%d %s %v leader %d members %v catching %v restored %d records %d applied %d ready %v %q",
		s.Group, s.Node, s.Role, s.Epoch, s.Leader, s.Members, s.CatchingUp, s.Counters.SnapshotsRestored, s.Records, s.Applied, ok, why)
}

// TestWatchStatus: the light status Watch reads 20 to 50 times a second says
// what the full Status says about every field Watch and Ready read, and
// leaves out the costly parts (uptime, huge pages).
func TestWatchStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := &cluster.Map{Name: "wst", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	for _, r := range lc.Replicas() {
		// Compare against full statuses taken before and after it: an
		// election in between changes them, and the sample is taken again.
		var w, before string
		same := false
		for range 1000 {
			before = watched(r.Status())
			w = watched(server.WatchStatus(r))
			if before == watched(r.Status()) {
				same = true
				break
			}
		}
		if !same {
			t.Fatalf("replica %d's status changed in each of 1000 samples", r.Node)
		}
		if w != before {
			t.Errorf("replica %d: Watch's status %s, Status %s", r.Node, w, before)
		}
		if ws := server.WatchStatus(r); ws.Uptime != "" || ws.HugePages.Mode != "" {
			t.Errorf("replica %d: Watch's status carries the uptime %q or the huge pages %+v", r.Node, ws.Uptime, ws.HugePages)
		}
	}
}
