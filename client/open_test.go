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
// once with ctx's error. Open whose ctx ends while no group registered
// the client (every group answers nothing, though their headers say they
// could elect) fails with an error wrapping ctx's error and
// ErrUnavailable that names each group; it used to fail with an error
// that wrapped neither. Open whose ctx ends while one group registered
// it serves that group, and a write to the other fails at once with
// *UnavailableError.
func TestOpenHonoursCtx(t *testing.T) {
	lc := startLocal(t, testMap("openctx", "mem", 2, 3))
	c0 := open(t, lc, 0)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	n1, err := lc.ClientNode(1)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := client.Open(cancelled, client.WithMap(lc.Map), client.WithNode(n1), client.WithSlot(1)); !errors.Is(err, context.Canceled) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Open with a cancelled ctx: %v, want context.Canceled", err)
	}
	k0, k1 := keyIn(c0, 0, "k"), keyIn(c0, 1, "k")
	for _, k := range [][]byte{k0, k1} {
		if _, err := c0.Put(context.Background(), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}

	// Group 1 answers nothing, but its headers say it can elect.
	pauseGroup(t, lc, 1)
	ctx, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	c, err := client.Open(ctx, client.WithMap(lc.Map), client.WithNode(n1), client.WithSlot(1))
	if err != nil {
		t.Fatalf("Open while group 1 answers nothing: %v (group 0 serves)", err)
	}
	defer c.Close()
	wctx, cancel3 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel3()
	if _, err := c.Put(wctx, k0, []byte("w")); err != nil {
		t.Fatalf("write to group 0: %v", err)
	}
	var ue *client.UnavailableError
	if _, err = c.Put(wctx, k1, []byte("w")); !errors.As(err, &ue) || ue.Group != 1 {
		t.Fatalf("write to group 1 while it answers nothing: %v, want *UnavailableError of group 1", err)
	}
	t.Logf("Open with a 3 s ctx while group 1 answers nothing: writes to group 1: %v", err)

	// Now group 0 answers nothing too: no group can register a client.
	pauseGroup(t, lc, 0)
	n2, err := lc.ClientNode(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx4, cancel4 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel4()
	if c, err := client.Open(ctx4, client.WithMap(lc.Map), client.WithNode(n2), client.WithSlot(2)); err == nil {
		c.Close()
		t.Fatalf("Open succeeded while no group answers")
	} else if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrUnavailable) ||
		!strings.Contains(err.Error(), "group 0") || !strings.Contains(err.Error(), "group 1") {
		t.Fatalf("Open while no group answers: %v, want an error wrapping context.DeadlineExceeded and ErrUnavailable naming groups 0 and 1", err)
	} else {
		t.Logf("Open with a 3 s ctx while no group answers: %v", err)
	}
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
