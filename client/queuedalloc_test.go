package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
)

// TestQueuedPutAllocs: a put queued behind its group's full window (the
// group does not answer: its replicas are paused) that gives up at its
// deadline allocates nothing: it waits on its pooled op's Waiter, and the
// reaper (a caller whose put is in flight) pokes it at its deadline (it
// allocated one timer per such wait before 0e5483b, which pooled the
// timer; the timer went when every caller came to wait in Await).
// Likewise an ordered keyspace's put, queued behind the same window.
func TestQueuedPutAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := testMap("qalloc", "mem", 1, 1)
	m.Keyspaces = []cluster.Keyspace{{Name: "users", Kind: "ordered", ID: 1}}
	lc := startLocal(t, m)
	c := open(t, lc, 0, client.WithTimeout(time.Millisecond))
	bg := context.Background()
	wctx, wcancel := context.WithTimeout(bg, time.Minute)
	defer wcancel()
	if _, err := c.Put(wctx, []byte("warm"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	for i := range lc.Map.Groups[0] {
		lc.Pause(0, i)
	}
	// Fill the window with puts that wait (up to a minute) for the paused
	// group; they end when the test does (ctx cancelled).
	slots := lc.Map.Limits.ClientSlots
	var wg sync.WaitGroup
	defer func() {
		wcancel()
		for i := range lc.Map.Groups[0] {
			lc.ResumeReplica(0, i)
		}
		wg.Wait()
	}()
	for i := 0; ; i++ {
		inflight, _ := client.CombinerLoad(c)
		if inflight >= slots {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Put(wctx, []byte(fmt.Sprintf("block%d", i)), []byte("v"))
		}()
		// Until this put went out in a message of its own (one put at a
		// time: none is combined with another).
		for deadline := time.Now().Add(30 * time.Second); ; {
			if n, q := client.CombinerLoad(c); n > inflight && q == 0 {
				break
			}
			if time.Now().After(deadline) {
				n, q := client.CombinerLoad(c)
				t.Fatalf("put %d not sent: %d messages in flight, %d puts queued", i, n, q)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	key, val := []byte("queued"), []byte("v")
	put := func() {
		if _, err := c.Put(bg, key, val); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a put behind the full window: %v, want context.DeadlineExceeded", err)
		}
	}
	for range 5 {
		put()
	}
	if n := testing.AllocsPerRun(50, put); n > 0 {
		t.Errorf("a put queued behind the full window until its deadline: %v allocations, want 0", n)
	}
	// An ordered keyspace's put queues behind the same window (its group's).
	ks := c.Keyspace("users")
	oput := func() {
		if _, err := ks.Put(bg, key, val); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an ordered put behind the full window: %v, want context.DeadlineExceeded", err)
		}
	}
	for range 5 {
		oput()
	}
	if n := testing.AllocsPerRun(50, oput); n > 0 {
		t.Errorf("an ordered put queued behind the full window until its deadline: %v allocations, want 0", n)
	}
}
