package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
)

// keyOf returns a key that group g holds (prefix plus a counter).
func keyOf(m *cluster.Map, g uint32, prefix string, n *int) []byte {
	for {
		*n++
		k := fmt.Appendf(nil, "%s-%d", prefix, *n)
		if m.GroupOf(k) == g {
			return k
		}
	}
}

// deadGroup0 runs 2 groups x 3 kvserver processes on shm, opens a client
// (slot 0) that writes to both groups, and kills two replicas of group 0
// (kill -9, nodes 2 and 3): group 0 has no leader and cannot elect one.
func deadGroup0(t *testing.T) (*tcluster, *client.Client) {
	c := newCluster(t, loopbackSpec(t, "isolation", "shm", 2))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	m := cl.Map()
	if m.Groups[0][1] != 2 || m.Groups[0][2] != 3 {
		t.Fatalf("group 0's members are %v, want [1 2 3]", m.Groups[0])
	}
	n := 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for g := range uint32(2) {
		if _, err := cl.Put(ctx, keyOf(m, g, "warm", &n), []byte("v")); err != nil {
			t.Fatalf("warm-up write to group %d: %v", g, err)
		}
	}
	c.kill(2)
	c.kill(3)
	c.logf("replicas 2 and 3 of group 0 killed")
	return c, cl
}

// TestDeadGroupIsolated: a dead group must cost a client only its own
// calls. A client that was using group 0 has writes to it time out (each
// stays under way in the client, retried until group 0 answers); after
// twice the client's window of them it must still complete every one of a
// run of writes to group 1. The same after as many batches over groups 0
// and 1 timed out.
//
// It first caught the multicast client numbering its in-flight messages
// across all groups (seq mod ClientSlots): the messages stuck on group 0
// held the slots, and the writes to group 1 timed out. Then it caught the
// batches holding group 1's reply slots (a message's reply slot is
// reserved in every destination group) until group 0 answered: the client
// now gives up the reply slots of a message whose caller gave up.
func TestDeadGroupIsolated(t *testing.T) {
	c, cl := deadGroup0(t)
	m := cl.Map()
	n := 0

	stuck := 2 * m.Limits.ClientSlots
	var wg sync.WaitGroup
	errs := make([]error, stuck)
	// live: writes to group 1 by the same client must all complete.
	const writes = 40
	live := func(after string) {
		t.Helper()
		for i := range writes {
			wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := cl.Put(wctx, keyOf(m, 1, "live", &n), []byte("v"))
			cancel()
			if err != nil {
				t.Fatalf("write %d of %d to group 1 after %s: %v%s", i+1, writes, after, err, c.describe())
			}
		}
		c.logf("then %d writes to group 1 completed", writes)
	}
	// Batches over both groups time out, all at once (group 0 is their
	// lca, or a destination that never answers); the first window of them
	// is sent, and must not hold group 1's window.
	for i := range stuck {
		k0, k1 := keyOf(m, 0, "both", &n), keyOf(m, 1, "both", &n)
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, errs[i] = cl.Commit(wctx, new(client.Batch).Put(k0, []byte("a")).Put(k1, []byte("b")))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Fatalf("batch %d over groups 0 and 1 (2 of group 0's 3 replicas killed) succeeded", i)
		}
	}
	c.logf("%d batches over groups 0 and 1 timed out (%v)", stuck, errs[0])
	live(fmt.Sprintf("%d timed-out batches over groups 0 and 1", stuck))

	// Writes to group 0 time out, all at once (each holds a slot of the
	// client's window for group 0 for good).
	for i := range stuck {
		k := keyOf(m, 0, "dead", &n)
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, errs[i] = cl.Put(wctx, k, []byte("lost"))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Fatalf("write %d to group 0 (2 of 3 replicas killed) succeeded", i)
		}
	}
	c.logf("%d writes to group 0 timed out (%v)", stuck, errs[0])

	live(fmt.Sprintf("%d timed-out writes to group 0", stuck))
}

// TestOpenWithDeadGroup: a new client must open while group 0 has no
// leader (it serves group 1), its writes to group 1 must work, and its
// writes to group 0, and a batch over both groups, must fail at once with
// *UnavailableError naming group 0 and why ("no leader: replicas 2 and 3
// unreachable").
//
// It first caught Open waiting for every group to register the client:
// no new client could open ("groups {0} did not register it").
func TestOpenWithDeadGroup(t *testing.T) {
	c, cl := deadGroup0(t)
	m := cl.Map()
	n := 0
	octx, ocancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ocancel()
	cl2, err := client.Open(octx, client.WithConfigFile(c.path), client.WithSlot(1), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("open a client while group 0 has no leader: %v", err)
	}
	defer cl2.Close()
	for i := range 10 {
		if _, err := cl2.Put(octx, keyOf(m, 1, "new", &n), []byte("v")); err != nil {
			t.Fatalf("new client: write %d to group 1: %v", i, err)
		}
	}
	checkUnavailable := func(what string, err error) {
		t.Helper()
		var ue *client.UnavailableError
		if !errors.As(err, &ue) || ue.Group != 0 {
			t.Fatalf("new client: %s: got %v, want *UnavailableError of group 0", what, err)
		}
		if want := "no leader: replicas 2 and 3 unreachable"; !strings.Contains(err.Error(), want) {
			t.Fatalf("new client: %s: %q does not say %q", what, err, want)
		}
	}
	_, err = cl2.Put(octx, keyOf(m, 0, "new-dead", &n), []byte("v"))
	checkUnavailable("write to group 0", err)
	b := new(client.Batch).Put(keyOf(m, 0, "batch", &n), []byte("a")).Put(keyOf(m, 1, "batch", &n), []byte("b"))
	_, err = cl2.Commit(octx, b)
	checkUnavailable("batch over groups 0 and 1", err)
	if octx.Err() != nil {
		t.Fatalf("the new client's calls to group 0 waited out the deadline instead of failing at once")
	}
	c.logf("new client opened: group 1 served, group 0: %v", err)
}
