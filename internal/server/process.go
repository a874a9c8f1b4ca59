package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/reuse"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/wal"
)

// ProcessConfig is what one node runtime (Process) runs: the kv replicas
// of a cluster map that this process hosts.
type ProcessConfig struct {
	// Map is the cluster map (StartProcess fills it).
	Map *cluster.Map
	// IDs are the replicas this process hosts; nil hosts every replica of
	// the map (the embedded cluster).
	IDs []rdma.NodeID
	// Spec is the fabric to open the replicas' nodes on; nil takes the
	// map's (fabric.ForMap), with a fresh mem.Fabric on mem.
	Spec *fabric.Spec
	// Broadcast is the Acuerdo configuration of every replica (Self is set
	// per replica, and Start by Prepare).
	Broadcast broadcast.Config
	// Pollers is the number of poller goroutines; 0 means
	// DefaultPollers: one per core, at most one per hosted group (a
	// group's replicas share a poller), and with SpareP on the shm
	// fabric one core left to the clients.
	Pollers int
	// Spin and MaxPark are the pollers' (poller.GroupConfig).
	Spin, MaxPark time.Duration
	// SpareP lets the pollers raise GOMAXPROCS to one above them while
	// their stream is dense (poller.GroupConfig.SpareP: the process's
	// own setting, for a process that runs a Process and little else, as
	// kvserver and the replica child do), so that their short parks keep
	// their P (poller, "Held parks"): with one P more than pollers, the
	// other goroutines still have one. kvserver (spare_p, --spare-p) and
	// the replica child (ChildConfig.SpareP) set it unless told "off".
	// Measured (docs/dev/write-path-plan.md, "The spare P on demand";
	// medians of 6 alternated rounds at SCHED_RR): one writer's stream
	// keeps the parks of a process without it (p50 12.3 against 12.0
	// µs; always holding: 18.4), many writers' take it (x64 231 k/s and
	// 8.1 µs CPU a put, against 206 k and 9.1 without, 225 k and 8.3
	// always holding). On shm SpareP also leaves a core to the clients
	// (DefaultPollers), so with two cores or more the pollers are fewer
	// than GOMAXPROCS and have the spare P from the start: they hold
	// whenever a stream flows and never switch (one writer's mean put
	// 15 against 61-75 µs, x64 385-396 against 223-259 k/s: DefaultPollers).
	SpareP bool
	// Prepare, if set, is called for each replica with its node open and
	// before the replica is built (it may probe the replica's peers): it
	// returns the replica's stable storage and may change its broadcast
	// configuration (bc: Broadcast with Self set and Start StartNew), e.g.
	// how it starts. nil: an in-memory stable state and StartNew.
	Prepare func(node rdma.Node, g, i int, bc *broadcast.Config) (broadcast.Stable, error)
	// AfterPoll, if set, is called on a replica's polling goroutine after
	// each of its Polls, with whether it made progress: a harness copies
	// there what only that goroutine may read.
	AfterPoll func(g, i int, r *kv.Replica, now time.Duration, progress bool)
	// Control, if set, is the control port's listener: the process serves
	// /status, /metrics... of its replicas there, and closes it.
	Control net.Listener
	// Pprof serves /debug/pprof/ on the control port.
	Pprof bool
	// Secret is the cluster secret the control port's POST /force
	// requires proof of (ControlOptions.Secret).
	Secret []byte
	// Commands lets the replicas take state-changing commands (ForceLead,
	// POST /force) on their pollers: kvserver --config sets it; an
	// embedded cluster's replicas take none.
	Commands bool
	// Log, if set, logs the replicas' role changes (Watch) and the control
	// port's errors.
	Log *slog.Logger
	// Durable is what the replicas keep on disk besides their stable
	// state (zero: memory mode, nothing). With a durable mode each
	// replica opens its log and snapshots in ReplicaDir(id) (OpenDurable,
	// after Prepare), and Stop flushes and syncs what its log has queued.
	Durable    DurableConfig
	ReplicaDir func(id rdma.NodeID) string
	// SharedLog, if set (and Durable is not memory mode), is the directory
	// of the process's one log (SharedLog, wal.Mux): every replica writes
	// its log records there as a stream, and one fdatasync covers all of
	// them; its disk snapshots stay in ReplicaDir(id)/snap. "": each
	// replica has a log of its own in ReplicaDir(id)/wal. UseDataDir sets
	// it (docs/operations.md, "One log per process").
	SharedLog string
	// WALLayout is the log layout UseDataDir gives a new data dir:
	// cluster.WALShared (SharedLog) or cluster.WALPerReplica; "" is
	// per-replica too, and a data dir that holds a log keeps its layout
	// (with a warning in Log if WALLayout asked for the other, unless
	// WALLayoutDefault). kvserver's embedded cluster gives shared: alone
	// on this machine (2026-11-27, docs/benchmarks.md) it was faster in
	// every durable row (one writer's sync p50 684 / 782 against 758 /
	// 1139 µs, 64 writers' sync puts 1.2-1.6x with about half the
	// replicas' CPU per put, async 1.3-1.4x), since a sync batch gathers
	// the followers' records with the leader's (wal.Config.GatherWindow).
	WALLayout string
	// WALLayoutDefault: WALLayout is the program's default, not asked
	// for, so a data dir that keeps the other layout is no warning.
	WALLayoutDefault bool
	// FS is the file system the durable state is on (nil: vfs.OS; tests
	// inject faults with errorfs).
	FS vfs.FS
	// Balance is the tablet balancer's configuration (balancer.go):
	// with an ordered keyspace and several groups, a process hosting a
	// replica of group 0 runs one, which acts while that replica leads.
	Balance BalanceConfig
	// RecoverWorkers is how many replicas StartProcess builds at once
	// (each reads its snapshot and log and replays them: a durable
	// restart's recovery); 0: DefaultRecoverWorkers. Under load 17-38
	// (kvbench recover --records 200000) two at once were not told
	// apart from one (from the log 47.5/53.3 s against 20.3/23.6 s,
	// then 42.1/29.1 against 33.5/35.0). On a quiet machine they are:
	// six replicas of 1 M records replayed from the log (sync, 2 x 3,
	// 2 cores, alternated) were up in 7.9/9.1 s with two against
	// 13.5/14.8 s with one at load 2, the process's CPU time the same
	// (13.0/14.7 against 13.7/15.3 s); at load 6-10 9.1 and 34.2 s
	// against 26.2 and 23.1 s.
	RecoverWorkers int
	// SavePollDetail reads the polling thread's counters (its CPU clock,
	// its wait on the OS's run queue, page faults, context switches)
	// around every replica Poll while a disk snapshot is being saved, so
	// that /status poll_max_saving_read says where a long one's time went
	// (kvserver --save-poll-detail; kvbench recover sets it). A
	// diagnostic: about ten system calls a Poll during saves, and the
	// Poll locked to its thread.
	SavePollDetail bool
	// SavesAtOnce lets each durable replica save its periodic disk
	// snapshots when its log says, at once with the others (kvserver
	// --saves-at-once: to compare). By default a process's replicas
	// save them one at a time (broadcast.SaveGate; issue 19).
	SavesAtOnce bool

	backupKnobs backupKnobs // planted bugs, tests only (backup.go)
	startKnobs  startKnobs  // planted bugs, tests only (StartProcess)
	saveBug     saveBug     // planted bugs, tests only (Replica.watchSave)
}

// saveBug is a planted bug of the save passes' statistics (tests only).
type saveBug int

const (
	saveOK saveBug = iota
	// saveNoEnd: a replica never closes its interval in the Watch of
	// saves (every later pass of a leader counts as a save pass)
	saveNoEnd
	// saveNoLeader: no replica watches its poller's passes (none counts)
	saveNoLeader
)

// startKnobs are StartProcess's planted bugs (tests only).
type startKnobs struct {
	// shared: the shared log's planted bugs (sharedlog.go).
	shared sharedKnobs
	// pollEach: each replica goes to its poller as soon as its own
	// recovery ended, not once every replica's did: it votes and
	// serves (and writes its data dir) while another replica of the
	// process still recovers, and a start that then fails leaves a
	// half-started process behind. TestStartProcessRecoveryFails must
	// catch it.
	pollEach bool
}

// Process is one node runtime: the fabric nodes of the replicas a process
// hosts, the replicas, one poller.Group running them all (the replicas of
// one group on one poller), and the control port. kvserver (one replica,
// some or all), the embedded cluster and the harnesses run one.
type Process struct {
	// Map is the cluster map.
	Map *cluster.Map

	cfg     ProcessConfig
	spec    fabric.Spec
	pollers *poller.Group
	// saves: the disk snapshot saves under way (each durable replica
	// opens an interval while it has one), watched by the pollers
	saves poller.Watch
	// saveGate: the durable replicas save their periodic disk snapshots
	// one at a time (broadcast.SaveGate; issue 19)
	saveGate *broadcast.SaveGate
	stop     context.CancelFunc
	done     chan struct{} // closed when the pollers and Watch returned
	control  *Control
	all      []*Replica // every replica started, in map order, for the control port
	backups  *backups   // backup files of the replicas (backup.go)
	// balancer is the tablet balancer (balancer.go); nil: none.
	balancer *balancer
	// started is the start's phases (startAll; read-only once
	// StartProcess returned)
	started StartStatus
	// images and scratch lend the replicas built at the start the
	// buffers of those built before them (startAll; closed after).
	images, scratch *reuse.Pool
	// spareAfter holds the tables' spare pre-faults until every replica
	// is built (startAll).
	spareAfter chan struct{}
	spareGo    func() // closes spareAfter (once)
	// shared is the process's one log (ProcessConfig.SharedLog); nil:
	// none (each replica its own, or memory mode). Closed after every
	// replica.
	shared *SharedLog

	mu      sync.Mutex
	failed  chan error  // a replica stopped on a disk error (fail-stop)
	reps    [][]*hosted // [group][index]; nil: not hosted here, or stopped
	clients map[rdma.NodeID]rdma.Node
	closed  bool
}

// hosted is one replica of the process.
type hosted struct {
	g, i int
	node rdma.Node
	r    *kv.Replica
	st   *btree.Store // nil: the map has no ordered keyspace
	sr   *Replica
	h    *poller.Handle // nil until register
	dur  *Durable       // nil: memory mode
	// stableDev runs the stable state's saves (an AsyncFileStable);
	// nil: an in-memory stable state.
	stableDev *wal.FileDevice
}

// StartProcess opens the nodes of cfg's replicas, builds the replicas,
// runs them on one poller.Group and serves the control port (if
// cfg.Control; it closes that listener on error). It does not wait for the groups to elect (WaitServing).
// On error everything it opened is closed again.
func StartProcess(cfg ProcessConfig) (_ *Process, err error) {
	began := time.Now()
	if cfg.Control != nil {
		defer func() {
			if err != nil {
				cfg.Control.Close()
			}
		}()
	}
	m := cfg.Map
	if m == nil {
		return nil, errors.New("server: no cluster map")
	}
	if err := m.Fill(); err != nil {
		return nil, err
	}
	if m.Durability == "" && cfg.Durable.Mode != broadcast.Memory {
		// The map the process serves and kvserver saves tells clients
		// the mode (a client holds writes on a sync cluster).
		m.Durability = cfg.Durable.Mode.String()
	}
	var spec fabric.Spec
	if cfg.Spec != nil {
		spec = *cfg.Spec
	} else {
		spec = fabric.ForMap(m)
	}
	if spec.Fabric == "mem" && spec.Mem == nil {
		spec.Mem = mem.New(mem.Options{}) // a closed node's id may be reused
	}
	var want []replicaPos
	groups := map[int]bool{}
	if cfg.IDs == nil {
		for g, ms := range m.Groups {
			for i := range ms {
				want = append(want, replicaPos{g, i})
			}
			groups[g] = true
		}
	} else {
		for _, id := range cfg.IDs {
			g, i, ok := position(m, id)
			if !ok {
				return nil, fmt.Errorf("node %d is not a replica of cluster %q (groups %v)", id, m.Name, m.Groups)
			}
			want = append(want, replicaPos{g, i})
			groups[g] = true
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	np := cfg.Pollers
	if np <= 0 {
		np = DefaultPollers(runtime.GOMAXPROCS(0), len(groups), spec.Fabric == "shm" && cfg.SpareP)
	}
	p := &Process{Map: m, cfg: cfg, spec: spec, clients: map[rdma.NodeID]rdma.Node{}, done: make(chan struct{}), failed: make(chan error, 1),
		started: StartStatus{Began: began}, saveGate: broadcast.NewSaveGate()}
	// The pollers count the passes of a leader's poller during a disk
	// snapshot's save apart (/status save_pass_*), against issue 19's
	// bound: the election timeout / 20.
	p.pollers = poller.NewGroup(poller.GroupConfig{Pollers: np, Spin: cfg.Spin, MaxPark: cfg.MaxPark, SpareP: cfg.SpareP,
		Watch: &p.saves, WatchOver: electionTimeout(cfg.Broadcast) / 20})
	p.backups = newBackups(m.Name, cfg.ReplicaDir, cfg.Log)
	p.backups.knobs = cfg.backupKnobs
	p.reps = make([][]*hosted, len(m.Groups))
	for g, ms := range m.Groups {
		p.reps[g] = make([]*hosted, len(ms))
	}
	ctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	var wg sync.WaitGroup
	wg.Go(func() { p.pollers.Run(ctx) })
	finished := func() {
		wg.Wait()
		close(p.done)
	}
	if err := p.startAll(want); err != nil {
		go finished()
		p.Close()
		return nil, err
	}
	p.shared.setClock(p.pollers.Now)    // the device's Continue polls in the pollers' time
	p.shared.setPollers(p.pollers.Kick) // and its completion wakes each poller once
	wg.Go(func() { p.openSpares(ctx) })
	// Watch reads every replica's status 20 to 50 times a second to log
	// role changes (at Info and Warn): with a log that drops those
	// lines it would only cost CPU and allocations (an allocation test
	// counts the whole process's).
	if cfg.Log.Enabled(ctx, slog.LevelWarn) {
		wg.Go(func() { watch(ctx, p.all, cfg.Log, watchEvery(electionTimeout(cfg.Broadcast))) })
	}
	if cfg.Durable.Mode != broadcast.Memory || cfg.Prepare != nil {
		// (A stable state in a file fails a replica too: ErrDisk.)
		wg.Go(func() { p.watchDisks(ctx) })
	}
	go finished()
	p.startBalancer()
	if cfg.Control != nil {
		p.control = ServeControlWith(cfg.Control, m, p.all, ControlOptions{Pprof: cfg.Pprof, Secret: cfg.Secret, backups: p.backups,
			balancer: p.BalancerStatus, collector: balancerCollector{p}, start: func() StartStatus { return p.started }, sharedLog: p.shared.Status, settings: p.settings}, cfg.Log)
	}
	return p, nil
}

// settings fills the process's settings in its /status: the log layout
// in force (the shared log open or not) and the pollers' spare P.
func (p *Process) settings(ps *ProcessStatus) {
	if p.cfg.Durable.Mode != broadcast.Memory {
		ps.WALLayout = keptLayout(p.shared != nil)
	}
	if ps.SpareP == nil {
		ps.SpareP = &SpareStatus{}
	}
	ps.SpareP.Setting = cluster.SparePOff
	if p.cfg.SpareP {
		ps.SpareP.Setting = cluster.SparePAuto
	}
}

// DefaultRecoverWorkers is how many replicas a process builds at once by
// default (ProcessConfig.RecoverWorkers 0): two, or one with a single
// processor. Two were measured on 2 cores; more are not measured.
func DefaultRecoverWorkers() int { return min(2, runtime.GOMAXPROCS(0)) }

// replicaPos is a replica's place in the map: group g, index i.
type replicaPos struct{ g, i int }

// opened is a replica whose node is open and whose Prepare ran
// (StartProcess's first, serial step): what build needs.
type opened struct {
	replicaPos
	node   rdma.Node
	bc     broadcast.Config
	stable broadcast.Stable
}

// startAll starts the replicas at want. Their nodes are opened and
// prepared one after another in map order (Prepare may probe the
// replica's peers); then the replicas are built, RecoverWorkers at once
// (default two, DefaultRecoverWorkers): each reads its snapshot and log
// and replays them (a durable restart's recovery; issue 19: one after
// another, six replicas of 1 M records took 3.1-3.7 s where the slowest
// alone took 0.6-0.9 s; see RecoverWorkers for two at once). Only
// once every replica is built does any go to its poller, in map order:
// no replica votes, serves or writes its data dir before every replica
// of the process recovered, and when one fails (its error names it),
// every replica built is closed unpolled: nothing was started, and no
// replica's data dir changed but by its recovery. The tables' spares are
// made after (openSpares).
func (p *Process) startAll(want []replicaPos) error {
	if p.cfg.SharedLog != "" && p.cfg.Durable.Mode != broadcast.Memory {
		// The shared log is read back before any replica (each takes
		// its stream's records from it); the process closes it after
		// every replica (Close).
		ids := make([]rdma.NodeID, len(want))
		for k, w := range want {
			ids[k] = p.Map.Groups[w.g][w.i]
		}
		sh, err := openSharedLog(p.cfg.FS, p.cfg.SharedLog, ids, p.cfg.Durable, p.cfg.startKnobs.shared)
		if err != nil {
			return err
		}
		for _, w := range sh.Warnings {
			p.cfg.Log.Warn(w, "dir", sh.Dir)
		}
		p.shared = sh
	}
	ops := make([]*opened, 0, len(want))
	for _, w := range want {
		o, err := p.open(w)
		if err != nil {
			for _, o := range ops {
				o.node.Close()
			}
			return err
		}
		ops = append(ops, o)
	}
	since := func() float64 { return time.Since(p.started.Began).Seconds() }
	p.started.OpenedSeconds = since()
	built := make([]*hosted, len(ops))
	errs := make([]error, len(ops))
	workers := p.cfg.RecoverWorkers
	if workers <= 0 {
		workers = DefaultRecoverWorkers()
	}
	workers = max(1, min(workers, len(ops)))
	// The replicas built one after another reuse the buffers of those
	// built before: the disk snapshots' images and Restore's scratch
	// (package reuse; issue 19). Kept only for the start.
	p.images, p.scratch = reuse.New(workers), reuse.New(3*workers)
	defer func() {
		p.images.Close()
		p.scratch.Close()
	}()
	// The tables' spares (kv.TableConfig.PrefaultSpare: an index-sized
	// buffer each, its pages touched) are made once the replicas are
	// built and know a leader (openSpares), not beside the builds nor
	// the elections: at 1 M records six spares of 32 MiB were 14% of
	// the start's CPU samples, taken from the two builds (issue 19). A
	// start that fails opens the gate before it closes the replicas.
	p.spareAfter = make(chan struct{})
	p.spareGo = sync.OnceFunc(func() { close(p.spareAfter) })
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		failed atomic.Bool
	)
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(ops) {
					return
				}
				o := ops[k]
				if failed.Load() {
					// Another replica failed: the start is over; do
					// not read this one's data.
					o.node.Close()
					continue
				}
				h, err := p.build(o)
				if err != nil {
					errs[k] = err
					failed.Store(true)
					continue
				}
				built[k] = h
				if p.cfg.startKnobs.pollEach {
					p.register(h) // planted: polled before the others recovered
				}
			}
		})
	}
	wg.Wait()
	if p.shared != nil {
		// Every replica took its stream's records: drop the log read
		// back (its read buffers), or the process holds it for life.
		p.shared.rec = nil
	}
	p.started.BuiltSeconds = since()
	var first error
	for k, err := range errs {
		if err == nil {
			continue
		}
		if first == nil {
			first = err
		} else {
			p.cfg.Log.Error("replica start failed too", "node", ops[k].node.ID(), "group", ops[k].g, "err", err)
		}
	}
	if first != nil {
		p.spareGo()
		for _, h := range built {
			if h != nil && h.h == nil {
				h.close()
			}
		}
		return first
	}
	if !p.cfg.startKnobs.pollEach {
		for _, h := range built {
			p.register(h)
		}
	}
	p.started.PolledSeconds = since()
	return nil
}

// openSpares opens the gate of the tables' spare pre-faults
// (spareAfter) once every replica of the process follows or leads an
// epoch (its last Poll's role is not Electing), or after 20 election
// timeouts, or when the process stops: a start's elections do not wait
// behind the spares' page faults, and a first capture rarely comes
// sooner (it waits for SnapshotLogBytes of new log).
func (p *Process) openSpares(ctx context.Context) {
	defer p.spareGo()
	bound := time.After(20 * electionTimeout(p.cfg.Broadcast))
	for {
		electing := false
		for _, r := range p.all {
			if r.r.Multicast().Broadcast().Status().Role == broadcast.Electing {
				electing = true
				break
			}
		}
		if !electing {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-bound:
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// open opens replica w's node and runs Prepare.
func (p *Process) open(w replicaPos) (*opened, error) {
	g, i := w.g, w.i
	id := p.Map.Groups[g][i]
	node, err := fabric.Open(p.spec, id)
	if err != nil {
		return nil, fmt.Errorf("start replica %d (group %d): %w", id, g, err)
	}
	bc := p.cfg.Broadcast
	bc.Self, bc.Start = id, broadcast.StartNew
	var stable broadcast.Stable = &broadcast.MemStable{}
	if p.cfg.Prepare != nil {
		if stable, err = p.cfg.Prepare(node, g, i, &bc); err != nil {
			node.Close()
			return nil, err
		}
	}
	return &opened{replicaPos: w, node: node, bc: bc, stable: stable}, nil
}

// build opens replica o's durable state and builds the replica (its
// recovery: New replays the snapshot and the log); it does not poll it
// (register). On error it closes what it and open opened.
func (p *Process) build(o *opened) (*hosted, error) {
	g, i, node, bc, stable := o.g, o.i, o.node, o.bc, o.stable
	id := p.Map.Groups[g][i]
	var err error
	// A stable state in a file saves off the polling goroutine, on a
	// device of its own (not the log's: a vote must not wait behind a
	// disk snapshot's writes), whose completions ring the node's
	// doorbell.
	var stableDev *wal.FileDevice
	if fs, ok := stable.(broadcast.FileStable); ok {
		dfs := fs.FS
		if dfs == nil {
			dfs = vfs.OS
		}
		stableDev = wal.NewFileDevice(dfs, node.Doorbell().Ring)
		stable = broadcast.NewAsyncFileStable(fs, stableDev)
	}
	closeStable := func() {
		if stableDev != nil {
			stableDev.Close()
		}
	}
	var dur *Durable
	var readTook time.Duration
	if p.cfg.Durable.Mode != broadcast.Memory {
		if p.cfg.ReplicaDir == nil {
			closeStable()
			node.Close()
			return nil, fmt.Errorf("start replica %d (group %d): durability %v needs a data directory", id, g, p.cfg.Durable.Mode)
		}
		fsys := p.cfg.FS
		if fsys == nil {
			fsys = vfs.OS
		}
		t0 := time.Now()
		dcfg := p.cfg.Durable
		dcfg.images = p.images
		dur, err = OpenDurableShared(fsys, p.cfg.ReplicaDir(id), id, g, dcfg, node.Doorbell().Ring, p.shared)
		readTook = time.Since(t0)
		if err != nil {
			closeStable()
			node.Close()
			return nil, err
		}
		for _, w := range dur.Warnings {
			p.cfg.Log.Warn(w, "node", id, "group", g)
		}
		dur.Apply(&bc)
		if !p.cfg.SavesAtOnce {
			bc.SaveGate = p.saveGate
		}
		{
			// A full disk: one line when the log finds it full, one
			// when a write succeeds again (not one per retry).
			prev := bc.OnEvent
			bc.OnEvent = func(ev broadcast.Event) {
				switch ev.Kind {
				case broadcast.EventDiskFull:
					p.cfg.Log.Error(fmt.Sprintf("disk full: replica %d (group %d) takes no new writes until space returns: %v", id, g, ev.Err), "node", id, "group", g, "dir", p.cfg.ReplicaDir(id))
				case broadcast.EventDiskSpace:
					p.cfg.Log.Info(fmt.Sprintf("disk space returned: replica %d (group %d) takes writes again", id, g), "node", id, "group", g)
				}
				if prev != nil {
					prev(ev)
				}
			}
		}
		if dur.Mode == broadcast.Async {
			// A recovery election this replica won: the line the
			// operator reads to learn what the outage cost (Warn: a
			// whole group went down, and the default level shows it).
			prev, fi := bc.OnEvent, bc.FsyncInterval
			bc.OnEvent = func(ev broadcast.Event) {
				if ev.Kind == broadcast.EventRecovered {
					p.cfg.Log.Warn(RecoveredLine(g, ev, fi), "node", id, "group", g)
				}
				if prev != nil {
					prev(ev)
				}
			}
		}
	}
	rc, err := p.Map.ReplicaConfig(g, bc)
	if err != nil {
		dur.Close()
		closeStable()
		node.Close()
		return nil, fmt.Errorf("start replica %d (group %d): %w", id, g, err)
	}
	// The ordered keyspaces' tree: every replica of every group builds a
	// Store when the map declares one (group OrderedGroup owns its one
	// tablet; the others answer StatusMoved).
	var st *btree.Store
	if sc, ok := p.Map.OrderedStore(g); ok {
		if st, err = btree.NewStore(sc, node); err != nil {
			dur.Close()
			closeStable()
			node.Close()
			return nil, fmt.Errorf("start replica %d (group %d): ordered keyspace: %w", id, g, err)
		}
		rc.Table.Ordered = st
	}
	// A durable replica writes snapshots periodically: its table keeps
	// a spare for a capture's index copy, pre-faulted off the polling
	// goroutine (issue 19: a fresh buffer's page faults stalled it).
	rc.Table.PrefaultSpare = dur != nil
	// Inserts take fresh heap pages: a goroutine of the table faults them
	// in ahead of the bump pointer, off the polling goroutine (YCSB's
	// load: the faults were 38% of the cluster's CPU, on the pollers).
	rc.Table.PrefaultHeap = kv.DefaultPrefaultHeap
	rc.Table.Scratch = p.scratch
	rc.Table.SpareAfter = p.spareAfter
	// A backup marker (kv.BackupMarker) hands the table to the
	// process's backups; one New replays from the log is ignored (its
	// backup is long over), as sr is not set yet.
	var sr *Replica
	p.backups.sweep(id)
	rc.Table.OnBackup = func(t *kv.Table, m kv.BackupMarker) {
		if sr != nil {
			p.backups.marker(sr, t, m)
		}
	}
	ts := &timedStable{Stable: stable}
	var rs broadcast.Stable = ts
	if a, ok := stable.(broadcast.AsyncStable); ok {
		rs = timedAsyncStable{timedStable: ts, a: a}
	}
	r, err := kv.NewReplica(rc, node, rs)
	if err != nil {
		if st != nil {
			st.Close()
		}
		dur.Close()
		closeStable()
		node.Close()
		return nil, fmt.Errorf("start replica %d (group %d): %w", id, g, err)
	}
	sr = NewReplica(g, i, id, r)
	sr.dur, sr.backups, sr.stable, sr.readTook = dur, p.backups, ts, readTook
	if dur != nil {
		sr.saves, sr.saveBug, sr.threadDetail = &p.saves, p.cfg.saveBug, p.cfg.SavePollDetail
	}
	if dur != nil {
		dur.Replayed() // New replayed the log: the recovery's whole time
		p.cfg.Log.Info(dur.Summary, "node", id, "group", g, "durability", dur.Mode.String(), "data_dir", dur.Dir)
	}
	sr.pollers = p.pollers
	if f := p.cfg.AfterPoll; f != nil {
		sr.after = func(now time.Duration, progress bool) { f(g, i, r, now, progress) }
	}
	return &hosted{g: g, i: i, node: node, r: r, st: st, sr: sr, dur: dur, stableDev: stableDev}, nil
}

// register hands built replica h to its poller: from now on it polls
// (votes, serves, writes its log), and the control port shows it.
func (p *Process) register(h *hosted) {
	// A group's replicas share a poller: their messages to each other
	// then need no wake-up.
	h.h = p.pollers.AddTo(h.g, h.sr, h.node)
	if p.cfg.Commands {
		h.sr.SetHandle(h.h)
	}
	p.mu.Lock()
	p.reps[h.g][h.i] = h
	p.all = append(p.all, h.sr)
	p.mu.Unlock()
}

// close closes a replica that no poller polls (any more): one that build
// made and the start abandoned, or one its poller let go.
func (h *hosted) close() {
	h.sr.watchSave(false) // no Poll of it runs any more
	h.r.Close()
	if h.st != nil {
		h.st.Close()
	}
	h.dur.Close()
	if h.stableDev != nil {
		h.stableDev.Close()
	}
	h.node.Close()
}

func (p *Process) get(g, i int) *hosted {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.reps) || i < 0 || i >= len(p.reps[g]) {
		return nil
	}
	return p.reps[g][i]
}

// Failed delivers the first disk error that stopped a replica of the
// process (fail-stop: its writer failed an fsync, or the disk refused a
// record): the replica polls no more, and the process should exit so that
// it is restarted once the disk is sound.
func (p *Process) Failed() <-chan error { return p.failed }

// watchDisks reports the first replica a disk error stopped (Failed).
func (p *Process) watchDisks(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, r := range p.all {
			if err := r.r.Multicast().Broadcast().Status().DiskErr; err != nil {
				where := "its stable state"
				if r.dur != nil {
					where = r.dur.LogDir
				}
				p.failed <- fmt.Errorf("replica %d (group %d) stopped on a disk error in %s: %v: nothing it acknowledged is lost; check the disk (dmesg, df), then restart it", r.Node, r.Group, where, err)
				return
			}
		}
	}
}

// Hosts reports whether replica (g, i) runs here (hosted and not stopped).
func (p *Process) Hosts(g, i int) bool { return p.get(g, i) != nil }

// Do runs f on replica (g, i)'s polling goroutine, between two of its
// Polls (paused or not), and waits for it.
func (p *Process) Do(g, i int, f func(*kv.Replica)) error {
	h := p.get(g, i)
	if h == nil {
		return fmt.Errorf("replica %d of group %d does not run here (stopped, or another process's)", i, g)
	}
	if err := h.h.Do(func() { f(h.r) }); err != nil {
		return errors.New("replica stopped")
	}
	return nil
}

// Stop stops replica (g, i) and closes its node: its memory is gone (as
// after kill -9 of a process hosting only it). A durable replica first
// writes and syncs what its log has queued (a clean stop), for at most
// flushTimeout.
func (p *Process) Stop(g, i int) {
	p.mu.Lock()
	var h *hosted
	if g >= 0 && g < len(p.reps) && i >= 0 && i < len(p.reps[g]) {
		h = p.reps[g][i]
		p.reps[g][i] = nil
	}
	p.mu.Unlock()
	if h == nil {
		return
	}
	if h.dur != nil {
		p.flush(h)
	}
	h.h.Remove()
	h.close()
	for _, name := range h.r.Multicast().Broadcast().ClosedUnsaved() {
		p.cfg.Log.Info("disk snapshot abandoned at the stop: the next start replays more of the log, nothing is lost",
			"node", h.sr.Node, "group", g, "snapshot", name)
	}
}

// flushTimeout bounds how long Stop waits for a log's queue to reach the
// disk.
const flushTimeout = 10 * time.Second

// flush pauses h (no Poll of it runs again, so it accepts and
// acknowledges nothing more: in async mode every entry it acknowledged
// is in its log's queue) and then drives its log writer itself, between
// the poller's passes, until everything queued is written and synced,
// the writer failed, or flushTimeout passed. A SIGTERM of every replica
// then loses nothing in async mode either.
func (p *Process) flush(h *hosted) {
	w := h.dur.WAL
	h.h.Pause()
	deadline := time.Now().Add(flushTimeout)
	for time.Now().Before(deadline) {
		done := false
		if h.h.Do(func() {
			w.Flush()
			w.Poll(p.pollers.Now())
			done = h.dur.logIdle() || w.Err() != nil
		}) != nil || done {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Pause stops polling replica (g, i) until Resume (once it returns, no
// Poll of the replica runs): its memory stays readable one-sided.
func (p *Process) Pause(g, i int) {
	if h := p.get(g, i); h != nil {
		h.h.Pause()
	}
}

// Resume resumes polling replica (g, i).
func (p *Process) Resume(g, i int) {
	if h := p.get(g, i); h != nil {
		h.h.Resume()
	}
}

// Leader is the index of the replica of group g running here that leads
// a committed epoch, or -1.
func (p *Process) Leader(g int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, h := range p.reps[g] {
		if h == nil {
			continue
		}
		if _, ok := h.r.Multicast().Broadcast().Leading(); ok {
			return i
		}
	}
	return -1
}

// WaitServing waits until every group of the map has a replica here
// serving linearizable gets (meant for a process hosting every replica).
func (p *Process) WaitServing(ctx context.Context) error {
	for {
		missing := -1
		for g := range p.reps {
			if p.Leader(g) < 0 {
				missing = g
				break
			}
		}
		if missing < 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("group %d has no leader: %w", missing, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// Replicas are the replicas started, for the control port (the list does
// not follow later Stops).
func (p *Process) Replicas() []*Replica { return p.all }

// ControlAddr is the control port's address, "" if none.
func (p *Process) ControlAddr() string {
	if p.control == nil {
		return ""
	}
	return p.control.Addr()
}

// ClientNode opens (once) the node of client slot k on the process's
// fabric, for client.WithNode (the only way to reach a mem cluster).
func (p *Process) ClientNode(k int) (rdma.Node, error) {
	if k < 0 || k >= len(p.Map.ClientNodes) {
		return nil, fmt.Errorf("client slot %d: the map has %d", k, len(p.Map.ClientNodes))
	}
	id := p.Map.ClientNodes[k]
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.clients[id]; n != nil {
		return n, nil
	}
	n, err := fabric.Open(p.spec, id)
	if err != nil {
		return nil, err
	}
	p.clients[id] = n
	return n, nil
}

// PollerStats are the pollers' counters.
func (p *Process) PollerStats() []poller.PollerStats { return p.pollers.Stats() }

// Close stops the control port and every replica, and closes every node
// (shm files included). It may be called more than once.
func (p *Process) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.stopBalancer()
	if p.control != nil {
		p.control.Close()
	}
	p.stopReplicas()
	p.stop()
	<-p.done
	p.shared.Close() // after every replica: each flushed its stream
	p.backups.close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, n := range p.clients {
		n.Close()
		delete(p.clients, id)
	}
}

// stopReplicas stops every replica of the closing process at once, so
// that a stop takes about as long as its slowest replica's, not their
// sum (issue 19: SIGINT of the embedded cluster at load took over 10 s):
// the SaveGate is closed first (a replica waiting for its turn to save
// gives up), then every replica is paused (none polls again: none
// accepts or acknowledges anything more, none starts a capture, and no
// group elects a new leader as its members stop one by one), then each
// is stopped (Stop: its log flushed, its save under way abandoned after
// broadcast's closeSaveBudget) in its own goroutine. A disk snapshot a
// replica did not save is logged (INFO): the next start replays more of
// the log, nothing is lost.
func (p *Process) stopReplicas() {
	var hs [][2]int
	for g := range p.reps {
		for i := range p.reps[g] {
			hs = append(hs, [2]int{g, i})
		}
	}
	p.saveGate.Close()
	for _, x := range hs {
		if h := p.get(x[0], x[1]); h != nil {
			h.h.Pause()
		}
	}
	var wg sync.WaitGroup
	for _, x := range hs {
		wg.Go(func() { p.Stop(x[0], x[1]) })
	}
	wg.Wait()
}

// electionTimeout is bc's election timeout, broadcast's default if unset.
func electionTimeout(bc broadcast.Config) time.Duration {
	if bc.ElectionTimeout > 0 {
		return bc.ElectionTimeout
	}
	return broadcast.DefaultElectionTimeout
}

// DefaultPollers is a process's pollers (ProcessConfig.Pollers 0) for
// procs cores (GOMAXPROCS) and groups hosted groups: one per core, at
// most one per group, at least one; with clientCore, one core fewer (at
// least one poller), left to the clients. kvserver and the replica child
// (SpareP) on shm ask for it: every client of an shm cluster runs on the
// replicas' host, and a writer waiting for its reply spins on a core.
//
// Why (issue 17, docs/dev/write-path-plan.md "One writer's slow puts"):
// on 2 cores, one writer against the embedded cluster's 2 groups had two
// pollers and the writer's spin wanting the 2 cores. A put to the group
// whose poller had parked waited for a core until the other poller's or
// the writer's spin ran out (the 80-100 µs puts), and once the pollers'
// spin budgets ran down every put paid a park and a wake in each process
// (150-350 µs): p50 11-12 µs but a mean of 40-66 µs. With one poller for
// both groups (its passes at one writer rarely go idle) the mean fell to
// 13-20 µs, and 64 writers did not lose (the client needs the other
// core). The one poller then has a P to spare (GOMAXPROCS above the
// pollers), so it holds its parks while a stream flows (poller, "Held
// parks"), with no switches of GOMAXPROCS.
func DefaultPollers(procs, groups int, clientCore bool) int {
	n := procs
	if clientCore {
		n--
	}
	return max(1, min(n, groups))
}

// position is where node id sits in m's groups.
func position(m *cluster.Map, id rdma.NodeID) (g, i int, ok bool) {
	for g, ms := range m.Groups {
		for i, n := range ms {
			if n == id {
				return g, i, true
			}
		}
	}
	return 0, 0, false
}
