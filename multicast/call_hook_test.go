package multicast

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/multicast/tree"
)

// TestOnDoneHook: a call's OnDone hook runs exactly once, on a goroutine
// waiting on the client (here an Await on the Waiter the hook settles),
// also when the call was done before OnDone was set (the client
// package's flush sets it after Send, and a reply may come first); and a
// call released before its hook ran never runs it. The planted hookLost
// (a hook set on a done call is dropped) and releaseKeepsHook (Release
// leaves the hook queued) are caught.
func TestOnDoneHook(t *testing.T) {
	_, c := callCluster(t, 0)
	c.stopKeeper() // only Await runs hooks here
	runPlanted(t, func(t *testing.T, k testingKnobs) error { return onDoneHook(t, c, k) }, []planted{
		{"hookLost", testingKnobs{hookLost: true}, errHookNotRun},
		{"releaseKeepsHook", testingKnobs{releaseKeepsHook: true}, errHookAfterRelease},
	})
}

// planted is a planted bug and the failure its check must report.
type planted struct {
	name  string
	knobs testingKnobs
	want  error
}

// runPlanted runs check without knobs (it must pass), then with each
// planted bug (it must fail with that bug's error).
func runPlanted(t *testing.T, check func(*testing.T, testingKnobs) error, bugs []planted) {
	t.Helper()
	t.Run("correct", func(t *testing.T) {
		if err := check(t, testingKnobs{}); err != nil {
			t.Fatal(err)
		}
	})
	for _, b := range bugs {
		t.Run(b.name, func(t *testing.T) {
			if err := check(t, b.knobs); !errors.Is(err, b.want) {
				t.Fatalf("planted %s: %v, want %v", b.name, err, b.want)
			}
		})
	}
}

var (
	errHookNotRun       = errors.New("the hook of a call done before OnDone did not run")
	errHookAfterRelease = errors.New("the hook of a call released before it ran ran")
)

// plant sets c's knobs under its lock; undo clears them, and the hooks a
// planted run left queued.
func plant(c *Client, knobs testingKnobs) (undo func()) {
	c.mu.Lock()
	c.knobs = knobs
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.knobs = testingKnobs{}
		c.rt.hooks = nil
		c.mu.Unlock()
	}
}

func onDoneHook(t *testing.T, c *Client, knobs testingKnobs) error {
	defer plant(c, knobs)()
	dst := tree.Of(0)
	bg := context.Background()

	// A call done before its hook is set: the hook runs once, on the
	// goroutine that waits for what it settles.
	u, p, err := c.Begin(dst, 8)
	if err != nil {
		return err
	}
	copy(p, "payloadA")
	u.Send()
	if _, err := u.Wait(bg, time.Time{}); err != nil {
		return err
	}
	w := NewWaiter()
	var runs atomic.Int32
	var replies int
	u.OnDone(func(k *Call) {
		runs.Add(1)
		rs, err := k.Result()
		if err == nil {
			replies = len(rs)
		}
		k.Release()
		w.Done()
	})
	// (a bounded wait: the hook, planted lost, never runs)
	if err := c.Await(bg, time.Now().Add(2*time.Second), w); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return errHookNotRun
		}
		return err
	}
	if n := runs.Load(); n != 1 || replies != 1 {
		t.Fatalf("the hook ran %d times and saw %d replies, want once and 1", n, replies)
	}

	// A call released before its hook ran: the hook never runs.
	u, p, err = c.Begin(dst, 8)
	if err != nil {
		return err
	}
	copy(p, "payloadB")
	u.Send()
	if _, err := u.Wait(bg, time.Time{}); err != nil {
		return err
	}
	var late atomic.Int32
	u.OnDone(func(*Call) { late.Add(1) })
	u.Release()
	// A wait runs whatever hooks are queued.
	if err := c.Await(bg, time.Now().Add(20*time.Millisecond), NewWaiter()); !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	c.mu.Lock()
	left := len(c.rt.hooks)
	c.mu.Unlock()
	if late.Load() != 0 {
		return errHookAfterRelease
	}
	if runs.Load() != 1 || left != 0 {
		t.Fatalf("hooks ran %d times, %d queued, want 1 and none", runs.Load(), left)
	}
	return nil
}

// TestAwaitEarlyDeadline: a waiter whose deadline is earlier than the
// end of the parked reaper's park rings the doorbell, so that the reaper
// looks at it (and pokes the waiter) at that deadline, not when its own
// park ends: the reaper's park ends by a ring (counted). The planted
// earlySleeps (no ring) is caught: the park ends at the reaper's own
// deadline, with no ring.
func TestAwaitEarlyDeadline(t *testing.T) {
	_, c := callCluster(t, time.Hour) // no retry while the test runs
	runPlanted(t, func(t *testing.T, k testingKnobs) error { return awaitEarlyDeadline(t, c, k) }, []planted{
		{"earlySleeps", testingKnobs{earlySleeps: true}, errReaperNotRung},
	})
}

var errReaperNotRung = errors.New("the parked reaper was not rung for an earlier deadline")

func awaitEarlyDeadline(t *testing.T, c *Client, knobs testingKnobs) error {
	defer plant(c, knobs)()
	// A: the reaper, its call never sent, parked until a deadline 1 s
	// away (context.Background: no 1 ms cap).
	a, _, err := c.Begin(tree.Of(0), 8)
	if err != nil {
		return err
	}
	aw := make(chan error, 1)
	go func() {
		_, err := a.Wait(context.Background(), time.Now().Add(time.Second))
		aw <- err
	}()
	eventually(t, c, "A parks", func() bool { return c.rt.reaper == &a.w && c.rt.parkUntil != 0 })
	c.mu.Lock()
	rings := c.rt.rings
	c.mu.Unlock()
	// B waits for nothing with a deadline 20 ms away.
	if err := c.Await(context.Background(), time.Now().Add(20*time.Millisecond), NewWaiter()); !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	c.mu.Lock()
	rung := c.rt.rings > rings
	c.mu.Unlock()
	if err := <-aw; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("A's Wait = %v, want context.DeadlineExceeded", err)
	}
	a.Release()
	if !rung {
		return errReaperNotRung
	}
	return nil
}
