package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
)

// The failures combineHold tells apart (its planted bugs' subtests assert
// which one they got).
var (
	errStalled   = errors.New("a queued write with no message of its group in flight and nobody posting")
	errNotHeld   = errors.New("a write posted past the hold")
	errDropped   = errors.New("a queued write was never sent")
	errNotOwn    = errors.New("a write got another write's result")
	errNotPacked = errors.New("the queued writes went out in more messages than they fill")
)

// TestCombineHold: a client whose hold is 1 (WithCombineHold) has one
// message of group 0 in flight (the group is paused, so it does not
// complete). A write to group 1 meanwhile goes out and completes: the hold
// is per group. Then 40 writers put to group 0's keys: none posts a message
// (each finds the group's message in flight and queues). When the group
// resumes, the completion posts the queue: all 40 writes go out, in as few
// messages as their encoded size allows (each full but the last; the
// count from kv's request sizes and the slot's payload), and each writer
// gets its own write's result (Prev is its key's version from before, the
// key then reads back its value at the returned version). The combiner's
// liveness rule is checked all along: a group with writes queued has a
// message in flight or a caller posting (else nothing would post them).
// Planted bugs, each caught by its own failure: holdAnyGroup (the hold
// counts every group's messages: group 1's write queues with nothing of
// its group in flight, errStalled), dropOverflow (a write that does not
// fit the message being filled leaves the queue unsent, errDropped),
// shiftResults (op i of a message gets op i+1's result, errNotOwn).
func TestCombineHold(t *testing.T) {
	runPlanted(t, []planted{{"", nil}, {"holdAnyGroup", errStalled}, {"dropOverflow", errDropped}, {"shiftResults", errNotOwn}}, combineHold)
}

func combineHold(t *testing.T, plant string) error {
	lc := startLocal(t, testMap("combhold", "mem", 2, 1))
	c := open(t, lc, 0, client.WithTimeout(time.Minute), client.WithCombineHold(1))
	switch plant {
	case "holdAnyGroup":
		client.PlantHoldAnyGroup(c)
	case "dropOverflow":
		client.PlantDropOverflow(c)
	case "shiftResults":
		client.PlantShiftResults(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Values large enough that a slot holds a dozen puts, not kv.MaxMulti.
	val := func(tag string) []byte { return append([]byte(tag+"-"), bytes.Repeat([]byte("v"), 300)...) }
	const writers = 40
	const total = writers + 1 // and one more past the hold
	keys := make([][]byte, writers+1)
	prev := make([]uint64, writers+1) // each key's version before the pause
	for i := range keys {
		keys[i] = keyIn(c, 0, fmt.Sprintf("w%d-", i))
		r, err := c.Put(ctx, keys[i], val("before"))
		if err != nil {
			t.Fatal(err)
		}
		prev[i] = r.Version
	}
	if _, err := c.Put(ctx, keyIn(c, 1, "g1-"), val("before")); err != nil {
		t.Fatal(err)
	}
	_, waitFor := combinerWaits(c, 2)

	resume := pauseAll(lc, 0)
	var wg sync.WaitGroup
	defer func() { cancel(); resume(); wg.Wait() }()
	// 40 writers put to group 0's keys, which cannot complete.
	st0 := c.Stats()
	type outcome struct {
		i   int
		r   client.WriteResult
		err error
	}
	done := make(chan outcome, total)
	for i := range writers {
		wg.Go(func() {
			r, err := c.Put(ctx, keys[i], val(fmt.Sprintf("held%d", i)))
			done <- outcome{i, r, err}
		})
	}
	// arrived: every writer's write is queued or in a message, and
	// nobody is posting.
	arrived := func(n int) func() bool {
		return func() bool {
			_, q, s := client.CombinerGroup(c, 0)
			return !s && int(c.Stats().WriteOps-st0.WriteOps)+q == n
		}
	}
	if err := waitFor("40 writes queued or sent", arrived(writers)); err != nil {
		return err
	}
	// The group has more writes under way than window slots: one more
	// write queues (the hold), whether the window is full or not.
	n0, q0, _ := client.CombinerGroup(c, 0)
	w0 := c.Stats().WriteOps - st0.WriteOps
	wg.Go(func() {
		r, err := c.Put(ctx, keys[writers], val("held40"))
		done <- outcome{writers, r, err}
	})
	if err := waitFor("41 writes queued or sent", arrived(writers+1)); err != nil {
		return err
	}
	if n, q, _ := client.CombinerGroup(c, 0); n != n0 || q != q0+1 {
		return fmt.Errorf("%w: %d messages (%d writes) in flight and %d writes queued, then %d and %d after one more write", errNotHeld, n0, w0, q0, n, q)
	}
	// Group 1 is not held by group 0's writes.
	g1 := make(chan error, 1)
	wg.Go(func() { _, err := c.Put(ctx, keyIn(c, 1, "g1-"), val("during")); g1 <- err })
	var g1err error
	if err := waitFor("group 1's write", func() bool {
		select {
		case g1err = <-g1:
			return true
		default:
			return false
		}
	}); err != nil {
		return err
	}
	if g1err != nil {
		return fmt.Errorf("group 1's write while group 0 was paused: %w", g1err)
	}
	stq := c.Stats() // the queued writes are sent from here on
	resume()
	got := 0
	var first error
	if err := waitFor("the queued writes' results", func() bool {
		for {
			select {
			case o := <-done:
				got++
				if o.err != nil && first == nil {
					first = fmt.Errorf("write %d: %v", o.i, o.err)
				}
				if o.err == nil && o.r.Prev != prev[o.i] && first == nil {
					first = fmt.Errorf("%w: write %d of key %q returned Prev %#x, the key's version was %#x", errNotOwn, o.i, keys[o.i], o.r.Prev, prev[o.i])
				}
				if o.err == nil {
					prev[o.i] = o.r.Version
				}
				continue
			default:
			}
			if got == total {
				return true
			}
			// Everything queued went out and came back, yet a writer
			// still waits: its write was never sent.
			n, q, s := client.CombinerGroup(c, 0)
			return n == 0 && q == 0 && !s && c.Stats().WriteOps-st0.WriteOps < total+1
		}
	}); err != nil {
		return err
	}
	st := c.Stats()
	if sent := st.WriteOps - st0.WriteOps - 1; sent != total { // (less group 1's)
		return fmt.Errorf("%w: %d writes, %d sent; %d returned", errDropped, total, sent, got)
	}
	if first != nil {
		return first
	}
	// Each key reads back its value at the version its write returned.
	for i, k := range keys {
		it, err := c.GetItem(ctx, k, client.Linearizable)
		if err != nil {
			return err
		}
		if want := val(fmt.Sprintf("held%d", i)); !bytes.Equal(it.Value, want) || it.Version != prev[i] {
			return fmt.Errorf("%w: key %q reads %.12q at %#x, its write returned version %#x", errNotOwn, k, it.Value, it.Version, prev[i])
		}
	}
	// As few messages as the queued writes fill: any per of them fit a
	// message (per from the largest write's encoded size), so each
	// message but the last carries at least per.
	largest := 0
	for i, k := range keys {
		largest = max(largest, kv.RequestSize([]kv.Op{{Kind: kv.OpPut, Key: k, Value: val(fmt.Sprintf("held%d", i))}}))
	}
	per := min(kv.MaxMulti, (multicast.MaxPayload(lc.Map.Limits.SlotSize)-4)/(largest-4))
	queued := q0 + 1
	msgs := st.WriteMessages - stq.WriteMessages
	if want := (queued + per - 1) / per; msgs > uint64(want) {
		return fmt.Errorf("%w: %d writes in %d messages, want at most %d (%d fit a message)", errNotPacked, queued, msgs, want, per)
	}
	t.Logf("%d writes: %d in %d messages before the group answered, %d queued and then sent in %d messages (%d fit one)", total, w0, n0, queued, msgs, per)
	return nil
}
