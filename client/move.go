package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// Tablet moves, as an operator runs them (docs/btree.md, "Moving a
// tablet"; the steps and why they are safe: btree/move.go). The client
// that moves a tablet sends each step to the group that applies it and
// waits for its answer before the next; every step is idempotent, so a
// move that failed half way is finished by running it again (or undone
// by AbortTabletMove while the source still holds the tablet).

// TabletInfo is one tablet of the ordered keyspaces, as the groups
// publish it. Low and High are internal keys: a keyspace's id byte, then
// the user's key (cluster.Keyspace.InternalKey).
type TabletInfo struct {
	Low, High []byte
	HighInf   bool
	Group     uint32
	// State is "serving", "frozen" (moving to To: writes wait) or
	// "installing" (being moved in: not served yet).
	State string
	To    uint32
	Gen   uint64
	// Writes and Keys are the tablet's load as its group published it
	// (btree/load.go), if HasLoad: the write ops the group applied to
	// the tablet's keys since the tablet came to the group (a split's
	// upper half and a moved tablet count from 0; a replica restored
	// from a snapshot counts again from 0: a hint), and the keys it
	// holds. Reads are one-sided and not counted. HasLoad is false when
	// the group's load area could not be read with its tablets (torn,
	// or of another directory version) or the group did not answer.
	Writes, Keys uint64
	HasLoad      bool
}

func tabletInfo(p btree.Placed) TabletInfo {
	st := "serving"
	switch p.State {
	case btree.TabletFrozen:
		st = "frozen"
	case btree.TabletInstalling:
		st = "installing"
	}
	return TabletInfo{Low: p.Low, High: p.High, HighInf: p.HighInf, Group: p.Group, State: st, To: p.To, Gen: p.Gen,
		Writes: p.Writes, Keys: p.Keys, HasLoad: p.HasLoad}
}

// ErrNoKeyspace: the cluster map declares no ordered keyspace.
var ErrNoKeyspace = errors.New("rdmakv: the cluster has no ordered keyspace")

// anyKeyspace is a handle on the client's ordered state (the directory
// is shared by every keyspace).
func (c *Client) anyKeyspace() (*Keyspace, error) {
	if len(c.m.Keyspaces) == 0 {
		return nil, ErrNoKeyspace
	}
	return c.Keyspace(c.m.Keyspaces[0].Name), nil
}

// Tablets reads every group's tablets afresh, linearizably (from each
// group's leader, its epoch confirmed: every tablet change acknowledged
// before the call is in the answer), and returns them in key order (the
// served ones, then the ones being installed that no served tablet
// covers). A group that does not answer within a few seconds is shown
// as this client last saw it.
func (c *Client) Tablets(ctx context.Context) ([]TabletInfo, error) {
	return c.tablets(ctx, kv.Linearizable)
}

// tablets is Tablets read in mode (tests: StaleOK shows what the near
// replicas have applied).
func (c *Client) tablets(ctx context.Context, mode kv.Consistency) ([]TabletInfo, error) {
	d, err := c.freshDirMode(ctx, mode)
	if err != nil {
		return nil, err
	}
	var out []TabletInfo
	for _, p := range d.Tablets() {
		out = append(out, tabletInfo(p))
	}
	for _, p := range d.Moving() {
		out = append(out, tabletInfo(p))
	}
	return out, nil
}

func (c *Client) freshDir(ctx context.Context) (*btree.Directory, error) {
	mode := kv.Linearizable
	if c.ord.undoUnchecked {
		mode = kv.StaleOK // the planted bug reads the near replicas, as the old code did
	}
	return c.freshDirMode(ctx, mode)
}

func (c *Client) freshDirMode(ctx context.Context, mode kv.Consistency) (*btree.Directory, error) {
	k, err := c.anyKeyspace()
	if err != nil {
		return nil, err
	}
	k.init()
	return k.refreshDirMode(ctx, c.ord.dir.Load(), mode)
}

// ctl sends a tablet control request to group g and returns its result.
func (c *Client) ctl(ctx context.Context, g uint32, ct *btree.Ctl) (kv.Result, error) {
	payload := btree.AppendCtl(nil, ct)
	if len(payload) > multicast.MaxPayload(c.m.Limits.SlotSize) {
		return kv.Result{}, fmt.Errorf("rdmakv: tablet control of %d bytes, a slot holds %d", len(payload), multicast.MaxPayload(c.m.Limits.SlotSize))
	}
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return kv.Result{}, err
	}
	defer end()
	o, err := c.multicast(ctx, tree.Of(tree.Group(g)), payload)
	if err != nil {
		return kv.Result{}, err
	}
	for _, rp := range o.Replies {
		if rp.Group == tree.Group(g) {
			return kv.DecodeResult(rp.Result)
		}
	}
	return kv.Result{}, fmt.Errorf("rdmakv: no reply from group %d", g)
}

// stepTries bounds the sends of one move step.
const stepTries = 5

// step sends a move step and wants StatusOK.
// stepOf names what a step is part of.
func stepOf(step string) string {
	if step == "split" {
		return "split"
	}
	return "move"
}

func (c *Client) step(ctx context.Context, g uint32, ct *btree.Ctl, what string) error {
	if c.ord.moveHook != nil {
		c.ord.moveHook(what)
	}
	// Every step is idempotent: one whose outcome is unknown (a leader
	// change, a timeout) is sent again.
	var r kv.Result
	var err error
	for try := 0; try < stepTries; try++ {
		if r, err = c.ctl(ctx, g, ct); err == nil || ctx.Err() != nil || c.isClosed() {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("rdmakv: tablet %s, %s at group %d: %w", stepOf(what), what, g, err)
	}
	if r.Status != kv.StatusOK {
		return fmt.Errorf("rdmakv: tablet %s, %s at group %d: status %d (the tablet changed, or another move runs; nothing changed by this step)", stepOf(what), what, g, r.Status)
	}
	return nil
}

// MoveTablet moves the tablet whose low fence is low (an internal key,
// as Tablets returns) to group to: it freezes the tablet at its group
// (writes to it wait), reads its entries one-sided from that group,
// sends them to group to, drops the tablet at its group and has group to
// serve it. Readers and writers of the tablet's keys see one history
// throughout (writes wait while the tablet is frozen and in the moment
// between the drop and the activation; reads go on until the drop).
// Called again after a failure (or for a tablet left frozen), it
// finishes the move.
func (c *Client) MoveTablet(ctx context.Context, low []byte, to uint32) error {
	if int(to) >= len(c.m.Groups) {
		return fmt.Errorf("rdmakv: no group %d", to)
	}
	d, err := c.freshDir(ctx)
	if err != nil {
		return err
	}
	var src *btree.Placed
	for i, p := range d.Tablets() {
		if bytes.Equal(p.Low, low) {
			src = &d.Tablets()[i]
		}
	}
	if src == nil {
		for _, p := range d.Moving() {
			if bytes.Equal(p.Low, low) && p.Group == to {
				// Dropped at its source already: only the activation
				// is left.
				return c.step(ctx, to, &btree.Ctl{Cmd: btree.CtlActivate, To: to, Gen: p.Gen, Tablet: p.Tablet}, "activate")
			}
		}
		return fmt.Errorf("rdmakv: no tablet starts at %q", low)
	}
	tb := btree.Tablet{Low: src.Low, High: src.High, HighInf: src.HighInf}
	g, gen := src.Group, src.Gen+1
	switch {
	case src.Group == to && src.State == btree.TabletServing:
		return nil
	case src.State == btree.TabletFrozen && src.To != to:
		return fmt.Errorf("rdmakv: tablet %q is moving to group %d (abort that move first)", low, src.To)
	case src.State == btree.TabletServing:
		if err := c.step(ctx, g, &btree.Ctl{Cmd: btree.CtlFreeze, To: to, Gen: gen, Tablet: tb}, "freeze"); err != nil {
			return err
		}
	}
	// The frozen tablet's entries, read one-sided from the leader of g
	// (linearizable: after the freeze, so its last state, which no write
	// changes any more), sent to group to in slots.
	k, _ := c.anyKeyspace()
	room := multicast.MaxPayload(c.m.Limits.SlotSize)
	var part []btree.KVV
	flush := func() error {
		err := c.step(ctx, to, &btree.Ctl{Cmd: btree.CtlIngest, To: to, Gen: gen, Tablet: tb, Entries: part}, "ingest")
		part = part[:0]
		return err
	}
	lo := slices.Clone(tb.Low)
	var hi []byte
	if !tb.HighInf {
		hi = tb.High
	}
	sent := false
	for waits := 0; ; {
		pairs, err := k.movePage(ctx, d, g, lo, hi)
		if errors.Is(err, kv.ErrNotOwner) {
			// g's tablets changed since d was read (another tablet
			// moved in or out, or d came from a replica behind g's
			// leader): read them again; this tablet must still be
			// frozen there for this move.
			if werr := k.moveWait(ctx, time.Time{}, waits, err); werr != nil {
				return werr
			}
			waits++
			if d, err = c.freshDir(ctx); err != nil {
				return err
			}
			if !frozenFor(d, tb, g, to, gen) && waits > 50 {
				return fmt.Errorf("rdmakv: tablet move: tablet %q is no longer frozen at group %d for this move", tb.Low, g)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("rdmakv: tablet move, reading the tablet at group %d: %w", g, err)
		}
		for _, p := range pairs {
			e := btree.KVV{Key: p.Key, Value: p.Value, Version: p.Version}
			if len(part) > 0 && btree.CtlSize(tb, append(part, e)) > room {
				if err := flush(); err != nil {
					return err
				}
				sent = true
			}
			part = append(part, e)
		}
		if len(pairs) < movePage {
			break
		}
		lo = append(slices.Clone(pairs[len(pairs)-1].Key), 0)
	}
	if len(part) > 0 || !sent {
		if err := flush(); err != nil {
			return err
		}
	}
	// The drop before the activation: group to serves the tablet only
	// once g no longer does (btree/move.go).
	drop := &btree.Ctl{Cmd: btree.CtlDrop, To: to, Gen: gen, Tablet: tb}
	activate := &btree.Ctl{Cmd: btree.CtlActivate, To: to, Gen: gen, Tablet: tb}
	if c.ord.activateFirst {
		// Planted: group to serves the tablet's writes while g still
		// serves its reads (to readers whose directory names g).
		if err := c.step(ctx, to, activate, "activate"); err != nil {
			return err
		}
		return c.step(ctx, g, drop, "drop")
	}
	if err := c.step(ctx, g, drop, "drop"); err != nil {
		return err
	}
	return c.step(ctx, to, activate, "activate")
}

// frozenFor reports whether d shows tablet tb frozen at group g for the
// move to group to of generation gen.
func frozenFor(d *btree.Directory, tb btree.Tablet, g, to uint32, gen uint64) bool {
	for _, p := range d.Tablets() {
		if p.Group == g && bytes.Equal(p.Low, tb.Low) && p.State == btree.TabletFrozen && p.To == to && p.Gen+1 == gen {
			return true
		}
	}
	return false
}

// movePage is the most pairs one read of a move takes.
const movePage = 512

// movePage reads up to movePage pairs of [lo, hi) (internal keys) from
// group g's tree, linearizable, copied.
func (k *Keyspace) movePage(ctx context.Context, d *btree.Directory, g uint32, lo, hi []byte) ([]btree.KV, error) {
	ctx, end, err := k.readCtx(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	r := k.reader(g)
	defer k.putReader(g, r)
	r.SetOwnVersion(d.OwnVersion(g))
	res, err := r.ScanCtx(ctx, lo, hi, movePage, Linearizable, false)
	if err != nil {
		return nil, err
	}
	out := make([]btree.KV, len(res.Pairs))
	for i, p := range res.Pairs {
		out[i] = btree.KV{Key: slices.Clone(p.Key), Value: slices.Clone(p.Value), Version: p.Version}
	}
	return out, nil
}

// SplitTablet splits the tablet whose low fence is low (an internal key,
// as Tablets returns) in its group, at its median key: both halves stay
// in the group, and can then be moved apart (the balancer splits a hot
// tablet so). It fails, changing nothing, if the tablet is moving, holds
// fewer than 2 keys, or its group owns btree.MaxTablets tablets. A
// request sent again after its answer was lost finds the tablet split
// already and succeeds (btree.CtlSplit).
func (c *Client) SplitTablet(ctx context.Context, low []byte) error {
	_, p, err := c.freshTablet(ctx, low)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("rdmakv: no tablet starts at %q", low)
	}
	if p.State != btree.TabletServing {
		return fmt.Errorf("rdmakv: tablet %q is moving", low)
	}
	ct := &btree.Ctl{Cmd: btree.CtlSplit, Gen: p.Gen + 1, Tablet: btree.Tablet{Low: p.Low, High: p.High, HighInf: p.HighInf}}
	// Routing needs no fresh directory: both halves stay in the group,
	// as after a split past TabletMax.
	return c.step(ctx, p.Group, ct, "split")
}

// freshTablet reads the directory linearizably (freshDir) and finds the
// tablet whose low fence is low in it (nil: none).
func (c *Client) freshTablet(ctx context.Context, low []byte) (*btree.Directory, *btree.Placed, error) {
	d, err := c.freshDir(ctx)
	if err != nil {
		return nil, nil, err
	}
	for i, p := range d.Tablets() {
		if bytes.Equal(p.Low, low) {
			return d, &d.Tablets()[i], nil
		}
	}
	return d, nil, nil
}

// AbortTabletMove undoes the move of the tablet whose low fence is low,
// while its source still holds it frozen: the source serves the
// tablet's writes again, and the target forgets what it took in. The
// target forgets it only once a linearizable read of the source shows
// that the source never dropped the tablet (undoMove): a directory read
// from a replica behind the source could show the tablet frozen after
// the source dropped it, and the target's copy is then the only one
// (the move is finished with MoveTablet instead).
func (c *Client) AbortTabletMove(ctx context.Context, low []byte) error {
	if err := c.undoMove(ctx, low); err != nil {
		return fmt.Errorf("%w (a move past its drop is finished with MoveTablet)", err)
	}
	return nil
}

// PlanBalance is the balancing rule: given the tablets (as Tablets
// returns them) of a cluster of groups groups, the next move it makes,
// if any. It counts each group's tablets; when the group with the most
// has at least 2 more than the group with the fewest (the hysteresis:
// a difference of 1 never moves a tablet back and forth), its tablet
// with the highest low fence goes to the group with the fewest (ties:
// the lowest group id, both ways). No move while a tablet is not
// serving (a move is under way). The rule is a function of the tablets
// alone, so every client that runs it proposes the same move, and a
// stale proposal is refused at apply (btree/move.go).
func PlanBalance(tablets []TabletInfo, groups int) (low []byte, from, to uint32, ok bool) {
	if groups < 2 {
		return nil, 0, 0, false
	}
	count := make([]int, groups)
	last := make([][]byte, groups)
	has := make([]bool, groups)
	for _, tb := range tablets {
		if tb.State != "serving" || int(tb.Group) >= groups {
			return nil, 0, 0, false
		}
		count[tb.Group]++
		if !has[tb.Group] || string(tb.Low) > string(last[tb.Group]) {
			last[tb.Group], has[tb.Group] = tb.Low, true
		}
	}
	hi, lo := 0, 0
	for g := range groups {
		if count[g] > count[hi] {
			hi = g
		}
		if count[g] < count[lo] {
			lo = g
		}
	}
	if count[hi]-count[lo] < 2 {
		return nil, 0, 0, false
	}
	return last[hi], uint32(hi), uint32(lo), true
}

// Balance runs the balancing rule (PlanBalance) until it proposes no
// move, or for at most max moves (<= 0: no bound), and returns the moves
// it made. While a tablet is not serving (a move under way, or replicas
// behind the last one) it reads the tablets again for up to about a
// second before it gives up proposing.
func (c *Client) Balance(ctx context.Context, max int) (int, error) {
	n, waits := 0, 0
	k, err := c.anyKeyspace()
	if err != nil {
		return 0, err
	}
	for max <= 0 || n < max {
		tbs, err := c.Tablets(ctx)
		if err != nil {
			return n, err
		}
		low, _, to, ok := PlanBalance(tbs, len(c.m.Groups))
		if !ok {
			busy := false
			for _, tb := range tbs {
				busy = busy || tb.State != "serving"
			}
			if !busy || waits >= 50 {
				return n, nil
			}
			// A move under way, or the replicas read are behind the
			// last move: read again in a moment.
			if err := k.moveWait(ctx, time.Time{}, waits, nil); err != nil {
				return n, err
			}
			waits++
			continue
		}
		waits = 0
		if err := c.MoveTablet(ctx, low, to); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Garbage: the keys a tablet leaves behind in a group when it moves away
// (or an aborted move's installing tablet) stay in that group's tree
// until deleted, at most btree.DefaultGarbageStep per log entry of the
// group (docs/btree.md, "Dropping a tablet: the keys as garbage"). A
// group that gets ordered requests deletes them as it goes; a quiet one
// only through collection requests (btree.CtlCollect), which the
// balancer sends each round to the groups that publish garbage, and
// CollectGarbage sends on demand.

// GroupGarbage is each group's garbage key count, as the group's load
// area publishes it (read one-sided from a near replica: a hint that
// may lag a little); -1 for a group that could not be read.
func (c *Client) GroupGarbage(ctx context.Context) ([]int64, error) {
	k, err := c.anyKeyspace()
	if err != nil {
		return nil, err
	}
	k.init()
	out := make([]int64, len(c.m.Groups))
	for g := range out {
		gctx, cancel := context.WithTimeout(ctx, dirReadTimeout)
		r := k.reader(uint32(g))
		res, err := r.DirCtxMode(gctx, kv.StaleOK)
		k.putReader(uint32(g), r)
		cancel()
		out[g] = -1
		if err == nil && res.GarbageOK {
			out[g] = int64(res.Garbage)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// CollectGarbage has group g delete its garbage keys: it sends
// collection requests (each deletes up to the group's GarbageStep keys,
// in one log entry) until the group answers that none are left, or ctx
// ends. It returns the keys left (0 on success).
func (c *Client) CollectGarbage(ctx context.Context, g uint32) (uint64, error) {
	left, _, _, err := c.collectGarbage(ctx, g, -1)
	return left, err
}

// CollectGarbageCount is CollectGarbage that also returns the keys its
// requests deleted (kvcli collect prints them).
func (c *Client) CollectGarbageCount(ctx context.Context, g uint32) (left, deleted uint64, err error) {
	left, deleted, _, err = c.collectGarbage(ctx, g, -1)
	return left, deleted, err
}

// collectGarbage sends at most most collection requests to group g
// (negative: no bound) until it answers 0 keys left, and returns the
// keys left by the last answer, the keys the requests deleted (their
// answers' sum) and the requests sent.
func (c *Client) collectGarbage(ctx context.Context, g uint32, most int) (left, deleted uint64, sent int, err error) {
	if int(g) >= len(c.m.Groups) {
		return 0, 0, 0, fmt.Errorf("rdmakv: no group %d", g)
	}
	ct := &btree.Ctl{Cmd: btree.CtlCollect, Gen: 1, Tablet: btree.All}
	for most < 0 || sent < most {
		if err := ctx.Err(); err != nil {
			return left, deleted, sent, err
		}
		r, err := c.ctl(ctx, g, ct)
		sent++
		if err != nil {
			return left, deleted, sent, fmt.Errorf("rdmakv: garbage collection at group %d: %w", g, err)
		}
		if r.Status != kv.StatusOK {
			return left, deleted, sent, fmt.Errorf("rdmakv: garbage collection at group %d: status %d", g, r.Status)
		}
		deleted += r.Prev
		if left = uint64(r.Count); left == 0 {
			break
		}
	}
	return left, deleted, sent, nil
}
