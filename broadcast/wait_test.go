package broadcast

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// testWait bounds every wait of a test on a group driven by its own
// goroutines (a proposal, a convergence, a driver's return): generous for a
// loaded 2-core machine under the race detector, far below the package
// timeout, so that a test that waits fails with a message instead of
// hanging until the package times out.
const testWait = 30 * time.Second

// awaitResolved waits up to d for p to resolve. It returns nil once p has
// resolved (p.Result then returns at once), or an error naming the
// proposal (what), the time waited and every replica's Status. With d 0, p
// must have resolved already: for tests that poll the replicas themselves,
// where nothing else would ever resolve it.
func awaitResolved(p *Proposal, what string, d time.Duration, rs ...*Replica) error {
	start := time.Now()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-p.Done():
		case <-t.C:
		}
	}
	select {
	case <-p.Done():
		return nil
	default:
	}
	return fmt.Errorf("proposal %s not resolved after %v (bound %v)%s", what, time.Since(start).Round(time.Millisecond), d, statuses(rs))
}

// waitProposal is awaitResolved that fails the test; it returns p's outcome.
func waitProposal(t testing.TB, p *Proposal, what string, d time.Duration, rs ...*Replica) (uint64, error) {
	t.Helper()
	if err := awaitResolved(p, what, d, rs...); err != nil {
		t.Fatal(err)
	}
	return p.Result()
}

// awaitCond polls check every few milliseconds for up to d. check returns
// nil once the awaited condition holds, else an error saying how far off
// it is; awaitCond returns nil, or an error with what, the time waited,
// check's last error and every replica's Status.
func awaitCond(what string, d time.Duration, check func() error, rs ...*Replica) error {
	start := time.Now()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Since(start) >= d {
			return fmt.Errorf("%s: not reached after %v (bound %v): %v%s", what, time.Since(start).Round(time.Millisecond), d, err, statuses(rs))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitCond is awaitCond that fails the test.
func waitCond(t testing.TB, what string, d time.Duration, check func() error, rs ...*Replica) {
	t.Helper()
	if err := awaitCond(what, d, check, rs...); err != nil {
		t.Fatal(err)
	}
}

// waitGroup waits up to d for wg; false if it did not finish in time.
func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func statuses(rs []*Replica) string {
	var b strings.Builder
	for _, r := range rs {
		if r != nil {
			s := r.Status()
			fmt.Fprintf(&b, "\n\tnode %d: %+v", s.Self, s)
		}
	}
	return b.String()
}

// qreplicas returns the replicas of a queued-mode cluster (crashed ones
// show their last Status).
func qreplicas(c *qcluster) []*Replica {
	var rs []*Replica
	for _, n := range c.nodes {
		rs = append(rs, n.r)
	}
	return rs
}

// TestWaitHelpersBite: a proposal made to a group without a majority (one
// replica of three running, driven in real time, with a ProposeTimeout
// that never expires) never resolves; awaitResolved gives up after its
// bound with the proposal's name, the time waited and the replica's
// Status instead of blocking, and awaitCond does the same for a condition
// that never holds. In a queued-mode cluster without a leader, bound 0
// reports the pending proposal at once.
func TestWaitHelpersBite(t *testing.T) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	n, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Self: 1, Members: ids, Start: StartNew, HeartbeatInterval: time.Millisecond,
		ElectionTimeout: 20 * time.Millisecond, ProposeTimeout: time.Hour}, n, &nopFSM{}, &MemStable{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runPolled(ctx, r, n)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
			r.Close()
			n.Close()
		case <-time.After(testWait):
			t.Errorf("the driver did not return within %v of its cancel", testWait)
		}
	}()

	const bound = 300 * time.Millisecond
	p := r.Propose([]byte("lonely"))
	start := time.Now()
	err = awaitResolved(p, `"lonely" at node 1 of 3`, bound, r)
	took := time.Since(start)
	if err == nil {
		i, perr := p.Result()
		t.Fatalf("a proposal to one replica of three resolved: index %d, %v", i, perr)
	}
	if took < bound || took > bound+testWait/2 {
		t.Errorf("awaitResolved returned after %v, want about %v", took, bound)
	}
	for _, want := range []string{`proposal "lonely" at node 1 of 3 not resolved after `, "(bound 300ms)", "node 1: {Self:1", "Role:", "Pending:1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("awaitResolved's error lacks %q:\n%v", want, err)
		}
	}
	t.Logf("awaitResolved: %v", err)

	err = awaitCond("a leader", bound, func() error {
		if s := r.Status(); s.Role != Leader {
			return fmt.Errorf("node 1 is %v", s.Role)
		}
		return nil
	}, r)
	if err == nil || !strings.Contains(err.Error(), "a leader: not reached after") || !strings.Contains(err.Error(), "node 1 is ") {
		t.Errorf("awaitCond on a condition that never holds: %v", err)
	}

	// In a cluster the test polls itself, nothing resolves a proposal
	// while the test waits: with bound 0 the helper reports it at once,
	// where Result would block forever.
	c := newQCluster(t, ids, func(cfg *Config) { cfg.ElectionTimeout = time.Hour })
	c.settle(nil)
	qp := c.get(2).r.Propose([]byte("unpolled"))
	c.settle(nil)
	err = awaitResolved(qp, `"unpolled"`, 0, qreplicas(c)...)
	// (The time waited is what the clock says: 0s, or 1ms on a loaded
	// machine; CI saw 1ms at load 10.)
	if err == nil || !strings.Contains(err.Error(), `proposal "unpolled" not resolved after `) || !strings.Contains(err.Error(), "(bound 0s)") || strings.Count(err.Error(), "\n\tnode ") != 3 {
		t.Errorf("awaitResolved with bound 0 on a pending proposal: %v", err)
	}

	// A resolved proposal passes at once, with any bound.
	if err := awaitResolved(r.Propose(make([]byte, r.MaxProposal()+1)), "too large", 0, r); err != nil {
		t.Errorf("a proposal refused at once: %v", err)
	}
	if err := awaitCond("true", 0, func() error { return nil }); err != nil {
		t.Errorf("a condition that holds: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	if waitGroup(&wg, 10*time.Millisecond) {
		t.Error("waitGroup returned true for a group that never finishes")
	}
	wg.Done()
	if !waitGroup(&wg, testWait) {
		t.Error("waitGroup returned false for a finished group")
	}
}
