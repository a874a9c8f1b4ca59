package broadcast

import (
	"encoding/binary"

	"github.com/rdmakv/rdmakv/rdma"
)

// Accepting (Acuerdo Fig. 5): reading rings, messages, forwarded
// proposals, diffs and snapshots.

const maxBatch = 4096

// readRing accepts the valid records the sender wrote, as one batch, and
// acknowledges only the last one (Acuerdo Fig. 5; earlier ones are implied
// by FIFO).
func (r *Replica) readRing(i int) bool {
	in := &r.ins[i]
	if in.sinc == 0 || r.recovering {
		return false // rejoining: records wait until we know what we promised
	}

	sender := r.mems[i].id
	rs := uint64(len(in.mem))
	start := in.cursor
	acc := r.accepted
	for k := 0; k < maxBatch; k++ {
		if r.diskFull() {
			// A full disk: the writer refuses records until space
			// returns; nothing is read that would need one (durable.go).
			break
		}
		if r.diskLate() {
			// Async back-pressure: the records wait in the ring (and
			// the sender with them) until our disk caught up
			// (durable.go).
			r.diskLateN++
			break
		}
		off := in.cursor % rs
		if rs-off < recHdr+8 {
			in.cursor += rs - off
			continue
		}
		h, size, ok := decodeRecord(in.mem, int(off), in.cursor, in.sinc, r.inc)
		if !ok {
			break
		}
		payload := in.mem[int(off)+recHdr : int(off)+recHdr+h.len]
		done := true
		switch h.kind {
		case kPad:
			in.cursor += rs - off
			continue
		case kMsg:
			r.acceptMsg(sender, h.hdr, payload)
		case kForward:
			done = r.acceptForward(h.hdr, payload)
		case kSnapshot:
			done = r.acceptSnapshot(i, h.hdr, payload)
		case kDiffPart, kDiffEnd:
			done = r.acceptDiffPart(i, sender, h.kind, h.hdr, payload)
		}
		if !done {
			break
		}
		in.cursor += uint64(size)
	}
	// Flow control: acknowledge consumed ring bytes once a quarter of the
	// ring is consumed, and at every heartbeat.
	if in.cursor-in.acked >= rs/4 || (in.cursor != in.acked && r.now >= r.nextHB) {
		r.links[i].ackDirty = true
	}
	if r.cfg.Trace != nil && r.accepted != acc && r.role == Follower && r.accepted.Cnt > 0 {
		r.tracef("node %d accepts up to %v", r.self, r.accepted)
	}
	return in.cursor != start
}

// acceptMsg is Acuerdo Fig. 5 l.47-53: normal message acceptance.
func (r *Replica) acceptMsg(sender rdma.NodeID, hdr MsgHdr, payload []byte) {
	// Acuerdo Fig. 5 l.47: only messages of the epoch we are in.
	if hdr.E != r.eNew || hdr.E != r.eCur || hdr.E < r.saves.asked || r.role != Follower || hdr.E.Leader() != sender || len(payload) < entryMeta ||
		len(payload) > entryMeta+maxProposal(r.cfg.MaxRecord) { // a member with another MaxRecord: never accepted, never in a diff of ours
		return
	}
	if hdr.E != r.accepted.E || hdr.Cnt != r.accepted.Cnt+1 {
		// Not the entry after our Accepted: an old one, or one after a
		// diff we refused (a snapshot we could not fetch, a stale base),
		// whose entries we do not hold. Accepting it would leave a hole
		// that commit would skip; our Accept_SST entry stays behind and
		// the leader syncs us again (serve: stalled).
		return
	}
	// Acuerdo Fig. 5 l.49-51: Log[hdr] = M; Accepted = hdr; Accept_SST[Self] = hdr.
	data, s := r.acceptCur.copy(&r.slabs, payload[entryMeta:])
	e := entry{hdr: hdr, id: getMeta(payload), data: data, slab: s}
	r.log.Set(e)
	r.accepted = hdr
	r.walAccept(&e) // Sync: the Entry record; acknowledged once synced (durable.go)
	// Fig. 5 l.52 (push to the leader) happens once per batch in push.
}

// acceptForward takes a proposal a follower forwarded to us as the leader
// of hdr.E. It reports false to leave it in the ring (back pressure).
func (r *Replica) acceptForward(hdr MsgHdr, payload []byte) bool {
	if r.role != Leader || hdr.E != r.eCur || !r.epochDone || len(payload) < entryMeta {
		return true // not for us: the follower re-forwards after the next epoch's diff
	}
	if len(payload) > entryMeta+maxProposal(r.cfg.MaxRecord) {
		r.tracef("node %d drops a forwarded proposal of %d bytes: its MaxRecord differs from ours", r.self, len(payload)-entryMeta)
		return true
	}
	if r.uncommitted() >= r.cfg.MaxUncommitted || r.diskLate() || r.fullRefuse {
		return false
	}
	data, s := r.acceptCur.copy(&r.slabs, payload[entryMeta:])
	r.broadcast(getMeta(payload), data, s)
	return true
}

// acceptSnapshot handles a snapshot announcement: fetch it (driveFetch)
// before looking further in the ring. A fetch that cannot succeed skips
// the announcement; the diff after it is then refused and the leader
// syncs us again. A later announcement of the same snapshot (the leader
// still holds it) is fetched anew: the failure skips only the record it
// came from.
func (r *Replica) acceptSnapshot(i int, hdr MsgHdr, payload []byte) bool {
	if len(payload) < snapRecLen {
		return true
	}
	l := r.links[i]
	mw := binary.LittleEndian.Uint64(payload[0:])
	metaID := rdma.RegionID(mw)
	size := binary.LittleEndian.Uint64(payload[8:])
	check := binary.LittleEndian.Uint64(payload[16:])
	commit := MsgHdr{E: Epoch(binary.LittleEndian.Uint64(payload[24:])), Cnt: binary.LittleEndian.Uint64(payload[32:])}
	if hdr.E < r.promised() || size < uint64(snapMetaSize(r.n)) || size > maxSnapMetaSize(r.n, r.cfg.MaxKeyedClients) || uint64(metaID) != mw {
		return true // Fig. 5 l.54 would refuse the diff it belongs to, or not a snapshot of this group
	}
	f := &l.fetch
	at := r.ins[i].cursor
	// A fetch of the same snapshot is kept (a re-announcement does not
	// throw a transfer away), unless it failed and this is a new
	// announcement: the leader re-synced us, and the skip of the failed
	// one must not be taken for this one (its diff would be refused for
	// ever; docs/broadcast.md, Beyond the paper: snapshots).
	if !f.active || f.metaID != metaID || f.metaCheck != check || f.commit != commit ||
		f.phase == fetchFailed && f.at != at {
		l.startFetch(metaID, int(size), check, commit)
	}
	f.at = at
	return f.phase >= fetchReady
}

// acceptDiffPart collects diff parts and accepts the diff on its last part.
// It reports false to leave the last part in the ring: the diff waits for
// the save of its E_new (acceptDiff), and is accepted when the part is
// read again at a later Poll.
func (r *Replica) acceptDiffPart(i int, sender rdma.NodeID, kind uint8, hdr MsgHdr, payload []byte) bool {
	in := &r.ins[i]
	if len(payload) < diffHdr {
		return true
	}
	base := MsgHdr{E: Epoch(binary.LittleEndian.Uint64(payload[0:])), Cnt: binary.LittleEndian.Uint64(payload[8:])}
	flags := binary.LittleEndian.Uint64(payload[16:])
	d := &in.diff
	if d.ended && kind == kDiffEnd && d.hdr == hdr && d.base == base && d.flags == flags {
		return r.retryDiff(i, sender, d) // its entries are in d already
	}
	r.ctr.DiffParts++
	if d.hdr != hdr || d.base != base || d.flags != flags || d.ended {
		*d = pendingDiff{hdr: hdr, base: base, flags: flags}
	}
	for p := payload[diffHdr:]; len(p) > 0; {
		e, size, ok := getDiffEntry(p)
		if !ok || len(e.data) > maxProposal(r.cfg.MaxRecord) {
			*d = pendingDiff{}
			return true
		}
		d.entries = append(d.entries, e)
		p = p[size:]
	}
	if kind == kDiffEnd {
		d.ended = true
		return r.retryDiff(i, sender, d)
	}
	return true
}

// retryDiff runs acceptDiff on an ended diff; the diff is dropped unless
// it waits for its E_new's save.
func (r *Replica) retryDiff(i int, sender rdma.NodeID, d *pendingDiff) bool {
	if !r.acceptDiff(i, sender, d) {
		return false
	}
	*d = pendingDiff{}
	return true
}

// acceptDiff is Acuerdo Fig. 5 l.54-66: diff acceptance and transition into
// broadcast, with the base fix of docs/broadcast.md: entries above the
// diff's base are removed, not only those from the diff's first key. It
// reports false while the diff waits for the save of its E_new.
func (r *Replica) acceptDiff(i int, sender rdma.NodeID, d *pendingDiff) bool {
	e := d.hdr.E
	// Acuerdo Fig. 5 l.54: accept unless we promised a bigger epoch (or,
	// rejoining without stable state, do not know yet what we promised).
	if e < r.promised() || e.Leader() != sender || r.recovering || d.hdr.Less(d.base) {
		return true // (a diff ends at or after its base: the leader sends none that does not)
	}
	l := r.links[i]
	f := &l.fetch
	ready := f.active && f.phase == fetchReady && f.commit == d.base
	useSnap := false
	if d.flags&diffSnapshot != 0 {
		if r.committed.Less(d.base) || d.flags&diffReset != 0 || r.knobs.snapRollback && ready {
			if !ready {
				return true // the snapshot did not arrive: the leader re-syncs us
			}
			useSnap = true
		}
	} else if r.committed.Less(d.base) {
		return true // a gap: the leader's view of our commit is stale; it re-syncs us
	}
	if e > r.eNew && !r.saveENew(e) {
		// A vote is recorded before it is published: E_new before the
		// accept. The diff's end stays in the ring until the save
		// completed (or, a synchronous save that failed, until the
		// next try).
		return false
	}
	var snapMetaBytes []byte
	if useSnap && r.dur != nil {
		snapMetaBytes = encodeSnapMeta(r.cfg.Members, f.meta) // before restore takes its tables
	}
	if useSnap {
		if err := r.restore(&f.meta, f.buf, d.base); err != nil {
			r.tracef("node %d: restore snapshot: %v", r.self, err)
			l.stopFetch()
			return true
		}
	}
	// Sync: the diff's records (a SnapMark naming its snapshot, if it
	// installs one, then its entries and its end), after the E_new save;
	// the snapshot goes to the disk snapshot store (durable.go).
	r.walDiff(d.hdr, d.base, d.entries, d.base, f.meta.index, snapMetaBytes, f.buf)
	l.stopFetch()
	// Acuerdo Fig. 5 l.58-60: E_new = E_cur = e; Role = FOLLOWER.
	newEpoch := e != r.eCur
	r.setENew(e)
	r.eCur = e
	if e.Leader() != r.self {
		r.role = Follower
	}
	// Acuerdo Fig. 5 l.62-63, with the base: remove entries above the base,
	// then insert the diff's entries.
	for {
		last, ok := r.log.Max()
		if !ok || !d.base.Less(last.hdr) {
			break
		}
		r.log.PopMax()
	}
	for _, en := range d.entries {
		r.log.Set(*en)
	}
	// Acuerdo Fig. 5 l.64: Accepted = hdr.
	r.accepted = d.hdr
	r.catchingUp = false
	if newEpoch {
		r.epochDone = false
	}
	r.setLeading()
	r.leaderHBAt = r.now
	r.leaderHB = r.mems[i].hb
	r.leaderInc = r.mems[i].inc
	r.ctr.DiffsAccepted++
	if newEpoch && r.role == Follower {
		r.event(EventFollower, e)
	}
	r.tracef("node %d accepts diff %v base %v with %d entries from node %d (snapshot %v)", r.self, d.hdr, d.base, len(d.entries), sender, useSnap)
	return true
}

// restore installs a fetched snapshot (meta m, state bytes) taken at
// commit point at.
func (r *Replica) restore(m *snapMeta, state []byte, at MsgHdr) error {
	if err := r.fsm.Restore(state); err != nil {
		return err
	}
	r.ctr.SnapshotsRestored++
	r.index = m.index
	r.table = m.table
	r.keys.restore(m.keys, r.cfg.MaxKeyedClients)
	r.committed = at
	r.log.Clear()
	r.pruned = at
	// Proposals of ours the snapshot covers were delivered; where is unknown.
	if t := r.table[r.me]; t.oinc == uint32(r.inc) {
		r.resolveThrough(t.pseq, 0, nil, nil)
	}
	return nil
}

// nextAfter returns the Log entry following h, or nil.
func (r *Replica) nextAfter(h MsgHdr) *entry {
	if i := r.log.above(h); i < r.log.Len() {
		return r.log.at(i)
	}
	return nil
}
