package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// Write combining. A client has a window of ClientSlots messages in flight
// per group. A single-key write (Put, Delete, a compare-and-swap) that
// finds its group's window open and nobody queued for its group goes out
// at once, alone. When the window is full, writes queue per group; each
// message of the group that completes sends the group's queue as one multi
// request (kv.AppendMulti: up to kv.MaxMulti independent ops, each with its
// own condition and result). Under load, one ordered message thus carries
// many writes, and no write waits longer than one message's round trip
// behind the window. The windows are per group so that a group that does
// not answer holds only its own writes.

type pendingOp struct {
	op    kv.Op
	g     uint32
	res   kv.Result
	index uint64
	err   error
	done  chan struct{}
	sent  bool // in a message (under combiner.mu)
}

type combiner struct {
	c        *Client
	mu       sync.Mutex
	inflight []int          // per group: messages under way
	queued   [][]*pendingOp // per group

	messages, ops atomic.Uint64
}

// Stats counts what a client sent.
type Stats struct {
	// WriteMessages and WriteOps count the messages of single-key writes
	// and the writes they carried (more ops than messages: combining).
	WriteMessages, WriteOps uint64
}

// Stats reports the client's counters.
func (c *Client) Stats() Stats {
	return Stats{WriteMessages: c.comb.messages.Load(), WriteOps: c.comb.ops.Load()}
}

func (c *Client) combine(ctx context.Context, op kv.Op) (kv.Result, uint64, error) {
	if err := ctx.Err(); err != nil {
		return kv.Result{}, 0, err // a done context: nothing is sent
	}
	cb := &c.comb
	p := &pendingOp{op: op, g: c.m.GroupOf(op.Key), done: make(chan struct{})}
	cb.mu.Lock()
	if cb.inflight[p.g] < c.m.Limits.ClientSlots && len(cb.queued[p.g]) == 0 {
		// Alone: sent on the caller's goroutine, under the caller's
		// context (if it ends, the runner keeps the message going and
		// the caller learns ErrOutcomeUnknown).
		cb.inflight[p.g]++
		p.sent = true
		cb.mu.Unlock()
		cb.send(ctx, p.g, []*pendingOp{p})
	} else {
		cb.queued[p.g] = append(cb.queued[p.g], p)
		cb.mu.Unlock()
	}
	select {
	case <-p.done:
		return p.res, p.index, p.err
	case <-ctx.Done():
		cb.mu.Lock()
		defer cb.mu.Unlock()
		if !p.sent {
			// Still queued: it will never be sent.
			q := cb.queued[p.g]
			for i, x := range q {
				if x == p {
					cb.queued[p.g] = append(q[:i], q[i+1:]...)
					break
				}
			}
			return kv.Result{}, 0, ctx.Err()
		}
		return kv.Result{}, 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	}
}

// send multicasts batch (ops of group g) as one message under ctx, hands
// each op its result, then sends what queued meanwhile, on a new goroutine
// under the client's own context (combined ops belong to several callers).
func (cb *combiner) send(ctx context.Context, g uint32, batch []*pendingOp) {
	c := cb.c
	ops := make([]kv.Op, len(batch))
	for i, p := range batch {
		ops[i] = p.op
	}
	var payload []byte
	if len(batch) == 1 {
		payload = kv.AppendRequest(nil, ops)
	} else {
		payload = kv.AppendMulti(nil, ops)
	}
	cb.messages.Add(1)
	cb.ops.Add(uint64(len(batch)))
	o, err := c.runner.Multicast(ctx, tree.Of(g), payload)
	var rs []kv.Result
	index := uint64(0)
	if err == nil && len(o.Replies) != 1 {
		err = fmt.Errorf("rdmakv: %d replies to a message for group %d", len(o.Replies), g)
	}
	if err == nil && o.Replies[0].Truncated {
		err = fmt.Errorf("rdmakv: group %d's reply was truncated (the cluster's max_result is below this client's)", g)
	}
	if err == nil {
		index = o.Replies[0].Index
		c.known(g, index)
		if len(batch) == 1 {
			var r kv.Result
			if r, err = kv.DecodeResult(o.Replies[0].Result); err == nil {
				rs = []kv.Result{r}
			}
		} else if res := o.Replies[0].Result; len(res) == kv.ResultSize {
			// The group refused the whole message (kv.LimitMulti): each
			// op gets the refusal.
			var r kv.Result
			if r, err = kv.DecodeResult(res); err == nil && r.Status != kv.StatusRefused {
				err = fmt.Errorf("rdmakv: group %d answered status %d to a multi request", g, r.Status)
			}
			for range batch {
				rs = append(rs, r)
			}
		} else {
			rs, err = kv.DecodeMultiResult(res, nil)
		}
		if err == nil && len(rs) != len(batch) {
			err = fmt.Errorf("rdmakv: group %d answered %d results for %d ops", g, len(rs), len(batch))
		}
		if err == nil && len(rs) == 1 && rs[0].Status == kv.StatusMalformed {
			err = fmt.Errorf("rdmakv: group %d refused the request as malformed (nothing applied there)", g)
		}
	} else if err != nil && (errors.Is(err, multicast.ErrClosed) || c.isClosed()) {
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
	} else if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
	}
	for i, p := range batch {
		p.err, p.index = err, index
		if err == nil {
			p.res = rs[i]
		}
		close(p.done)
	}
	// Take the group's queue, or give the group's slot back.
	cb.mu.Lock()
	if len(cb.queued[g]) == 0 {
		cb.inflight[g]--
		cb.mu.Unlock()
		return
	}
	nb := cb.take(g)
	cb.mu.Unlock()
	go cb.send(c.life0, g, nb)
}

// take removes up to kv.MaxMulti ops of group g's queue that fit one
// request slot (mu held).
func (cb *combiner) take(g uint32) []*pendingOp {
	q := cb.queued[g]
	room := multicast.MaxPayload(cb.c.m.Limits.SlotSize) - 4
	n := 0
	for n < len(q) && n < kv.MaxMulti {
		sz := kv.RequestSize([]kv.Op{q[n].op}) - 4
		if n > 0 && sz > room {
			break
		}
		room -= sz
		n++
	}
	batch := append([]*pendingOp(nil), q[:n]...)
	for _, p := range batch {
		p.sent = true
	}
	cb.queued[g] = append(q[:0], q[n:]...)
	return batch
}
