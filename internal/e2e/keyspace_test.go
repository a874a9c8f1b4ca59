package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestOrderedKeyspaceProcesses: kvserver processes started from a TOML
// config that declares an ordered keyspace build its tree (every replica
// of group 0), and a client in this process puts keys and scans them back
// in order, both ways; after kill -9 of group 0's leader, the keys are
// still there (the new leader's tree) and the killed replica comes back.
func TestOrderedKeyspaceProcesses(t *testing.T) {
	s := loopbackSpec(t, "keyspace", "shm", 2)
	s.Extra = "\n[[keyspace]]\nname = \"users\"\nkind = \"ordered\"\nnode_size = \"2KiB\"\n"
	c := newCluster(t, s)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	if len(cl.Map().Keyspaces) != 1 || cl.Map().Keyspaces[0].NodeSize != 2048 {
		t.Fatalf("the client's map has keyspaces %+v", cl.Map().Keyspaces)
	}
	users := cl.Keyspace("users")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 300 // several leaves of 2 KiB, and more than a scan page
	for i := n - 1; i >= 0; i-- {
		if _, err := users.Put(ctx, fmt.Appendf(nil, "user%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	check := func(when string) {
		t.Helper()
		i := 0
		for kv, err := range users.Scan(ctx, nil, nil) {
			if err != nil {
				t.Fatalf("%s: scan: %v", when, err)
			}
			if want := fmt.Sprintf("user%04d=v%d", i, i); string(kv.Key)+"="+string(kv.Value) != want {
				t.Fatalf("%s: scan pair %d is %s=%s, want %s", when, i, kv.Key, kv.Value, want)
			}
			i++
		}
		if i != n {
			t.Fatalf("%s: scan returned %d pairs, want %d", when, i, n)
		}
		i = n - 1
		for kv, err := range users.Scan(ctx, []byte("user0100"), []byte("user0200"), client.Reverse(), client.WithLimit(10)) {
			if err != nil {
				t.Fatalf("%s: reverse scan: %v", when, err)
			}
			if want := fmt.Sprintf("user%04d", 199-(n-1-i)); string(kv.Key) != want {
				t.Fatalf("%s: reverse scan: %s, want %s", when, kv.Key, want)
			}
			i--
		}
		if i != n-11 {
			t.Fatalf("%s: reverse scan with limit 10 returned %d pairs", when, n-1-i)
		}
	}
	check("after the puts")
	if _, err := cl.Get(ctx, []byte("user0001")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the hashed keyspace sees an ordered key: %v", err)
	}

	lead := c.leader(0, 20*time.Second)
	c.kill(lead)
	c.logf("group 0's leader %d killed", lead)
	if _, err := users.Put(ctx, []byte("user9999"), []byte("after")); err != nil {
		t.Fatalf("put after the leader's kill: %v%s", err, c.describe())
	}
	if _, err := users.Delete(ctx, []byte("user9999")); err != nil {
		t.Fatalf("delete after the leader's kill: %v", err)
	}
	check("after the leader's kill")
	c.start(lead)
	c.waitReady(30*time.Second, lead)
	check("after the restart")
}
