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
// The hold (WithCombineHold; off by default, the whole window, but 1 on a
// sync cluster: DefaultSyncCombineHold) is
// Nagle-like: a write that finds its group with hold messages or more in
// flight queues even if the window has room, and the next completion of
// one of the group's messages posts the queue (its hook, as above). A
// flush posts its first message whatever the hold and more only while the
// group is not held or the message before was full. A lone writer finds
// nothing in flight and posts at once; under load, fewer and larger
// messages go out (64 writers on 2 groups: ~12 writes a message with a hold
// of 1 against ~2.6). A group with queued writes always has a message in
// flight or a caller posting, or is held by a round (below) whose bound a
// queued caller wakes for, so a queued write is never left behind.
//
// The busy hold (on by default on a memory or async cluster unless
// WithCombineHold sets a hold: DefaultCombineBusyHold) is the hold of 1
// while the group is busy: while more writes arrive for it during a
// message's round trip than busyHoldOn (on average over its last
// completions: each message counts the writes that joined the group's
// queue from its post to its completion), a write that finds one of the
// group's messages in flight queues for its completion; once that average
// falls below busyHoldOff the group posts whenever its window has room
// again. One writer, or a few, never see a write of their group arrive
// during a round trip, so they post at once as without a hold; 64 writers
// on 2 groups see ~25, and their messages then carry ~17 writes instead of
// ~3 (docs/dev/write-path-plan.md, m500's paragraph). It needs a message
// in flight to hold, as the hold of 1 does, so a queued write always has a
// completion coming to post it.
//
// Rounds (WithCombineRounds; off by default, DefaultSyncCombineRounds,
// since alone they were not faster): a group's queue also waits while another
// group has a message in flight posted less than roundMax ago, so that
// the groups' messages go out together when the last of them completes.
// Why (docs/dev/durability-plan.md, spipe's paragraph): in sync mode the
// embedded cluster's groups share one log, whose device starts the next
// batch at a completion with the records waiting then. With a hold of 1
// per group the two groups' messages fell into alternate batches: a
// message posted at its group's completion came after the other group's
// batch had started, so it waited for that whole fsync and then its own
// (two fsyncs in flight, one message a batch). Posted in one round, both
// groups' records join one batch, which the gather holds for both groups'
// followers (wal/gather.go), and they complete in the same fsync. A young
// message only: a group that does not answer (paused, its disk slow)
// holds the others for roundMax at most, and a queued caller wakes by
// then to post its group's queue.
//
// Every caller waits for its own op (multicast.Client.Await on the op's
// Waiter); one of the waiting callers is the multicast client's reaper.
// A posted message's call has an OnDone hook (message.onDone), which the
// goroutine that completed the call (the reaper, mostly) runs: it hands
// each op of the message its result and wakes that op's caller, then
// posts what queued behind the window. So a reply costs one wake-up per
// waiting caller and no goroutine in between, and a caller whose wait
// ends (its context or deadline) leaves its op behind: the message goes
// on, and is abandoned once no op of it has a caller.

// DefaultCombineHold is a client's hold (WithCombineHold): the messages of
// single-key writes a group may have in flight before a new write queues
// for the next completion rather than posting a message of its own; 0, the
// whole window (ClientSlots). A hold of 1 measured less CPU per put at 64
// writers but more context switches and fewer puts a second at 8, so it is
// not the default in memory mode (DefaultSyncCombineHold: sync mode's).
const DefaultCombineHold = 0

// DefaultSyncCombineHold is the hold of a client whose cluster map says
// durability sync (cluster.Map.Durability), unless WithCombineHold says
// otherwise: there a message waits for its group's fsync anyway, so a
// write that queues behind one message in flight costs little and the
// messages, and so the records of each fsync, are larger.
const DefaultSyncCombineHold = 1

// DefaultSyncCombineRounds says whether a client whose cluster map says
// durability sync sends its groups' messages in rounds (WithCombineRounds,
// above), unless WithCombineRounds says otherwise. Off: measured alone
// (2026-11-28, 2 rounds against the embedded cluster, 64 writers), rounds
// gave 41.1 and 32.2 k puts/s against 41.1 and 43.2 without them in the
// same build; the gain spipe saw under load did not hold on a quiet
// machine. Elsewhere rounds are off anyway: without a disk a message
// completes in microseconds, and waiting for another group's would only
// add its latency.
const DefaultSyncCombineRounds = false

// DefaultCombineBusyHold says whether a client on a memory or async
// cluster uses the busy hold (above) unless WithCombineHold sets a hold
// (then that hold alone). A sync cluster's default hold of 1 holds at
// least as much already.
const DefaultCombineBusyHold = true

// busyHoldOn and busyHoldOff bound the busy hold: a group is held once the
// writes that arrive during one of its messages' round trips average
// busyHoldOn or more, and posts freely again once they average below
// busyHoldOff (measured in the stand-in for alone, 2026-11-28: a hold of 1
// was no faster than none at 8 writers on 2 groups, ~4 arrivals a round
// trip, and 20% faster at 16, ~8).
const (
	busyHoldOn  = 6
	busyHoldOff = 3
)

// busyShift: the average is kept in 1/16ths of a write, and each
// completion moves it a quarter of the way to its own count.
const busyShift = 4

// roundMax bounds the wait a round imposes: a group's queue waits for
// another group's message only while that message was posted less than
// roundMax ago (a few of this VM's fsyncs under load). It is also how
// often a queued caller of a client with rounds looks again.
const roundMax = 5 * time.Millisecond

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
	w        *multicast.Waiter // done once the op has its outcome (state opDone); stays with the pooled op
	deadline time.Time

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
	cb      *combiner
	g       uint32
	ordered bool            // the ops are ordered ones (format 5)
	call    *multicast.Call // nil until posted
	ops     []*pendingOp    // an op whose caller gave up is nil
	kops    []kv.Op
	bops    []btree.Op // kops as btree ops (ordered messages)
	rs      []kv.Result
	hook    func(*multicast.Call) // onDone, made once with the message
	// arrAt is the group's arrivals count when the message was taken
	// (the busy hold: the writes that arrive during its round trip).
	arrAt uint64
	// dropped: every op's caller gave up and the call was abandoned;
	// the message is never reused (its hook may still run: it sees
	// this and does nothing).
	dropped bool
}

type combiner struct {
	c        *Client
	mu       sync.Mutex
	inflight []int          // per group: messages under way
	sending  []bool         // per group: a caller is posting its queue
	queued   [][]*pendingOp // per group

	ops  sync.Pool // *pendingOp
	msgs sync.Pool // *message

	// hold: a write that finds its group with hold messages in flight
	// queues for the next completion instead of posting its own (1 to
	// ClientSlots; ClientSlots: post whenever the window has room).
	hold int
	// busy: the busy hold is on (DefaultCombineBusyHold). arrivals
	// counts each group's writes; busyAvg is the writes that arrived
	// during a message's round trip, averaged over the group's
	// completions (in 1/16ths); busyOn says the group is held for it.
	busy     bool
	arrivals []uint64
	busyAvg  []uint32
	busyOn   []bool
	// rounds: a group's queue also waits for other groups' young messages
	// (posted less than roundWait ago; posted[g] is when group g's latest
	// message went out), so that the groups' messages go out together.
	rounds    bool
	roundWait time.Duration
	posted    []time.Time

	messages, nops atomic.Uint64
	// holdAnyGroup plants a bug (tests): the hold counts the messages in
	// flight of every group, so a write to a group with none in flight
	// queues behind another group's, where no completion of its own
	// group posts it.
	holdAnyGroup bool
	// busyNoFlight plants a bug (tests): the busy hold holds a busy group
	// with nothing of its own in flight, where no completion posts it.
	busyNoFlight bool
	// busyStuck plants a bug (tests): a group once busy stays held by the
	// busy hold however few writes arrive later.
	busyStuck bool
	// roundForever plants a bug (tests): a round holds a group's queue
	// behind another group's message however old it is, so a group
	// that does not answer holds every other group's writes.
	roundForever bool
	// roundNone plants a bug (tests): rounds hold nothing (a group with
	// nothing of its own in flight posts at once).
	roundNone bool
	// dropOverflow plants a bug (tests): an op that does not fit in the
	// message being filled is removed from the queue, never sent.
	dropOverflow bool
	// shiftResults plants a bug (tests): a message's op i gets the
	// result of op i+1.
	shiftResults bool
	// reuseUnposted plants a bug (tests): an op whose caller gives up
	// while its message is being encoded returns its key buffer to the
	// pool, where another write may overwrite it.
	reuseUnposted bool
	// onPost, if set (tests), runs in post before the message is encoded.
	onPost func()
	// closedAsUnsent plants a bug (tests): the hook of a message whose
	// call the client's Close ended hands its ops ErrClosed alone (never
	// sent), although the replicas may have applied them.
	closedAsUnsent bool
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
	return &pendingOp{w: multicast.NewWaiter()}
}

func (cb *combiner) putOp(p *pendingOp) {
	p.w.Reset()
	w, kbuf := p.w, p.kbuf
	*p = pendingOp{w: w, kbuf: kbuf[:0]}
	cb.ops.Put(p)
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
	cb.arrivals[p.g]++
	if cb.canPost(p.g) {
		cb.flush(p.g)
	}
	for {
		// mu held
		if p.state == opDone {
			cb.mu.Unlock()
			return p.res, p.index, p.err
		}
		if err := ctxEnded(ctx, deadline); err != nil {
			return cb.giveUp(p, err) // unlocks
		}
		if p.state == opQueued && c.closed.Load() {
			return cb.giveUp(p, ErrClosed)
		}
		wait := deadline
		if cb.rounds && p.state == opQueued {
			// A round may hold the queue with no completion of its
			// group to post it: look again once its bound passed.
			if until := time.Now().Add(cb.roundWait); wait.IsZero() || until.Before(wait) {
				wait = until
			}
		}
		cb.mu.Unlock()
		err := c.mc.Await(ctx, wait, p.w)
		cb.mu.Lock()
		if errors.Is(err, multicast.ErrClosed) && p.state != opDone {
			return cb.giveUp(p, ErrClosed)
		}
		// Rounds only: a round may hold the queue with no completion of
		// its group to post it (without rounds a queued write always has
		// one coming). Not for a caller about to give up.
		if cb.rounds && p.state == opQueued && ctxEnded(ctx, deadline) == nil && cb.canPost(p.g) {
			cb.flush(p.g)
		}
	}
}

// canPost says whether group g's queue may be posted now (mu held): no
// flush of it under way, not held, and room in its window.
func (cb *combiner) canPost(g uint32) bool {
	return !cb.sending[g] && !cb.held(g) && cb.inflight[g] < cb.c.m.Limits.ClientSlots
}

// held says whether group g's queue waits for one of the group's messages
// to complete (mu held): the group has hold messages in flight or more.
func (cb *combiner) held(g uint32) bool {
	inflight := cb.inflight[g]
	if cb.holdAnyGroup {
		inflight = 0
		for _, n := range cb.inflight {
			inflight += n
		}
	}
	return inflight >= cb.hold || cb.busyHeld(g) || cb.roundHeld(g)
}

// busyHeld says whether the busy hold holds group g's queue (mu held): the
// group is busy and has a message in flight.
func (cb *combiner) busyHeld(g uint32) bool {
	return cb.busy && cb.busyOn[g] && (cb.inflight[g] > 0 || cb.busyNoFlight)
}

// learnBusy takes m's round trip into group g's busy average (mu held, m
// completed or abandoned): the writes that joined the queue since m was
// taken.
func (cb *combiner) learnBusy(m *message) {
	if !cb.busy {
		return
	}
	g := m.g
	n := min(cb.arrivals[g]-m.arrAt, 1<<16)
	avg := int64(cb.busyAvg[g])
	avg += (int64(n)<<busyShift - avg) / 4
	cb.busyAvg[g] = uint32(avg)
	switch {
	case avg >= busyHoldOn<<busyShift:
		cb.busyOn[g] = true
	case avg < busyHoldOff<<busyShift && !cb.busyStuck:
		cb.busyOn[g] = false
	}
}

// roundHeld says whether a round holds group g's queue (mu held): another
// group has a message in flight posted less than roundWait ago.
func (cb *combiner) roundHeld(g uint32) bool {
	if !cb.rounds || cb.roundNone {
		return false
	}
	var now time.Time
	for h, n := range cb.inflight {
		if n == 0 || uint32(h) == g {
			continue
		}
		if cb.roundForever {
			return true
		}
		if now.IsZero() {
			now = time.Now()
		}
		if now.Sub(cb.posted[h]) < cb.roundWait {
			return true
		}
	}
	return false
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
	if m.call != nil && !m.dropped && m.live() == 0 {
		// nobody waits for it: abandoned (flush abandons a message
		// whose callers all gave up while it was posted)
		drop, m.dropped = m.call, true
		cb.done(m)
	}
	cb.mu.Unlock()
	if drop != nil {
		drop.Release() // abandoned: it no longer holds reply slots; its hook will not run
	}
	if errors.Is(err, ErrClosed) {
		return kv.Result{}, 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
	}
	return kv.Result{}, 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// live counts m's ops whose callers wait (mu held).
func (m *message) live() int {
	n := 0
	for _, q := range m.ops {
		if q != nil && q.state == opSent {
			n++
		}
	}
	return n
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
// flush may unlock it for a while). With rounds, a group's queue goes
// once no other group's young message is in flight: m's own, and the
// other groups' that waited for m.
func (cb *combiner) done(m *message) {
	cb.inflight[m.g]--
	cb.learnBusy(m)
	if !cb.rounds {
		if len(cb.queued[m.g]) > 0 && !cb.sending[m.g] {
			cb.flush(m.g)
		}
		return
	}
	// Which groups go is decided before any posts: a group posted now
	// is young and would hold the others for another round.
	// (flush unlocks mu: the list is this call's own)
	var buf [8]uint32
	due := buf[:0]
	for h := range cb.queued {
		g := uint32(h)
		if len(cb.queued[g]) == 0 || cb.sending[g] || cb.inflight[g] >= cb.c.m.Limits.ClientSlots || cb.roundHeld(g) {
			continue
		}
		if g == m.g || !cb.held(g) {
			due = append(due, g)
		}
	}
	for _, g := range due {
		if len(cb.queued[g]) > 0 && !cb.sending[g] {
			cb.flush(g)
		}
	}
}

// flush posts group g's queue as messages while the window has room (mu
// held; unlocked while encoding and posting). A posted message's call
// gets its hook (onDone), which hands the ops their results.
func (cb *combiner) flush(g uint32) {
	c := cb.c
	cb.sending[g] = true
	full := true // (the first message goes out whatever the hold)
	for len(cb.queued[g]) > 0 && cb.inflight[g] < c.m.Limits.ClientSlots && (full || !cb.held(g)) {
		var m *message
		m, full = cb.take(g)
		cb.inflight[g]++
		if cb.rounds {
			cb.posted[g] = time.Now()
		}
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
		if m.live() == 0 {
			// every op's caller gave up while it was posted
			call.Release()
			cb.inflight[g]--
			cb.msgs.Put(m)
			continue
		}
		call.OnDone(m.hook) // (it runs at once if call is done already)
	}
	cb.sending[g] = false
}

// take removes from group g's queue its first op and up to kv.MaxMulti-1
// later ones of the same kind (hashed or ordered) that fit one request
// slot with it, into a message (mu held). The ops left keep their order.
func (cb *combiner) take(g uint32) (m *message, full bool) {
	m, _ = cb.msgs.Get().(*message)
	if m == nil {
		m = &message{cb: cb}
		m.hook = m.onDone
	}
	q := cb.queued[g]
	m.g, m.call, m.ordered, m.arrAt = g, nil, q[0].ordered, cb.arrivals[g]
	m.ops, m.kops = m.ops[:0], m.kops[:0]
	room := multicast.MaxPayload(cb.c.m.Limits.SlotSize) - 4
	kept := 0
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
			if cb.dropOverflow {
				continue // (still opQueued, in no queue: its caller waits)
			}
		}
		q[kept] = p
		kept++
	}
	clear(q[kept:])
	cb.queued[g] = q[:kept]
	return m, full
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

// onDone is the hook of m's call, run once it is done (by the goroutine
// that completed it, holding none of the client's locks): it hands each
// op of m still waiting its result, frees m's window slot and posts what
// queued meanwhile.
func (m *message) onDone(call *multicast.Call) {
	cb := m.cb
	c := cb.c
	cb.mu.Lock()
	if m.dropped || m.call != call {
		cb.mu.Unlock() // abandoned (giveUp released the call)
		return
	}
	replies, err := call.Result()
	switch {
	case err == nil:
	case errors.Is(err, multicast.ErrClosed) && cb.closedAsUnsent:
		err = ErrClosed
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
	cb.deliver(m, replies, err)
	cb.done(m)
	cb.mu.Unlock()
	call.Release()
	cb.msgs.Put(m)
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
		p.w.Done()
	}
}
