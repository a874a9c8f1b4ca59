package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// keyIn is a key that group g holds.
func keyIn(c *client.Client, g uint32, prefix string) []byte {
	for i := 0; ; i++ {
		if k := fmt.Appendf(nil, "%s%d", prefix, i); c.Map().GroupOf(k) == g {
			return k
		}
	}
}

// pauseGroup stops polling two of group g's three replicas: their memory
// stays readable (their headers say they are up and can vote), but the
// group answers nothing: it looks like an election under way, for good.
func pauseGroup(t *testing.T, lc interface{ Pause(g, i int) }, g int) {
	t.Helper()
	lc.Pause(g, 1)
	lc.Pause(g, 2)
}

// TestOpenHonoursCtx: Open given a ctx that is already done fails at
// once with ctx's error; Open whose ctx ends while a group that could
// elect a leader has not registered the client fails with an error
// wrapping ctx's error (and ErrUnavailable) that names the group, rather
// than returning once ctx is over (it used to return a client whose ctx
// had ended, as if the group could not elect).
func TestOpenHonoursCtx(t *testing.T) {
	lc := startLocal(t, testMap("openctx", "mem", 2, 3))
	c0 := open(t, lc, 0)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := lc.ClientNode(1)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := client.Open(cancelled, client.WithMap(lc.Map), client.WithNode(n), client.WithSlot(1)); !errors.Is(err, context.Canceled) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Open with a cancelled ctx: %v, want context.Canceled", err)
	}

	// Group 1 answers nothing, but its headers say it can elect.
	if _, err := c0.Put(context.Background(), keyIn(c0, 1, "warm"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	pauseGroup(t, lc, 1)
	ctx, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	c, err := client.Open(ctx, client.WithMap(lc.Map), client.WithNode(n), client.WithSlot(1))
	if err == nil {
		c.Close()
		t.Fatalf("Open returned a client after its ctx ended (group 1 never registered it)")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Open: %v, want an error wrapping context.DeadlineExceeded and ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "group 1") {
		t.Fatalf("Open: %q does not name group 1", err)
	}
	t.Logf("Open with a 3 s ctx: %v", err)
}

// TestRegistersGroupLater: a client that opened while a group answered
// nothing fails its writes to that group at once with *UnavailableError,
// and keeps registering in the background: once the group answers again,
// its writes work, without a new Open.
func TestRegistersGroupLater(t *testing.T) {
	lc := startLocal(t, testMap("later", "mem", 2, 2))
	c0 := open(t, lc, 0)
	k1 := keyIn(c0, 1, "k")
	if _, err := c0.Put(context.Background(), k1, []byte("v0")); err != nil {
		t.Fatal(err)
	}
	pauseGroup(t, lc, 1)
	c := open(t, lc, 1, client.WithDegradedOpen())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, keyIn(c, 0, "k"), []byte("v")); err != nil {
		t.Fatalf("write to group 0: %v", err)
	}
	var ue *client.UnavailableError
	if _, err := c.Put(ctx, k1, []byte("v1")); !errors.As(err, &ue) || ue.Group != 1 {
		t.Fatalf("write to group 1 while it answers nothing: %v, want *UnavailableError of group 1", err)
	}
	lc.ResumeReplica(1, 1)
	lc.ResumeReplica(1, 2)
	for {
		_, err := c.Put(ctx, k1, []byte("v1"))
		if err == nil {
			break
		}
		if !errors.As(err, &ue) || ctx.Err() != nil {
			t.Fatalf("write to group 1 after it came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v, err := c.Get(ctx, k1); err != nil || string(v) != "v1" {
		t.Fatalf("get of group 1's key: %q, %v", v, err)
	}
}
