// Package poller runs polled tasks (replicas of any group, any node) in
// real time: a Group has one poller goroutine per core, each owning a fixed
// set of tasks. A poller runs passes over its tasks while they make
// progress, then spins briefly and parks on one rdma.WaitSet over every
// doorbell of its tasks' nodes, until a Notify write or a Ring lands on
// one of them, a task is due (its NextDeadline), or a Handle's change
// kicks it.
//
// Tasks stay pure: the poller's clock is the only time they see, and spin
// or park decisions never reach them.
package poller

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Task is a deterministic polled step (a replica, or a layer wrapping one)
// and the latest time it wants its next one.
type Task interface {
	// Poll runs one step at now and reports whether it made progress.
	Poll(now time.Duration) bool
	// NextDeadline is the latest time the task wants its next Poll even
	// if nothing lands in its memory.
	NextDeadline() time.Duration
}

// Flusher is a Task that posts what its Poll queued in a separate step:
// Pass calls Flush right after the task's Poll.
type Flusher interface {
	Flush(now time.Duration)
}

// Heartbeater is a Task that reports its heartbeat interval, so that its
// poller parks no longer than that (a broadcast Replica, and each layer
// that wraps one).
type Heartbeater interface {
	HeartbeatInterval() time.Duration
}

// never is a deadline no task reaches.
const never = time.Duration(1<<63 - 1)

// Pass polls every task once, in order, at now (flushing a Flusher right
// after its Poll), and reports whether any made progress and the earliest
// NextDeadline after the pass (never for no tasks). Production pollers and
// simulators run the same passes.
func Pass(now time.Duration, ts []Task) (progress bool, next time.Duration) {
	for _, t := range ts {
		if t.Poll(now) {
			progress = true
		}
		if f, ok := t.(Flusher); ok {
			f.Flush(now)
		}
	}
	next = never
	for _, t := range ts {
		next = min(next, t.NextDeadline())
	}
	return progress, next
}

// GroupConfig configures a Group.
type GroupConfig struct {
	// Pollers is the number of poller goroutines; 0 means GOMAXPROCS.
	Pollers int
	// MaxPark bounds one park; 0 means the smallest HeartbeatInterval of
	// the poller's tasks (Heartbeater), DefaultMaxPark if none reports one.
	MaxPark time.Duration
	// Spin is the most a poller spins before it parks; 0 means
	// rdma.DefaultSpin, negative never spins.
	Spin time.Duration
	// Hold bounds a held park (one that keeps the poller's P: see
	// "Held parks" below); 0 means DefaultHold, negative never holds.
	Hold time.Duration
	// SpareP lets the group raise GOMAXPROCS to its pollers + 1 while
	// one of its pollers is dense (density), and hold parks then; it
	// sets GOMAXPROCS back when all are sparse again. For a process that
	// runs a group and little else (kvserver, the replica child), whose
	// GOMAXPROCS is at most the pollers: one already above them holds
	// whenever a stream flows, SpareP or not.
	SpareP bool
	// Watch, if set, marks intervals whose passes the pollers count
	// apart (PollerStats.Watched*): a pass that overlaps one, of a
	// poller with a task that reports it watches (PassWatcher) at the
	// pass's end. WatchOver is the length above which such a pass counts
	// in WatchedOver (0: none does). Statistics only: nothing the
	// pollers do depends on them.
	Watch     *Watch
	WatchOver time.Duration

	noProbe bool // testing knob: no probe spins (spinBudget)
	// testing knobs, planted bugs of the held parks: hold with no spare
	// P; a held park not bounded by Hold (until the task deadline)
	holdNoSpare, holdUnbounded bool
	holdSpins                  bool // planted: spin before a held park (spinBudget.spin)
	spareStays                 bool // planted: a SpareP group keeps its spare P once taken
	kickFirstOnly              bool // planted: Group.Kick wakes the first poller only
	// procs, if set, replaces runtime.GOMAXPROCS (tests: the spare P's
	// switches without changing the test process's)
	procs    func(n int) int
	watchBug watchBug
}

// watchBug is a planted bug of the watched passes (tests only).
type watchBug int

const (
	watchOK watchBug = iota
	// watchAtStart: a pass counts only if an interval was open at its
	// start (misses the pass in which a capture began one)
	watchAtStart
	// watchAnyTask: a pass counts with no task watching (a poller of
	// followers only)
	watchAnyTask
	// watchEvery: every pass counts, interval or not
	watchEvery
)

// Held parks. A poller parks in a system call (the WaitSet's futex sleep).
// Its ordinary park enters it as a call known to block, which gives the
// poller's P (the Go runtime's processor) back at once: the runtime then
// starts a thread to take the P over when another P is busy, or to poll
// the network when it was the last one running; on the way out the
// poller takes a P again, and when every P had been idle that wakes the
// runtime's monitor thread (sysmon) out of its deep sleep into 20 µs
// ticks for a millisecond or more. At 64 writers a poller parks about
// once per log entry, and each park paid those thread wake-ups (wsrv,
// docs/dev/write-path-plan.md). A held park (rdma.HoldingWaitSet) keeps
// the P through the sleep: none of them. It is safe only while another P
// is free for the process's other goroutines (a goroutine the poller made
// runnable is then taken by that P's thread), so a group holds only when
// GOMAXPROCS is above its pollers (or while it took a spare P: SpareP,
// below), and only
// while a stream flows: after a park that a ring ended within Hold
// (spinBudget.hold), for at most Hold, then the ordinary park. An idle
// poller (parks ended by deadlines or far rings) never holds.
//
// sysmon preempts a goroutine that kept its P for 10 ms without going
// through the scheduler, and takes the P from one in a system call, which
// restarts its 20 µs ticks; a holding poller never gives its P back, so
// while its next park would hold it calls runtime.Gosched every
// schedEvery of its clock (checked before each pass: with a held park of
// at most Hold after it, under 10 ms; an idle poller's parks give the P
// back, and it does not yield). A poller whose next park holds does
// not spin before it (spinBudget.spin): the spin saved a blocking park's
// costs, which a held park does not have, and it kept a core that a
// single writer's client needed (one writer's round trip 3-4x longer on
// two cores). Its other spins (before a blocking park, after an idle
// spell) do not yield every 16 tries: with a P free, each yield only woke
// a thread that found nothing to run.
//
// The spare P on demand (GroupConfig.SpareP). Held parks cost one writer
// a futex wake-up per hop that the ordinary spin catches (its next
// request comes a round trip after the last, within the spin), and a
// spare P with ordinary parks is worse than none (the spin's Gosched and
// each park's hand-off wake a thread for the idle P). So a SpareP group
// starts with GOMAXPROCS as it found it and parks as without the spare
// P, and each poller watches its busy spells (density): when a window
// of them shows work back to back (many writers), the group raises
// GOMAXPROCS to its pollers + 1 and its pollers hold; when every poller
// is sparse again, it stops holding and sets GOMAXPROCS back. Each
// switch stops the world once; the rule's windows and hysteresis keep
// them to changes of the load.

// DefaultHold bounds a held park.
const DefaultHold = 4 * time.Millisecond

// schedEvery is how often a holding poller goes through the scheduler
// (schedEvery + Hold stays below sysmon's 10 ms).
const schedEvery = 4 * time.Millisecond

// DefaultMaxPark bounds a park when no task reports a heartbeat.
const DefaultMaxPark = time.Millisecond

// ErrRemoved is returned by Do on a removed task.
var ErrRemoved = errors.New("poller: task removed")

// Group is a set of pollers and the tasks assigned to them.
type Group struct {
	cfg    GroupConfig
	origin time.Duration // rdma.Mono at NewGroup: the tasks' clock starts there
	mu     sync.Mutex    // guards ps's handle lists (with each poller's mu) and running
	ps     []*poller
	ran    bool
	stop   atomic.Bool // Run's ctx ended
	hold   bool        // set by Run: pollers may hold their P in short parks
	// holding: pollers hold now (hold, and the spare P taken if the group
	// manages it: SpareP); managed, the group takes and gives back its
	// spare P; base and spare are GOMAXPROCS without and with it
	holding     atomic.Bool
	managed     bool
	base, spare int
	spareMu     sync.Mutex // serializes the switches
	dense       int        // dense pollers (spareMu)
	switches    atomic.Uint64
}

// NewGroup returns a group of cfg.Pollers pollers; Run runs them.
func NewGroup(cfg GroupConfig) *Group {
	if cfg.Pollers <= 0 {
		cfg.Pollers = runtime.GOMAXPROCS(0)
	}
	switch {
	case cfg.Spin == 0:
		cfg.Spin = rdma.DefaultSpin
	case cfg.Spin < 0:
		cfg.Spin = 0
	}
	switch {
	case cfg.Hold == 0:
		cfg.Hold = DefaultHold
	case cfg.Hold < 0:
		cfg.Hold = 0
	}
	g := &Group{cfg: cfg, origin: rdma.Mono()}
	for i := range cfg.Pollers {
		p := &poller{g: g, idx: i}
		p.cond.L = &p.mu
		p.ws = rdma.NewWaitSet(nil)
		g.ps = append(g.ps, p)
	}
	return g
}

// Kick wakes every poller of the group once (its WaitSet's Kick: an
// atomic add, and a futex wake only if it is parked), so that each runs a
// pass over all its tasks. For an event that concerns every task at once,
// such as the process's shared log's fsync completion (every replica's
// stream moved): ringing each task's doorbell instead costs a system call
// per task, and when the woken poller runs a pass and parks again between
// two rings, a wake-up per ring (internal/server's shared log).
func (g *Group) Kick() {
	for i, p := range g.ps {
		if i > 0 && g.cfg.kickFirstOnly {
			break
		}
		p.mu.Lock()
		ws := p.ws
		p.mu.Unlock()
		ws.Kick()
	}
}

// WatchOver is GroupConfig.WatchOver.
func (g *Group) WatchOver() time.Duration { return g.cfg.WatchOver }

// Now is the group's clock, the time its pollers pass to Poll.
func (g *Group) Now() time.Duration { return rdma.Mono() - g.origin }

// Add assigns t to the least loaded poller (ties: one already waiting on
// one of nodes, then the first), for good: tasks never move. The poller
// waits on the doorbells of nodes. t is polled from the next pass on.
func (g *Group) Add(t Task, nodes ...rdma.Node) *Handle {
	return g.add(-1, t, nodes)
}

// AddTo is Add for a task with affinity key (>= 0): every task of one key
// goes to the poller of the key's first task (chosen as Add chooses), so
// that the replicas of one group in one process exchange their messages
// within one poller's passes, with no wake-up between them.
func (g *Group) AddTo(key int, t Task, nodes ...rdma.Node) *Handle {
	return g.add(key, t, nodes)
}

func (g *Group) add(key int, t Task, nodes []rdma.Node) *Handle {
	g.mu.Lock()
	defer g.mu.Unlock()
	best, bestLoad, bestShares := -1, 0, false
	for i, p := range g.ps {
		p.mu.Lock()
		load, shares, keyed := len(p.handles), false, false
		for _, h := range p.handles {
			keyed = keyed || key >= 0 && h.key == key
			for _, n := range h.nodes {
				for _, m := range nodes {
					shares = shares || n == m
				}
			}
		}
		p.mu.Unlock()
		if keyed {
			best = i
			break
		}
		if best < 0 || load < bestLoad || load == bestLoad && shares && !bestShares {
			best, bestLoad, bestShares = i, load, shares
		}
	}
	p := g.ps[best]
	h := &Handle{p: p, t: t, key: key, nodes: append([]rdma.Node(nil), nodes...)}
	p.mu.Lock()
	p.handles = append(p.handles, h)
	p.mu.Unlock()
	p.changed()
	return h
}

// Run runs the pollers until ctx ends, then returns ctx's error. Calls
// queued by Do meanwhile run before it returns. It closes no task.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.ran {
		g.mu.Unlock()
		return errors.New("poller: Group.Run called twice")
	}
	g.ran = true
	procs := g.cfg.procs
	if procs == nil {
		procs = runtime.GOMAXPROCS
	}
	g.base = procs(0)
	g.managed = g.cfg.Hold > 0 && g.cfg.SpareP && g.base <= len(g.ps) && !g.cfg.holdNoSpare
	g.spare = len(g.ps) + 1
	g.hold = g.cfg.Hold > 0 && (g.base > len(g.ps) || g.cfg.holdNoSpare || g.managed)
	g.holding.Store(g.hold && !g.managed)
	g.mu.Unlock()
	if g.managed {
		defer func() {
			g.spareMu.Lock()
			if g.holding.Load() {
				g.holding.Store(false)
				procs(g.base)
			}
			g.spareMu.Unlock()
		}()
	}
	for _, p := range g.ps {
		p.mu.Lock()
		p.running = true
		p.mu.Unlock()
	}
	after := context.AfterFunc(ctx, func() {
		g.stop.Store(true)
		for _, p := range g.ps {
			p.mu.Lock()
			ws := p.ws
			p.mu.Unlock()
			ws.Kick()
		}
	})
	defer after()
	var wg sync.WaitGroup
	for _, p := range g.ps {
		wg.Go(p.run)
	}
	wg.Wait()
	return ctx.Err()
}

// PollerStats counts one poller's work since the group started.
type PollerStats struct {
	Tasks    int    // assigned, paused ones included
	Passes   uint64 // passes over its tasks
	Spins    uint64 // spin phases before a park
	SpinHits uint64 // spin phases ended by a ring or a kick
	Parks    uint64 // parks in the WaitSet
	Wakes    uint64 // parks ended by a ring or a kick (the rest timed out)
	// Probes are spins of a probe budget (spinBudget: a stream just
	// beyond the full budget), ProbeHits those a ring ended.
	Probes, ProbeHits uint64
	// Holds are parks that kept the poller's P (held parks, counted in
	// Parks too), HoldWakes those a ring or a kick ended.
	Holds, HoldWakes uint64
	// MaxPass is the longest pass since the group started: the longest a
	// task of this poller waited for its next Poll while the poller was
	// busy (a pass polls every task once). RecentMaxPass is the longest
	// pass in the last PassWindow to 2*PassWindow: a reader sampling it
	// at least every PassWindow sees every long pass of an interval.
	MaxPass       time.Duration
	RecentMaxPass time.Duration
	// Dense: the poller's stream is dense (density); only a group that
	// manages its spare P (GroupConfig.SpareP) looks.
	Dense bool
	// Spells are the poller's busy spells (from a wake to its next
	// park), BusySpells those with denseProgress or more passes that made
	// progress: what the density rule counts (in any group, SpareP or
	// not; the first spell, the start-up, is not counted).
	Spells, BusySpells uint64
	// The watched passes (GroupConfig.Watch): how many, how many were
	// longer than GroupConfig.WatchOver, the longest since the start and
	// in the last PassWindow to 2*PassWindow (as RecentMaxPass).
	WatchedPasses, WatchedOver           uint64
	WatchedMaxPass, WatchedRecentMaxPass time.Duration
}

// SpareSwitches counts the times the group took or gave back its spare P
// (GroupConfig.SpareP).
func (g *Group) SpareSwitches() uint64 { return g.switches.Load() }

// Holding reports whether the group's pollers hold their P in parks now.
func (g *Group) Holding() bool { return g.holding.Load() }

// Spare is a group's spare P (GroupConfig.SpareP) at one moment.
type Spare struct {
	// OnDemand: the group takes its spare P only while a poller is
	// dense (SpareP, with GOMAXPROCS at most the pollers when Run
	// started); false before Run.
	OnDemand bool
	// Held: it holds the spare P now (GOMAXPROCS is Procs = pollers + 1
	// and the pollers hold their parks).
	Held bool
	// Switches counts the times it took the P or gave it back
	// (SpareSwitches).
	Switches uint64
	// Procs is GOMAXPROCS (as the group sets it) read with the others.
	Procs int
}

// Spare returns the group's spare P, read between two of its switches.
func (g *Group) Spare() Spare {
	g.mu.Lock()
	managed := g.managed
	g.mu.Unlock()
	g.spareMu.Lock()
	defer g.spareMu.Unlock()
	procs := g.cfg.procs
	if procs == nil {
		procs = runtime.GOMAXPROCS
	}
	return Spare{OnDemand: managed, Held: managed && g.holding.Load(), Switches: g.switches.Load(), Procs: procs(0)}
}

// PassWindow is the window of PollerStats.RecentMaxPass.
const PassWindow = time.Second

// Watch marks intervals in which the pollers' passes count apart
// (GroupConfig.Watch): kvserver opens one while a replica's disk snapshot
// is captured and written, so that /status tells the longest pass a
// leader waited through during a save from the others (issue 19 bounds
// it). Begin and End may be called from any goroutine; every Begin needs
// one End.
type Watch struct {
	// intervals begun << 32 | intervals open
	x atomic.Uint64
}

// Begin opens an interval.
func (w *Watch) Begin() { w.x.Add(1<<32 | 1) }

// End closes an interval Begin opened.
func (w *Watch) End() { w.x.Add(^uint64(0)) }

// Open is the number of intervals open now.
func (w *Watch) Open() int { return int(uint32(w.load())) }

// Mark is the Watch's state now (0 for a nil Watch), for WatchOverlaps:
// a task's owner reads it around a step of its own (kvserver: a
// replica's Poll) to tell whether the step overlapped an interval.
func (w *Watch) Mark() uint64 { return w.load() }

// WatchOverlaps reports whether an interval was open between two Marks
// a and b (a first): one was open at a, or one began since.
func WatchOverlaps(a, b uint64) bool { return watchOverlaps(a, b) }

func (w *Watch) load() uint64 {
	if w == nil {
		return 0
	}
	return w.x.Load()
}

// watchOverlaps reports whether an interval was open between reads a and
// b of a Watch: one was open at a, or one began since.
func watchOverlaps(a, b uint64) bool { return uint32(a) != 0 || a>>32 != b>>32 }

// PassWatcher is a Task that says whether the passes of its poller count
// as watched while a Watch interval is open (kvserver's replica: while
// it leads). The poller asks only after a pass that overlapped one.
type PassWatcher interface {
	WatchesPasses() bool
}

// Stats returns every poller's counters.
func (g *Group) Stats() []PollerStats {
	var out []PollerStats
	for _, p := range g.ps {
		p.mu.Lock()
		n := len(p.handles)
		p.mu.Unlock()
		out = append(out, PollerStats{Tasks: n, Passes: p.passes.Load(), Spins: p.spins.Load(),
			SpinHits: p.spinHits.Load(), Parks: p.parks.Load(), Wakes: p.wakes.Load(),
			Probes: p.probes.Load(), ProbeHits: p.probeHits.Load(),
			Holds: p.holds.Load(), HoldWakes: p.holdWakes.Load(),
			MaxPass: p.passLen.all(), RecentMaxPass: p.passLen.recent(), Dense: p.isDense.Load(),
			Spells: p.spells.Load(), BusySpells: p.busySpells.Load(),
			WatchedPasses: p.watched.Load(), WatchedOver: p.watchedOver.Load(),
			WatchedMaxPass: p.watchedLen.all(), WatchedRecentMaxPass: p.watchedLen.recent()})
	}
	return out
}

// Handle is a task's place in its group.
type Handle struct {
	p     *poller
	t     Task
	key   int // AddTo's affinity key, -1 for none
	nodes []rdma.Node
	// guarded by p.mu
	paused, removed bool
	dos             []func()
}

// Do runs f on the goroutine that polls the task, between two of its
// Polls (paused or not), and waits for it; f may touch the task's state.
// If the group does not run, f runs on the caller's goroutine (one such
// call at a time). f must not call the group's or its handles' methods.
func (h *Handle) Do(f func()) error {
	p := h.p
	p.mu.Lock()
	if h.removed {
		p.mu.Unlock()
		return ErrRemoved
	}
	if !p.running {
		// Under the lock: serialized with other such calls and with the
		// start of Run.
		defer p.mu.Unlock()
		f()
		return nil
	}
	done := make(chan struct{})
	h.dos = append(h.dos, func() { f(); close(done) })
	// dirty under the lock: a poller that is finishing sees it before it
	// stops running (and runs f).
	p.dirty.Store(true)
	ws := p.ws
	p.mu.Unlock()
	ws.Kick()
	<-done
	return nil
}

// Pause stops polling the task until Resume (its memory stays readable
// one-sided, its node's doorbell leaves the poller's WaitSet): once Pause
// returns, no Poll of the task runs.
func (h *Handle) Pause() { h.set(func() { h.paused = true }) }

// Resume polls a paused task again.
func (h *Handle) Resume() { h.set(func() { h.paused = false }) }

// Remove takes the task out of its group for good: once Remove returns it
// is never polled again and its poller no longer waits on its nodes (the
// caller may close them). Calls queued by Do run first.
func (h *Handle) Remove() { h.set(func() { h.removed = true }) }

// set applies change under the poller's lock and, if the poller runs,
// waits until it took the change into its pass.
func (h *Handle) set(change func()) {
	p := h.p
	p.mu.Lock()
	if h.removed {
		p.mu.Unlock()
		return
	}
	change()
	p.gen++
	gen := p.gen
	p.dirty.Store(true)
	ws := p.ws
	for p.running && p.applied < gen {
		ws.Kick()
		p.cond.Wait()
		ws = p.ws
	}
	if !p.running {
		p.dropRemovedLocked()
	}
	p.mu.Unlock()
}

// poller is one goroutine's tasks and WaitSet.
type poller struct {
	g   *Group
	idx int

	mu      sync.Mutex
	cond    sync.Cond
	handles []*Handle // assigned, paused ones included
	running bool
	gen     uint64        // changes made
	applied uint64        // changes the running poller took in
	ws      rdma.WaitSet  // the current set (Kick from any goroutine under mu)
	dirty   atomic.Bool   // handles, flags or Do queues changed
	passes  atomic.Uint64 // stats
	spins, spinHits,
	parks, wakes,
	probes, probeHits,
	holds, holdWakes atomic.Uint64
	// the longest passes, of all (notePass) and of the watched ones
	// (noteWatched)
	passLen, watchedLen  passMaxima
	isDense              atomic.Bool // density.dense, for Stats
	spells, busySpells   atomic.Uint64
	watched, watchedOver atomic.Uint64

	// owned by the poller goroutine
	tasks   []Task
	dbs     []rdma.Doorbell // the WaitSet's
	snap    []uint64
	maxPark time.Duration
	budget  spinBudget // the adaptive spin budget
	dos     []func()
	sched   time.Duration // a holding poller's last Gosched
	// the busy spell under way: its passes that made progress; spelled,
	// a park ended one before
	density     density
	spelled     bool
	progressRun int
}

// changed tells a running poller to look at its handles.
func (p *poller) changed() {
	p.dirty.Store(true)
	p.mu.Lock()
	ws := p.ws
	p.mu.Unlock()
	ws.Kick()
}

// dropRemovedLocked forgets removed handles (p.mu held).
func (p *poller) dropRemovedLocked() {
	hs := p.handles[:0]
	for _, h := range p.handles {
		if !h.removed {
			hs = append(hs, h)
		}
	}
	clear(p.handles[len(hs):])
	p.handles = hs
}

// refresh takes in the handles' changes: runs queued Do calls, rebuilds
// the task list and, if the set of doorbells changed, the WaitSet.
func (p *poller) refresh() {
	p.mu.Lock()
	p.dirty.Store(false)
	p.dos = p.dos[:0]
	for _, h := range p.handles {
		p.dos = append(p.dos, h.dos...)
		clear(h.dos)
		h.dos = h.dos[:0]
	}
	p.mu.Unlock()
	// Do calls run before the change they may precede (a Remove).
	for i, f := range p.dos {
		f()
		p.dos[i] = nil
	}

	p.mu.Lock()
	p.dropRemovedLocked()
	p.tasks = p.tasks[:0]
	var dbs []rdma.Doorbell
	p.maxPark = 0
	for _, h := range p.handles {
		if h.paused {
			continue
		}
		p.tasks = append(p.tasks, h.t)
		if hb, ok := h.t.(Heartbeater); ok && hb.HeartbeatInterval() > 0 && (p.maxPark == 0 || hb.HeartbeatInterval() < p.maxPark) {
			p.maxPark = hb.HeartbeatInterval()
		}
	next:
		for _, n := range h.nodes {
			db := n.Doorbell()
			for _, x := range dbs {
				if x == db {
					continue next
				}
			}
			dbs = append(dbs, db)
		}
	}
	if p.maxPark == 0 || p.g.cfg.MaxPark > 0 && p.g.cfg.MaxPark < p.maxPark {
		p.maxPark = p.g.cfg.MaxPark
	}
	if p.maxPark == 0 {
		p.maxPark = DefaultMaxPark
	}
	var old rdma.WaitSet
	if !slices.Equal(dbs, p.dbs) {
		old, p.ws, p.dbs = p.ws, rdma.NewWaitSet(dbs), dbs
	}
	p.applied = p.gen
	p.cond.Broadcast()
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// finish runs at the poller's end: queued Do calls run, changes apply,
// and later calls act without it.
func (p *poller) finish() {
	for {
		p.refresh()
		p.mu.Lock()
		if !p.dirty.Load() {
			p.running = false
			p.dropRemovedLocked()
			p.cond.Broadcast()
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// run is the poller's loop.
func (p *poller) run() {
	defer p.finish()
	p.refresh()
	p.budget = newSpinBudget(p.g.cfg.Spin)
	p.budget.noProbe = p.g.cfg.noProbe
	if p.g.hold {
		p.budget.holdMax = p.g.cfg.Hold
	}
	p.budget.holdSpins = p.g.cfg.holdSpins
	defer func() {
		if p.density.dense {
			p.g.noteDense(false)
		}
	}()
	for !p.g.stop.Load() {
		if p.dirty.Load() {
			p.refresh()
		}
		p.snap = p.ws.Snapshot(p.snap[:0])
		now := p.g.Now()
		if p.budget.hold && !p.budget.notNow && now-p.sched >= schedEvery {
			p.sched = now
			runtime.Gosched()
		}
		w0 := p.g.cfg.Watch.load()
		progress, next := Pass(now, p.tasks)
		p.passes.Add(1)
		end := p.g.Now()
		p.notePass(now, end)
		if p.g.cfg.Watch != nil && p.watchedPass(w0) {
			p.noteWatched(now, end)
		}
		if progress {
			p.progressRun++
			continue
		}
		if len(p.tasks) == 0 {
			next = never
		} else {
			next = min(next, now+p.maxPark)
		}
		if next <= now {
			continue
		}
		p.park(next)
	}
}

// notePass records a pass that ran from start to end (the group's
// clock) in the longest-pass stats: one clock read per pass, and atomic
// stores only when a maximum moves or a window ends.
func (p *poller) notePass(start, end time.Duration) { p.passLen.note(start, end-start) }

// passMaxima keeps the longest of a series of passes: since the start,
// in the current PassWindow and in the previous one. note runs on the
// poller's goroutine (its own copies, stored to the atomics only when a
// maximum moves or a window ends); all and recent from any goroutine.
type passMaxima struct {
	max, cur, prev  atomic.Int64 // ns, for all and recent
	maxD, curD, win time.Duration
}

// note records a pass of length d that began at start.
func (m *passMaxima) note(start, d time.Duration) {
	if start-m.win >= PassWindow {
		if start-m.win >= 2*PassWindow {
			m.curD = 0 // no pass in the window after it
		}
		m.prev.Store(int64(m.curD))
		m.curD = 0
		m.cur.Store(0)
		m.win = start
	}
	if d > m.curD {
		m.curD = d
		m.cur.Store(int64(d))
	}
	if d > m.maxD {
		m.maxD = d
		m.max.Store(int64(d))
	}
}

// all is the longest pass since the start.
func (m *passMaxima) all() time.Duration { return time.Duration(m.max.Load()) }

// recent is the longest pass of the current and the previous window
// (RecentMaxPass). cur before prev: note moves cur to prev before it
// clears cur.
func (m *passMaxima) recent() time.Duration {
	c := time.Duration(m.cur.Load())
	return max(c, time.Duration(m.prev.Load()))
}

// watchedPass reports whether the pass that just ran, which read w0 from
// the Watch before it, counts as watched.
func (p *poller) watchedPass(w0 uint64) bool {
	w1 := p.g.cfg.Watch.load()
	switch p.g.cfg.watchBug {
	case watchAtStart:
		return uint32(w0) != 0 && p.watching()
	case watchAnyTask:
		return watchOverlaps(w0, w1)
	case watchEvery:
		return true
	}
	return watchOverlaps(w0, w1) && p.watching()
}

// watching reports whether a task of the poller watches its passes
// (PassWatcher) now.
func (p *poller) watching() bool {
	for _, t := range p.tasks {
		if w, ok := t.(PassWatcher); ok && w.WatchesPasses() {
			return true
		}
	}
	return false
}

// noteWatched records a watched pass (one that overlapped a Watch
// interval) that ran from start to end, as notePass records every pass.
func (p *poller) noteWatched(start, end time.Duration) {
	d := end - start
	p.watched.Add(1)
	if o := p.g.cfg.WatchOver; o > 0 && d > o {
		p.watchedOver.Add(1)
	}
	p.watchedLen.note(start, d)
}

// park spins for the adaptive budget (spinBudget), then parks until the
// task time next.
func (p *poller) park(next time.Duration) {
	// A change or the stop may have kicked the WaitSet that refresh
	// replaced: look at both before parking on the new one.
	if p.dirty.Load() || p.g.stop.Load() {
		return
	}
	deadline := never
	if next < never-p.g.origin {
		deadline = p.g.origin + next
	}
	enter := rdma.Mono()
	p.noteSpell()
	holding := p.g.holding.Load()
	p.budget.notNow = !holding
	if spin := p.budget.spin(); spin > 0 {
		p.spins.Add(1)
		probe := p.budget.probing
		if probe {
			p.probes.Add(1)
		}
		end := min(enter+spin, deadline)
		for i := 1; ; i++ {
			if p.ws.Wait(p.snap, 0) {
				p.spinHits.Add(1)
				if probe {
					p.probeHits.Add(1)
				}
				p.budget.spun(true)
				return
			}
			if i%16 == 0 {
				if rdma.Mono() >= end {
					break
				}
				if !holding {
					runtime.Gosched()
				}
			}
		}
		p.budget.spun(false)
		if p.dirty.Load() || p.g.stop.Load() {
			return
		}
	}
	p.parks.Add(1)
	start := rdma.Mono()
	rang := false
	if hs, ok := p.ws.(rdma.HoldingWaitSet); ok && p.budget.hold && holding {
		p.holds.Add(1)
		until := min(deadline, start+p.g.cfg.Hold)
		if p.g.cfg.holdUnbounded {
			until = deadline
		}
		if rang = hs.WaitHolding(p.snap, until); rang {
			p.holdWakes.Add(1)
		}
	}
	if !rang {
		rang = p.ws.Wait(p.snap, deadline)
	}
	if rang {
		p.wakes.Add(1)
	}
	end := rdma.Mono()
	p.budget.parked(rang, end-enter, end-start)
}

// noteSpell ends the busy spell under way (the poller goes idle), counts
// it (PollerStats.Spells) and, in a group that manages its spare P, hands
// it to the density rule; a change of the poller's mode goes to the group
// (noteDense).
func (p *poller) noteSpell() {
	run := p.progressRun
	p.progressRun = 0
	if !p.spelled {
		p.spelled = true
		return // the first spell: the poller's start-up
	}
	p.spells.Add(1)
	if run >= denseProgress {
		p.busySpells.Add(1)
	}
	if !p.g.managed {
		return
	}
	if p.density.spell(run) {
		p.isDense.Store(p.density.dense)
		p.g.noteDense(p.density.dense)
	}
}

// noteDense counts a poller that turned dense (or sparse): the first
// dense poller takes the group's spare P and lets the pollers hold, the
// last one to turn sparse stops the holds and gives the P back. Each
// switch stops the world once (runtime.GOMAXPROCS); the density rule's
// windows bound how often.
func (g *Group) noteDense(dense bool) {
	g.spareMu.Lock()
	defer g.spareMu.Unlock()
	procs := g.cfg.procs
	if procs == nil {
		procs = runtime.GOMAXPROCS
	}
	if dense {
		g.dense++
		if g.dense == 1 && !g.holding.Load() {
			procs(g.spare)
			g.holding.Store(true)
			g.switches.Add(1)
		}
		return
	}
	g.dense--
	if g.dense == 0 && g.holding.Load() && !g.cfg.spareStays {
		g.holding.Store(false)
		procs(g.base)
		g.switches.Add(1)
	}
}
