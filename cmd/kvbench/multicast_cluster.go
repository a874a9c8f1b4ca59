package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// A TRAM cluster of the multicast benchmark: every group's replicas and
// the closed-loop clients, in this process. Each replica is a node of its
// own on the fabric (mem, or shm nodes of this process), polled by a
// goroutine of its own (as multicast's TestRealTime does); each client is
// a node of its own too, driven by its own goroutine.

// mcSpec describes a cluster.
type mcSpec struct {
	fabric   string // "mem" or "shm"
	tree     *tree.Tree
	replicas int // per group
	clients  int // client slots (and loaders, unless the clients live elsewhere)
	window   int // ClientSlots: each client's ring, and its closed-loop window
	slotSize int
	et       time.Duration // election timeout (0: broadcast's default)
	spin     time.Duration // doorbell spin budget (0: rdma.DefaultSpin)
	shmDir   string        // shm: --shm-dir (the cluster gets a directory in the work directory)
	shmPath  string        // shm: or this existing cluster directory (kept)
	// clientNodes, if set, names the client slots' nodes, which live in
	// another process (no loaders here).
	clientNodes []rdma.NodeID
	// placement: mcRuntime ("" too) polls every replica, a node of its
	// own, with one poller group of min(GOMAXPROCS, groups) pollers, a
	// group's replicas on one poller (poller.Group.AddTo), as kvserver's
	// server.Process does: their messages to each other need no wake-up;
	// a crashed replica leaves its poller (Handle.Remove) and a restarted
	// one joins its group's poller again. mcOwn gives each replica a
	// poller group of its own. mcShared places replica i of every group on
	// node i (replicas nodes in all), each node's replicas polled by one
	// poller (a poller.Group of one) on its one doorbell; shared replicas
	// do not crash one by one (no table1).
	placement string
}

func (s *mcSpec) shared() bool  { return s.placement == mcShared }
func (s *mcSpec) runtime() bool { return s.placement == mcRuntime || s.placement == "" }

// Node ids: group g's replica i, and client slot c.
func mcReplicaID(g, i, replicas int) rdma.NodeID { return rdma.NodeID(1 + g*replicas + i) }
func mcClientID(c int) rdma.NodeID               { return rdma.NodeID(10000 + c) }

// mcSlotSize is the ring slot that holds a payload of size bytes: the
// default, or the payload and the record's 56 bytes rounded up.
func mcSlotSize(size int) int {
	return max(multicast.DefaultSlotSize, (size+56+7)&^7)
}

// mcParentSlots bounds a parent ring to about 4 MiB (256 slots up to
// 16 KiB slots).
func mcParentSlots(slotSize int) int {
	return max(32, min(multicast.DefaultParentSlots, (4<<20)/slotSize))
}

// mcCluster is a running cluster.
type mcCluster struct {
	spec    mcSpec
	members [][]rdma.NodeID
	cnodes  []rdma.NodeID
	fab     fabric.Spec // the nodes' fabric
	dir     string      // shm cluster directory
	reps    [][]*mcReplica
	loaders []*mcLoader
	// shared placement: the nodes and their drivers
	nodes   map[rdma.NodeID]rdma.Node
	drivers []*mcDriver
	// runtime placement (mcSpec.runtime): the one poller group
	pg       *poller.Group
	pgCancel context.CancelFunc
	pgDone   chan struct{}
}

// mcDriver polls the replicas of one shared node.
type mcDriver struct {
	node   rdma.Node
	reps   []*mcReplica
	cancel context.CancelFunc
	done   chan struct{}
}

// callPoller runs x's queued calls (do) before each Poll, on the driver's
// goroutine.
type callPoller struct{ x *mcReplica }

func (p callPoller) Poll(now time.Duration) bool {
	p.x.runCalls()
	return p.x.r.Poll(now)
}

func (p callPoller) NextDeadline() time.Duration { return p.x.r.NextDeadline() }

// mcReplica is one replica and its polling goroutine. It keeps its
// broadcast stable state across a crash, so it can restart (empty memory,
// same stable state: a restarted member).
type mcReplica struct {
	g      tree.Group
	i      int
	id     rdma.NodeID
	cfg    multicast.Config
	stable *broadcast.MemStable
	node   rdma.Node
	r      *multicast.Replica
	app    *mcApp

	cancel context.CancelFunc
	done   chan struct{}
	shared bool // its node and driver are shared with other groups' replicas

	mu      sync.Mutex
	calls   []func()
	pending atomic.Bool
}

// mcApp is the benchmark's application: it counts and hashes what its
// group delivers and returns no result (a reply carries the index only).
type mcApp struct {
	n, h uint64
}

func (a *mcApp) Apply(e broadcast.Entry) []byte {
	a.n++
	a.h = (a.h ^ uint64(len(e.Data)) ^ e.Index) * 0x100000001b3
	return nil
}

func (a *mcApp) Snapshot() (broadcast.FSMSnapshot, error) {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, a.n)
	binary.LittleEndian.PutUint64(b[8:], a.h)
	return broadcast.BytesSnapshot(b), nil
}

func (a *mcApp) Restore(b []byte) error {
	if len(b) != 16 {
		return fmt.Errorf("kvbench multicast: snapshot of %d bytes, want 16", len(b))
	}
	a.n, a.h = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	return nil
}

// openMcCluster starts every replica, waits until every group has a leader
// of a committed epoch, and registers the clients (unless they live in
// another process).
func openMcCluster(ctx context.Context, spec mcSpec) (*mcCluster, error) {
	c := &mcCluster{spec: spec}
	n := spec.tree.Len()
	for g := range n {
		var ms []rdma.NodeID
		for i := range spec.replicas {
			if spec.shared() {
				ms = append(ms, mcReplicaID(0, i, spec.replicas))
			} else {
				ms = append(ms, mcReplicaID(g, i, spec.replicas))
			}
		}
		c.members = append(c.members, ms)
	}
	c.cnodes = spec.clientNodes
	if c.cnodes == nil {
		for k := range spec.clients {
			c.cnodes = append(c.cnodes, mcClientID(k))
		}
	}
	switch spec.fabric {
	case "mem":
		c.fab = fabric.Spec{Fabric: "mem", Mem: mem.New(mem.Options{Spin: spec.spin})}
	case "shm":
		c.dir = spec.shmPath
		if c.dir == "" {
			wd, err := workDir(spec.shmDir)
			if err != nil {
				return nil, err
			}
			if c.dir, err = os.MkdirTemp(wd, "mcast-"); err != nil {
				return nil, fmt.Errorf("shm: cluster directory: %w", err)
			}
		}
		c.fab = fabric.Spec{Fabric: "shm", ShmDir: c.dir, Cluster: "mcast", Spin: spec.spin}
	default:
		return nil, fmt.Errorf("multicast: fabric %q runs no in-process cluster (want mem, shm)", spec.fabric)
	}
	for g := range n {
		var rs []*mcReplica
		for i, id := range c.members[g] {
			x := &mcReplica{g: tree.Group(g), i: i, id: id, stable: &broadcast.MemStable{}}
			x.cfg = multicast.Config{
				Group: tree.Group(g), Tree: spec.tree, Members: c.members, ClientNodes: c.cnodes,
				ClientSlots: spec.window, ParentSlots: mcParentSlots(spec.slotSize), SlotSize: spec.slotSize,
				Broadcast: broadcast.Config{Self: id, Start: broadcast.StartNew, ElectionTimeout: spec.et},
			}
			rs = append(rs, x)
		}
		c.reps = append(c.reps, rs)
	}
	for _, rs := range c.reps {
		for _, x := range rs {
			if err := c.start(x); err != nil {
				c.close()
				return nil, err
			}
		}
	}
	c.startDrivers()
	if _, err := c.leaders(ctx, nil); err != nil {
		c.close()
		return nil, err
	}
	if spec.clientNodes != nil {
		return c, nil
	}
	inc := uint64(time.Now().UnixNano())
	for k := range spec.clients {
		node, err := fabric.Open(c.fab, mcClientID(k))
		if err != nil {
			c.close()
			return nil, err
		}
		l, err := newMcLoader(node, k, inc, spec.tree, c.members, spec.window, spec.slotSize)
		if err != nil {
			node.Close()
			c.close()
			return nil, err
		}
		c.loaders = append(c.loaders, l)
	}
	if err := registerAll(ctx, c.loaders); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// newMcLoader makes client slot k (incarnation inc+k) on node.
func newMcLoader(node rdma.Node, k int, inc uint64, tr *tree.Tree, members [][]rdma.NodeID, window, slotSize int) (*mcLoader, error) {
	l := &mcLoader{slot: k, node: node, db: node.Doorbell(), tr: tr, rng: rand.New(rand.NewPCG(inc, uint64(k))), sent: make([]time.Time, window)}
	cl, err := multicast.NewClient(multicast.ClientConfig{Slot: uint32(k), Inc: inc + uint64(k), Tree: tr, Members: members,
		ClientSlots: window, SlotSize: slotSize, OnDone: l.done}, node)
	if err != nil {
		return nil, err
	}
	l.c = cl
	return l, nil
}

// registerAll registers every client with every group, concurrently.
func registerAll(ctx context.Context, ls []*mcLoader) error {
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for k, l := range ls {
		wg.Add(1)
		go func() { defer wg.Done(); errs[k] = l.register(ctx) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// start opens x's node and replica (again, after a crash: a restart with
// its stable state and empty memory) and its polling goroutine.
func (c *mcCluster) start(x *mcReplica) error {
	var node rdma.Node
	if c.spec.shared() {
		if c.nodes == nil {
			c.nodes = map[rdma.NodeID]rdma.Node{}
		}
		if node = c.nodes[x.id]; node == nil {
			n, err := fabric.Open(c.fab, x.id)
			if err != nil {
				return err
			}
			node = n
			c.nodes[x.id] = n
			c.drivers = append(c.drivers, &mcDriver{node: n})
		}
	} else {
		n, err := fabric.Open(c.fab, x.id)
		if err != nil {
			return err
		}
		node = n
	}
	x.app = &mcApp{}
	r, err := multicast.New(x.cfg, node, x.app, x.stable)
	if err != nil {
		if !c.spec.shared() {
			node.Close()
		}
		return fmt.Errorf("group %d replica %d: %w", x.g, x.i, err)
	}
	x.node, x.r = node, r
	if c.spec.shared() {
		x.shared = true
		for _, d := range c.drivers {
			if d.node == node {
				d.reps = append(d.reps, x)
			}
		}
		return nil // the node's driver polls it (startDrivers)
	}
	if c.spec.runtime() {
		if c.pg == nil {
			c.pg = poller.NewGroup(poller.GroupConfig{Pollers: max(1, min(goruntime.GOMAXPROCS(0), c.spec.tree.Len())), Spin: c.spec.spin})
			ctx, cancel := context.WithCancel(context.Background())
			c.pgCancel, c.pgDone = cancel, make(chan struct{})
			go func() { defer close(c.pgDone); c.pg.Run(ctx) }()
		}
		h := c.pg.AddTo(int(x.g), callPoller{x}, node)
		done := make(chan struct{})
		var once sync.Once
		// stop: once Remove returns the replica is never polled again.
		x.cancel, x.done = func() { once.Do(func() { h.Remove(); close(done) }) }, done
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel, x.done = cancel, make(chan struct{})
	pg := poller.NewGroup(poller.GroupConfig{Pollers: 1})
	pg.Add(callPoller{x}, node)
	go func() { defer close(x.done); pg.Run(ctx) }()
	return nil
}

// startDrivers starts one poller per shared node.
func (c *mcCluster) startDrivers() {
	for _, d := range c.drivers {
		md := poller.NewGroup(poller.GroupConfig{Pollers: 1})
		for _, x := range d.reps {
			md.Add(callPoller{x}, d.node)
		}
		ctx, cancel := context.WithCancel(context.Background())
		d.cancel, d.done = cancel, make(chan struct{})
		for _, x := range d.reps {
			x.cancel, x.done = cancel, d.done
		}
		go func() { defer close(d.done); md.Run(ctx) }()
	}
}

// runCalls runs the calls queued by do.
func (x *mcReplica) runCalls() {
	if !x.pending.Load() {
		return
	}
	x.mu.Lock()
	calls := x.calls
	x.calls = nil
	x.pending.Store(false)
	x.mu.Unlock()
	for _, f := range calls {
		f()
	}
}

// do runs f on x's polling goroutine and waits for it; false if the
// replica is not running.
func (x *mcReplica) do(f func()) bool {
	if x.done == nil {
		return false
	}
	ran := make(chan struct{})
	x.mu.Lock()
	x.calls = append(x.calls, func() { f(); close(ran) })
	x.pending.Store(true)
	x.mu.Unlock()
	x.node.Doorbell().Ring()
	select {
	case <-ran:
		return true
	case <-x.done:
		return false
	}
}

// stop ends x's polling goroutine.
func (x *mcReplica) stop() {
	if x.done == nil {
		return
	}
	x.cancel()
	<-x.done
}

// halt closes x's replica and node (after stop); it is down until the
// next start.
func (x *mcReplica) halt() error {
	if x.done == nil {
		return nil
	}
	err := x.r.Close()
	if !x.shared {
		err = errors.Join(err, x.node.Close())
	}
	x.done = nil
	return err
}

// alive reports whether x runs.
func (x *mcReplica) alive() bool { return x.done != nil }

// leaders waits until every group has a live replica leading a committed
// epoch above after[g] (after may be nil), and returns its index per group.
func (c *mcCluster) leaders(ctx context.Context, after []broadcast.Epoch) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, stallTimeout)
	defer cancel()
	out := make([]int, len(c.reps))
	for {
		missing := -1
		for g, rs := range c.reps {
			out[g] = -1
			for i, x := range rs {
				if !x.alive() {
					continue
				}
				if e, ok := x.r.Broadcast().Leading(); ok && (after == nil || e > after[g]) {
					out[g] = i
					break
				}
			}
			if out[g] < 0 && missing < 0 {
				missing = g
			}
		}
		if missing < 0 {
			return out, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("group %d has no leader: %w", missing, err)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// leaderEpochs is each group's leading epoch (0 where none leads now).
func (c *mcCluster) leaderEpochs() []broadcast.Epoch {
	out := make([]broadcast.Epoch, len(c.reps))
	for g, rs := range c.reps {
		for _, x := range rs {
			if !x.alive() {
				continue
			}
			if e, ok := x.r.Broadcast().Leading(); ok && e > out[g] {
				out[g] = e
			}
		}
	}
	return out
}

// check reads every live replica's anomaly counters (duplicates, gaps,
// stale entries: zero in a correct run) on its polling goroutine.
func (c *mcCluster) check() error {
	var errs []error
	for _, rs := range c.reps {
		for _, x := range rs {
			var d, g, s uint64
			if !x.do(func() { d, g, s = x.r.Anomalies() }) {
				continue
			}
			if d+g+s != 0 {
				errs = append(errs, fmt.Errorf("group %d replica %d: anomalies: %d duplicates, %d gaps, %d stale", x.g, x.i, d, g, s))
			}
		}
	}
	return errors.Join(errs...)
}

// counters sums every live replica's counters (read on its polling
// goroutine).
func (c *mcCluster) counters() multicast.Counters {
	var sum multicast.Counters
	for _, rs := range c.reps {
		for _, x := range rs {
			var k multicast.Counters
			if !x.do(func() { k = x.r.Counters() }) {
				continue
			}
			sum.Ordered += k.Ordered
			sum.Forwarded += k.Forwarded
			sum.Retransmits += k.Retransmits
			sum.Replies += k.Replies
			sum.Resets += k.Resets
			sum.Blocked += k.Blocked
			sum.Dropped += k.Dropped
			sum.Malformed += k.Malformed
		}
	}
	return sum
}

// parks is the runtime poller group's parks so far (-1 for another
// placement).
func (c *mcCluster) parks() int64 { return groupParks(c.pg) }

// close stops every client and replica and removes the shm directory.
func (c *mcCluster) close() error {
	var err error
	for _, l := range c.loaders {
		err = errors.Join(err, l.c.Close(), l.node.Close())
	}
	c.loaders = nil
	for _, rs := range c.reps {
		for _, x := range rs {
			x.stop()
		}
	}
	for _, rs := range c.reps {
		for _, x := range rs {
			err = errors.Join(err, x.halt())
		}
	}
	for _, d := range c.drivers {
		err = errors.Join(err, d.node.Close())
	}
	c.drivers, c.nodes = nil, nil
	if c.pg != nil {
		c.pgCancel()
		<-c.pgDone
		c.pg = nil
	}
	if c.dir != "" && c.spec.shmPath == "" {
		err = errors.Join(err, os.RemoveAll(c.dir))
	}
	return err
}

// mcLoadSpec is what every client of a load does: keep its window of
// messages outstanding (closed loop) to destinations chosen per message.
type mcLoadSpec struct {
	dests    int  // destination groups per message
	adjacent bool // a random connected set of dests groups, not any dests groups
	mixed    bool // dests uniform in 1..groups per message (soak)
	window   int  // outstanding messages per client (<= ClientSlots)
	payload  []byte
	// from and to bound the measured part: completions in [from, to)
	// count and are timed. If none came by to (one message outlasting the
	// window on a busy machine), the first one after it counts too, and
	// the measured part lasts until it (last).
	from, to time.Time
	// record keeps every completion's send and completion time.
	record bool

	// h times the measured completions of every client (fixed memory, so a
	// soak's RSS is the cluster's).
	mu   sync.Mutex
	h    hist.Hist
	last time.Time // the latest measured completion
}

// mcSample is one completed message.
type mcSample struct {
	sent, done int64 // Unix ns
}

// mcLoadResult is what one client's load measured.
type mcLoadResult struct {
	n       uint64     // measured completions
	total   uint64     // every completion
	samples []mcSample // record: every completion
	retried uint64     // messages the client wrote again (Outcome.Retries > 0)
	bad     uint64     // outcomes without exactly one reply per destination
	badWhat string
	err     error
}

// mcLoader is a closed-loop client.
type mcLoader struct {
	slot int
	node rdma.Node
	db   rdma.Doorbell
	c    *multicast.Client
	tr   *tree.Tree
	rng  *rand.Rand
	sent []time.Time // by seq mod window: when the message was written

	sp  *mcLoadSpec
	res *mcLoadResult
}

// register polls the client until every group registered it.
func (l *mcLoader) register(ctx context.Context) error {
	deadline := time.Now().Add(stallTimeout)
	start := time.Now()
	for !l.c.Ready() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("client %d: not registered with every group after %v", l.slot, stallTimeout)
		}
		seq := l.db.Seq()
		now := time.Since(start)
		if l.c.Poll(now) {
			continue
		}
		l.db.Wait(seq, min(l.c.NextDeadline()-now, time.Millisecond))
	}
	return nil
}

// done is the client's OnDone: it times and checks the outcome.
func (l *mcLoader) done(o *multicast.Outcome) {
	now := time.Now()
	sent := l.sent[o.ID.Seq%uint64(len(l.sent))]
	res, sp := l.res, l.sp
	res.total++
	if o.Retries > 0 {
		res.retried++
	}
	ok := len(o.Replies) == o.Dst.Len()
	for _, r := range o.Replies {
		if !o.Dst.Has(r.Group) || r.Index == 0 {
			ok = false
		}
	}
	if !ok && res.bad == 0 {
		res.badWhat = fmt.Sprintf("message %v to %v: %d replies %v", o.ID, o.Dst, len(o.Replies), o.Replies)
	}
	if !ok {
		res.bad++
	}
	if sp.record {
		res.samples = append(res.samples, mcSample{sent: sent.UnixNano(), done: now.UnixNano()})
	}
	if !now.Before(sp.from) {
		sp.mu.Lock()
		if now.Before(sp.to) || sp.h.N() == 0 {
			res.n++
			sp.h.Record(now.Sub(sent))
			sp.last = now
		}
		sp.mu.Unlock()
	}
}

// pick chooses a message's destinations.
func (l *mcLoader) pick(sp *mcLoadSpec) tree.Set {
	n := l.tr.Len()
	k := sp.dests
	if sp.mixed {
		k = 1 + l.rng.IntN(n)
	}
	if k >= n {
		return l.tr.All()
	}
	if sp.adjacent {
		return adjacentSet(l.tr, k, l.rng)
	}
	var s tree.Set
	for s.Len() < k {
		s = s.Add(tree.Group(l.rng.IntN(n)))
	}
	return s
}

// adjacentSet is a random connected set of k groups of t: a random group,
// then k-1 times a random neighbour (parent or child) of the set so far.
// For k = 2 it is a group and its parent or one of its children.
func adjacentSet(t *tree.Tree, k int, rng *rand.Rand) tree.Set {
	s := tree.Of(tree.Group(rng.IntN(t.Len())))
	for s.Len() < k {
		var nb tree.Set
		for v := uint64(s); v != 0; v &= v - 1 {
			g := tree.Group(bits.TrailingZeros64(v))
			if p, ok := t.Parent(g); ok {
				nb = nb.Add(p)
			}
			nb |= t.ChildSet(g)
		}
		nb &^= s
		v := uint64(nb)
		for j := rng.IntN(nb.Len()); j > 0; j-- {
			v &= v - 1
		}
		s = s.Add(tree.Group(bits.TrailingZeros64(v)))
	}
	return s
}

// run keeps sp.window messages outstanding until stop is set, then stops
// sending and waits for the outstanding ones (at most stallTimeout).
func (l *mcLoader) run(sp *mcLoadSpec, stop *atomic.Bool) mcLoadResult {
	res := mcLoadResult{}
	l.sp, l.res = sp, &res
	start := time.Now()
	stopping := false
	var drainBy time.Time
	for {
		seq := l.db.Seq()
		now := time.Since(start)
		progress := l.c.Poll(now)
		if !stopping && stop.Load() {
			stopping = true
			drainBy = time.Now().Add(stallTimeout)
		}
		if stopping {
			if l.c.Outstanding() == 0 {
				break
			}
			if time.Now().After(drainBy) {
				res.err = fmt.Errorf("client %d: %d message(s) still outstanding %v after the load stopped", l.slot, l.c.Outstanding(), stallTimeout)
				break
			}
		} else {
			for l.c.Outstanding() < sp.window {
				t := time.Now()
				id, err := l.c.Multicast(l.pick(sp), sp.payload)
				if err == nil {
					l.sent[id.Seq%uint64(len(l.sent))] = t
				} else {
					if errors.Is(err, multicast.ErrWindowFull) {
						break
					}
					res.err = fmt.Errorf("client %d: %w", l.slot, err)
					stop.Store(true)
					return res
				}
				progress = true
			}
		}
		if progress {
			continue
		}
		if w := min(l.c.NextDeadline()-now, time.Millisecond); w > 0 {
			l.db.Wait(seq, w)
		}
	}
	l.sp, l.res = nil, nil
	return res
}

// runLoaders runs every loader with sp until stop is set (by the caller,
// or at sp.to when wait is true) and gathers their results.
func runLoaders(ls []*mcLoader, sp *mcLoadSpec, stop *atomic.Bool, wait bool) []mcLoadResult {
	sp.h.Reset()
	out := make([]mcLoadResult, len(ls))
	var wg sync.WaitGroup
	for k, l := range ls {
		wg.Add(1)
		go func() { defer wg.Done(); out[k] = l.run(sp, stop) }()
	}
	if wait {
		for time.Now().Before(sp.to) && !stop.Load() {
			time.Sleep(min(time.Until(sp.to), 10*time.Millisecond))
		}
		stop.Store(true)
	}
	for _, l := range ls {
		l.db.Ring()
	}
	wg.Wait()
	return out
}

// mcMerged is the merge of every client's result of one load.
type mcMerged struct {
	p50, p99 time.Duration
	n, total uint64
	retried  uint64
	opsPerS  float64
	err      error
}

// merge merges the loaders' results of sp; dur is the measured part's
// length, unless its only completion came after it (ops/s is then over
// the time until that one).
func merge(sp *mcLoadSpec, rs []mcLoadResult, dur time.Duration) mcMerged {
	sp.mu.Lock()
	if !sp.last.IsZero() {
		dur = max(dur, sp.last.Sub(sp.from))
	}
	sp.mu.Unlock()
	var m mcMerged
	var errs []error
	for _, r := range rs {
		m.n += r.n
		m.total += r.total
		m.retried += r.retried
		if r.err != nil {
			errs = append(errs, r.err)
		}
		if r.bad > 0 {
			errs = append(errs, fmt.Errorf("%d outcome(s) without one reply per destination, e.g. %s", r.bad, r.badWhat))
		}
	}
	m.p50, m.p99 = sp.h.Quantile(0.50), sp.h.Quantile(0.99)
	if dur > 0 {
		m.opsPerS = float64(m.n) / dur.Seconds()
	}
	m.err = errors.Join(errs...)
	return m
}

// quantiles returns the p50 and p99 of lat (sorted in place).
func quantiles(lat []time.Duration) (p50, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[min(int(f*float64(len(lat))), len(lat)-1)] }
	return q(0.5), q(0.99)
}
