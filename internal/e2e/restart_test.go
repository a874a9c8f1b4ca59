package e2e

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestWholeGroupRestart stops every replica of a group (SIGTERM), which
// loses the group's data (it lives in memory only), and starts them again
// from their data dirs. They restart as the same members, each waiting to
// catch up from a member that has the data, and none has: the group must
// not come back on its own as an empty group that serves (acknowledged
// writes would turn into "not found"), and /readyz says it is not ready.
// The way back that docs/deploy.md gives: stop the replicas, remove their
// data dirs (replica-N), start them again: the group starts over, empty,
// and serves.
func TestWholeGroupRestart(t *testing.T) {
	c := newCluster(t, loopbackSpec(t, "whole", "shm", 1))
	c.startAll()
	ids := c.allIDs()
	c.waitReady(30*time.Second, ids...)
	cl := c.openClient(0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	for _, id := range ids {
		if code := c.term(id); code != 0 {
			t.Fatalf("replica %d: exit code %d after SIGTERM", id, code)
		}
	}
	for _, id := range ids {
		c.start(id)
	}
	const wait = 2 * time.Second
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		for _, id := range ids {
			s, err := c.status(id)
			if err != nil {
				t.Fatalf("replica %d: %v", id, err)
			}
			if s.Serving || s.Role == "leader" {
				t.Fatalf("replica %d leads a group whose every member restarted with no data: %+v", id, s)
			}
			if ok, why := c.ready(id); ok {
				t.Fatalf("replica %d is ready, its group lost its data: %s", id, why)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, why := c.ready(ids[0])
	c.logf("every replica restarted from its data dir: none leads or is ready after %v (/readyz: %s)", wait, why)

	// Start over: stop, remove the data dirs, start.
	for _, id := range ids {
		if code := c.term(id); code != 0 {
			t.Fatalf("replica %d: exit code %d after SIGTERM", id, code)
		}
		if err := os.RemoveAll(c.cfg.ReplicaDir(id)); err != nil {
			t.Fatal(err)
		}
	}
	c.startAll()
	c.waitReady(30*time.Second, ids...)
	for _, id := range ids {
		if p := c.proc(id); !p.logged("replica starting") || !strings.Contains(p.stderr.String(), "start=new") && !strings.Contains(p.stderr.String(), "start=rejoin") {
			t.Errorf("replica %d did not start as a new member: %s", id, p.stderr.String())
		}
	}
	cl = c.openClient(1)
	if _, err := cl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("get k from the group started over: %v, want ErrNotFound (its data was lost)", err)
	}
	if _, err := cl.Put(ctx, []byte("k"), []byte("w")); err != nil {
		t.Errorf("put into the group started over: %v", err)
	}
	if v, err := cl.Get(ctx, []byte("k")); err != nil || string(v) != "w" {
		t.Errorf("get k: %q, %v; want w", v, err)
	}
	c.logf("data dirs removed: the group started over, empty, and serves")
}
