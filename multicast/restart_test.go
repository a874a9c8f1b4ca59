package multicast

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// restartGroup crashes every replica of group g at once (their nodes
// closed: the mem fabric's crash) and starts each again on a new node of
// the same id, as a new group with empty memory (StartNew): it no longer
// knows any client's registration or ring positions.
func (c *testCluster) restartGroup(tb testing.TB, g tree.Group) {
	tb.Helper()
	k := 0
	var idx []int
	for gg, ms := range c.spec.members {
		for range ms {
			if tree.Group(gg) == g {
				idx = append(idx, k)
			}
			k++
		}
	}
	for _, i := range idx {
		c.hs[i].Remove()
		c.reps[i].Close()
	}
	for _, id := range c.spec.members[g] {
		c.nodes[id].Close()
	}
	for j, i := range idx {
		id := c.spec.members[g][j]
		n, err := c.memf.NewNode(id)
		if err != nil {
			tb.Fatal(err)
		}
		c.nodes[id] = n
		bc := c.spec.bcast
		bc.Self, bc.Start = id, broadcast.StartNew
		r, err := New(Config{Group: g, Tree: c.spec.tree, Members: c.spec.members, ClientNodes: c.spec.cnodes, Broadcast: bc}, n, nopFSM{}, &broadcast.MemStable{})
		if err != nil {
			tb.Fatal(err)
		}
		c.reps[i] = r
		c.hs[i] = c.pg.Add(r, n)
	}
}

// TestCallsEndWhenWholeGroupRestarts: a started client's calls under way
// to a group whose every replica restarts with empty memory end with
// ErrRestarted, not at their deadline, and the client, under a new
// incarnation, is registered again by that group and by the other one:
// new calls to both succeed. Without the restart watch the restarted group
// ignores the client's messages for good (it registered no incarnation of
// it) and the calls wait for their deadline.
func TestCallsEndWhenWholeGroupRestarts(t *testing.T) {
	tr, err := tree.Parse("0:1")
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, clusterSpec{tree: tr, members: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, cnodes: []rdma.NodeID{100},
		bcast: broadcast.Config{RingSize: 64 << 10}})
	c.waitLeaders(t)
	cl := c.client(t, 0, 100)
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	for g := range tree.Group(2) {
		if _, err := cl.Do(ctx, tree.Of(g), []byte("warm")); err != nil {
			t.Fatalf("warm-up call to group %d: %v", g, err)
		}
	}
	inc := cl.cfg.Inc

	// Calls to group 1 under way while its replicas are paused, then all
	// crash and come back empty.
	for i := 3; i < 6; i++ { // group 1's replicas
		c.hs[i].Pause()
	}
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = cl.Do(ctx, tree.Of(1), []byte("under way")) })
	}
	deadline := time.Now().Add(10 * time.Second)
	for cl.Outstanding() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls outstanding, want %d", cl.Outstanding(), n)
		}
		time.Sleep(time.Millisecond)
	}
	c.restartGroup(t, 1)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatalf("calls under way to group 1 still waiting 30 s after it restarted whole (their context lasts 2 minutes): %v", errs)
	}
	for i, err := range errs {
		if !errors.Is(err, ErrRestarted) {
			t.Errorf("call %d: %v, want ErrRestarted", i, err)
		}
	}
	if cl.Restarts() != 1 || cl.cfg.Inc <= inc {
		t.Errorf("restarts %d, incarnation %d (was %d): want one new incarnation", cl.Restarts(), cl.cfg.Inc, inc)
	}
	c.waitLeaders(t)
	for g := range tree.Group(2) {
		for range 20 {
			if _, err := cl.Do(ctx, tree.Of(g), []byte("after")); err != nil {
				t.Fatalf("call to group %d after the restart: %v", g, err)
			}
		}
	}
}
