package broadcast

import (
	"encoding/binary"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// SST rows: computing, pushing and reading AcceptSST, CommitSST and VoteSST
// rows, and ring acknowledgements.

// updateRows recomputes our three rows from the protocol state and marks
// changed ones for pushing: AcceptSST to the leader (Acuerdo Fig. 5 l.52),
// CommitSST and VoteSST to all (Fig. 6 l.95, Fig. 7 l.104).
func (r *Replica) updateRows() {
	var rs [nTables]row
	ack := r.ackHdr() // Accepted; in Sync mode no more than what is on disk (durable.go)
	rs[tAccept] = row{uint64(ack.E), ack.Cnt, r.fetched, r.inc}
	if r.diskFull() {
		rs[tAccept][wAckFull] = 1 // our leader counts us out (updateFull)
	}
	rs[tCommit] = row{uint64(r.committed.E), r.committed.Cnt, r.heartbeat, r.inc, r.index, uint64(r.follows())}
	rv := r.awaitsRecovery()
	if r.vote != (Vote{}) || rv {
		rs[tVote] = row{uint64(r.vote.ENew), uint64(r.vote.Acpt.E), r.vote.Acpt.Cnt, r.inc}
		if r.vote.Forced {
			rs[tVote][wForced] = 1
		}
		if rv {
			// Async: restarted without its memory, waiting for a
			// recovery election (a Repair member too, which does not
			// vote: awaitsRecovery); the highest commit index it saw
			// (election.go).
			rs[tVote][wSeen] = r.seenIdx
			rs[tVote][wFromDisk] = 1
		}
	}
	for t := range rs {
		if rs[t] == r.myRows[t] {
			continue
		}
		if t == tVote && r.vote == (Vote{}) && !rv {
			continue
		}
		// A follower's CommitSST row matters at once to its leader only
		// (its heartbeat is the leader's failure detector); the others use
		// it for diff bases and pruning (Fig. 7 l.113) and get it at the
		// next beat after the commit point moved, and every fourth beat.
		beatOnly := false
		if t == tCommit && r.role == Follower {
			if rs[t][wFollows] != r.myRows[t][wFollows] || rs[t][wFollows] == 0 {
				// Whether we hear our leader matters to every member at
				// once, and a follower that lost its leader keeps its
				// row fresh everywhere (pre-vote).
			} else if r.beat && (r.heartbeat%4 == 0 || r.commitMoved) {
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
	for i, l := range r.links {
		if l == nil || !l.isUp() {
			continue
		}
		if r.pushLink(i, l) {
			progress = true
		}
		if r.driveFetch(l) {
			progress = true
		}
	}
	return progress
}

// pushOp is what a ring write of a push list settles.
type pushOp struct {
	next uint64 // outRing.posted once it is posted
}

// maxPushList bounds one link's push list (ring writes are at most
// maxFlush bytes each; what does not fit goes in the next Poll).
const maxPushList = 16

// pushLink posts, as one list (rdma.Conn.PostList: one lock and one
// liveness check on shm), what peer i needs from us: new ring records
// first (they are on the commit path), then dirty rows, then our ring
// acknowledgement. The list's last write carries Notify when the peer
// should wake: always after ring records, and for rows and acks as the
// rules below say. Writes on a Conn land in order, so when the Notify
// write is visible, so is everything before it. A wake-up that could not
// be posted is owed to the next push.
func (r *Replica) pushLink(i int, l *link) bool {
	if !l.notifyOwed && !l.ackDirty && l.dirty == [nTables]bool{} && (l.out.rinc == 0 || l.out.posted >= l.out.sent) {
		return false // nothing to post and no wake-up owed: most Polls
	}
	want := l.notifyOwed
	for t := range l.dirty {
		// A CommitSST row wakes the peer only when a leader's commit
		// point moved (its followers deliver on it). A heartbeat alone,
		// or another member's commit point (used for diff bases and
		// pruning), waits for the peer's next poll: a parked peer wakes
		// for its own timers anyway.
		if l.dirty[t] && (t != tCommit || (r.role == Leader && r.commitHdr(t) != l.commitSent)) {
			want = true
		}
	}
	in := &r.ins[i]
	ack := l.ackDirty && in.sinc != 0
	// A sender waiting for ring space waits for at least a quarter of the
	// ring (records are at most a quarter): only such an ack wakes it, not
	// the ones sent at heartbeats.
	if ack && in.cursor-in.acked >= uint64(len(in.mem))/4 {
		want = true
	}
	// Each op is settled when it is queued: the Link posts it at the
	// Flush below, or fails, and then connect re-posts everything on the
	// next Conn.
	wrs, ops := l.wrs[:0], l.ops[:0]
	if l.out.rinc != 0 && l.out.posted < l.out.sent {
		wrs, ops = l.ringWrites(wrs, ops, r.cfg.RegionBase+1+rdma.RegionID(r.me))
		if len(ops) > 0 {
			want = true // ring records always wake the peer
		}
	}
	l.wrs, l.ops = wrs, ops
	queued := 0
	for k := range wrs {
		if _, ok := l.io.Queue(wrs[k], want); !ok {
			break
		}
		l.out.posted = ops[k].next
		queued++
	}
	clear(wrs) // drop the references to the mirror
	records := queued > 0
	for t := range l.dirty {
		if !l.dirty[t] || queued == maxPushList {
			continue
		}
		if t == tCommit && records && r.lazyCommit(l) {
			continue
		}
		if t == tCommit && r.knobs.lateCommitRow && r.dur != nil && r.inc > 1 && (r.bootAt < 0 || r.now-r.bootAt < 2*r.cfg.ElectionTimeout) {
			continue
		}
		buf := l.io.Stage(rowSize)
		if buf == nil {
			break
		}
		encodeSealed(buf, r.seal(t))
		if _, ok := l.io.Queue(rdma.WR{Kind: rdma.OpWrite, Region: r.cfg.RegionBase, Offset: uint64(rowOffset(t, r.me, r.n)), Buf: buf}, want); !ok {
			break
		}
		queued++
		l.dirty[t] = false
		if t == tCommit {
			l.commitSent = r.commitHdr(t)
			l.commitSentAt = r.now
		}
	}
	if ack && queued < maxPushList {
		if buf := l.io.Stage(8); buf != nil {
			binary.LittleEndian.PutUint64(buf, ackWord(in.sinc, r.inc, in.cursor))
			if _, ok := l.io.Queue(rdma.WR{Kind: rdma.OpWrite, Region: r.cfg.RegionBase, Offset: uint64(ackOffset(r.me, r.n)), Buf: buf}, want); ok {
				queued++
				l.ackDirty = false
				in.acked = in.cursor
			}
		}
	}
	if queued == 0 {
		l.notifyOwed = want
		return false
	}
	n := l.io.Flush(r.now)
	l.noteDown(r)
	l.notifyOwed = want && n < queued
	return n > 0
}

// Bounds on how long a streaming leader defers its CommitSST row.
const (
	lazyCommitEntries = 32
	lazyCommitDelay   = 20 * time.Microsecond
)

// lazyCommit reports whether the leader may leave its CommitSST row for
// peer l out of a push that carries ring records: the commit push is off
// the critical path (Acuerdo, "Committing": Fig. 6 l.93), and while records stream, one
// row write per message and peer is a cost on it. The row still goes out
// at every heartbeat (its counter is the failure detector), in any push
// without records, when the epoch changed, and once the commit point is
// lazyCommitEntries ahead of the last row the peer got or that row is
// lazyCommitDelay old; so followers deliver at most that much later.
func (r *Replica) lazyCommit(l *link) bool {
	if r.role != Leader || r.beat {
		return false
	}
	c := r.commitHdr(tCommit)
	return c.E == l.commitSent.E && c.Cnt-l.commitSent.Cnt < lazyCommitEntries && r.now-l.commitSentAt < lazyCommitDelay
}

// seal returns our row of table t with its check word, computed once per
// change of the row (not per peer), and only for rows that are pushed.
func (r *Replica) seal(t int) *row {
	if [wCheck]uint64(r.sealed[t][:wCheck]) != [wCheck]uint64(r.myRows[t][:wCheck]) {
		r.sealed[t] = r.myRows[t]
		r.sealed[t][wCheck] = rowCheck(&r.sealed[t], t, r.me)
	}
	return &r.sealed[t]
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
			if t == tAccept {
				m.progressAt = r.now
			}
			progress = true
			if t == tCommit && rw[wHeartbeat] != m.hb {
				m.hb = rw[wHeartbeat]
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
	// Its previous incarnation's acknowledgement of our ring to it is
	// stale; the new one writes its own only after reading records we
	// write from here on.
	rdma.Store64(r.sstMem, ackOffset(i, r.n), 0)
	l.stopFetch()
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
			// An acknowledgement of records posted on an earlier Conn
			// (re-posting restarted from an older one) may pass what
			// we re-posted: those bytes are consumed and may be
			// overwritten by new records, so never post them again.
			l.out.posted = max(l.out.posted, c)
		}
	}
}
