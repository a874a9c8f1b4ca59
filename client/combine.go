package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// Write combining. A client has a window of ClientSlots messages in flight
// per group. A single-key write (Put, Delete, a compare-and-swap, of a
// hashed key or of an ordered keyspace's) joins its group's queue; whoever
// finds the window open and nobody sending for the group drains the whole
// queue into messages (kv.AppendMulti for hashed keys, btree.AppendMulti
// for ordered ones: up to kv.MaxMulti independent ops, each with its own
// condition and result; a lone op goes as a plain request), encoded
// straight into the multicast call's record image and posted on that
// caller's goroutine. A message carries ops of one kind: hashed and
// ordered ops of a group share its queue and its window, and a message
// takes the queue's first op and the later ones of the same kind (the
// group's replica routes a message by its format byte, and a request of
// format 5 carries ordered ops only). When the
// window is full the queue grows, and the caller whose message completes
// sends it. Under load one ordered message thus carries many writes, and a
// single writer's put is posted and reaped by its own goroutine. The
// windows are per group so that a group that does not answer holds only
// its own writes.
//
// Each message has an owner, one of its ops' callers, who waits for the
// multicast call (multicast.Call.Wait) and hands each op its result. If
// the owner's wait ends (its context or deadline), it hands the message
// to another op's caller still waiting; the last one to give up abandons
// the call. The owner also expires the ops of its message whose deadline
// passed, so the others wait without a timer.

type pendingOp struct {
	op kv.Op
	// ordered: op is an ordered keyspace's, its key the internal key (the
	// keyspace's prefix and the user's key) in kbuf, which stays with
	// the pooled op.
	ordered  bool
	kbuf     []byte
	g        uint32
	res      kv.Result
	index    uint64
	err      error
	ch       chan struct{} // cap 1: a result, or the message handed over
	deadline time.Time
	// t wakes a caller queued behind a full window at its deadline;
	// made once, it stays with the pooled op (stopped when unused).
	t *time.Timer

	// under combiner.mu
	state uint8
	m     *message // once taken into a message
}

const (
	opQueued = iota
	opSent
	opDone
	opGone // its caller gave up
)

type message struct {
	g       uint32
	ordered bool            // the ops are ordered ones (format 5)
	call    *multicast.Call // nil until posted
	ops     []*pendingOp
	kops    []kv.Op
	bops    []btree.Op // kops as btree ops (ordered messages)
	rs      []kv.Result
	owner   *pendingOp // the op whose caller waits for call; nil if none left
}

type combiner struct {
	c        *Client
	mu       sync.Mutex
	inflight []int          // per group: messages under way
	sending  []bool         // per group: a caller is posting its queue
	queued   [][]*pendingOp // per group

	ops  sync.Pool // *pendingOp
	msgs sync.Pool // *message

	messages, nops atomic.Uint64
	// shiftResults plants a bug (tests): a message's op i gets the
	// result of op i+1.
	shiftResults bool
	// reuseUnposted plants a bug (tests): an op whose caller gives up
	// while its message is being encoded returns its key buffer to the
	// pool, where another write may overwrite it.
	reuseUnposted bool
	// onPost, if set (tests), runs in post before the message is encoded.
	onPost func()
}

// Stats counts what a client sent.
type Stats struct {
	// WriteMessages and WriteOps count the messages of single-key writes
	// (of hashed and of ordered keys) and the writes they carried (more
	// ops than messages: combining).
	WriteMessages, WriteOps uint64
	// Ordered keyspaces' one-sided reads (every Keyspace of the client):
	// OrderedGets counts the gets answered, OrderedGetReads the one-sided
	// node reads they posted (every attempt's; a read shared with a
	// concurrent get of the same leaf counts once) and OrderedGetLists
	// the lists of reads (round trips) of the attempts that answered;
	// likewise for scan pages (a Scan reads one page per ScanPage pairs).
	// OrderedGetHits counts the gets that read one node at most: the
	// leaf, found through the cache (its hit rate: OrderedGetHits /
	// OrderedGets).
	OrderedGets, OrderedGetReads, OrderedGetLists, OrderedGetHits uint64
	OrderedScanPages, OrderedScanReads, OrderedScanLists          uint64
	// OrderedCache is the client's cache of inner nodes (Nodes, Bytes:
	// its size now). Its Lookups, Reads and Warm count the walks that
	// answered, and a walk runs again from the inner nodes an earlier run
	// of the same get cached: use OrderedGetReads and OrderedGetHits for
	// what gets read.
	OrderedCache btree.CacheStats
}

// Stats reports the client's counters.
func (c *Client) Stats() Stats {
	s := Stats{WriteMessages: c.comb.messages.Load(), WriteOps: c.comb.nops.Load()}
	o := &c.ord
	s.OrderedGets, s.OrderedGetReads, s.OrderedGetLists = o.gets.Load(), o.getReads.Load(), o.getLists.Load()
	s.OrderedGetHits = o.getHits.Load()
	s.OrderedScanPages, s.OrderedScanReads, s.OrderedScanLists = o.pages.Load(), o.pageReads.Load(), o.pageLists.Load()
	if o.ready.Load() {
		for _, og := range o.groups {
			cs := og.cache.Stats()
			s.OrderedCache.Lookups += cs.Lookups
			s.OrderedCache.Reads += cs.Reads
			s.OrderedCache.Warm += cs.Warm
			s.OrderedCache.Drops += cs.Drops
			s.OrderedCache.Evicted += cs.Evicted
			s.OrderedCache.Nodes += cs.Nodes
			s.OrderedCache.Bytes += cs.Bytes
		}
	}
	return s
}

func (cb *combiner) getOp() *pendingOp {
	if p, _ := cb.ops.Get().(*pendingOp); p != nil {
		return p
	}
	return &pendingOp{ch: make(chan struct{}, 1)}
}

func (cb *combiner) putOp(p *pendingOp) {
	select {
	case <-p.ch:
	default:
	}
	ch, t, kbuf := p.ch, p.t, p.kbuf
	*p = pendingOp{ch: ch, t: t, kbuf: kbuf[:0]}
	cb.ops.Put(p)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// combine sends op through group g's queue and waits for its result until
// ctx ends or deadline passes. ks is the ordered keyspace of op's key (nil:
// a hashed key).
func (c *Client) combine(ctx context.Context, deadline time.Time, g uint32, op kv.Op, ks *Keyspace) (kv.Result, uint64, error) {
	cb := &c.comb
	p := cb.getOp()
	defer cb.putOp(p)
	if ks != nil {
		p.kbuf = ks.ks.InternalKey(p.kbuf[:0], op.Key)
		op.Key, p.ordered = p.kbuf, true
	}
	p.op, p.g, p.deadline = op, g, deadline
	cb.mu.Lock()
	cb.queued[p.g] = append(cb.queued[p.g], p)
	if !cb.sending[p.g] && cb.inflight[p.g] < c.m.Limits.ClientSlots {
		cb.flush(p.g, p)
	}
	armed := false // p.t, only while queued behind a full window
	defer func() {
		if armed {
			p.t.Stop()
		}
	}()
	for {
		// mu held
		if p.state == opDone {
			cb.mu.Unlock()
			return p.res, p.index, p.err
		}
		if err := ctxEnded(ctx, deadline); err != nil {
			return cb.giveUp(p, err) // unlocks
		}
		if m := p.m; m != nil && m.owner == p && m.call != nil {
			cb.mu.Unlock()
			cb.own(ctx, p)
			cb.mu.Lock()
			continue
		}
		if p.state == opQueued && c.closed.Load() {
			return cb.giveUp(p, ErrClosed)
		}
		var tc <-chan time.Time
		if p.state == opQueued && !deadline.IsZero() {
			// the owners of messages expire their ops; a queued op
			// has none
			if !armed {
				if p.t == nil {
					p.t = time.NewTimer(time.Until(deadline))
				} else {
					p.t.Reset(time.Until(deadline)) // no stale tick: Go 1.23 timers
				}
				armed = true
			}
			tc = p.t.C
		}
		cb.mu.Unlock()
		select {
		case <-p.ch:
		case <-ctx.Done():
		case <-tc:
		case <-c.done:
		}
		cb.mu.Lock()
	}
}

// ctxEnded is ctx's error, or context.DeadlineExceeded once deadline (if
// not zero) passed.
func ctxEnded(ctx context.Context, deadline time.Time) error {
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// giveUp ends p's wait with err (mu held; it unlocks): a queued op is never
// sent; one in a message has an unknown outcome, and the message goes to
// another of its ops' callers (or is abandoned if none waits).
func (cb *combiner) giveUp(p *pendingOp, err error) (kv.Result, uint64, error) {
	if p.state == opQueued {
		q := cb.queued[p.g]
		for i, x := range q {
			if x == p {
				copy(q[i:], q[i+1:])
				q[len(q)-1] = nil
				cb.queued[p.g] = q[:len(q)-1]
				break
			}
		}
		p.state = opGone
		cb.mu.Unlock()
		return kv.Result{}, 0, err
	}
	p.state = opGone
	m := p.m
	m.forget(p)
	if m.call == nil && !cb.reuseUnposted {
		// m may be being encoded (post, outside mu): its copy of the op
		// still reads the key in kbuf, which must not go back to the
		// pool with p.
		p.kbuf = nil
	}
	var drop *multicast.Call
	if m.owner == p {
		m.owner = nil
		for _, q := range m.ops {
			if q != nil && q.state == opSent {
				m.owner = q
				signal(q.ch)
				break
			}
		}
		if m.owner == nil && m.call != nil {
			drop = m.call
			cb.done(m)
		}
	}
	cb.mu.Unlock()
	if drop != nil {
		drop.Release() // abandoned: it no longer holds reply slots
		cb.msgs.Put(m)
	}
	if errors.Is(err, ErrClosed) {
		return kv.Result{}, 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
	}
	return kv.Result{}, 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// forget drops p from m (mu held): its caller returns, and p goes back to
// the pool while m may still be under way.
func (m *message) forget(p *pendingOp) {
	for i, q := range m.ops {
		if q == p {
			m.ops[i] = nil // (its result stays at index i)
		}
	}
}

// done frees m's window slot and sends what queued meanwhile (mu held;
// flush may unlock it for a while).
func (cb *combiner) done(m *message) {
	cb.inflight[m.g]--
	if len(cb.queued[m.g]) > 0 && !cb.sending[m.g] {
		cb.flush(m.g, nil)
	}
}

// flush posts group g's queue as messages while the window has room (mu
// held; unlocked while encoding and posting). Each message's owner is the
// caller's op (self) if the message carries it, else its first op's
// caller, woken to wait for it.
func (cb *combiner) flush(g uint32, self *pendingOp) {
	c := cb.c
	cb.sending[g] = true
	for len(cb.queued[g]) > 0 && cb.inflight[g] < c.m.Limits.ClientSlots {
		m := cb.take(g, self)
		cb.inflight[g]++
		cb.mu.Unlock()
		call, err := cb.post(m)
		cb.mu.Lock()
		if err != nil {
			cb.deliver(m, nil, err)
			cb.inflight[g]--
			cb.msgs.Put(m)
			continue
		}
		m.call = call
		if m.owner == nil {
			// every op's caller gave up while it was posted
			call.Release()
			cb.inflight[g]--
			cb.msgs.Put(m)
			continue
		}
		if m.owner != self {
			signal(m.owner.ch)
		}
	}
	cb.sending[g] = false
}

// take removes from group g's queue its first op and up to kv.MaxMulti-1
// later ones of the same kind (hashed or ordered) that fit one request
// slot with it, into a message (mu held). The ops left keep their order.
func (cb *combiner) take(g uint32, self *pendingOp) *message {
	m, _ := cb.msgs.Get().(*message)
	if m == nil {
		m = &message{}
	}
	q := cb.queued[g]
	m.g, m.call, m.owner, m.ordered = g, nil, nil, q[0].ordered
	m.ops, m.kops = m.ops[:0], m.kops[:0]
	room := multicast.MaxPayload(cb.c.m.Limits.SlotSize) - 4
	kept, full := 0, false
	for _, p := range q {
		if !full && p.ordered == m.ordered {
			// (kv's and btree's requests encode an op in the same bytes)
			m.kops = append(m.kops, p.op)
			sz := kv.RequestSize(m.kops[len(m.kops)-1:]) - 4
			if len(m.ops) == 0 || sz <= room {
				room -= sz
				p.state, p.m = opSent, m
				m.ops = append(m.ops, p)
				full = len(m.ops) == kv.MaxMulti
				continue
			}
			m.kops, full = m.kops[:len(m.kops)-1], true
		}
		q[kept] = p
		kept++
	}
	m.owner = m.ops[0]
	for _, p := range m.ops {
		if p == self {
			m.owner = p // no wake-up: the caller waits for it
		}
	}
	clear(q[kept:])
	cb.queued[g] = q[:kept]
	return m
}

// post encodes m's ops into a multicast call's record and sends it.
func (cb *combiner) post(m *message) (*multicast.Call, error) {
	c := cb.c
	if err := c.registered(tree.Of(m.g)); err != nil {
		return nil, err
	}
	if cb.onPost != nil {
		cb.onPost()
	}
	n := kv.RequestSize(m.kops)
	if m.ordered {
		m.bops = m.bops[:0]
		for i := range m.kops {
			o := &m.kops[i]
			m.bops = append(m.bops, btree.Op{Kind: o.Kind, Cmp: o.Cmp, Key: o.Key, Value: o.Value, CmpVersion: o.CmpVersion, CmpValue: o.CmpValue})
		}
		n = btree.RequestSize(m.bops)
	}
	call, area, err := c.mc.Begin(tree.Of(m.g), n)
	if err != nil {
		if errors.Is(err, multicast.ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
		}
		return nil, err
	}
	switch {
	case m.ordered && len(m.bops) == 1:
		btree.AppendRequest(area[:0], m.bops)
	case m.ordered:
		btree.AppendMulti(area[:0], m.bops)
	case len(m.kops) == 1:
		kv.AppendRequest(area[:0], m.kops)
	default:
		kv.AppendMulti(area[:0], m.kops)
	}
	cb.messages.Add(1)
	cb.nops.Add(uint64(len(m.kops)))
	call.Send()
	return call, nil
}

// own waits, as m's owner, for p's message's outcome and hands each op
// its result; if p's wait ends first the message goes to another op.
func (cb *combiner) own(ctx context.Context, p *pendingOp) {
	c := cb.c
	m := p.m
	for {
		// the earliest deadline of the ops still waiting
		cb.mu.Lock()
		dl := p.deadline
		for _, q := range m.ops {
			if q != nil && q.state == opSent && !q.deadline.IsZero() && (dl.IsZero() || q.deadline.Before(dl)) {
				dl = q.deadline
			}
		}
		cb.mu.Unlock()
		replies, err := m.call.Wait(ctx, dl)
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			// the outcome, or the call failed (nothing to wait for)
			switch {
			case errors.Is(err, multicast.ErrClosed):
				err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
			case errors.Is(err, multicast.ErrRestarted):
				// its group came back without its memory: never sent again
				err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
			case errors.Is(err, multicast.ErrDiskFull):
				err = diskFullErr(err)
			case errors.Is(err, multicast.ErrNotReady):
				if uerr := c.registered(tree.Of(m.g)); uerr != nil {
					err = uerr
				}
			}
			cb.mu.Lock()
			cb.deliver(m, replies, err)
			call := m.call
			cb.done(m)
			cb.mu.Unlock()
			call.Release()
			cb.msgs.Put(m)
			return
		}
		cb.mu.Lock()
		now := time.Now()
		for i, q := range m.ops {
			if q != nil && q != p && q.state == opSent && !q.deadline.IsZero() && !now.Before(q.deadline) {
				q.state, q.err = opDone, fmt.Errorf("%w: %w", ErrOutcomeUnknown, context.DeadlineExceeded)
				m.ops[i] = nil
				signal(q.ch)
			}
		}
		ended := ctxEnded(ctx, p.deadline) != nil
		cb.mu.Unlock()
		if ended {
			return // combine gives up
		}
	}
}

// deliver hands each op of m still waiting its result: from replies, or
// err (mu held).
func (cb *combiner) deliver(m *message, replies []multicast.Reply, err error) {
	c := cb.c
	g := m.g
	index := uint64(0)
	rs := m.rs[:0]
	if err == nil && len(replies) != 1 {
		err = fmt.Errorf("rdmakv: %d replies to a message for group %d", len(replies), g)
	}
	if err == nil && replies[0].Truncated {
		err = fmt.Errorf("rdmakv: group %d's reply was truncated (the cluster's max_result is below this client's)", g)
	}
	if err == nil {
		index = replies[0].Index
		c.known(g, index)
		if len(m.ops) == 1 {
			var r kv.Result
			if r, err = kv.DecodeResult(replies[0].Result); err == nil {
				rs = append(rs, r)
			}
		} else if res := replies[0].Result; len(res) == kv.ResultSize {
			// The group refused the whole message (kv.LimitMulti): each
			// op gets the refusal.
			var r kv.Result
			if r, err = kv.DecodeResult(res); err == nil && r.Status != kv.StatusRefused && r.Status != kv.StatusMalformed {
				err = fmt.Errorf("rdmakv: group %d answered status %d to a multi request", g, r.Status)
			}
			for range m.ops {
				rs = append(rs, r)
			}
		} else {
			// (an ordered multi request's result is laid out as kv's)
			rs, err = kv.DecodeMultiResult(res, rs)
		}
		if err == nil && len(rs) != len(m.ops) {
			err = fmt.Errorf("rdmakv: group %d answered %d results for %d ops", g, len(rs), len(m.ops))
		}
		if err == nil && len(rs) > 0 && rs[0].Status == kv.StatusMalformed {
			err = fmt.Errorf("rdmakv: group %d refused the request as malformed (nothing applied there)", g)
			if m.ordered {
				err = fmt.Errorf("rdmakv: group %d refused the ordered request as malformed (nothing applied; does it run an ordered keyspace?)", g)
			}
		}
	}
	m.rs = rs
	for i, p := range m.ops {
		if p == nil || p.state == opGone || p.state == opDone {
			continue
		}
		p.state, p.err, p.index = opDone, err, index
		if err == nil {
			p.res = rs[i]
			if cb.shiftResults {
				p.res = rs[(i+1)%len(rs)]
			}
		}
		m.ops[i] = nil
		signal(p.ch)
	}
}
