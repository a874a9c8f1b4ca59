package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestOpenWithCatchingUpGroup: 2 groups x 3 kvserver processes on shm;
// group 1's leader and one of its followers are killed (kill -9) and
// restarted. They come back without their data (memory mode), catching
// up, and cannot vote, so group 1 cannot elect a leader until an operator
// acts. A new client must still open (with a 20 s ctx), serve group 0,
// and fail a write to group 1 at once with *UnavailableError saying that
// the restarted replicas cannot vote; /readyz of group 1's replicas must
// name group 1 and why.
//
// Without the table header's catching-up flag, the client took the
// restarted replicas (reachable) for voters and waited for an election
// that could not happen: Open returned only when its ctx ended, and a
// write to group 1 said "no leader (an election is under way)".
func TestOpenWithCatchingUpGroup(t *testing.T) {
	c := newCluster(t, loopbackSpec(t, "catchingup", "shm", 2))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	m := cl.Map()
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for g := range uint32(2) {
		if _, err := cl.Put(ctx, keyOf(m, g, "warm", &n), []byte("v")); err != nil {
			t.Fatalf("warm-up write to group %d: %v", g, err)
		}
	}
	cl.Close()

	lead := c.leader(1, 20*time.Second)
	fs := c.followers(1, lead)
	survivor, victim := fs[0], fs[1]
	c.kill(lead)
	c.kill(victim)
	c.logf("group 1's leader %d and follower %d killed; %d survives", lead, victim, survivor)
	c.start(lead)
	c.start(victim)
	// Both come back catching up (they lost their memory) and stay so:
	// no member of group 1 can lead.
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range []int64{lead, victim} {
		for {
			s, err := c.status(id)
			if err == nil && s.CatchingUp {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d is not catching up after its restart (%+v, %v)%s", id, s, err, c.describe())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	restarted := []int64{min(lead, victim), max(lead, victim)}
	why := fmt.Sprintf("replicas %d and %d restarted without their data and cannot vote", restarted[0], restarted[1])
	c.logf("replicas %d and %d restarted, catching up", restarted[0], restarted[1])

	octx, ocancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ocancel()
	cl2, err := client.Open(octx, client.WithConfigFile(c.path), client.WithSlot(1), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("open a client while group 1's restarted replicas cannot vote: %v%s", err, c.describe())
	}
	defer cl2.Close()
	if octx.Err() != nil {
		t.Fatalf("Open returned only once its ctx had ended (it waited for group 1 to elect)")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	k0 := keyOf(m, 0, "new", &n)
	if _, err := cl2.Put(wctx, k0, []byte("v0")); err != nil {
		t.Fatalf("new client: write to group 0: %v", err)
	}
	if v, err := cl2.Get(wctx, k0); err != nil || string(v) != "v0" {
		t.Fatalf("new client: get of group 0's key: %q, %v", v, err)
	}
	_, err = cl2.Put(wctx, keyOf(m, 1, "new", &n), []byte("v1"))
	var ue *client.UnavailableError
	if !errors.As(err, &ue) || ue.Group != 1 {
		t.Fatalf("new client: write to group 1: %v, want *UnavailableError of group 1", err)
	}
	if !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "force-new-cluster") {
		t.Fatalf("new client: write to group 1: %q does not say %q (and point to force-new-cluster)", err, why)
	}
	c.logf("new client opened: group 0 served; write to group 1: %v", err)

	// /readyz of each of group 1's replicas names the group and why (the
	// survivor may take a moment to give up on its dead leader).
	want := "group 1 cannot elect a leader: " + why
	for _, id := range c.members(1) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body, err := c.get(id, "/readyz")
			text := strings.TrimSpace(string(body))
			if err == nil && code == http.StatusServiceUnavailable && strings.Contains(text, want) {
				c.logf("replica %d: /readyz %d %s", id, code, text)
				break
			}
			if err == nil && code == http.StatusOK {
				t.Fatalf("replica %d: /readyz says ready: %q%s", id, text, c.describe())
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: /readyz %d %q (%v); want 503 naming %q%s", id, code, text, err, want, c.describe())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
