package multicast

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

	done chan struct{}
	stop context.CancelFunc
}

type request struct {
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
	r := &ClientRunner{db: node.Doorbell(), start: time.Now(), waiting: map[uint64]*request{}, done: make(chan struct{})}
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
	ready := make(chan struct{})
	go r.run(runCtx, ready)
	select {
	case <-ready:
		return r, nil
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("multicast: client slot %d: groups %v did not register it (%w); %s", cfg.Slot, c.cfg.Tree.All()&^c.ready, ctx.Err(), c.peerErrors())
	}
}

func (r *ClientRunner) now() time.Duration { return time.Since(r.start) }

func (r *ClientRunner) run(ctx context.Context, ready chan struct{}) {
	defer close(r.done)
	stopRing := context.AfterFunc(ctx, r.db.Ring)
	defer stopRing()
	wasReady := false
	for ctx.Err() == nil {
		seq := r.db.Seq()
		now := r.now()
		progress := r.c.Poll(now)
		if !wasReady && r.c.Ready() {
			wasReady = true
			close(ready)
		}
		if wasReady && r.submit() {
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
	r.mu.Unlock()
	r.c.Close()
}

// submit hands queued requests to the client while its window has room.
func (r *ClientRunner) submit() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := 0
	for k < len(r.queue) {
		q := r.queue[k]
		id := r.c.NextID()
		if q.build != nil && q.payload == nil {
			q.payload = q.build(id)
		}
		if _, err := r.c.Multicast(q.dst, q.payload); err != nil {
			if errors.Is(err, ErrWindowFull) {
				break
			}
			q.ch <- result{err: err}
		} else {
			r.waiting[id.Seq] = q
		}
		k++
	}
	r.queue = r.queue[k:]
	return k > 0
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
// group's reply. If ctx ends first it returns ctx's error and the message
// may still be delivered (the client keeps retrying it until Close).
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
