package broadcast

import (
	"context"
	"sync"
	"time"
)

// Proposal is the handle of one proposed message. It resolves exactly once:
// delivered at Index (Err nil) with the result this replica's FSM.Apply
// returned for it (Reply), or failed with an error that says whether the
// message may still be delivered (only ErrStopped leaves it unknown).
//
// Handles are carved from per-replica slabs, their copies of the data from
// reused data slabs (arena.go; released when the proposal resolves), the
// copies of their results from small chunks (replyArena), and the Done
// channel is made only when asked for, so a proposal costs no allocation
// of its own (a retained handle keeps its handle slab and its result's
// chunk alive).
type Proposal struct {
	data     []byte
	pseq     uint64
	key      Key           // ProposeKeyed's (zero: unkeyed)
	epoch    Epoch         // epoch it was handed to (inflight)
	deadline time.Duration // set when the replica first sees it
	cb       func(index uint64, result []byte, err error)
	slab     *slab // holds data, with a reference for this proposal

	mu       sync.Mutex
	resolved bool
	done     chan struct{} // made on demand by Done
	index    uint64
	reply    []byte // a copy of the FSM's result (handles without a callback only)
	err      error
}

// Done returns a channel that is closed once the proposal is resolved.
func (p *Proposal) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		p.done = make(chan struct{})
		if p.resolved {
			close(p.done)
		}
	}
	return p.done
}

// result reports the outcome if the proposal is resolved.
func (p *Proposal) result() (index uint64, err error, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.index, p.err, p.resolved
}

// Result returns the index the message was delivered at and nil, or the
// error. Index 0 with a nil error means delivered, but this replica caught
// up through a snapshot and does not know where. It blocks until the
// proposal is resolved.
func (p *Proposal) Result() (uint64, error) {
	if i, err, ok := p.result(); ok {
		return i, err
	}
	<-p.Done()
	i, err, _ := p.result()
	return i, err
}

// Reply returns the result FSM.Apply returned, at this replica, for the
// entry the proposal was delivered as: nil until the proposal resolved,
// when it failed, when Apply returned nil, and when Result reports index 0
// (this replica skipped the entry by restoring a snapshot, so its FSM did
// not compute the result). A keyed proposal delivered as a duplicate
// (ProposeKeyed) gets the original delivery's result, nil if it was
// longer than 1 KiB. The bytes are the proposal's own copy (they do
// not alias the FSM's memory); they must not be modified.
func (p *Proposal) Reply() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reply
}

// Wait blocks until the proposal resolves or ctx ends, and returns Result.
func (p *Proposal) Wait(ctx context.Context) (uint64, error) {
	if i, err, ok := p.result(); ok {
		return i, err
	}
	select {
	case <-p.Done():
		i, err, _ := p.result()
		return i, err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// finish resolves the proposal. result is the FSM's result for a
// delivered proposal: the callback gets it as it is (valid during the
// callback); a handle without a callback keeps it, so it must then be the
// proposal's own copy (resolveThrough copies it).
func (p *Proposal) finish(index uint64, result []byte, err error) {
	p.slab.unref() // the data is not used once the proposal resolved
	p.slab, p.data = nil, nil
	p.mu.Lock()
	p.index, p.err = index, err
	if p.cb == nil {
		p.reply = result
	}
	p.resolved = true
	if p.done != nil {
		close(p.done)
	}
	p.mu.Unlock()
	if p.cb != nil {
		p.cb(index, result, err)
	}
}

// propSlab is how many proposal handles are carved from one allocation
// (their data copies live in the replica's data slabs, arena.go).
const propSlab = 128

// Propose submits data for atomic broadcast and returns its handle. It is
// safe from any goroutine; the replica takes it on its next Poll (Propose
// rings the node's doorbell when the replica's inbox was empty). At a
// follower the proposal is forwarded to the leader; during an election it
// waits, up to ProposeTimeout, for a leader. data is copied.
func (r *Replica) Propose(data []byte) *Proposal {
	return r.propose(Key{}, data, nil)
}

// ProposeFunc is Propose with a completion callback instead of a handle to
// wait on: done is called exactly once with the outcome Proposal.Result
// would report and the result Proposal.Reply would (FSM.Apply's result at
// this replica; nil on failure), from the goroutine that polls the replica
// (from ProposeFunc itself when the proposal fails at once, from Close with
// ErrStopped). result is the FSM's own memory, not a copy: it is valid
// only during the callback. done must not block and must not call Poll;
// it may call Propose or ProposeFunc.
func (r *Replica) ProposeFunc(data []byte, done func(index uint64, result []byte, err error)) {
	r.propose(Key{}, data, done)
}

// MaxProposal is the largest data Propose accepts (Config.MaxRecord-64
// bytes): one that fits every record that may carry it (a message, a
// forwarded proposal, a diff part after an election).
func (r *Replica) MaxProposal() int { return maxProposal(r.cfg.MaxRecord) }

// propose submits data, keyed unless key is zero (proposeKeyed checked it).
func (r *Replica) propose(key Key, data []byte, cb func(uint64, []byte, error)) *Proposal {
	if len(data) > maxProposal(r.cfg.MaxRecord) {
		p := &Proposal{cb: cb}
		p.finish(0, nil, ErrTooLarge)
		return p
	}
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		p := &Proposal{cb: cb}
		p.finish(0, nil, ErrStopped)
		return p
	case r.npending.Load() >= int64(r.cfg.MaxPending):
		r.mu.Unlock()
		p := &Proposal{cb: cb}
		p.finish(0, nil, ErrBusy)
		return p
	}
	if len(r.propSlab) == 0 {
		r.propSlab = make([]Proposal, propSlab)
	}
	p := &r.propSlab[0]
	r.propSlab = r.propSlab[1:]
	p.cb = cb
	if key != (Key{}) {
		var kb [keyLen]byte
		putKey(kb[:], key)
		p.key = key
		p.data, p.slab = r.propCur.copy2(&r.slabs, kb[:], data)
	} else {
		p.data, p.slab = r.propCur.copy(&r.slabs, data)
	}
	r.npending.Add(1) // under mu: proposers check and add in turn; Poll only subtracts
	r.inbox = append(r.inbox, p)
	first := len(r.inbox) == 1
	r.inboxLen.Store(int64(len(r.inbox)))
	r.mu.Unlock()
	if first {
		// A parked driver polls at once. Later proposals find the inbox
		// non-empty: the ring of the first is still due, or the driver
		// has not drained the inbox since it last looked at the doorbell.
		r.node.Doorbell().Ring()
	}
	return p
}

// drainInbox moves new proposals to the waiting queue.
func (r *Replica) drainInbox() bool {
	if r.inboxLen.Load() == 0 {
		return false
	}
	r.mu.Lock()
	in := r.inbox
	r.inbox, r.inboxSpare = r.inboxSpare[:0], in // the two slices take turns
	r.inboxLen.Store(0)
	r.mu.Unlock()
	for _, p := range in {
		r.pseq++
		p.pseq = r.pseq
		p.deadline = r.now + r.cfg.ProposeTimeout
		r.waiting = append(r.waiting, p)
	}
	clear(in) // in is the spare now: only this goroutine touches it until the next drain
	return len(in) > 0
}

func (r *Replica) resolved(k int) { r.npending.Add(-int64(k)) }

// resolveThrough resolves the in-flight proposals up to pseq as delivered:
// proposals of one replica are delivered in pseq order (they are handed to
// one epoch's leader at a time, in order, only once the fate of all earlier
// ones is known), so the delivered ones form a prefix. The one at pseq was
// delivered at index with the FSM's result (nil for a snapshot's), or,
// keyed, found a duplicate (err ErrDuplicate, or the original's index and
// result); the earlier ones were skipped by a snapshot (index 0, no
// result).
func (r *Replica) resolveThrough(pseq, index uint64, result []byte, err error) {
	k := 0
	for k < len(r.inflight) && r.inflight[k].pseq <= pseq {
		p := r.inflight[k]
		if p.pseq == pseq {
			if p.cb == nil && result != nil {
				p.finish(index, r.replies.copy(result), err)
			} else {
				p.finish(index, result, err)
			}
		} else {
			p.finish(0, nil, nil)
		}
		k++
	}
	if k > 0 {
		r.inflight = dropFront(r.inflight, k)
		r.resolved(k)
	}
}

// id names the proposal in its entry: keyedBit marks a keyed one, whose
// data starts with its key.
func (p *Proposal) id(r *Replica) proposalID {
	id := proposalID{origin: r.self, oinc: uint32(r.inc), pseq: p.pseq}
	if p.key != (Key{}) {
		id.pseq |= keyedBit
	}
	return id
}

// dropFront removes the first k proposals of q. A queue it empties keeps
// its backing array, so that a steady trickle of proposals appends without
// allocating.
func dropFront(q []*Proposal, k int) []*Proposal {
	clear(q[:k])
	if k == len(q) {
		return q[:0]
	}
	return q[k:]
}

// newEpochCommitted runs once the diff of a new epoch committed here: every
// entry of earlier epochs that will ever be delivered has been, so
// proposals handed to earlier epochs and not delivered never will be; they
// go back to the front of the waiting queue (docs/broadcast.md, "Proposals").
func (r *Replica) newEpochCommitted() {
	k := 0
	for k < len(r.inflight) && r.inflight[k].epoch < r.eCur {
		k++
	}
	if k == 0 {
		return
	}
	r.ctr.Requeued += uint64(k)
	back := r.inflight[:k:k]
	r.inflight = r.inflight[k:]
	r.waiting = append(back, r.waiting...)
}

// submit hands waiting proposals to the leader: broadcast them if we lead
// (Acuerdo Fig. 4), else forward them through our ring to the leader. Only
// once this epoch's diff committed here, so that delivery follows pseq order.
func (r *Replica) submit() bool {
	if len(r.waiting) > 0 && r.role == Leader && r.fullRefuse {
		// The group cannot log them (durable.go), also before our
		// epoch's diff committed: they were never broadcast, so they
		// are not delivered.
		for _, p := range r.waiting {
			p.finish(0, nil, ErrDiskFull)
		}
		r.ctr.DiskFullRefused += uint64(len(r.waiting))
		r.resolved(len(r.waiting))
		clear(r.waiting)
		r.waiting = r.waiting[:0]
		return true
	}
	if len(r.waiting) == 0 || !r.epochDone || r.role == Electing {
		return false
	}
	k := 0
	switch r.role {
	case Leader:
		for k < len(r.waiting) && r.uncommitted() < r.cfg.MaxUncommitted && !r.diskLate() {
			p := r.waiting[k]
			p.epoch = r.eCur
			p.slab.ref() // the Log's; the proposal keeps its own until it resolves
			r.broadcast(p.id(r), p.data, p.slab)
			k++
		}
	case Follower:
		l := r.links[r.idxOf(r.eCur.Leader())]
		if l.out.rinc == 0 {
			return false
		}
		for k < len(r.waiting) {
			p := r.waiting[k]
			size := recSize(entryMeta + len(p.data))
			if !l.out.room(size) {
				break
			}
			buf := l.out.reserve(size, r.inc)
			putMeta(buf[recHdr:], p.id(r))
			copy(buf[recHdr+entryMeta:], p.data)
			l.out.commitRecord(recHeader{len: entryMeta + len(p.data), kind: kForward, hdr: MsgHdr{E: r.eCur}}, r.inc)
			p.epoch = r.eCur
			k++
		}
	}
	if k == 0 {
		return false
	}
	r.inflight = append(r.inflight, r.waiting[:k]...)
	r.waiting = dropFront(r.waiting, k)
	return true
}

// expireWaiting fails waiting proposals past their deadline with
// ErrTimeout: they were never handed to a leader, or the epoch they were
// handed to ended without delivering them, so they are not delivered.
func (r *Replica) expireWaiting() bool {
	if len(r.waiting) == 0 || r.waiting[0].deadline > r.now {
		return false
	}
	kept := r.waiting[:0]
	k := 0
	for _, p := range r.waiting {
		if p.deadline <= r.now {
			p.finish(0, nil, ErrTimeout)
			k++
		} else {
			kept = append(kept, p)
		}
	}
	clear(r.waiting[len(kept):])
	r.waiting = kept
	r.resolved(k)
	return k > 0
}
