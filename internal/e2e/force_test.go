package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestForceNewCluster is issue 19's scenario with real processes: 2
// groups x 3 kvserver processes on shm; kill -9 of two replicas of group
// 1 (its leader and a follower), restarted at once: they come back
// without their data, catching up, and group 1 has no leader and cannot
// elect one. kvserver force-new-cluster (the built binary) without --yes
// only says what it would do, and nothing changes; with --yes the
// surviving replica leads, the other two take its data, and group 1
// serves puts and gets again, the writes made before the outage included
// (the survivor had applied them). The client is opened only after the
// force.
func TestForceNewCluster(t *testing.T) {
	c := newCluster(t, loopbackSpec(t, "force", "shm", 2))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Writes to both groups, then every replica applies them.
	cl := c.openClient(0)
	m := cl.Map()
	n := 0
	var before [][]byte
	for k := range 20 {
		key := keyOf(m, uint32(k%2), "before", &n)
		if _, err := cl.Put(ctx, key, []byte("v-"+string(key))); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		before = append(before, key)
	}
	cl.Close()
	c.waitConverged(30 * time.Second)

	leader := c.leader(1, 10*time.Second)
	fs := c.followers(1, leader)
	victim, survivor := fs[0], fs[1]
	c.kill(leader)
	c.kill(victim)
	c.logf("group 1: killed leader %d and follower %d (kill -9); %d survives", leader, victim, survivor)
	args := []string{"force-new-cluster", "--config", c.path, "--group", "1"}
	// With 2 of 3 down there is no majority to force with: refused.
	code, out, errOut := runOnce(t, c.bin, 30*time.Second, append(args, "--yes")...)
	if code != 1 || !strings.Contains(errOut, "only 1 of 3 replicas answer") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("force-new-cluster with 2 of 3 down: exit %d, stdout %q, stderr %q: want one line of refusal", code, out, errOut)
	}
	c.start(leader)
	c.start(victim)

	// Stuck: the survivor elects in vain, the others catch up in vain.
	stuck := func() string {
		s, err := c.status(survivor)
		if err != nil || s.Role != "electing" || s.CatchingUp {
			return fmt.Sprintf("survivor %d: %+v %v", survivor, s, err)
		}
		for _, id := range []int64{leader, victim} {
			s, err := c.status(id)
			if err != nil || !s.CatchingUp || s.Role != "electing" {
				return fmt.Sprintf("restarted %d: %+v %v", id, s, err)
			}
		}
		return ""
	}
	deadline := time.Now().Add(20 * time.Second)
	for why := stuck(); why != ""; why = stuck() {
		if time.Now().After(deadline) {
			t.Fatalf("group 1 is not stuck as expected: %s%s", why, c.describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // more than 2 election timeouts (100ms) without a leader
	if why := stuck(); why != "" {
		t.Fatalf("group 1 healed without a force: %s", why)
	}

	code, out, errOut = runOnce(t, c.bin, 30*time.Second, args...)
	c.logf("without --yes: exit %d\n%s%s", code, out, errOut)
	want := fmt.Sprintf("group 1 will go on from node %d (accepted ", survivor)
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "add --yes") || !strings.Contains(out, "will take node") {
		t.Fatalf("force-new-cluster without --yes: exit %d, stdout %q (want %q and the advice to add --yes), stderr %q", code, out, want, errOut)
	}
	time.Sleep(300 * time.Millisecond)
	if why := stuck(); why != "" {
		t.Fatalf("force-new-cluster without --yes changed the group: %s", why)
	}
	if s, _ := c.status(survivor); s.Counters.ForcedVotes != 0 {
		t.Fatalf("force-new-cluster without --yes cast a forced vote: %+v", s.Counters)
	}

	code, out, errOut = runOnce(t, c.bin, 90*time.Second, append(args, "--yes", "--timeout", "60s")...)
	c.logf("with --yes: exit %d\n%s%s", code, out, errOut)
	if code != 0 || !strings.Contains(out, "serves again") {
		t.Fatalf("force-new-cluster --yes: exit %d, stdout %q, stderr %q%s", code, out, errOut, c.describe())
	}
	// The survivor leads the forced epoch; it may lose it at once if both
	// followers take longer than an election timeout to install its
	// snapshot, and then one of them leads (with the survivor's data).
	l := c.leader(1, 30*time.Second)
	c.logf("group 1's leader: %d (the survivor was %d)", l, survivor)
	c.waitConverged(30 * time.Second)
	if s, _ := c.status(survivor); s.Counters.ForcedVotes != 1 {
		t.Fatalf("survivor's counters: %+v, want 1 forced vote", s.Counters)
	}

	// A second force is refused: the group has a leader.
	code, _, errOut = runOnce(t, c.bin, 30*time.Second, append(args, "--yes", "--timeout", "5s")...)
	if code != 1 || !strings.Contains(errOut, "has a leader") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("force-new-cluster on a healthy group: exit %d, stderr %q", code, errOut)
	}

	// The endpoint itself refuses too (the protocol's check, 409), and
	// says why.
	st, err := c.status(survivor)
	if err != nil {
		t.Fatal(err)
	}
	_, r := c.replica(survivor)
	resp, err := c.hc.Post(fmt.Sprintf("http://%s/force?group=1&epoch=%d&count=%d", r.Control, uint64(st.Accepted.Epoch), st.Accepted.Count), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "the group has a leader") {
		t.Fatalf("POST /force to a replica of a healthy group: %d %q, want 409 and the reason", resp.StatusCode, body)
	}

	// Group 1 serves again: a client opened now reads the writes of
	// before and writes anew.
	cl = c.openClient(1)
	for _, key := range before {
		v, err := cl.Get(ctx, key)
		if err != nil || string(v) != "v-"+string(key) {
			t.Fatalf("get %s after the force: %q, %v", key, v, err)
		}
	}
	for k := range 10 {
		key := keyOf(m, 1, "after", &n)
		if _, err := cl.Put(ctx, key, []byte(fmt.Sprint(k))); err != nil {
			t.Fatalf("put %s to group 1 after the force: %v", key, err)
		}
		if v, err := cl.Get(ctx, key); err != nil || string(v) != fmt.Sprint(k) {
			t.Fatalf("get %s after the force: %q, %v", key, v, err)
		}
	}
}
