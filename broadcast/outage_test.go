package broadcast

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestLogBoundedMemberDown: with one member of three down for good (crashed
// mid-run, never started, or alive but stuck: its process does not poll),
// the leader keeps committing and its Log and data slabs stay within their
// bounds however many entries commit (here 40x MaxLogEntries), and Status
// says the member is unreachable. When the member comes back it catches up
// by snapshot and delivers the same sequence. Before MaxLogEntries was a
// hard bound, a diff to the dead member stuck in a full ring held the Log
// from its base for ever (the unboundedLog knob restores that).
func TestLogBoundedMemberDown(t *testing.T) {
	for _, how := range []string{"crashed", "never-started", "stuck"} {
		t.Run(how, func(t *testing.T) { testLogBounded(t, how, testingKnobs{}) })
	}
	t.Run("mutant-unbounded", func(t *testing.T) {
		err := logBoundRun(t, "crashed", testingKnobs{unboundedLog: true})
		if err == nil || !strings.Contains(err.Error(), "log bound:") {
			t.Fatalf("the unbounded-Log mutant was not caught by the Log bound: %v", err)
		}
	})
}

func testLogBounded(t *testing.T, how string, knobs testingKnobs) {
	if err := logBoundRun(t, how, knobs); err != nil {
		t.Fatal(err)
	}
}

const (
	boundMaxLog = 64
	boundRing   = 8 << 10
)

func logBoundRun(t *testing.T, how string, knobs testingKnobs) error {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) {
		cfg.MaxLogEntries = boundMaxLog
		cfg.RingSize = boundRing
		cfg.MaxRecord = 1024
	})
	n1, n3 := c.get(1), c.get(3)
	for _, n := range c.nodes {
		n.r.knobs = knobs
	}
	if how == "never-started" {
		c.crash(3, 0)
	}
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	c.settle(nil)
	var want []string
	propose := func(k int) {
		for i := 0; i < k; i++ {
			d := fmt.Sprintf("m%05d-%s", len(want), strings.Repeat("x", 100))
			want = append(want, d)
			n1.r.Propose([]byte(d))
		}
	}
	live := func(from, to rdma.NodeID) bool { return from != 3 && to != 3 }
	switch how {
	case "crashed":
		propose(10)
		c.settle(nil)
		c.crash(3, 0)
	case "stuck":
		propose(10)
		c.settle(nil)
		live = nil // its memory still takes writes; it never reads them
	}
	// Slabs: the Log's entries (at most MaxLogEntries committed plus the
	// uncommitted ones, 110 bytes each here), the leader's unresolved
	// proposals, and a few cursors' slabs.
	maxSlabs := 8
	for round := 0; round < 400; round++ {
		propose(8)
		for _, n := range c.nodes {
			if n.up && (n.id != 3 || how != "stuck") {
				n.r.Poll(c.now)
			}
		}
		c.now += c.cfg.HeartbeatInterval
		for i := 0; i < 100; i++ {
			progress := false
			for _, n := range c.nodes {
				if n.up && (n.id != 3 || how != "stuck") && n.r.Poll(c.now) {
					progress = true
				}
			}
			if !c.deliver(live) && !progress {
				break
			}
		}
		s := n1.r.Status()
		if s.Role != Leader {
			return fmt.Errorf("round %d: node 1 lost its leadership: %+v", round, s)
		}
		// A member heard within the election timeout may be catching up:
		// the Log may hold MaxCatchUpLogEntries for it; one silent for
		// longer holds nothing beyond MaxLogEntries.
		uncommitted := int(s.Accepted.Cnt - s.Committed.Cnt)
		bound := boundMaxLog
		if s.Members[2].State != MemberUnreachable && s.Members[2].State != MemberUnknown {
			bound = 8 * boundMaxLog
		}
		if s.LogLen > bound+uncommitted {
			return fmt.Errorf("log bound: round %d: the leader's Log holds %d entries, bound %d + %d uncommitted (node 3 %v)", round, s.LogLen, bound, uncommitted, s.Members[2].State)
		}
		if s.Slabs > maxSlabs {
			return fmt.Errorf("slab bound: round %d: the leader holds %d data slabs, want at most %d", round, s.Slabs, maxSlabs)
		}
	}
	s := n1.r.Status()
	if s.Index < 3000 {
		return fmt.Errorf("the leader delivered %d entries, want 3000 or more while node 3 was out", s.Index)
	}
	// What the leader says of node 3.
	ms := s.Members[2]
	wantState := MemberUnreachable
	if how == "never-started" {
		wantState = MemberUnknown
	}
	if ms.ID != 3 || ms.State != wantState || (how != "never-started" && ms.Silent < c.cfg.ElectionTimeout) {
		return fmt.Errorf("leader's status of node 3: %+v, want %v", ms, wantState)
	}
	if st := s.Members[1].State; st != MemberStreaming {
		return fmt.Errorf("leader's status of node 2: %v, want streaming", st)
	}
	// Node 3 comes back (restarted, or its process polls again) and catches
	// up by snapshot.
	if how != "stuck" {
		c.boot(n3)
	}
	c.now += time.Millisecond
	for i := 0; i < 200 && n3.r.Status().Index < s.Index; i++ {
		c.settle(nil)
	}
	for _, id := range []rdma.NodeID{1, 2, 3} {
		if got := c.delivered(id); !equalStrings(got, want) {
			return fmt.Errorf("node %d delivered %d entries, want %d (the same sequence)", id, len(got), len(want))
		}
	}
	c.settle(nil) // Status.Members is refreshed at heartbeats
	if s3 := n3.r.Status(); s3.Counters.SnapshotsRestored == 0 {
		return fmt.Errorf("node 3 caught up without a snapshot: %+v", s3.Counters)
	}
	if st := n1.r.Status().Members[2].State; st != MemberStreaming {
		return fmt.Errorf("leader's status of node 3 after catch-up: %v, want streaming", st)
	}
	return nil
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
