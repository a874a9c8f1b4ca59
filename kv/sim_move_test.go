package kv

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// Tablet moves in the kv simulator (issue 18). The ordered keys o00-o23
// are cut into three tablets, [-inf, o08), [o08, o16) and [o16, +inf),
// placed round-robin over the groups. A mover process (a client node of
// its own) moves them between groups while the clients run, through the
// same four steps client.MoveTablet sends (btree/move.go: freeze at the
// source, ingest at the target what it read one-sided from the source's
// leader after the freeze, drop at the source, activate at the target),
// each after the previous one was acknowledged. client/move.go is code
// for goroutines and contexts (a call per step, blocking), so the mover
// here is a polled state machine over the same steps and encodings
// (btree.Ctl, kv.OrderedReader's directory and scan reads), not a copy of
// the client's calls. Each step names the product function it mirrors.
// The mover reads the directory linearizably (from each group's leader,
// its epoch confirmed: Client.freshDir), except in the lagging-mover
// case, where it reads it stale-ok from each group's member furthest
// behind (harsher than the product: its undo must stay safe on a
// directory behind the groups), and a new mover of the old-view case
// plans first from what its crashed incarnation knew. A
// mover that crashes comes back as a new process that reads the
// directory again and finishes the move it finds under way (MoveTablet
// again) or undoes it (Client.undoMove, as AbortTabletMove and the
// balancer do): the abort at the source first; then a linearizable read
// of the source's tablets (Keyspace.servesAgain) showing that it serves
// the tablet again; only then the abort at the target. If the source no
// longer lists the tablet (it dropped it: the move got past its drop,
// and the target's installing copy is the only one), the mover finishes
// the move forward instead (MoveTablet's activation alone).
//
// The clients route by what they know: writes and reads through the log
// go to the group they last found owning the tablet; StatusMoved sends
// them to the next group, StatusMoving makes them wait and send again
// (neither applied anything). One-sided lookups and scans route by a
// btree.Directory read one-sided from every group's header region (as
// the client library's), with the ownership check
// (OrderedReader.SetOwnVersion); ErrNotOwner, a tablet being installed or
// a gap makes them read the directory again. A scan goes piece by piece
// (Directory.Piece), each piece its own op in the history.
//
// Checks, besides porcupine over the history (kvcheck, scans included)
// and the stale-ok check:
//   - ownership: after every Poll of every replica, the tablets each
//     group holds at the furthest entry any of its replicas applied
//     (replicas of a group hold the same tablets at the same entry): no
//     key is served (a serving or frozen tablet) by two groups at once;
//     after the run every tablet is serving and the groups' tablets
//     cover the key order exactly once ("owned by none" otherwise),
//     except an installing tablet left of an undo cut short between its
//     steps (the mover crashed after the abort at the source), which a
//     served tablet of its generation or a later one hides (the next
//     move's ingest at that group replaces it: btree/move.go);
//   - held: at every change of a group's tablets, every key lies in a
//     tablet (in any state) of some group's furthest replica: a range
//     that no group holds lost its pairs;
//   - every group's replicas hold only keys of their tablets;
//   - moved pairs: when a move's drop is acknowledged, the target's
//     installing tablet holds no key but those the mover read from the
//     source after the freeze (no key of an older installing copy);
//   - scans: every piece's pairs lie in its range, in order (descending
//     for a reverse scan), at most its limit, and the pieces of a scan
//     follow each other in order;
//   - versions: of two acknowledged writes of a key that leave it
//     present, with no delete of the key issued around them, the one
//     that began after the other returned has the higher version (an
//     ingest raises the target's version offset, verOff, above the
//     moved pairs'); no two acknowledged writes of a key share one.

// moveOpts configures the moves of a run.
type moveOpts struct {
	// every is the mean gap between two moves (default 2 ms).
	every time.Duration
	// crashMover crashes the mover this many times in the middle of a
	// move (after its freeze, an ingest or its drop was acknowledged),
	// for 0.5 to 2 ms.
	crashMover int
	// crashLeaders crashes, this many times, the leader of the group a
	// step went to (the source or the target) right after the step was
	// acknowledged, for 1 to 4 ms.
	crashLeaders int
	// abortOneIn: a new mover that finds a tablet frozen aborts the move
	// one time in abortOneIn (default 3), else finishes it.
	abortOneIn int
	// crashAfterDrop: an armed crash of the mover comes right after a
	// move's drop (else after one of its steps at random).
	crashAfterDrop bool
	// oldView: a new mover makes its first plan from the tablets its
	// crashed incarnation knew, the move's tablet frozen at its source
	// (as an operator who runs abort-move from an old listing), not from
	// a read.
	oldView bool
	// staleDir: the mover reads the directory stale-ok, each group's
	// from the member furthest behind at the read (the product reads it
	// linearizably, from the leaders).
	staleDir bool
	// Planted bugs of the mover (not the product's: its steps in a
	// wrong order) and of the stores.
	activateFirst bool   // activate at the target before the drop at the source
	activateEarly bool   // drop and activate after the first ingest, then the others
	uncheckedUndo bool   // undo: abort at the target, then at the source, no check between
	store         string // "write-during-move", "no-version-floor", "drop-keeps-keys", "no-own-bump", "ingest-over-leftover"
}

// debugMoves prints the groups' tablet changes and the mover's steps (set
// it by hand to follow a failing seed).
var debugMoves = false

// moveFences cut the ordered keys into the tablets of a moves run.
var moveFences = []string{"o08", "o16"}

// moveTablets are the tablets of a moves run, in key order.
func moveTablets() []btree.Tablet {
	var out []btree.Tablet
	lo := []byte(nil)
	for _, f := range moveFences {
		out = append(out, btree.Tablet{Low: lo, High: []byte(f)})
		lo = []byte(f)
	}
	return append(out, btree.Tablet{Low: lo, HighInf: true})
}

// tabletOf is the index of the tablet of key in moveTablets.
func tabletOf(key string) int {
	i := 0
	for i < len(moveFences) && key >= moveFences[i] {
		i++
	}
	return i
}

// moveRun is a run's moves: the mover's node and what the checks keep.
type moveRun struct {
	h     *kvRun
	node  rdma.NodeID
	mover *moverProc // the live incarnation
	// front[g]: the tablets group g holds after entry front[g].idx, the
	// furthest entry any of its replicas applied.
	front []frontier
	// route[client][tablet]: the group a client sends the tablet's
	// requests through the log to first.
	route        [][]int
	view         *oldView // the crashed mover's tablets (moveOpts.oldView)
	crashesLeft  int
	leadersLeft  int
	stats        moveStats
	versionPairs int // pairs of writes the version check compared
}

type frontier struct {
	idx     uint64
	tablets []btree.Tablet
}

type moveStats struct {
	moves, aborts, resumes, activations, refused, crashes, leaders, notOwner, dirReads, waits, moving, rerouted, frozen, pieces int
	// undone: undos whose check passed (the target aborted too);
	// forward: undos whose source had dropped the tablet (finished
	// forward); leftovers: hidden installing tablets after the run.
	undone, forward, leftovers int
}

func (h *kvRun) setupMoves() error {
	m := &moveRun{h: h, crashesLeft: h.o.moves.crashMover, leadersLeft: h.o.moves.crashLeaders}
	m.front = make([]frontier, len(h.members))
	m.node = h.cnodes[len(h.cnodes)-1] + 1
	m.route = make([][]int, len(h.cnodes))
	for c := range m.route {
		m.route[c] = make([]int, len(moveFences)+1)
		for i := range m.route[c] {
			m.route[c][i] = i % len(h.members)
		}
	}
	slot := len(h.cnodes)
	h.cnodes = append(h.cnodes, m.node)
	h.mv = m
	return h.s.AddNode(m.node, func() sim.Process {
		p := &moverProc{h: h, m: m, slot: slot}
		m.mover = p
		return p
	})
}

// placedTablets are group g's tablets at the start of a moves run.
func placedTablets(g, groups int) []btree.Tablet {
	var out []btree.Tablet
	for i, tb := range moveTablets() {
		if i%groups == g {
			out = append(out, tb)
		}
	}
	return out
}

// furthestBehind is the index of group g's live member that delivered
// the fewest entries.
func (h *kvRun) furthestBehind(g int) int {
	at, least := 0, uint64(1<<64-1)
	for i, id := range h.members[g] {
		if p := h.procs[id]; p != nil && h.s.Live(id) && p.r.Multicast().Delivered() < least {
			at, least = i, p.r.Multicast().Delivered()
		}
	}
	return at
}

// plantStore plants the run's store bug in st.
func (m *moveOpts) plantStore(st *btree.Store) {
	switch m.store {
	case "":
	case "write-during-move":
		btree.PlantWriteDuringMove(st)
	case "no-version-floor":
		btree.PlantNoVersionFloor(st)
	case "drop-keeps-keys":
		btree.PlantDropKeepsKeys(st)
	case "no-own-bump":
		btree.PlantNoOwnBump(st)
	case "gc-keeps-range":
		btree.PlantGCKeepsRange(st)
	case "ingest-over-leftover":
		btree.PlantIngestOverLeftover(st)
	default:
		panic("unknown store bug " + m.store)
	}
}

// served reports whether a tablet in state st is served (read: serving
// or frozen).
func served(st uint8) bool { return st != btree.TabletInstalling }

func fmtTablet(tb btree.Tablet) string {
	st := map[uint8]string{btree.TabletServing: "serving", btree.TabletFrozen: "frozen", btree.TabletInstalling: "installing"}[tb.State]
	return fmt.Sprintf("[%q, %s) %s gen %d", tb.Low, fmtHi(tb), st, tb.Gen)
}

func fmtHi(tb btree.Tablet) string {
	if tb.HighInf {
		return "+inf"
	}
	return fmt.Sprintf("%q", tb.High)
}

func cloneTablets(tbs []btree.Tablet) []btree.Tablet {
	out := make([]btree.Tablet, len(tbs))
	for i, tb := range tbs {
		out[i] = tb
		out[i].Low, out[i].High = bytes.Clone(tb.Low), bytes.Clone(tb.High)
	}
	return out
}

func sameTablets(a, b []btree.Tablet) bool {
	return slices.EqualFunc(a, b, func(x, y btree.Tablet) bool {
		return bytes.Equal(x.Low, y.Low) && bytes.Equal(x.High, y.High) && x.HighInf == y.HighInf && x.State == y.State && x.To == y.To && x.Gen == y.Gen
	})
}

func overlap(a, b btree.Tablet) bool {
	return (a.HighInf || string(b.Low) < string(a.High)) && (b.HighInf || string(a.Low) < string(b.High))
}

// note takes a replica's tablets after its Poll: the group's frontier
// moves on, and no key may be served by two groups' frontiers.
func (m *moveRun) note(p *kvRepProc) {
	h := m.h
	g := h.group[p.env.ID()]
	idx := p.r.Multicast().Delivered()
	f := &m.front[g]
	switch {
	case idx > f.idx || f.tablets == nil:
		changed := !sameTablets(f.tablets, p.store.Tablets())
		if debugMoves && changed {
			fmt.Printf("%v: group %d node %d after entry %d:", h.s.Now(), g, p.env.ID(), idx)
			for _, tb := range p.store.Tablets() {
				fmt.Printf(" %s to %d;", fmtTablet(tb), tb.To)
			}
			fmt.Println()
		}
		f.idx, f.tablets = idx, cloneTablets(p.store.Tablets())
		if changed && !m.held() {
			return
		}
	case idx == f.idx && !sameTablets(f.tablets, p.store.Tablets()):
		h.fail(fmt.Errorf("ownership: group %d: node %d holds other tablets than its group-mates after entry %d", g, p.env.ID(), idx))
		return
	default:
		return
	}
	// The replica holds only keys of its tablets, and of the garbage
	// ranges a drop or an abort left, which it deletes in steps
	// (btree/garbage.go); its counts agree with its tree.
	tbs := p.store.Tablets()
	gr, _ := p.store.Garbage()
	p.store.Tree().Ascend(nil, func(k, _ []byte) bool {
		if !slices.ContainsFunc(tbs, func(tb btree.Tablet) bool { return tb.Contains(k) }) &&
			!slices.ContainsFunc(gr, func(tb btree.Tablet) bool { return tb.Contains(k) }) {
			h.fail(fmt.Errorf("ownership: group %d node %d holds key %q after entry %d, in none of its tablets", g, p.env.ID(), k, idx))
			return false
		}
		return true
	})
	if err := p.store.CheckKeys(); err != nil {
		h.fail(fmt.Errorf("ownership: group %d node %d after entry %d: %v", g, p.env.ID(), idx, err))
		return
	}
	for o := range m.front {
		if o == g {
			continue
		}
		for _, a := range f.tablets {
			for _, b := range m.front[o].tablets {
				if served(a.State) && served(b.State) && overlap(a, b) {
					h.fail(fmt.Errorf("ownership: a key served by two groups at once: group %d's %s (entry %d) and group %d's %s (entry %d)",
						g, fmtTablet(a), f.idx, o, fmtTablet(b), m.front[o].idx))
					return
				}
			}
		}
	}
}

// held checks that every key lies in a tablet of some group's frontier,
// in any state: a range that no group holds (not even installing) has
// lost its pairs for good (an undo that aborted the target's copy after
// the source dropped the tablet).
func (m *moveRun) held() bool {
	if slices.ContainsFunc(m.front, func(f frontier) bool { return f.tablets == nil }) {
		return true // a group not polled yet
	}
	var all []btree.Tablet
	for _, f := range m.front {
		all = append(all, f.tablets...)
	}
	slices.SortFunc(all, func(a, b btree.Tablet) int { return bytes.Compare(a.Low, b.Low) })
	at := []byte{}
	for _, tb := range all {
		if bytes.Compare(tb.Low, at) > 0 {
			break
		}
		if tb.HighInf {
			return true
		}
		if bytes.Compare(tb.High, at) > 0 {
			at = tb.High
		}
	}
	m.h.fail(fmt.Errorf("ownership: the keys from %q are held by no group (no tablet in any state at any group's furthest replica): lost", at))
	return false
}

// settledFront reports whether every group's frontier tablet is serving
// (or a hidden leftover).
func (m *moveRun) settledFront() bool {
	for g, f := range m.front {
		for _, tb := range f.tablets {
			if tb.State != btree.TabletServing && m.coveredBy(g, tb) == nil {
				return false
			}
		}
	}
	return true
}

// leftover reports whether group g's tablet tb is an installing tablet
// left of an undo cut short: another group's frontier serves a tablet
// overlapping it at its generation or a later one, so the directory
// hides it and its move can never finish (btree/move.go: the abort at
// the source used the generation up).
func (m *moveRun) leftover(g int, tb btree.Tablet) bool {
	q := m.coveredBy(g, tb)
	return q != nil && q.Gen >= tb.Gen
}

// coveredBy is, for group g's installing tablet tb, a tablet another
// group's frontier serves over part of its range (nil: none).
func (m *moveRun) coveredBy(g int, tb btree.Tablet) *btree.Tablet {
	if tb.State != btree.TabletInstalling {
		return nil
	}
	for o, f := range m.front {
		for i, q := range f.tablets {
			if o != g && q.State == btree.TabletServing && overlap(q, tb) {
				return &f.tablets[i]
			}
		}
	}
	return nil
}

// settled: no move under way (runKV's convergence waits for it).
func (m *moveRun) settled() bool {
	p := m.mover
	return m.h.s.Live(m.node) && p != nil && p.st == mvIdle && m.settledFront()
}

// dump describes the mover and the groups' tablets, for a failed run.
func (m *moveRun) dump() string {
	var b strings.Builder
	if p := m.mover; p != nil {
		fmt.Fprintf(&b, "mover (node %d) live %v: state %d, queue %d steps, inflight %v, next %v; move %s from %d to %d gen %d\n",
			m.node, m.h.s.Live(m.node), p.st, len(p.queue), p.inflight, p.next, fmtTablet(p.tb), p.from, p.to, p.gen)
		for _, s := range p.queue {
			fmt.Fprintf(&b, "  step %s at group %d\n", s.what, s.g)
		}
	}
	for g, f := range m.front {
		fmt.Fprintf(&b, "group %d after entry %d:", g, f.idx)
		for _, tb := range f.tablets {
			fmt.Fprintf(&b, " %s to %d;", fmtTablet(tb), tb.To)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// checkMoves: after the run, every group's tablets are serving and
// together cover the key order once; the versions check.
func (h *kvRun) checkMoves() error {
	m := h.mv
	var all []btree.Tablet
	for g, f := range m.front {
		for _, tb := range f.tablets {
			if m.leftover(g, tb) {
				m.stats.leftovers++
				continue
			}
			if q := m.coveredBy(g, tb); q != nil {
				return fmt.Errorf("ownership: group %d's %s after the run, left of an aborted move but not hidden by the served %s (the next move of the range to group %d would take its pairs in over it)", g, fmtTablet(tb), fmtTablet(*q), g)
			}
			if tb.State != btree.TabletServing {
				return fmt.Errorf("ownership: group %d's %s after the run", g, fmtTablet(tb))
			}
			all = append(all, tb)
		}
	}
	slices.SortFunc(all, func(a, b btree.Tablet) int { return bytes.Compare(a.Low, b.Low) })
	var at []byte
	for i, tb := range all {
		if i == 0 && len(tb.Low) != 0 || i > 0 && (all[i-1].HighInf || !bytes.Equal(tb.Low, at)) {
			return fmt.Errorf("ownership: after the run the groups' tablets do not cover the keys once: %s after %q", fmtTablet(tb), at)
		}
		at = tb.High
	}
	if len(all) == 0 || !all[len(all)-1].HighInf {
		return fmt.Errorf("ownership: after the run no group owns the keys past %q", at)
	}
	return h.checkVersions()
}

// checkVersions checks the versions of the acknowledged ordered writes
// (see the comment at the top).
func (h *kvRun) checkVersions() error {
	type w struct {
		op  *kvcheck.Op
		ver uint64
	}
	hist := h.rec.History()
	present := map[string][]w{}
	deletes := map[string][]*kvcheck.Op{}
	for i := range hist {
		o := &hist[i]
		if !strings.HasPrefix(o.Key, "o") && o.Kind != kvcheck.Batch {
			continue
		}
		switch o.Kind {
		case kvcheck.Put, kvcheck.CAS, kvcheck.Merge:
			if !o.Out.Unknown && o.Out.OK && o.Out.Version != 0 {
				present[o.Key] = append(present[o.Key], w{o, o.Out.Version})
			}
		case kvcheck.Delete:
			deletes[o.Key] = append(deletes[o.Key], o)
		case kvcheck.Batch:
			for j, b := range o.Batch {
				if !strings.HasPrefix(b.Key, "o") {
					break
				}
				if b.Delete {
					deletes[b.Key] = append(deletes[b.Key], o)
				} else if !o.Out.Unknown && o.Out.OK && o.Out.Version != 0 {
					present[b.Key] = append(present[b.Key], w{o, o.Out.Version + uint64(j)})
				}
			}
		}
	}
	for key, ws := range present {
		for i := range ws {
			for j := range ws {
				a, b := ws[i], ws[j]
				if i < j && a.ver == b.ver {
					return fmt.Errorf("versions: two writes of %q got version %x: %v and %v", key, a.ver, a.op, b.op)
				}
				if a.op.Return == 0 || a.op.Return >= b.op.Call {
					continue
				}
				between := slices.ContainsFunc(deletes[key], func(d *kvcheck.Op) bool {
					return d.Call < b.op.Return && (d.Return == 0 || d.Return > a.op.Call)
				})
				if between {
					continue
				}
				h.mv.versionPairs++
				if a.ver >= b.ver {
					return fmt.Errorf("versions: %q written at version %x by %v, then at %x by %v, which began after it returned", key, a.ver, a.op, b.ver, b.op)
				}
			}
		}
	}
	return nil
}

// The mover.

type mvState uint8

const (
	mvIdle  mvState = iota
	mvDir           // reading every group's tablets
	mvSteps         // sending the queued steps, one at a time
	mvRead          // reading the frozen tablet from its source's leader
	mvCheck         // an undo: reading the source's tablets linearizably
)

type mvStep struct {
	g     uint32
	ct    btree.Ctl
	what  string
	crash bool // the mover crashes once it is acknowledged (crashMover)
}

// moverProc moves tablets (see the comment at the top): a polled state
// machine, one incarnation per life of its node.
type moverProc struct {
	h    *kvRun
	m    *moveRun
	env  *sim.Env
	slot int
	c    *multicast.Client
	dirR []*OrderedReader
	scan []*OrderedReader
	st   mvState
	next time.Duration
	// The tablets read so far (a group whose read fails keeps the last
	// ones read, as the client's directory does).
	tabs        map[uint32][]btree.Tablet
	dvers, owns map[uint32]uint64
	dir         *btree.Directory
	// The move under way: its tablet, source, target and generation.
	tb        btree.Tablet
	from, to  uint32
	gen       uint64
	pairs     []btree.KVV
	lo        []byte
	queue     []mvStep
	thenRead  bool // read the tablet when the queue is done
	thenCheck bool // an undo: check the source when the queue is done
	checks    int  // the undo's check reads that failed
	inflight  bool
	stepID    multicast.MsgID
	stepDone  bool
	stepState uint8
	crashArm  bool // crash after the next step acknowledged
	fromView  bool // the next plan is made from the old incarnation's tablets
	read      bool // pairs holds the tablet as this incarnation read it
}

// oldView is what a crashed mover knew (moveOpts.oldView).
type oldView struct {
	tabs        map[uint32][]btree.Tablet
	dvers, owns map[uint32]uint64
}

func (p *moverProc) Start(env *sim.Env) error {
	h := p.h
	p.env = env
	cfg := multicast.ClientConfig{Slot: uint32(p.slot), Inc: uint64(env.Incarnation()), Tree: h.t, Members: h.members,
		ClientSlots: 4, SlotSize: 512, MaxResult: MultiResultSize, RetryAfter: 10 * time.Millisecond,
		ReconnectMin: 100 * time.Microsecond, ReconnectMax: time.Millisecond, OnDone: p.done}
	c, err := multicast.NewClient(cfg, env.Node())
	if err != nil {
		return err
	}
	p.c = c
	for g := range h.members {
		p.dirR = append(p.dirR, NewOrderedReader(env.Node(), uint32(g), h.members[g], p.slot, btree.NewCache(1<<16)))
		p.scan = append(p.scan, NewOrderedReader(env.Node(), uint32(g), h.members[g], p.slot, btree.NewCache(1<<16)))
	}
	p.tabs, p.dvers, p.owns = map[uint32][]btree.Tablet{}, map[uint32]uint64{}, map[uint32]uint64{}
	p.next = env.Now() + p.gap()
	if env.Incarnation() > 1 {
		p.next = env.Now() // a new mover looks at once for a move to finish
		if v := p.m.view; v != nil {
			// oldView: the first plan is made from what the crashed
			// incarnation knew.
			p.m.view = nil
			p.tabs, p.dvers, p.owns, p.fromView = v.tabs, v.dvers, v.owns, true
		}
	}
	return nil
}

func (p *moverProc) gap() time.Duration {
	return time.Duration(p.env.Rand().Int64N(int64(2 * cmp.Or(p.h.o.moves.every, 2*time.Millisecond))))
}

func (p *moverProc) done(o *multicast.Outcome) {
	if !p.inflight || o.ID != p.stepID {
		return
	}
	p.inflight, p.stepDone = false, true
	p.stepState = 255
	if len(o.Replies) == 1 {
		if r, err := btree.DecodeResult(o.Replies[0].Result); err == nil {
			p.stepState = r.Status
		}
	}
}

func (p *moverProc) Step(now time.Duration) bool {
	h := p.h
	progress := p.c.Poll(now)
	wake := p.c.NextDeadline()
	switch p.st {
	case mvIdle:
		active := now < h.o.until-8*time.Millisecond
		if now >= p.next && (active || !p.m.settledFront()) {
			if p.fromView {
				p.plan(now)
			} else {
				p.readDir()
			}
			progress = true
		} else if active || !p.m.settledFront() {
			wake = min(wake, max(p.next, now+100*time.Microsecond))
		}
	case mvDir:
		busy := false
		for _, r := range p.dirR {
			if r.Busy() && !r.Poll(now) {
				busy = true
				wake = min(wake, r.NextDeadline())
			}
		}
		if !busy {
			p.plan(now)
			progress = true
		}
	case mvRead:
		r := p.scan[p.from]
		if r.Poll(now) {
			p.readDone(now)
			progress = true
		} else {
			wake = min(wake, r.NextDeadline())
		}
	case mvCheck:
		r := p.dirR[p.from]
		if r.Poll(now) {
			p.checkDone(now)
			progress = true
		} else {
			wake = min(wake, r.NextDeadline())
		}
	case mvSteps:
		if p.stepDone {
			p.stepDone = false
			if p.stepState != btree.StatusOK {
				// A stale or conflicting step (read from a directory
				// behind the groups): nothing changed; look again.
				p.m.stats.refused++
				p.retry(now)
				return true
			}
			s := p.queue[0]
			p.queue = p.queue[1:]
			if p.m.leadersLeft > 0 && p.env.Rand().IntN(3) == 0 {
				p.crashLeader(now, int(s.g))
			}
			if debugMoves {
				fmt.Printf("%v: mover: %s at group %d acknowledged\n", now, s.what, s.g)
			}
			if s.what == "drop" && p.read {
				p.checkIngested()
			}
			if s.crash {
				p.crash(now)
				return true
			}
			progress = true
		}
		if !p.inflight && p.st == mvSteps {
			if len(p.queue) == 0 {
				p.stepsDone(now)
				progress = true
			} else if p.c.Ready() {
				s := &p.queue[0]
				id, err := p.c.Multicast(tree.Of(tree.Group(s.g)), btree.AppendCtl(nil, &s.ct))
				switch {
				case err == nil:
					p.inflight, p.stepID = true, id
					progress = true
				case !errors.Is(err, multicast.ErrWindowFull):
					h.fail(fmt.Errorf("mover: %s: %v", s.what, err))
				}
			}
		}
	}
	if p.st != mvIdle {
		wake = min(wake, now+20*time.Microsecond)
	}
	p.env.WakeAt(wake)
	return progress
}

// crash crashes the mover in the middle of a move (moveOpts.crashMover).
func (p *moverProc) crash(now time.Duration) {
	h, id := p.h, p.env.ID()
	p.m.stats.crashes++
	if h.o.moves.oldView {
		// What this incarnation knew: the tablets it read, with the
		// move's tablet frozen at its source.
		v := &oldView{tabs: map[uint32][]btree.Tablet{}, dvers: maps.Clone(p.dvers), owns: maps.Clone(p.owns)}
		for g, tbs := range p.tabs {
			v.tabs[g] = cloneTablets(tbs)
			for i := range v.tabs[g] {
				if tb := &v.tabs[g][i]; g == p.from && bytes.Equal(tb.Low, p.tb.Low) && tb.State == btree.TabletServing {
					tb.State, tb.To = btree.TabletFrozen, p.to
				}
			}
		}
		p.m.view = v
	}
	h.s.At(now, func() { h.crashFor(id, 500*time.Microsecond+time.Duration(h.rng.Int64N(int64(1500*time.Microsecond)))) })
}

// crashLeader crashes group g's leader (moveOpts.crashLeaders), if the
// group keeps a majority up.
func (p *moverProc) crashLeader(now time.Duration, g int) {
	h := p.h
	id, ok := h.leaderOf(g)
	if !ok || h.downIn(g) >= (len(h.members[g])-1)/2 {
		return
	}
	p.m.leadersLeft--
	p.m.stats.leaders++
	if debugMoves {
		fmt.Printf("%v: crash group %d's leader %d\n", now, g, id)
	}
	h.s.At(now, func() { h.crashFor(id, time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond)))) })
}

// retry gives the move up for now: the mover reads the directory again
// in a moment (and finds the move where the groups have it).
func (p *moverProc) retry(now time.Duration) {
	p.st, p.queue, p.inflight = mvIdle, nil, false
	p.next = now + 200*time.Microsecond
}

// readDir reads every group's tablets: linearizably, as the product's
// moves do (Client.freshDir), or stale-ok (moveOpts.staleDir).
func (p *moverProc) readDir() {
	p.st = mvDir
	p.m.stats.dirReads++
	h := p.h
	mode := Linearizable
	if h.o.moves.staleDir {
		mode = StaleOK
		for g := range p.dirR {
			p.dirR[g].Close()
			p.dirR[g] = NewOrderedReader(p.env.Node(), uint32(g), h.members[g], h.furthestBehind(g), btree.NewCache(1<<10))
		}
	}
	for _, r := range p.dirR {
		r.BeginDirMode(mode)
	}
}

// plan takes the directory read and picks what to do: finish or abort a
// move under way, activate a tablet whose source dropped it, or start a
// move (before the run's end).
func (p *moverProc) plan(now time.Duration) {
	h, rng := p.h, p.env.Rand()
	if p.fromView {
		p.fromView = false // the tablets are the old incarnation's (oldView)
	} else {
		for g, r := range p.dirR {
			if res, err := r.Result(); err == nil {
				p.tabs[uint32(g)] = slices.Clone(res.Tablets)
				p.dvers[uint32(g)], p.owns[uint32(g)] = res.DirVersion, res.OwnVersion
			}
		}
	}
	if len(p.tabs) < len(h.members) {
		p.retry(now) // some group not read yet
		return
	}
	d, err := btree.NewDirectoryOwned(p.tabs, p.dvers, p.owns)
	if err != nil {
		h.fail(fmt.Errorf("mover: directory: %v", err))
		return
	}
	p.dir = d
	p.queue, p.thenRead, p.thenCheck = nil, false, false
	for _, t := range d.Tablets() {
		if t.State != btree.TabletFrozen {
			continue
		}
		p.tb = btree.Tablet{Low: bytes.Clone(t.Low), High: bytes.Clone(t.High), HighInf: t.HighInf}
		p.from, p.to, p.gen = t.Group, t.To, t.Gen+1
		if rng.IntN(cmp.Or(h.o.moves.abortOneIn, 3)) == 0 {
			ct := btree.Ctl{Cmd: btree.CtlAbort, To: p.to, Gen: p.gen, Tablet: p.tb}
			p.m.stats.aborts++
			if h.o.moves.uncheckedUndo {
				// Planted: the old undo, the target forgets first and
				// nothing checks that the source still holds the
				// tablet.
				p.queue = []mvStep{{g: p.to, ct: ct, what: "abort"}, {g: p.from, ct: ct, what: "abort"}}
				p.st = mvSteps
				return
			}
			// Client.undoMove, step 1: the abort at the source (if it
			// still holds the tablet frozen for this move it serves it
			// again, and a drop of this move sent later is refused).
			// Steps 2 and 3 (checkDone) follow once it is acknowledged.
			p.queue = []mvStep{{g: p.from, ct: ct, what: "abort"}}
			p.thenCheck, p.checks = true, 0
			p.maybeArm()
			if p.crashArm {
				// The mover dies between the undo's steps: the target
				// keeps its installing copy (a leftover).
				p.crashArm, p.queue[0].crash = false, true
			}
		} else {
			p.thenRead = true // MoveTablet again: read, ingest, drop, activate
			p.m.stats.resumes++
		}
		p.st = mvSteps
		return
	}
	for _, t := range d.Moving() {
		// Dropped at its source already: only the activation is left.
		// (MoveTablet activates only a tablet that no group serves: a
		// tablet being installed that another group serves is left of
		// an aborted move.)
		if slices.ContainsFunc(d.Tablets(), func(q btree.Placed) bool { return bytes.Equal(q.Low, t.Low) }) {
			continue
		}
		p.tb = btree.Tablet{Low: bytes.Clone(t.Low), High: bytes.Clone(t.High), HighInf: t.HighInf}
		p.to, p.gen = t.Group, t.Gen
		p.queue = []mvStep{{g: p.to, ct: btree.Ctl{Cmd: btree.CtlActivate, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "activate"}}
		p.m.stats.activations++
		p.st = mvSteps
		return
	}
	if now >= h.o.until-8*time.Millisecond {
		p.st, p.next = mvIdle, now+time.Millisecond
		return
	}
	tbs := d.Tablets()
	if len(tbs) == 0 {
		if debugMoves {
			fmt.Printf("%v: mover: no tablet served: %v\n", now, p.tabs)
		}
		p.retry(now)
		return
	}
	t := tbs[rng.IntN(len(tbs))]
	to := (t.Group + 1 + uint32(rng.IntN(len(h.members)-1))) % uint32(len(h.members))
	p.tb = btree.Tablet{Low: bytes.Clone(t.Low), High: bytes.Clone(t.High), HighInf: t.HighInf}
	p.from, p.to, p.gen = t.Group, to, t.Gen+1
	p.queue = []mvStep{{g: p.from, ct: btree.Ctl{Cmd: btree.CtlFreeze, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "freeze"}}
	p.thenRead = true
	p.m.stats.moves++
	p.maybeArm()
	if p.crashArm && p.env.Rand().IntN(3) == 0 {
		p.crashArm, p.queue[0].crash = false, true
	}
	p.st = mvSteps
}

// maybeArm arms a crash after one of the move's steps (crashMover).
func (p *moverProc) maybeArm() {
	if p.m.crashesLeft > 0 && p.env.Rand().IntN(2) == 0 {
		p.m.crashesLeft--
		p.crashArm = true
	}
}

// stepsDone: the queue is empty.
func (p *moverProc) stepsDone(now time.Duration) {
	if p.thenCheck {
		p.thenCheck = false
		p.beginCheck()
		return
	}
	if p.thenRead {
		p.thenRead = false
		p.pairs, p.lo, p.read = p.pairs[:0], bytes.Clone(p.tb.Low), false
		p.beginRead()
		return
	}
	p.st, p.next = mvIdle, now+p.gap()
}

// checkIngested: once the drop of a move whose pairs this mover read is
// acknowledged, the target's installing tablet of the move (which
// nothing writes until its activation, not sent yet) holds no key but
// those read from the source after the freeze, at the target's most
// advanced live replica. A key more is one the target had before (a
// leftover's, taken in by an ingest: it may have been deleted at the
// source since). (Fewer keys are no error there: after a leader crash
// the live replicas may not have applied every acknowledged ingest yet.)
func (p *moverProc) checkIngested() {
	h := p.h
	var best *kvRepProc
	for _, id := range h.members[p.to] {
		if q := h.procs[id]; q != nil && h.s.Live(id) && (best == nil || q.r.Multicast().Delivered() > best.r.Multicast().Delivered()) {
			best = q
		}
	}
	if best == nil {
		return
	}
	i := slices.IndexFunc(best.store.Tablets(), func(tb btree.Tablet) bool { return bytes.Equal(tb.Low, p.tb.Low) })
	if i < 0 || best.store.Tablets()[i].State != btree.TabletInstalling || best.store.Tablets()[i].Gen != p.gen {
		return // activated or replaced meanwhile (another incarnation's steps)
	}
	var keys []string
	best.store.Tree().Ascend(p.tb.Low, func(k, _ []byte) bool {
		if !p.tb.Contains(k) {
			return false
		}
		keys = append(keys, string(k))
		return true
	})
	for _, k := range keys {
		if !slices.ContainsFunc(p.pairs, func(e btree.KVV) bool { return string(e.Key) == k }) {
			h.fail(fmt.Errorf("moved pairs: group %d's installing %s holds key %q, which group %d did not hold at the freeze (an older installing copy's, taken in by the ingest)", p.to, fmtTablet(best.store.Tablets()[i]), k, p.from))
			return
		}
	}
}

// beginCheck is Client.undoMove's step 2 (Keyspace.servesAgain): a
// linearizable read of the source's tablets (its leader's, its epoch
// confirmed), after the abort there was acknowledged.
func (p *moverProc) beginCheck() {
	p.st = mvCheck
	p.dirR[p.from].BeginDirMode(Linearizable)
}

// checkDone takes the source's tablets: if it serves the tablet again,
// the abort at the target (undoMove's step 3); if it lists nothing of
// the tablet's range, it dropped it (the move got past its drop before
// the abort) and the target's installing copy is the only one: the move
// is finished forward (MoveTablet's activation alone). Anything else (a
// read that failed, the range in another state or cut otherwise) leaves
// the target as it is and looks again.
func (p *moverProc) checkDone(now time.Duration) {
	res, err := p.dirR[p.from].Result()
	if err != nil {
		if p.checks++; p.checks < 20 {
			p.beginCheck() // the product's read retries until its context ends
			return
		}
		p.retry(now)
		return
	}
	serves, held := false, false
	for _, t := range res.Tablets {
		if overlap(t, p.tb) {
			held = true
			serves = serves || t.State == btree.TabletServing && bytes.Equal(t.Low, p.tb.Low) && t.HighInf == p.tb.HighInf && bytes.Equal(t.High, p.tb.High)
		}
	}
	if debugMoves {
		fmt.Printf("%v: mover: undo check at group %d: serves %v, holds %v\n", now, p.from, serves, held)
	}
	switch {
	case serves:
		p.queue = []mvStep{{g: p.to, ct: btree.Ctl{Cmd: btree.CtlAbort, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "abort"}}
		p.m.stats.undone++
	case !held:
		p.queue = []mvStep{{g: p.to, ct: btree.Ctl{Cmd: btree.CtlActivate, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "activate"}}
		p.m.stats.forward++
	default:
		p.retry(now)
		return
	}
	p.st = mvSteps
}

// movePageSim is the most pairs one read of the mover takes (small, so
// that a tablet takes several).
const movePageSim = 5

func (p *moverProc) beginRead() {
	p.st = mvRead
	r := p.scan[p.from]
	r.SetOwnVersion(p.dir.OwnVersion(p.from))
	var hi []byte
	if !p.tb.HighInf {
		hi = p.tb.High
	}
	r.BeginScan(p.lo, hi, movePageSim, Linearizable, false)
}

// readDone takes a page of the frozen tablet; after the last, it queues
// the ingests, the drop and the activation.
func (p *moverProc) readDone(now time.Duration) {
	res, err := p.scan[p.from].Result()
	if err != nil {
		// ErrNotOwner (the group's tablets changed since the directory
		// was read) or a read that gave up: look again.
		p.retry(now)
		return
	}
	for _, kv := range res.Pairs {
		p.pairs = append(p.pairs, btree.KVV{Key: bytes.Clone(kv.Key), Value: bytes.Clone(kv.Value), Version: kv.Version})
	}
	if len(res.Pairs) == movePageSim {
		p.lo = append(bytes.Clone(res.Pairs[len(res.Pairs)-1].Key), 0)
		p.beginRead()
		return
	}
	p.read = true
	room := multicast.MaxPayload(512)
	var ingests []mvStep
	var part []btree.KVV
	flush := func() {
		ingests = append(ingests, mvStep{g: p.to, ct: btree.Ctl{Cmd: btree.CtlIngest, To: p.to, Gen: p.gen, Tablet: p.tb, Entries: part}, what: "ingest"})
		part = nil
	}
	for _, e := range p.pairs {
		// At most 4 pairs a part: tablets take several parts.
		if len(part) > 0 && (len(part) == 4 || btree.CtlSize(p.tb, append(slices.Clip(part), e)) > room) {
			flush()
		}
		part = append(part, e)
	}
	if len(part) > 0 || len(ingests) == 0 {
		flush()
	}
	drop := mvStep{g: p.from, ct: btree.Ctl{Cmd: btree.CtlDrop, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "drop"}
	act := mvStep{g: p.to, ct: btree.Ctl{Cmd: btree.CtlActivate, To: p.to, Gen: p.gen, Tablet: p.tb}, what: "activate"}
	mo := p.h.o.moves
	switch {
	case mo.activateFirst:
		p.queue = append(append(ingests, act), drop)
	case mo.activateEarly && len(ingests) > 1:
		p.queue = append(append(ingests[:1:1], drop, act), ingests[1:]...)
	default:
		p.queue = append(ingests, drop, act)
	}
	if p.crashArm && len(p.queue) > 1 {
		// Crash after one of these steps instead (the first step, the
		// freeze, is acknowledged already).
		p.crashArm = false
		at := p.env.Rand().IntN(len(p.queue) - 1)
		if mo.crashAfterDrop && !mo.activateFirst {
			at = len(p.queue) - 2
		}
		p.queue[at].crash = true
	}
	p.st = mvSteps
}

// The clients' one-sided reads in a moves run: a directory read from
// every group's header region, and lanes of readers (one per group) that
// route by it.

type moveReads struct {
	caches []*btree.Cache
	delegs []*Delegation
	dirR   []*OrderedReader
	// The directory: the tablets last read from each group.
	tabs        map[uint32][]btree.Tablet
	dvers, owns map[uint32]uint64
	dir         *btree.Directory
	dirGen      int  // directories built so far
	dirWant     bool // a lane asked for a new one
	dirBusy     bool
	lanes       []*mvLane
}

// mvLane is one read under way.
type mvLane struct {
	rs       []*OrderedReader // per group
	cur      *OrderedReader
	curG     uint32
	active   bool
	lookup   bool
	stale    bool
	reverse  bool
	key      string
	lo, hi   []byte // the scan's range left (hi nil: no bound)
	limit    int    // pairs still wanted (0: no limit)
	tries    int
	waitGen  int // waiting for a directory newer than this (-1: not waiting)
	waitTill time.Duration
	// The record(s) under way: the lookup's, or the piece's (a stale
	// scan's: one stale get per key of the piece).
	recs       []int
	keys       []string
	op         kvcheck.Op
	plo, phi   []byte
	last       string // the last key a scan yielded
	yielded    bool
	lastPiece  bool
	pieceLimit int
	seen       []uint64
}

func (p *kvCliProc) startMoveReads() *moveReads {
	h := p.h
	m := &moveReads{tabs: map[uint32][]btree.Tablet{}, dvers: map[uint32]uint64{}, owns: map[uint32]uint64{}, dirWant: true}
	for g := range h.members {
		m.caches = append(m.caches, btree.NewCache(1<<16))
		m.delegs = append(m.delegs, NewDelegation())
		m.dirR = append(m.dirR, NewOrderedReader(p.env.Node(), uint32(g), h.members[g], p.slot, btree.NewCache(1<<10)))
	}
	for range h.o.ordReaders {
		l := &mvLane{waitGen: -1, seen: make([]uint64, len(h.members))}
		for g := range h.members {
			r := NewOrderedReader(p.env.Node(), uint32(g), h.members[g], p.slot, m.caches[g])
			r.SetDelegation(m.delegs[g])
			l.rs = append(l.rs, r)
		}
		m.lanes = append(m.lanes, l)
	}
	return m
}

func (m *moveReads) busy() bool {
	if m.dirBusy {
		return true
	}
	for _, l := range m.lanes {
		if l.active {
			return true
		}
	}
	return false
}

func (m *moveReads) nextDeadline() time.Duration {
	d := time.Duration(1<<63 - 1)
	for _, r := range m.dirR {
		if r.Busy() {
			d = min(d, r.NextDeadline())
		}
	}
	for _, l := range m.lanes {
		if l.cur != nil {
			d = min(d, l.cur.NextDeadline())
		}
	}
	return d
}

// issueMoveRead starts a one-sided read on an idle lane.
func (p *kvCliProc) issueMoveRead(now time.Duration, rng *rand.Rand) bool {
	h, m := p.h, p.ord.mv
	var l *mvLane
	for _, x := range m.lanes {
		if !x.active {
			l = x
			break
		}
	}
	if l == nil {
		return false
	}
	key := func() string { return fmt.Sprintf("o%02d", rng.IntN(orderedKeys)) }
	l.active, l.tries, l.waitGen, l.cur = true, 0, -1, nil
	l.stale = rng.IntN(3) == 0
	l.recs, l.keys, l.plo, l.phi, l.yielded = l.recs[:0], l.keys[:0], nil, nil, false
	if rng.IntN(2) == 0 {
		l.lookup, l.key = true, key()
		l.recs = append(l.recs, h.rec.Begin(p.slot, kvcheck.Op{Kind: kvcheck.Get, Key: l.key, Stale: l.stale}))
		h.stats.ordLookups++
	} else {
		l.lookup = false
		l.lo, l.hi = nil, nil
		if rng.IntN(3) > 0 {
			l.lo = []byte(key())
		}
		if rng.IntN(2) == 0 {
			if end := fmt.Sprintf("o%02d", rng.IntN(orderedKeys+1)); end > string(l.lo) {
				l.hi = []byte(end)
			}
		}
		l.limit = 0
		if rng.IntN(3) > 0 {
			l.limit = 1 + rng.IntN(8)
		}
		l.reverse = rng.IntN(2) == 0
		h.stats.ordScans++
	}
	p.advanceLane(l, now)
	return true
}

// pollMoveReads drives the directory read and the lanes.
func (p *kvCliProc) pollMoveReads(now time.Duration) bool {
	m := p.ord.mv
	progress := false
	if m.dirWant && !m.dirBusy {
		m.dirWant, m.dirBusy = false, true
		for _, r := range m.dirR {
			r.BeginDir()
		}
		p.h.mv.stats.dirReads++
	}
	if m.dirBusy {
		busy := false
		for _, r := range m.dirR {
			if r.Busy() && !r.Poll(now) {
				busy = true
			}
		}
		if !busy {
			p.buildDir()
			progress = true
		}
	}
	for _, l := range m.lanes {
		if !l.active {
			continue
		}
		if l.cur != nil {
			if l.cur.Poll(now) {
				p.landLane(l, now)
				progress = true
			}
			continue
		}
		if l.waitGen >= 0 && m.dirGen > l.waitGen && now >= l.waitTill {
			p.advanceLane(l, now)
			progress = true
		}
	}
	return progress
}

// buildDir takes the directory reads that answered.
func (p *kvCliProc) buildDir() {
	h, m := p.h, p.ord.mv
	m.dirBusy = false
	for g, r := range m.dirR {
		if res, err := r.Result(); err == nil {
			m.tabs[uint32(g)] = slices.Clone(res.Tablets)
			m.dvers[uint32(g)], m.owns[uint32(g)] = res.DirVersion, res.OwnVersion
		}
	}
	if len(m.tabs) < len(h.members) {
		m.dirWant = true // some group not read yet: no directory to route by
		return
	}
	d, err := btree.NewDirectoryOwned(m.tabs, m.dvers, m.owns)
	if err != nil {
		h.fail(fmt.Errorf("client %d: directory: %v", p.slot, err))
		return
	}
	m.dir = d
	m.dirGen++
}

// waitDir makes the lane wait for a newer directory.
func (p *kvCliProc) waitDir(l *mvLane, now time.Duration) {
	m := p.ord.mv
	l.cur = nil
	l.tries++
	if l.tries > 200 {
		p.endLane(l, kvcheck.Output{Unknown: true})
		return
	}
	l.waitGen, l.waitTill = m.dirGen, now+50*time.Microsecond
	m.dirWant = true
	p.h.mv.stats.waits++
}

func (p *kvCliProc) endLane(l *mvLane, out kvcheck.Output) {
	for _, id := range l.recs {
		p.h.rec.End(id, out)
	}
	l.recs, l.keys, l.active, l.cur = l.recs[:0], l.keys[:0], false, nil
}

// advanceLane routes the lane's read (its next piece) by the directory.
func (p *kvCliProc) advanceLane(l *mvLane, now time.Duration) {
	h, m := p.h, p.ord.mv
	l.waitGen = -1
	if m.dir == nil {
		p.waitDir(l, now)
		return
	}
	mode := Linearizable
	if l.stale {
		mode = StaleOK
	}
	if l.lookup {
		g, err := m.dir.Route([]byte(l.key))
		if err != nil {
			if errors.Is(err, btree.ErrTabletMoving) {
				h.mv.stats.moving++
			}
			p.waitDir(l, now)
			return
		}
		l.cur, l.curG = l.rs[g], g
		l.cur.SetOwnVersion(m.dir.OwnVersion(g))
		l.cur.BeginLookup([]byte(l.key), mode)
		return
	}
	g, plo, phi, last, err := m.dir.Piece(l.lo, l.hi, l.reverse)
	if err != nil {
		if errors.Is(err, btree.ErrTabletMoving) {
			h.mv.stats.moving++
		}
		p.waitDir(l, now)
		return
	}
	// A piece within one tablet (a run of one group's tablets is cut at
	// their fences): the history's scans then link only the keys of one
	// tablet, which keeps porcupine's partitions small.
	if !l.reverse {
		if i := tabletOf(string(plo)); i < len(moveFences) && (phi == nil || string(phi) > moveFences[i]) {
			phi, last = []byte(moveFences[i]), false
		}
	} else {
		// The tablet of the greatest key below phi.
		top := len(moveFences)
		if phi != nil {
			top = tabletOf(string(phi))
			if top > 0 && string(phi) == moveFences[top-1] {
				top--
			}
		}
		if top > 0 && string(plo) < moveFences[top-1] {
			plo, last = []byte(moveFences[top-1]), false
		}
	}
	if len(l.recs) > 0 && (!bytes.Equal(plo, l.plo) || !bytes.Equal(phi, l.phi)) {
		// The directory changed the piece: the one recorded gave no
		// answer.
		for _, id := range l.recs {
			h.rec.End(id, kvcheck.Output{Unknown: true})
		}
		l.recs, l.keys = l.recs[:0], l.keys[:0]
	}
	if len(l.recs) == 0 {
		l.plo, l.phi, l.pieceLimit = bytes.Clone(plo), bytes.Clone(phi), l.limit
		lo, hi := cmp.Or(string(plo), "o"), cmp.Or(string(phi), "p")
		l.op = kvcheck.Op{Kind: kvcheck.Scan, Key: lo, End: hi, Limit: l.limit, Reverse: l.reverse}
		if l.stale {
			for i := range orderedKeys {
				if k := fmt.Sprintf("o%02d", i); k >= lo && k < hi {
					l.keys = append(l.keys, k)
					l.recs = append(l.recs, h.rec.Begin(p.slot, kvcheck.Op{Kind: kvcheck.Get, Key: k, Stale: true}))
				}
			}
			if len(l.recs) == 0 {
				l.recs = append(l.recs, h.rec.Begin(p.slot, l.op)) // no key: a stale scan of nothing
				l.keys = append(l.keys, "")
			}
		} else {
			l.recs = append(l.recs, h.rec.Begin(p.slot, l.op))
		}
		h.mv.stats.pieces++
	}
	l.lastPiece = last
	l.cur, l.curG = l.rs[g], g
	l.cur.SetOwnVersion(m.dir.OwnVersion(g))
	l.cur.BeginScan(plo, phi, l.limit, mode, l.reverse)
}

// landLane takes a read that ended.
func (p *kvCliProc) landLane(l *mvLane, now time.Duration) {
	h := p.h
	r := l.cur
	res, err := r.Result()
	r.st = osIdle
	l.cur = nil
	h.stats.ordRetries += res.Retries
	h.stats.ordJoined += int(r.Joined - l.seen[l.curG])
	l.seen[l.curG] = r.Joined
	if errors.Is(err, ErrNotOwner) {
		h.mv.stats.notOwner++
		p.waitDir(l, now)
		return
	}
	if err != nil {
		p.endLane(l, kvcheck.Output{Unknown: true})
		return
	}
	g := int(l.curG)
	if l.lookup {
		out := kvcheck.Output{Found: res.Found, Value: string(res.Value), Group: g}
		if l.stale {
			out.Applied = res.Applied
		}
		p.endLane(l, out)
		return
	}
	// Scans complete and in order: the piece's pairs in its range, in
	// order, at most its limit, after what the scan yielded before.
	for i, kv := range res.Pairs {
		k := string(kv.Key)
		bad := ""
		switch {
		case k < string(l.plo) || l.phi != nil && k >= string(l.phi):
			bad = "outside its range"
		case i > 0 && !l.reverse && k <= string(res.Pairs[i-1].Key), i > 0 && l.reverse && k >= string(res.Pairs[i-1].Key):
			bad = "out of order"
		case l.yielded && (!l.reverse && k <= l.last || l.reverse && k >= l.last):
			bad = "out of order with the scan's previous piece"
		}
		if bad != "" {
			h.fail(fmt.Errorf("scan order: client %d: a piece [%q, %q) of group %d (reverse %v) returned %q %s", p.slot, l.plo, l.phi, g, l.reverse, k, bad))
			return
		}
	}
	if l.pieceLimit > 0 && len(res.Pairs) > l.pieceLimit {
		h.fail(fmt.Errorf("scan order: client %d: a piece with limit %d returned %d pairs", p.slot, l.pieceLimit, len(res.Pairs)))
		return
	}
	if n := len(res.Pairs); n > 0 {
		l.last, l.yielded = string(res.Pairs[n-1].Key), true
	}
	if !l.stale {
		out := kvcheck.Output{Group: g}
		for _, kv := range res.Pairs {
			out.Pairs = append(out.Pairs, kvcheck.KV{Key: string(kv.Key), Value: string(kv.Value)})
		}
		h.rec.End(l.recs[0], out)
	} else {
		got := map[string]string{}
		for _, kv := range res.Pairs {
			got[string(kv.Key)] = string(kv.Value)
		}
		full := l.pieceLimit == 0 || len(res.Pairs) < l.pieceLimit
		for i, k := range l.keys {
			covered := full || !l.reverse && k <= l.last || l.reverse && k >= l.last
			if k == "" {
				h.rec.End(l.recs[i], kvcheck.Output{Group: g})
				continue
			}
			if !covered {
				h.rec.End(l.recs[i], kvcheck.Output{Unknown: true})
				continue
			}
			v, ok := got[k]
			h.rec.End(l.recs[i], kvcheck.Output{Found: ok, Value: v, Applied: res.Scanned, Group: g})
		}
	}
	l.recs, l.keys = l.recs[:0], l.keys[:0]
	if l.limit > 0 {
		l.limit -= len(res.Pairs)
	}
	if l.lastPiece || l.limit < 0 || l.pieceLimit > 0 && l.limit == 0 {
		l.active = false
		return
	}
	// The next piece: from the piece's high fence (its low fence, for a
	// reverse scan).
	if l.reverse {
		l.hi = bytes.Clone(l.plo)
	} else {
		l.lo = bytes.Clone(l.phi)
	}
	l.tries = 0
	p.advanceLane(l, now)
}

// kvSimMoveSeeds is TestSimMoves' seeds per case (-seeds N for more).
const kvSimMoveSeeds = 6

var kvSimMoveCases = []struct {
	name string
	o    kvOpts
}{
	{"calm", kvOpts{ops: 100}},
	{"faults", kvOpts{ops: 100, crashes: true, partitions: true, slow: true, clientCrash: true}},
	{"leaders", kvOpts{ops: 100, leaders: 2, isolate: 2, gap: 100 * time.Microsecond}},
	{"mover-crashes", kvOpts{ops: 100, crashes: true, partitions: true, moves: &moveOpts{crashMover: 4}}},
	// step-leaders: the source's or the target's leader crashes right
	// after it acknowledged a step; the mover sends the next one to the
	// group's next leader (and a step whose answer was lost again).
	{"step-leaders", kvOpts{ops: 100, gap: 150 * time.Microsecond, slow: true, moves: &moveOpts{crashLeaders: 6}}},
	// lagging-mover: a follower of every group lags (cut from its
	// group-mates until its leader's log is pruned past it) while the
	// mover, which reads the directory stale-ok from each group's member
	// furthest behind (staleDir), crashes mid-move: a new mover may read
	// a directory behind the groups (-seed 95 lost a tablet to the old
	// undo this way).
	{"lagging-mover", kvOpts{ops: 100, lag: 2, logEntries: 16, moves: &moveOpts{crashMover: 4, staleDir: true}}},
	// old-view: a new mover plans its first step from what its crashed
	// incarnation knew (the move's tablet frozen at its source, though
	// the crash may have come after the drop): its undo must check the
	// source, and finish the move forward if the source dropped it.
	{"old-view", kvOpts{ops: 100, moves: &moveOpts{crashMover: 4, oldView: true}}},
	{"slow-new-leaders", kvOpts{ops: 100, crashAfterCommit: 3, newLeaderStall: true, gap: 100 * time.Microsecond, moves: &moveOpts{crashMover: 2}}},
}

func moveRunOpts(o kvOpts) kvOpts {
	o = orderedRunOpts(o)
	if o.moves == nil {
		o.moves = &moveOpts{}
	} else {
		mo := *o.moves
		o.moves = &mo
	}
	return o
}

// TestSimMoves runs the ordered workload while a mover moves the tablets
// between the groups, under every fault kind, and checks the history
// (porcupine, stale-ok gets), ownership, scans and versions (see the
// comment at the top). A failing seed prints the command that runs it
// alone. Longer: go test -run 'TestSimMoves$' -seeds 200 ./kv
func TestSimMoves(t *testing.T) {
	simNoRace(t)
	def := kvSimMoveSeeds
	if raceEnabled {
		def = 1
	}
	flags := simFlags.WithDefault(def)
	for _, c := range kvSimMoveCases {
		t.Run(c.name, func(t *testing.T) {
			o := moveRunOpts(c.o)
			var st moveStats
			pairs, seeds := 0, 0
			flags.Run(t, func(sd sim.Seed) error {
				h, err := runKV(sd.WithLog(t), o)
				if h != nil && h.mv != nil {
					s := h.mv.stats
					st.moves += s.moves
					st.aborts += s.aborts
					st.resumes += s.resumes
					st.activations += s.activations
					st.refused += s.refused
					st.crashes += s.crashes
					st.leaders += s.leaders
					st.notOwner += s.notOwner
					st.waits += s.waits
					st.moving += s.moving
					st.rerouted += s.rerouted
					st.pieces += s.pieces
					st.undone += s.undone
					st.forward += s.forward
					st.leftovers += s.leftovers
					pairs += h.mv.versionPairs
				}
				seeds++
				if err != nil {
					if h != nil && h.mv != nil {
						err = fmt.Errorf("%w\n%s", err, h.mv.dump())
					}
					return err // sim prints the command that runs the seed alone
				}
				return nil
			})
			t.Logf("%d seeds: %d moves begun, %d resumed and %d aborted by a new mover (%d undone at the target after the check, %d finished forward, %d leftovers hidden after the run), %d activations alone, %d steps refused, %d mover crashes, %d leaders crashed after a step; clients: %d requests sent to another group, %d reads refused by the ownership check, %d waits for the directory (%d on a tablet being installed), %d scan pieces; %d write pairs compared by version",
				seeds, st.moves, st.resumes, st.aborts, st.undone, st.forward, st.leftovers, st.activations, st.refused, st.crashes, st.leaders, st.rerouted, st.notOwner, st.waits, st.moving, st.pieces, pairs)
			if st.moves == 0 || st.rerouted == 0 || st.pieces == 0 || pairs == 0 {
				t.Errorf("the case tested nothing: %+v, %d version pairs", st, pairs)
			}
			if o.moves.crashMover > 0 && st.crashes == 0 {
				t.Errorf("the mover never crashed")
			}
			if o.moves.crashLeaders > 0 && st.leaders == 0 {
				t.Errorf("no leader crashed after a step")
			}
			if o.moves.oldView && seeds >= kvSimMoveSeeds && st.undone == 0 {
				t.Errorf("no undo got past its check of the source")
			}
		})
	}
}

// TestSimMovesMutants plants each bug of a move, in the mover (its steps
// in a wrong order) or in the stores, and requires the check aimed at it
// to catch it within 20 seeds:
//   - write-during-move (stores): a frozen tablet takes writes, which
//     the mover read before: acknowledged writes lost at the target
//     (linearizability);
//   - no-version-floor (stores): an ingest does not raise the target's
//     version offset, so a write at the target gets a version below the
//     key's version at the source (versions);
//   - drop-keeps-keys (stores): a drop leaves the tablet's keys in the
//     tree (ownership: a replica holds keys of no tablet of its);
//   - gc-keeps-range (stores): a tablet that comes back over its own
//     garbage leaves its range in the garbage, whose later steps delete
//     the keys it took back in (ownership, Store.CheckKeys: a garbage
//     range overlaps a tablet, or a tablet holds fewer keys than counted);
//   - no-own-bump (stores): drops and activations keep the ownership
//     version, so a one-sided reader with an old directory reads the
//     group the tablet left (linearizability, or the stale-ok check);
//   - activate-first (mover): the target serves the tablet before the
//     source dropped it (ownership: served by two groups at once);
//   - activate-early (mover): the target serves the tablet before its
//     last ingest, which it then refuses as sent again: the pairs of the
//     later parts are lost (linearizability);
//   - unchecked-undo (mover): the old undo, the abort at the target
//     first and nothing checking that the source still holds the
//     tablet, from a view where it is frozen though the source dropped
//     it: the target's copy, the only one, is gone (ownership: the keys
//     are held by no group);
//   - ingest-over-leftover (stores): an abort at the source leaves the
//     tablet's generation, so an installing copy left at the target by
//     an undo cut short after its first step (the mover crashed) is not
//     hidden by the source's tablet, and the next move to that target
//     with the same generation takes its pairs in over it (moved pairs:
//     the target holds a key the source did not; ownership: a leftover
//     not hidden after the run; or linearizability, a key deleted
//     meanwhile back).
func TestSimMovesMutants(t *testing.T) {
	simNoRace(t)
	for _, m := range []struct {
		name string
		mo   moveOpts
		base kvOpts
		want []string
	}{
		{"write-during-move", moveOpts{store: "write-during-move"}, kvOpts{ops: 100}, []string{"linearizability"}},
		{"no-version-floor", moveOpts{store: "no-version-floor"}, kvOpts{ops: 100}, []string{"versions:"}},
		{"drop-keeps-keys", moveOpts{store: "drop-keeps-keys"}, kvOpts{ops: 100}, []string{"in none of its tablets"}},
		{"no-own-bump", moveOpts{store: "no-own-bump"}, kvOpts{ops: 100}, []string{"linearizability", "stale-ok gets"}},
		{"gc-keeps-range", moveOpts{store: "gc-keeps-range"}, kvOpts{ops: 100}, []string{"overlap", "tablet count"}},
		{"activate-first", moveOpts{activateFirst: true}, kvOpts{ops: 100}, []string{"served by two groups at once"}},
		{"activate-early", moveOpts{activateEarly: true}, kvOpts{ops: 100}, []string{"linearizability"}},
		{"unchecked-undo", moveOpts{uncheckedUndo: true, oldView: true, crashMover: 8, abortOneIn: 1, crashAfterDrop: true}, kvOpts{ops: 100}, []string{"ownership: the keys from"}},
		{"ingest-over-leftover", moveOpts{store: "ingest-over-leftover", crashMover: 8, abortOneIn: 1}, kvOpts{ops: 100}, []string{"moved pairs:", "ownership:", "linearizability"}},
	} {
		t.Run(m.name, func(t *testing.T) {
			b := m.base
			b.moves = &m.mo
			catchMutant(t, moveRunOpts(b), m.want)
		})
	}
}
