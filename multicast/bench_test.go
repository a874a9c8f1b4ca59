package multicast

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// BenchmarkSingleGroupW1: one group of 3 replicas on the mem fabric, each
// on its own node and goroutine, and one client with one message
// outstanding: the latency of a single-group multicast (client write to
// reply). Reports each replica's Polls per message.
func BenchmarkSingleGroupW1(b *testing.B) {
	tr, _ := tree.Parse("0:")
	c := startCluster(b, clusterSpec{tree: tr, members: [][]rdma.NodeID{{1, 2, 3}}, cnodes: []rdma.NodeID{100},
		bcast: broadcast.Config{ElectionTimeout: 250 * time.Millisecond}})
	c.waitLeaders(b)
	cr := c.client(b, 0, 100)
	ctx, reps, counts := c.ctx, c.reps, c.counts
	payload := make([]byte, 64)
	for range 1000 { // warm up
		if _, err := cr.Do(ctx, tree.Of(0), payload); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range counts {
		c.n.Store(0)
		c.progr.Store(0)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := cr.Do(ctx, tree.Of(0), payload); err != nil {
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
// replica of each group per node, all on one poller.Group, waits for
// both leaders, and returns how many Polls each node's replicas made in
// 200 ms with no client.
func idlePolls(t *testing.T, knobs testingKnobs) (polls, spins []int64) {
	tr, _ := tree.Parse("0:1")
	c := startCluster(t, clusterSpec{tree: tr, members: [][]rdma.NodeID{{1, 2, 3}, {1, 2, 3}}, cnodes: []rdma.NodeID{100}, knobs: knobs})
	c.waitLeaders(t)
	time.Sleep(50 * time.Millisecond) // settle
	for _, cp := range c.counts {
		cp.n.Store(0)
		cp.spins.Store(0)
	}
	time.Sleep(200 * time.Millisecond)
	for _, cp := range c.counts {
		polls = append(polls, cp.n.Load())
		spins = append(spins, cp.spins.Load())
	}
	return polls, spins
}

// TestIdleParks: an idle cluster does not burn the CPU: with nothing to
// order, each replica is polled about once per heartbeat (1 ms), not in a
// loop, and a Poll that finds nothing to do leaves the replica's next
// deadline in the future (so its driver parks). The spinDeadline planted
// bug (a leader always due) is caught by the second property, which counts
// decisions, not time: a loaded machine (or -race) slows a spinning
// replica's Polls but does not make its driver park.
func TestIdleParks(t *testing.T) {
	const bound = 2000 // 200 ms idle: ~200-400 Polls at the 1 ms heartbeat; a spinning replica makes 10^4-10^5
	check := func(polls, spins []int64) error {
		for i, n := range polls {
			if n > bound {
				return fmt.Errorf("replica %d Polled %d times in 200 ms idle (bound %d): it spins", i, n, bound)
			}
			if spins[i] > 2 && spins[i]*4 > n {
				return fmt.Errorf("replica %d: %d of its %d idle Polls did nothing and left it due at once: its driver never parks", i, spins[i], n)
			}
		}
		return nil
	}
	polls, spins := idlePolls(t, testingKnobs{})
	t.Logf("Polls per replica in 200 ms idle: %v, of which spins %v", polls, spins)
	if err := check(polls, spins); err != nil {
		t.Fatal(err)
	}
	polls, spins = idlePolls(t, testingKnobs{spinDeadline: true})
	t.Logf("with the spinning-deadline mutant: Polls %v, spins %v", polls, spins)
	if check(polls, spins) == nil {
		t.Fatal("the spinning-deadline mutant passed the idle checks")
	}
}

// BenchmarkLeaderIdlePoll: the cost of one Poll of a group's leader with
// nothing to order, by the number of client slots the cluster configures
// (one of them registered): what every pass of a busy poller pays for
// the group when its rings hold nothing new (scanHeaders, scan).
func BenchmarkLeaderIdlePoll(b *testing.B) {
	for _, slots := range []int{32, 1024} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			tr, _ := tree.Parse("0:")
			cnodes := make([]rdma.NodeID, slots)
			for k := range cnodes {
				cnodes[k] = rdma.NodeID(100 + k)
			}
			c := startCluster(b, clusterSpec{tree: tr, members: [][]rdma.NodeID{{1}}, cnodes: cnodes,
				bcast: broadcast.Config{ElectionTimeout: 50 * time.Millisecond}})
			c.waitLeaders(b)
			c.client(b, 0, 100)
			r := c.reps[0]
			c.hs[0].Pause()
			defer c.hs[0].Resume()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			now := c.pg.Now()
			r.Poll(now)
			cpu0 := threadCPU()
			b.ResetTimer()
			for i := range b.N {
				if i%64 == 0 {
					now = c.pg.Now()
				}
				r.Poll(now)
			}
			b.StopTimer()
			if _, ok := r.Broadcast().Leading(); !ok {
				b.Fatal("not leading")
			}
			b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// threadCPU is the calling thread's CPU time in ns (a loaded machine
// inflates it less than wall time).
func threadCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return ru.Utime.Nano() + ru.Stime.Nano()
}
