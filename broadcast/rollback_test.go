package broadcast

import (
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestSnapshotBehindCommit: a new leader whose commit point lags a
// follower's catches that follower up by a snapshot taken behind what the
// follower already delivered. Node 4 commits ((0,1),12) from leader 1
// while node 5 commits only up to 8 and, cut off from node 4's rows,
// still believes node 4 is at 3. Leader 1 crashes; node 5 wins (every log
// is the same, and its epoch is the largest), its Log pruned to
// MaxLogEntries (past 3), so its diff to node 4 is based on a snapshot at
// 8. Node 4 must not install it (its delivered prefix would shrink from 12
// to 8: a rollback, and 9..12 delivered again): it applies the diff's
// entries only. The snapRollback knob installs it, and the rollback
// check (logFSM.rollbacks, as checkFSM's in the simulator) catches it.
func TestSnapshotBehindCommit(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		if rb, err := snapshotBehindCommit(t, testingKnobs{}); err != nil || rb != 0 {
			t.Fatalf("rollbacks %d, err %v", rb, err)
		}
	})
	t.Run("mutant", func(t *testing.T) {
		if rb, _ := snapshotBehindCommit(t, testingKnobs{snapRollback: true}); rb == 0 {
			t.Fatal("rollback check: node 4 installed no snapshot behind its commit point with the snapRollback knob")
		}
	})
}

func snapshotBehindCommit(t *testing.T, knobs testingKnobs) (rollbacks int, err error) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3, 4, 5}, func(cfg *Config) { cfg.MaxLogEntries = 4 })
	for _, n := range c.nodes {
		n.r.knobs = knobs
	}
	n1, n5, n4 := c.get(1), c.get(5), c.get(4)
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	c.settle(nil)
	var want []string
	propose := func(k int) {
		for i := 0; i < k; i++ {
			d := fmt.Sprintf("e%02d", len(want)+1)
			want = append(want, d)
			n1.r.Propose([]byte(d))
		}
	}
	propose(3)
	c.settle(nil)
	c.settle(nil) // node 4's commit row (at 3) reaches node 5
	no45 := func(from, to rdma.NodeID) bool { return !(from == 4 && to == 5) }
	propose(5)
	c.settle(no45)
	c.settle(no45)
	if s := n5.r.Status(); s.Committed.Cnt != 8 {
		return 0, fmt.Errorf("node 5 committed %v, want 8", s.Committed)
	}
	// 9..12: everyone accepts them, only node 5 misses the commit.
	propose(4)
	n1.r.Poll(c.now)
	c.deliver(no45)
	for _, n := range c.nodes[1:] {
		n.r.Poll(c.now)
	}
	c.deliver(no45)
	n1.r.Poll(c.now) // commits 12
	c.deliver(func(from, to rdma.NodeID) bool { return no45(from, to) && !(from == 1 && to == 5) })
	for _, n := range c.nodes[1:4] {
		n.r.Poll(c.now)
	}
	if s := n4.r.Status(); s.Committed.Cnt != 12 {
		return 0, fmt.Errorf("node 4 committed %v, want 12", s.Committed)
	}
	if s := n5.r.Status(); s.Committed.Cnt != 8 || s.Accepted.Cnt != 12 || s.Pruned.Cnt < 4 {
		return 0, fmt.Errorf("node 5: committed %v accepted %v pruned %v, want 8, 12 and at least 4", s.Committed, s.Accepted, s.Pruned)
	}
	c.crash(1, 0)
	c.loseLeader(no45, 2, 3, 4)
	n5.r.startElection(true)
	for k := 0; k < 10 && n5.r.Status().Role != Leader; k++ {
		c.settle(no45)
	}
	if s := n5.r.Status(); s.Role != Leader {
		return 0, fmt.Errorf("node 5 did not win: %+v", s)
	}
	// Its diff to node 4 went out; now node 4 can fetch the snapshot.
	for k := 0; k < 5; k++ {
		c.settle(nil)
	}
	if n4.fsm.restores == 0 && knobs.snapRollback {
		return 0, fmt.Errorf("node 4 was sent no snapshot: the scenario did not happen")
	}
	if got := c.delivered(4); !equalStrings(got, want) {
		err = fmt.Errorf("node 4 delivered %q, want %q", got, want)
	}
	return n4.fsm.rollbacks, err
}
