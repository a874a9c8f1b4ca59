package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/kv"
)

// The balancer: tablet moves that nobody asks for (docs/btree.md, "Who
// decides"). A Balancer runs rounds; each round reads the tablets afresh
// and makes at most one move (Client.MoveTablet), so moves run one at a
// time with a pause (the caller's interval) between them:
//
//   - While a tablet is not serving (a move under way, by anyone), the
//     round moves nothing else. A move this balancer left half done (its
//     MoveTablet failed) is finished at the next round, or, after
//     abortAfter failures in a row while its source still holds the
//     tablet, undone (AbortTabletMove: the source serves it again), and
//     the balancer then makes no move for pauseRounds rounds; a move another
//     mover left half done (an operator's kvcli that was stopped, or the
//     balancer of a process that died) is finished once the tablet has
//     stayed in the same state for StuckAfter. MoveTablet's steps are
//     idempotent, so finishing a move that its own mover is still
//     running changes nothing more than that mover would.
//   - Otherwise the round runs the rule by load (planBalanceWrites: each
//     tablet's writes since the last round, from the write counts its
//     group publishes, btree/load.go): a tablet moves from the most
//     loaded group to the least loaded, or a hot tablet splits first.
//     When the load is not known (the first round, a group whose counts
//     could not be read) or too small to go by (fewer than MinWrites in
//     the round), it runs the rule by count (PlanBalance, with the
//     groups' applied entries as the tie-breaker: planBalanceLoad).
//
// Who runs a Balancer is the caller's choice: kvserver runs one in the
// process hosting group 0's leader (internal/server, balancer.go).

// BalancerConfig configures a Balancer.
type BalancerConfig struct {
	// StuckAfter: a tablet another mover left frozen or installing, in
	// the same state this long, has its move finished by the balancer
	// (0: 5 times Interval, at least a second).
	StuckAfter time.Duration
	// Interval is the pause between rounds the caller keeps (for the
	// status, and StuckAfter's default).
	Interval time.Duration
	// MoveTimeout bounds one move (0: 5 minutes).
	MoveTimeout time.Duration
	// Log, if set, gets one line per move and per error.
	Log *slog.Logger
	// BeforeStep, if set (tests), is called before each step of the
	// balancer's moves, with the step's name (freeze, ingest, drop,
	// activate), before its splits ("split") and before its removals
	// of leftover installing tablets ("abort leftover").
	BeforeStep func(step string)
	// MinWrites is the fewest writes (to every ordered key, all groups
	// together) between two rounds for the rule by load to decide; with
	// fewer, the rule by count does (0: DefaultMinWrites).
	MinWrites uint64
	// SplitKeys is the fewest keys a hot tablet must hold for the rule
	// by load to split it (0: DefaultSplitKeys).
	SplitKeys uint64
}

// Defaults of BalancerConfig (a config's [ordered] balance_min_writes
// and balance_split_keys).
const (
	DefaultMinWrites = cluster.DefaultBalanceMinWrites
	DefaultSplitKeys = cluster.DefaultBalanceSplitKeys
)

// BalancerMove is a move the balancer made (or tried).
type BalancerMove struct {
	// From and To are the tablet's fences as kvcli tablets prints them.
	From string `json:"from"`
	To   string `json:"to"`
	// Source and Target are the groups (the same group for a split).
	Source uint32 `json:"source"`
	Target uint32 `json:"target"`
	// Split: the balancer split the tablet in its group (a hot tablet,
	// the rule by load) rather than move it (BalancerStatus.LastSplit).
	Split bool `json:"split,omitempty"`
	// Rule is the rule that chose it: "load" or "count" (empty for a
	// half-done move finished).
	Rule string `json:"rule,omitempty"`
	// Resumed: the balancer finished a move that another mover (or its
	// own failed attempt) left half done.
	Resumed bool      `json:"resumed,omitempty"`
	At      time.Time `json:"at"`
	Took    string    `json:"took"`
	Err     string    `json:"error,omitempty"`
}

// BalancerStatus is what a balancer did so far.
type BalancerStatus struct {
	// State: "starting", "balanced" (no move to make), "moving",
	// "waiting" (another mover's move is under way), "error" (the last
	// round failed), or what the caller says ("standby: ...", "off").
	State string `json:"state"`
	// Interval is the pause between rounds.
	Interval string `json:"interval,omitempty"`
	// MinWrites and SplitKeys are the rule by load's thresholds in
	// force (BalancerConfig's, defaults filled in).
	MinWrites uint64 `json:"min_writes"`
	SplitKeys uint64 `json:"split_keys"`
	// Moves counts the moves completed (Resumed among them: moves
	// another mover left half done), Errors the rounds that failed.
	Moves   uint64 `json:"moves"`
	Resumed uint64 `json:"resumed"`
	Errors  uint64 `json:"errors"`
	// Aborted counts its own moves it undid after abortAfter failures.
	Aborted uint64 `json:"aborted"`
	// Rounds counts the rounds run.
	Rounds uint64 `json:"rounds"`
	// Tablets is the number of tablets of each group at the last round.
	Tablets []int `json:"tablets,omitempty"`
	// Writes is each group's write load at the last round that measured
	// it: the writes its tablets took since the round before (nil: not
	// measured).
	Writes []uint64 `json:"writes,omitempty"`
	// Splits counts the hot tablets the balancer split.
	Splits uint64 `json:"splits"`
	// Garbage is each group's garbage keys (keys of tablets that left
	// it, not deleted yet; -1: not read) after the last round's
	// collections. GarbageCollected counts the garbage keys the
	// balancer's collection requests deleted, Collections the requests
	// (each round sends up to collectPerRound to each group whose
	// published garbage is not 0).
	Garbage          []int64 `json:"garbage,omitempty"`
	GarbageCollected uint64  `json:"garbage_collected"`
	Collections      uint64  `json:"collections"`
	// Leftovers counts the leftover installing tablets the balancer
	// removed (copies an interrupted undo left at a move's target:
	// cleanLeftovers).
	Leftovers uint64 `json:"leftovers_removed"`
	// Last is the last move made or tried, LastSplit the last split.
	Last      *BalancerMove `json:"last_move,omitempty"`
	LastSplit *BalancerMove `json:"last_split,omitempty"`
	// LastError is the last round's error, and when.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Balancer decides and makes tablet moves, one per round.
type Balancer struct {
	cfg   BalancerConfig
	knobs balancerKnobs

	mu sync.Mutex
	st BalancerStatus
	// busy: the not-serving tablet the last rounds saw, and since when
	// (unchanged).
	busy   busyKey
	busyAt time.Time
	// failed: the tablet of this balancer's last move, if it failed (the
	// next round finishes it at once), and its failures in a row.
	failed   []byte
	failures int
	// pause: rounds left without a new move (after an abort).
	pause int
	// applied: each group's highest applied index at the last round
	// (the load tie-breaker's counters).
	applied []uint64
	// writes: each tablet's write count at the last round, by
	// tabletKey (nil: that round could not read every group's counts).
	writes map[string]uint64
}

// balancerKnobs are planted bugs (tests only).
type balancerKnobs struct {
	// ignoreBusy: a round plans from the serving tablets alone, and so
	// starts a move while another tablet is frozen or installing.
	ignoreBusy bool
	// noTakeover: a move another mover left half done is never
	// finished.
	noTakeover bool
	// noAbort: a move of its own that keeps failing is never undone.
	noAbort bool
	// noCollect: rounds send no collection requests, so a group that
	// gets no ordered requests keeps a dropped tablet's keys for ever.
	noCollect bool
	// ignoreLoad: rounds never measure the tablets' load, so the rule by
	// count always decides (the balancer before per-tablet counters: a
	// group with one hot tablet and one with three cold ones look
	// balanced).
	ignoreLoad bool
	// leftoverUnchecked: any installing tablet that another group's
	// tablet overlaps (in any state, of any generation) is taken for a
	// leftover and aborted, without the second read: a live move's
	// copy (its source frozen) is removed.
	leftoverUnchecked bool
	// noLeftovers: rounds never remove leftover installing tablets.
	noLeftovers bool
	// leftoverSourceFirst: the leftover check goes by the round's list
	// of s, read before t's when s comes first in the groups' order,
	// instead of a read of s after t's (no second read).
	leftoverSourceFirst bool
	// leftoverAnyGen: a serving tablet of another group shows an
	// installing one dead whatever their generations.
	leftoverAnyGen bool
	// afterLeftoverRead, if set (tests), is called after each read of a
	// group's tablets by cleanLeftovers (the round's reads and the
	// second reads), with the group.
	afterLeftoverRead func(g uint32)
}

// abortAfter is how many times in a row the balancer's move of a tablet
// may fail before it undoes the move (while the source holds the tablet
// frozen: writes to it wait until the move ends, so a move that cannot
// finish, for a target that refuses the ingest, must end the other
// way), and pauseRounds how many rounds it then makes no move.
const (
	abortAfter  = 3
	pauseRounds = 10
)

// busyKey identifies a not-serving tablet's state.
type busyKey struct {
	low   string
	state string
	group uint32
	to    uint32
	gen   uint64
}

// NewBalancer returns a balancer that has run no round.
func NewBalancer(cfg BalancerConfig) *Balancer {
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = max(5*cfg.Interval, time.Second)
	}
	if cfg.MoveTimeout <= 0 {
		cfg.MoveTimeout = 5 * time.Minute
	}
	if cfg.MinWrites == 0 {
		cfg.MinWrites = DefaultMinWrites
	}
	if cfg.SplitKeys == 0 {
		cfg.SplitKeys = DefaultSplitKeys
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Balancer{cfg: cfg}
	b.st.State = "starting"
	b.st.MinWrites, b.st.SplitKeys = cfg.MinWrites, cfg.SplitKeys
	if cfg.Interval > 0 {
		b.st.Interval = cfg.Interval.String()
	}
	return b
}

// Status is a copy of what the balancer did so far.
func (b *Balancer) Status() BalancerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.st
	st.Tablets = append([]int(nil), st.Tablets...)
	st.Writes = append([]uint64(nil), st.Writes...)
	st.Garbage = append([]int64(nil), st.Garbage...)
	if st.Last != nil {
		l := *st.Last
		st.Last = &l
	}
	if st.LastSplit != nil {
		l := *st.LastSplit
		st.LastSplit = &l
	}
	return st
}

// SetState sets the state the status shows (the caller's: "standby:
// ...", "off") until the next round.
func (b *Balancer) SetState(s string) {
	b.mu.Lock()
	b.st.State = s
	b.mu.Unlock()
}

// Fail records an error of the caller's (no client to run a round
// with): the status shows it, and it is counted.
func (b *Balancer) Fail(err error) {
	b.mu.Lock()
	b.st.State, b.st.LastError, b.st.LastErrorAt = "error", err.Error(), time.Now()
	b.st.Errors++
	b.mu.Unlock()
}

func (b *Balancer) fail(err error) error {
	b.Fail(err)
	b.cfg.Log.Warn("balancer: " + err.Error())
	return err
}

// Round runs one round with client c: it reads the tablets and makes at
// most one move (see the package comment above: a half-done move is
// finished first, and no move starts while another is under way). It
// returns the round's error (also in the status).
func (b *Balancer) Round(ctx context.Context, c *Client) error {
	if b.cfg.BeforeStep != nil {
		c.ord.moveHook = b.cfg.BeforeStep
	}
	b.mu.Lock()
	b.st.Rounds++
	b.mu.Unlock()
	groups := len(c.m.Groups)
	tbs, err := c.Tablets(ctx)
	if err != nil {
		return b.fail(fmt.Errorf("reading the tablets: %w", err))
	}
	count := make([]int, groups)
	var busy []TabletInfo
	for _, tb := range tbs {
		if int(tb.Group) < groups && tb.State != "installing" {
			count[tb.Group]++
		}
		if tb.State != "serving" {
			busy = append(busy, tb)
		}
	}
	loads := b.measure(tbs, groups)
	b.mu.Lock()
	b.st.Tablets = count
	b.mu.Unlock()
	b.cleanLeftovers(ctx, c)
	sent := b.collect(ctx, c)
	if len(busy) > 0 && b.knobs.ignoreBusy {
		// Planted: plan from the serving tablets, as if nothing moved.
		var serving []TabletInfo
		for _, tb := range tbs {
			if tb.State == "serving" {
				serving = append(serving, tb)
			}
		}
		tbs, busy = serving, nil
	}
	if len(busy) > 0 {
		// A tablet frozen at its source first: a move past its ingest
		// shows the tablet twice (frozen at the source, installing at
		// the target, listed after the served ones but possibly first
		// in a directory whose generations rank the target's copy
		// higher), and only the frozen one can be undone (abortAfter).
		pick := busy[0]
		for _, tb := range busy {
			if tb.State == "frozen" {
				pick = tb
				break
			}
		}
		return b.takeOver(ctx, c, pick)
	}
	b.mu.Lock()
	b.busy, b.failed, b.failures = busyKey{}, nil, 0
	paused := b.pause > 0
	if paused {
		b.pause--
	}
	b.mu.Unlock()
	applied := b.load(ctx, c, sent)
	p, byLoad := planBalanceWrites(tbs, loads, groups, b.cfg.MinWrites, b.cfg.SplitKeys)
	if !byLoad {
		p.Low, p.From, p.To, p.OK = planBalanceLoad(tbs, groups, applied)
		p.Rule = "count"
	}
	if paused {
		b.SetState("paused after an aborted move")
		return nil
	}
	if !p.OK {
		b.SetState("balanced")
		return nil
	}
	var tb TabletInfo
	for _, t := range tbs {
		if bytes.Equal(t.Low, p.Low) {
			tb = t
		}
	}
	if p.Split {
		return b.split(ctx, c, tb, p)
	}
	return b.move(ctx, c, tb, p.From, p.To, false, count, p.Rule)
}

// tabletKey identifies a tablet across rounds: its group, generation
// and low fence. The lower half of a split keeps its tablet's key and
// write count; the upper half, and a tablet moved in (a new generation),
// are new keys whose counts start at 0 (btree.Tablet.Writes).
func tabletKey(tb TabletInfo) string {
	return fmt.Sprintf("%d/%d/%x", tb.Group, tb.Gen, tb.Low)
}

// measure is each tablet's load (in tbs's order): the writes it took
// since the last round, from its group's write counts; nil if this
// round or the last could not read every tablet's (HasLoad), or at the
// first round. A tablet the last round did not have counts from 0, so
// its load is its count; a count that went down (a replica restored
// from a snapshot counts again from 0) is taken as counted from 0 too.
// It also records each group's load in the status.
func (b *Balancer) measure(tbs []TabletInfo, groups int) []uint64 {
	cur := make(map[string]uint64, len(tbs))
	all := !b.knobs.ignoreLoad
	for _, tb := range tbs {
		all = all && tb.HasLoad
		cur[tabletKey(tb)] = tb.Writes
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.writes
	if !all {
		b.writes = nil
		return nil
	}
	b.writes = cur
	if prev == nil {
		return nil
	}
	loads := make([]uint64, len(tbs))
	per := make([]uint64, groups)
	for i, tb := range tbs {
		w := tb.Writes
		if p, ok := prev[tabletKey(tb)]; ok && p <= w {
			w -= p
		}
		loads[i] = w
		if int(tb.Group) < groups {
			per[tb.Group] += w
		}
	}
	b.st.Writes = per
	return loads
}

// balancePlan is what a balancing rule proposes.
type balancePlan struct {
	// Low is the tablet's low fence; From its group, To the group it
	// goes to (From for a split).
	Low      []byte
	From, To uint32
	// Split: split the tablet in its group (at its median key) rather
	// than move it.
	Split bool
	// OK: there is something to do.
	OK bool
	// Rule is "load" or "count".
	Rule string
}

// planBalanceWrites is the rule by load. loads are the tablets' loads
// (the writes each took in the last round, in tablets' order; nil: not
// known). It decides (byLoad) when the loads are known, every tablet
// serves, and the groups took at least minWrites writes in all; then,
// with L the groups' loads, hi the most loaded group and lo the least
// loaded (ties: the lowest id; a group at MaxTablets is never lo), the
// first of:
//
//  1. A move (loadMove): nothing while L[lo] > 3/4 L[hi] (the
//     hysteresis: a gap under a quarter of the most loaded group's load
//     is left alone). A move of tablet t (load x) from hi to lo leaves
//     the two groups max(L[hi]-x, L[lo]+x); of hi's tablets the one
//     that leaves the least (ties: the highest low fence) moves if that
//     takes at least a quarter of the gap off L[hi]. So both groups end
//     below what L[hi] was, and moving the tablet back would leave
//     L[hi] again: a move never just swaps the imbalance (no
//     ping-pong), and at constant loads moves end.
//  2. A split: hi's hottest tablet (ties: the highest low fence) takes
//     more than half of L[hi] (moving it would only carry the imbalance
//     to lo), holds at least splitKeys keys, and hi owns no more
//     tablets than the mean (or just one): it splits at its median key,
//     in hi, and its halves can then move. (The mean bounds the splits
//     when the load does not divide, a hot key or inserts at the end of
//     the key order: the upper half stays as hot, and hi's count stops
//     them, about one split per group.)
//  3. The rule by count (PlanBalance's groups), with a tablet of the
//     fullest group whose move leaves its target no more loaded than
//     L[hi] and the load rule nothing to move (1) at the same loads,
//     the least loaded first (ties: the highest low fence): counts even
//     out without raising the most loaded group's load, undoing, or
//     being undone by, moves by load.
//
// Without load (byLoad false) the caller goes by count (PlanBalance).
// A pure function of its arguments: every balancer reading the same
// tablets and loads proposes the same.
func planBalanceWrites(tablets []TabletInfo, loads []uint64, groups int, minWrites, splitKeys uint64) (p balancePlan, byLoad bool) {
	return planBalanceWritesKnobs(tablets, loads, groups, minWrites, splitKeys, planKnobs{})
}

// planKnobs are planted bugs of the rule by load (tests only).
type planKnobs struct {
	// swap: a move by load needs only to leave hi no more loaded than
	// before (not both groups below L[hi], by a quarter of the gap), so
	// a tablet that is all of the imbalance moves back and forth.
	swap bool
	// countUnguarded: the rule by count moves the fullest group's
	// tablet without checking what the load rule does after it.
	countUnguarded bool
	// splitPastMean: a hot tablet splits however many tablets its group
	// owns, so a load that does not divide (inserts at the end of the
	// key order) splits the tablet at its end round after round.
	splitPastMean bool
}

func planBalanceWritesKnobs(tablets []TabletInfo, loads []uint64, groups int, minWrites, splitKeys uint64, k planKnobs) (p balancePlan, byLoad bool) {
	p.Rule = "load"
	if groups < 2 || len(loads) != len(tablets) {
		return p, false
	}
	L := make([]uint64, groups)
	count := make([]int, groups)
	var total uint64
	for i, tb := range tablets {
		if tb.State != "serving" || int(tb.Group) >= groups {
			return p, false
		}
		L[tb.Group] += loads[i]
		count[tb.Group]++
		total += loads[i]
	}
	if total < minWrites || total == 0 {
		return p, false
	}
	if i, hi, lo, ok := loadMove(tablets, loads, L, count, k); ok {
		p.Low, p.From, p.To, p.OK = tablets[i].Low, hi, lo, true
		return p, true
	}
	hi := 0
	for g := range groups {
		if L[g] > L[hi] {
			hi = g
		}
	}
	hot := -1
	for i, tb := range tablets {
		if int(tb.Group) == hi && (hot < 0 || loads[i] > loads[hot] || loads[i] == loads[hot] && string(tb.Low) > string(tablets[hot].Low)) {
			hot = i
		}
	}
	if hot >= 0 && 2*loads[hot] > L[hi] && tablets[hot].Keys >= splitKeys && count[hi] < btree.MaxTablets && (count[hi]*groups <= max(len(tablets), groups) || k.splitPastMean) {
		p.Low, p.From, p.To, p.Split, p.OK = tablets[hot].Low, uint32(hi), uint32(hi), true, true
		return p, true
	}
	_, from, to, ok := PlanBalance(tablets, groups)
	if !ok {
		return p, true
	}
	tablets = slices.Clone(tablets) // the caller's are not changed, even for a moment
	pick := -1
	for i, tb := range tablets {
		if tb.Group != from || pick >= 0 && (loads[i] > loads[pick] || loads[i] == loads[pick] && string(tb.Low) < string(tablets[pick].Low)) {
			continue
		}
		// Would the load rule move something after it?
		L[from], L[to] = L[from]-loads[i], L[to]+loads[i]
		count[from], count[to] = count[from]-1, count[to]+1
		tablets[i].Group = to
		_, _, _, undo := loadMove(tablets, loads, L, count, k)
		tablets[i].Group = from
		L[from], L[to] = L[from]+loads[i], L[to]-loads[i]
		count[from], count[to] = count[from]+1, count[to]-1
		if !undo && L[to]+loads[i] <= L[hi] || k.countUnguarded {
			pick = i
		}
	}
	if pick >= 0 {
		p.Low, p.From, p.To, p.OK, p.Rule = tablets[pick].Low, from, to, true, "count"
	}
	return p, true
}

// loadMove is step 1 of planBalanceWrites: the tablet (its index) to
// move from hi to lo, given the groups' loads L and tablet counts.
func loadMove(tablets []TabletInfo, loads, L []uint64, count []int, k planKnobs) (at int, from, to uint32, ok bool) {
	hi, lo := 0, -1
	for g := range L {
		if L[g] > L[hi] {
			hi = g
		}
		if count[g] < btree.MaxTablets && (lo < 0 || L[g] < L[lo]) {
			lo = g
		}
	}
	if lo < 0 || lo == hi || 4*L[lo] > 3*L[hi] {
		return 0, 0, 0, false
	}
	gap := L[hi] - L[lo]
	best, bestAt := L[hi], -1
	for i, tb := range tablets {
		if int(tb.Group) != hi || loads[i] == 0 {
			continue
		}
		left := max(L[hi]-loads[i], L[lo]+loads[i])
		if k.swap {
			left = L[hi] - loads[i] // planted: the target's load left out
		}
		if left < best || left == best && bestAt >= 0 && string(tb.Low) > string(tablets[bestAt].Low) {
			best, bestAt = left, i
		}
	}
	if bestAt < 0 || 4*(L[hi]-best) < gap {
		return 0, 0, 0, false
	}
	return bestAt, uint32(hi), uint32(lo), true
}

// takeOver handles a tablet that is not serving: the balancer's own
// failed move is finished at once, another mover's once it has stayed
// unchanged for StuckAfter.
func (b *Balancer) takeOver(ctx context.Context, c *Client, tb TabletInfo) error {
	k := busyKey{low: string(tb.Low), state: tb.State, group: tb.Group, to: tb.To, gen: tb.Gen}
	src, to := tb.Group, tb.To
	if tb.State == "installing" {
		// Dropped at its source (no longer known): the target, its
		// group, activates it.
		src, to = tb.Group, tb.Group
	}
	now := time.Now()
	b.mu.Lock()
	own := b.failed != nil && bytes.Equal(b.failed, tb.Low)
	failures := b.failures
	if b.busy != k {
		b.busy, b.busyAt = k, now
	}
	waited := now.Sub(b.busyAt)
	b.mu.Unlock()
	if own && failures >= abortAfter && tb.State == "frozen" && !b.knobs.noAbort {
		return b.abort(ctx, c, tb, failures)
	}
	if b.knobs.noTakeover || !own && waited < b.cfg.StuckAfter {
		b.SetState("waiting")
		return nil
	}
	if !own {
		b.cfg.Log.Info(fmt.Sprintf("balancer: the move of tablet [%s, %s) to group %d has been %s for %v: finishing it",
			fenceString(c.m, tb.Low), highString(c.m, tb), to, tb.State, waited.Round(time.Millisecond)))
	}
	return b.move(ctx, c, tb, src, to, true, nil, "")
}

// abort undoes the balancer's own move of tablet tb (frozen at its
// source) after failures failed attempts.
func (b *Balancer) abort(ctx context.Context, c *Client, tb TabletInfo, failures int) error {
	b.SetState("moving")
	mctx, cancel := context.WithTimeout(ctx, b.cfg.MoveTimeout)
	defer cancel()
	err := c.undoMove(mctx, tb.Low)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.busy = busyKey{}
	if err != nil {
		b.st.State, b.st.LastError, b.st.LastErrorAt = "error", err.Error(), time.Now()
		b.st.Errors++
		b.cfg.Log.Warn(fmt.Sprintf("balancer: undoing the move of tablet [%s, %s) to group %d failed (the next round tries again): %v",
			fenceString(c.m, tb.Low), highString(c.m, tb), tb.To, err))
		return err
	}
	b.failed, b.failures, b.pause = nil, 0, pauseRounds
	b.st.Aborted++
	b.st.State = "paused after an aborted move"
	b.cfg.Log.Warn(fmt.Sprintf("balancer: undid the move of tablet [%s, %s) from group %d to group %d after %d failed attempts (group %d serves it again; no move for %d rounds)",
		fenceString(c.m, tb.Low), highString(c.m, tb), tb.Group, tb.To, failures, tb.Group, pauseRounds))
	return nil
}

// undoMove undoes the move of the tablet whose low fence is low while
// its source holds it frozen, in an order safe against a directory read
// from replicas behind their groups (AbortTabletMove, for an operator
// who saw the tablet frozen, tells the target first):
//
//  1. abort at the source: if it still holds the tablet frozen for this
//     move, it serves it again, and a drop of this move sent later (a
//     late retry of the failed mover's) is refused; if it dropped the
//     tablet already, nothing changes;
//  2. a linearizable read of the tablet's range at the source, checked
//     against the ownership version of the directory that showed the
//     tablet frozen there: it succeeds only if the source never dropped
//     the tablet (a drop changes that version), so the source holds
//     every pair and the target's copy is not the only one;
//  3. abort at the target: it forgets what it took in.
//
// If 2 fails the target keeps the tablet, and the move is left to be
// finished (the next round sees a tablet installing).
func (c *Client) undoMove(ctx context.Context, low []byte) error {
	d, p, err := c.freshTablet(ctx, low)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("rdmakv: no frozen tablet starts at %q", low)
	}
	if p.State != btree.TabletFrozen {
		return fmt.Errorf("rdmakv: tablet %q is not being moved", low)
	}
	if d.OwnVersion(p.Group) == 0 {
		return fmt.Errorf("rdmakv: group %d's ownership version is unknown: the move of tablet %q is not undone", p.Group, low)
	}
	tb := btree.Tablet{Low: p.Low, High: p.High, HighInf: p.HighInf}
	ct := &btree.Ctl{Cmd: btree.CtlAbort, To: p.To, Gen: p.Gen + 1, Tablet: tb}
	if err := c.step(ctx, p.Group, ct, "abort"); err != nil {
		return err
	}
	k, err := c.anyKeyspace()
	if err != nil {
		return err
	}
	if !c.ord.undoUnchecked {
		if err := k.servesAgain(ctx, p.Group, tb); err != nil {
			return fmt.Errorf("rdmakv: tablet move: group %d may have dropped tablet %q, so group %d keeps what it took in: %w", p.Group, low, p.To, err)
		}
	}
	return c.step(ctx, p.To, ct, "abort")
}

// servesAgain checks, by a linearizable read of group g's tablets (its
// leader's, its epoch confirmed), that g serves tablet tb again after an
// abort: a group that dropped the tablet no longer lists it, and nothing
// brings a dropped tablet back, so g holds every pair of it. (The
// ownership version cannot tell: the abort changes it too, as a drop
// does.)
func (k *Keyspace) servesAgain(ctx context.Context, g uint32, tb btree.Tablet) error {
	r := k.reader(g)
	defer k.putReader(g, r)
	res, err := r.DirCtxMode(ctx, kv.Linearizable)
	if err != nil {
		return err
	}
	for _, t := range res.Tablets {
		if bytes.Equal(t.Low, tb.Low) && t.HighInf == tb.HighInf && bytes.Equal(t.High, tb.High) {
			if t.State != 0 {
				return fmt.Errorf("its tablet is in state %d after the abort", t.State)
			}
			return nil
		}
	}
	return errors.New("it does not list the tablet after the abort")
}

// move moves tablet tb from group from to group to (or finishes that
// move), records it and logs one line.
func (b *Balancer) move(ctx context.Context, c *Client, tb TabletInfo, from, to uint32, resumed bool, count []int, rule string) error {
	b.SetState("moving")
	mctx, cancel := context.WithTimeout(ctx, b.cfg.MoveTimeout)
	defer cancel()
	t0 := time.Now()
	err := c.MoveTablet(mctx, tb.Low, to)
	mv := &BalancerMove{From: fenceString(c.m, tb.Low), To: highString(c.m, tb), Source: from, Target: to, Resumed: resumed,
		Rule: rule, At: t0, Took: time.Since(t0).Round(time.Millisecond).String()}
	what := "moved"
	if resumed {
		what = "finished moving"
	}
	b.mu.Lock()
	b.st.Last = mv
	b.busy = busyKey{}
	if err != nil {
		mv.Err = err.Error()
		if bytes.Equal(b.failed, tb.Low) {
			b.failures++
		} else {
			b.failed, b.failures = bytes.Clone(tb.Low), 1
		}
		b.st.State, b.st.LastError, b.st.LastErrorAt = "error", err.Error(), time.Now()
		b.st.Errors++
	} else {
		b.failed, b.failures = nil, 0
		b.st.Moves++
		if resumed {
			b.st.Resumed++
		}
		b.st.State = "balanced"
		if count != nil {
			count[from]--
			count[to]++
			b.st.Tablets = count
		}
	}
	b.mu.Unlock()
	if err != nil {
		b.cfg.Log.Warn(fmt.Sprintf("balancer: moving tablet [%s, %s) from group %d to group %d failed after %s (the next round finishes it): %v",
			mv.From, mv.To, from, to, mv.Took, err))
		return err
	}
	line := fmt.Sprintf("balancer: %s tablet [%s, %s) from group %d to group %d in %s", what, mv.From, mv.To, from, to, mv.Took)
	if count != nil {
		line += fmt.Sprintf(" (tablets per group now %v)", count)
	}
	if rule == "load" {
		line += fmt.Sprintf(" by load (writes per group in the last round %v)", b.Status().Writes)
	}
	b.cfg.Log.Info(line)
	return nil
}

// split splits the hot tablet tb in its group (the rule by load, p).
func (b *Balancer) split(ctx context.Context, c *Client, tb TabletInfo, p balancePlan) error {
	b.SetState("splitting")
	mctx, cancel := context.WithTimeout(ctx, b.cfg.MoveTimeout)
	defer cancel()
	t0 := time.Now()
	err := c.SplitTablet(mctx, tb.Low)
	mv := &BalancerMove{From: fenceString(c.m, tb.Low), To: highString(c.m, tb), Source: p.From, Target: p.From, Split: true,
		Rule: p.Rule, At: t0, Took: time.Since(t0).Round(time.Millisecond).String()}
	b.mu.Lock()
	b.st.LastSplit = mv
	if err != nil {
		mv.Err = err.Error()
		b.st.State, b.st.LastError, b.st.LastErrorAt = "error", err.Error(), time.Now()
		b.st.Errors++
	} else {
		b.st.Splits++
		b.st.State = "balanced"
	}
	writes := b.st.Writes
	b.mu.Unlock()
	if err != nil {
		b.cfg.Log.Warn(fmt.Sprintf("balancer: splitting hot tablet [%s, %s) in group %d failed: %v", mv.From, mv.To, p.From, err))
		return err
	}
	b.cfg.Log.Info(fmt.Sprintf("balancer: split hot tablet [%s, %s) (%d keys) in group %d in %s by load (writes per group in the last round %v)",
		mv.From, mv.To, tb.Keys, p.From, mv.Took, writes))
	return nil
}

// cleanLeftovers removes the installing copies that interrupted undos
// left at their moves' targets. An undo (undoMove) aborts at the source,
// which then serves the tablet again at the move's generation, and then
// at the target; if it stops in between (its client died, the check
// read failed), the target keeps an installing tablet of that
// generation. Directories hide it (a tablet served at a generation as
// high covers it, btree.NewDirectory), so Tablets does not show it and
// rounds are not held up, and a later move of the range to that target
// replaces it (CtlIngest); but with no such move it and its keys would
// stay for ever.
//
// A leftover, as a round sees it: an installing tablet at group t (read
// linearizably) that a SERVING tablet of another group s overlaps at a
// generation at least the installing one's, in a linearizable read of s
// made AFTER t's read answered. It is removed by CtlAbort at t with its
// own fences and generation (its keys become garbage, collected as any
// other). Why this never removes a live move's copy: a tablet's
// generation only grows (a move and an abort raise it by one, a split
// keeps it), and while move G (an ingest of generation G) can still
// finish, its source holds the range frozen at G-1 (until its drop)
// and then nobody holds it until the target activates it; so no group
// serves any key of it at G or more. A read of s, after t's read showed
// the copy, that finds a key of it served at G or more thus comes after
// one of: the abort of move G at its source (from then on the source
// refuses move G's drop, and move G can never finish: its copy is
// dead), or the activation of move G at t (t's copy serves; an abort
// of generation G then finds no installing tablet of G there, and
// changes nothing). The order of the two reads is what makes "served at
// G or more" a fact about a moment when the copy already existed: read
// first, s's answer could predate the copy, and only the growth of the
// range's generations would then rule out a live one. Each of the two
// rules is enough on its own: a copy of move G is made after its source
// froze the range at G-1, so no group served a key of it at G or more
// before (generations only grow), and after it nobody serves it while
// the move can finish; TestBalancerLeftoverReadOrder runs a move between
// the round's reads of its source and its target, and planting both
// leftoverSourceFirst and leftoverAnyGen takes its copy. Frozen is not
// serving: a range under a move is left alone (a round after the move
// settles cleans it). The abort carries the leftover's exact fences and
// generation, so t applies it to that tablet alone, and only while it
// is still installing. Its failures are logged, not the round's: a
// leftover waits for the next round.
func (b *Balancer) cleanLeftovers(ctx context.Context, c *Client) {
	if b.knobs.noLeftovers {
		return
	}
	k, err := c.anyKeyspace()
	if err != nil {
		return
	}
	k.init()
	read := func(g uint32) ([]btree.Tablet, error) {
		gctx, cancel := context.WithTimeout(ctx, dirReadTimeout)
		defer cancel()
		r := k.reader(g)
		defer k.putReader(g, r)
		res, err := r.DirCtxMode(gctx, kv.Linearizable)
		if b.knobs.afterLeftoverRead != nil {
			b.knobs.afterLeftoverRead(g)
		}
		if err != nil {
			return nil, err
		}
		out := make([]btree.Tablet, len(res.Tablets))
		for i, tb := range res.Tablets {
			out[i] = btree.Tablet{Low: bytes.Clone(tb.Low), High: bytes.Clone(tb.High), HighInf: tb.HighInf,
				State: tb.State, Gen: tb.Gen, To: tb.To}
		}
		return out, nil
	}
	groups := uint32(len(c.m.Groups))
	lists := make([][]btree.Tablet, groups)
	for g := range groups {
		lists[g], _ = read(g) // a group not read is skipped this round
		if ctx.Err() != nil {
			return
		}
	}
	// covers: a tablet of group s that shows tablet l of group t dead.
	covers := func(q, l btree.Tablet) bool {
		if !tabletsOverlap(q, l) {
			return false
		}
		return b.knobs.leftoverUnchecked || q.State == btree.TabletServing && (q.Gen >= l.Gen || b.knobs.leftoverAnyGen)
	}
	for t := range groups {
		for _, l := range lists[t] {
			if l.State != btree.TabletInstalling {
				continue
			}
			s, found := uint32(0), false
			for g := range groups {
				if g == t {
					continue
				}
				for _, q := range lists[g] {
					if covers(q, l) {
						s, found = g, true
					}
				}
			}
			if !found {
				continue
			}
			if !b.knobs.leftoverUnchecked && !b.knobs.leftoverSourceFirst {
				// s again, after t's read answered (above).
				again, err := read(s)
				if err != nil {
					continue
				}
				found = false
				for _, q := range again {
					found = found || covers(q, l)
				}
				if !found {
					continue
				}
			}
			tb := btree.Tablet{Low: l.Low, High: l.High, HighInf: l.HighInf}
			ct := &btree.Ctl{Cmd: btree.CtlAbort, To: t, Gen: l.Gen, Tablet: tb}
			if err := c.step(ctx, t, ct, "abort leftover"); err != nil {
				b.cfg.Log.Warn(fmt.Sprintf("balancer: removing the leftover installing tablet [%s, %s) of generation %d at group %d (the next round tries again): %v",
					fenceString(c.m, l.Low), highString(c.m, TabletInfo{High: l.High, HighInf: l.HighInf}), l.Gen, t, err))
				continue
			}
			b.mu.Lock()
			b.st.Leftovers++
			b.mu.Unlock()
			b.cfg.Log.Info(fmt.Sprintf("balancer: removed the leftover installing tablet [%s, %s) of generation %d at group %d (an undone move's copy: group %d serves the range)",
				fenceString(c.m, l.Low), highString(c.m, TabletInfo{High: l.High, HighInf: l.HighInf}), l.Gen, t, s))
		}
	}
}

// tabletsOverlap reports whether tablets a and b share a key.
func tabletsOverlap(a, b btree.Tablet) bool {
	return (a.HighInf || string(b.Low) < string(a.High)) && (b.HighInf || string(a.Low) < string(b.High))
}

// collectPerRound bounds the collection requests a round sends one group
// (each deletes up to btree.DefaultGarbageStep keys): a round stays
// short, and a big dropped tablet's keys go over several rounds.
const collectPerRound = 32

// collect sends collection requests (Client.collectGarbage) to each
// group whose published garbage count is not 0, and returns how many
// each group got (the log entries this round added to it, which are not
// its load). Its failures are logged, not the round's: garbage waits.
func (b *Balancer) collect(ctx context.Context, c *Client) []int {
	if b.knobs.noCollect {
		return nil
	}
	garbage, err := c.GroupGarbage(ctx)
	if err != nil {
		return nil
	}
	sent := make([]int, len(garbage))
	var collected, reqs uint64
	for g, n := range garbage {
		if n <= 0 {
			continue
		}
		// The published count is a hint (a replica may lag): the
		// answers say what was deleted and what is left.
		left, del, k, err := c.collectGarbage(ctx, uint32(g), collectPerRound)
		sent[g], reqs, collected = k, reqs+uint64(k), collected+del
		if err != nil {
			b.cfg.Log.Warn("balancer: " + err.Error())
			continue
		}
		garbage[g] = int64(left)
		if left > 0 {
			b.cfg.Log.Info(fmt.Sprintf("balancer: group %d holds %d garbage keys after %d collections", g, left, k))
		}
	}
	b.mu.Lock()
	b.st.Garbage = garbage
	b.st.GarbageCollected += collected
	b.st.Collections += reqs
	b.mu.Unlock()
	return sent
}

// load is each group's write load since the last round: the log entries
// its most advanced replica applied meanwhile (read one-sided from the
// replicas' headers; nil if they could not be read, or at the first
// round), less the collection requests this round sent it (sent).
func (b *Balancer) load(ctx context.Context, c *Client, sent []int) []uint64 {
	st, err := c.Status(ctx)
	if err != nil || len(st.Groups) != len(c.m.Groups) {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.applied
	b.applied = make([]uint64, len(st.Groups))
	for g, gs := range st.Groups {
		b.applied[g] = gs.Applied
	}
	if len(prev) != len(b.applied) {
		return nil
	}
	load := make([]uint64, len(prev))
	for g := range load {
		if b.applied[g] > prev[g] {
			load[g] = b.applied[g] - prev[g]
		}
		if g < len(sent) {
			load[g] -= min(load[g], uint64(sent[g]))
		}
	}
	return load
}

// planBalanceLoad is PlanBalance with the groups' loads (nil: none) as
// the tie-breaker: among the groups with the most tablets the source is
// the most loaded, among those with the fewest the target the least
// loaded (then the lowest group id, as PlanBalance). The counts decide
// whether a move is made, so the load never makes one that PlanBalance
// would not.
func planBalanceLoad(tablets []TabletInfo, groups int, load []uint64) (low []byte, from, to uint32, ok bool) {
	low, from, to, ok = PlanBalance(tablets, groups)
	if !ok || len(load) != groups {
		return low, from, to, ok
	}
	count := make([]int, groups)
	last := make([][]byte, groups)
	has := make([]bool, groups)
	for _, tb := range tablets {
		count[tb.Group]++
		if !has[tb.Group] || string(tb.Low) > string(last[tb.Group]) {
			last[tb.Group], has[tb.Group] = tb.Low, true
		}
	}
	hi, lo := from, to
	for g := range groups {
		if count[g] == count[hi] && load[g] > load[hi] {
			hi = uint32(g)
		}
		if count[g] == count[lo] && load[g] < load[lo] {
			lo = uint32(g)
		}
	}
	return last[hi], hi, lo, true
}

// fenceString is a fence as kvcli tablets prints it: min for the empty
// one, else KEYSPACE:KEY (quoted when it holds unprintable bytes or
// spaces), or hex for an id no keyspace has.
func fenceString(m *cluster.Map, k []byte) string {
	if len(k) == 0 {
		return "min"
	}
	for _, ks := range m.Keyspaces {
		if ks.ID == k[0] {
			key := string(k[1:])
			if strings.ContainsFunc(key, func(r rune) bool { return !strconv.IsPrint(r) || r == ' ' }) {
				key = strconv.Quote(key)
			}
			return ks.Name + ":" + key
		}
	}
	return fmt.Sprintf("0x%x", k)
}

func highString(m *cluster.Map, tb TabletInfo) string {
	if tb.HighInf {
		return "max"
	}
	return fenceString(m, tb.High)
}

// OpenHighSlot opens a client of map m on the highest client slot of
// this host that no other process holds (ordinary clients take the
// lowest: see WithSlot), for a client that a server process runs for
// itself (kvserver's balancer). On shm the slot is claimed as Open
// claims one (a lock file, released by release or by the process's
// death); on tcp it is the highest slot whose address this host can
// listen on, with the cluster secret. release closes the client and
// lets the slot go.
func OpenHighSlot(ctx context.Context, m *cluster.Map, secret []byte, opts ...Option) (c *Client, release func(), err error) {
	if err := m.Fill(); err != nil {
		return nil, nil, err
	}
	switch m.Fabric {
	case "shm":
		dir := filepath.Join(os.TempDir(), "rdmakv-slots", m.Name)
		for k := len(m.ClientNodes) - 1; k >= 0; k-- {
			f, err := lockSlot(dir, k)
			if err != nil {
				return nil, nil, err
			}
			if f == nil {
				continue
			}
			sweepSlots(dir, f.Name())
			c, err := Open(ctx, append(opts, WithMap(m), WithSlot(k))...)
			if err != nil {
				releaseSlot(f)
				return nil, nil, err
			}
			return c, func() { c.Close(); releaseSlot(f) }, nil
		}
		return nil, nil, fmt.Errorf("all %d client slots of cluster %q are in use on this host", len(m.ClientNodes), m.Name)
	case "tcp":
		if len(secret) == 0 {
			return nil, nil, errors.New("a tcp cluster needs its secret")
		}
		s := fabric.ForMap(m)
		s.Secret = secret
		inUse := 0
		for k := len(m.ClientNodes) - 1; k >= 0; k-- {
			n, err := fabric.Open(s, m.ClientNodes[k])
			switch {
			case errors.Is(err, syscall.EADDRINUSE):
				inUse++
				continue
			case errors.Is(err, syscall.EADDRNOTAVAIL):
				continue
			case err != nil:
				return nil, nil, fmt.Errorf("client slot %d (%s): %w", k, m.Addrs[m.ClientNodes[k]], err)
			}
			c, err := Open(ctx, append(opts, WithMap(m), WithSlot(k), WithNode(n))...)
			if err != nil {
				n.Close()
				return nil, nil, err
			}
			return c, func() { c.Close(); n.Close() }, nil
		}
		if inUse == 0 {
			return nil, nil, errors.New("no client slot listens on this host: add a [[clients]] block listening here to the config (count = 1 is enough)")
		}
		return nil, nil, fmt.Errorf("all %d client slots of this host are in use", inUse)
	}
	return nil, nil, fmt.Errorf("fabric %q: give the client's node (WithNode)", m.Fabric)
}
