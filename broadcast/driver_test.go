package broadcast

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// syncFSM is a logFSM readable from the test goroutine.
type syncFSM struct {
	mu sync.Mutex
	logFSM
}

func (f *syncFSM) Apply(e Entry) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logFSM.Apply(e)
}

func (f *syncFSM) Snapshot() (FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logFSM.Snapshot()
}

func (f *syncFSM) Restore(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logFSM.Restore(b)
}

func (f *syncFSM) seqCopy() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.seq))
	for i, d := range f.seq {
		out[i] = string(d)
	}
	return out
}

// runPolled polls r in real time until ctx ends, as a process does: on a
// poller.Group (of one poller) parked on node's doorbell.
func runPolled(ctx context.Context, r *Replica, node rdma.Node) error {
	g := poller.NewGroup(poller.GroupConfig{Pollers: 1})
	g.Add(r, node)
	return g.Run(ctx)
}

// rtMember is one replica polled in real time on the mem fabric.
type rtMember struct {
	id     rdma.NodeID
	node   *mem.Node
	r      *Replica
	fsm    *syncFSM
	stable *MemStable
	cancel context.CancelFunc
	done   chan struct{}
}

func startMember(t testing.TB, f *mem.Fabric, cfg Config, m *rtMember) {
	var err error
	if m.node, err = f.NewNode(m.id); err != nil {
		panic(err)
	}
	cfg.Self = m.id
	m.fsm = &syncFSM{}
	if m.r, err = New(cfg, m.node, m.fsm, m.stable); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		runPolled(ctx, m.r, m.node)
	}()
}

// stop cancels the member's driver and, once it returned, closes the
// replica and the node. A driver that does not return within testWait
// panics (benchmarks use stop too) rather than hang.
func (m *rtMember) stop() {
	if err := m.stopWithin(testWait); err != nil {
		panic(err)
	}
}

// stopWithin is stop that returns an error, leaving the replica open, if
// the driver has not returned within d of its cancel.
func (m *rtMember) stopWithin(d time.Duration) error {
	m.cancel()
	select {
	case <-m.done:
	case <-time.After(d):
		return fmt.Errorf("node %d: the driver did not return within %v of its cancel", m.id, d)
	}
	m.r.Close()
	m.node.Close()
	return nil
}

// TestDriverRealTime runs three replicas in real time on the mem fabric:
// concurrent proposals at every member, a leader crash, and a restart with
// empty memory that catches up; every member ends with the same sequence
// and every proposal learns its index.
func TestDriverRealTime(t *testing.T) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	cfg := Config{Members: ids, Start: StartNew, RingSize: 64 << 10, HeartbeatInterval: time.Millisecond,
		ElectionTimeout: 60 * time.Millisecond, MaxLogEntries: 64}
	ms := make([]*rtMember, len(ids))
	for i, id := range ids {
		ms[i] = &rtMember{id: id, stable: &MemStable{}}
		startMember(t, f, cfg, ms[i])
	}
	defer func() {
		for _, m := range ms {
			if m.done != nil {
				if err := m.stopWithin(testWait); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	replicas := func() []*Replica {
		var rs []*Replica
		for _, m := range ms {
			rs = append(rs, m.r)
		}
		return rs
	}

	propose := func(round, per int, at []*rtMember) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, len(at))
		for _, m := range at {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < per; k++ {
					d := fmt.Sprintf("r%d-n%d-%d", round, m.id, k)
					p := m.r.Propose([]byte(d))
					if err := awaitResolved(p, fmt.Sprintf("%s at node %d", d, m.id), testWait, replicas()...); err != nil {
						errs <- err
						return
					}
					i, err := p.Result()
					if err != nil {
						errs <- fmt.Errorf("%s: %w", d, err)
						return
					}
					got := m.fsm.seqCopy()
					if i == 0 {
						// Delivered, but this member caught up through a
						// snapshot that held it and does not know where
						// (Proposal.Result): it must be in the sequence.
						if !slices.Contains(got, d) {
							errs <- fmt.Errorf("%s reported delivered (index 0: through a snapshot), not in the sequence", d)
							return
						}
						continue
					}
					if int(i) > len(got) || got[i-1] != d {
						errs <- fmt.Errorf("%s reported at index %d, not delivered there", d, i)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	propose(0, 100, ms)

	// Crash the leader; the others elect and keep going.
	var leader *rtMember
	for _, m := range ms {
		if m.r.Status().Role == Leader {
			leader = m
		}
	}
	if leader == nil {
		t.Fatal("no leader after the first round")
	}
	if err := leader.stopWithin(testWait); err != nil {
		t.Fatal(err)
	}
	var rest []*rtMember
	for _, m := range ms {
		if m != leader {
			rest = append(rest, m)
		}
	}
	propose(1, 100, rest)

	// Restart it with empty memory and its stable state: it catches up.
	startMember(t, f, cfg, leader)
	propose(2, 50, ms)
	waitCond(t, "all three members deliver the same 650 entries", testWait, func() error {
		a, b, c := ms[0].fsm.seqCopy(), ms[1].fsm.seqCopy(), ms[2].fsm.seqCopy()
		if len(a) == 650 && fmt.Sprint(a) == fmt.Sprint(b) && fmt.Sprint(b) == fmt.Sprint(c) {
			return nil
		}
		return fmt.Errorf("%d, %d, %d entries", len(a), len(b), len(c))
	}, replicas()...)
	if s := leader.r.Status(); s.Counters.SnapshotsRestored == 0 {
		t.Logf("restarted member caught up by diff, not snapshot: %+v", s.Counters)
	}
}
