package broadcast

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

var update = flag.Bool("update", false, "rewrite golden traces in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got+"\n" {
		t.Errorf("trace differs from %s (rerun with -update after checking):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func only(pairs ...[2]rdma.NodeID) func(from, to rdma.NodeID) bool {
	return func(from, to rdma.NodeID) bool {
		return slices.Contains(pairs, [2]rdma.NodeID{from, to})
	}
}

func not(ids ...rdma.NodeID) func(from, to rdma.NodeID) bool {
	return func(from, to rdma.NodeID) bool {
		return !slices.Contains(ids, from) && !slices.Contains(ids, to)
	}
}

func wantSeq(t *testing.T, c *qcluster, id rdma.NodeID, want ...string) {
	t.Helper()
	if got := c.delivered(id); !slices.Equal(got, want) {
		t.Errorf("node %d delivered %q, want %q", id, got, want)
	}
}

// TestFig3RunningExample replays the paper's running example (Acuerdo
// section 3, Fig. 3): node 1 leads epoch (0,1) and broadcasts ((0,1),1) and
// ((0,1),2), which node 3 discovers together and accepts as one batch; node
// 1 times out (crashes) after node 3 but before node 2 got ((0,1),3); node 2
// proposes itself for (0,2); node 3 refuses, having the more up-to-date
// log, and proposes itself for (0,3); node 2 joins; node 3 wins and its
// diff ((0,3),0) brings node 2 the missing message.
func TestFig3RunningExample(t *testing.T) {
	var events []string
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) {
		cfg.OnEvent = func(ev Event) { events = append(events, fmt.Sprintf("%d %v", ev.Kind, ev.Epoch)) }
	})
	n1, n2, n3 := c.get(1), c.get(2), c.get(3)
	c.settle(nil)
	c.takeTrace() // boot and connections

	// Node 1 times out first and wins epoch (0,1).
	n1.r.startElection(true)
	c.settle(nil)
	golden(t, "fig3-1-elect-01.trace", c.takeTrace())
	for _, n := range c.nodes {
		if s := n.r.Status(); s.ECur != MakeEpoch(0, 1) || s.Committed != (MsgHdr{E: MakeEpoch(0, 1)}) {
			t.Fatalf("node %d: %+v, want epoch (0,1) with its diff committed", n.id, s)
		}
	}

	// ((0,1),1) and ((0,1),2): node 3 finds both in one look.
	p1 := n1.r.Propose([]byte("m1"))
	p2 := n1.r.Propose([]byte("m2"))
	n1.r.Poll(c.now)
	c.deliver(nil)
	n3.r.Poll(c.now)
	c.deliver(only([2]rdma.NodeID{3, 1}))
	n1.r.Poll(c.now) // commits at node 1 on node 3's acceptance
	c.settle(nil)
	golden(t, "fig3-2-broadcast.trace", c.takeTrace())
	for k, p := range []*Proposal{p1, p2} {
		if _, err := waitProposal(t, p, fmt.Sprintf("m%d", k+1), 0, qreplicas(c)...); err != nil {
			t.Fatal(err)
		}
	}
	if i, _ := p2.Result(); i != 2 {
		t.Errorf("m2 delivered at %d, want 2", i)
	}

	// ((0,1),3) reaches node 3 only; then node 1 is gone.
	p3 := n1.r.Propose([]byte("m3"))
	n1.r.Poll(c.now)
	c.deliver(only([2]rdma.NodeID{1, 3}))
	n3.r.Poll(c.now)
	c.crash(1, 0)
	if _, err := waitProposal(t, p3, "m3", 0, qreplicas(c)...); err != ErrStopped {
		t.Errorf("m3 at the crashed node: %v, want ErrStopped", err)
	}

	// Node 3 times out first, but defers: node 2 still hears the leader
	// (pre-vote). Then node 2 times out and proposes itself for (0,2).
	c.loseLeader(not(1), 3)
	n2.r.startElection(true)
	n2.r.Poll(c.now)
	if v := n2.r.Status().Vote; v != (Vote{ENew: MakeEpoch(0, 2), Acpt: MsgHdr{E: MakeEpoch(0, 1), Cnt: 2}}) {
		t.Fatalf("node 2 votes %v", v)
	}
	// Node 3 refuses and wins (0,3); its diff brings node 2 ((0,1),3).
	c.settle(not(1))
	golden(t, "fig3-3-elect-03.trace", c.takeTrace())
	if s := n3.r.Status(); s.Role != Leader || s.ECur != MakeEpoch(0, 3) {
		t.Fatalf("node 3: %+v, want leader of (0,3)", s)
	}
	if s := n2.r.Status(); s.Role != Follower || s.ECur != MakeEpoch(0, 3) {
		t.Fatalf("node 2: %+v, want follower of (0,3)", s)
	}
	wantSeq(t, c, 2, "m1", "m2", "m3")
	wantSeq(t, c, 3, "m1", "m2", "m3")
	// Milestones: 1 elects and wins (0,1), followed by 2 and 3, committed by all;
	// 2 and 3 elect (with 3 joining when it sees 2's vote); (0,3) is won
	// and committed.
	wantEv := []string{"1 (0,0)", "2 (0,1)", "3 (0,1)", "3 (0,1)", "4 (0,1)", "4 (0,1)", "4 (0,1)",
		"1 (0,1)", "1 (0,1)", "2 (0,3)", "3 (0,3)", "4 (0,3)", "4 (0,3)"}
	if !slices.Equal(events, wantEv) {
		t.Errorf("events %q, want %q", events, wantEv)
	}

	// A proposal at follower 2 is forwarded to node 3 and delivered at 4.
	p4 := n2.r.Propose([]byte("m4"))
	c.settle(not(1))
	if i, err := waitProposal(t, p4, "m4", 0, qreplicas(c)...); err != nil || i != 4 {
		t.Errorf("m4: index %d, err %v, want 4", i, err)
	}
	wantSeq(t, c, 2, "m1", "m2", "m3", "m4")
	wantSeq(t, c, 3, "m1", "m2", "m3", "m4")
}

// TestEmptyDiffTruncatesStaleEntries is the flaw docs/broadcast.md fixes
// ("Diffs, made precise"): the paper's diff removes Log entries from the
// diff's first key up, which removes nothing when the diff is empty. Node 2
// holds ((0,1),1), accepted from leader 1 and never committed; node 5 wins
// (0,5) without it and its diff to node 2 is empty. With the paper's rule
// node 2 would keep ((0,1),1) and deliver it when the diff commits (Fig. 6
// l.83-88); with the diff's base it drops it and delivers what 3, 4, 5 do.
func TestEmptyDiffTruncatesStaleEntries(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3, 4, 5}, nil)
	n1, n2, n3 := c.get(1), c.get(2), c.get(3)
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	c.settle(nil) // a heartbeat spreads the commit rows
	c.takeTrace()

	n1.r.Propose([]byte("m1"))
	n1.r.Poll(c.now)
	c.deliver(only([2]rdma.NodeID{1, 2}))
	n2.r.Poll(c.now)
	if s := n2.r.Status(); s.Accepted != (MsgHdr{E: MakeEpoch(0, 1), Cnt: 1}) {
		t.Fatalf("node 2 accepted %v, want ((0,1),1)", s.Accepted)
	}
	c.crash(1, 0)

	// Node 2 is cut off while 3, 4, 5 elect a leader and commit m2. Nodes
	// 4 and 5 lost the leader too (first deferring: the pre-vote wants a
	// majority that hears no leader); node 3's vote starts the election,
	// and node 5, timed out with the same log, wins it with a bigger epoch.
	c.loseLeader(not(1, 2), 4, 5)
	n3.r.startElection(true)
	c.settle(not(1, 2))
	p2 := n3.r.Propose([]byte("m2"))
	c.settle(not(1, 2))
	if i, err := waitProposal(t, p2, "m2", 0, qreplicas(c)...); err != nil || i != 1 {
		t.Fatalf("m2: index %d, err %v", i, err)
	}
	// Node 2 comes back and gets (0,3)'s empty diff, then m2.
	c.settle(not(1))
	golden(t, "empty-diff.trace", c.takeTrace())
	for _, id := range []rdma.NodeID{2, 3, 4, 5} {
		wantSeq(t, c, id, "m2")
	}
}

// TestSnapshotCatchUp: a follower cut off while the group commits more than
// MaxLogEntries entries comes back behind the pruned Log; the leader sends
// a snapshot that the follower fetches with one-sided reads, then a diff
// with the tail, and the follower ends with the same sequence.
// With a MaxSnapshot below the snapshot's size the follower refuses it and
// stays behind, with what it had delivered intact, while the others go on.
func TestSnapshotCatchUp(t *testing.T) {
	t.Run("fetched", func(t *testing.T) { testSnapshotCatchUp(t, 0) })
	t.Run("refused", func(t *testing.T) { testSnapshotCatchUp(t, 32) })
}

func testSnapshotCatchUp(t *testing.T, maxSnapshot int) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) {
		cfg.MaxLogEntries = 8
		cfg.MaxRecord = 512
		cfg.MaxSnapshot = maxSnapshot
	})
	n1, n3 := c.get(1), c.get(3)
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	var want []string
	propose := func(k int) {
		for i := 0; i < k; i++ {
			d := fmt.Sprintf("m%02d-%s", len(want), strings.Repeat("x", 40))
			want = append(want, d)
			n1.r.Propose([]byte(d))
		}
	}
	propose(5)
	c.settle(nil)
	// Node 3 misses these: more than its ring holds (so the leader cannot
	// stream them all to it while it is cut off), and the Log keeps only
	// the last 8 committed. Node 3 stays a follower (pre-vote: node 2
	// still hears the leader).
	propose(250)
	for i := 0; i < 3; i++ {
		c.settle(not(3))
	}
	if s := n1.r.Status(); s.LogLen > 8 || s.Pruned.Cnt < 240 {
		t.Fatalf("leader log not pruned: %+v", s)
	}
	// Node 3 is still cut off: the leader keeps committing with node 2. Then
	// it cannot stream to node 3 (its next entry was pruned) and re-syncs it
	// with a snapshot while 20 more entries commit.
	c.now += 25 * c.cfg.ElectionTimeout
	propose(20)
	for i := 0; i < 5; i++ {
		c.settle(nil)
	}
	s3 := n3.r.Status()
	if maxSnapshot != 0 {
		for _, id := range []rdma.NodeID{1, 2} {
			wantSeq(t, c, id, want...)
		}
		// Node 3 delivered what its ring held when the link healed, a
		// prefix, and stays behind.
		if got := c.delivered(3); len(got) >= len(want) || !slices.Equal(got, want[:len(got)]) {
			t.Errorf("node 3 delivered %d entries, want a strict prefix of the %d", len(got), len(want))
		}
		if n3.fsm.restores != 0 || s3.Counters.SnapshotsRefused == 0 {
			t.Errorf("node 3 restored %d snapshots and refused %d, want 0 and some: %+v", n3.fsm.restores, s3.Counters.SnapshotsRefused, s3.Counters)
		}
		return
	}
	for _, id := range []rdma.NodeID{1, 2, 3} {
		wantSeq(t, c, id, want...)
	}
	if n3.fsm.restores != 1 || s3.Counters.SnapshotsRestored != 1 {
		t.Errorf("node 3 restored %d snapshots, want 1: %+v", n3.fsm.restores, s3.Counters)
	}
}

// TestProposalErrors: a proposal that cannot be delivered fails with an
// error that guarantees it never will be.
func TestProposalErrors(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) {
		cfg.ElectionTimeout = time.Hour // no election: no leader
		cfg.ProposeTimeout = 10 * time.Millisecond
		cfg.MaxPending = 2
		cfg.MaxRecord = 512
	})
	n1 := c.get(1)
	c.settle(nil)
	if _, err := waitProposal(t, n1.r.Propose(make([]byte, 600)), "of 600 bytes", 0); !errors.Is(err, ErrTooLarge) {
		t.Errorf("600 bytes: %v, want ErrTooLarge", err)
	}
	a, b := n1.r.Propose([]byte("a")), n1.r.Propose([]byte("b"))
	if _, err := waitProposal(t, n1.r.Propose([]byte("c")), "c", 0); !errors.Is(err, ErrBusy) {
		t.Errorf("third pending proposal: %v, want ErrBusy", err)
	}
	c.settle(nil)
	c.now += 20 * time.Millisecond
	c.settle(nil)
	for k, p := range []*Proposal{a, b} {
		if _, err := waitProposal(t, p, []string{"a", "b"}[k], 0, qreplicas(c)...); !errors.Is(err, ErrTimeout) {
			t.Errorf("proposal without a leader: %v, want ErrTimeout", err)
		}
	}
	// A leader now: the timed-out proposals are not delivered, new ones are.
	n1.r.startElection(true)
	c.settle(nil)
	p := n1.r.Propose([]byte("d"))
	c.settle(nil)
	if i, err := waitProposal(t, p, "d", 0, qreplicas(c)...); err != nil || i != 1 {
		t.Errorf("d: %d, %v; want index 1", i, err)
	}
	wantSeq(t, c, 2, "d")
}

// TestElectionsRacing: two members time out at once and vote for
// themselves in the same round; Fig. 7 converges on one leader (the larger
// vote wins: both logs are equal, so the other joins it), and the group
// commits.
func TestElectionsRacing(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.get(2).r.startElection(true)
	c.get(1).r.Poll(c.now)
	c.get(2).r.Poll(c.now)
	if v1, v2 := c.get(1).r.Status().Vote, c.get(2).r.Status().Vote; v1.ENew != MakeEpoch(0, 1) || v2.ENew != MakeEpoch(0, 2) {
		t.Fatalf("votes %v and %v, want both for themselves", v1, v2)
	}
	c.settle(nil)
	leaders := 0
	for _, n := range c.nodes {
		s := n.r.Status()
		if s.Role == Leader {
			leaders++
		}
		if s.ECur != MakeEpoch(0, 2) {
			t.Errorf("node %d in epoch %v, want (0,2)", n.id, s.ECur)
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	p := c.get(1).r.Propose([]byte("x"))
	c.settle(nil)
	if i, err := waitProposal(t, p, "x", 0, qreplicas(c)...); err != nil || i != 1 {
		t.Fatalf("x: %d, %v", i, err)
	}
	golden(t, "elections-racing.trace", c.takeTrace())
}
