package client

import (
	"context"
	"errors"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
)

// PlantBalancerIgnoreBusy plants a bug in b: a round plans from the
// serving tablets alone, so it starts a move while another tablet is
// frozen or installing.
func PlantBalancerIgnoreBusy(b *Balancer) { b.knobs.ignoreBusy = true }

// PlantBalancerNoTakeover plants a bug in b: it never finishes a move
// another mover left half done.
func PlantBalancerNoTakeover(b *Balancer) { b.knobs.noTakeover = true }

// PlanBalanceLoad is the balancer's rule with the groups' loads as the
// tie-breaker.
var PlanBalanceLoad = planBalanceLoad

// PlantBalancerNoAbort plants a bug in b: a move of its own that keeps
// failing is never undone.
func PlantBalancerNoAbort(b *Balancer) { b.knobs.noAbort = true }

// UndoMove is the balancer's undoing of a move (undoMove).
func UndoMove(c *Client, ctx context.Context, low []byte) error { return c.undoMove(ctx, low) }

// PlantUndoUnchecked plants a bug in c's undoMove: the target forgets the
// tablet without the check that the source never dropped it.
func PlantUndoUnchecked(c *Client) { c.ord.undoUnchecked = true }

// PlanBalanceWrites is the balancer's rule by load (planBalanceWrites).
func PlanBalanceWrites(tablets []TabletInfo, loads []uint64, groups int, minWrites, splitKeys uint64) (low []byte, from, to uint32, split, ok, byLoad bool, rule string) {
	p, byLoad := planBalanceWrites(tablets, loads, groups, minWrites, splitKeys)
	return p.Low, p.From, p.To, p.Split, p.OK, byLoad, p.Rule
}

// PlantBalancerIgnoreLoad plants a bug in b: rounds never measure the
// tablets' load, so the rule by count always decides.
func PlantBalancerIgnoreLoad(b *Balancer) { b.knobs.ignoreLoad = true }

// PlanBalanceWritesPlanted is PlanBalanceWrites with a planted bug of
// the rule: "swap", "countUnguarded" or "splitPastMean" (planKnobs).
func PlanBalanceWritesPlanted(plant string, tablets []TabletInfo, loads []uint64, groups int, minWrites, splitKeys uint64) (low []byte, from, to uint32, split, ok, byLoad bool, rule string) {
	k := planKnobs{swap: plant == "swap", countUnguarded: plant == "countUnguarded", splitPastMean: plant == "splitPastMean"}
	p, byLoad := planBalanceWritesKnobs(tablets, loads, groups, minWrites, splitKeys, k)
	return p.Low, p.From, p.To, p.Split, p.OK, byLoad, p.Rule
}

// PlantBalancerNoCollect plants a bug in b: rounds send no garbage
// collection requests.
func PlantBalancerNoCollect(b *Balancer) { b.knobs.noCollect = true }

// PlantBalancerLeftoverUnchecked plants a bug in b: any installing
// tablet another group's tablet overlaps is removed as a leftover (no
// state or generation check, no second read).
func PlantBalancerLeftoverUnchecked(b *Balancer) { b.knobs.leftoverUnchecked = true }

// PlantBalancerNoLeftovers plants a bug in b: rounds never remove
// leftover installing tablets.
func PlantBalancerNoLeftovers(b *Balancer) { b.knobs.noLeftovers = true }

// PlantBalancerLeftoverSourceFirst plants a bug in b: the leftover
// check goes by the round's read of the serving group, which comes
// before the target's read when that group comes first (no read of it
// after the target's).
func PlantBalancerLeftoverSourceFirst(b *Balancer) { b.knobs.leftoverSourceFirst = true }

// PlantBalancerLeftoverAnyGen plants a bug in b: a serving tablet of
// another group shows an installing one dead whatever their
// generations.
func PlantBalancerLeftoverAnyGen(b *Balancer) { b.knobs.leftoverAnyGen = true }

// SetBalancerLeftoverReadHook has f called after each read of a group's
// tablets by b's leftover removal, with the group.
func SetBalancerLeftoverReadHook(b *Balancer, f func(g uint32)) { b.knobs.afterLeftoverRead = f }

// AbortAtSource is the first step of undoMove alone (an undo whose
// client died after it): the source of the frozen tablet starting at
// low serves it again, and the target keeps its installing copy.
func AbortAtSource(c *Client, ctx context.Context, low []byte) error {
	_, p, err := c.freshTablet(ctx, low)
	if err != nil {
		return err
	}
	if p == nil || p.State != btree.TabletFrozen {
		return errors.New("no frozen tablet starts there")
	}
	ct := &btree.Ctl{Cmd: btree.CtlAbort, To: p.To, Gen: p.Gen + 1, Tablet: btree.Tablet{Low: p.Low, High: p.High, HighInf: p.HighInf}}
	return c.step(ctx, p.Group, ct, "abort")
}

// GroupTablets is group g's own list of tablets, read linearizably
// (installing ones included, hidden by no directory).
func GroupTablets(c *Client, ctx context.Context, g uint32) ([]btree.Tablet, error) {
	k, err := c.anyKeyspace()
	if err != nil {
		return nil, err
	}
	k.init()
	r := k.reader(g)
	defer k.putReader(g, r)
	res, err := r.DirCtxMode(ctx, kv.Linearizable)
	if err != nil {
		return nil, err
	}
	out := make([]btree.Tablet, len(res.Tablets))
	for i, tb := range res.Tablets {
		out[i] = btree.Tablet{Low: append([]byte(nil), tb.Low...), High: append([]byte(nil), tb.High...), HighInf: tb.HighInf, State: tb.State, Gen: tb.Gen, To: tb.To}
	}
	return out, nil
}
