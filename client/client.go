// Package client is the Go library applications use to reach an rdmakv
// cluster: puts, deletes, compare-and-swaps and atomic batches go through
// the cluster's ordering (TRAM over Acuerdo, exactly once), and gets read
// the replicas' memory one-sided, without the servers' CPU.
//
// Keys live in the default (hashed) keyspace, or in a named ordered
// keyspace (Client.Keyspace): sorted keys with scans and atomic batches.
// Single-key writes of both kinds go through one write combiner per
// client: concurrent writes to a group share a message, each with its own
// condition and result.
//
// A Client is safe for concurrent use. Every method takes a context and
// returns typed errors (ErrNotFound, ErrKeyTooLarge, ErrValueTooLarge,
// ErrCASMismatch, *UnavailableError, ...). docs/client.md explains the
// guarantees, the limits and what a retry means.
package client

import (
	"io/fs"
	"os"
	"path/filepath"

	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// Errors. Test them with errors.Is.
var (
	// ErrNotFound: the key has no value.
	ErrNotFound = errors.New("rdmakv: key not found")
	// ErrEmptyKey: keys have at least one byte.
	ErrEmptyKey = errors.New("rdmakv: empty key")
	// ErrKeyTooLarge: the key is longer than the cluster's MaxKey.
	ErrKeyTooLarge = errors.New("rdmakv: key too large")
	// ErrValueTooLarge: the value is longer than the cluster's MaxValue.
	ErrValueTooLarge = errors.New("rdmakv: value too large")
	// ErrBatchTooLarge: a batch has more operations than MaxBatch.
	ErrBatchTooLarge = errors.New("rdmakv: batch too large")
	// ErrCASMismatch: a compare-and-swap (or a conditional batch op)
	// found another value or version; nothing was written.
	ErrCASMismatch = errors.New("rdmakv: compare-and-swap mismatch")
	// ErrUnavailable is wrapped by *UnavailableError.
	ErrUnavailable = errors.New("rdmakv: group unavailable")
	// ErrOutcomeUnknown: the context ended (or the client closed) while a
	// write was under way. The write may still be applied, once: it is
	// never applied twice, but this client will not learn its outcome.
	ErrOutcomeUnknown = errors.New("rdmakv: write outcome unknown")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("rdmakv: client closed")
	// ErrDiskFull: the write's group refuses writes because its
	// replicas' disks are full (durability sync or async; docs/
	// operations.md, "A full disk"). The error names the group. Alone,
	// nothing was written; together with ErrOutcomeUnknown the write was
	// sent before the group refused it and stays queued there: it may
	// still be applied, once, when space returns. Alone, the client's
	// window to the group was full of writes the group refused (also
	// for a moment right after space returns, until the group answered
	// them). Retry once space is freed.
	ErrDiskFull = errors.New("rdmakv: disk full")
)

// diskFullErr maps a call ended by a disk-full notice (nil otherwise).
func diskFullErr(err error) error {
	var df *multicast.DiskFullError
	if !errors.As(err, &df) {
		return nil
	}
	if df.Sent {
		return fmt.Errorf("%w: %w: group %d refuses writes, its disk is full (the write stays queued in the group and may still be applied once space returns)", ErrOutcomeUnknown, ErrDiskFull, df.Group)
	}
	return fmt.Errorf("%w: group %d refuses writes, its disk is full (nothing written)", ErrDiskFull, df.Group)
}

// UnavailableError says which group could not be reached in time.
type UnavailableError struct {
	Group uint32
	Err   error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("rdmakv: group %d unavailable: %v", e.Group, e.Err)
}

func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// Consistency of gets.
type Consistency = kv.Consistency

const (
	// Linearizable gets see every write acknowledged before they began
	// (the default).
	Linearizable = kv.Linearizable
	// StaleOK gets read the nearest replica, which may lag; Item.Lag
	// says by how much at most.
	StaleOK = kv.StaleOK
)

// Option configures Open.
type Option func(*options)

type options struct {
	m           *cluster.Map
	mapFile     string
	node        rdma.Node
	slot        int
	timeout     time.Duration
	consistency Consistency
	near        int
	listen      string
	secret      []byte
	backoffMin  time.Duration
	backoffMax  time.Duration
	configFile  string
	seed        string
	degraded    bool
	hold        int
	holdSet     bool
	rounds      bool
	roundsSet   bool
}

// WithCombineHold sets the messages of single-key writes a group may have
// in flight before a new write queues for one of them to complete rather
// than posting a message of its own (write combining: the completion posts
// the queue as one message): n >= 1, or 0 for the whole window
// (client_slots: a write posts whenever a slot is free). A lone writer
// never waits. The default is DefaultCombineHold (0) with the busy hold
// (DefaultCombineBusyHold: a hold of 1 while many writes arrive for the
// group during a round trip), or DefaultSyncCombineHold (1) when the
// cluster map says the cluster's durability is sync. A hold set here
// replaces the busy hold. A hold of 1 sends fewer, larger messages when
// many goroutines write at once, but makes a few concurrent writers wait
// for each other's round trips.
func WithCombineHold(n int) Option { return func(o *options) { o.hold, o.holdSet = n, true } }

// WithCombineRounds says whether the write combiner sends its groups'
// messages in rounds: a write to a group waits, besides its group's hold,
// while another group has a message in flight posted less than a few
// milliseconds ago, so that the groups' messages go out together when the
// last completes. It suits groups that share a disk (the embedded
// cluster's one log a process, in sync mode: their records then go in
// one fsync instead of alternate ones); groups on disks of their own
// wait for each other's commits. The default is off
// (DefaultSyncCombineRounds: alone they were not faster). A lone writer
// never waits.
func WithCombineRounds(on bool) Option {
	return func(o *options) { o.rounds, o.roundsSet = on, true }
}

// WithMap uses the cluster map m.
func WithMap(m *cluster.Map) Option { return func(o *options) { o.m = m } }

// WithMapFile loads the cluster map from a file (the default is
// DefaultMapFile).
func WithMapFile(path string) Option { return func(o *options) { o.mapFile = path } }

// WithNode uses an rdma node the caller opened (its id must be the
// client slot's node); Close leaves it open. Tests and in-process
// clusters on the mem fabric need it.
func WithNode(n rdma.Node) Option { return func(o *options) { o.node = n } }

// WithSlot picks the client slot: one live client per slot. Without it, a
// client of an shm cluster claims the first free slot of the host (a lock
// file per slot, released by Close or by the process's death), and other
// clients take slot 0.
func WithSlot(k int) Option { return func(o *options) { o.slot = k } }

// WithTimeout bounds each call whose context has no deadline (default
// 10 s), retries included.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithConsistency sets the default consistency of gets.
func WithConsistency(c Consistency) Option { return func(o *options) { o.consistency = c } }

// WithNearReplica picks which replica of each group stale-ok gets read
// first (an index into the group's members; default 0).
func WithNearReplica(i int) Option { return func(o *options) { o.near = i } }

// WithTCP sets the listen address and cluster secret of the client's node
// on the tcp fabric.
func WithTCP(listen string, secret []byte) Option {
	return func(o *options) { o.listen, o.secret = listen, secret }
}

// WithBackoff bounds the wait between retries of a get that found no
// confirmed leader (default 100 µs to 50 ms, doubling).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = min, max }
}

// WithDegradedOpen makes Open return once the groups that have a leader
// registered the client (waiting at most a second for the others), and
// succeed even if no group did: for tools that report a degraded
// cluster's state (Status reads the replicas' headers and needs no group
// to register the client). Calls to a group that has not registered fail
// with *UnavailableError until it does.
func WithDegradedOpen() Option { return func(o *options) { o.degraded = true } }

// DefaultMapFile is where a local cluster's map is found when no map is
// given (kvserver with no arguments writes it).
const DefaultMapFile = "/tmp/rdmakv/cluster.json"

// Client is a connection to a cluster.
type Client struct {
	o        options
	m        *cluster.Map
	tree     *tree.Tree
	node     rdma.Node
	own      bool
	mc       *multicast.Client // a started client: calls post and wait on the caller's goroutine
	pools    []readerPool
	ord      ordered // ordered keyspaces' readers and cache (keyspace.go)
	comb     combiner
	slotLock *os.File      // the claimed slot's lock file (shm clusters), closed by Close
	inc      uint64        // the multicast client's incarnation
	stageSeq atomic.Uint64 // numbers staged requests
	stages   stageLimiter  // bounds the requests staged at once (ops.go)
	// knownTab is the highest entry index seen per group.
	knownTab []atomic.Uint64

	// down: why each group that had not registered the client when Open
	// returned has no leader (the error of its calls until it registers).
	downMu sync.Mutex
	down   map[uint32]string

	// life: calls hold it shared, Close exclusively (to wait for them).
	life   sync.RWMutex
	closed atomic.Bool
	done   chan struct{}
}

// Open connects to a cluster: it opens the client's rdma node (unless
// WithNode), registers with every group, and is ready for calls.
//
// Registering with a group needs the group to have a leader. Open waits
// for every group, but not for a group that cannot elect one: no majority
// of its replicas is reachable and able to vote (a replica that restarted
// without its data cannot vote until a leader catches it up). It then
// serves the groups that registered it, and a call to another group fails
// at once with *UnavailableError saying why (the client keeps registering
// in the background: once the group has a leader again, its calls work).
// Open fails if no group registered it, and fails at once, with an error
// wrapping tcp.ErrAuth, if a replica refuses the client's cluster secret.
//
// Open waits for a group that could elect a leader until ctx ends (a ctx
// without a deadline: until the WithTimeout bound), never longer: it then
// serves the groups that registered the client, as above, or, if none
// did, fails with an error wrapping ctx's error and ErrUnavailable that
// names each group and why. A ctx already done fails Open at once.
func Open(ctx context.Context, opts ...Option) (*Client, error) {
	o := options{slot: -1, timeout: 10 * time.Second, backoffMin: 100 * time.Microsecond, backoffMax: 50 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rdmakv: open: %w", err)
	}
	m := o.m
	if m == nil && (o.configFile != "" || o.seed != "") {
		var err error
		if m, err = loadRemote(ctx, &o); err != nil {
			return nil, fmt.Errorf("rdmakv: open: %w", err)
		}
	}
	if m == nil {
		path := o.mapFile
		if path == "" {
			path = DefaultMapFile
		}
		var err error
		if m, err = cluster.Load(path); err != nil {
			return nil, fmt.Errorf("rdmakv: open: %w", err)
		}
	} else if err := m.Fill(); err != nil {
		return nil, fmt.Errorf("rdmakv: open: %w", err)
	}
	var slotLock *os.File
	if o.slot < 0 && m.Fabric == "shm" && o.node == nil {
		k, f, err := claimSlot(m)
		if err != nil {
			return nil, fmt.Errorf("rdmakv: open: %w", err)
		}
		o.slot, slotLock = k, f
	}
	var claimed rdma.Node // a tcp node listening on the claimed slot's address
	if o.slot < 0 && m.Fabric == "tcp" && o.node == nil && o.listen == "" {
		k, n, err := claimTCPSlot(m, o.secret)
		if err != nil {
			return nil, fmt.Errorf("rdmakv: open: %w", err)
		}
		o.slot, claimed = k, n
	} else if o.slot < 0 {
		o.slot = 0
	}
	opened := false
	defer func() {
		if !opened && slotLock != nil {
			releaseSlot(slotLock)
		}
		if !opened && claimed != nil {
			claimed.Close()
		}
	}()
	if o.hold < 0 {
		return nil, fmt.Errorf("rdmakv: open: WithCombineHold(%d): want 0 (the whole window) or more", o.hold)
	}
	if o.slot < 0 || o.slot >= len(m.ClientNodes) {
		return nil, fmt.Errorf("rdmakv: open: client slot %d: the map has %d", o.slot, len(m.ClientNodes))
	}
	t, err := m.Overlay()
	if err != nil {
		return nil, err
	}
	c := &Client{o: o, m: m, tree: t, node: o.node, done: make(chan struct{})}
	id := m.ClientNodes[o.slot]
	if c.node == nil && claimed != nil {
		c.node, c.own, claimed = claimed, true, nil
	} else if c.node == nil {
		if c.node, err = openNode(m, id, &o); err != nil {
			return nil, fmt.Errorf("rdmakv: open node %d: %w", id, err)
		}
		c.own = true
	} else if c.node.ID() != id {
		return nil, fmt.Errorf("rdmakv: open: node %d is not client slot %d's node %d", c.node.ID(), o.slot, id)
	}
	c.knownTab = make([]atomic.Uint64, len(m.Groups))
	c.comb = combiner{c: c, queued: make([][]*pendingOp, len(m.Groups)), inflight: make([]int, len(m.Groups)), sending: make([]bool, len(m.Groups))}
	c.comb.hold = DefaultCombineHold
	if m.Durability == cluster.DurabilitySync {
		c.comb.hold = DefaultSyncCombineHold
	}
	if o.holdSet {
		c.comb.hold = o.hold
	}
	c.comb.busy = DefaultCombineBusyHold && !o.holdSet && m.Durability != cluster.DurabilitySync
	c.comb.arrivals, c.comb.busyAvg, c.comb.busyOn = make([]uint64, len(m.Groups)), make([]uint32, len(m.Groups)), make([]bool, len(m.Groups))
	c.comb.rounds = m.Durability == cluster.DurabilitySync && DefaultSyncCombineRounds
	if o.roundsSet {
		c.comb.rounds = o.rounds
	}
	c.comb.roundWait, c.comb.posted = roundMax, make([]time.Time, len(m.Groups))
	if c.comb.hold == 0 || c.comb.hold > m.Limits.ClientSlots {
		c.comb.hold = m.Limits.ClientSlots
	}
	c.pools = make([]readerPool, len(m.Groups))
	octx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	c.inc = uint64(time.Now().UnixNano())
	mc, err := multicast.StartClientAsync(multicast.ClientConfig{
		Slot: uint32(o.slot), Inc: c.inc, Tree: t, Members: m.Groups,
		ClientSlots: m.Limits.ClientSlots, SlotSize: m.Limits.SlotSize, MaxResult: cluster.MaxResult,
	}, c.node)
	if err == nil {
		c.mc = mc
		if err = c.register(ctx, octx); err != nil {
			mc.Close()
		}
	}
	if err != nil {
		if c.own {
			c.node.Close()
		}
		return nil, fmt.Errorf("rdmakv: open: %w", err)
	}
	opened = true
	c.slotLock = slotLock
	return c, nil
}

func openNode(m *cluster.Map, id rdma.NodeID, o *options) (rdma.Node, error) {
	s := fabric.ForMap(m)
	s.Listen, s.Secret = o.listen, o.secret
	return fabric.Open(s, id)
}

// Map is the cluster map the client uses.
func (c *Client) Map() *cluster.Map { return c.m }

// Close ends the client: calls under way return ErrClosed (a write among
// them has an unknown outcome), and every Conn, region and (unless
// WithNode) the node is released.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(c.done)
	err := c.mc.Close()
	c.life.Lock() // every call returned
	defer c.life.Unlock()
	for g := range c.pools {
		p := &c.pools[g]
		p.mu.Lock()
		for _, r := range p.free {
			r.Close()
		}
		p.free = nil
		p.mu.Unlock()
	}
	c.closeOrdered()
	if c.slotLock != nil {
		defer releaseSlot(c.slotLock) // the slot is free once the node is closed
	}
	if c.own {
		if e := c.node.Close(); err == nil {
			err = e
		}
	}
	return err
}

// enter registers a call (Close waits for it: exit ends it) and returns
// its deadline: ctx's, or the default timeout from now if ctx has none.
// Close also ends the calls under way: the multicast client fails waiting
// writes with ErrClosed, and gets watch c.done.
func (c *Client) enter(ctx context.Context) (time.Time, error) {
	c.life.RLock()
	if c.closed.Load() {
		c.life.RUnlock()
		return time.Time{}, ErrClosed
	}
	if d, ok := ctx.Deadline(); ok {
		return d, nil
	}
	return time.Now().Add(c.o.timeout), nil
}

func (c *Client) exit() { c.life.RUnlock() }

// begin is enter for calls that pass the deadline on in a context.
func (c *Client) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	d, err := c.enter(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, c.exit, nil
	}
	ctx, cancel := context.WithDeadline(ctx, d)
	return ctx, func() { cancel(); c.exit() }, nil
}

func (c *Client) checkKey(key []byte) error {
	switch {
	case len(key) == 0:
		return ErrEmptyKey
	case len(key) > c.m.Limits.MaxKey:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), c.m.Limits.MaxKey)
	}
	return nil
}

func (c *Client) checkValue(v []byte) error {
	if len(v) > c.m.Limits.MaxValue {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(v), c.m.Limits.MaxValue)
	}
	return nil
}

// claimSlot claims the first client slot of shm cluster m that no other
// live process of the host holds: an exclusive flock on a lock file per
// slot, which the kernel releases when the holder closes it or dies. It
// then removes the lock files that killed clients left (sweepSlots).
func claimSlot(m *cluster.Map) (int, *os.File, error) {
	dir := filepath.Join(os.TempDir(), "rdmakv-slots", m.Name)
	for k := range m.ClientNodes {
		f, err := lockSlot(dir, k)
		if err != nil {
			return 0, nil, err
		}
		if f != nil {
			sweepSlots(dir, f.Name())
			return k, f, nil
		}
	}
	return 0, nil, fmt.Errorf("all %d client slots of cluster %q are in use on this host", len(m.ClientNodes), m.Name)
}

// lockSlot tries to take slot k's lock file in dir: the file, or nil if
// another process holds the slot. A holder removes the file (and the
// directory, once empty) when it lets the slot go, so a lock taken on a
// file that was removed meanwhile is not the slot's: that case retries.
func lockSlot(dir string, k int) (*os.File, error) {
	path := filepath.Join(dir, fmt.Sprintf("slot-%d.lock", k))
	for range 100 {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the directory was removed between the two calls
		}
		if err != nil {
			return nil, err
		}
		if slotLockHook != nil {
			slotLockHook()
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			return nil, nil
		}
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
			return f, nil
		}
		f.Close() // locked a file its holder removed: take the new one
	}
	return nil, fmt.Errorf("client slot %d: its lock file %s keeps changing", k, path)
}

// slotLockHook, if set (tests), runs between opening a lock file and
// locking it: the window in which its holder may remove it.
var slotLockHook func()

// releaseSlot removes the slot's lock file while still holding the lock,
// and the lock files killed clients left (sweepSlots); then the cluster's
// directory and rdmakv-slots itself if they are empty; and closes the
// file. (A claim racing with the removal of a directory retries: see
// lockSlot.)
func releaseSlot(f *os.File) {
	dir := filepath.Dir(f.Name())
	sweepSlots(dir, f.Name())
	os.Remove(f.Name())
	os.Remove(dir)               // fails while other slots are held
	os.Remove(filepath.Dir(dir)) // fails while other clusters' slots are held
	f.Close()
}

// sweepSlots removes the lock files in dir, other than ours, that no
// process holds: those of clients killed (kill -9) before they could
// remove theirs. Each is removed while locked, as a releasing holder
// does, and only if it still is the file at its path, so a claimer that
// opened it meanwhile finds its lock stale and retries (lockSlot). A file
// another process holds is left to it.
func sweepSlots(dir, ours string) {
	paths, _ := filepath.Glob(filepath.Join(dir, "slot-*.lock"))
	for _, path := range paths {
		if path == ours {
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue // removed meanwhile
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			var a, b unix.Stat_t
			if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
				os.Remove(path)
			}
		}
		f.Close()
	}
}
