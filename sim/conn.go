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
	c.landAt.pop()
	wr, cp, ok := c.c.Land()
	if !ok {
		c.sync()
		return
	}
	seq := c.landed
	c.landed++
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
