package broadcast

import (
	"encoding/binary"
	"fmt"
)

// Broadcasting (Acuerdo Fig. 4) and serving each follower its diff and
// stream (Fig. 7 l.119-126).

// Leading reports whether this replica leads epoch E and E's diff has
// committed here (the epoch's first commit, EventEpochCommitted): every
// entry of earlier epochs that will ever be delivered has then been
// delivered here, and Append accepts entries. It stays true until the
// replica stops leading E (it starts an election, follows a later epoch's
// leader, or is closed). It is an atomic load, safe from any goroutine;
// from another goroutine than the one that polls, the answer may be stale
// by the time it is used (the leader may have been deposed since).
func (r *Replica) Leading() (Epoch, bool) {
	e := Epoch(r.leading.Load())
	return e, e != 0
}

// setLeading publishes what Leading reports; it is called wherever the role
// or epochDone changes. No epoch is 0 (the first election's is (0,self)
// with self > 0, or (1,0)), so 0 means not leading.
func (r *Replica) setLeading() {
	var e Epoch
	if r.role == Leader && r.epochDone {
		e = r.eCur
	}
	r.leading.Store(uint64(e))
}

// Append broadcasts data as a new entry of the epoch this replica leads,
// exactly as its own proposals are (Acuerdo Fig. 4), but without a
// Proposal: no handle, no result, and nothing is retried. It must be
// called on the goroutine that polls the replica (between Polls, or from
// FSM.Apply or Config.OnEvent), and only while Leading. The entry goes to
// the followers in the next Poll (in this one when called from its
// callbacks), without waiting for a timer. If the epoch ends before the
// entry committed, it is delivered by the next leader's diff or lost,
// like any uncommitted entry: it is never requeued nor forwarded to
// another leader, so it is delivered at most once. Entries appended in
// one epoch are delivered in Append order, after every entry of earlier
// epochs. data is copied (into a reused slab: no allocation in steady
// state for data up to MaxProposal).
//
// Errors: ErrNotLeader when Leading is false; ErrTooLarge when data is
// larger than MaxProposal; ErrBusy when the leader's uncommitted entries
// (proposals and appends) reached Config.MaxUncommitted (back pressure:
// retry after a Poll committed some; AppendRoom says how many fit now), and
// in Async mode while the oldest record not yet on disk is older than
// 2 x Config.FsyncInterval; ErrDiskFull (Sync, Async) while this leader's
// log finds its disk full or too few members can log (Status.GroupDiskFull).
// On an error nothing was appended.
func (r *Replica) Append(data []byte) error {
	if r.leading.Load() == 0 {
		return ErrNotLeader
	}
	if len(data) > maxProposal(r.cfg.MaxRecord) {
		return ErrTooLarge
	}
	if r.fullRefuse {
		r.ctr.DiskFullRefused++
		return ErrDiskFull
	}
	if r.uncommitted() >= r.cfg.MaxUncommitted || r.diskLate() {
		return ErrBusy
	}
	d, s := r.acceptCur.copy(&r.slabs, data) // the Log takes the reference
	r.broadcast(proposalID{}, d, s)
	return nil
}

// AppendFunc is Append of an n-byte entry that fill writes in place:
// fill gets the entry's n bytes (not zeroed) and must write every one of
// them, so that a leader builds an entry straight into the slab it is
// broadcast from, without a copy of its own. fill runs on the calling
// goroutine before AppendFunc returns, only if nothing refuses the entry;
// it must not keep the slice. Errors and their meaning are Append's; on an
// error fill was not called and nothing was appended.
func (r *Replica) AppendFunc(n int, fill func([]byte)) error {
	if r.leading.Load() == 0 {
		return ErrNotLeader
	}
	if n < 0 || n > maxProposal(r.cfg.MaxRecord) {
		return ErrTooLarge
	}
	if r.fullRefuse {
		r.ctr.DiskFullRefused++
		return ErrDiskFull
	}
	if r.uncommitted() >= r.cfg.MaxUncommitted || r.diskLate() {
		return ErrBusy
	}
	d, s := r.acceptCur.alloc(&r.slabs, n) // the Log takes the reference
	fill(d)
	r.broadcast(proposalID{}, d, s)
	return nil
}

// AppendRoom is how many more entries Append accepts now: 0 unless
// Leading, else Config.MaxUncommitted less the leader's uncommitted
// entries. Like Append, it is for the polling goroutine.
func (r *Replica) AppendRoom() int {
	if r.leading.Load() == 0 || r.diskLate() || r.fullRefuse {
		return 0 // Async: also while our disk is late (durable.go)
	}
	return max(0, r.cfg.MaxUncommitted-r.uncommitted())
}

// broadcast is Acuerdo Fig. 4 l.38-41: hdr = (E_new, ++Count), added to the
// Log (the leader is a receiver too); serve writes it to each follower.
// The Log takes over one reference on s, the slab holding data.
func (r *Replica) broadcast(id proposalID, data []byte, s *slab) MsgHdr {
	r.count++
	hdr := MsgHdr{E: r.eNew, Cnt: r.count}
	e := entry{hdr: hdr, id: id, data: data, slab: s}
	r.log.Set(e)
	r.accepted = hdr
	r.walAccept(&e)
	return hdr
}

// startSync begins a diff for member i (Acuerdo Fig. 7 l.119-126): base is
// comm_cpy[i], the diff runs to our Accepted.
func (r *Replica) startSync(i int) {
	m := &r.mems[i]
	f := &r.fol[i]
	*f = follower{state: fsSync, inc: m.inc, end: r.accepted, sentAt: r.now}
	if m.valid[tCommit] {
		f.base = m.commitHdr()
	}
	if f.base.Less(r.pruned) {
		f.snap = true
	}
	f.base = minHdr(f.base, r.accepted)
	if r.cfg.Durability == Async && !f.snap && f.base.E != r.eCur && f.base != r.pruned {
		// Async: is its commit point in our history? In a history
		// without loss every commit point of an earlier epoch is at or
		// below what the leader had accepted when elected (Fig. 7
		// l.106), and one that names an entry above the pruned point is
		// in our Log. One that is not (the member restarted from its
		// disk after a recovery election that did not hear it, and had
		// committed entries, or an epoch's diff, the group lost) has
		// its state replaced by our snapshot, even though its commit
		// point may look ahead of the snapshot's (diffReset).
		_, inLog := r.log.Get(f.base)
		if r.electedFrom.Less(f.base) || f.base.Cnt != 0 && !inLog {
			f.snap, f.reset = true, true
		}
	}
	f.packed = f.base
}

// serve writes what follower i needs next into its ring: the diff, then
// new messages as they are broadcast, while the ring has room.
func (r *Replica) serve(i int) bool {
	m := &r.mems[i]
	f := &r.fol[i]
	l := r.links[i]
	if m.inc == 0 || l.out.rinc != m.inc {
		return false
	}
	if f.state == fsIdle || f.inc != m.inc {
		if r.cfg.Durability == Async && !m.valid[tCommit] {
			// Fig. 7 l.119 takes the diff's base from comm_cpy[j]: wait
			// for this incarnation's CommitSST row. Async: without it
			// startSync cannot tell whether the member's commit point
			// is in our history (a member restarted from its disk may
			// have delivered entries a recovery election lost). From
			// base 0 it sent a snapshot diff without diffReset, or,
			// nothing pruned, a plain diff: a member whose commit point
			// is above the diff's base kept those entries.
			return false
		}
		r.startSync(i)
	}
	if f.state == fsStream {
		// A follower whose next entry was pruned, or that has not
		// accepted the diff and made no progress (accepting, or fetching
		// its snapshot: a long transfer is not thrown away) for 20
		// election timeouts, is synced again.
		// In Sync mode a member restarted from its log may show an
		// AcceptSST row at f.end already (its replayed dA) without having
		// accepted our diff (a snapshot fetch failed): it does not say it
		// follows us.
		behind := m.valid[tAccept] && m.acceptHdr().Less(f.end) || r.dur != nil && m.valid[tCommit] && m.follows() != r.eCur
		stalled := behind && r.now-max(f.sentAt, m.progressAt) > 20*r.cfg.ElectionTimeout
		if f.next.Less(r.pruned) || stalled {
			r.tracef("node %d re-syncs node %d (stalled %v)", r.self, m.id, stalled)
			r.startSync(i)
		}
	}
	if f.state == fsSync && (!f.snap || f.snapSent) && f.packed.Less(r.pruned) {
		// The Log was pruned past what this diff still has to send
		// (MaxLogEntries: the follower is down or too slow): start over,
		// from a snapshot.
		r.tracef("node %d re-syncs node %d: its diff was pruned at %v", r.self, m.id, r.pruned)
		r.startSync(i)
	}
	progress := false
	if f.state == fsSync {
		if !r.sendDiff(i, f, l) {
			return progress
		}
		progress = true
	}
	// Stream new messages (Fig. 4 l.41: outgoing_buff.send_to_all), at
	// most maxServe bytes a Poll: a member that comes back to an empty
	// ring would otherwise have the whole ring filled in one Poll (a MiB
	// of small records took the leader's Poll 5-7 ms).
	for served := 0; served < maxServe; {
		if f.next.Less(r.pruned) {
			break // the entries after f.next are gone: synced again at the next serve
		}
		next := r.nextAfter(f.next)
		if next == nil {
			break
		}
		size := recSize(entryMeta + len(next.data))
		if !l.out.room(size) {
			break
		}
		served += size
		buf := l.out.reserve(size, r.inc)
		putMeta(buf[recHdr:], next.id)
		copy(buf[recHdr+entryMeta:], next.data)
		l.out.commitRecord(recHeader{len: entryMeta + len(next.data), kind: kMsg, hdr: next.hdr}, r.inc)
		f.next = next.hdr
		progress = true
	}
	return progress
}

// maxServe bounds the record bytes serve streams to one follower in one
// Poll (a push posts at most maxPushList writes of maxFlush bytes anyway).
const maxServe = 256 << 10

// sendDiff writes the snapshot announcement and diff parts for follower i;
// it reports true once the whole diff is in the ring.
func (r *Replica) sendDiff(i int, f *follower, l *link) bool {
	if f.snap && !f.snapSent {
		// A snapshot shared by every member behind the pruned Log, made
		// off the polling goroutine: wait for it (heartbeats, commits and
		// the other members go on meanwhile). None is made for a member
		// we do not hear (down, or partitioned away).
		if r.now-r.mems[i].heardAt > r.cfg.ElectionTimeout {
			return false
		}
		snap := r.snapshotFor()
		if snap == nil || !l.out.room(recSize(snapRecLen)) {
			return false
		}
		// The diff runs from the snapshot's commit point to our Accepted
		// now: the snapshot may be later than the Accepted of startSync
		// (taken after it, or shared with another member), and a diff
		// ending below its base would be followed by a stream that skips
		// the entries between them (the member, having installed the
		// snapshot or not, would accept past a hole).
		f.base = snap.at
		f.packed = f.base
		f.end = r.accepted
		metaID, _ := r.snapRegionIDs(snap.slot)
		buf := l.out.reserve(recSize(snapRecLen), r.inc)
		p := buf[recHdr:]
		binary.LittleEndian.PutUint64(p[0:], uint64(metaID))
		binary.LittleEndian.PutUint64(p[8:], uint64(snap.metaSize))
		binary.LittleEndian.PutUint64(p[16:], snap.mcheck)
		binary.LittleEndian.PutUint64(p[24:], uint64(f.base.E))
		binary.LittleEndian.PutUint64(p[32:], f.base.Cnt)
		l.out.commitRecord(recHeader{len: snapRecLen, kind: kSnapshot, hdr: f.end}, r.inc)
		f.snapSent = true
		r.ctr.SnapshotsSent++
		r.tracef("node %d sends node %d a snapshot at %v (%d bytes)", r.self, r.mems[i].id, f.base, snap.size)
	}
	var flags uint64
	if f.snap {
		flags = diffSnapshot
	}
	if f.reset {
		flags |= diffReset
	}
	for {
		// Fig. 7 l.121-124: the entries h with comm_cpy[j] <= h <= Accepted,
		// packed into parts of at most MaxRecord bytes.
		p := r.scratch
		binary.LittleEndian.PutUint64(p[0:], uint64(f.base.E))
		binary.LittleEndian.PutUint64(p[8:], f.base.Cnt)
		binary.LittleEndian.PutUint64(p[16:], flags)
		n := diffHdr
		last := f.packed
		more := false
		r.log.Ascend(f.packed, func(e *entry) bool {
			if f.end.Less(e.hdr) {
				return false
			}
			if n+diffEntrySize(e) > len(p) {
				if n == diffHdr {
					// Propose admits only data that fits a part alone
					// (maxProposal); an entry that does not would stall
					// this diff for ever.
					panic(fmt.Sprintf("broadcast: entry %v of %d bytes does not fit a diff part of %d (acceptance admits only maxProposal)", e.hdr, len(e.data), len(p)))
				}
				more = true
				return false
			}
			n += putDiffEntry(p[n:], e)
			last = e.hdr
			return true
		})
		kind := uint8(kDiffEnd)
		if more {
			kind = kDiffPart
		}
		size := recSize(n)
		if !l.out.room(size) {
			return false
		}
		buf := l.out.reserve(size, r.inc)
		copy(buf[recHdr:], p[:n])
		l.out.commitRecord(recHeader{len: n, kind: kind, hdr: f.end}, r.inc)
		f.packed = last
		if kind == kDiffEnd {
			f.state = fsStream
			f.next = f.end
			f.sentAt = r.now
			r.tracef("node %d sends node %d diff %v base %v", r.self, r.mems[i].id, f.end, f.base)
			return true
		}
	}
}
