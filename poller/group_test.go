package poller_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/regions"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

const testWait = 30 * time.Second

// seqFSM records the entries it applies.
type seqFSM struct {
	mu  sync.Mutex
	seq []string
}

func (f *seqFSM) Apply(e broadcast.Entry) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq = append(f.seq, string(e.Data))
	return nil
}

func (f *seqFSM) Snapshot() (broadcast.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return broadcast.BytesSnapshot([]byte(fmt.Sprint(len(f.seq)))), nil
}

func (f *seqFSM) Restore([]byte) error { return nil }

func (f *seqFSM) copy() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seq...)
}

// countTask counts the Polls of a replica.
type countTask struct {
	*broadcast.Replica
	polls atomic.Int64
}

func (c *countTask) Poll(now time.Duration) bool {
	c.polls.Add(1)
	return c.Replica.Poll(now)
}

// openNodes opens nodes 1..n on fabric ("mem" or "shm").
func openNodes(t *testing.T, fabric string, n int) []rdma.Node {
	var nodes []rdma.Node
	var mf *mem.Fabric
	var dir string
	if fabric == "mem" {
		mf = mem.New(mem.Options{})
	} else {
		var err error
		if dir, err = os.MkdirTemp("/dev/shm", "rdmakv-pollertest-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	for id := rdma.NodeID(1); id <= rdma.NodeID(n); id++ {
		var node rdma.Node
		var err error
		if mf != nil {
			node, err = mf.NewNode(id)
		} else {
			node, err = shm.Open(id, shm.Options{Dir: dir, Cluster: "pt"})
		}
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	return nodes
}

// TestGroupSeveralGroups: node k runs replica k of every group (each with
// its own RegionBase) and a Group of pollers owns them all, so a poller
// owns replicas of several groups and several nodes. Proposals made
// concurrently to every group at every member are delivered in the same
// order within each group and only there; once the load stops, the pollers
// park: each replica is polled about as often as its heartbeats ask, and
// most parks end by a ring or a deadline, not in a loop.
func TestGroupSeveralGroups(t *testing.T) {
	for _, tc := range []struct {
		fabric  string
		pollers int
	}{{"mem", 2}, {"shm", 2}, {"shm", 1}} {
		t.Run(fmt.Sprintf("%s/pollers=%d", tc.fabric, tc.pollers), func(t *testing.T) {
			severalGroups(t, tc.fabric, tc.pollers)
		})
	}
}

func severalGroups(t *testing.T, fabric string, pollers int) {
	const groups, per = 3, 15
	hb := 5 * time.Millisecond
	nodes := openNodes(t, fabric, 3)
	ids := []rdma.NodeID{1, 2, 3}
	g := poller.NewGroup(poller.GroupConfig{Pollers: pollers})
	type member struct {
		r   *countTask
		fsm *seqFSM
	}
	ms := make([][]member, groups)
	var all []*broadcast.Replica
	for k, node := range nodes {
		for gr := range groups {
			fsm := &seqFSM{}
			cfg := broadcast.Config{Self: node.ID(), Members: ids, Start: broadcast.StartNew, RegionBase: regions.Broadcast(uint32(gr)),
				RingSize: 64 << 10, HeartbeatInterval: hb, ElectionTimeout: 200 * time.Millisecond, Seed: uint64(gr*10 + k + 1)}
			r, err := broadcast.New(cfg, node, fsm, &broadcast.MemStable{})
			if err != nil {
				t.Fatalf("group %d at node %d: %v", gr, node.ID(), err)
			}
			ct := &countTask{Replica: r}
			ms[gr] = append(ms[gr], member{ct, fsm})
			all = append(all, r)
			g.Add(ct, node)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(testWait):
			t.Error("Run did not return")
			return
		}
		for _, r := range all {
			r.Close()
		}
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i, st := range g.Stats() {
		if st.Tasks != 9/pollers && pollers <= 3 && 9%pollers == 0 {
			t.Errorf("poller %d has %d tasks, want %d (least loaded)", i, st.Tasks, 9/pollers)
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, groups*len(ids))
	for gr := range groups {
		for k := range ids {
			wg.Go(func() {
				for i := range per {
					d := fmt.Sprintf("g%d-n%d-%d", gr, ids[k], i)
					p := ms[gr][k].r.Propose([]byte(d))
					pctx, pc := context.WithTimeout(ctx, testWait)
					_, err := p.Wait(pctx)
					pc()
					if err != nil {
						errs <- fmt.Errorf("%s: %w", d, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for gr := range groups {
		deadline := time.Now().Add(testWait)
		for {
			a := ms[gr][0].fsm.copy()
			err := error(nil)
			for _, m := range ms[gr][1:] {
				if b := m.fsm.copy(); fmt.Sprint(a) != fmt.Sprint(b) {
					err = fmt.Errorf("%d and %d entries, or another order", len(a), len(b))
				}
			}
			if err == nil && len(a) != per*len(ids) {
				err = fmt.Errorf("%d entries", len(a))
			}
			for _, d := range a {
				if want := fmt.Sprintf("g%d-", gr); d[:len(want)] != want {
					t.Fatalf("group %d delivered %q", gr, d)
				}
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %d: %v", gr, err)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// Idle: heartbeats every 5 ms make ~20 Polls a replica in 100 ms
	// (plus the acks'); a spinning poller makes 10^4-10^5.
	time.Sleep(20 * time.Millisecond)
	before := g.Stats()
	var polls0 []int64
	for gr := range groups {
		for _, m := range ms[gr] {
			polls0 = append(polls0, m.r.polls.Load())
		}
	}
	time.Sleep(100 * time.Millisecond)
	i := 0
	for gr := range groups {
		for k, m := range ms[gr] {
			if d := m.r.polls.Load() - polls0[i]; d > 2000 {
				t.Errorf("replica %d of group %d polled %d times in 100 ms idle: its poller spins", k, gr, d)
			}
			i++
		}
	}
	for p, st := range g.Stats() {
		passes := st.Passes - before[p].Passes
		parks := st.Parks - before[p].Parks + st.SpinHits - before[p].SpinHits
		t.Logf("poller %d idle: %d passes, %d parks, %d spins", p, passes, st.Parks-before[p].Parks, st.Spins-before[p].Spins)
		if passes > 8 && parks*4 < passes {
			t.Errorf("poller %d: %d passes but only %d parks or spin hits in 100 ms idle: it loops without waiting", p, passes, parks)
		}
	}
}
