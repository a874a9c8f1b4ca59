package sim

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// Process is the program of one incarnation of a node: a polled state
// machine. The Sim makes a new Process for every boot of the node (see
// AddNode), so a restart starts from fresh Go state and fresh memory, with
// only the Disk possibly handed back.
type Process interface {
	// Start runs when the incarnation boots, before its first Step:
	// register regions, grant peers, connect, read env.Disk(). An error
	// stops the run.
	Start(env *Env) error
	// Step reads the node's memory and completions, posts verbs, and
	// reports whether it made progress (the Sim then steps it again soon).
	// It must not block: no Doorbell.Wait, no rdma.Do and its helpers, no
	// real time, no goroutines; randomness only from env.Rand().
	Step(now time.Duration) bool
}

// node is one node id of the simulation across its incarnations.
type node struct {
	id      rdma.NodeID
	idx     int32 // index in Sim.nodes
	newProc func() Process

	live  bool
	inc   int    // incarnation: boots so far
	gen   uint64 // bumped on crash and on each new mem node: items and Conns of an older gen are stale
	mem   *mem.Node
	proc  Process
	env   *Env
	disk  *Disk
	conns []*conn     // conns this incarnation opened
	dead  []*mem.Node // crashed incarnations, memory kept until Close

	held   []*conn         // conns whose head read is held here (Options.ReadOverlap), in order held
	slow   int             // slow-down factor, 1 is normal
	woken  bool            // an itWake is scheduled
	timers []time.Duration // times asked for with WakeAt, scheduled
	steps  uint64
}

// start boots a new incarnation of n on n.mem.
func (s *Sim) start(n *node, keepDisk bool) {
	n.inc++
	n.live = true
	n.woken = false
	n.timers = n.timers[:0]
	if !keepDisk {
		n.disk = newDisk(s, n.id)
	}
	n.env = &Env{s: s, n: n, gen: n.gen, inc: n.inc,
		rng: rand.New(rand.NewPCG(s.opts.Seed, uint64(n.id)<<32|uint64(n.inc)))}
	n.env.node = &simNode{Node: n.mem, env: n.env}
	n.proc = n.newProc()
	if n.inc > 1 {
		k := 0
		if keepDisk {
			k = 1
		}
		s.record(Event{Kind: EvRestart, Node: n.id, Value: n.inc, Len: k})
	}
	if err := n.proc.Start(n.env); err != nil {
		s.fail(fmt.Errorf("node %d incarnation %d: start: %w", n.id, n.inc, err))
		return
	}
	if s.opts.Tick > 0 {
		// A random phase, so nodes' clocks are not in lockstep.
		s.agenda.push(item{at: s.now + uniform(s.rng, 0, s.opts.Tick), kind: itTick, ref: n.idx, gen: n.gen})
	}
	s.wake(n)
}

func (s *Sim) scheduleTick(n *node) {
	d := s.opts.Tick * time.Duration(n.slow)
	s.agenda.push(item{at: s.now + d + uniform(s.rng, 0, d/16), kind: itTick, ref: n.idx, gen: n.gen})
}

// wake makes n step soon, unless a wake is already scheduled (it will run
// at or after now, so it sees whatever woke n).
func (s *Sim) wake(n *node) {
	if !n.live || n.woken {
		return
	}
	n.woken = true
	l := s.opts.StepLatency * time.Duration(n.slow)
	s.agenda.push(item{at: s.now + uniform(s.rng, l/4, l), kind: itWake, ref: n.idx, gen: n.gen})
}

func (s *Sim) step(n *node) {
	progress := n.proc.Step(s.now)
	n.steps++
	s.record(Event{Kind: EvStep, Node: n.id, Progress: progress})
	if progress {
		s.wake(n)
	}
	s.check()
}

// Env is an incarnation's handle on the simulated world. Its methods are
// called from the process's Start and Step; once the incarnation crashed
// they do nothing.
type Env struct {
	s    *Sim
	n    *node
	gen  uint64
	inc  int
	rng  *rand.Rand
	node *simNode
}

func (e *Env) alive() bool { return e.n.live && e.n.gen == e.gen }

// ID is the node's id.
func (e *Env) ID() rdma.NodeID { return e.n.id }

// Incarnation is 1 on the node's first boot and one more on each restart.
func (e *Env) Incarnation() int { return e.inc }

// Node is the node's fabric endpoint: register regions and connect through
// it. Its Conns queue every op for the scheduler; their Wait never blocks
// (it polls), and Connect to a node that is down fails at once with an
// error wrapping rdma.ErrPeerDead.
func (e *Env) Node() rdma.Node { return e.node }

// Nodes returns the ids of every node of the simulation, in the order they
// were added, including this one.
func (e *Env) Nodes() []rdma.NodeID { return e.s.Nodes() }

// Now is the virtual time.
func (e *Env) Now() time.Duration { return e.s.now }

// Rand is the incarnation's random source, seeded from the run's seed, the
// node id and the incarnation.
func (e *Env) Rand() *rand.Rand { return e.rng }

// Disk is the node's stable storage. A restart gets it back unless the
// fault lost it.
func (e *Env) Disk() *Disk { return e.n.disk }

// WakeAt asks for a Step at virtual time t (at once if t is not in the
// future): the node's timer for a timeout or a retry.
func (e *Env) WakeAt(t time.Duration) {
	if !e.alive() {
		return
	}
	s, n := e.s, e.n
	if t <= s.now {
		s.wake(n)
		return
	}
	if slices.Contains(n.timers, t) {
		return
	}
	n.timers = append(n.timers, t)
	s.agenda.push(item{at: t, kind: itTimer, ref: n.idx, gen: n.gen})
}

// Yield tells the simulator that the stores this step made so far to the
// node's registered memory may be seen: a one-sided read held at this node
// (Options.ReadOverlap) may land here, in the middle of the step. A process
// calls it between the stores whose order readers rely on (a record before
// the slot that points to it, copies before a moved flag), so that the
// simulator shows readers the states in between. Without ReadOverlap it
// does nothing.
func (e *Env) Yield() {
	if len(e.n.held) == 0 || !e.alive() {
		return
	}
	e.s.yield(e.n)
}

// WakeAfter asks for a Step d from now.
func (e *Env) WakeAfter(d time.Duration) { e.WakeAt(e.s.now + d) }

// Output records v as an EvOutput event of this node, for observers and
// the trace (a delivered entry, a client's response).
func (e *Env) Output(v any) {
	if e.alive() {
		e.s.record(Event{Kind: EvOutput, Node: e.n.id, Value: v})
	}
}

// Logf writes a line to Options.Logf, prefixed with the time and node.
func (e *Env) Logf(format string, args ...any) {
	if e.s.opts.Logf != nil {
		e.s.opts.Logf("%12v n%d: %s", e.s.now, e.n.id, fmt.Sprintf(format, args...))
	}
}

// Disk is a node's stable storage: a small key-value map whose writes are
// durable when Put returns (as after fsync). It outlives crashes; a
// restart gets it back or starts empty, as the fault says.
type Disk struct {
	s  *Sim
	id rdma.NodeID
	m  map[string][]byte

	files *diskFiles // disk.go, made on first use
}

func newDisk(s *Sim, id rdma.NodeID) *Disk {
	return &Disk{s: s, id: id, m: make(map[string][]byte)}
}

// Get returns a copy of the value stored under key.
func (d *Disk) Get(key string) ([]byte, bool) {
	v, ok := d.m[key]
	return slices.Clone(v), ok
}

// Put durably stores a copy of v under key. It returns an error (never,
// today) so that a replica's storage interface can be the same for the
// simulator and a real file, which can fail.
func (d *Disk) Put(key string, v []byte) error {
	d.m[key] = slices.Clone(v)
	d.s.record(Event{Kind: EvPersist, Node: d.id, Value: key, Len: len(v)})
	return nil
}

// Delete removes key.
func (d *Disk) Delete(key string) error {
	delete(d.m, key)
	d.s.record(Event{Kind: EvPersist, Node: d.id, Value: key, Len: -1})
	return nil
}

// Keys returns the stored keys in sorted order.
func (d *Disk) Keys() []string { return slices.Sorted(maps.Keys(d.m)) }

// simNode is the rdma.Node a process sees: the mem node, with Connect
// returning scheduler-aware Conns.
type simNode struct {
	*mem.Node
	env *Env
}

// Connect implements rdma.Node.
func (sn *simNode) Connect(peer rdma.NodeID) (rdma.Conn, error) {
	e := sn.env
	if !e.alive() {
		return nil, rdma.ErrClosed
	}
	s := e.s
	t := s.byID[peer]
	switch {
	case t == nil:
		return nil, fmt.Errorf("sim: node %d connect to %d: %w", e.n.id, peer, rdma.ErrUnknownPeer)
	case t.mem == nil: // crashed (a node booting with us already has its mem node)
		return nil, fmt.Errorf("sim: node %d connect to %d: node is down: %w", e.n.id, peer, rdma.ErrPeerDead)
	}
	mc, err := sn.Node.Dial(peer)
	if err != nil {
		return nil, err
	}
	s.nconn++
	c := &conn{id: s.nconn, ref: int32(len(s.connTab)), c: mc, from: e.n, to: t, toGen: t.gen, landHeld: -1, doneHeld: -1}
	s.connTab = append(s.connTab, c)
	s.conns = append(s.conns, c)
	e.n.conns = append(e.n.conns, c)
	return &simConn{Conn: mc, s: s, c: c}, nil
}

// simConn is the rdma.Conn a process sees.
type simConn struct {
	*mem.Conn
	s *Sim
	c *conn
}

// Post implements rdma.Conn.
func (sc *simConn) Post(wr rdma.WR) error {
	if err := sc.Conn.Post(wr); err != nil {
		return err
	}
	sc.s.posted(sc.c, &wr)
	return nil
}

// PostList implements rdma.Conn: each op is scheduled as if posted alone
// (the embedded mem.Conn's PostList would bypass the scheduler).
func (sc *simConn) PostList(wrs []rdma.WR) (int, error) { return rdma.PostEach(sc, wrs) }

// Wait implements rdma.Conn without blocking: virtual time does not pass
// inside a Step.
func (sc *simConn) Wait(cs []rdma.Completion, _ time.Duration) int { return sc.Conn.Poll(cs) }

// Close implements rdma.Conn.
func (sc *simConn) Close() error {
	sc.c.closed = true
	return sc.Conn.Close()
}
