package multicast

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/multicast/tree"
)

// TestClientRingsOnlyLeader: once a reply named the group's leader, the
// client still writes each message into every member's ring but rings
// only the leader's doorbell (the followers do not scan the rings: a ring
// woke their pollers for nothing, and cost the client a futex wake on
// shm). A retry rings every member again.
func TestClientRingsOnlyLeader(t *testing.T) {
	tc, c := callCluster(t, time.Minute)
	ctx, cancel := context.WithTimeout(tc.ctx, time.Minute)
	defer cancel()
	if _, err := c.Do(ctx, tree.Of(0), []byte("first")); err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, r := range tc.reps {
		if _, ok := r.Broadcast().Leading(); ok {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	c.mu.Lock()
	hint := c.leader[0]
	before := make([]uint64, len(c.peers[0]))
	for i, p := range c.peers[0] {
		before[i] = p.link.Stats().Notifies
	}
	c.mu.Unlock()
	if want := tc.spec.members[0][leader]; hint < 0 || c.peers[0][hint].id != want {
		t.Fatalf("after a reply the client's leader of group 0 is member %d, want node %d's", hint, want)
	}
	const n = 20
	for i := range n {
		if _, err := c.Do(ctx, tree.Of(0), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.peers[0] {
		got := p.link.Stats().Notifies - before[i]
		want := uint64(0)
		if i == hint {
			want = n
		}
		if got != want {
			t.Errorf("member %d (node %d, leader %v): %d doorbell rings for %d messages, want %d", i, p.id, i == hint, got, n, want)
		}
	}
}

// TestClientStaleLeaderHint: the leader the client rings stops (paused)
// and another member takes over; the client's next message, rung only at
// the old leader, is still ordered and answered without a retry (the new
// leader's heartbeat scan finds it in its ring), and the reply makes the
// new leader the one the client rings.
func TestClientStaleLeaderHint(t *testing.T) {
	tc, c := callCluster(t, time.Minute) // no retry within the test
	ctx, cancel := context.WithTimeout(tc.ctx, 30*time.Second)
	defer cancel()
	if _, err := c.Do(ctx, tree.Of(0), []byte("first")); err != nil {
		t.Fatal(err)
	}
	old := -1
	for i, r := range tc.reps {
		if _, ok := r.Broadcast().Leading(); ok {
			old = i
		}
	}
	c.mu.Lock()
	hint := c.leader[0]
	c.mu.Unlock()
	if old < 0 || hint != old {
		t.Fatalf("leader member %d, the client's hint %d", old, hint)
	}
	tc.hs[old].Pause()
	defer tc.hs[old].Resume()
	// A new leader of a committed epoch among the others.
	for deadline := time.Now().Add(20 * time.Second); ; {
		led := false
		for i, r := range tc.reps {
			if _, ok := r.Broadcast().Leading(); ok && i != old {
				led = true
			}
		}
		if led {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no new leader 20 s after the old one paused")
		}
		time.Sleep(time.Millisecond)
	}
	o, err := c.Do(ctx, tree.Of(0), []byte("second"))
	if err != nil {
		t.Fatalf("a message rung only at the paused leader: %v", err)
	}
	if o.Retries != 0 {
		t.Errorf("answered after %d retries, want none", o.Retries)
	}
	c.mu.Lock()
	hint = c.leader[0]
	c.mu.Unlock()
	if hint == old || hint < 0 {
		t.Errorf("after the new leader's reply the client rings member %d, want the new leader (not %d)", hint, old)
	}
}
