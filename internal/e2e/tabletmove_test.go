package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestTabletMoveProcesses: kvserver processes, a keyspace without split
// points (group 0 serves it all), 300 keys; a client in this process
// moves the tablet to group 1 while the leaders of both groups are
// killed with -9 during the move. The move is run again until it
// completes (every step is idempotent); the killed replicas restart and
// replay their logs; then every key is in group 1 with its value, also
// after group 1's leader, and then group 0's, is killed again (so the
// replicas that restarted serve the moved tablet, or no longer serve
// it).
func TestTabletMoveProcesses(t *testing.T) {
	s := loopbackSpec(t, "tabletmove", "shm", 2)
	s.Extra = "\n[[keyspace]]\nname = \"users\"\nkind = \"ordered\"\nnode_size = \"2KiB\"\n"
	c := newCluster(t, s)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	users := cl.Keyspace("users")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 300
	for i := range n {
		if _, err := users.Put(ctx, fmt.Appendf(nil, "user%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	check := func(when string) {
		t.Helper()
		i := 0
		for kv, err := range users.Scan(ctx, nil, nil) {
			if err != nil {
				t.Fatalf("%s: scan: %v%s", when, err, c.describe())
			}
			if want := fmt.Sprintf("user%04d=v%d", i, i); string(kv.Key)+"="+string(kv.Value) != want {
				t.Fatalf("%s: scan pair %d is %s=%s, want %s", when, i, kv.Key, kv.Value, want)
			}
			i++
		}
		if i != n {
			t.Fatalf("%s: scan returned %d pairs, want %d", when, i, n)
		}
		for _, k := range []int{0, 150, n - 1} {
			v, err := users.Get(ctx, fmt.Appendf(nil, "user%04d", k))
			if err != nil || string(v) != fmt.Sprintf("v%d", k) {
				t.Fatalf("%s: get %d: %q %v", when, k, v, err)
			}
		}
	}
	l0, l1 := c.leader(0, 20*time.Second), c.leader(1, 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- cl.MoveTablet(ctx, []byte{}, 1) }()
	c.kill(l0)
	c.logf("group 0's leader %d killed during the move", l0)
	time.Sleep(20 * time.Millisecond)
	c.kill(l1)
	c.logf("group 1's leader %d killed during the move", l1)
	err := <-done
	for try := 0; err != nil && try < 10; try++ {
		c.logf("move: %v; again", err)
		err = cl.MoveTablet(ctx, []byte{}, 1)
	}
	if err != nil {
		t.Fatalf("the move did not complete: %v%s", err, c.describe())
	}
	c.logf("the move completed")
	tbs, err := cl.Tablets(ctx)
	if err != nil || len(tbs) != 1 || tbs[0].Group != 1 || tbs[0].State != "serving" {
		t.Fatalf("tablets after the move: %+v %v", tbs, err)
	}
	check("after the move")
	c.start(l0)
	c.start(l1)
	c.waitReady(30*time.Second, l0, l1)
	check("after the restarts")
	for _, g := range []int{1, 0} {
		lead := c.leader(g, 20*time.Second)
		c.kill(lead)
		c.logf("group %d's leader %d killed after the move", g, lead)
		check(fmt.Sprintf("after group %d's leader's kill", g))
		c.start(lead)
		c.waitReady(30*time.Second, lead)
	}
}
