package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestNearReplicaTCP: on the tcp fabric over loopback, with 3 kvserver
// processes, a client opened WithNearReplica(i) reads member i with every
// stale-ok get, its first included (its reader's Conns connect in the
// background: the first read finds member i still connecting). While a
// follower is stopped (SIGSTOP), the stale-ok gets of the client near it
// go on, from another member; once it continues (SIGCONT), they read it
// again.
func TestNearReplicaTCP(t *testing.T) {
	c := newCluster(t, loopbackSpec(t, "near", "tcp", 1))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var cls []*client.Client
	for i := range 3 {
		cl, err := client.Open(ctx, client.WithConfigFile(c.path), client.WithTimeout(20*time.Second), client.WithNearReplica(i))
		if err != nil {
			t.Fatalf("open the client near member %d: %v", i, err)
		}
		t.Cleanup(func() { cl.Close() })
		cls = append(cls, cl)
	}
	members := cls[0].Map().Groups[0]
	keys := make([][]byte, 8)
	for k := range keys {
		keys[k] = fmt.Appendf(nil, "near-%d", k)
		if _, err := cls[0].Put(ctx, keys[k], []byte("v")); err != nil {
			t.Fatalf("put %q: %v", keys[k], err)
		}
	}
	// get is a stale-ok get of key k by client i; it returns the node read.
	get := func(i, k int) rdma.NodeID {
		t.Helper()
		it, err := cls[i].GetItem(ctx, keys[k], client.StaleOK)
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("+%v: stale-ok get %q near member %d: %v", c.since(), keys[k], i, err)
		}
		return it.Replica
	}
	for i := range cls {
		for k := range keys {
			if got := get(i, k); got != members[i] {
				t.Errorf("stale-ok get %d of the client near member %d (node %d) read node %d", k, i, members[i], got)
			}
		}
	}

	ldr := c.leader(0, 10*time.Second)
	f := c.followers(0, ldr)[0]
	fi := slices.Index(members, rdma.NodeID(f))
	if fi < 0 {
		t.Fatalf("replica %d is not among group 0's members %v", f, members)
	}
	c.stop(f)
	c.logf("follower %d (member %d) stopped", f, fi)
	for k := range keys {
		if got := get(fi, k); got == members[fi] {
			t.Fatalf("stale-ok get %d near member %d read it while it was stopped", k, fi)
		}
	}
	c.cont(f)
	at := time.Now()
	deadline := at.Add(30 * time.Second)
	for n := 0; ; n++ {
		if got := get(fi, n%len(keys)); got == members[fi] {
			c.logf("member %d read again by get %d, %v after SIGCONT", fi, n, time.Since(at).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %d continued 30 s ago, and the stale-ok gets near it still read another member%s", fi, c.describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for k := range keys {
		if got := get(fi, k); got != members[fi] {
			t.Errorf("once back, stale-ok get %d near member %d read node %d", k, fi, got)
		}
	}
}
