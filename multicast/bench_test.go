package multicast

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// countPolls wraps a Poller and counts its Polls and the ones that made
// progress.
type countPolls struct {
	p        broadcast.Poller
	n, progr atomic.Int64
}

func (c *countPolls) Poll(now time.Duration) bool {
	c.n.Add(1)
	ok := c.p.Poll(now)
	if ok {
		c.progr.Add(1)
	}
	return ok
}

func (c *countPolls) NextDeadline() time.Duration { return c.p.NextDeadline() }

// BenchmarkSingleGroupW1: one group of 3 replicas on the mem fabric, each
// on its own node and goroutine, and one client with one message
// outstanding: the latency of a single-group multicast (client write to
// reply). Reports each replica's Polls per message.
func BenchmarkSingleGroupW1(b *testing.B) {
	tr, _ := tree.Parse("0:")
	f := mem.New(mem.Options{})
	members := [][]rdma.NodeID{{1, 2, 3}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reps []*Replica
	var counts []*countPolls
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range reps {
			r.Close()
		}
	}()
	for _, id := range members[0] {
		node, err := f.NewNode(id)
		if err != nil {
			b.Fatal(err)
		}
		r, err := New(Config{Group: 0, Tree: tr, Members: members, ClientNodes: []rdma.NodeID{100},
			Broadcast: broadcast.Config{Self: id, Start: broadcast.StartNew, ElectionTimeout: 250 * time.Millisecond}}, node, nopFSM{}, &broadcast.MemStable{})
		if err != nil {
			b.Fatal(err)
		}
		reps = append(reps, r)
		c := &countPolls{p: r}
		counts = append(counts, c)
		d := broadcast.NewMultiDriver(node.Doorbell(), c)
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(ctx) }()
	}
	node, err := f.NewNode(100)
	if err != nil {
		b.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	cr, err := StartClient(sctx, ClientConfig{Slot: 0, Inc: 1, Tree: tr, Members: members}, node)
	scancel()
	if err != nil {
		b.Fatal(err)
	}
	defer cr.Close()
	payload := make([]byte, 64)
	for range 1000 { // warm up
		if _, err := cr.Multicast(ctx, tree.Of(0), payload); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range counts {
		c.n.Store(0)
		c.progr.Store(0)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := cr.Multicast(ctx, tree.Of(0), payload); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for i, c := range counts {
		_, lead := reps[i].Broadcast().Leading()
		name := "follower"
		if lead {
			name = "leader"
		}
		b.ReportMetric(float64(c.n.Load())/float64(b.N), name+string(rune('0'+i))+"-polls/msg")
		b.ReportMetric(float64(c.progr.Load())/float64(b.N), name+string(rune('0'+i))+"-progress/msg")
	}
}

// idlePolls runs 2 groups (tree 0:1) of 3 replicas on the mem fabric, one
// MultiDriver per node (one replica of each group per node), waits for
// both leaders, and returns how many Polls each node's replicas made in
// 200 ms with no client.
func idlePolls(t *testing.T, mutant int) []int64 {
	tr, _ := tree.Parse("0:1")
	f := mem.New(mem.Options{})
	members := [][]rdma.NodeID{{1, 2, 3}, {1, 2, 3}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reps []*Replica
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range reps {
			r.Close()
		}
	}()
	var counts []*countPolls
	for _, id := range members[0] {
		node, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		var ps []broadcast.Poller
		for g := range members {
			r, err := New(Config{Group: tree.Group(g), Tree: tr, Members: members, ClientNodes: []rdma.NodeID{100},
				Broadcast: broadcast.Config{Self: id, Start: broadcast.StartNew}}, node, nopFSM{}, &broadcast.MemStable{})
			if err != nil {
				t.Fatal(err)
			}
			r.mutant = mutant
			reps = append(reps, r)
			c := &countPolls{p: r}
			counts = append(counts, c)
			ps = append(ps, c)
		}
		d := broadcast.NewMultiDriver(node.Doorbell(), ps...)
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(ctx) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaders := 0
		for _, r := range reps {
			if _, ok := r.Broadcast().Leading(); ok {
				leaders++
			}
		}
		if leaders == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no leaders after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // settle
	for _, c := range counts {
		c.n.Store(0)
	}
	time.Sleep(200 * time.Millisecond)
	var out []int64
	for _, c := range counts {
		out = append(out, c.n.Load())
	}
	return out
}

// TestIdleParks: an idle cluster does not burn the CPU: with nothing to
// order, each replica is polled about once per heartbeat (1 ms), not in a
// loop. The mutSpinDeadline planted bug (a leader always due) is caught.
func TestIdleParks(t *testing.T) {
	const bound = 2000 // 200 ms idle: ~200-400 Polls at the 1 ms heartbeat; a spinning replica makes 10^4-10^5
	idle := idlePolls(t, 0)
	t.Logf("Polls per replica in 200 ms idle: %v", idle)
	for _, n := range idle {
		if n > bound {
			t.Fatalf("idle replicas Polled %d times in 200 ms (bound %d): a replica spins", n, bound)
		}
	}
	worst := int64(0)
	spun := idlePolls(t, mutSpinDeadline)
	t.Logf("with the spinning-deadline mutant: %v", spun)
	for _, n := range spun {
		worst = max(worst, n)
	}
	if worst <= bound {
		t.Fatalf("the spinning-deadline mutant Polled at most %d times in 200 ms: the bound %d does not catch it", worst, bound)
	}
}
