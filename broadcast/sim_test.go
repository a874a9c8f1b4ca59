package broadcast

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

var simFlags = sim.RegisterFlags(flag.CommandLine)

// pad makes proposals of varied sizes, so that diffs take several parts.
var pad = strings.Repeat("abcdefghijklmnopqrstuvwxyz", 10)

// diskStable keeps StableState on a simulated node's Disk.
type diskStable struct{ d *sim.Disk }

func (s diskStable) Load() (StableState, error) {
	b, ok := s.d.Get("acuerdo")
	if !ok {
		return StableState{}, nil
	}
	if len(b) != 16 {
		return StableState{}, ErrCorrupt
	}
	return StableState{Incarnation: binary.LittleEndian.Uint64(b), ENew: Epoch(binary.LittleEndian.Uint64(b[8:]))}, nil
}

func (s diskStable) Save(st StableState) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], st.Incarnation)
	binary.LittleEndian.PutUint64(b[8:], uint64(st.ENew))
	s.d.Put("acuerdo", b[:])
	return nil
}

// checker holds the reference total order: the longest sequence any
// replica delivered. Every delivery must agree with it (total order, no
// gaps), no replica may deliver a message twice (no duplication), and
// every message must have been proposed (integrity).
type checker struct {
	ref      []string
	proposed map[string]*simProposal
	err      error
}

type simProposal struct {
	node rdma.NodeID
	inc  int
	p    *Proposal
}

func (c *checker) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
}

// apply checks that a replica's index-th delivery is d.
func (c *checker) apply(id rdma.NodeID, index uint64, d string) {
	if _, ok := c.proposed[d]; !ok {
		c.fail("integrity: node %d delivered %q at %d, never proposed", id, d, index)
	}
	switch {
	case index <= uint64(len(c.ref)):
		if c.ref[index-1] != d {
			c.fail("total order: node %d delivered %q at %d, another replica %q", id, d, index, c.ref[index-1])
		}
	case index == uint64(len(c.ref))+1:
		c.ref = append(c.ref, d)
	default:
		c.fail("gap: node %d delivered %d with only %d in the reference", id, index, len(c.ref))
	}
}

// checkFSM is a logFSM whose deliveries are checked as they happen.
type checkFSM struct {
	logFSM
	id   rdma.NodeID
	c    *checker
	seen map[string]bool
}

func (f *checkFSM) Apply(index uint64, data []byte) {
	f.logFSM.Apply(index, data)
	d := string(data)
	if f.seen[d] {
		f.c.fail("duplication: node %d delivered %q twice (again at %d)", f.id, d, index)
	}
	f.seen[d] = true
	f.c.apply(f.id, index, d)
}

func (f *checkFSM) Restore(s []byte) error {
	if err := f.logFSM.Restore(s); err != nil {
		return err
	}
	f.seen = map[string]bool{}
	for i, d := range f.seq {
		if f.seen[string(d)] {
			f.c.fail("duplication: node %d restored a snapshot with %q twice", f.id, d)
		}
		f.seen[string(d)] = true
		f.c.apply(f.id, uint64(i+1), string(d))
	}
	return nil
}

type simOpts struct {
	bug      int
	qdepth   int // sim queue depth (0: default)
	ring     int // ring size (0: 8 KiB)
	n        int
	until    time.Duration // faults and proposals until then
	crashes  bool
	restarts bool // crashes restart with empty memory (always, here) after a downtime
	faults   sim.Faults
	maxLog   int
	// script, if set, schedules scripted faults and checks on the run
	// (asym_test.go); it fails the run through h.c.fail.
	script func(h *simRun)
}

// simProc is one incarnation of a replica in the simulator, with a client
// that proposes at random times until the faults end.
type simProc struct {
	h    *simRun
	env  *sim.Env
	r    *Replica
	fsm  *checkFSM
	next time.Duration
	k    int
}

type simRun struct {
	o     simOpts
	s     *sim.Sim
	c     *checker
	cfg   Config
	procs map[rdma.NodeID]*simProc
	rng   *rand.Rand
	down  map[rdma.NodeID]bool // crashed by scheduleCrashes, not restarted yet
	all   []*simProc           // every incarnation, for its counters
}

func (p *simProc) Start(env *sim.Env) error {
	p.env = env
	cfg := p.h.cfg
	cfg.Self = env.ID()
	cfg.Seed = env.Rand().Uint64() | 1
	p.fsm = &checkFSM{id: env.ID(), c: p.h.c, seen: map[string]bool{}}
	r, err := New(cfg, env.Node(), p.fsm, diskStable{env.Disk()})
	if err != nil {
		return err
	}
	p.r = r
	r.bug = p.h.o.bug
	p.next = env.Now() + time.Duration(env.Rand().Int64N(int64(time.Millisecond)))
	p.h.procs[env.ID()] = p
	p.h.all = append(p.h.all, p)
	return nil
}

func (p *simProc) Step(now time.Duration) bool {
	if now >= p.next && now < p.h.o.until {
		p.k++
		d := fmt.Sprintf("n%d.%d.%d.%s", p.env.ID(), p.env.Incarnation(), p.k, pad[:p.env.Rand().IntN(len(pad))])
		p.h.c.proposed[d] = &simProposal{node: p.env.ID(), inc: p.env.Incarnation(), p: p.r.Propose([]byte(d))}
		p.next = now + time.Duration(p.env.Rand().Int64N(int64(4*time.Millisecond)))
	}
	progress := p.r.Poll(now)
	wake := p.r.NextDeadline()
	if now < p.h.o.until {
		wake = min(wake, p.next)
	}
	p.env.WakeAt(wake)
	return progress
}

// unavailable counts the members that are down or restarted and not yet
// caught up.
func (h *simRun) unavailable() int {
	k := len(h.down)
	for id, p := range h.procs {
		if h.s.Live(id) && p.r.Status().CatchingUp {
			k++
		}
	}
	return k
}

// scheduleCrashes crashes members at random and restarts each with empty
// memory (its disk kept) after a random downtime, keeping at most f
// members down or catching up at once (docs/broadcast.md).
func (h *simRun) scheduleCrashes(at time.Duration) {
	h.s.At(at, func() {
		now := h.s.Now()
		if now >= h.o.until {
			return
		}
		ids := h.s.Nodes()
		id := ids[h.rng.IntN(len(ids))]
		if h.unavailable() < (len(ids)-1)/2 && h.s.Live(id) {
			if err := h.s.Crash(id); err == nil {
				h.down[id] = true
				down := time.Millisecond + time.Duration(h.rng.Int64N(int64(4*time.Millisecond)))
				h.s.At(now+down, func() {
					if !h.s.Live(id) { // the end of random faults may have restarted it
						if err := h.s.Restart(id, true); err != nil {
							h.c.fail("restart %d: %v", id, err)
						}
					}
					delete(h.down, id)
				})
			}
		}
		h.scheduleCrashes(now + time.Millisecond + time.Duration(h.rng.Int64N(int64(6*time.Millisecond))))
	})
}

func runSim(sd sim.Seed, o simOpts, total *Counters) error {
	opts := sd.Options()
	opts.Faults = o.faults
	opts.Tick = -1 // replicas ask for their steps (NextDeadline)
	if o.qdepth != 0 {
		opts.QueueDepth = o.qdepth
	}
	s := sim.New(opts)
	defer s.Close()
	h := &simRun{o: o, s: s, c: &checker{proposed: map[string]*simProposal{}}, procs: map[rdma.NodeID]*simProc{},
		rng: rand.New(rand.NewPCG(sd.Seed, 0xc7a5)), down: map[rdma.NodeID]bool{}}
	var ids []rdma.NodeID
	for i := 1; i <= o.n; i++ {
		ids = append(ids, rdma.NodeID(i))
	}
	h.cfg = Config{
		Members:           ids,
		RingSize:          max(o.ring, 8<<10),
		MaxRecord:         1 << 10,
		HeartbeatInterval: time.Millisecond,
		ElectionTimeout:   4 * time.Millisecond,
		MaxLogEntries:     o.maxLog,
		ProposeTimeout:    time.Second,
		ReconnectMin:      100 * time.Microsecond,
		ReconnectMax:      time.Millisecond,
	}
	if sd.Trace {
		h.cfg.Trace = func(format string, args ...any) { opts.Logf("%12v %s", s.Now(), fmt.Sprintf(format, args...)) }
	}
	for _, id := range ids {
		if err := s.AddNode(id, func() sim.Process { return &simProc{h: h} }); err != nil {
			return err
		}
	}
	s.Invariant(func() error { return h.c.err })
	if o.crashes {
		h.scheduleCrashes(2 * time.Millisecond)
	}
	if o.script != nil {
		o.script(h)
	}
	defer func() {
		for _, p := range h.all {
			total.add(p.r.Status().Counters)
		}
	}()
	if err := s.RunUntil(o.until); err != nil {
		return err
	}
	// Liveness once faults heal: every member up to date and every proposal
	// of a live incarnation resolved.
	done := func() bool {
		if len(h.down) != 0 {
			return false
		}
		for _, id := range ids {
			p := h.procs[id]
			if !s.Live(id) || p.r.Status().Index != uint64(len(h.c.ref)) {
				return false
			}
		}
		for _, sp := range h.c.proposed {
			if s.Live(sp.node) && s.Incarnation(sp.node) == sp.inc {
				select {
				case <-sp.p.Done():
				default:
					return false
				}
			}
		}
		return true
	}
	if err := s.Await(done, o.until+500*time.Millisecond); err != nil {
		var st []string
		for _, id := range ids {
			if p := h.procs[id]; p != nil {
				st = append(st, fmt.Sprintf("%+v", p.r.Status()))
			}
		}
		return fmt.Errorf("liveness after faults healed: %w; ref has %d; states %v", err, len(h.c.ref), st)
	}
	if h.c.err != nil {
		return h.c.err
	}
	// Elections stop once faults heal: a group that is up to date with
	// every link up elects no more for ten election timeouts.
	before := h.electionsStarted()
	if err := s.RunFor(10 * h.cfg.ElectionTimeout); err != nil {
		return err
	}
	if after := h.electionsStarted(); after != before {
		return fmt.Errorf("elections after heal: %d elections started in the %v after every fault healed and every member caught up", after-before, 10*h.cfg.ElectionTimeout)
	}
	// Outcomes: delivered at the index they name, errors only for messages
	// that were not delivered.
	pos := map[string]int{}
	for i, d := range h.c.ref {
		pos[d] = i + 1
	}
	for d, sp := range h.c.proposed {
		select {
		case <-sp.p.Done():
		default:
			continue
		}
		index, err := sp.p.Result()
		switch {
		case err != nil && errors.Is(err, ErrStopped):
		case err != nil:
			if pos[d] != 0 {
				return fmt.Errorf("proposal %q failed with %v but was delivered at %d", d, err, pos[d])
			}
			if s.Live(sp.node) && s.Incarnation(sp.node) == sp.inc {
				return fmt.Errorf("liveness: proposal %q of a live proposer failed: %v", d, err)
			}
		case pos[d] == 0:
			return fmt.Errorf("proposal %q reported delivered at %d but is not in the order", d, index)
		case index != 0 && int(index) != pos[d]:
			return fmt.Errorf("proposal %q reported at %d, delivered at %d", d, index, pos[d])
		}
	}
	return nil
}

// electionsStarted sums ElectionsStarted over the live incarnations.
func (h *simRun) electionsStarted() uint64 {
	var k uint64
	for id, p := range h.procs {
		if h.s.Live(id) {
			k += p.r.Status().Counters.ElectionsStarted
		}
	}
	return k
}

func (c *Counters) add(o Counters) {
	c.Elected += o.Elected
	c.ElectionsStarted += o.ElectionsStarted
	c.ElectionsDeferred += o.ElectionsDeferred
	c.DiffsAccepted += o.DiffsAccepted
	c.DiffParts += o.DiffParts
	c.SnapshotsSent += o.SnapshotsSent
	c.SnapshotsRestored += o.SnapshotsRestored
	c.SnapshotsRefused += o.SnapshotsRefused
	c.Reconnects += o.Reconnects
	c.Requeued += o.Requeued
	c.Delivered += o.Delivered
}

// TestSimAcuerdo runs the protocol in the deterministic simulator under
// random faults and checks integrity, no duplication, total order, and
// liveness once the faults heal; a failing seed prints its rerun command.
// -seeds K runs seeds 1..K of every case (default: 2000 seeds in all),
// -seed N one seed.
func TestSimAcuerdo(t *testing.T) {
	const window = 16 * time.Millisecond
	cases := []struct {
		name  string
		share float64 // of the seeds
		o     simOpts
		want  func(c Counters) error
	}{
		{"n3-crash-restart", 0.37, simOpts{n: 3, until: window, crashes: true, maxLog: 24}, wantSnapshots},
		{"n3-partition-slow", 0.38, simOpts{n: 3, until: window, faults: sim.Faults{Until: window, Partition: 2, Slow: 1}}, wantElections},
		{"n3-small-queues", 0.1, simOpts{n: 3, until: window, crashes: true, maxLog: 24, qdepth: 8, ring: 64 << 10, faults: sim.Faults{Until: window, Partition: 1, Slow: 1}}, wantSnapshots},
		{"n5-mixed", 0.15, simOpts{n: 5, until: window, crashes: true, maxLog: 24, faults: sim.Faults{Until: window, Partition: 1, Slow: 1}}, wantSnapshots},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each seed is its own single-goroutine Sim
			var total Counters
			flags := *simFlags
			if flags.Seed == 0 && flags.Seeds == sim.DefaultSeeds {
				flags.Seeds = int(float64(2*sim.DefaultSeeds)*tc.share + 0.5)
			}
			flags.Run(t, func(sd sim.Seed) error { return runSim(sd.WithLog(t), tc.o, &total) })
			t.Logf("counters over all seeds: %+v", total)
			// The fault paths must have been taken (a test that never
			// restores a snapshot proves nothing about snapshots).
			if flags.Seed == 0 && flags.Seeds/max(1, map[bool]int{true: 10, false: 1}[testing.Short()]) >= 50 {
				if err := tc.want(total); err != nil {
					t.Errorf("fault paths not exercised: %v (counters %+v)", err, total)
				}
			}
		})
	}
}

func wantElections(c Counters) error {
	if c.ElectionsStarted == 0 || c.Requeued == 0 || c.Reconnects == 0 {
		return fmt.Errorf("want elections, re-queued proposals and reconnects")
	}
	return nil
}

func wantSnapshots(c Counters) error {
	if c.SnapshotsRestored == 0 || c.DiffParts <= c.DiffsAccepted {
		return fmt.Errorf("want snapshot restores and multi-part diffs")
	}
	return wantElections(c)
}

// TestSimCheckerCatchesBug runs a deliberately broken variant (the leader
// commits without a majority) and expects the checkers to flag a seed.
func TestSimCheckerCatchesBug(t *testing.T) {
	o := simOpts{bug: bugMinorityCommit, n: 3, until: 16 * time.Millisecond, crashes: true, maxLog: 24,
		faults: sim.Faults{Until: 16 * time.Millisecond, Partition: 1}}
	for seed := uint64(1); seed <= 300; seed++ {
		var total Counters
		err := runSim(sim.Seed{Seed: seed}, o, &total)
		if err != nil {
			t.Logf("seed %d caught the bug: %v", seed, err)
			return
		}
	}
	t.Fatal("300 seeds of a leader committing without a majority passed the checkers")
}
