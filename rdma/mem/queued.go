package mem

import (
	"github.com/rdmakv/rdmakv/rdma"
)

// Queued mode. An op goes through two FIFO queues of its Conn:
//
//	Post ──► pending ──Land──► landed ──Complete──► CQ (initiator)
//	                   │
//	                   └ applied to the target's memory here
//
// The driver (package sim) calls Land when the op reaches the target and
// Complete when the acknowledgement reaches the initiator, each in FIFO
// order, so a completion implies every earlier op landed. The first op that
// fails at the target puts the Conn into the error state, as on an RC queue
// pair: later ops land as flushed (ErrConnBroken, no memory effect), and
// when the failed op's completion is returned everything still queued is
// flushed at once.

// ring is a FIFO over a circular buffer that grows by doubling: push and pop
// are O(1) (push amortized), truncate is O(dropped).
type ring[T any] struct {
	buf  []T // len is 0 or a power of two
	head int
	n    int
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)&(len(r.buf)-1)] }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		nb := make([]T, max(8, 2*len(r.buf)))
		for i := range r.n {
			nb[i] = *r.at(i)
		}
		r.buf, r.head = nb, 0
	}
	*r.at(r.n) = v
	r.n++
}

func (r *ring[T]) pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	p := r.at(0)
	v := *p
	*p = zero
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return v, true
}

// truncate keeps the first keep elements.
func (r *ring[T]) truncate(keep int) {
	var zero T
	for r.n > max(keep, 0) {
		r.n--
		*r.at(r.n) = zero
	}
}

// landedOp is an op applied at the target whose completion has not been
// returned to the initiator yet.
type landedOp struct {
	cp       rdma.Completion
	signaled bool
	region   rdma.RegionID
	offset   uint64
	n        int
}

// queue is a Conn's queued-mode state; the Conn's mu guards it.
type queue struct {
	pending ring[rdma.WR]
	landed  ring[landedOp]
	flush   error // set when an op failed at the target: later ops are flushed
}

func (q *queue) outstanding() int { return q.pending.len() + q.landed.len() }

func (q *queue) discard() {
	q.pending.truncate(0)
	q.landed.truncate(0)
}

// postQueued queues wr; c.mu is held and is released here (the OnPost hook
// runs unlocked, so it may look at the Conn). Every outstanding op yields at
// most one completion, so bounding outstanding ops plus unpolled completions
// by the queue depth means no completion is ever dropped: the poster gets
// ErrQueueFull instead.
func (c *Conn) postQueued(wr rdma.WR) error {
	if c.q.outstanding()+c.cq.Len() >= c.from.f.opts.QueueDepth {
		c.mu.Unlock()
		return rdma.ErrQueueFull
	}
	c.q.pending.push(wr)
	c.mu.Unlock()
	if h := c.from.f.opts.OnPost; h != nil {
		h(c)
	}
	return nil
}

func (c *Conn) opError(wr *rdma.WR, cause error) rdma.Completion {
	return rdma.Completion{ID: wr.ID, Kind: wr.Kind, Err: &rdma.OpError{Op: wr.Kind, Peer: c.to.id, Region: wr.Region, Offset: wr.Offset, Len: wr.Len(), Err: cause}}
}

// Pending is the number of posted ops that have not landed yet (queued
// mode).
func (c *Conn) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.q.pending.len()
}

// Landed is the number of ops that landed at the target and whose
// completion has not been returned yet (queued mode).
func (c *Conn) Landed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.q.landed.len()
}

// Head returns the oldest op that has not landed yet (queued mode).
func (c *Conn) Head() (rdma.WR, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q.pending.len() == 0 {
		return rdma.WR{}, false
	}
	return *c.q.pending.at(0), true
}

// Land applies the oldest pending op at the target and queues its
// completion for Complete (queued mode). It returns the op, its completion
// (Err set if the op failed at the target or was flushed because an earlier
// one failed) and whether there was an op. A Notify write rings the target's
// doorbell. On a closed Conn the op is discarded.
func (c *Conn) Land() (rdma.WR, rdma.Completion, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wr, ok := c.q.pending.pop()
	if !ok || c.closed {
		return wr, rdma.Completion{}, ok
	}
	var cp rdma.Completion
	if c.q.flush != nil {
		cp = c.opError(&wr, rdma.ErrConnBroken)
	} else {
		cp = c.exec(&wr)
		if cp.Err != nil {
			c.q.flush = cp.Err
		}
	}
	c.q.landed.push(landedOp{cp: cp, signaled: wr.Flags&rdma.Signaled != 0, region: wr.Region, offset: wr.Offset, n: wr.Len()})
	return wr, cp, true
}

// LandPrefix applies the first n bytes (rounded down to whole 8-byte
// words) of the oldest pending op, if it is a write longer than that, and
// leaves the op queued: a later Land applies all of it. Between the two a
// reader at the target sees the write torn, as a real NIC may show it. It
// reports whether a prefix was applied; permission and bounds are checked
// as for Land, and a failing op is left for Land to report.
func (c *Conn) LandPrefix(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n &^= 7
	if c.closed || c.q.flush != nil || c.q.pending.len() == 0 || n <= 0 {
		return false
	}
	wr := *c.q.pending.at(0)
	if wr.Kind != rdma.OpWrite || n >= len(wr.Buf) || c.to.Closed() {
		return false
	}
	r := c.to.region(wr.Region)
	if r == nil {
		return false
	}
	wr.Buf = wr.Buf[:n]
	wr.Flags &^= rdma.Notify
	_, err := r.Apply(c.from.id, &wr)
	return err == nil
}

// PeekHead performs the oldest pending op, if it is a read of len(dst)
// bytes, into dst instead of its own buffer, and leaves it queued: dst
// holds what the read would return now, and a later Land performs it for
// real. The simulator uses it to let a read see the target's memory from
// two moments (sim Options.ReadOverlap). It reports whether it read;
// permission and bounds are checked as for Land.
func (c *Conn) PeekHead(dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.q.flush != nil || c.q.pending.len() == 0 {
		return false
	}
	wr := *c.q.pending.at(0)
	if wr.Kind != rdma.OpRead || len(dst) != len(wr.Buf) || c.to.Closed() {
		return false
	}
	r := c.to.region(wr.Region)
	if r == nil {
		return false
	}
	wr.Buf = dst
	_, err := r.Apply(c.from.id, &wr)
	return err == nil
}

// Complete returns the oldest landed op's completion to the initiator
// (queued mode): it is pushed to the completion queue if the op was
// signaled or failed. It returns the completion, whether it was pushed, and
// whether there was one. The first error breaks the Conn and flushes every
// op still queued with ErrConnBroken.
func (c *Conn) Complete() (cp rdma.Completion, pushed, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	op, ok := c.q.landed.pop()
	if !ok || c.closed {
		return op.cp, false, ok
	}
	if op.cp.Err == nil {
		if op.signaled {
			c.cq.Push(op.cp)
		}
		return op.cp, op.signaled, true
	}
	if c.err == nil {
		c.err = op.cp.Err
	}
	c.cq.Push(op.cp)
	c.failLocked(rdma.ErrConnBroken)
	return op.cp, true, true
}

// Deliver lands the oldest queued op at the target and returns every landed
// completion to the initiator (queued mode). It reports whether there was an
// op. After an error the Conn is broken and the rest of the queue fails with
// ErrConnBroken, as on an RC queue pair.
func (c *Conn) Deliver() bool {
	if _, _, ok := c.Land(); !ok {
		return false
	}
	for {
		if _, _, ok := c.Complete(); !ok {
			return true
		}
	}
}

// FailPending fails every queued op, landed or not, with cause (a partition
// timed out, the target died) and breaks the Conn. Ops that already landed
// keep their effect at the target; only their acknowledgement is lost.
func (c *Conn) FailPending(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = cause
	}
	c.failLocked(cause)
}

// failLocked fails everything queued with cause; c.mu is held.
func (c *Conn) failLocked(cause error) {
	if c.q.flush == nil {
		c.q.flush = cause
	}
	if c.closed {
		c.q.discard()
		return
	}
	for {
		op, ok := c.q.landed.pop()
		if !ok {
			break
		}
		cp := op.cp
		if cp.Err == nil {
			cp.Err = &rdma.OpError{Op: cp.Kind, Peer: c.to.id, Region: op.region, Offset: op.offset, Len: op.n, Err: cause}
		}
		c.cq.Push(cp)
	}
	for {
		wr, ok := c.q.pending.pop()
		if !ok {
			break
		}
		c.cq.Push(c.opError(&wr, cause))
	}
}

// DropPending keeps the first keep ops that have not landed and silently
// discards the rest: the initiator crashed and only a prefix of its ops
// left its NIC.
func (c *Conn) DropPending(keep int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.q.pending.truncate(keep)
}

// Target is the node c's ops land on.
func (c *Conn) Target() *Node { return c.to }

// Initiator is the node that posts on c.
func (c *Conn) Initiator() *Node { return c.from }

// Crash kills the node abruptly (queued mode). Like Close, the node leaves
// the fabric, its regions stop accepting ops and its id may be reused by a
// new node (a restart); unlike Close, its Conns stay open, so ops still
// queued on them (trim them first with DropPending) keep landing at their
// targets, and region memory stays mapped until Release, because those ops'
// buffers may point into it. Ops targeting the node fail with
// rdma.ErrPeerDead.
func (n *Node) Crash() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	regions := n.regions
	n.regions = map[rdma.RegionID]*Region{}
	for _, r := range regions {
		r.Shut()
		n.crashed = append(n.crashed, r)
	}
	n.conns = nil
	n.mu.Unlock()
	n.f.mu.Lock()
	if n.f.nodes[n.id] == n {
		delete(n.f.nodes, n.id)
	}
	n.f.mu.Unlock()
	n.db.Ring()
}

// Release frees the memory of a crashed node's regions. Call it once no op
// queued before the crash can land any more.
func (n *Node) Release() error {
	n.mu.Lock()
	crashed := n.crashed
	n.crashed = nil
	n.mu.Unlock()
	var first error
	for _, r := range crashed {
		if err := r.Free(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
