package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
)

// TestBalancerRemovesLeftover: a move of the one tablet from group 0 to
// group 1 stops after its ingest (group 0 holds it frozen, group 1 an
// installing copy). A balancer round leaves that live move's copy alone.
// Then an undo stops after its first step (the abort at group 0, which
// serves the tablet again at the move's generation) and group 1 keeps a
// leftover installing copy that no move finishes; keys are deleted and
// rewritten at group 0 meanwhile. The next round removes the leftover
// (group 1 lists no tablet any more, the status counts 1), every key is
// served once with its last value, and its keys at group 1 are
// deleted as garbage. Planted leftoverUnchecked (any overlapped
// installing tablet is removed, the frozen source not checked) removes
// the live move's copy at the first round; planted noLeftovers keeps the
// leftover: the test catches both.
func TestBalancerRemovesLeftover(t *testing.T) {
	for _, plant := range []string{"none", "leftoverUnchecked", "noLeftovers"} {
		t.Run(plant, func(t *testing.T) { balancerRemovesLeftover(t, plant) })
	}
}

func installingAt(t *testing.T, c *client.Client, g uint32) []btree.Tablet {
	t.Helper()
	tbs, err := client.GroupTablets(c, context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	var out []btree.Tablet
	for _, tb := range tbs {
		if tb.State == btree.TabletInstalling {
			out = append(out, tb)
		}
	}
	return out
}

func balancerRemovesLeftover(t *testing.T, plant string) {
	o := startOneTablet(t, "balleft"+plant, 2, 100)
	lc, op, ks, want := o.lc, o.c, o.ks, o.want
	ctx := context.Background()
	// The move stops before its drop: frozen at 0, installing at 1.
	moveStopsBefore(t, op, []byte{}, 1, "drop")
	if in := installingAt(t, op, 1); len(in) != 1 {
		t.Fatalf("after the ingest group 1 has installing tablets %+v", in)
	}

	bc := open(t, lc, 1)
	b := client.NewBalancer(client.BalancerConfig{StuckAfter: time.Hour})
	switch plant {
	case "leftoverUnchecked":
		client.PlantBalancerLeftoverUnchecked(b)
	case "noLeftovers":
		client.PlantBalancerNoLeftovers(b)
	}
	// A live move's copy survives a round (its source is frozen).
	if err := b.Round(ctx, bc); err != nil {
		t.Fatalf("round during the move: %v", err)
	}
	in := installingAt(t, op, 1)
	switch {
	case plant == "leftoverUnchecked" && len(in) == 0:
		t.Logf("planted %s caught: the live move's copy at group 1 was removed (status %+v)", plant, b.Status())
		return
	case len(in) != 1 || b.Status().Leftovers != 0:
		t.Fatalf("a round during the move: group 1 has installing tablets %+v, status %+v", in, b.Status())
	}
	gen := in[0].Gen

	// The undo stops after its abort at the source.
	if err := client.AbortAtSource(op, ctx, []byte{}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		k := fmt.Sprintf("k%04d", i)
		if _, err := ks.Delete(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
		delete(want, k)
		k = fmt.Sprintf("k%04d", 50+i)
		if _, err := ks.Put(ctx, []byte(k), []byte("new")); err != nil {
			t.Fatal(err)
		}
		want[k] = "new"
	}
	if in := installingAt(t, op, 1); len(in) != 1 || in[0].Gen != gen {
		t.Fatalf("after the abort at the source group 1 has %+v, want the leftover of generation %d", in, gen)
	}
	tbs, _ := tabletsOf(t, op)
	if len(tbs) != 1 || tbs[0].Group != 0 || tbs[0].State != "serving" || tbs[0].Gen != gen {
		t.Fatalf("after the abort at the source the tablets are %+v, want group 0 serving at %d", tbs, gen)
	}

	if err := b.Round(ctx, bc); err != nil {
		t.Fatalf("round after the interrupted undo: %v", err)
	}
	in = installingAt(t, op, 1)
	switch {
	case plant == "noLeftovers" && len(in) == 1:
		t.Logf("planted %s caught: group 1 keeps the leftover %+v", plant, in)
		return
	case plant != "none":
		t.Fatalf("the planted %s was not caught", plant)
	case len(in) != 0 || b.Status().Leftovers != 1:
		t.Fatalf("after a round group 1 has installing tablets %+v, status %+v", in, b.Status())
	}
	all, err := client.GroupTablets(op, ctx, 1)
	if err != nil || len(all) != 0 {
		t.Fatalf("group 1 lists %+v (%v), want nothing", all, err)
	}
	checkPairs(t, ks, want)
	// Its keys at group 1 became garbage, deleted (at the abort's apply
	// and after, or by the rounds' collection requests).
	for r := 0; ; r++ {
		g, err := op.GroupGarbage(ctx)
		if err == nil && g[1] == 0 {
			break
		}
		if r > 100 {
			t.Fatalf("group 1's garbage after %d rounds: %v %v, status %+v", r, g, err, b.Status())
		}
		if err := b.Round(ctx, bc); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Further rounds remove nothing more.
	if err := b.Round(ctx, bc); err != nil || b.Status().Leftovers != 1 {
		t.Fatalf("a later round: %v, status %+v", err, b.Status())
	}
}

// TestBalancerLeftoverReadOrder: the leftover check reads the target t
// first, then the group s that serves the range again, after t's read.
// Here a move of the one tablet from group 0 to group 1 freezes, ingests
// and drops (group 1's installing copy is then the tablet's only copy)
// between a round's read of group 0, which served the tablet at the
// generation before the move's, and its read of group 1. Group 0's
// answer predates the copy: taking it as a read of s would make a live
// move's copy a leftover, and two rules each stop that. The order: the
// read of s after t's finds group 0 without the tablet. The generations:
// group 0 served it below the copy's generation. Planted
// leftoverSourceFirst (no read of s after t's: the round's read of group
// 0, before group 1's) and planted leftoverAnyGen (a serving tablet
// shows a copy dead at any generation) each leave the copy, the other
// rule holding; both together remove the only copy, and the test
// catches that. Otherwise the move then finishes and every key reads
// back from group 1.
func TestBalancerLeftoverReadOrder(t *testing.T) {
	for _, plant := range []string{"none", "leftoverSourceFirst", "leftoverAnyGen", "both"} {
		t.Run(plant, func(t *testing.T) { balancerLeftoverReadOrder(t, plant) })
	}
}

func balancerLeftoverReadOrder(t *testing.T, plant string) {
	o := startOneTablet(t, "balorder"+plant, 2, 100)
	lc, op, ks := o.lc, o.c, o.ks
	ctx := context.Background()
	tbs, _ := tabletsOf(t, op)
	if len(tbs) != 1 || tbs[0].Group != 0 || tbs[0].State != "serving" {
		t.Fatalf("tablets %+v: want one, serving at group 0", tbs)
	}
	gen := tbs[0].Gen

	bc := open(t, lc, 1)
	b := client.NewBalancer(client.BalancerConfig{StuckAfter: time.Hour})
	if plant == "leftoverSourceFirst" || plant == "both" {
		client.PlantBalancerLeftoverSourceFirst(b)
	}
	if plant == "leftoverAnyGen" || plant == "both" {
		client.PlantBalancerLeftoverAnyGen(b)
	}
	// After the round's read of group 0: the move runs until its
	// activation.
	moved := false
	client.SetBalancerLeftoverReadHook(b, func(g uint32) {
		if g == 0 && !moved {
			moved = true
			moveStopsBefore(t, op, []byte{}, 1, "activate")
		}
	})
	if err := b.Round(ctx, bc); err != nil {
		t.Fatalf("round: %v", err)
	}
	if !moved {
		t.Fatalf("the move did not run between the round's reads")
	}
	if all, err := client.GroupTablets(op, ctx, 0); err != nil || len(all) != 0 {
		t.Fatalf("group 0 lists %+v (%v): want nothing (the move dropped the tablet)", all, err)
	}
	in := installingAt(t, op, 1)
	switch {
	case plant == "both" && len(in) == 0:
		t.Logf("planted leftoverSourceFirst and leftoverAnyGen caught: the live move's copy of generation %d at group 1, the only copy (group 0 dropped the tablet), was removed (status %+v)", gen+1, b.Status())
		return
	case plant == "both":
		t.Fatalf("planted leftoverSourceFirst and leftoverAnyGen not caught: group 1 has %+v", in)
	case len(in) != 1 || in[0].Gen != gen+1 || b.Status().Leftovers != 0:
		t.Fatalf("after the round group 1 has installing tablets %+v (want the move's copy of generation %d), status %+v", in, gen+1, b.Status())
	}
	// The move finishes (its activation alone is left).
	if err := op.MoveTablet(ctx, []byte{}, 1); err != nil {
		t.Fatalf("finishing the move: %v", err)
	}
	tbs, _ = tabletsOf(t, op)
	if len(tbs) != 1 || tbs[0].Group != 1 || tbs[0].State != "serving" || tbs[0].Gen != gen+1 {
		t.Fatalf("after the move the tablets are %+v, want group 1 serving at %d", tbs, gen+1)
	}
	checkPairs(t, ks, o.want)
}
