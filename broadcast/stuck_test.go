package broadcast

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// stuckPolls runs a group of 3 in which the leader and one follower are
// killed and restarted with their stable state but no memory (catching
// up: they may not vote until a leader's diff reaches them, and no
// leader can be elected without them), then plays one poller for all
// three in virtual time: poll every member, land what they posted, and
// sleep until the earliest NextDeadline. It returns how many passes 10
// election timeouts took, and the restarted member 1.
func stuckPolls(t *testing.T, noBackoff bool) (passes int, r *Replica) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.settle(nil)
	if s := c.get(1).r.Status(); s.Role != Leader {
		t.Fatalf("node 1 did not win: %+v", s)
	}
	c.crash(1, 0)
	c.crash(2, 0)
	c.now += c.cfg.ElectionTimeout
	c.boot(c.get(1))
	c.boot(c.get(2))
	for _, n := range c.nodes {
		n.r.knobs.noElectBackoff = noBackoff
	}
	end := c.now + 10*c.cfg.ElectionTimeout
	for c.now < end && passes < 100_000 {
		c.pollAll()
		passes++
		c.deliver(nil)
		next := end
		for _, n := range c.nodes {
			next = min(next, n.r.NextDeadline())
		}
		if next > c.now {
			c.now = next
		}
	}
	return passes, c.get(1).r
}

// TestStuckGroupParks: the members of a group that cannot elect (a
// majority restarted without its memory) wait between election attempts, polled only at its deadlines
// (heartbeats of its rows, attempts that back off), instead of asking to
// be polled at once again and again (which burned a core per stuck
// replica under the real-time poller). Counts in virtual time, no timing.
func TestStuckGroupParks(t *testing.T) {
	passes, r := stuckPolls(t, false)
	hb := int(10 * r.cfg.ElectionTimeout / r.cfg.HeartbeatInterval)
	st := r.Status()
	t.Logf("%d passes over 10 election timeouts (%d heartbeat intervals); restarted member: %v, counters %+v", passes, hb, st.Role, st.Counters)
	if passes > 3*hb+64 {
		t.Fatalf("a group that cannot elect was polled in %d passes over 10 election timeouts (%d heartbeat intervals): a member does not wait between attempts", passes, hb)
	}
	if st.Counters.ElectBackoffs == 0 || st.Role != Electing {
		t.Fatalf("restarted member: role %v, %d backoffs: the case did not exercise a member that cannot vote", st.Role, st.Counters.ElectBackoffs)
	}
}

// TestStuckGroupParksCatchesNoBackoff: without the backoff the same
// member asks to be polled again at the same instant forever.
func TestStuckGroupParksCatchesNoBackoff(t *testing.T) {
	simNoRace(t) // 100,000 passes of a queued cluster in virtual time: one goroutine
	passes, r := stuckPolls(t, true)
	hb := int(10 * r.cfg.ElectionTimeout / r.cfg.HeartbeatInterval)
	if passes <= 3*hb+64 {
		t.Fatalf("noElectBackoff went unnoticed: %d passes", passes)
	}
	t.Logf("caught as expected: %d passes over 10 election timeouts", passes)
}
