package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// peer is a Node's view of one incarnation of a target node: its node file
// mapping and the region files mapped so far. The Conns to the target share
// it; it is unmapped when the last of them and the Node's cache let go.
type peer struct {
	id    rdma.NodeID
	owner procIdent
	// mon checks the owner's process for checkLive; nil for a node of
	// this process (its closing shows in its node file's closed flag).
	mon  *procMonitor
	nf   []byte
	refs int // Conns + the Node's peers map; guarded by the Node's mu

	mu      sync.Mutex
	regions map[rdma.RegionID]*remoteRegion
	retired []*remoteRegion // closed by the owner; Conns may still hold them
}

// live reports whether the target is open and its process alive (a system
// call: not for the hot path).
func (p *peer) live() bool {
	return rdma.Load64(p.nf, nodeClosedW) == 0 && (p.mon == nil || !p.mon.dead.Load()) && p.owner.alive()
}

// checkLive fails once the target is closed or its owner's monitor found
// the process gone. It makes no system call and allocates nothing: atomic
// loads, and a store and a timer reset only on the first op after an idle
// spell.
func (p *peer) checkLive() error {
	if rdma.Load64(p.nf, nodeClosedW) != 0 {
		return rdma.ErrPeerDead
	}
	if m := p.mon; m != nil {
		return m.use()
	}
	return nil
}

// procMonitor checks that one process of another still runs, for every
// peer of this process whose target node it owns: the nodes of all the
// replicas in one kvserver process share one check, whichever Node (of
// this process) connected to them. Where the kernel gives a pidfd, the
// runtime's poller waits on it (exitwatch.go): no timer, no wake-up, no
// /proc read while the process lives. Otherwise the check (a /proc read)
// runs on a timer's goroutine of the runtime's, every interval while ops
// use one of the peers: an idle monitor costs no wake-ups, and the first
// op after an idle spell re-arms it. dead is sticky: the process is gone
// for good (procIdent names one process for its lifetime).
type procMonitor struct {
	key   monitorKey
	refs  int                        // peers holding it; guarded by monitors.mu
	timer atomic.Pointer[time.Timer] // set once, before it first fires (start)
	used  atomic.Bool
	armed atomic.Bool
	dead  atomic.Bool
	gone  atomic.Bool // released by its last peer: the monitor stops
	// wmu guards watch against release while the monitor reads it.
	wmu   sync.Mutex
	watch *procWatch
	alive func() bool // the check (tests replace it); nil: watch.alive
	// exit is the process's pidfd (nil: the timer checks); stop closes it.
	exit *os.File
}

// monitorKey: one monitor per watched process and check interval (the
// Options of the Nodes that share it).
type monitorKey struct {
	owner procIdent
	every time.Duration
}

// monitors holds this process's monitors by key.
var monitors struct {
	mu sync.Mutex
	m  map[monitorKey]*procMonitor
	// unshared plants a bug (tests): every peer gets a monitor of its
	// own, as before they were shared.
	unshared bool
}

// acquireMonitor returns the monitor of owner's process at interval every,
// started, with one more reference.
func acquireMonitor(owner procIdent, every time.Duration) *procMonitor {
	k := monitorKey{owner: owner, every: every}
	monitors.mu.Lock()
	defer monitors.mu.Unlock()
	if m := monitors.m[k]; m != nil && !monitors.unshared {
		m.refs++
		return m
	}
	if monitors.m == nil {
		monitors.m = make(map[monitorKey]*procMonitor)
	}
	m := &procMonitor{key: k, refs: 1}
	if f, dead, ok := openExitWatch(owner); ok {
		m.exit = f
		m.dead.Store(dead)
	}
	m.start()
	if monitors.m[k] == nil {
		monitors.m[k] = m
	}
	return m
}

// release drops one reference; the last stops the monitor.
func (m *procMonitor) release() {
	monitors.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last && monitors.m[m.key] == m {
		delete(monitors.m, m.key)
	}
	monitors.mu.Unlock()
	if last {
		m.stop()
	}
}

// use fails once the process was found dead, and marks the monitor used
// (re-arming it after an idle spell).
func (m *procMonitor) use() error {
	if m.dead.Load() {
		return rdma.ErrPeerDead
	}
	if !m.used.Load() {
		m.used.Store(true)
	}
	if !m.armed.Load() && m.armed.CompareAndSwap(false, true) {
		if t := m.timer.Load(); t != nil { // nil: the exit watch, or dead at the start
			t.Reset(m.key.every)
		}
	}
	return nil
}

// start starts the monitor: the exit watch if it has a pidfd, else the
// timer; a process found gone at the start needs neither.
func (m *procMonitor) start() {
	switch {
	case m.exit != nil:
		go m.waitExit(m.exit)
	case m.dead.Load():
	default:
		m.startTimer()
	}
}

// startTimer arms the monitor for its first check one interval from now
// (the timer is stored before it can fire), opening its stat file if the
// check needs one.
func (m *procMonitor) startTimer() {
	m.wmu.Lock()
	if m.gone.Load() {
		m.wmu.Unlock()
		return
	}
	if m.watch == nil && m.alive == nil {
		m.watch = newProcWatch(m.key.owner)
	}
	m.wmu.Unlock()
	m.armed.Store(true)
	m.used.Store(true)
	m.timer.Store(time.AfterFunc(time.Duration(1<<62), m.check))
	m.timer.Load().Reset(m.key.every)
}

// check is the timer's function: it checks the process if ops used a peer
// of it since the last check, and re-arms the timer; an unused monitor is
// left unarmed until the next op.
func (m *procMonitor) check() {
	if m.gone.Load() {
		return
	}
	if !m.used.Swap(false) {
		m.armed.Store(false)
		// an op that saw armed just before the store re-arms nothing:
		// look again
		if m.used.Load() && m.armed.CompareAndSwap(false, true) {
			m.timer.Load().Reset(m.key.every)
		}
		return
	}
	m.wmu.Lock()
	alive := true
	switch {
	case m.alive != nil:
		alive = m.alive()
	case m.watch != nil:
		alive = m.watch.alive()
	}
	m.wmu.Unlock()
	if !alive {
		m.dead.Store(true)
		return
	}
	if !m.gone.Load() {
		m.timer.Load().Reset(m.key.every)
	}
}

// stop ends the monitor and releases its stat file or pidfd.
func (m *procMonitor) stop() {
	m.gone.Store(true)
	if t := m.timer.Load(); t != nil {
		t.Stop()
	}
	m.wmu.Lock()
	if m.watch != nil {
		m.watch.close()
		m.watch = nil
	}
	if m.exit != nil {
		m.exit.Close() // waitExit returns
		m.exit = nil
	}
	m.wmu.Unlock()
}

// release drops one reference; the Node's mu is held (or p is unshared).
func (p *peer) release() {
	p.refs--
	if p.refs > 0 {
		return
	}
	if p.mon != nil {
		p.mon.release()
		p.mon = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rr := range p.regions {
		unix.Munmap(rr.file)
	}
	for _, rr := range p.retired {
		unix.Munmap(rr.file)
	}
	p.regions, p.retired = nil, nil
	unix.Munmap(p.nf)
	p.nf = nil
}

// remoteRegion is a mapping of a target's region file.
type remoteRegion struct {
	file  []byte // header, peer table, data
	data  []byte
	slots int // peer table slots
	// slot is the offset of the local node's slot in the peer table once
	// found and claimed, else 0.
	slot atomic.Int64
}

// region returns the current mapping of the target's region id, mapping the
// file if needed. stale, if not nil, is a mapping found closed: it is
// retired first.
func (p *peer) region(id rdma.RegionID, dir, cluster string, stale *remoteRegion) (*remoteRegion, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rr := p.regions[id]
	if rr != nil && (rr == stale || rdma.Load64(rr.file, regionClosedW) != 0) {
		delete(p.regions, id)
		p.retired = append(p.retired, rr)
		rr = nil
	}
	if rr != nil {
		return rr, nil
	}
	path := filepath.Join(dir, regionFileName(cluster, p.id, id))
	b, err := mapFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, rdma.ErrNoRegion
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", rdma.ErrNoRegion, err)
	}
	h, err := decodeRegionHeader(b, len(b))
	switch {
	case err != nil:
		err = fmt.Errorf("%w: %s: %w", rdma.ErrNoRegion, path, err)
	case h.node != p.id || h.region != id:
		err = fmt.Errorf("%w: %s: %w: header names node %d region %d", rdma.ErrNoRegion, path, ErrCorrupt, h.node, h.region)
	case h.owner != p.owner || rdma.Load64(b, regionClosedW) != 0:
		err = rdma.ErrNoRegion // left by an earlier incarnation, or closed
	}
	if err != nil {
		unix.Munmap(b)
		return nil, err
	}
	rr = &remoteRegion{file: b, data: b[h.dataOff:][:h.size:h.size], slots: h.slots}
	p.regions[id] = rr
	return rr, nil
}

// claim finds self's slot in rr for node me and claims it for this
// process, returning its offset or 0 if the owner never granted me
// anything. Claiming records the process in the writer word and resets the
// in-flight count: only one live process holds a node id, and its Node
// claims each region file once, before any of its ops, so a count left
// there belongs to a dead predecessor.
func (p *peer) claim(rr *remoteRegion, me rdma.NodeID, self procIdent) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if off := rr.slot.Load(); off != 0 {
		return int(off)
	}
	off := findSlot(rr.file, rr.slots, me)
	if off < 0 {
		return 0
	}
	rdma.Store64(rr.file, off+slotWriter, uint64(self))
	rdma.Store64(rr.file, off+slotInflight, 0)
	rr.slot.Store(int64(off))
	return off
}

// Conn is a connection from an shm node to a target node. It implements
// rdma.Conn. Ops are applied inside Post, so they complete at once and in
// order, and Outstanding is always 0.
type Conn struct {
	node *Node
	peer *peer
	cq   *rdma.CQ

	mu      sync.Mutex // held by Post and PostList for the whole list
	err     error
	closed  bool
	regions map[rdma.RegionID]*remoteRegion // this Conn's cache of peer.regions
}

var _ rdma.Conn = (*Conn)(nil)

// Local implements rdma.Conn.
func (c *Conn) Local() rdma.NodeID { return c.node.id }

// Peer implements rdma.Conn.
func (c *Conn) Peer() rdma.NodeID { return c.peer.id }

// Err implements rdma.Conn.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Post implements rdma.Conn: it checks and applies wr at once. It is
// PostList of one work request, without the list's bookkeeping.
func (c *Conn) Post(wr rdma.WR) error {
	if err := rdma.CheckWR(&wr); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if wr.Flags&rdma.Signaled != 0 && c.cq.Len() >= c.node.opts.QueueDepth {
		// Only a signaled op needs a free completion slot; the one error
		// completion that breaks the Conn has a slot reserved (the CQ
		// holds QueueDepth+1), so unsignaled ops skip the CQ's lock.
		return rdma.ErrQueueFull
	}
	var w window
	live := false
	val, err := c.exec(&w, &wr, &live)
	w.close()
	if err != nil {
		c.fail(&wr, err)
		return nil
	}
	if wr.Kind == rdma.OpWrite && wr.Flags&rdma.Notify != 0 {
		ringNode(c.peer.nf)
	}
	if wr.Flags&rdma.Signaled != 0 {
		c.cq.Push(rdma.Completion{ID: wr.ID, Kind: wr.Kind, Value: val})
	}
	return nil
}

// usable is nil if the Conn takes posts; c.mu is held.
func (c *Conn) usable() error {
	switch {
	case c.closed:
		return rdma.ErrClosed
	case c.err != nil:
		return fmt.Errorf("%w: %w", rdma.ErrConnBroken, c.err)
	}
	return nil
}

// fail breaks the Conn with wr's failure: its error completion (which
// has a reserved CQ slot) carries the cause. c.mu is held.
func (c *Conn) fail(wr *rdma.WR, err error) {
	cp := rdma.Completion{ID: wr.ID, Kind: wr.Kind, Err: &rdma.OpError{Op: wr.Kind, Peer: c.peer.id, Region: wr.Region, Offset: wr.Offset, Len: wr.Len(), Err: err}}
	c.err = cp.Err
	c.cq.Push(cp)
}

// PostList implements rdma.Conn: it checks and applies wrs at once, in
// order. The per-post costs are paid once per list: the lock, the
// liveness check and, for each run of consecutive work requests on the
// same region, the region lookup and one revocation-handshake window
// (announce, load the grant, apply the run, retract; see layout.go). The
// grant is loaded inside the window, so a Revoke that returns has waited
// for the whole run, and nothing of the list lands after it. Notify writes
// ring the target's doorbell once, after the list.
func (c *Conn) PostList(wrs []rdma.WR) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return 0, err
	}
	var w window
	n, notify, err := c.apply(&w, wrs)
	w.close()
	if notify {
		ringNode(c.peer.nf)
	}
	return n, err
}

// apply is PostList's loop; c.mu is held. It leaves the last window open
// and reports whether a Notify write landed.
func (c *Conn) apply(w *window, wrs []rdma.WR) (n int, notify bool, err error) {
	free := -1 // free completion slots, counted at the first signaled op
	live := false
	for i := range wrs {
		wr := &wrs[i]
		if err := rdma.CheckWR(wr); err != nil {
			return i, notify, err
		}
		if wr.Flags&rdma.Signaled != 0 { // as in Post
			if free < 0 {
				free = c.node.opts.QueueDepth - c.cq.Len()
			}
			if free <= 0 {
				return i, notify, rdma.ErrQueueFull
			}
			free--
		}
		val, err := c.exec(w, wr, &live)
		if err != nil {
			w.close()
			c.fail(wr, err)
			if i+1 < len(wrs) {
				return i + 1, notify, fmt.Errorf("%w: %w", rdma.ErrConnBroken, c.err)
			}
			return i + 1, notify, nil
		}
		if wr.Kind == rdma.OpWrite && wr.Flags&rdma.Notify != 0 {
			notify = true
		}
		if wr.Flags&rdma.Signaled != 0 {
			c.cq.Push(rdma.Completion{ID: wr.ID, Kind: wr.Kind, Value: val})
		}
	}
	return len(wrs), notify, nil
}

// window is a run of ops on one region inside one revocation-handshake
// window: inflight announced in the local node's slot of rr, and the
// grant loaded after the announcement.
type window struct {
	rr    *remoteRegion // nil when no window is open
	id    rdma.RegionID
	off   int // the slot's offset in rr.file
	grant rdma.Perm
}

// close retracts the window's announcement, if one is open.
func (w *window) close() {
	if w.rr != nil {
		rdma.Add64(w.rr.file, w.off+slotInflight, ^uint64(0))
		w.rr = nil
	}
}

// exec applies wr at the target inside w, opening a window on wr's region
// if w is not on it; c.mu is held. *live records that the peer passed its
// liveness check in this list.
func (c *Conn) exec(w *window, wr *rdma.WR, live *bool) (uint64, error) {
	if w.rr == nil || w.id != wr.Region {
		w.close()
		if err := c.open(w, wr.Region, live); err != nil {
			return 0, err
		}
	}
	need := wr.NeedPerm()
	if w.grant&need != need {
		return 0, rdma.ErrPermission
	}
	if !rdma.InBounds(wr.Offset, wr.Len(), len(w.rr.data)) {
		return 0, rdma.ErrBounds
	}
	return rdma.Apply(w.rr.data, wr), nil
}

// open checks the peer (once per list), finds the current mapping of
// region id and opens a window on it: announce, then load the grant.
func (c *Conn) open(w *window, id rdma.RegionID, live *bool) error {
	p := c.peer
	if !*live {
		if err := p.checkLive(); err != nil {
			return err
		}
		*live = true
	}
	rr := c.regions[id]
	if rr == nil || rdma.Load64(rr.file, regionClosedW) != 0 {
		// First op to the region, or the owner closed it (and may have
		// registered it anew): look it up again.
		if rr != nil {
			delete(c.regions, id)
		}
		var err error
		if rr, err = p.region(id, c.node.opts.Dir, c.node.opts.Cluster, rr); err != nil {
			return err
		}
		c.regions[id] = rr
	}
	off := int(rr.slot.Load())
	if off == 0 {
		if off = p.claim(rr, c.node.id, c.node.self); off == 0 {
			return rdma.ErrPermission
		}
	}
	// The revocation handshake (layout.go): announce, check, touch, retract.
	rdma.Add64(rr.file, off+slotInflight, 1)
	*w = window{rr: rr, id: id, off: off, grant: rdma.Perm(rdma.Load64(rr.file, off+slotGrant))}
	return nil
}

// Poll implements rdma.Conn.
func (c *Conn) Poll(cs []rdma.Completion) int { return c.cq.Poll(cs) }

// Wait implements rdma.Conn. Ops complete inside Post, so Wait only waits
// for completions already queued or for timeout.
func (c *Conn) Wait(cs []rdma.Completion, timeout time.Duration) int { return c.cq.Wait(cs, timeout) }

// Outstanding implements rdma.Conn; shm ops complete inside Post.
func (c *Conn) Outstanding() int { return 0 }

// Close implements rdma.Conn.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.regions = nil
	c.mu.Unlock()
	n := c.node
	n.mu.Lock()
	delete(n.conns, c)
	c.peer.release()
	n.mu.Unlock()
	return nil
}
