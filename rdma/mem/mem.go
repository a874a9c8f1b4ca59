// Package mem is the in-process fabric: every node lives in one process and
// a verb is a direct copy into the target region's memory.
//
// In the default immediate mode an op is applied inside Post, so ops on a
// Conn are trivially FIFO and complete at once. In queued mode (Options.Queued)
// Post only queues the op; a driver, the deterministic simulator (package
// sim), decides when each Conn's oldest op lands at the target (Conn.Land,
// or Conn.LandPrefix first for a torn write), when its completion returns to
// the initiator (Conn.Complete), when a partition or a dead target fails the
// queue (Conn.FailPending), and which prefix of a crashed initiator's ops
// still lands (Conn.DropPending, Node.Crash). Conn.Deliver does Land and
// Complete in one call. Permission and bounds checks and the memory effect
// are the same in both modes; queued mode is in queued.go.
package mem

import (
	"fmt"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/internal/hostregion"
)

// Options configure a Fabric. The zero value is immediate mode with
// rdma.DefaultSpin and rdma.DefaultQueueDepth.
type Options struct {
	// Queued holds posted ops until Conn.Deliver (simulator mode).
	Queued bool
	// OnPost, in queued mode, is called after an op is queued on c.
	OnPost func(c *Conn)
	// Spin is the doorbell spin budget; 0 means rdma.DefaultSpin, negative
	// means park at once.
	Spin time.Duration
	// QueueDepth bounds outstanding ops and unpolled completions per Conn.
	QueueDepth int
}

// Fabric is a set of in-process nodes.
type Fabric struct {
	opts  Options
	mu    sync.RWMutex
	nodes map[rdma.NodeID]*Node
}

// New returns an empty fabric.
func New(opts Options) *Fabric {
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = rdma.DefaultQueueDepth
	}
	switch {
	case opts.Spin == 0:
		opts.Spin = rdma.DefaultSpin
	case opts.Spin < 0:
		opts.Spin = 0
	}
	return &Fabric{opts: opts, nodes: make(map[rdma.NodeID]*Node)}
}

// NewNode adds node id. An id may be reused once its previous node is
// closed (a restart); connections to the old node stay broken.
func (f *Fabric) NewNode(id rdma.NodeID) (*Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.nodes[id]; ok {
		return nil, fmt.Errorf("mem: node %d already exists", id)
	}
	n := &Node{f: f, id: id, regions: make(map[rdma.RegionID]*Region), db: rdma.NewLocalDoorbell(f.opts.Spin)}
	f.nodes[id] = n
	return n, nil
}

// Node returns the live node with id, if any.
func (f *Fabric) Node(id rdma.NodeID) (*Node, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n, ok := f.nodes[id]
	return n, ok
}

// Node is one in-process endpoint.
type Node struct {
	f  *Fabric
	id rdma.NodeID
	db *rdma.LocalDoorbell

	mu      sync.RWMutex
	regions map[rdma.RegionID]*Region
	conns   []*Conn
	closed  bool
	crashed []*Region // queued mode: regions of a crashed node, freed by Release
}

var _ rdma.Node = (*Node)(nil)

// ID implements rdma.Node.
func (n *Node) ID() rdma.NodeID { return n.id }

// Doorbell implements rdma.Node.
func (n *Node) Doorbell() rdma.Doorbell { return n.db }

// Closed reports whether the node was closed (crashed).
func (n *Node) Closed() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.closed
}

// Register implements rdma.Node.
func (n *Node) Register(id rdma.RegionID, size int) (rdma.Region, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, rdma.ErrClosed
	}
	if _, ok := n.regions[id]; ok {
		return nil, fmt.Errorf("mem: node %d region %d: %w", n.id, id, rdma.ErrRegionExists)
	}
	hr, err := hostregion.New(id, size)
	if err != nil {
		return nil, fmt.Errorf("mem: node %d: %w", n.id, err)
	}
	r := &Region{Region: hr, node: n}
	n.regions[id] = r
	return r, nil
}

func (n *Node) region(id rdma.RegionID) *Region {
	n.mu.RLock()
	r := n.regions[id]
	n.mu.RUnlock()
	return r
}

// Connect implements rdma.Node.
func (n *Node) Connect(peer rdma.NodeID) (rdma.Conn, error) {
	return n.Dial(peer)
}

// Dial is Connect returning the concrete type (for the simulator).
func (n *Node) Dial(peer rdma.NodeID) (*Conn, error) {
	t, ok := n.f.Node(peer)
	if !ok {
		return nil, fmt.Errorf("mem: node %d: %w", peer, rdma.ErrUnknownPeer)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, rdma.ErrClosed
	}
	c := &Conn{from: n, to: t}
	if n.f.opts.Queued {
		// Completions arrive asynchronously: they ring the initiator.
		c.cq = rdma.NewCQ(n.f.opts.QueueDepth, n.db)
	} else {
		c.cq = rdma.NewCQ(n.f.opts.QueueDepth, nil)
	}
	n.conns = append(n.conns, c)
	return c, nil
}

// Close implements rdma.Node: the node's regions are freed and removed from
// the fabric, and its connections closed.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	regions := n.regions
	n.regions = map[rdma.RegionID]*Region{}
	conns := n.conns
	n.conns = nil
	n.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	for _, r := range regions {
		r.Free()
	}
	n.f.mu.Lock()
	if n.f.nodes[n.id] == n {
		delete(n.f.nodes, n.id)
	}
	n.f.mu.Unlock()
	n.db.Ring()
	return nil
}

// Region is registered memory of a mem node (see package hostregion for
// the locking that makes Revoke final).
type Region struct {
	*hostregion.Region
	node *Node
}

var _ rdma.Region = (*Region)(nil)

// Close implements rdma.Region.
func (r *Region) Close() error {
	n := r.node
	n.mu.Lock()
	if n.regions[r.ID()] == r {
		delete(n.regions, r.ID())
	}
	n.mu.Unlock()
	return r.Free()
}

// Conn is a connection between two mem nodes.
type Conn struct {
	from, to *Node
	cq       *rdma.CQ

	mu     sync.Mutex
	err    error // broken cause
	closed bool
	q      queue // queued mode: ops posted, landed, not yet completed
}

var _ rdma.Conn = (*Conn)(nil)

// PostList implements rdma.Conn. In immediate mode the list is applied
// under one hold of the Conn's lock, each op exactly as Post would apply
// it (the same checks, in the same order, stopping at the first error).
func (c *Conn) PostList(wrs []rdma.WR) (int, error) {
	if c.from.f.opts.Queued {
		return rdma.PostEach(c, wrs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range wrs {
		wr := &wrs[i]
		if err := rdma.CheckWR(wr); err != nil {
			return i, err
		}
		switch {
		case c.closed:
			return i, rdma.ErrClosed
		case c.err != nil:
			return i, fmt.Errorf("%w: %w", rdma.ErrConnBroken, c.err)
		case c.cq.Full():
			return i, rdma.ErrQueueFull
		}
		c.complete(wr, c.exec(wr))
	}
	return len(wrs), nil
}

// Local implements rdma.Conn.
func (c *Conn) Local() rdma.NodeID { return c.from.id }

// Peer implements rdma.Conn.
func (c *Conn) Peer() rdma.NodeID { return c.to.id }

// Err implements rdma.Conn.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Post implements rdma.Conn.
func (c *Conn) Post(wr rdma.WR) error {
	if err := rdma.CheckWR(&wr); err != nil {
		return err
	}
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return rdma.ErrClosed
	case c.err != nil:
		c.mu.Unlock()
		return fmt.Errorf("%w: %w", rdma.ErrConnBroken, c.err)
	}
	if c.from.f.opts.Queued {
		return c.postQueued(wr) // unlocks c.mu
	}
	defer c.mu.Unlock()
	if c.cq.Full() {
		return rdma.ErrQueueFull
	}
	c.complete(&wr, c.exec(&wr))
	return nil
}

// exec applies wr at the target and returns its completion.
func (c *Conn) exec(wr *rdma.WR) rdma.Completion {
	cp := rdma.Completion{ID: wr.ID, Kind: wr.Kind}
	var err error
	if c.to.Closed() {
		err = rdma.ErrPeerDead
	} else if r := c.to.region(wr.Region); r == nil {
		err = rdma.ErrNoRegion
	} else {
		cp.Value, err = r.Apply(c.from.id, wr)
		if err == nil && wr.Kind == rdma.OpWrite && wr.Flags&rdma.Notify != 0 {
			c.to.db.Ring()
		}
	}
	if err != nil {
		cp.Err = &rdma.OpError{Op: wr.Kind, Peer: c.to.id, Region: wr.Region, Offset: wr.Offset, Len: wr.Len(), Err: err}
	}
	return cp
}

// complete records cp's outcome; c.mu is held.
func (c *Conn) complete(wr *rdma.WR, cp rdma.Completion) {
	if cp.Err != nil {
		if c.err == nil {
			c.err = cp.Err
		}
		c.cq.Push(cp)
		return
	}
	if wr.Flags&rdma.Signaled != 0 {
		c.cq.Push(cp)
	}
}

// Poll implements rdma.Conn.
func (c *Conn) Poll(cs []rdma.Completion) int { return c.cq.Poll(cs) }

// Wait implements rdma.Conn.
func (c *Conn) Wait(cs []rdma.Completion, timeout time.Duration) int { return c.cq.Wait(cs, timeout) }

// Outstanding implements rdma.Conn.
func (c *Conn) Outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.q.outstanding()
}

// Close implements rdma.Conn. Queued ops are discarded.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.q.discard()
	return nil
}

// HugePages implements rdma.HugePager: region memory comes from
// rdma.AllocMemory.
func (n *Node) HugePages() rdma.HugePages { return rdma.AnonHugePages() }
