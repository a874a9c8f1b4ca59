package multicast

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// callCluster is one group of 3 replicas (mem fabric, real time) and a
// started client on node 100 (retryAfter: its ClientConfig.RetryAfter).
func callCluster(t *testing.T, retryAfter time.Duration) (*testCluster, *Client) {
	t.Helper()
	tr, _ := tree.Parse("0:")
	tc := startCluster(t, clusterSpec{tree: tr, members: [][]rdma.NodeID{{1, 2, 3}}, cnodes: []rdma.NodeID{100},
		bcast: broadcast.Config{ElectionTimeout: time.Second}})
	tc.waitLeaders(t)
	sctx, cancel := context.WithTimeout(tc.ctx, 20*time.Second)
	defer cancel()
	c, err := StartClient(sctx, ClientConfig{Slot: 0, Inc: uint64(time.Now().UnixNano()), Tree: tr, Members: tc.spec.members,
		RetryAfter: retryAfter}, tc.nodes[100])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return tc, c
}

// eventually waits (bounded: a minute) until cond holds under c's lock.
func eventually(t *testing.T, c *Client, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: not %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

type waited struct {
	replies []Reply
	err     error
}

func waitAsync(u *Call, ctx context.Context) chan waited {
	ch := make(chan waited, 1)
	go func() {
		rs, err := u.Wait(ctx, time.Time{})
		ch <- waited{append([]Reply(nil), rs...), err}
	}()
	return ch
}

// TestReaperHandOver: when the reaper's context ends, the role goes to a
// caller still waiting, which then completes its own call (and the
// others'): no call is left without a reaper.
func TestReaperHandOver(t *testing.T) {
	_, c := callCluster(t, 0)
	dst := tree.Of(0)
	// A waits for a call it has not sent: it reaps and never completes.
	a, _, err := c.Begin(dst, 8)
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	aw := waitAsync(a, actx)
	eventually(t, c, "A is the reaper", func() bool { return c.rt.reaper == &a.w })
	// B waits too, not sent yet; C is sent and waits (A may reap it).
	b, pb, _ := c.Begin(dst, 8)
	copy(pb, "payloadB")
	bw := waitAsync(b, context.Background())
	eventually(t, c, "B waits", func() bool { return b.w.waiting })
	cc, pc, _ := c.Begin(dst, 8)
	copy(pc, "payloadC")
	cc.Send()
	cw := waitAsync(cc, context.Background())
	c.mu.Lock()
	before := c.rt.handOffs
	c.mu.Unlock()
	acancel()
	if r := <-aw; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("A's Wait = %v, want context.Canceled", r.err)
	}
	a.Release()
	eventually(t, c, "the reaper role handed to B", func() bool { return c.rt.handOffs > before && c.rt.reaper != nil })
	b.Send()
	for name, w := range map[string]chan waited{"B": bw, "C": cw} {
		r := <-w
		if r.err != nil || len(r.replies) != 1 || r.replies[0].Group != 0 || r.replies[0].Index == 0 {
			t.Fatalf("%s: %v %+v, want group 0's reply", name, r.err, r.replies)
		}
	}
	b.Release()
	cc.Release()
	eventually(t, c, "no reaper once no call waits", func() bool { return c.rt.reaper == nil && len(c.rt.waiters) == 0 })
}

// TestReaperParkedWoken: a reaper parked on the doorbell (its own call
// never completes, no retry is due) is woken by another caller's reply
// and completes that call, which thus does not wait for the reaper's
// timeout.
func TestReaperParkedWoken(t *testing.T) {
	_, c := callCluster(t, time.Hour) // no retry while the test runs
	dst := tree.Of(0)
	a, _, err := c.Begin(dst, 8)
	if err != nil {
		t.Fatal(err)
	}
	// Background: the reaper parks until its next deadline (1 s here),
	// or a ring. A cancellable context would cap its park at 1 ms.
	aw := waitAsync(a, context.Background())
	eventually(t, c, "A is the reaper", func() bool { return c.rt.reaper == &a.w })
	ringWoken := 0
	for i := range 5 {
		c.mu.Lock()
		rings := c.rt.rings
		c.mu.Unlock()
		start := time.Now()
		o, err := c.Do(context.Background(), dst, []byte("payload"))
		took := time.Since(start)
		if err != nil || len(o.Replies) != 1 {
			t.Fatalf("call %d: %v %+v", i, err, o.Replies)
		}
		select {
		case r := <-aw:
			t.Fatalf("the reaper's Wait returned: %v", r.err)
		default:
		}
		c.mu.Lock()
		if c.rt.reaper != &a.w {
			t.Fatalf("call %d: the reaper changed", i)
		}
		woken := c.rt.rings > rings
		c.mu.Unlock()
		if woken {
			ringWoken++
		} else {
			// the reaper's park (1 s) may have ended just as the reply
			// landed on a loaded machine: not every call must show it
			t.Logf("call %d (%v): no ring of the reaper's doorbell", i, took)
		}
	}
	if ringWoken == 0 {
		t.Fatal("no call completed through a ring of the parked reaper's doorbell (the replies did not wake it)")
	}
	// End A: Close ends it with ErrClosed.
	c.Close()
	if r := <-aw; !errors.Is(r.err, ErrClosed) {
		t.Fatalf("the reaper's Wait after Close = %v, want ErrClosed", r.err)
	}
}

// TestReaperParksWithoutTick: a reaper whose context can end (a
// cancellable one) and whose call does not complete parks on the
// doorbell without a 1 ms tick: after its first park (reapMaxPark) it
// hands the context to the keeper and sleeps until the client's next
// deadline (up to a second away) or a ring. Cancelling the context wakes
// it through a ring of the doorbell, not at that deadline.
func TestReaperParksWithoutTick(t *testing.T) {
	_, c := callCluster(t, time.Hour) // no retry while the test runs
	a, _, err := c.Begin(tree.Of(0), 8)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aw := waitAsync(a, ctx) // never sent: it never completes
	eventually(t, c, "A parks with its context watched", func() bool { return c.rt.reaper == &a.w && c.rt.watched == ctx.Done() })
	c.mu.Lock()
	parks, rings := c.rt.parks, c.rt.rings
	c.mu.Unlock()
	const idle = 300 * time.Millisecond // 300 parks with a 1 ms tick
	time.Sleep(idle)
	c.mu.Lock()
	n := c.rt.parks - parks
	c.mu.Unlock()
	// Without a tick, only the client's own deadlines (a second apart)
	// end its park.
	if n > 3 {
		t.Fatalf("the parked reaper woke %d times in %v with nothing to do (a tick?)", n, idle)
	}
	cancel()
	if r := <-aw; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("A's Wait = %v, want context.Canceled", r.err)
	}
	c.mu.Lock()
	woken := c.rt.rings > rings
	c.mu.Unlock()
	if !woken {
		t.Fatalf("the cancel did not ring the parked reaper's doorbell (it woke at its deadline)")
	}
	a.Release()
}
