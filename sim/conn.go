package sim

import (
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// conn is the scheduler's side of one mem.Conn in queued mode. Each op gets
// a landing time when posted and a completion time when it lands; both are
// at least those of the op before it, so the Conn stays FIFO. One itLand
// item is scheduled for the head of the pending queue and one itComplete
// for the head of the landed queue; a new generation number invalidates
// an item when its queue changes under it.
type conn struct {
	id       uint64
	ref      int32 // index in Sim.connTab
	c        *mem.Conn
	from, to *node
	toGen    uint64 // the target's generation when connected: its incarnation
	closed   bool   // closed by its process
	orphan   bool   // its initiator crashed: ops may land, nobody polls

	landAt, doneAt     times         // due times of pending and landed ops
	lastLand, lastDone time.Duration // FIFO floors
	posted, landed     uint64        // op sequence numbers: next to post, next to land
	completed          uint64        // next to complete

	landGen, doneGen     uint64
	landSched, doneSched bool
	landHeld, doneHeld   time.Duration // since when the head is held (-1: not held)
	torn                 bool          // the head write's prefix has landed
	overlap              bool          // the head read is held at the target (Options.ReadOverlap)
	old                  []byte        // what the held read would have returned when it arrived
	chained              bool          // the held read was posted behind one that landed at a Yield
}

// posted schedules the op just queued on c.
func (s *Sim) posted(c *conn, wr *rdma.WR) {
	at := max(s.now+s.delay(c.from, c.to), c.lastLand)
	c.lastLand = at
	c.landAt.push(at)
	s.record(Event{Kind: EvPost, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: c.posted,
		Op: wr.Kind, Region: wr.Region, Offset: wr.Offset, Len: wr.Len()})
	c.posted++
	if !c.landSched && c.landHeld < 0 {
		s.scheduleLand(c, at)
	}
}

func (s *Sim) scheduleLand(c *conn, at time.Duration) {
	c.landGen++
	c.landSched = true
	s.agenda.push(item{at: max(at, s.now), kind: itLand, ref: c.ref, gen: c.landGen})
}

func (s *Sim) scheduleDone(c *conn, at time.Duration) {
	c.doneGen++
	c.doneSched = true
	s.agenda.push(item{at: max(at, s.now), kind: itComplete, ref: c.ref, gen: c.doneGen})
}

// sync catches up with queues the mem Conn emptied when its process closed
// it. (Flushes after errors are accounted where they happen.)
func (c *conn) sync() {
	if !c.closed {
		return
	}
	if c.c.Pending() < c.landAt.len() {
		c.landAt.truncate(0)
		c.landed = c.posted
		c.torn = false
		c.landHeld = -1
		c.unhold()
	}
	if c.c.Landed() < c.doneAt.len() {
		c.doneAt.truncate(0)
		c.completed = c.landed
		c.doneHeld = -1
	}
}

// reachable reports whether c's ops can reach the target now.
func (s *Sim) reachable(c *conn) bool {
	return !s.cut[c.from.idx][c.to.idx] && c.to.live && c.to.gen == c.toGen
}

// land handles c's itLand: the head op lands, or is torn, or is held.
func (s *Sim) land(c *conn) {
	c.sync()
	if c.landAt.len() == 0 {
		return
	}
	if !s.reachable(c) {
		c.unhold()
		if c.landHeld < 0 {
			c.landHeld = s.now
		}
		if s.now-c.landHeld >= s.opts.FabricTimeout {
			s.failConn(c)
			return
		}
		s.scheduleLand(c, c.landHeld+s.opts.FabricTimeout)
		return
	}
	c.landHeld = -1
	if c.overlap {
		s.landHeldRead(c) // its span is over
		return
	}
	if s.opts.ReadOverlap > 0 && s.rng.Float64() < s.opts.ReadOverlap && s.holdRead(c) {
		return
	}
	if !c.torn && s.opts.TearProb > 0 && s.rng.Float64() < s.opts.TearProb {
		if wr, ok := c.c.Head(); ok && wr.Kind == rdma.OpWrite && len(wr.Buf) > 8 {
			n := 8 * (1 + s.rng.IntN((len(wr.Buf)-1)/8))
			if c.c.LandPrefix(n) {
				c.torn = true
				s.record(Event{Kind: EvTear, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: c.landed,
					Op: wr.Kind, Region: wr.Region, Offset: wr.Offset, Len: n})
				s.wake(c.to)
				l := s.opts.StepLatency * time.Duration(max(c.to.slow, 1))
				s.scheduleLand(c, s.now+uniform(s.rng, l/4, 2*l))
				return
			}
		}
	}
	c.torn = false
	s.landHead(c)
}

// landHead lands c's head op and schedules its completion and the next
// op's landing.
func (s *Sim) landHead(c *conn) {
	c.landAt.pop()
	wr, cp, ok := c.c.Land()
	if !ok {
		c.sync()
		return
	}
	seq := c.landed
	c.landed++
	if c.overlap {
		s.mixHeld(c, &wr, cp.Err)
	}
	s.record(Event{Kind: EvLand, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: seq,
		Op: wr.Kind, Region: wr.Region, Offset: wr.Offset, Len: wr.Len(), Err: cp.Err})
	if wr.Kind != rdma.OpRead && cp.Err == nil {
		s.wake(c.to)
	}
	at := max(s.now+s.delay(c.to, c.from), c.lastDone)
	c.lastDone = at
	c.doneAt.push(at)
	if !c.doneSched && c.doneHeld < 0 {
		s.scheduleDone(c, at)
	}
	if c.landAt.len() > 0 {
		s.scheduleLand(c, c.landAt.front())
	}
}

// complete handles c's itComplete: the head completion returns, or is held.
func (s *Sim) complete(c *conn) {
	c.sync()
	if c.doneAt.len() == 0 {
		return
	}
	if !c.orphan && s.cut[c.to.idx][c.from.idx] {
		if c.doneHeld < 0 {
			c.doneHeld = s.now
		}
		if s.now-c.doneHeld >= s.opts.FabricTimeout {
			s.failConn(c)
			return
		}
		s.scheduleDone(c, c.doneHeld+s.opts.FabricTimeout)
		return
	}
	c.doneHeld = -1
	c.doneAt.pop()
	cp, pushed, ok := c.c.Complete()
	if !ok {
		c.sync()
		return
	}
	seq := c.completed
	c.completed++
	s.record(Event{Kind: EvComplete, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: seq, Op: cp.Kind, Err: cp.Err})
	if cp.Err != nil {
		// The Conn broke: mem flushed every later op.
		if c.completed < c.posted {
			s.record(Event{Kind: EvFail, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: c.completed, Err: rdma.ErrConnBroken})
		}
		s.drained(c)
	}
	if pushed && !c.orphan {
		s.wake(c.from)
	}
	if c.doneAt.len() > 0 {
		s.scheduleDone(c, c.doneAt.front())
	}
}

// failConn fails every op of c not completed yet with rdma.ErrPeerDead:
// its target stayed unreachable for the fabric timeout.
func (s *Sim) failConn(c *conn) {
	c.c.FailPending(rdma.ErrPeerDead)
	s.record(Event{Kind: EvFail, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: c.completed, Err: rdma.ErrPeerDead})
	s.drained(c)
	if !c.orphan {
		s.wake(c.from)
	}
}

// drained resets c's queues after mem failed everything on it.
func (s *Sim) drained(c *conn) {
	c.landAt.truncate(0)
	c.doneAt.truncate(0)
	c.landed, c.completed = c.posted, c.posted
	c.landHeld, c.doneHeld = -1, -1
	c.torn = false
	c.unhold()
	c.landGen++
	c.doneGen++
	c.landSched, c.doneSched = false, false
}

// idle reports whether c has nothing queued and never will again.
func (c *conn) idle() bool {
	return (c.orphan || c.closed || c.c.Err() != nil) && c.landAt.len() == 0 && c.doneAt.len() == 0
}

// retryHeld reschedules every held queue at once, after a link healed.
// Idle conns are forgotten here.
func (s *Sim) retryHeld() {
	live := s.conns[:0]
	for _, c := range s.conns {
		if c.idle() {
			continue
		}
		live = append(live, c)
		if c.landHeld >= 0 {
			s.scheduleLand(c, s.now)
		}
		if c.doneHeld >= 0 {
			s.scheduleDone(c, s.now)
		}
	}
	clear(s.conns[len(live):])
	s.conns = live
}

// Overlapping reads (Options.ReadOverlap). A real one-sided read is not an
// instant: the NIC copies the target's memory while the target's CPU may
// be storing to it, and each aligned 8-byte word is read whole, some before
// a store and some after. Without this mode a read lands between two steps
// of the target and sees every step whole.
//
// A held read arrived at the target but has not landed: holdRead copies
// what it would have returned then (old). It lands at a Yield of one of the
// target's later steps (Env.Yield: the process says its stores so far may
// be seen), or at the latest ReadOverlapSpan after it arrived, between
// steps. It then returns, word by word, either what the target's memory
// holds at that moment or the old word, each choice drawn from the seed.
// Reads on one Conn still happen in order: the ops behind a held read wait
// for it, and a read posted behind it is held from the moment it lands
// (within the same step, if it landed at a Yield), as a NIC runs a posted
// list back to back. So what a list of reads sees moves forward in the
// target's store order, as the protocols assume of a Conn, while each read
// may see any mix of the moments it spans.
//
// Where a held read lands is biased toward the interesting moments: at a
// Yield where the memory it covers changed since it was held, or when it
// follows a read that just landed, it lands with probability 1/2; at any
// other Yield with 1/yieldSpread, so that most reads wait for a store to
// their range (or their span's end) rather than land at the first Yield.

// yieldSpread: a held read lands at a Yield where nothing it covers
// changed with probability 1/yieldSpread.
const yieldSpread = 64

// holdRead holds c's head op if it is a read the target can serve now.
func (s *Sim) holdRead(c *conn) bool {
	wr, ok := c.c.Head()
	if !ok || wr.Kind != rdma.OpRead || len(wr.Buf) < 8 {
		return false
	}
	if cap(c.old) < len(wr.Buf) {
		c.old = make([]byte, len(wr.Buf))
	}
	c.old = c.old[:len(wr.Buf)]
	if !c.c.PeekHead(c.old) {
		return false
	}
	c.overlap, c.chained = true, false
	c.to.held = append(c.to.held, c)
	s.record(Event{Kind: EvHold, Node: c.from.id, Peer: c.to.id, Conn: c.id, Seq: c.landed,
		Op: wr.Kind, Region: wr.Region, Offset: wr.Offset, Len: wr.Len()})
	span := s.opts.ReadOverlapSpan
	s.scheduleLand(c, s.now+uniform(s.rng, span/4, span))
	return true
}

// unhold forgets c's held read (its Conn failed or its target crashed); the
// op itself stays queued, or was failed, by the caller.
func (c *conn) unhold() {
	if !c.overlap {
		return
	}
	c.overlap = false
	l := c.to.held
	for i, o := range l {
		if o == c {
			c.to.held = append(l[:i], l[i+1:]...)
			break
		}
	}
}

// landHeldRead lands c's held read now.
func (s *Sim) landHeldRead(c *conn) {
	s.landHead(c)
	c.unhold()
	if c.landAt.len() == 0 {
		c.landGen++ // the span's landing item is void
		c.landSched = false
	}
}

// mixHeld gives back, in each word of the held read that changed since it
// arrived, the old word or the new one, as the seed draws.
func (s *Sim) mixHeld(c *conn, wr *rdma.WR, err error) {
	if err != nil || len(c.old) != len(wr.Buf) {
		return
	}
	n := 0
	for i := 0; i+8 <= len(wr.Buf); i += 8 {
		o, b := c.old[i:i+8], wr.Buf[i:i+8]
		if string(o) != string(b) && s.rng.IntN(2) == 0 {
			copy(b, o)
			n++
		}
	}
	if n > 0 {
		s.overlapMixed++
	}
}

// yield lands held reads at node n, which is inside a step (Env.Yield).
func (s *Sim) yield(n *node) {
	for i := 0; i < len(n.held); {
		c := n.held[i]
		// A read that arrived between steps lands at one Yield in
		// yieldSpread, so that it may overlap a later step than the
		// first; one posted behind a read that just landed follows it
		// closely, as a NIC runs a list back to back.
		p := yieldSpread
		if c.chained || s.heldChanged(c) {
			p = 2
		}
		if !s.reachable(c) || s.rng.IntN(p) != 0 {
			i++
			continue
		}
		s.landHeldRead(c) // removes c from n.held
		// A read posted behind it goes on at once, as a NIC runs
		// a posted list back to back: it is held from here on,
		// within this step.
		if c.landAt.len() > 0 {
			if wr, ok := c.c.Head(); ok && wr.Kind == rdma.OpRead && s.holdRead(c) {
				c.chained = true // appended: it may land at a later Yield
			}
		}
	}
}

// heldChanged reports whether the memory c's held read covers changed
// since it was held: the Yields worth landing at.
func (s *Sim) heldChanged(c *conn) bool {
	if cap(s.peek) < len(c.old) {
		s.peek = make([]byte, len(c.old))
	}
	b := s.peek[:len(c.old)]
	return c.c.PeekHead(b) && string(b) != string(c.old)
}
