package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

var (
	errNeverBusy = errors.New("the group never turned busy")
	errStillBusy = errors.New("the group stayed busy under a lone writer")
	errLoneHeld  = errors.New("a lone writer's puts went out combined")
)

// TestCombineBusyHold: a client with the default hold on a memory cluster
// uses the busy hold. A lone writer's 20 puts go out in 20 messages (no
// write arrives during its round trips) and the group is not busy. Then
// bursts of 40 writers, each held back by the paused group until all 40
// arrived, turn the group busy. While busy, with the group paused, a
// write that finds nothing of its group in flight posts at once, and the
// next one queues behind it (the hold of 1) although the window has room;
// on resume both complete. Then a lone writer's 20 puts again go out one
// a message, and the group is no longer busy. The combiner's liveness
// rule (writes queued: a message in flight or a caller posting) is
// checked all along. Planted bugs, each caught by its own failure:
// busyNoFlight (the busy hold holds a group with nothing in flight: the
// first write stalls, errStalled), busyStuck (a busy group never turns
// back: errStillBusy).
func TestCombineBusyHold(t *testing.T) {
	runPlanted(t, []planted{{"", nil}, {"busyNoFlight", errStalled}, {"busyStuck", errStillBusy}}, combineBusy)
}

// planted is a planted bug's name ("": none) and the failure it must
// cause (nil: none).
type planted struct {
	plant string
	want  error
}

// runPlanted runs f for each case in a subtest and checks that it failed
// with the case's failure.
func runPlanted(t *testing.T, cases []planted, f func(t *testing.T, plant string) error) {
	for _, tc := range cases {
		name := tc.plant
		if name == "" {
			name = "correct"
		}
		t.Run(name, func(t *testing.T) {
			err := f(t, tc.plant)
			switch {
			case tc.want == nil && err != nil:
				t.Fatal(err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("planted %s: got %v, want %v", tc.plant, err, tc.want)
			case tc.want != nil:
				t.Logf("caught: %v", err)
			}
		})
	}
}

// combinerWaits returns checks of c's write combiner on its first groups:
// stalled, its liveness rule (a group with writes queued has a message in
// flight or a caller posting), and waitFor, which polls cond until it
// holds, the rule fails, or a minute passes.
func combinerWaits(c *client.Client, groups uint32) (stalled func() error, waitFor func(what string, cond func() bool) error) {
	stalled = func() error {
		for g := range groups {
			if n, q, s := client.CombinerGroup(c, g); q > 0 && n == 0 && !s {
				return fmt.Errorf("%w: group %d has %d writes queued", errStalled, g, q)
			}
		}
		return nil
	}
	waitFor = func(what string, cond func() bool) error {
		for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(100 * time.Microsecond) {
			if err := stalled(); err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("a minute without %s", what)
			}
		}
		return stalled()
	}
	return stalled, waitFor
}

func combineBusy(t *testing.T, plant string) error {
	lc := startLocal(t, testMap("combbusy", "mem", 2, 1))
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	switch plant {
	case "busyNoFlight":
		client.PlantBusyNoFlight(c)
	case "busyStuck":
		client.PlantBusyStuck(c)
	}
	if on, _ := client.CombineBusy(c, 0); !on || client.CombineHold(c) != lc.Map.Limits.ClientSlots {
		return fmt.Errorf("a memory cluster's default client: busy hold %v, hold %d; want the busy hold and the whole window", on, client.CombineHold(c))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, waitFor := combinerWaits(c, 2)
	// lone: one writer's 20 puts to group 0, each its own message.
	lone := func(tag string) error {
		st0 := c.Stats()
		for i := range 20 {
			if _, err := c.Put(ctx, keyIn(c, 0, fmt.Sprintf("%s%d-", tag, i)), []byte("v")); err != nil {
				return err
			}
		}
		st := c.Stats()
		if msgs, ops := st.WriteMessages-st0.WriteMessages, st.WriteOps-st0.WriteOps; msgs != ops {
			return fmt.Errorf("%w: %d puts in %d messages", errLoneHeld, ops, msgs)
		}
		return nil
	}
	if err := lone("a"); err != nil {
		return err
	}
	if _, busy := client.CombineBusy(c, 0); busy {
		return fmt.Errorf("%w: group 0 busy after a lone writer", errStillBusy)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Bursts: 40 writers arrive while group 0 is paused.
	for round := 0; ; round++ {
		if _, busy := client.CombineBusy(c, 0); busy {
			break
		}
		if round == 5 {
			return fmt.Errorf("%w: 5 bursts of 40 writers", errNeverBusy)
		}
		st0 := c.Stats()
		resume := pauseAll(lc, 0)
		errs := make(chan error, 40)
		for i := range 40 {
			wg.Go(func() {
				_, err := c.Put(ctx, keyIn(c, 0, fmt.Sprintf("b%d-%d-", round, i)), []byte("v"))
				errs <- err
			})
		}
		err := waitFor("40 writes queued or sent", func() bool {
			_, q, s := client.CombinerGroup(c, 0)
			return !s && int(c.Stats().WriteOps-st0.WriteOps)+q == 40
		})
		resume()
		if err != nil {
			return err
		}
		for range 40 {
			if err := <-errs; err != nil {
				return err
			}
		}
	}
	// Busy: the first write posts (nothing in flight), the next queues.
	resume := pauseAll(lc, 0)
	errs := make(chan error, 2)
	put := func(tag string) {
		wg.Go(func() {
			_, err := c.Put(ctx, keyIn(c, 0, tag), []byte("v"))
			errs <- err
		})
	}
	put("first-")
	err := waitFor("the first write sent", func() bool { n, _, s := client.CombinerGroup(c, 0); return n == 1 && !s })
	if err == nil {
		put("second-")
		err = waitFor("the second write queued", func() bool { _, q, s := client.CombinerGroup(c, 0); return q == 1 && !s })
		if err == nil {
			if n, _, _ := client.CombinerGroup(c, 0); n != 1 {
				err = fmt.Errorf("%w: %d messages in flight, want the busy group held at 1", errNotHeld, n)
			}
		}
	}
	resume()
	if err != nil {
		cancel() // (a stalled write ends with its context)
		return err
	}
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	// A lone writer again: one write a message, and the group calms.
	if err := lone("c"); err != nil {
		return err
	}
	if _, busy := client.CombineBusy(c, 0); busy {
		return fmt.Errorf("%w: after 20 lone puts", errStillBusy)
	}
	return nil
}
