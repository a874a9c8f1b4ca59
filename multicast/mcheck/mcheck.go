// Package mcheck checks atomic multicast histories recorded in simulator
// runs and real-process tests of TRAM against the properties of the paper
// (TRAM, section 2.2; the proofs are in section 6): validity, uniform
// agreement, uniform integrity, uniform prefix order and uniform acyclic
// order, plus what the implementation promises beyond them (every message
// takes exactly one slot of each destination group's sequence, replicas of
// one group agree slot by slot, clients' replies match the deliveries).
//
// # Model
//
// Groups are numbered 0..groups-1 (at most 64: a destination set is a
// bitmask). Inside a group every delivery has a group-level index 1, 2, 3,
// ...: the group's sequence. A message that passes through a group that is
// not one of its destinations is not delivered there and takes no index.
// Replicas report each delivery with its index; a replica that restarted
// with empty memory (a new incarnation) or caught up by a snapshot
// continues at a later index, so a replica's indices need only increase
// strictly within one incarnation. Restore reports such a snapshot
// explicitly; it is optional (the first delivery of an incarnation may start
// anywhere) but lets a replica that restored and then delivered nothing
// count as caught up.
//
// # Use
//
//	c := mcheck.New(groups)
//	c.Multicast(id, dst)                       // client, before sending
//	c.Deliver(g, replica, inc, index, id, res) // replica, at each delivery
//	c.Restore(g, replica, inc, index)          // replica, optional
//	c.Reply(id, g, index, res)                 // client, per reply
//	...
//	err := c.Final(mcheck.FinalOptions{Live: live}) // faults healed, converged
//
// Deliver and Reply return a *Violation at once when the record contradicts
// what is already known; every violation is also kept, so a recorder that
// ignores the returned errors (a replica's goroutine) loses nothing: Final
// returns all of them with its own checks. A Checker is safe for concurrent
// use. Errors that are not *Violation are misuse by the test (a group out of
// range, index 0, a message multicast twice with different destinations).
//
// # Cost
//
// Deliver and Reply are O(|dst|) amortized; Final is O(deliveries x
// average |dst|) time and O(deliveries) memory, fine for 10^6 deliveries.
package mcheck

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"
)

// MsgID identifies an a-multicast message: a client and its sequence number.
type MsgID struct{ Client, Seq uint64 }

// String formats id as "c<client>#<seq>".
func (id MsgID) String() string { return fmt.Sprintf("c%d#%d", id.Client, id.Seq) }

// Property names a checked property; Violation.Error starts with it.
type Property string

const (
	// Validity (paper 2.2): a message of a correct client (FinalOptions.
	// Completed) is delivered in every destination group.
	Validity Property = "Validity"
	// UniformAgreement (paper 2.2): every live replica of a group delivered
	// (or restored a snapshot through) every index of the group's sequence,
	// and the sequence has no index that no replica reported.
	UniformAgreement Property = "UniformAgreement"
	// UniformIntegrity (paper 2.2): a replica delivers a message only if it
	// was multicast and the replica's group is a destination, and at most
	// once (a replica's indices increase strictly within an incarnation).
	UniformIntegrity Property = "UniformIntegrity"
	// UniformPrefixOrder (paper 2.2): two messages delivered in two common
	// groups are delivered in the same relative order in both.
	UniformPrefixOrder Property = "UniformPrefixOrder"
	// AcyclicOrder (paper 2.2, uniform acyclic order): the delivered-before
	// relation over all groups has no cycle.
	AcyclicOrder Property = "AcyclicOrder"
	// ExactlyOnce: a message takes at most one index of a group's sequence
	// (a retried client message ordered twice, say).
	ExactlyOnce Property = "ExactlyOnce"
	// Replies: every completed message has one reply per destination group,
	// with that group's delivery index and result; no reply names a
	// delivery that did not happen.
	Replies Property = "Replies"
	// GroupOrder: replicas of one group disagree at an index, on the message
	// or on the result of delivering it.
	GroupOrder Property = "GroupOrder"
)

// Violation is one property violation found in a history.
type Violation struct {
	Property Property
	Detail   string
}

func (v *Violation) Error() string { return string(v.Property) + ": " + v.Detail }

func violation(p Property, format string, args ...any) *Violation {
	return &Violation{Property: p, Detail: fmt.Sprintf(format, args...)}
}

// maxKept bounds the violations and misuse errors a Checker keeps (counts
// are kept for all): a systematic bug in a run of 10^6 deliveries must not
// make the checker the memory problem.
const maxKept = 1000

// maxIndexJump bounds how far past a group's known sequence an index may
// point: the sequence is a slice indexed by it, and a garbage index must be
// reported, not allocated.
const maxIndexJump = 1 << 26

// place is a message's (first) index in one group's sequence.
type place struct {
	g   uint32
	idx uint64
}

// reply is the first reply a client recorded from one group.
type reply struct {
	g   uint32
	idx uint64
	res []byte
}

type msgState struct {
	id        MsgID
	dst       uint64
	multicast bool
	at        []place // first index in each group that delivered it
	replies   []reply
}

func (m *msgState) placeIn(g uint32) (uint64, bool) {
	for _, p := range m.at {
		if p.g == g {
			return p.idx, true
		}
	}
	return 0, false
}

func (m *msgState) replyFrom(g uint32) *reply {
	for i := range m.replies {
		if m.replies[i].g == g {
			return &m.replies[i]
		}
	}
	return nil
}

// slot is one index of a group's sequence, as first reported.
type slot struct {
	msg int32 // index into Checker.msgs; -1: no replica reported the index
	res []byte
	rep uint32
	inc int
}

type groupState struct {
	seq     []slot
	covered uint64 // highest index a Restore reported
}

type incState struct {
	inc  int
	last uint64 // highest index delivered or restored
	n    uint64 // deliveries reported
}

type replicaState struct{ incs []incState }

func (r *replicaState) get(inc int) *incState {
	for i := len(r.incs) - 1; i >= 0; i-- {
		if r.incs[i].inc == inc {
			return &r.incs[i]
		}
	}
	r.incs = append(r.incs, incState{inc: inc})
	return &r.incs[len(r.incs)-1]
}

// latest is the state of the highest incarnation reported.
func (r *replicaState) latest() *incState {
	var best *incState
	for i := range r.incs {
		if best == nil || r.incs[i].inc > best.inc {
			best = &r.incs[i]
		}
	}
	return best
}

type replicaKey struct{ g, r uint32 }

// Checker records one run's history and checks it. The zero value is not
// usable; call New.
type Checker struct {
	mu       sync.Mutex
	groups   int
	msgs     []*msgState
	byID     map[MsgID]int32
	grp      []groupState
	replicas map[replicaKey]*replicaState

	multicasts int
	deliveries int
	nreplies   int

	// immediate holds violations found while recording, final those of the
	// last Final; counts covers both (final ones replaced on each Final).
	immediate   []*Violation
	final       []*Violation
	nImmediate  map[Property]int
	nFinal      map[Property]int
	misuse      []error
	misuseCount int
}

// New returns a Checker for groups groups (numbered 0..groups-1, at most 64).
func New(groups int) *Checker {
	if groups < 1 || groups > 64 {
		panic(fmt.Sprintf("mcheck: %d groups; want 1..64", groups))
	}
	return &Checker{
		groups:     groups,
		byID:       make(map[MsgID]int32),
		grp:        make([]groupState, groups),
		replicas:   make(map[replicaKey]*replicaState),
		nImmediate: make(map[Property]int),
		nFinal:     make(map[Property]int),
	}
}

func (c *Checker) msg(id MsgID) (int32, *msgState) {
	if i, ok := c.byID[id]; ok {
		return i, c.msgs[i]
	}
	i := int32(len(c.msgs))
	m := &msgState{id: id}
	c.msgs = append(c.msgs, m)
	c.byID[id] = i
	return i, m
}

func (c *Checker) misused(format string, args ...any) error {
	err := fmt.Errorf("mcheck: "+format, args...)
	c.misuseCount++
	if len(c.misuse) < maxKept {
		c.misuse = append(c.misuse, err)
	}
	return err
}

// record keeps v and returns it (as an error, nil if v is nil).
func (c *Checker) record(v *Violation) error {
	if v == nil {
		return nil
	}
	c.nImmediate[v.Property]++
	if len(c.immediate) < maxKept {
		c.immediate = append(c.immediate, v)
	}
	return v
}

// Multicast records that a client a-multicast id to the groups in dst.
// Recording it again with the same dst (a retry) is fine; a different dst,
// an empty dst or a group out of range is misuse: the error is returned and
// also reported by Final.
func (c *Checker) Multicast(id MsgID, dst uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dst == 0 || (c.groups < 64 && dst>>uint(c.groups) != 0) {
		return c.misused("multicast %v to %#x: destinations must be a non-empty subset of groups 0..%d", id, dst, c.groups-1)
	}
	_, m := c.msg(id)
	if m.multicast {
		if m.dst != dst {
			return c.misused("multicast %v to %s, earlier to %s", id, groupSet(dst), groupSet(m.dst))
		}
		return nil
	}
	m.multicast, m.dst = true, dst
	c.multicasts++
	var errs []error
	// A delivery or reply recorded before the multicast (recorders racing)
	// is checked now.
	for _, p := range m.at {
		if dst&(1<<p.g) == 0 {
			errs = append(errs, c.record(violation(UniformIntegrity,
				"%v delivered in group %d at index %d, not a destination of %s", id, p.g, p.idx, groupSet(dst))))
		}
	}
	for _, r := range m.replies {
		if dst&(1<<r.g) == 0 {
			errs = append(errs, c.record(violation(Replies,
				"%v: reply from group %d (index %d), not a destination of %s", id, r.g, r.idx, groupSet(dst))))
		}
	}
	return joinErrs(errs)
}

// Deliver records that replica of group g, in its incarnation, delivered id
// at index of g's sequence with the given result (compared byte for byte;
// nil equals empty). It returns a *Violation at once when the delivery
// contradicts what is known (several, joined, if more than one applies):
//   - GroupOrder: another message, or the same message with another result,
//     was reported at (g, index);
//   - ExactlyOnce: id already took another index of g's sequence;
//   - UniformIntegrity: g is not one of id's destinations, or index does
//     not exceed the replica incarnation's last delivered (or restored)
//     index.
//
// A delivery of a message not (yet) multicast is not reported at once,
// since recorders may race: Multicast checks it if recorded later, Final
// reports it as UniformIntegrity if never.
//
// The delivery is recorded even when it violates a property, so that one
// fault yields one violation. result is copied.
func (c *Checker) Deliver(g uint32, replica uint32, incarnation int, index uint64, id MsgID, result []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(g) >= c.groups {
		return c.misused("delivery of %v in group %d: only %d groups", id, g, c.groups)
	}
	if index == 0 {
		return c.misused("delivery of %v in group %d at index 0: indices start at 1", id, g)
	}
	gs := &c.grp[g]
	if index > uint64(len(gs.seq))+maxIndexJump {
		return c.misused("delivery of %v in group %d at index %d: %d past the known sequence", id, g, index, index-uint64(len(gs.seq)))
	}
	c.deliveries++
	var errs []error
	rs := c.replicas[replicaKey{g, replica}]
	if rs == nil {
		rs = &replicaState{}
		c.replicas[replicaKey{g, replica}] = rs
	}
	in := rs.get(incarnation)
	if index <= in.last {
		errs = append(errs, c.record(violation(UniformIntegrity,
			"group %d replica %d incarnation %d delivered %v at index %d after reaching index %d (delivered again or out of order)",
			g, replica, incarnation, id, index, in.last)))
	}
	in.n++
	in.last = max(in.last, index)

	mi, m := c.msg(id)
	switch {
	case !m.multicast:
		// Checked again by Multicast if it is recorded late; at Final if never.
	case m.dst&(1<<g) == 0:
		errs = append(errs, c.record(violation(UniformIntegrity,
			"%v delivered in group %d (replica %d) at index %d, not a destination of %s", id, g, replica, index, groupSet(m.dst))))
	}

	for uint64(len(gs.seq)) < index {
		gs.seq = append(gs.seq, slot{msg: -1})
	}
	s := &gs.seq[index-1]
	if s.msg >= 0 {
		if s.msg != mi {
			errs = append(errs, c.record(violation(GroupOrder,
				"group %d index %d: replica %d (incarnation %d) delivered %v, replica %d (incarnation %d) delivered %v",
				g, index, replica, incarnation, id, s.rep, s.inc, c.msgs[s.msg].id)))
		} else if !bytes.Equal(s.res, result) {
			errs = append(errs, c.record(violation(GroupOrder,
				"group %d index %d (%v): replica %d (incarnation %d) got result %q, replica %d (incarnation %d) got %q",
				g, index, id, replica, incarnation, clip(result), s.rep, s.inc, clip(s.res))))
		}
		return joinErrs(errs)
	}
	*s = slot{msg: mi, res: clone(result), rep: replica, inc: incarnation}
	if prev, ok := m.placeIn(g); ok {
		errs = append(errs, c.record(violation(ExactlyOnce,
			"%v delivered in group %d at index %d and at index %d", id, g, prev, index)))
		return joinErrs(errs)
	}
	m.at = append(m.at, place{g, index})
	if r := m.replyFrom(g); r != nil {
		errs = append(errs, c.record(c.checkReply(m, r)))
	}
	return joinErrs(errs)
}

// Restore records that replica of group g, in its incarnation, restored a
// snapshot covering g's sequence through index (0: an empty snapshot): its
// later deliveries in that incarnation must be past index, and it counts as
// having delivered 1..index for uniform agreement. A snapshot behind what
// the incarnation already delivered is a UniformIntegrity violation (its
// deliveries after it would repeat earlier ones).
func (c *Checker) Restore(g uint32, replica uint32, incarnation int, index uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(g) >= c.groups {
		return c.misused("restore in group %d: only %d groups", g, c.groups)
	}
	gs := &c.grp[g]
	if index > uint64(len(gs.seq))+maxIndexJump {
		return c.misused("restore in group %d through index %d: %d past the known sequence", g, index, index-uint64(len(gs.seq)))
	}
	rs := c.replicas[replicaKey{g, replica}]
	if rs == nil {
		rs = &replicaState{}
		c.replicas[replicaKey{g, replica}] = rs
	}
	in := rs.get(incarnation)
	var err error
	if index < in.last {
		err = c.record(violation(UniformIntegrity,
			"group %d replica %d incarnation %d restored a snapshot through index %d after reaching index %d",
			g, replica, incarnation, index, in.last))
	}
	in.last = max(in.last, index)
	gs.covered = max(gs.covered, index)
	return err
}

// Reply records that id's client got group g's reply: delivered at index
// with result. It must match g's delivery of id: at once if that is known,
// else when it becomes known or at Final. A second reply from g (a retry)
// must match the first. Returns a *Violation (Replies) on a mismatch.
func (c *Checker) Reply(id MsgID, g uint32, index uint64, result []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(g) >= c.groups {
		return c.misused("reply for %v from group %d: only %d groups", id, g, c.groups)
	}
	c.nreplies++
	_, m := c.msg(id)
	if r := m.replyFrom(g); r != nil {
		if r.idx != index || !bytes.Equal(r.res, result) {
			return c.record(violation(Replies,
				"%v: group %d replied index %d result %q, earlier index %d result %q",
				id, g, index, clip(result), r.idx, clip(r.res)))
		}
		return nil
	}
	m.replies = append(m.replies, reply{g: g, idx: index, res: clone(result)})
	r := &m.replies[len(m.replies)-1]
	if m.multicast && m.dst&(1<<g) == 0 {
		return c.record(violation(Replies,
			"%v: reply from group %d (index %d), not a destination of %s", id, g, index, groupSet(m.dst)))
	}
	if _, ok := m.placeIn(g); ok {
		return c.record(c.checkReply(m, r))
	}
	return nil
}

// checkReply compares r with m's delivery in r.g, which is known.
func (c *Checker) checkReply(m *msgState, r *reply) *Violation {
	idx, _ := m.placeIn(r.g)
	if r.idx != idx {
		return violation(Replies, "%v: group %d replied index %d, delivered it at index %d", m.id, r.g, r.idx, idx)
	}
	s := &c.grp[r.g].seq[idx-1]
	if !bytes.Equal(r.res, s.res) {
		return violation(Replies, "%v: group %d replied result %q, delivered it (index %d) with result %q",
			m.id, r.g, clip(r.res), idx, clip(s.res))
	}
	return nil
}

// FinalOptions describes the end of a run.
type FinalOptions struct {
	// Live maps each group to its replicas that are up at the end and must
	// have delivered (or restored) the group's whole sequence. Groups not in
	// the map are not checked for agreement.
	Live map[uint32][]uint32
	// Completed reports the messages whose client is correct: they must be
	// delivered in every destination group and have every reply. nil: all
	// multicast messages. It is called with the Checker locked and must not
	// call the Checker.
	Completed func(MsgID) bool
}

// Final checks the whole history at the end of a run, after faults healed
// and the system converged: Validity, UniformAgreement, UniformPrefixOrder,
// AcyclicOrder, Replies, and what Deliver could not decide alone (messages
// delivered but never multicast). It returns nil, or an error that joins
// the misuse errors and the violations (errors.As finds the first
// *Violation); Violations lists them all. Calling Final again rechecks.
func (c *Checker) Final(opts FinalOptions) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := finalRun{c: c, counts: make(map[Property]int)}
	f.integrity()
	f.agreement(opts.Live)
	f.validityAndReplies(opts.Completed)
	f.prefixOrder()
	f.acyclic()
	c.final, c.nFinal = f.vs, f.counts

	var errs []error
	errs = append(errs, c.misuse...)
	errs = append(errs, f.errs...)
	if c.misuseCount > len(c.misuse) {
		errs = append(errs, fmt.Errorf("mcheck: %d more misuse errors", c.misuseCount-len(c.misuse)))
	}
	all := c.violations()
	const shown = 20
	for i, v := range all {
		if i == shown {
			break
		}
		errs = append(errs, v)
	}
	if n := c.violationCount() - min(len(all), shown); n > 0 {
		errs = append(errs, fmt.Errorf("mcheck: %d more violations (Checker.Violations lists up to %d found while recording and %d found by Final)", n, maxKept, maxKept))
	}
	return joinErrs(errs)
}

func (c *Checker) violations() []*Violation {
	out := make([]*Violation, 0, len(c.immediate)+len(c.final))
	out = append(out, c.immediate...)
	return append(out, c.final...)
}

func (c *Checker) violationCount() int {
	n := 0
	for _, k := range c.nImmediate {
		n += k
	}
	for _, k := range c.nFinal {
		n += k
	}
	return n
}

// Violations returns the violations found so far: those found while
// recording and those of the last Final, at most 1000 of each.
func (c *Checker) Violations() []*Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violations()
}

// Stats summarizes a recorded history.
type Stats struct {
	Messages   int              // distinct messages multicast
	Deliveries int              // Deliver calls (one per replica delivery)
	Replies    int              // Reply calls
	GroupLen   []uint64         // per group: the highest index known
	Violations map[Property]int // violations found so far, by property
	Misuse     int              // misuse errors
}

// Stats returns counts of what was recorded and found.
func (c *Checker) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{
		Messages:   c.multicasts,
		Deliveries: c.deliveries,
		Replies:    c.nreplies,
		GroupLen:   make([]uint64, c.groups),
		Violations: make(map[Property]int),
		Misuse:     c.misuseCount,
	}
	for g := range c.grp {
		s.GroupLen[g] = c.grp[g].length()
	}
	for p, n := range c.nImmediate {
		s.Violations[p] += n
	}
	for p, n := range c.nFinal {
		s.Violations[p] += n
	}
	return s
}

// length is the group's sequence length: the highest index reported by a
// delivery or a restore.
func (gs *groupState) length() uint64 { return max(uint64(len(gs.seq)), gs.covered) }

// finalRun is one Final's checks.
type finalRun struct {
	c      *Checker
	vs     []*Violation
	counts map[Property]int
	errs   []error // misuse found by Final (its options)
}

func (f *finalRun) add(v *Violation) {
	f.counts[v.Property]++
	if len(f.vs) < maxKept {
		f.vs = append(f.vs, v)
	}
}

// integrity reports deliveries of messages never multicast.
func (f *finalRun) integrity() {
	for _, m := range f.c.msgs {
		if m.multicast {
			continue
		}
		for _, p := range m.at {
			f.add(violation(UniformIntegrity, "%v delivered in group %d at index %d but never multicast", m.id, p.g, p.idx))
		}
		for _, r := range m.replies {
			f.add(violation(Replies, "%v: reply from group %d (index %d) but never multicast", m.id, r.g, r.idx))
		}
	}
}

// agreement checks that each group's sequence has no hole and that every
// live replica reached its end.
func (f *finalRun) agreement(live map[uint32][]uint32) {
	c := f.c
	for g := range c.grp {
		gs := &c.grp[g]
		holes, first := 0, uint64(0)
		for i := range gs.seq {
			if gs.seq[i].msg < 0 {
				if holes == 0 {
					first = uint64(i) + 1
				}
				holes++
			}
		}
		if n := gs.length() - uint64(len(gs.seq)); n > 0 {
			if holes == 0 {
				first = uint64(len(gs.seq)) + 1
			}
			holes += int(n)
		}
		if holes > 0 {
			f.add(violation(UniformAgreement,
				"group %d: %d of indices 1..%d delivered by no replica that reported it (first: %d)", g, holes, gs.length(), first))
		}
	}
	groups := make([]uint32, 0, len(live))
	for g := range live {
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i] < groups[j] })
	for _, g := range groups {
		if int(g) >= c.groups {
			f.errs = append(f.errs, fmt.Errorf("mcheck: FinalOptions.Live names group %d: only %d groups", g, c.groups))
			continue
		}
		n := c.grp[g].length()
		for _, r := range live[g] {
			var reached uint64
			inc := 0
			if rs := c.replicas[replicaKey{g, r}]; rs != nil {
				in := rs.latest()
				reached, inc = in.last, in.inc
			}
			if reached != n {
				f.add(violation(UniformAgreement,
					"group %d replica %d is live but its incarnation %d reached index %d of %d", g, r, inc, reached, n))
			}
		}
	}
}

// validityAndReplies checks that each completed message was delivered in
// each destination and got each reply, and that no reply names a delivery
// that never happened.
func (f *finalRun) validityAndReplies(completed func(MsgID) bool) {
	for _, m := range f.c.msgs {
		for _, r := range m.replies {
			if _, ok := m.placeIn(r.g); !ok && m.multicast && m.dst&(1<<r.g) != 0 {
				f.add(violation(Replies, "%v: group %d replied index %d, never delivered it", m.id, r.g, r.idx))
			}
		}
		if !m.multicast || (completed != nil && !completed(m.id)) {
			continue
		}
		var missing, noReply uint64
		for d := m.dst; d != 0; d &= d - 1 {
			g := uint32(bits.TrailingZeros64(d))
			if _, ok := m.placeIn(g); !ok {
				missing |= 1 << g
			} else if m.replyFrom(g) == nil {
				noReply |= 1 << g
			}
		}
		if missing != 0 {
			f.add(violation(Validity, "%v (to %s) never delivered in %s", m.id, groupSet(m.dst), groupSet(missing)))
		}
		if noReply != 0 {
			f.add(violation(Replies, "%v (to %s): no reply from %s", m.id, groupSet(m.dst), groupSet(noReply)))
		}
	}
}

// first reports whether slot i (0-based) of group g holds the first index
// its message took in g: later ones are duplicates, already reported as
// ExactlyOnce, and are left out of the order checks.
func (f *finalRun) first(g uint32, i int) (int32, bool) {
	s := f.c.grp[g].seq[i]
	if s.msg < 0 {
		return -1, false
	}
	idx, ok := f.c.msgs[s.msg].placeIn(g)
	return s.msg, ok && idx == uint64(i)+1
}

// prefixOrder checks each pair of groups g < h: the messages of g's
// sequence that h delivered too must appear in h in increasing order. One
// scan of g's sequence keeps, per h, the highest h-index seen so far: a
// message with a lower h-index is ordered after it in g but before it in h.
func (f *finalRun) prefixOrder() {
	c := f.c
	lastIdx := make([]uint64, c.groups)
	lastMsg := make([]int32, c.groups)
	for g := range c.grp {
		clear(lastIdx)
		var reported uint64
		for i := range c.grp[g].seq {
			mi, ok := f.first(uint32(g), i)
			if !ok {
				continue
			}
			m := c.msgs[mi]
			for _, p := range m.at {
				h := p.g
				if int(h) <= g {
					continue
				}
				if p.idx < lastIdx[h] && reported&(1<<h) == 0 {
					reported |= 1 << h
					prev := c.msgs[lastMsg[h]]
					pi, _ := prev.placeIn(uint32(g))
					f.add(violation(UniformPrefixOrder,
						"groups %d and %d order %v and %v differently: group %d delivered %v at %d and %v at %d, group %d delivered %v at %d and %v at %d",
						g, h, prev.id, m.id, g, prev.id, pi, m.id, i+1, h, m.id, p.idx, prev.id, lastIdx[h]))
				}
				if p.idx > lastIdx[h] {
					lastIdx[h], lastMsg[h] = p.idx, mi
				}
			}
		}
	}
}

// acyclic builds the delivered-before relation (an edge from each message
// to the next one of each group's sequence, across holes) and looks for a
// cycle with an iterative depth-first search; it reports the first found.
func (f *finalRun) acyclic() {
	c := f.c
	n := len(c.msgs)
	start := make([]int32, n+1) // CSR: node u's edges are [start[u], start[u+1])
	forEachEdge := func(fn func(u, v int32, g uint32)) {
		for g := range c.grp {
			prev := int32(-1)
			for i := range c.grp[g].seq {
				mi, ok := f.first(uint32(g), i)
				if !ok {
					continue
				}
				if prev >= 0 {
					fn(prev, mi, uint32(g))
				}
				prev = mi
			}
		}
	}
	forEachEdge(func(u, _ int32, _ uint32) { start[u+1]++ })
	for u := 0; u < n; u++ {
		start[u+1] += start[u]
	}
	to := make([]int32, start[n])
	via := make([]uint32, start[n])
	fill := append([]int32(nil), start[:n]...)
	forEachEdge(func(u, v int32, g uint32) {
		to[fill[u]], via[fill[u]] = v, g
		fill[u]++
	})

	const (
		white = iota
		gray
		black
	)
	color := make([]uint8, n)
	pos := make([]int32, n)
	type frame struct{ node, next int32 }
	var stack []frame
	for s := int32(0); int(s) < n; s++ {
		if color[s] != white || start[s] == start[s+1] {
			continue
		}
		color[s], pos[s] = gray, 0
		stack = append(stack[:0], frame{s, start[s]})
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next == start[top.node+1] {
				color[top.node] = black
				stack = stack[:len(stack)-1]
				continue
			}
			e := top.next
			top.next++
			v := to[e]
			switch color[v] {
			case white:
				color[v], pos[v] = gray, int32(len(stack))
				stack = append(stack, frame{v, start[v]})
			case gray:
				// The cycle is the stack from v to the top, each frame left
				// by the edge before its cursor, closed by e.
				cyc := stack[pos[v]:]
				var b strings.Builder
				const maxShown = 16
				for k, fr := range cyc {
					if len(cyc) > maxShown && k >= maxShown-1 && k < len(cyc)-1 {
						if k == maxShown-1 {
							fmt.Fprintf(&b, "... (%d more) ... ", len(cyc)-maxShown)
						}
						continue
					}
					fmt.Fprintf(&b, "%v -(g%d)-> ", c.msgs[fr.node].id, via[fr.next-1])
				}
				b.WriteString(c.msgs[v].id.String())
				f.add(violation(AcyclicOrder, "delivered-before cycle of %d messages: %s", len(cyc), b.String()))
				return
			}
		}
	}
}

// groupSet formats a destination bitmask as "{0,2,5}".
func groupSet(d uint64) string {
	var b strings.Builder
	b.WriteByte('{')
	for first := true; d != 0; d &= d - 1 {
		if !first {
			b.WriteByte(',')
		}
		first = false
		fmt.Fprintf(&b, "%d", bits.TrailingZeros64(d))
	}
	b.WriteByte('}')
	return b.String()
}

// joinErrs returns nil, the only non-nil error of errs (a *Violation stays
// one), or all of them joined.
func joinErrs(errs []error) error {
	var one error
	n := 0
	for _, err := range errs {
		if err != nil {
			one = err
			n++
		}
	}
	if n <= 1 {
		return one
	}
	return errors.Join(errs...)
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// clip shortens a result for a Detail.
func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}
