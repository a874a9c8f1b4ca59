package broadcast

import (
	"encoding/binary"
	"slices"
)

// Committing (Acuerdo Fig. 6), delivery, and the Log's bounds.

// uncommitted is how many entries of this epoch we accepted and did not
// commit yet: at the leader, the back-pressure measure (MaxUncommitted).
func (r *Replica) uncommitted() int {
	if r.accepted.E != r.eCur || r.committed.E != r.eCur {
		return 0
	}
	return int(r.accepted.Cnt - r.committed.Cnt)
}

// commit is Acuerdo Fig. 6 l.69-91. The leader commits up to the header a
// majority of Accept_SST entries of its epoch reached (l.72-74); a follower
// up to its leader's Commit_SST entry of its epoch (l.76-77). Entries are
// delivered in Log order (l.79-88: a diff's entries, then the epoch's).
// Committed also advances to (E_cur, 0) when the diff commits, so that an
// empty diff's commit is visible to followers.
func (r *Replica) commit() bool {
	var bound MsgHdr
	switch r.role {
	case Leader:
		if !r.committed.Less(r.accepted) {
			// Followers accept only what we sent, so no quorum can be
			// beyond our own Accepted: nothing to count (the common idle
			// Poll).
			r.checkEpochDone()
			return false
		}
		vals := r.commitVals[:0]
		vals = append(vals, r.ackHdr()) // Sync: our own dA, not Accepted (plan §2 D3)
		for i := range r.mems {
			m := &r.mems[i]
			if i != r.me && m.valid[tAccept] {
				if h := m.acceptHdr(); h.E == r.eCur {
					vals = append(vals, h)
				}
			}
		}
		r.commitVals = vals
		k := len(vals)
		q := r.quorum
		if r.knobs.minorityCommit {
			q--
		}
		if k < q {
			return false
		}
		s := vals
		slices.SortFunc(s, func(a, b MsgHdr) int {
			if b.Less(a) {
				return -1
			}
			if a.Less(b) {
				return 1
			}
			return 0
		})
		bound = s[q-1]
	case Follower:
		m := &r.mems[r.idxOf(r.eCur.Leader())]
		if !m.valid[tCommit] {
			return false
		}
		h := m.commitHdr()
		if h.E != r.eCur {
			return false
		}
		if r.dur != nil {
			// Durable modes: the highest commit index seen, for the
			// Commit records (async loss counting).
			r.seenIdx = max(r.seenIdx, m.rows[tCommit][wIndex])
		}
		bound = minHdr(h, r.accepted)
		if r.knobs.uncommitted {
			bound = r.accepted
		}
	default:
		return false
	}
	if bound.E != r.eCur || !r.committed.Less(bound) {
		r.checkEpochDone()
		return false
	}
	// deliver neither changes the Log nor calls back into the replica.
	for i := r.log.above(r.committed); i < r.log.Len(); i++ {
		e := r.log.at(i)
		if bound.Less(e.hdr) {
			break
		}
		r.deliver(e)
		if r.knobs.dupDeliver && r.role == Follower && i == r.log.above(r.committed) {
			r.deliver(e)
		}
	}
	r.committed = bound
	r.commitMoved = true
	r.seenIdx = max(r.seenIdx, r.index)
	if r.log.Len() > r.cfg.MaxLogEntries+r.uncommitted() {
		r.prune() // the bounds are hard, not once per prune period
	}
	if r.cfg.Trace != nil {
		r.tracef("node %d commits up to %v (delivered %d)", r.self, bound, r.index)
	}
	r.checkEpochDone()
	return true
}

// checkEpochDone notes when this epoch's diff has committed here
// (Committed >= (E_cur, 0)), also when a snapshot took us past it.
func (r *Replica) checkEpochDone() {
	if !r.epochDone && r.role != Electing && r.committed.E == r.eCur {
		r.epochDone = true
		r.recoveryCommitted()
		r.setLeading() // before the event: OnEvent may Append
		r.event(EventEpochCommitted, r.eCur)
		r.newEpochCommitted()
	}
}

// deliver hands one committed entry to the application.
// A keyed entry (keyedBit) the keyed table shows as delivered already is a
// duplicate: it takes its index, FSM.Apply is not called, and its proposal
// resolves with the original delivery's index and result (same Seq) or
// ErrDuplicate (an older Seq). Every replica decides alike: the table is
// replicated state (keyed.go).
func (r *Replica) deliver(e *entry) {
	r.index++
	r.ctr.Delivered++
	pseq := e.id.pseq &^ keyedBit
	index, data := r.index, e.data
	var key Key
	var res []byte
	var err error
	dup := false
	if e.id.pseq&keyedBit != 0 && len(data) >= keyLen {
		key = Key{Client: binary.LittleEndian.Uint64(data[0:]), Seq: binary.LittleEndian.Uint64(data[8:])}
		data = data[keyLen:]
		if k := r.keys.get(key.Client); k != nil && key.Seq <= k.seq {
			dup = true
			r.ctr.Duplicates++
			if key.Seq == k.seq {
				index, res = k.index, k.reply()
			} else {
				index, err = 0, ErrDuplicate
			}
		}
	}
	if !dup {
		res = r.fsm.Apply(Entry{Index: r.index, Hdr: e.hdr, Data: data, Key: key})
		if key.Client != 0 {
			r.keys.record(key, r.index, res, r.cfg.MaxKeyedClients)
		}
	}
	if pseq == 0 {
		return // appended (Replica.Append): no proposal, no table record
	}
	if k := r.idxOf(e.id.origin); k >= 0 {
		r.table[k] = tableRec{oinc: e.id.oinc, pseq: pseq}
	}
	if e.id.origin == r.self && e.id.oinc == uint32(r.inc) {
		r.resolveThrough(pseq, index, res, err)
	}
}

// maxPrune bounds the entries one prune removes.
const maxPrune = 1024

// prune removes committed entries nobody is expected to need: below every
// member's Commit_SST entry heard within the timeout, every streaming
// follower's cursor and every diff being sent; and in any case beyond
// MaxLogEntries committed entries, whoever still needs them, except for
// the entries a member that makes progress still needs (catching up by
// snapshot, or just behind), up to MaxCatchUpLogEntries. Both bounds
// are hard: a follower whose cursor or diff was pruned (serve) is synced
// again, by snapshot, so a member that is down, partitioned or stuck mid
// catch-up for good never makes the leader's Log grow, and one that
// fetches a large snapshot while the group commits keeps its entries.
func (r *Replica) prune() {
	floor := r.committed
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || r.now-m.heardAt > r.cfg.ElectionTimeout || !m.valid[tCommit] {
			continue
		}
		floor = minHdr(floor, m.commitHdr())
	}
	top := MsgHdr{E: ^Epoch(0), Cnt: ^uint64(0)}
	keep := top // entries above keep are needed by a diff being sent
	hold := top // entries above hold are needed by a member catching up by snapshot, making progress
	if r.role == Leader {
		for i := range r.fol {
			f := &r.fol[i]
			heard := r.now-r.mems[i].heardAt <= r.cfg.ElectionTimeout
			// A member that makes progress (its AcceptSST row moves:
			// it accepts, or fetches its snapshot) is catching up.
			catching := heard && r.now-r.mems[i].progressAt <= r.cfg.ElectionTimeout
			switch f.state {
			case fsSync:
				switch {
				case !f.snap || f.snapSent || r.knobs.unboundedLog:
					keep = minHdr(keep, f.packed)
				case r.snap != nil && heard:
					// The snapshot being made for it: its diff will
					// start at the snapshot's point.
					keep = minHdr(keep, r.snap.at)
					hold = minHdr(hold, r.snap.at)
				}
				if catching && f.snapSent {
					hold = minHdr(hold, f.packed)
				}
			case fsStream:
				floor = minHdr(floor, f.next)
				if catching {
					hold = minHdr(hold, f.next) // fetching a snapshot (its ring full until it installs it), or reading its ring
				}
			}
		}
	}
	floor = minHdr(floor, keep)
	if r.snap != nil && r.snap.done.Load() && !r.snapInUse() {
		r.releaseSnap() // nobody needs it any more: free its copy of the state
	}
	ncommitted := r.log.above(r.committed)
	for popped := 0; ; popped++ {
		e, ok := r.log.Min()
		if !ok || r.committed.Less(e.hdr) {
			return
		}
		if popped == maxPrune {
			// A catch-up hold that ends frees up to MaxCatchUpLogEntries
			// at once: a Poll frees at most maxPrune of them, the next
			// Poll goes on (freeing 200k entries took one Poll 10-20 ms).
			r.nextPrune = r.now
			return
		}
		held := hold.Less(e.hdr) && ncommitted <= r.cfg.MaxCatchUpLogEntries
		if floor.Less(e.hdr) && (ncommitted <= r.cfg.MaxLogEntries || held || r.knobs.unboundedLog && keep.Less(e.hdr)) {
			return
		}
		r.pruned = maxHdr(r.pruned, e.hdr)
		if r.knobs.slabLeak {
			e.slab.ref()
		}
		r.log.PopMin() // e is invalid from here
		ncommitted--
	}
}
