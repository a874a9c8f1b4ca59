package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// Sentinel errors.
var (
	// ErrDeadline: Await's condition did not hold by its deadline.
	ErrDeadline = errors.New("sim: condition not reached by the deadline")
	// ErrNodeExists: AddNode with an id already in the simulation.
	ErrNodeExists = errors.New("sim: node id already added")
	// ErrNoNode: a fault named a node the simulation does not have.
	ErrNoNode = errors.New("sim: no such node")
	// ErrNodeState: Crash of a node that is down, Restart of one that is up.
	ErrNodeState = errors.New("sim: node is not in the state the fault needs")
)

// Options configure a Sim. Zero fields take the defaults documented on
// each; every random choice is drawn from Seed.
type Options struct {
	// Seed makes the run: the same seed and options give the same trace.
	Seed uint64
	// MinDelay and MaxDelay bound one leg of a verb: from Post until it
	// lands at the target, and again from landing until its completion
	// reaches the initiator. Defaults 1µs and 10µs.
	MinDelay, MaxDelay time.Duration
	// TailProb is the probability that a leg takes up to TailDelay longer
	// (congestion, a retransmission). Defaults 0.02 and 200µs; a negative
	// TailProb disables tails.
	TailProb  float64
	TailDelay time.Duration
	// TearProb is the probability that a write longer than 8 bytes lands
	// in two parts, a prefix first, so that the target may step while it is
	// torn. Default 0.1; negative disables tearing.
	TearProb float64
	// ReadOverlap is the probability that a one-sided read, on reaching
	// its target, is held there so that it overlaps the target's stores:
	// it lands at a Yield inside one of the target's later steps (see
	// Env.Yield), or ReadOverlapSpan after it arrived at the latest, and
	// each 8-byte word it returns is, as drawn from the seed, the word as
	// it was when the read arrived or as it is when it lands. Reads on a
	// Conn still see the target's stores in order. Default 0: reads land
	// between steps and see each step whole.
	ReadOverlap float64
	// ReadOverlapSpan bounds how long a held read waits for a Yield.
	// Default 300µs.
	ReadOverlapSpan time.Duration
	// FabricTimeout: an op that cannot reach its target (cut link, crashed
	// target) or whose acknowledgement cannot come back fails with
	// rdma.ErrPeerDead, with every later op of its Conn, once held this
	// long, as an RC queue pair's retries run out. Default 1ms.
	FabricTimeout time.Duration
	// Tick is the period of every node's unconditional step, its clock for
	// heartbeats and timeouts. Default 200µs; negative disables ticks (a
	// node then steps only when woken or at times it asked for).
	Tick time.Duration
	// StepLatency bounds how long after being woken (an op landed in its
	// memory, a completion arrived, its last Step made progress) a node
	// steps: uniform in [StepLatency/4, StepLatency]. Default 2µs.
	StepLatency time.Duration
	// QueueDepth bounds each Conn's outstanding ops (rdma.ErrQueueFull).
	// Default 512.
	QueueDepth int
	// Faults configures random faults; the zero value injects none.
	Faults Faults
	// Logf, if set, receives Env.Logf lines and, with Trace, every event.
	Logf func(format string, args ...any)
	// Trace logs every event through Logf.
	Trace bool
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.MinDelay, time.Microsecond)
	def(&o.MaxDelay, 10*time.Microsecond)
	o.MaxDelay = max(o.MaxDelay, o.MinDelay)
	if o.TailProb == 0 {
		o.TailProb = 0.02
	}
	def(&o.TailDelay, 200*time.Microsecond)
	if o.TearProb == 0 {
		o.TearProb = 0.1
	}
	def(&o.FabricTimeout, time.Millisecond)
	def(&o.ReadOverlapSpan, 300*time.Microsecond)
	def(&o.Tick, 200*time.Microsecond)
	def(&o.StepLatency, 2*time.Microsecond)
	o.StepLatency = max(o.StepLatency, 4)
	if o.QueueDepth <= 0 {
		o.QueueDepth = 512
	}
	o.Faults.setDefaults()
}

// Failure is the error a run stops with when an invariant fails or a
// process fails to start. It names the seed, so the run can be repeated,
// and carries the events that led to it.
type Failure struct {
	Seed   uint64
	Time   time.Duration // virtual time of the failure
	Err    error
	Recent []Event // the last events before the failure, oldest first
}

// Error implements error.
func (f *Failure) Error() string {
	return fmt.Sprintf("sim: seed %d at %v: %v", f.Seed, f.Time, f.Err)
}

// Unwrap returns the cause.
func (f *Failure) Unwrap() error { return f.Err }

// recentEvents is how many events a Failure carries.
const recentEvents = 40

// Sim is one deterministic simulation: nodes running processes over a
// queued mem fabric, driven by one seeded scheduler in virtual time. It is
// not safe for concurrent use; everything runs on the caller's goroutine.
type Sim struct {
	opts   Options
	fabric *mem.Fabric
	rng    *rand.Rand // delays, tears, crash prefixes
	frng   *rand.Rand // random fault schedule
	wrng   *rand.Rand // the test's workload (Sim.Rand)

	now    time.Duration
	agenda agenda
	booted bool
	failed *Failure

	nodes   []*node
	byID    map[rdma.NodeID]*node
	cut     [][]bool // cut[from.idx][to.idx]
	conns   []*conn  // live and draining conns, in creation order
	connTab []*conn  // every conn ever opened, by conn.ref
	actions []func() // scheduled functions, by item.ref (nil once run)
	nconn   uint64

	hash         uint64
	nevents      uint64
	overlapMixed uint64 // held reads that returned words from two moments
	peek         []byte // heldChanged's buffer
	scratch      []byte
	recent       [recentEvents]Event
	observers    []func(Event)
	invariants   []func() error

	faults faultState
}

// New returns an empty simulation. Add nodes with AddNode, then run it.
func New(opts Options) *Sim {
	opts.setDefaults()
	s := &Sim{
		opts:   opts,
		fabric: mem.New(mem.Options{Queued: true, Spin: -1, QueueDepth: opts.QueueDepth}),
		rng:    rand.New(rand.NewPCG(opts.Seed, 0x73696d2d64656c61)),
		frng:   rand.New(rand.NewPCG(opts.Seed, 0x73696d2d6661756c)),
		wrng:   rand.New(rand.NewPCG(opts.Seed, 0x73696d2d776f726b)),
		byID:   make(map[rdma.NodeID]*node),
		hash:   opts.Seed,
	}
	return s
}

// Observe adds fn to the functions that see every event, in order, as it
// happens. fn must not call back into the Sim except for read-only
// accessors.
func (s *Sim) Observe(fn func(Event)) { s.observers = append(s.observers, fn) }

// Invariant adds check to the functions run after every step of a node and
// every fault. The first error stops the run with a *Failure.
func (s *Sim) Invariant(check func() error) { s.invariants = append(s.invariants, check) }

// Seed returns the run's seed.
func (s *Sim) Seed() uint64 { return s.opts.Seed }

// Rand is a random source for the test's own workload (which client
// proposes what, when), seeded from the run's seed and separate from the
// streams of the fabric and the faults.
func (s *Sim) Rand() *rand.Rand { return s.wrng }

// Now returns the virtual time.
func (s *Sim) Now() time.Duration { return s.now }

// TraceHash is a hash of every event so far: two runs with the same seed
// and options have the same hash.
func (s *Sim) TraceHash() uint64 { return s.hash }

// OverlapMixed counts the held reads (Options.ReadOverlap) that returned
// some words as they were when the read arrived and others as they were
// when it landed: the reads that saw the target in the middle of a change.
func (s *Sim) OverlapMixed() uint64 { return s.overlapMixed }

// Events is the number of events so far.
func (s *Sim) Events() uint64 { return s.nevents }

// Nodes returns the ids of every node, in the order they were added.
func (s *Sim) Nodes() []rdma.NodeID {
	ids := make([]rdma.NodeID, len(s.nodes))
	for i, n := range s.nodes {
		ids[i] = n.id
	}
	return ids
}

// Live reports whether node id is up.
func (s *Sim) Live(id rdma.NodeID) bool {
	n := s.byID[id]
	return n != nil && n.live
}

// Process returns the process of node id's running incarnation, or nil if
// the node is down (or not booted yet).
func (s *Sim) Process(id rdma.NodeID) Process {
	if n := s.byID[id]; n != nil && n.live {
		return n.proc
	}
	return nil
}

// Incarnation returns node id's incarnation number: 1 after its first
// boot, one more after each restart, 0 before it booted.
func (s *Sim) Incarnation(id rdma.NodeID) int {
	if n := s.byID[id]; n != nil {
		return n.inc
	}
	return 0
}

// Disk returns node id's current disk (nil for an unknown node). Checkers
// may read it; it is the state a restart with the disk gets back.
func (s *Sim) Disk(id rdma.NodeID) *Disk {
	if n := s.byID[id]; n != nil {
		return n.disk
	}
	return nil
}

// Err returns the failure that stopped the run, if any.
func (s *Sim) Err() error {
	if s.failed == nil {
		return nil
	}
	return s.failed
}

// Close releases every node's memory: region bytes that processes or
// checkers hold must not be touched afterwards. The Sim is unusable
// afterwards, except for read-only accessors such as TraceHash.
func (s *Sim) Close() error {
	var first error
	for _, n := range s.nodes {
		if n.mem != nil {
			// Crash, not Close: queued ops of other nodes may still point
			// into this memory; Release frees it below.
			n.mem.Crash()
			n.dead = append(n.dead, n.mem)
			n.mem = nil
		}
		for _, d := range n.dead {
			if err := d.Release(); err != nil && first == nil {
				first = err
			}
		}
		n.dead = nil
		n.live, n.proc, n.env = false, nil, nil
	}
	s.conns, s.connTab, s.actions = nil, nil, nil
	s.agenda = agenda{}
	return first
}

// AddNode adds node id, whose every incarnation runs a process made by
// newProcess. Nodes added before the first run boot together at time 0,
// after all of them exist (so their Start may connect to each other);
// a node added later boots at once.
func (s *Sim) AddNode(id rdma.NodeID, newProcess func() Process) error {
	if _, ok := s.byID[id]; ok {
		return fmt.Errorf("sim: add node %d: %w", id, ErrNodeExists)
	}
	n := &node{id: id, idx: int32(len(s.nodes)), newProc: newProcess, slow: 1, disk: newDisk(s, id)}
	s.nodes = append(s.nodes, n)
	s.byID[id] = n
	for i := range s.cut {
		s.cut[i] = append(s.cut[i], false)
	}
	s.cut = append(s.cut, make([]bool, len(s.nodes)))
	if s.booted {
		if err := s.createMem(n); err != nil {
			return err
		}
		s.start(n, true)
		return s.Err()
	}
	return nil
}

// boot starts every node added so far (first run).
func (s *Sim) boot() error {
	if s.booted {
		return s.Err()
	}
	s.booted = true
	for _, n := range s.nodes {
		if err := s.createMem(n); err != nil {
			return err
		}
	}
	for _, n := range s.nodes {
		s.start(n, true)
	}
	s.startFaults()
	return s.Err()
}

func (s *Sim) createMem(n *node) error {
	m, err := s.fabric.NewNode(n.id)
	if err != nil {
		return fmt.Errorf("sim: boot node %d: %w", n.id, err)
	}
	n.mem = m
	n.gen++
	return nil
}

// At schedules fn to run at virtual time t (now if t is past): a scripted
// fault, a client request, a check. fn runs between events and may call
// any method of the Sim except the Run family.
func (s *Sim) At(t time.Duration, fn func()) {
	s.actions = append(s.actions, fn)
	s.agenda.push(item{at: max(t, s.now), kind: itAction, ref: int32(len(s.actions) - 1)})
}

// RunFor runs the simulation for d of virtual time.
func (s *Sim) RunFor(d time.Duration) error { return s.RunUntil(s.now + d) }

// RunUntil runs the simulation until virtual time t or a failure.
func (s *Sim) RunUntil(t time.Duration) error {
	_, err := s.run(nil, t)
	return err
}

// Await runs the simulation until cond holds (checked after every event)
// or until virtual time deadline. It returns nil once cond holds, an error
// wrapping ErrDeadline if it did not by deadline, or the run's *Failure.
func (s *Sim) Await(cond func() bool, deadline time.Duration) error {
	ok, err := s.run(cond, deadline)
	if err != nil || ok {
		return err
	}
	return fmt.Errorf("sim: seed %d: at %v: %w", s.opts.Seed, s.now, ErrDeadline)
}

func (s *Sim) run(cond func() bool, until time.Duration) (bool, error) {
	if err := s.boot(); err != nil {
		return false, err
	}
	if cond != nil && cond() {
		return true, nil
	}
	for s.failed == nil && s.agenda.len() > 0 && s.agenda.peek().at <= until {
		it := s.agenda.pop()
		s.now = it.at
		s.dispatch(&it)
		if cond != nil && s.failed == nil && cond() {
			return true, nil
		}
	}
	if s.failed != nil {
		return false, s.failed
	}
	s.now = max(s.now, until)
	return false, nil
}

func (s *Sim) dispatch(it *item) {
	switch it.kind {
	case itLand:
		if c := s.connTab[it.ref]; it.gen == c.landGen {
			c.landSched = false
			s.land(c)
		}
	case itComplete:
		if c := s.connTab[it.ref]; it.gen == c.doneGen {
			c.doneSched = false
			s.complete(c)
		}
	case itWake:
		if n := s.nodes[it.ref]; n.live && it.gen == n.gen {
			n.woken = false
			s.step(n)
		}
	case itTimer:
		if n := s.nodes[it.ref]; n.live && it.gen == n.gen {
			for i, t := range n.timers {
				if t == it.at {
					n.timers = append(n.timers[:i], n.timers[i+1:]...)
					break
				}
			}
			s.step(n)
		}
	case itTick:
		if n := s.nodes[it.ref]; n.live && it.gen == n.gen {
			s.scheduleTick(n)
			s.step(n)
		}
	case itAction:
		fn := s.actions[it.ref]
		s.actions[it.ref] = nil
		fn()
		s.check()
	}
}

// record appends ev to the trace.
func (s *Sim) record(ev Event) {
	ev.Time = s.now
	s.hash, s.scratch = ev.hash(s.hash, s.scratch)
	s.recent[s.nevents%recentEvents] = ev
	s.nevents++
	for _, o := range s.observers {
		o(ev)
	}
	if s.opts.Trace && s.opts.Logf != nil {
		s.opts.Logf("%v", ev)
	}
}

// fail stops the run with err.
func (s *Sim) fail(err error) {
	if s.failed != nil {
		return
	}
	f := &Failure{Seed: s.opts.Seed, Time: s.now, Err: err}
	k := min(s.nevents, recentEvents)
	for i := s.nevents - k; i < s.nevents; i++ {
		f.Recent = append(f.Recent, s.recent[i%recentEvents])
	}
	s.failed = f
}

// check runs the invariants.
func (s *Sim) check() {
	if s.failed != nil {
		return
	}
	for _, inv := range s.invariants {
		if err := inv(); err != nil {
			s.fail(err)
			return
		}
	}
}

// uniform returns a duration uniform in [lo, hi].
func uniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// delay draws one leg's latency between a and b.
func (s *Sim) delay(a, b *node) time.Duration {
	d := uniform(s.rng, s.opts.MinDelay, s.opts.MaxDelay)
	if s.opts.TailProb > 0 && s.rng.Float64() < s.opts.TailProb {
		d += uniform(s.rng, 0, s.opts.TailDelay)
	}
	return d * time.Duration(max(a.slow, b.slow))
}
