package sim

import (
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Faults configure the random fault schedule drawn from the seed. The zero
// value (Until == 0) injects no random faults; scripted faults (Crash,
// Restart, Cut, ... called from At or between runs) work either way.
type Faults struct {
	// Until is the virtual time up to which faults start. At Until every
	// fault still in effect ends: crashed nodes restart with their disk,
	// cut links heal, slow nodes recover. Zero disables random faults.
	Until time.Duration
	// Every is the mean gap between the starts of two faults. Default 2ms.
	Every time.Duration
	// Crash, Partition and Slow weigh the kinds of fault. All zero means
	// equal weights; a zero weight with another non-zero disables a kind.
	Crash, Partition, Slow int
	// MaxDown bounds how many nodes are crashed at once. Default 1.
	MaxDown int
	// Duration bounds how long one fault lasts (a node's down time, a
	// partition, a slow spell): uniform in [Duration/4, Duration].
	// Default 4ms.
	Duration time.Duration
	// LoseDisk is the probability that a crashed node restarts with an
	// empty disk. Default 0: disks survive crashes.
	LoseDisk float64
	// MaxSlow bounds a slow node's factor, drawn in [2, MaxSlow].
	// Default 10.
	MaxSlow int
}

func (f *Faults) setDefaults() {
	if f.Every <= 0 {
		f.Every = 2 * time.Millisecond
	}
	if f.Crash == 0 && f.Partition == 0 && f.Slow == 0 {
		f.Crash, f.Partition, f.Slow = 1, 1, 1
	}
	if f.MaxDown <= 0 {
		f.MaxDown = 1
	}
	if f.Duration <= 0 {
		f.Duration = 4 * time.Millisecond
	}
	if f.MaxSlow < 2 {
		f.MaxSlow = 10
	}
}

// faultState is the random fault schedule's bookkeeping.
type faultState struct {
	healed bool // Until has passed and every fault ended
}

func (s *Sim) node(id rdma.NodeID) (*node, error) {
	n := s.byID[id]
	if n == nil {
		return nil, fmt.Errorf("sim: node %d: %w", id, ErrNoNode)
	}
	return n, nil
}

// Crash kills node id at once: it stops stepping, its memory is gone, and
// of the ops it had queued on each Conn a random prefix (drawn from the
// seed) still lands, never anything else. Its peers' ops to it fail with
// rdma.ErrPeerDead after the fabric timeout. Its disk survives.
func (s *Sim) Crash(id rdma.NodeID) error {
	n, err := s.node(id)
	if err != nil {
		return err
	}
	if !n.live {
		return fmt.Errorf("sim: crash node %d: it is down: %w", id, ErrNodeState)
	}
	for _, c := range n.conns {
		c.sync()
		c.orphan = true
		pend := c.landAt.len()
		if pend == 0 {
			continue
		}
		// None, all, or a uniform prefix: the edges are where bugs hide.
		var keep int
		switch r := s.rng.IntN(4); r {
		case 0:
			keep = 0
		case 1:
			keep = pend
		default:
			keep = s.rng.IntN(pend + 1)
		}
		if keep < pend {
			c.c.DropPending(keep)
			c.landAt.truncate(keep)
			s.record(Event{Kind: EvDrop, Node: n.id, Peer: c.to.id, Conn: c.id, Seq: c.landed + uint64(keep), Len: pend - keep})
			c.posted = c.landed + uint64(keep)
			if keep == 0 {
				c.torn = false
				c.unhold()
			}
		}
	}
	n.conns = nil
	for _, c := range n.held {
		c.overlap = false // they fail: the target is gone
	}
	n.held = nil
	n.mem.Crash()
	n.disk.crash()
	n.dead = append(n.dead, n.mem)
	n.mem = nil
	n.live = false
	n.gen++
	n.proc, n.env = nil, nil
	n.timers = n.timers[:0]
	n.woken = false
	s.record(Event{Kind: EvCrash, Node: n.id, Value: n.inc})
	s.check()
	return nil
}

// Restart boots a new incarnation of the crashed node id: a new Process
// with fresh, empty memory; its disk is the one the old incarnation wrote
// if keepDisk, else empty. Peers must reconnect: their old Conns stay
// broken.
func (s *Sim) Restart(id rdma.NodeID, keepDisk bool) error {
	n, err := s.node(id)
	if err != nil {
		return err
	}
	if n.live || !s.booted {
		return fmt.Errorf("sim: restart node %d: it is up or not booted yet: %w", id, ErrNodeState)
	}
	if err := s.createMem(n); err != nil {
		return err
	}
	s.start(n, keepDisk)
	s.check()
	return s.Err()
}

// Cut cuts the directed link from -> to: ops from's Conns post to to are
// held, and so are acknowledgements of to's ops to from. Held ops fail
// with rdma.ErrPeerDead once held for the fabric timeout; if the link
// heals before, they proceed.
func (s *Sim) Cut(from, to rdma.NodeID) error { return s.setCut(from, to, true) }

// Heal restores the directed link from -> to.
func (s *Sim) Heal(from, to rdma.NodeID) error { return s.setCut(from, to, false) }

// Partition cuts the links between a and b both ways.
func (s *Sim) Partition(a, b rdma.NodeID) error {
	if err := s.Cut(a, b); err != nil {
		return err
	}
	return s.Cut(b, a)
}

// HealPair heals the links between a and b both ways.
func (s *Sim) HealPair(a, b rdma.NodeID) error {
	if err := s.Heal(a, b); err != nil {
		return err
	}
	return s.Heal(b, a)
}

// Isolate cuts every link of id, both ways.
func (s *Sim) Isolate(id rdma.NodeID) error {
	for _, m := range s.nodes {
		if m.id != id {
			if err := s.Partition(id, m.id); err != nil {
				return err
			}
		}
	}
	return nil
}

// HealAll heals every cut link.
func (s *Sim) HealAll() {
	for _, a := range s.nodes {
		for _, b := range s.nodes {
			if s.cut[a.idx][b.idx] {
				s.setCut(a.id, b.id, false)
			}
		}
	}
}

func (s *Sim) setCut(from, to rdma.NodeID, cut bool) error {
	a, err := s.node(from)
	if err != nil {
		return err
	}
	b, err := s.node(to)
	if err != nil {
		return err
	}
	if a == b || s.cut[a.idx][b.idx] == cut {
		return nil
	}
	s.cut[a.idx][b.idx] = cut
	if cut {
		s.record(Event{Kind: EvCut, Node: from, Peer: to})
	} else {
		s.record(Event{Kind: EvHeal, Node: from, Peer: to})
		s.retryHeld()
	}
	return nil
}

// Linked reports whether the directed link from -> to works.
func (s *Sim) Linked(from, to rdma.NodeID) bool {
	a, b := s.byID[from], s.byID[to]
	return a != nil && b != nil && !s.cut[a.idx][b.idx]
}

// SetSlow makes node id factor times slower (1 is normal speed): its steps
// come factor times less often and every leg of an op it posts or receives
// takes factor times longer.
func (s *Sim) SetSlow(id rdma.NodeID, factor int) error {
	n, err := s.node(id)
	if err != nil {
		return err
	}
	factor = max(factor, 1)
	if n.slow != factor {
		n.slow = factor
		s.record(Event{Kind: EvSlow, Node: id, Value: factor})
	}
	return nil
}

// startFaults schedules the random fault schedule, if configured.
func (s *Sim) startFaults() {
	f := &s.opts.Faults
	if f.Until <= 0 || len(s.nodes) == 0 {
		return
	}
	s.At(s.now+uniform(s.frng, f.Every/2, f.Every*3/2), s.randomFault)
	s.At(f.Until, s.endFaults)
}

// endFaults ends every fault at Faults.Until.
func (s *Sim) endFaults() {
	s.faults.healed = true
	s.HealAll()
	for _, n := range s.nodes {
		s.SetSlow(n.id, 1)
		if !n.live {
			s.Restart(n.id, true)
		}
	}
}

// randomFault starts one fault drawn from the fault generator and
// schedules its end and the next fault.
func (s *Sim) randomFault() {
	f := &s.opts.Faults
	if s.faults.healed || s.now >= f.Until {
		return
	}
	r := s.frng
	s.At(s.now+uniform(r, f.Every/2, f.Every*3/2), s.randomFault)
	dur := uniform(r, f.Duration/4, f.Duration)
	end := func(fn func()) {
		s.At(s.now+dur, func() {
			if !s.faults.healed {
				fn()
			}
		})
	}
	n := s.nodes[r.IntN(len(s.nodes))]
	switch k := r.IntN(f.Crash + f.Partition + f.Slow); {
	case k < f.Crash:
		down := 0
		for _, m := range s.nodes {
			if !m.live {
				down++
			}
		}
		if !n.live || down >= f.MaxDown {
			return
		}
		keep := r.Float64() >= f.LoseDisk
		s.Crash(n.id)
		end(func() {
			if !n.live {
				s.Restart(n.id, keep)
			}
		})
	case k < f.Crash+f.Partition:
		var links [][2]rdma.NodeID
		add := func(a, b rdma.NodeID) {
			if s.Linked(a, b) {
				s.Cut(a, b)
				links = append(links, [2]rdma.NodeID{a, b})
			}
		}
		m := s.nodes[r.IntN(len(s.nodes))]
		switch r.IntN(3) {
		case 0: // one direction of one link
			if m != n {
				add(n.id, m.id)
			}
		case 1: // one link both ways
			if m != n {
				add(n.id, m.id)
				add(m.id, n.id)
			}
		default: // isolate n
			for _, o := range s.nodes {
				if o != n {
					add(n.id, o.id)
					add(o.id, n.id)
				}
			}
		}
		end(func() {
			for _, l := range links {
				s.Heal(l[0], l[1])
			}
		})
	default:
		if n.slow != 1 {
			return
		}
		s.SetSlow(n.id, 2+r.IntN(f.MaxSlow-1))
		end(func() { s.SetSlow(n.id, 1) })
	}
}
