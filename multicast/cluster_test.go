package multicast

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// clusterSpec describes a real-time test cluster: every group's replicas
// on the nodes members names (a node may host several groups' replicas),
// all polled by one poller.Group (as a process runs them), plus the client
// nodes, on the mem or tcp fabric.
type clusterSpec struct {
	fabric  string // "mem" (default) or "tcp"
	tree    *tree.Tree
	members [][]rdma.NodeID
	cnodes  []rdma.NodeID // ClientNodes
	extra   []rdma.NodeID // nodes to open that are not listed clients
	app     func(g tree.Group, i int) broadcast.FSM
	bcast   broadcast.Config // template: Self and Start are set per replica
	knobs   testingKnobs     // planted bugs
}

// testCluster is a running clusterSpec; its Cleanup stops the pollers
// and closes every replica and node.
type testCluster struct {
	spec   clusterSpec
	nodes  map[rdma.NodeID]rdma.Node
	reps   []*Replica
	counts []*countPolls    // one per replica, in reps order
	hs     []*poller.Handle // one per replica, in reps order
	ctx    context.Context
	memf   *mem.Fabric   // the mem fabric (nil on tcp)
	pg     *poller.Group // polls the replicas
}

// countPolls wraps a poller.Task and counts its Polls, the ones that made
// progress, and the spins: Polls that made none and left the replica due
// at once (NextDeadline not after the Poll's now), so that its poller
// polls again without parking.
type countPolls struct {
	p               poller.Task
	n, progr, spins atomic.Int64
}

func (c *countPolls) Poll(now time.Duration) bool {
	c.n.Add(1)
	ok := c.p.Poll(now)
	if ok {
		c.progr.Add(1)
	} else if c.p.NextDeadline() <= now {
		c.spins.Add(1)
	}
	return ok
}

func (c *countPolls) NextDeadline() time.Duration { return c.p.NextDeadline() }

const testSecret = "multicast test cluster secret, at least 32 bytes"

// hangBound is how long a wait of tb's may last before it counts as a
// hang, not a slow machine: nine tenths of what is left until the test
// binary's deadline (go test -timeout; make unit gives 30 m), so that a
// hang fails with the test's own message before the binary's timeout
// panics. A bound of seconds is a timing assertion: under -race at load
// 35 (2 cores) a tcp cluster needed more than 10 s for what takes
// milliseconds alone. Without a deadline (a benchmark, -timeout 0): an
// hour.
func hangBound(tb testing.TB) time.Duration {
	if d, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			return time.Until(dl) * 9 / 10
		}
	}
	return time.Hour
}

func startCluster(tb testing.TB, sp clusterSpec) *testCluster {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &testCluster{spec: sp, nodes: map[rdma.NodeID]rdma.Node{}, ctx: ctx}
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		cancel()
		wg.Wait()
		for _, r := range c.reps {
			r.Close()
		}
		for _, n := range c.nodes {
			n.Close()
		}
	})
	var ids []rdma.NodeID
	for _, ms := range sp.members {
		ids = append(ids, ms...)
	}
	ids = append(append(ids, sp.cnodes...), sp.extra...)
	memf := mem.New(mem.Options{})
	c.memf = memf
	for _, id := range ids {
		if c.nodes[id] != nil {
			continue
		}
		var n rdma.Node
		var err error
		switch sp.fabric {
		case "", "mem":
			n, err = memf.NewNode(id)
		case "tcp":
			n, err = tcp.Open(id, tcp.Options{Listen: "127.0.0.1:0", Secret: []byte(testSecret)})
		default:
			tb.Fatalf("fabric %q", sp.fabric)
		}
		if err != nil {
			tb.Fatal(err)
		}
		c.nodes[id] = n
	}
	if sp.fabric == "tcp" {
		for _, a := range c.nodes {
			for id, b := range c.nodes {
				a.(*tcp.Node).SetPeer(id, b.(*tcp.Node).Addr())
			}
		}
	}
	pg := poller.NewGroup(poller.GroupConfig{})
	c.pg = pg
	for g, ms := range sp.members {
		for i, id := range ms {
			bc := sp.bcast
			bc.Self, bc.Start = id, broadcast.StartNew
			var app broadcast.FSM = nopFSM{}
			if sp.app != nil {
				app = sp.app(tree.Group(g), i)
			}
			r, err := New(Config{Group: tree.Group(g), Tree: sp.tree, Members: sp.members, ClientNodes: sp.cnodes, Broadcast: bc},
				c.nodes[id], app, &broadcast.MemStable{})
			if err != nil {
				tb.Fatal(err)
			}
			r.knobs = sp.knobs
			c.reps = append(c.reps, r)
			cp := &countPolls{p: r}
			c.counts = append(c.counts, cp)
			c.hs = append(c.hs, pg.Add(cp, c.nodes[id]))
		}
	}
	wg.Go(func() { pg.Run(ctx) })
	return c
}

// waitLeaders waits until every group has a leader of a committed epoch.
func (c *testCluster) waitLeaders(tb testing.TB) {
	tb.Helper()
	bound := hangBound(tb)
	deadline := time.Now().Add(bound)
	for {
		led := map[tree.Group]bool{}
		for _, r := range c.reps {
			if _, ok := r.Broadcast().Leading(); ok {
				led[r.Group()] = true
			}
		}
		if len(led) == len(c.spec.members) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("groups led after %v: %v of %d", bound.Round(time.Second), led, len(c.spec.members))
		}
		time.Sleep(time.Millisecond)
	}
}

// client starts client slot k on node id (registered with every group).
func (c *testCluster) client(tb testing.TB, k uint32, id rdma.NodeID) *Client {
	tb.Helper()
	sctx, cancel := context.WithTimeout(c.ctx, hangBound(tb))
	defer cancel()
	cr, err := StartClient(sctx, ClientConfig{Slot: k, Inc: uint64(time.Now().UnixNano()), Tree: c.spec.tree, Members: c.spec.members}, c.nodes[id])
	if err != nil {
		tb.Fatalf("client %d: %v", k, err)
	}
	tb.Cleanup(func() { cr.Close() })
	return cr
}
