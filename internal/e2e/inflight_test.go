package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestInflightPutsAcrossGroupRestart (issue 19 D5): puts in flight when
// their whole group is killed (kill -9 of its three replicas, durability
// sync) and restarted from its data dirs must not wait for their
// context's deadline. The messages sat in the killed incarnation's
// memory; the client must see that the members it posted to restarted and
// fail those puts at once with ErrOutcomeUnknown (the write may or may
// not have been applied: it must not be sent again silently), freeing its
// window for new puts, which must then succeed.
//
// The writers' contexts last 2 minutes; the test waits a bounded time
// (inflightBudget after the group is ready again) for every call to
// return, and fails, naming the calls still under way, if one did not.
func TestInflightPutsAcrossGroupRestart(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) { inflightAcrossRestart(t, mode) })
	}
}

func inflightAcrossRestart(t *testing.T, mode string) {
	if testing.Short() {
		t.Skip("runs 6 kvserver processes")
	}
	const writers = 24
	const inflightBudget = 20 * time.Second
	s := loopbackSpec(t, "inflight", "shm", 2)
	s.Durability = mode
	c := newCluster(t, s)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	m := cl.Map()

	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		bad      []string
		under    atomic.Int64 // calls under way
		acked    atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for w := range writers {
		wg.Go(func() {
			n := 0
			for i := 0; !stop.Load(); i++ {
				key := keyOf(m, 1, fmt.Sprintf("w%d", w), &n)
				under.Add(1)
				_, err := cl.Put(ctx, key, []byte("v"))
				under.Add(-1)
				mu.Lock()
				switch {
				case err == nil:
					outcomes["ok"]++
					acked.Add(1)
				case errors.Is(err, client.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
					outcomes["outcome unknown"]++
				case errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded):
					// refused before it was sent (the group had not
					// registered the client): nothing applied
					outcomes["unavailable"]++
				default:
					outcomes["other"]++
					if len(bad) < 10 {
						bad = append(bad, fmt.Sprintf("writer %d put %q: %v", w, key, err))
					}
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for acked.Load() < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("warm-up: %d puts acknowledged in 30s%s", acked.Load(), c.describe())
		}
		time.Sleep(10 * time.Millisecond)
	}
	victims := c.members(1)
	for _, id := range victims {
		c.kill(id)
	}
	c.logf("kill -9 of group 1 (%v) with %d puts under way", victims, under.Load())
	time.Sleep(500 * time.Millisecond)
	for _, id := range victims {
		c.start(id)
	}
	c.waitReady(30*time.Second, victims...)
	mark := acked.Load()
	c.logf("group 1 ready again; %d puts under way", under.Load())

	// New puts must succeed: every writer's window is free again.
	deadline = time.Now().Add(inflightBudget)
	for acked.Load() < mark+200 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline) + time.Second):
		stuck := under.Load()
		cancel() // the writers return now; the test fails
		<-done
		mu.Lock()
		t.Fatalf("%d puts still under way %v after group 1 was ready again (their context lasts 2 minutes), %d acknowledged since: puts in flight at the whole-group kill wait for their deadline; outcomes once cancelled %v", stuck, inflightBudget, acked.Load()-mark, outcomes)
	}
	mu.Lock()
	defer mu.Unlock()
	c.logf("outcomes: %v", outcomes)
	for _, b := range bad {
		t.Errorf("unexpected error: %s", b)
	}
	if got := acked.Load() - mark; got < 200 {
		t.Errorf("only %d puts acknowledged after group 1 was ready again", got)
	}
}
