package server_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestDefaultPollers: one poller per core, at most one per group, at
// least one; a process that leaves a core to its clients has one fewer.
func TestDefaultPollers(t *testing.T) {
	for _, c := range []struct {
		procs, groups int
		clientCore    bool
		want          int
	}{
		{2, 2, false, 2}, {2, 2, true, 1}, {1, 2, true, 1}, {1, 1, false, 1},
		{4, 2, true, 2}, {4, 8, true, 3}, {4, 8, false, 4}, {8, 0, true, 1},
	} {
		if got := server.DefaultPollers(c.procs, c.groups, c.clientCore); got != c.want {
			t.Errorf("DefaultPollers(%d cores, %d groups, client core %v) = %d, want %d", c.procs, c.groups, c.clientCore, got, c.want)
		}
	}
}

// TestOneWriterOnePoller: the embedded cluster's layout (two groups in
// one process on shm, the spare P on) at GOMAXPROCS 2 runs one poller,
// which leaves the other core to the clients: one writer's stream then
// has one poller spinning for it instead of two pollers and the writer
// wanting the two cores (issue 17: a put to a parked poller's group
// waited for a core). The poller has its spare P from the start: it
// holds while the stream flows, and the stream never switches GOMAXPROCS
// (each switch a stop of the world). With the spare P off the process
// keeps one poller per group, as before.
func TestOneWriterOnePoller(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-onepoller-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: time.Second}
	for k, spare := range []bool{true, false} {
		m := &cluster.Map{Name: fmt.Sprintf("onepoller%d", k), Fabric: "shm", ShmDir: dir,
			Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
		p, err := server.StartProcess(server.ProcessConfig{Map: m, Broadcast: bc, SpareP: spare})
		if err != nil {
			t.Fatal(err)
		}
		want := 1
		if !spare {
			want = 2
		}
		if n := len(p.PollerStats()); n != want {
			p.Close()
			t.Fatalf("spare P %v, 2 groups at GOMAXPROCS 2: %d pollers, want %d", spare, n, want)
		}
		if !spare {
			p.Close()
			continue
		}
		c := openClient(t, p, m)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		groups := map[uint32]bool{}
		for i := range 100 {
			key := fmt.Appendf(nil, "k%d", i)
			groups[m.GroupOf(key)] = true
			if _, err := c.Put(ctx, key, []byte("v")); err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
		}
		cancel()
		sp, holding := server.ProcessSpare(p)
		c.Close()
		p.Close()
		if len(groups) != 2 {
			t.Fatalf("the puts went to groups %v, want both", groups)
		}
		if sp.OnDemand || sp.Switches != 0 || sp.Procs != 2 || !holding {
			t.Errorf("one writer's stream: spare P %+v, holding %v; want no switch, GOMAXPROCS 2, held parks (the spare P there from the start)", sp, holding)
		}
	}
}
