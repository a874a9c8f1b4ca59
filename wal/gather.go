package wal

import "math/bits"

// The gather (Config.GatherWindow): in Sync mode a batch of a Mux's log
// may wait a little before it starts, so that one fsync covers the
// records a group's commit needs.
//
// A commit needs a majority of its group's replicas to have the entry on
// disk. When several replicas of one group share this log (one process
// hosting them: kvserver's embedded cluster), the leader's record is
// appended first and its followers' a poller pass later at most (they
// read the leader's ring in their next Poll). A batch started by the
// leader's record alone is synced alone, and the followers' records then
// wait for it and for a fsync of their own: two fsyncs in series per
// commit. So a batch whose first eager record came while no batch was in
// flight waits, for every group with an eager record in it, for the
// group's other streams in this log: each until it appended an eager
// record to the batch, or until it was polled twice (a replica polls its
// log at the start and at the end of each Poll: twice is one whole Poll
// of it after the group's first record, in which a follower reads the
// leader's ring and accepts) without one. This needs no clock: at one
// writer the leader's and both followers' records go in one batch
// whatever the order of the replicas in the poller's pass and however
// long the pass takes. The window is only the bound for a stream that is
// not polled (a replica stopped on a disk error, paused, or on a poller
// that does not run): the hold ends when it passes, and the streams it
// still waited for are then not waited for until they are polled again.
//
// The groups are the owner's word (Stream.JoinGroup: the process knows
// which replicas it hosts and of which group); a stream of no group is
// never waited for. Replicas of one group in other processes are those
// processes' logs' business: each log gathers the streams it holds, and
// a process with one replica of a group never holds for it.
//
// The gather decides when a batch starts, nothing else: a record counts
// as synced once an fsync that began after it was appended completed,
// whoever polls, held or not.
type gatherState struct {
	// batch: the open batch the rest is about (the Writer's openFirst;
	// 0: none yet); idle: its first eager record came while no batch was
	// in flight; set: the streams (bit Stream.idx, the first 64) with
	// eager records in it; want: the streams it waits for (the groups'
	// other streams).
	batch uint64
	idle  bool
	set   uint64
	want  uint64
	// Per stream (the first 64): mates, the streams of its group (itself
	// included; 0: no group); polls, its Stream.Polls so far; due, the
	// polls at which it stops being waited for in the open batch.
	group map[uint32]uint64 // the streams of each group
	mates [64]uint64
	polls [64]uint64
	due   [64]uint64
	// absent: streams a hold timed out waiting for; not waited for until
	// they are polled again.
	absent uint64
	// passed: holds released because every stream still waited for was
	// polled without an eager record (GatherPassed).
	passed uint64

	// The rule before groups, kept only while the planted knob
	// gatherRound is on (TestGroupCommitOneFsync): a round runs from one idle batch's first record (its
	// starter's) to the next's; round: the streams with eager records in
	// the round so far; follows[i]: those of the last round stream i
	// started; expect: the current round's starter's. The batch waits
	// for expect, released by the window alone.
	round   uint64
	starter int // -1: none yet
	follows [64]uint64
	expect  uint64
}

// JoinGroup says that the stream is a replica of group g (an id of the
// owner's choosing): a Sync batch that holds an eager record of one of
// g's streams waits for g's other streams in this log (gather.go). A
// stream joins one group, once; past the first 64 streams of a Mux it is
// never waited for.
func (s *Stream) JoinGroup(g uint32) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.idx >= 64 {
		return
	}
	gs := &m.gather
	if gs.mates[s.idx] != 0 {
		return
	}
	if gs.group == nil {
		gs.group = map[uint32]uint64{}
	}
	all := gs.group[g] | 1<<s.idx
	gs.group[g] = all
	for k := all; k != 0; k &= k - 1 {
		gs.mates[bits.TrailingZeros64(k)] = all
	}
}

// noteEager follows the open batch's eager records for the gather (called
// right after s appended one).
func (m *Mux) noteEager(s *Stream) {
	w, gs := m.w, &m.gather
	var bit uint64
	if s.idx < 64 {
		bit = 1 << s.idx
	}
	if gs.batch != w.openFirst {
		// the batch's first eager record (the tracking of an earlier
		// batch is stale: its openFirst was lower)
		gs.batch, gs.set, gs.want = w.openFirst, 0, 0
		gs.idle = w.cur == nil || m.knobs.gatherWhileBusy
		if gs.idle && m.knobs.gatherRound {
			gs.newRound(s)
		}
	}
	if m.knobs.gatherRound {
		gs.round |= bit
	}
	if bit != 0 && gs.set&gs.mates[s.idx] == 0 {
		// the group's first record in the batch: its other streams may
		// follow within one Poll of theirs
		others := gs.mates[s.idx] &^ bit
		if m.knobs.gatherAllGroups {
			for _, all := range gs.group {
				others |= all &^ bit
			}
		}
		gs.want |= others
		for k := others; k != 0; k &= k - 1 {
			i := bits.TrailingZeros64(k)
			gs.due[i] = gs.polls[i] + 2
		}
	}
	if gs.set == 0 || !m.knobs.gatherKeepsHolding {
		gs.set |= bit
	}
}

// newRound is the round rule's bookkeeping (knob gatherRound): an idle
// batch's first record ends the last round, which belongs to the stream
// that started it.
func (gs *gatherState) newRound(s *Stream) {
	if gs.starter >= 0 && gs.starter < 64 {
		gs.follows[gs.starter] = gs.round
	}
	gs.round, gs.starter, gs.expect = 0, s.idx, 0
	if s.idx < 64 {
		gs.expect = gs.follows[s.idx]
	}
}

// gatherPolled notes a Poll of stream s (before the Mux polls).
func (m *Mux) gatherPolled(s *Stream) {
	if s.idx < 64 {
		m.gather.polls[s.idx]++
		m.gather.absent &^= 1 << s.idx
	}
}

// gatherWanted: the open batch may wait for other streams' records: its
// first eager record came while no batch was in flight (one that came
// during a batch's fsync has waited already), and a stream of a group
// with an eager record in it has none yet and was not polled twice since
// (nor was found absent).
func (m *Mux) gatherWanted() bool { return m.wanted(false) }

// wanted is gatherWanted; count: a hold it releases by the passes counts
// (GatherPassed; the Polls' call, not NextDeadline's).
func (m *Mux) wanted(count bool) bool {
	w, gs := m.w, &m.gather
	if len(w.open) == 0 || gs.batch != w.openFirst || !gs.idle {
		return false
	}
	if m.knobs.gatherRound {
		return gs.set&gs.expect != gs.expect
	}
	pend := gs.want &^ gs.set &^ gs.absent
	if pend == 0 {
		return false
	}
	for k := pend; k != 0; k &= k - 1 {
		i := bits.TrailingZeros64(k)
		if gs.polls[i] < gs.due[i] || m.knobs.gatherNoPass {
			return true
		}
	}
	if count && w.holding {
		gs.passed++
	}
	return false
}

// gatherTimedOut: the window ended a hold (a Poll of the Writer said so):
// the streams it still waited for were not polled in it; they are not
// waited for until they are.
func (m *Mux) gatherTimedOut() {
	gs := &m.gather
	gs.absent |= gs.want &^ gs.set
}

// GatherPassed is how many holds ended because every stream still waited
// for was polled without an eager record (the rest ended with every
// stream's record in, or by the window: GatherStats).
func (m *Mux) GatherPassed() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gather.passed
}
