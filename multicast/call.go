package multicast

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// A started client (StartClient) serves calls on the callers' goroutines:
//
//	k, payload, err := c.Begin(dst, n) // payload: n bytes inside the call's record image
//	... write the payload ...
//	k.Send()                           // seals the record and posts it to the lca's replicas
//	replies, err := k.Wait(ctx, deadline)
//	... read replies (valid until Release) ...
//	k.Release()
//
// Send posts on the caller's goroutine if the destination groups' windows
// have room (else the call queues, in order per group, and is posted by
// whoever next polls once room frees). Waiting is shared: the first
// waiter is the reaper. It polls the client (replies, retries), parking
// on the node's doorbell (which the replies' writes ring) when nothing
// progressed; it completes every call whose replies arrived and wakes
// their waiters (a cap-1 channel per call); once its own call completes
// (or its wait ends) it hands the role to another waiter. A single caller
// thus posts and reaps its own message with no goroutine in between.
// A keeper goroutine polls, slowly, only while no call waits: it
// registers the client with the groups and retries messages whose
// callers are not waiting (abandoned ones, held until their lca ordered
// them).
//
// A caller may also wait for something other than its own call
// (Client.Await on a Waiter): a call with an OnDone hook is settled by
// the hook, which the goroutine that completed it (the reaper, mostly)
// runs once it let go of the client's lock; the hook settles whatever
// waits for the call (Waiter.Done). The client package combines several
// callers' writes into one call this way: every caller waits on its own
// Waiter, and the reaper hands each its result, with no goroutine woken
// to do it for them.

// ErrClosed: the client was closed before the outcome arrived; the
// message may or may not be delivered.
var ErrClosed = errors.New("multicast: client closed")

// PeerError is the last failure of the client's Conn to a group's replica.
type PeerError struct {
	Group tree.Group
	Node  rdma.NodeID
	Err   error
}

// Call is one message of a started client, from Begin to Release. Its
// methods are for one goroutine at a time (Wait may move to another
// goroutine after the first's Wait returned).
type Call struct {
	c     *Client
	dst   tree.Set
	buf   []byte // the record image: SlotSize bytes
	n     int    // payload length
	build func(MsgID) []byte
	w     Waiter // done once the call is

	// under c.mu
	state   uint8
	k       *call // once admitted, until done or abandoned
	id      MsgID
	err     error
	replies []Reply
	rbuf    []byte
	oc      Outcome
	hook    func(*Call) // OnDone's
}

// Waiter is one goroutine's wait in Client.Await: for a Call's outcome
// (Call.Wait uses the call's own), or for anything that another goroutine
// settles with Done, typically a Call's OnDone hook. A Waiter is for one
// goroutine at a time; NewWaiter makes one.
type Waiter struct {
	ch   chan struct{} // cap 1: done, the reaper role handed over, or its deadline passed
	done atomic.Bool

	// under Client.mu
	deadline time.Duration // on the client's clock (0: none)
	waiting  bool
}

// NewWaiter returns a Waiter, not done.
func NewWaiter() *Waiter { return &Waiter{ch: make(chan struct{}, 1)} }

// Done marks w done and wakes its goroutine if it waits (any goroutine,
// under any lock: it only signals).
func (w *Waiter) Done() {
	w.done.Store(true)
	w.poke()
}

// Reset makes w not done, for its next wait (not while it waits).
func (w *Waiter) Reset() {
	w.done.Store(false)
	select {
	case <-w.ch:
	default:
	}
}

// IsDone reports whether Done was called since the last Reset.
func (w *Waiter) IsDone() bool { return w.done.Load() }

func (w *Waiter) poke() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

const (
	callBegun = iota
	callQueued
	callSent
	callDone
)

// callState is the started client's part of Client (under Client.mu
// unless said otherwise).
type callState struct {
	db      rdma.Doorbell
	start   time.Time
	queue   []*Call   // sent, waiting for room in their groups' windows
	waiters []*Waiter // waiting callers other than the reaper
	reaper  *Waiter
	// parkUntil: the reaper parks on the doorbell until then, on the
	// client's clock (0: it does not park)
	parkUntil time.Duration
	pool      []*Call
	hooks     []*Call // done, their OnDone hook not run yet (in completion order)
	closed    bool

	// counts, for tests: reaper roles handed to a waiter, the reapers'
	// parks, and those a doorbell ring ended
	handOffs, parks, rings uint64

	// watch hands the keeper the Done channel of a reaper's context
	// (cap 1; nil without a keeper): the keeper rings the doorbell when it
	// closes, so that a reaper parked past reapMaxPark needs no tick to
	// see its context end. watched is the last one handed over.
	watch   chan (<-chan struct{})
	watched <-chan struct{}

	// the published registration and Conn failures
	reg   tree.Set
	fails uint64
	perr  []PeerError
	regCh chan struct{}
	regA  atomic.Uint64 // reg, read without the lock

	stop     chan struct{} // closed to end the keeper
	keeperOn chan struct{} // closed when the keeper ended (nil: none)
}

func (s *callState) init(node rdma.Node) {
	s.db = node.Doorbell()
	s.start = time.Now()
	s.regCh = make(chan struct{})
}

// clock is the started client's Poll clock.
func (c *Client) clock() time.Duration { return time.Since(c.rt.start) }

// StartClient creates a client on node that serves calls (Begin, Do) and
// waits until every group registered it (or ctx ends).
func StartClient(ctx context.Context, cfg ClientConfig, node rdma.Node) (*Client, error) {
	c, err := StartClientAsync(cfg, node)
	if err != nil {
		return nil, err
	}
	for {
		reg, ch := c.Registered()
		if reg == cfg.Tree.All() {
			return c, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.Close()
			return nil, fmt.Errorf("multicast: client slot %d: groups %v did not register it (%w); %s", cfg.Slot, cfg.Tree.All()&^reg, ctx.Err(), c.peerErrorsText())
		}
	}
}

// StartClientAsync creates a client on node that serves calls, returning
// at once: the client registers with the groups in the background
// (Registered says which did), and a message may go to the groups that
// registered it while others have not.
func StartClientAsync(cfg ClientConfig, node rdma.Node) (*Client, error) {
	c, err := NewClient(cfg, node)
	if err != nil {
		return nil, err
	}
	c.watchRestarts = true
	c.rt.stop = make(chan struct{})
	c.rt.keeperOn = make(chan struct{})
	c.rt.watch = make(chan (<-chan struct{}), 1)
	go c.keeper()
	return c, nil
}

func (c *Client) peerErrorsText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peerErrors()
}

// Registered returns the groups that registered the client and a channel
// closed when more do, when a Conn fails (PeerErrors) or when the client
// closes.
func (c *Client) Registered() (tree.Set, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rt.reg, c.rt.regCh
}

// RegisteredNow is the set of groups that registered the client (cheap:
// for a check on every call).
func (c *Client) RegisteredNow() tree.Set { return tree.Set(c.rt.regA.Load()) }

// PeerErrors describes the last failure of each of the client's Conns to
// the replicas of groups (empty if none failed).
func (c *Client) PeerErrors(groups tree.Set) []PeerError {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []PeerError
	for _, e := range c.rt.perr {
		if groups.Has(e.Group) {
			out = append(out, e)
		}
	}
	return out
}

// publish makes the client's registration and Conn failures visible
// (Registered, PeerErrors) and wakes Registered's waiters if they changed
// (mu held).
func (c *Client) publish() {
	reg, fails := c.ready, c.failures()
	if reg == c.rt.reg && fails == c.rt.fails {
		return
	}
	c.rt.reg, c.rt.fails = reg, fails
	c.rt.regA.Store(uint64(reg))
	c.rt.perr = c.peerErrList(c.rt.perr[:0:0])
	close(c.rt.regCh)
	c.rt.regCh = make(chan struct{})
}

// step polls the client on its own clock, posts the queued calls that
// fit, and publishes (mu held). It reports whether anything progressed.
func (c *Client) step() bool {
	progress := c.poll(c.clock())
	if c.pump() {
		progress = true
	}
	c.publish()
	return progress
}

// keeperPark bounds the keeper's sleep once the client is registered
// (it polls only while no call waits: for retries of calls nobody waits
// for); registering, it parks on the doorbell at most 1 ms.
const keeperPark = 20 * time.Millisecond

func (c *Client) keeper() {
	defer close(c.rt.keeperOn)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var watched <-chan struct{} // a parked reaper's ctx.Done (nil: none)
	ring := func() {
		c.rt.db.Ring() // the reaper sees its context ended
		watched = nil
	}
	for {
		seq := c.rt.db.Seq()
		c.mu.Lock()
		if c.rt.closed {
			c.mu.Unlock()
			return
		}
		progress := false
		if c.rt.reaper == nil {
			progress = c.step()
		}
		wait := c.nextDeadline() - c.now
		ready := c.isReady()
		c.unlock()
		if progress {
			continue
		}
		select {
		case <-c.rt.stop:
			return
		default:
		}
		if !ready {
			select {
			case watched = <-c.rt.watch:
			default:
			}
			select {
			case <-watched:
				ring()
			default:
			}
			c.rt.db.Wait(seq, max(min(wait, time.Millisecond), time.Microsecond))
			continue
		}
		t.Reset(max(min(wait, keeperPark), time.Microsecond))
		select {
		case <-c.rt.stop:
			return
		case <-t.C:
		case watched = <-c.rt.watch:
		case <-watched:
			ring()
		}
	}
}

// stopKeeper ends the keeper, if any, and waits for it.
func (c *Client) stopKeeper() {
	if c.rt.keeperOn == nil {
		return
	}
	c.mu.Lock()
	select {
	case <-c.rt.stop:
	default:
		close(c.rt.stop)
	}
	c.mu.Unlock()
	c.rt.db.Ring()
	<-c.rt.keeperOn
}

// closeCalls ends every call with ErrClosed (mu held).
func (c *Client) closeCalls() {
	c.rt.closed = true
	for _, u := range c.rt.queue {
		u.finish(nil, ErrClosed)
	}
	c.rt.queue = nil
	for _, i := range c.act {
		if k := &c.calls[i]; k.user != nil {
			u := k.user
			k.user = nil
			u.finish(nil, ErrClosed)
		}
	}
	if c.rt.regCh != nil {
		close(c.rt.regCh)
		c.rt.regCh = make(chan struct{})
	}
	for _, w := range c.rt.waiters {
		w.poke() // ErrClosed, unless done
	}
	c.rt.db.Ring() // the reaper
}

// unlock runs the OnDone hooks of the calls that are done, each without
// mu, and then releases mu (entered with mu held). Only a goroutine that
// holds no lock a hook may take calls it: Await, the reaper, the keeper
// and Close.
func (c *Client) unlock() {
	for len(c.rt.hooks) > 0 {
		u := c.rt.hooks[0]
		copy(c.rt.hooks, c.rt.hooks[1:])
		c.rt.hooks[len(c.rt.hooks)-1] = nil
		c.rt.hooks = c.rt.hooks[:len(c.rt.hooks)-1]
		f := u.hook
		u.hook = nil
		if f == nil {
			continue
		}
		c.mu.Unlock()
		f(u)
		c.mu.Lock()
	}
	c.mu.Unlock()
}

// unlockRing releases mu; if calls became done with hooks since the
// hooks list was n long, it rings the doorbell so that the reaper (or the
// keeper) runs them: for the paths that may not run hooks themselves.
func (c *Client) unlockRing(n int) {
	more := len(c.rt.hooks) > n
	c.mu.Unlock()
	if more {
		c.rt.db.Ring()
	}
}

// Begin starts a call to dst with an n-byte payload, which the caller
// writes into payload (inside the call's record image) before Send.
func (c *Client) Begin(dst tree.Set, n int) (*Call, []byte, error) {
	if n < 0 || n > maxPayload(c.cfg.SlotSize) {
		return nil, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, n, maxPayload(c.cfg.SlotSize))
	}
	if _, err := c.cfg.Tree.LCA(dst); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrDestination, err)
	}
	c.mu.Lock()
	if c.rt.closed {
		c.mu.Unlock()
		return nil, nil, ErrClosed
	}
	var u *Call
	if l := len(c.rt.pool); l > 0 {
		u = c.rt.pool[l-1]
		c.rt.pool = c.rt.pool[:l-1]
	}
	c.mu.Unlock()
	if u == nil {
		u = &Call{c: c, buf: make([]byte, c.cfg.SlotSize), w: Waiter{ch: make(chan struct{}, 1)}}
	}
	u.dst, u.n, u.build, u.state, u.err, u.w.deadline, u.hook = dst, n, nil, callBegun, nil, 0, nil
	u.w.Reset()
	return u, u.buf[recHdr : recHdr+n], nil
}

// Send queues the call and posts it if its groups' windows have room
// (else whoever polls next posts it once they do). It does not wait.
func (u *Call) Send() {
	c := u.c
	c.mu.Lock()
	n := len(c.rt.hooks)
	defer c.unlockRing(n)
	if c.rt.closed {
		u.finish(nil, ErrClosed)
		return
	}
	u.state = callQueued
	c.rt.queue = append(c.rt.queue, u)
	c.pump()
}

// OnDone has f(u) run once u is done (instead of waking a waiter: a call
// with a hook has none), on a goroutine that waits on the client (a
// reaper, an Await, the keeper, Close) when it holds none of the client's
// locks: f may call the client (Begin, Send, Release ...), and should not
// block. If u is done already, f runs at the next such point. Release
// before f ran cancels it. Set it once, after Send.
func (u *Call) OnDone(f func(*Call)) {
	c := u.c
	c.mu.Lock()
	n := len(c.rt.hooks)
	u.hook = f
	if u.state == callDone && !c.knobs.hookLost {
		c.rt.hooks = append(c.rt.hooks, u)
	}
	c.unlockRing(n)
}

// Result is the outcome of a call that is done (in its OnDone hook, or
// after Wait): its replies (valid until Release) or its error.
func (u *Call) Result() ([]Reply, error) { return u.replies, u.err }

// pump posts the queued calls while their groups' windows have room (mu
// held). A call whose window is full waits, and so do the later ones that
// share a group with it (each group's calls go in order); the others go
// on: a group that does not answer holds back only its own calls.
func (c *Client) pump() bool {
	if len(c.rt.queue) == 0 {
		return false
	}
	var full tree.Set
	keep := c.rt.queue[:0]
	sent := false
	for _, u := range c.rt.queue {
		lca, _ := c.cfg.Tree.LCA(u.dst) // checked by Begin
		involved := u.dst.Add(lca)
		if involved&full != 0 {
			keep = append(keep, u)
			continue
		}
		if w := uint64(c.cfg.ClientSlots); c.full.Has(lca) && (c.busy[lca][(c.pos[lca]+1)%w] != 0 || len(c.free) == 0) {
			// Its leader refused earlier messages for a full disk and
			// has not answered since, and they fill the window: the
			// call would wait for them, so it fails, not sent.
			u.finish(nil, &DiskFullError{Group: lca})
			sent = true
			continue
		}
		if u.build != nil {
			// built once its id is sure: admit below takes this seq
			seq, ok := c.nextSeq(u.dst)
			w := uint64(c.cfg.ClientSlots)
			if ok && involved&^c.ready == 0 && c.busy[lca][(c.pos[lca]+1)%w] == 0 && len(c.free) > 0 {
				p := u.build(MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: seq})
				u.build = nil
				if len(p) > maxPayload(c.cfg.SlotSize) {
					u.finish(nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(p), maxPayload(c.cfg.SlotSize)))
					sent = true
					continue
				}
				u.n = copy(u.buf[recHdr:], p)
			}
		}
		k, err := c.admit(u.dst)
		if errors.Is(err, ErrWindowFull) {
			full |= involved
			keep = append(keep, u)
			continue
		}
		sent = true
		if err != nil {
			u.finish(nil, err)
			continue
		}
		u.state, u.k = callSent, k
		u.id = MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: k.seq}
		k.user = u
		rec := record{pos: k.pos, id: u.id, dst: k.dst, reply: c.addr, payload: u.buf[recHdr : recHdr+u.n]}
		k.rec = encodeRecord(u.buf, &rec) // the payload is in place: not moved
		c.send(k)
	}
	clear(c.rt.queue[len(keep):])
	c.rt.queue = keep
	return sent
}

// finish completes u with outcome o (copied) or err, and wakes its waiter
// (mu held).
func (u *Call) finish(o *Outcome, err error) {
	u.state, u.k, u.err = callDone, nil, err
	if o != nil {
		u.rbuf = u.rbuf[:0]
		u.replies = u.replies[:0]
		for _, r := range o.Replies {
			u.rbuf = append(u.rbuf, r.Result...)
		}
		off := 0
		for _, r := range o.Replies {
			n := len(r.Result)
			r.Result = u.rbuf[off : off+n : off+n]
			off += n
			u.replies = append(u.replies, r)
		}
		u.oc = Outcome{ID: o.ID, Dst: o.Dst, Replies: u.replies, Sent: o.Sent, Retries: o.Retries}
	}
	if u.hook != nil {
		u.c.rt.hooks = append(u.c.rt.hooks, u)
	}
	u.w.Done()
}

// ID is the call's message id once it was posted (zero before).
func (u *Call) ID() MsgID {
	u.c.mu.Lock()
	defer u.c.mu.Unlock()
	return u.id
}

// Sent reports whether the call's message was posted (a call whose wait
// ended before is never posted once Released).
func (u *Call) Sent() bool {
	u.c.mu.Lock()
	defer u.c.mu.Unlock()
	return u.state == callSent || u.state == callDone && u.id.Seq != 0
}

// Outcome is the call's outcome after a successful Wait (valid until
// Release).
func (u *Call) Outcome() *Outcome { return &u.oc }

// Wait waits for every destination group's reply, until ctx ends or the
// deadline (zero: none) passes; it then returns ctx's error or
// context.DeadlineExceeded, and the call stays under way: Wait again, or
// Release it. The replies are valid until Release. (A call not Sent yet
// waits until it is, or until ctx ends.)
func (u *Call) Wait(ctx context.Context, deadline time.Time) ([]Reply, error) {
	if err := u.c.Await(ctx, deadline, &u.w); err != nil {
		return nil, err
	}
	return u.replies, u.err // (written before the waiter's Done)
}

// Await waits until w is done (Waiter.Done), ctx ends or the deadline
// (zero: none) passes, or the client closes: nil, ctx's error,
// context.DeadlineExceeded or ErrClosed (a done w wins). Meanwhile the
// goroutine may serve as the reaper: it polls the client, completes calls
// and runs their OnDone hooks, which may settle w.
func (c *Client) Await(ctx context.Context, deadline time.Time, w *Waiter) error {
	done := ctx.Done()
	c.mu.Lock()
	w.deadline = 0
	if !deadline.IsZero() {
		w.deadline = max(time.Duration(1), deadline.Sub(c.rt.start))
	}
	for {
		if w.done.Load() {
			if c.rt.reaper == w {
				c.handOff()
			}
			c.unlock()
			return nil
		}
		err := w.ended(c, ctx)
		if err == nil && c.rt.closed {
			err = ErrClosed
		}
		if err != nil {
			if c.rt.reaper == w {
				c.handOff()
			}
			c.unlock()
			return err
		}
		if c.rt.reaper == nil {
			c.rt.reaper = w
		}
		if c.rt.reaper == w {
			c.reap(w, ctx) // unlocks and locks again
			continue
		}
		if len(c.rt.hooks) > 0 {
			c.unlock() // the hooks may settle w: look again
			c.mu.Lock()
			continue
		}
		w.waiting = true
		c.rt.waiters = append(c.rt.waiters, w)
		// The reaper parked until parkUntil: if w's deadline is earlier,
		// it must wake to see it.
		early := w.deadline != 0 && c.rt.parkUntil != 0 && w.deadline < c.rt.parkUntil && !c.knobs.earlySleeps
		c.mu.Unlock()
		if early {
			c.rt.db.Ring()
		}
		if done == nil {
			<-w.ch
		} else {
			select {
			case <-w.ch:
			case <-done:
			}
		}
		c.mu.Lock()
		c.unwait(w)
	}
}

// ended is the error that ends w's wait, if any (mu held).
func (w *Waiter) ended(c *Client, ctx context.Context) error {
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if w.deadline != 0 && c.clock() >= w.deadline {
		return context.DeadlineExceeded
	}
	return nil
}

// unwait removes w from the waiters (mu held).
func (c *Client) unwait(w *Waiter) {
	if !w.waiting {
		return
	}
	w.waiting = false
	for i, x := range c.rt.waiters {
		if x == w {
			last := len(c.rt.waiters) - 1
			c.rt.waiters[i] = c.rt.waiters[last]
			c.rt.waiters[last] = nil
			c.rt.waiters = c.rt.waiters[:last]
			break
		}
	}
}

// handOff gives the reaper role to a waiter not done yet, if any (mu held).
func (c *Client) handOff() {
	c.rt.reaper = nil
	for _, w := range c.rt.waiters {
		if !w.done.Load() {
			c.rt.reaper = w
			c.rt.handOffs++
			w.poke()
			return
		}
	}
}

// reapMaxPark bounds a reaper's first park while its context can end
// (the doorbell does not watch the context). A reaper still waiting after
// it hands its context's Done channel to the keeper, which rings the
// doorbell when it closes: longer waits park without a tick, and a reply
// within reapMaxPark costs the keeper nothing.
const reapMaxPark = time.Millisecond

// reap is the reaper's loop (entered and left with mu held): it polls,
// completing calls and running their hooks, and parks on the doorbell
// when nothing progressed, until w is done, its wait ended or the client
// closed.
func (c *Client) reap(w *Waiter, ctx context.Context) {
	long := false // a park of this reap ended without progress: watch ctx
	for {
		seq := c.rt.db.Seq()
		if c.rt.closed {
			return
		}
		progress := c.step()
		if len(c.rt.hooks) > 0 {
			c.unlock() // (a hook may post: the seq read above sees its replies)
			c.mu.Lock()
			progress = true
			if c.rt.closed {
				return
			}
		}
		now := c.now
		next := c.nextDeadline()
		for _, x := range c.rt.waiters {
			if x.deadline != 0 {
				if x.deadline <= now {
					x.poke()
				} else {
					next = min(next, x.deadline)
				}
			}
		}
		if w.done.Load() || w.ended(c, ctx) != nil {
			return
		}
		if w.deadline != 0 {
			next = min(next, w.deadline)
		}
		wait := next - now
		if d := ctx.Done(); d != nil && !progress {
			if !long || !c.watchCtx(d) {
				wait = min(wait, reapMaxPark)
			}
		}
		if !progress {
			c.rt.parks++
			c.rt.parkUntil = now + max(wait, time.Microsecond)
		}
		c.mu.Unlock()
		if !progress {
			rang := c.rt.db.Wait(seq, max(wait, time.Microsecond))
			c.mu.Lock()
			c.rt.parkUntil = 0
			if rang {
				c.rt.rings++
			} else {
				long = true
			}
			continue
		}
		c.mu.Lock()
	}
}

// watchCtx has the keeper ring the doorbell when d closes (mu held); false
// without a keeper, or while it has not taken the last one handed over.
func (c *Client) watchCtx(d <-chan struct{}) bool {
	if c.rt.watch == nil {
		return false
	}
	if c.rt.watched == d {
		return true
	}
	select {
	case c.rt.watch <- d:
		c.rt.watched = d
		return true
	default:
		return false
	}
}

// Release ends the call: a call still queued is never posted; one under
// way is abandoned (Client.Abandon). The call and its replies must not be
// used after.
func (u *Call) Release() {
	c := u.c
	c.mu.Lock()
	if u.hook != nil && !c.knobs.releaseKeepsHook {
		u.hook = nil
		for i, x := range c.rt.hooks {
			if x == u {
				copy(c.rt.hooks[i:], c.rt.hooks[i+1:])
				c.rt.hooks[len(c.rt.hooks)-1] = nil
				c.rt.hooks = c.rt.hooks[:len(c.rt.hooks)-1]
				break
			}
		}
	}
	n := len(c.rt.hooks)
	defer c.unlockRing(n)
	switch u.state {
	case callQueued:
		for i, x := range c.rt.queue {
			if x == u {
				c.rt.queue = append(c.rt.queue[:i], c.rt.queue[i+1:]...)
				break
			}
		}
	case callSent:
		if u.k != nil {
			c.abandon(u.k)
		}
		c.pump() // its reply slots may be free
	}
	if c.rt.reaper == &u.w {
		c.handOff()
	}
	c.unwait(&u.w)
	u.w.Reset()
	u.state, u.k, u.build, u.id, u.err = callBegun, nil, nil, MsgID{}, nil
	u.oc = Outcome{}
	clear(u.replies)
	c.rt.pool = append(c.rt.pool, u)
}

// Do multicasts payload to dst and waits for every destination group's
// reply (until ctx ends: it then returns ctx's error, and a message
// already sent is abandoned). The Outcome is the caller's (copied).
func (c *Client) Do(ctx context.Context, dst tree.Set, payload []byte) (Outcome, error) {
	u, p, err := c.Begin(dst, len(payload))
	if err != nil {
		return Outcome{}, err
	}
	copy(p, payload)
	return c.do(ctx, u)
}

// DoID is Do with a payload built from the message's id: build runs, at
// most once, when the message is posted (under the client's lock: it must
// not call the client).
func (c *Client) DoID(ctx context.Context, dst tree.Set, build func(MsgID) []byte) (Outcome, error) {
	u, _, err := c.Begin(dst, 0)
	if err != nil {
		return Outcome{}, err
	}
	u.build = build
	return c.do(ctx, u)
}

func (c *Client) do(ctx context.Context, u *Call) (Outcome, error) {
	defer u.Release()
	u.Send()
	dl, _ := ctx.Deadline()
	if _, err := u.Wait(ctx, dl); err != nil {
		return Outcome{}, err
	}
	o := *u.Outcome()
	o.Replies = append([]Reply(nil), o.Replies...)
	for i := range o.Replies {
		o.Replies[i].Result = append([]byte(nil), o.Replies[i].Result...)
	}
	return o, nil
}
