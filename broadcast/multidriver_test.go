package broadcast

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// countingPoller counts the Polls a driver makes.
type countingPoller struct {
	*Replica
	polls atomic.Int64
}

func (p *countingPoller) Poll(now time.Duration) bool {
	p.polls.Add(1)
	return p.Replica.Poll(now)
}

// TestMultiDriver runs three groups on three nodes of the mem fabric: each
// node holds one replica of every group (RegionBase regions.Broadcast(g))
// and one MultiDriver polls them all on the node's one doorbell.
// Proposals made concurrently to every group at every member are
// delivered in the same order within each group and only there; once
// the load stops, an idle driver parks (it does not spin): over 100 ms it
// polls about as often as the heartbeat deadlines ask, not millions of
// times.
func TestMultiDriver(t *testing.T) {
	const groups = 3
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	hb := 5 * time.Millisecond
	type member struct {
		r   *countingPoller
		fsm *syncFSM
	}
	ms := make([][]member, groups) // [group][member]
	var counters [][]*countingPoller
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	var all []*Replica
	for k, id := range ids {
		node, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		var ps []Poller
		var cs []*countingPoller
		for g := range groups {
			fsm := &syncFSM{}
			cfg := Config{Self: id, Members: ids, Start: StartNew, RegionBase: regions.Broadcast(uint32(g)),
				RingSize: 64 << 10, HeartbeatInterval: hb, ElectionTimeout: 200 * time.Millisecond, Seed: uint64(g*10 + k + 1)}
			r, err := New(cfg, node, fsm, &MemStable{})
			if err != nil {
				t.Fatalf("group %d at node %d: %v", g, id, err)
			}
			cp := &countingPoller{Replica: r}
			ms[g] = append(ms[g], member{cp, fsm})
			ps = append(ps, cp)
			cs = append(cs, cp)
			all = append(all, r)
		}
		counters = append(counters, cs)
		var rs []Poller
		for _, c := range cs {
			rs = append(rs, c.Replica)
		}
		if park := NewMultiDriver(node.Doorbell(), rs...).MaxPark; park != hb {
			t.Errorf("MaxPark %v, want the replicas' heartbeat interval %v", park, hb)
		}
		// The counting wrappers embed their Replica, so they report its
		// heartbeat (Heartbeater), as a layer wrapping a Replica does; a
		// poller that reports none leaves the default.
		d := NewMultiDriver(node.Doorbell(), ps...)
		if d.MaxPark != hb {
			t.Errorf("MaxPark %v for pollers wrapping Replicas, want their heartbeat interval %v", d.MaxPark, hb)
		}
		if park := NewMultiDriver(node.Doorbell(), plainPoller{}).MaxPark; park != DefaultHeartbeatInterval {
			t.Errorf("MaxPark %v for a poller with no heartbeat, want %v", park, DefaultHeartbeatInterval)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Run(ctx)
		}()
	}
	defer func() {
		cancel()
		if !waitGroup(&wg, testWait) {
			t.Error("drivers did not return")
			return
		}
		for _, r := range all {
			r.Close()
		}
	}()

	// Load: every member of every group proposes concurrently.
	const per = 20
	var lwg sync.WaitGroup
	errs := make(chan error, groups*len(ids))
	for g := range groups {
		for k := range ids {
			lwg.Add(1)
			go func() {
				defer lwg.Done()
				for i := range per {
					d := fmt.Sprintf("g%d-n%d-%d", g, ids[k], i)
					p := ms[g][k].r.Propose([]byte(d))
					if err := awaitResolved(p, d, testWait, all...); err != nil {
						errs <- err
						return
					}
					if _, err := p.Result(); err != nil {
						errs <- fmt.Errorf("%s: %w", d, err)
						return
					}
				}
			}()
		}
	}
	lwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for g := range groups {
		waitCond(t, fmt.Sprintf("group %d's members deliver the same %d entries", g, per*len(ids)), testWait, func() error {
			a := ms[g][0].fsm.seqCopy()
			for _, m := range ms[g][1:] {
				if b := m.fsm.seqCopy(); fmt.Sprint(a) != fmt.Sprint(b) {
					return fmt.Errorf("%d and %d entries, or another order", len(a), len(b))
				}
			}
			if len(a) != per*len(ids) {
				return fmt.Errorf("%d entries", len(a))
			}
			prefix := fmt.Sprintf("g%d-", g)
			for _, d := range a {
				if d[:len(prefix)] != prefix {
					return fmt.Errorf("group %d delivered %q", g, d)
				}
			}
			return nil
		}, all...)
	}

	// Idle: the drivers park. Heartbeat deadlines every 5 ms for 3
	// replicas each make about 60 wake-ups of 3 Polls in 100 ms; a
	// spinning driver makes hundreds of thousands.
	time.Sleep(20 * time.Millisecond)
	before := make([]int64, len(ids))
	for k, cs := range counters {
		for _, c := range cs {
			before[k] += c.polls.Load()
		}
	}
	time.Sleep(100 * time.Millisecond)
	for k, cs := range counters {
		var n int64
		for _, c := range cs {
			n += c.polls.Load()
		}
		if d := n - before[k]; d > 2000 {
			t.Errorf("node %d's idle driver polled %d times in 100 ms: it spins", ids[k], d)
		} else {
			t.Logf("node %d's idle driver polled %d times in 100 ms", ids[k], d)
		}
	}
}

// plainPoller reports no heartbeat interval.
type plainPoller struct{}

func (plainPoller) Poll(time.Duration) bool     { return false }
func (plainPoller) NextDeadline() time.Duration { return 1<<63 - 1 }
