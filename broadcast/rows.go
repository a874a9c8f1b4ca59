package broadcast

import (
	"encoding/binary"

	"github.com/rdmakv/rdmakv/rdma"
)

// SST rows: computing, pushing and reading AcceptSST, CommitSST and VoteSST
// rows, and ring acknowledgements.

// updateRows recomputes our three rows from the protocol state and marks
// changed ones for pushing: AcceptSST to the leader (Acuerdo Fig. 5 l.52),
// CommitSST and VoteSST to all (Fig. 6 l.95, Fig. 7 l.104).
func (r *Replica) updateRows() {
	var rs [nTables]row
	rs[tAccept] = row{uint64(r.accepted.E), r.accepted.Cnt, 0, r.inc}
	rs[tCommit] = row{uint64(r.committed.E), r.committed.Cnt, r.heartbeat, r.inc, r.index}
	if r.vote != (Vote{}) {
		rs[tVote] = row{uint64(r.vote.ENew), uint64(r.vote.Acpt.E), r.vote.Acpt.Cnt, r.inc}
	}
	for t := range rs {
		if rs[t] == r.myRows[t] {
			continue
		}
		if t == tVote && r.vote == (Vote{}) {
			continue
		}
		// A follower's CommitSST row matters at once to its leader only
		// (its heartbeat is the leader's failure detector); the others use
		// it for diff bases and pruning (Fig. 7 l.113) and get it at the
		// next beat after the commit point moved, and every fourth beat.
		beatOnly := false
		if t == tCommit && r.role == Follower {
			if r.beat && (r.heartbeat%4 == 0 || r.commitMoved) {
				r.commitMoved = false
			} else {
				beatOnly = true
			}
		}
		r.myRows[t] = rs[t]
		for i, l := range r.links {
			if l == nil {
				continue
			}
			if (t == tAccept || beatOnly) && r.role != Electing && r.mems[i].id != r.eCur.Leader() {
				continue
			}
			l.dirty[t] = true
		}
	}
}

// push writes dirty rows, acknowledgements and ring records to the peers.
func (r *Replica) push() bool {
	now := r.now
	r.beat = now >= r.nextHB
	if r.beat {
		// Acuerdo Fig. 6 l.93-95: push Commit_SST[Self] periodically; its
		// heartbeat counter is the failure detector.
		r.heartbeat++
		r.nextHB = now + r.cfg.HeartbeatInterval
	}
	r.updateRows()
	progress := false
	for t := range r.sealed {
		if [wCheck]uint64(r.sealed[t][:wCheck]) != [wCheck]uint64(r.myRows[t][:wCheck]) {
			r.sealed[t] = r.myRows[t]
			r.sealed[t][wCheck] = rowCheck(&r.sealed[t], t, r.me) // once, not per peer
		}
	}
	for i, l := range r.links {
		if l == nil || !l.up {
			continue
		}
		// One doorbell ring per peer and push: every write that should
		// wake the peer makes the last write of this push carry Notify
		// (writes on a Conn land in order, so when that one is visible,
		// so are the others). Ring records always end with a Notify write.
		// A wake-up that could not be posted is owed to the next push.
		want := l.notifyOwed
		last := -1 // the last row table to post, if no ack or records follow
		for t := range l.dirty {
			if !l.dirty[t] {
				continue
			}
			last = t
			// A CommitSST row wakes the peer only when a leader's commit
			// point moved (its followers deliver on it). A heartbeat
			// alone, or another member's commit point (used for diff
			// bases and pruning), waits for the peer's next poll: a
			// parked peer wakes for its own timers anyway.
			if t != tCommit || (r.role == Leader && r.commitHdr(t) != l.commitSent) {
				want = true
			}
		}
		in := &r.ins[i]
		ack := l.ackDirty && in.sinc != 0
		// A sender waiting for ring space waits for at least a quarter of
		// the ring (records are at most a quarter): only such an ack
		// wakes it, not the ones sent at heartbeats.
		if ack && in.cursor-in.acked >= uint64(len(in.mem))/4 {
			want = true
		}
		records := l.out.rinc != 0 && l.out.posted < l.out.sent
		notified := false
		for t := range l.dirty {
			if !l.dirty[t] {
				continue
			}
			slot, buf := l.stageSlot()
			if buf == nil {
				break
			}
			encodeSealed(buf, &r.sealed[t])
			notify := want && t == last && !ack && !records
			if l.postStaged(r, now, slot, buf, r.cfg.RegionBase, rowOffset(t, r.me, r.n), notify) {
				l.dirty[t] = false
				if t == tCommit {
					l.commitSent = r.commitHdr(t)
				}
				notified = notified || notify
				progress = true
			}
		}
		if ack {
			slot, buf := l.stageSlot()
			if buf != nil {
				binary.LittleEndian.PutUint64(buf, ackWord(in.sinc, r.inc, in.cursor))
				notify := want && !records
				if l.postStaged(r, now, slot, buf[:8], r.cfg.RegionBase, ackOffset(r.me, r.n), notify) {
					l.ackDirty = false
					in.acked = in.cursor
					notified = notified || notify
					progress = true
				}
			}
		}
		if records {
			p, n := l.flushRing(r, now, r.cfg.RegionBase+1+rdma.RegionID(r.me))
			progress = progress || p
			notified = notified || n
		}
		l.notifyOwed = want && !notified
		if r.driveFetch(l) {
			progress = true
		}
	}
	return progress
}

// commitHdr is the commit point in our sealed CommitSST row (t == tCommit).
func (r *Replica) commitHdr(t int) MsgHdr {
	return MsgHdr{E: Epoch(r.myRows[t][0]), Cnt: r.myRows[t][1]}
}

// readRows reads every member's rows from our SST region.
func (r *Replica) readRows() bool {
	progress := false
	for i := range r.mems {
		if i == r.me {
			continue
		}
		m := &r.mems[i]
		for t := 0; t < nTables; t++ {
			if rowUnchanged(r.sstMem, t, i, r.n, &m.raw[t], m.rawOK[t]) {
				continue
			}
			rw, ok := decodeRow(r.sstMem, t, i, r.n)
			m.raw[t], m.rawOK[t] = rw, ok
			if !ok || rw[wIncarnation] < m.inc {
				continue
			}
			if rw[wIncarnation] > m.inc {
				r.memberRestarted(i, rw[wIncarnation])
			}
			if m.valid[t] && m.rows[t] == rw {
				continue
			}
			m.rows[t] = rw
			m.valid[t] = true
			m.heardAt = r.now
			progress = true
			if t == tCommit && rw[2] != m.hb {
				m.hb = rw[2]
			}
		}
	}
	return progress
}

// memberRestarted handles the first row of a new incarnation of member i:
// its memory is new, so both rings between us start afresh.
func (r *Replica) memberRestarted(i int, inc uint64) {
	m := &r.mems[i]
	r.tracef("node %d sees node %d incarnation %d", r.self, m.id, inc)
	m.inc = inc
	m.valid = [nTables]bool{}
	m.heardAt = r.now
	in := &r.ins[i]
	in.sinc = inc
	in.cursor, in.acked = 0, 0
	in.diff = pendingDiff{}
	l := r.links[i]
	l.ackDirty = true
	l.out.reset(inc)
	l.fetch = snapFetch{}
	for t := range l.dirty {
		l.dirty[t] = true
	}
	if r.fol[i].state != fsIdle {
		r.fol[i] = follower{state: fsIdle}
	}
}

// readAcks reads the ring acknowledgements peers wrote into our SST region.
func (r *Replica) readAcks() {
	for i, l := range r.links {
		if l == nil || l.out.rinc == 0 {
			continue
		}
		w := rdma.Load64(r.sstMem, ackOffset(i, r.n))
		if w>>56 != r.inc&0xff || (w>>48)&0xff != l.out.rinc&0xff {
			continue
		}
		c := liftAck(w&ackMask, l.out.sent)
		if c > l.out.consumed && c <= l.out.sent {
			l.out.consumed = c
		}
	}
}
