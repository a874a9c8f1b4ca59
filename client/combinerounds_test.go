package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
)

// The failures combineRounds tells apart.
var (
	errNotRound = errors.New("a write posted while another group's young message was in flight")
	errStuck    = errors.New("a group that does not answer held another group's write past the round's bound")
)

// TestCombineRounds: a client with rounds (WithCombineRounds) and a hold of
// 1 on two groups; group 0 is paused with one message in flight. (1) With
// the round's bound an hour, a write to group 1 queues behind group 0's
// young message (nothing of group 1 in flight: only the round holds it),
// and once group 0 resumes and its message completes, the completion
// posts group 1's queue and the write completes. (2) With the default
// bound (roundMax, milliseconds), a write to group 1 completes while
// group 0 stays paused: a group that does not answer holds the others
// for the bound only, and the queued caller wakes by then to post. Planted
// bugs, each caught by its own failure: roundNone (rounds hold nothing:
// errNotRound in (1)), roundForever (the bound never ends: errStuck in
// (2), after the test's 20 s wait for the write). Which groups a round
// posts is decided before any posts (combiner.done): the count of messages
// is not asserted here, the benchmark's deliv_per_fsync is (durability
// plan, spipe's paragraph).
func TestCombineRounds(t *testing.T) {
	t.Run("held", func(t *testing.T) {
		runPlanted(t, []planted{{"", nil}, {"roundNone", errNotRound}}, func(t *testing.T, plant string) error { return combineRounds(t, plant, true) })
	})
	t.Run("bounded", func(t *testing.T) {
		runPlanted(t, []planted{{"", nil}, {"roundForever", errStuck}}, func(t *testing.T, plant string) error { return combineRounds(t, plant, false) })
	})
}

// pauseAll pauses every replica of group g; the function it returns
// resumes them (once, whoever calls it again).
func pauseAll(lc *localcluster.Cluster, g int) (resume func()) {
	for i := range lc.Map.Groups[g] {
		lc.Pause(g, i)
	}
	resumed := false
	return func() {
		if !resumed {
			resumed = true
			for i := range lc.Map.Groups[g] {
				lc.ResumeReplica(g, i)
			}
		}
	}
}

func combineRounds(t *testing.T, plant string, hold bool) error {
	lc := startLocal(t, testMap("combrounds", "mem", 2, 1))
	c := open(t, lc, 0, client.WithTimeout(time.Minute), client.WithCombineHold(1), client.WithCombineRounds(true))
	switch plant {
	case "roundNone":
		client.PlantRoundNone(c)
	case "roundForever":
		client.PlantRoundForever(c)
	}
	if hold {
		client.SetCombineRoundWait(c, time.Hour)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k0, k1 := keyIn(c, 0, "r0-"), keyIn(c, 1, "r1-")
	for _, k := range [][]byte{k0, k1} {
		if _, err := c.Put(ctx, k, []byte("before")); err != nil {
			return err
		}
	}
	// waitFor polls cond until it holds or wait passes.
	waitFor := func(what string, wait time.Duration, cond func() bool) error {
		for deadline := time.Now().Add(wait); !cond(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%v without %s", wait, what)
			}
		}
		return nil
	}
	resume := pauseAll(lc, 0)
	defer resume()
	put := func(k []byte, v string) chan error {
		ch := make(chan error, 1)
		go func() { _, err := c.Put(ctx, k, []byte(v)); ch <- err }()
		return ch
	}
	done0 := put(k0, "during")
	if err := waitFor("group 0's message in flight", time.Minute, func() bool {
		n, _, s := client.CombinerGroup(c, 0)
		return n == 1 && !s
	}); err != nil {
		return err
	}
	done1 := put(k1, "during")
	if !hold {
		// (2) group 0 stays paused: group 1's write must complete.
		var err1 error
		if err := waitFor("group 1's write", 20*time.Second, func() bool {
			select {
			case err1 = <-done1:
				return true
			default:
				return false
			}
		}); err != nil {
			return fmt.Errorf("%w: %v", errStuck, err)
		}
		if err1 != nil {
			return fmt.Errorf("group 1's write while group 0 was paused: %w", err1)
		}
		if n, _, _ := client.CombinerGroup(c, 0); n != 1 {
			return fmt.Errorf("group 0 has %d messages in flight while paused, want 1", n)
		}
		resume()
		return <-done0
	}
	// (1) group 1's write arrives: queued (the round), posted, or, posted
	// at once to the running group 1, already completed (the in-flight
	// window of a posted write may be shorter than a poll's sleep).
	completed := false
	if err := waitFor("group 1's write queued, sent or completed", time.Minute, func() bool {
		select {
		case err := <-done1:
			completed, done1 = true, make(chan error, 1)
			done1 <- err
			return true
		default:
		}
		n, q, s := client.CombinerGroup(c, 1)
		return !s && n+q == 1
	}); err != nil {
		return err
	}
	if completed {
		return fmt.Errorf("%w: group 1's write completed while group 0's message was in flight", errNotRound)
	}
	if n, q, _ := client.CombinerGroup(c, 1); n != 0 || q != 1 {
		return fmt.Errorf("%w: group 1 has %d messages in flight and %d writes queued, want 0 and 1", errNotRound, n, q)
	}
	resume()
	for g, ch := range []chan error{done0, done1} {
		if err := <-ch; err != nil {
			return fmt.Errorf("group %d's write: %w", g, err)
		}
	}
	for _, k := range [][]byte{k0, k1} {
		it, err := c.GetItem(ctx, k, client.Linearizable)
		if err != nil {
			return err
		}
		if string(it.Value) != "during" {
			return fmt.Errorf("key %q reads %q after its write, want %q", k, it.Value, "during")
		}
	}
	return nil
}

// TestCombineRoundsDefault: rounds on a sync cluster's map follow
// DefaultSyncCombineRounds (off), they are off on any other, and
// WithCombineRounds wins either way.
func TestCombineRoundsDefault(t *testing.T) {
	lc := startLocal(t, testMap("roundsdef", "mem", 2, 4))
	for slot, tc := range []struct {
		durability string
		opts       []client.Option
		want       bool
	}{
		{"", nil, false},
		{cluster.DurabilitySync, nil, client.DefaultSyncCombineRounds},
		{cluster.DurabilitySync, []client.Option{client.WithCombineRounds(false)}, false},
		{cluster.DurabilityAsync, []client.Option{client.WithCombineRounds(true)}, true},
	} {
		m := *lc.Map
		m.Durability = tc.durability
		n, err := lc.ClientNode(slot)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := client.Open(ctx, append([]client.Option{client.WithMap(&m), client.WithNode(n), client.WithSlot(slot)}, tc.opts...)...)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := client.CombineRounds(c); got != tc.want {
			t.Errorf("durability %q, %d options: rounds %v, want %v", tc.durability, len(tc.opts), got, tc.want)
		}
	}
}
