package broadcast

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// syncFSM is a logFSM readable from the test goroutine.
type syncFSM struct {
	mu sync.Mutex
	logFSM
}

func (f *syncFSM) Apply(index uint64, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logFSM.Apply(index, data)
}

func (f *syncFSM) Snapshot() ([]byte, error) {
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

// rtMember is one replica run by a Driver on the mem fabric.
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
	d := NewDriver(m.r, m.node.Doorbell())
	go func() {
		defer close(m.done)
		d.Run(ctx)
	}()
}

func (m *rtMember) stop() {
	m.cancel()
	<-m.done
	m.r.Close()
	m.node.Close()
}

// TestDriverRealTime runs three replicas in real time on the mem fabric:
// concurrent proposals at every member, a leader crash, and a restart with
// empty memory that catches up; every member ends with the same sequence
// and every proposal learns its index.
func TestDriverRealTime(t *testing.T) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	cfg := Config{Members: ids, RingSize: 64 << 10, HeartbeatInterval: time.Millisecond,
		ElectionTimeout: 60 * time.Millisecond, MaxLogEntries: 64}
	ms := make([]*rtMember, len(ids))
	for i, id := range ids {
		ms[i] = &rtMember{id: id, stable: &MemStable{}}
		startMember(t, f, cfg, ms[i])
	}
	defer func() {
		for _, m := range ms {
			if m.done != nil {
				m.stop()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

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
					i, err := m.r.Propose([]byte(d)).Wait(ctx)
					if err != nil {
						errs <- fmt.Errorf("%s: %w", d, err)
						return
					}
					if got := m.fsm.seqCopy(); int(i) > len(got) || got[i-1] != d {
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
	leader.stop()
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, b, c := ms[0].fsm.seqCopy(), ms[1].fsm.seqCopy(), ms[2].fsm.seqCopy()
		if len(a) == 650 && fmt.Sprint(a) == fmt.Sprint(b) && fmt.Sprint(b) == fmt.Sprint(c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members did not converge: %d %d %d entries; statuses %+v %+v %+v", len(a), len(b), len(c),
				ms[0].r.Status(), ms[1].r.Status(), ms[2].r.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := leader.r.Status(); s.Counters.SnapshotsRestored == 0 {
		t.Logf("restarted member caught up by diff, not snapshot: %+v", s.Counters)
	}
}
