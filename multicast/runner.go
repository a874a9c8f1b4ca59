package multicast

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// ClientRunner drives a Client in real time on a goroutine of its own:
// Multicast is safe from any goroutine and waits for the outcome. The
// goroutine polls while there is progress and then parks on the node's
// doorbell (the replies' writes ring it) until the client's next
// deadline: an idle client does not burn a core.
type ClientRunner struct {
	c     *Client
	db    rdma.Doorbell
	start time.Time

	mu      sync.Mutex
	queue   []*request
	waiting map[uint64]*request // by seq
	closed  bool
	err     error
	gone    []MsgID       // sent messages whose callers gave up
	reg     tree.Set      // the groups that registered the client
	perr    []PeerError   // the Conns' last failures
	fails   uint64        // the client's Conn failures when perr was taken
	regCh   chan struct{} // closed (and replaced) when reg or perr change
	regA    atomic.Uint64 // reg, read without mu (RegisteredNow)

	done chan struct{}
	stop context.CancelFunc
}

type request struct {
	id      MsgID // once sent
	dst     tree.Set
	payload []byte
	build   func(MsgID) []byte
	ch      chan result
}

type result struct {
	o   Outcome
	err error
}

// ErrClosed: the runner was closed before the outcome arrived; the
// message may or may not be delivered.
var ErrClosed = errors.New("multicast: client closed")

// StartClient creates a client on node and runs it until Close. It waits
// until every group registered the client (or ctx ends).
func StartClient(ctx context.Context, cfg ClientConfig, node rdma.Node) (*ClientRunner, error) {
	r, err := StartClientAsync(cfg, node)
	if err != nil {
		return nil, err
	}
	for {
		reg, ch := r.Registered()
		if reg == cfg.Tree.All() {
			return r, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			r.Close()
			return nil, fmt.Errorf("multicast: client slot %d: groups %v did not register it (%w); %s", cfg.Slot, cfg.Tree.All()&^reg, ctx.Err(), r.c.peerErrors())
		}
	}
}

// StartClientAsync creates a client on node and runs it until Close,
// returning at once: the client registers with the groups in the
// background (Registered says which did), and a message may go to the
// groups that registered it while others have not (a group without a
// leader does not stop the others).
func StartClientAsync(cfg ClientConfig, node rdma.Node) (*ClientRunner, error) {
	r := &ClientRunner{db: node.Doorbell(), start: time.Now(), waiting: map[uint64]*request{}, done: make(chan struct{}), regCh: make(chan struct{})}
	user := cfg.OnDone
	cfg.OnDone = func(o *Outcome) {
		if user != nil {
			user(o)
		}
		r.finish(o)
	}
	c, err := NewClient(cfg, node)
	if err != nil {
		return nil, err
	}
	r.c = c
	runCtx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go r.run(runCtx)
	return r, nil
}

// Registered returns the groups that registered the client and a channel
// closed when more do, when a Conn fails (PeerErrors) or when the runner
// ends.
func (r *ClientRunner) Registered() (tree.Set, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg, r.regCh
}

// RegisteredNow is the set of groups that registered the client (cheap:
// for a check on every call).
func (r *ClientRunner) RegisteredNow() tree.Set { return tree.Set(r.regA.Load()) }

// PeerErrors describes the last failure of each of the client's Conns to
// the replicas of groups (empty if none failed).
func (r *ClientRunner) PeerErrors(groups tree.Set) []PeerError {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []PeerError
	for _, e := range r.perr {
		if groups.Has(e.Group) {
			out = append(out, e)
		}
	}
	return out
}

// PeerError is the last failure of the client's Conn to a group's replica.
type PeerError struct {
	Group tree.Group
	Node  rdma.NodeID
	Err   error
}

// changed publishes the client's registration and Conn failures (the run
// goroutine calls it after each Poll) and wakes Registered's waiters if
// they changed.
func (r *ClientRunner) changed() {
	reg, fails := r.c.ready, r.c.failures()
	r.mu.Lock()
	defer r.mu.Unlock()
	if reg == r.reg && fails == r.fails {
		return
	}
	r.reg, r.fails = reg, fails
	r.regA.Store(uint64(reg))
	r.perr = r.c.peerErrList(r.perr[:0:0])
	close(r.regCh)
	r.regCh = make(chan struct{})
}

func (r *ClientRunner) now() time.Duration { return time.Since(r.start) }

func (r *ClientRunner) run(ctx context.Context) {
	defer close(r.done)
	stopRing := context.AfterFunc(ctx, r.db.Ring)
	defer stopRing()
	for ctx.Err() == nil {
		seq := r.db.Seq()
		now := r.now()
		progress := r.c.Poll(now)
		r.changed()
		if r.submit() {
			progress = true
		}
		if progress {
			continue
		}
		wait := min(r.c.NextDeadline()-now, time.Millisecond)
		if wait > 0 {
			r.db.Wait(seq, wait)
		}
	}
	r.mu.Lock()
	r.closed = true
	for _, q := range r.queue {
		q.ch <- result{err: ErrClosed}
	}
	for _, q := range r.waiting {
		q.ch <- result{err: ErrClosed}
	}
	r.queue, r.waiting = nil, nil
	close(r.regCh)
	r.regCh = make(chan struct{})
	r.mu.Unlock()
	r.c.Close()
}

// submit hands queued requests to the client while their groups' windows
// have room. A request whose group's window is full waits, and so do the
// later ones that share a group with it (each group's requests go in
// order); the others go on: a group that does not answer holds back only
// its own requests.
func (r *ClientRunner) submit() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.gone {
		r.c.Abandon(id)
	}
	r.gone = r.gone[:0]
	var full tree.Set // groups a waiting request involves
	keep := r.queue[:0]
	sent := false
	for _, q := range r.queue {
		lca, lerr := r.c.cfg.Tree.LCA(q.dst)
		involved := q.dst
		if lerr == nil {
			involved = involved.Add(lca)
		}
		if involved&full != 0 {
			keep = append(keep, q)
			continue
		}
		id := r.c.NextID(q.dst)
		if q.build != nil && q.payload == nil {
			q.payload = q.build(id)
		}
		if _, err := r.c.Multicast(q.dst, q.payload); err != nil {
			if errors.Is(err, ErrWindowFull) {
				full |= involved
				keep = append(keep, q)
				continue
			}
			q.ch <- result{err: err}
		} else {
			q.id = id
			r.waiting[id.Seq] = q
		}
		sent = true
	}
	clear(r.queue[len(keep):])
	r.queue = keep
	return sent
}

func (r *ClientRunner) finish(o *Outcome) {
	r.mu.Lock()
	q := r.waiting[o.ID.Seq]
	delete(r.waiting, o.ID.Seq)
	r.mu.Unlock()
	if q == nil {
		return
	}
	cp := *o
	cp.Replies = append([]Reply(nil), o.Replies...)
	for i := range cp.Replies {
		cp.Replies[i].Result = append([]byte(nil), cp.Replies[i].Result...)
	}
	q.ch <- result{o: cp}
}

// Multicast multicasts payload to dst and waits for every destination
// group's reply. If ctx ends first it returns ctx's error. A message not
// sent yet never is; a sent one may still be delivered (once): the client
// abandons it (Client.Abandon), writing it again until its lca ordered it
// but no longer holding the other groups' reply slots for it.
func (r *ClientRunner) Multicast(ctx context.Context, dst tree.Set, payload []byte) (Outcome, error) {
	return r.do(ctx, &request{dst: dst, payload: append([]byte{}, payload...), ch: make(chan result, 1)})
}

// MulticastID is Multicast with a payload built from the message's id
// (build runs on the runner's goroutine once the id is known, and is
// called at most once; its result is not copied).
func (r *ClientRunner) MulticastID(ctx context.Context, dst tree.Set, build func(MsgID) []byte) (Outcome, error) {
	return r.do(ctx, &request{dst: dst, build: build, ch: make(chan result, 1)})
}

func (r *ClientRunner) do(ctx context.Context, q *request) (Outcome, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Outcome{}, ErrClosed
	}
	r.queue = append(r.queue, q)
	r.mu.Unlock()
	r.db.Ring()
	select {
	case res := <-q.ch:
		return res.o, res.err
	case <-ctx.Done():
		// Not sent yet: it never will be (a request for a group that does
		// not answer must not pile up in the queue). Sent: the client
		// abandons it (it keeps only what the ring needs).
		r.mu.Lock()
		for i, x := range r.queue {
			if x == q {
				r.queue = append(r.queue[:i], r.queue[i+1:]...)
				break
			}
		}
		if q.id.Seq != 0 && r.waiting[q.id.Seq] == q {
			delete(r.waiting, q.id.Seq)
			r.gone = append(r.gone, q.id)
		}
		r.mu.Unlock()
		r.db.Ring()
		return Outcome{}, ctx.Err()
	}
}

// Client is the driven client (its fixed properties: Slot, Window).
func (r *ClientRunner) Client() *Client { return r.c }

// Close stops the runner; waiting calls return ErrClosed.
func (r *ClientRunner) Close() error {
	r.stop()
	<-r.done
	return nil
}
