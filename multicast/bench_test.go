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
