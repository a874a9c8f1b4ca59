package multicast

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// ClientConfig configures a TRAM client (Alg. 1). The ring geometry
// (ClientSlots, SlotSize, MaxResult) must match the replicas'.
type ClientConfig struct {
	// Slot is the client slot this client holds; the cluster's
	// Config.ClientNodes[Slot] must be this client's node. One live
	// client per slot.
	Slot uint32
	// Inc is this incarnation of the slot: above every earlier one (the
	// Unix time in nanoseconds does). Required.
	Inc uint64
	// Tree and Members are the cluster's overlay and groups.
	Tree    *tree.Tree
	Members [][]rdma.NodeID
	// ReplyRegion is the id of the region replies land in; default
	// regions.Client(Slot).
	ReplyRegion rdma.RegionID
	// ClientSlots, SlotSize, MaxResult: as the replicas' Config.
	ClientSlots, SlotSize, MaxResult int
	// RetryAfter is how long a message waits for its replies before the
	// client writes it again and asks the destinations to re-send their
	// replies; it doubles on each retry up to 20x. Default 50 ms.
	RetryAfter time.Duration
	// ReconnectMin and ReconnectMax bound the backoff of broken Conns.
	ReconnectMin, ReconnectMax time.Duration
	// OnDone is called from Poll when a message has every destination
	// group's reply; the Outcome, its Replies and their Result bytes are
	// valid only during the call (the client reuses them).
	OnDone func(*Outcome)
}

// Outcome is what a client learns of a message: each destination group's
// reply, in ascending group order.
type Outcome struct {
	ID      MsgID
	Dst     tree.Set
	Replies []Reply
	Sent    time.Duration // the Poll clock when it was first written
	Retries int
}

// Reply is one destination group's outcome: the message's delivery index
// in that group and the bytes the application's Apply returned.
type Reply struct {
	Group     tree.Group
	Index     uint64
	Result    []byte
	Truncated bool // Apply returned more than MaxResult bytes
}

// Client errors.
var (
	ErrNotReady    = errors.New("multicast: client not registered with every group yet")
	ErrWindowFull  = errors.New("multicast: client window full (ClientSlots messages outstanding)")
	ErrTooLarge    = errors.New("multicast: payload larger than a ring slot holds")
	ErrDestination = errors.New("multicast: destination set empty or outside the tree")
	// ErrRestarted ends a started client's calls under way when every
	// replica of a group restarted while they were (Client.restarted):
	// each may or may not have been delivered.
	ErrRestarted = errors.New("multicast: every replica of a group restarted while the message was under way; it may or may not have been delivered")
	// ErrDiskFull is wrapped by *DiskFullError.
	ErrDiskFull = errors.New("multicast: disk full")
)

// DiskFullError ends a started client's call whose lca's leader cannot
// log new messages because its group's disks are full (broadcast.
// ErrDiskFull): the leader wrote a notice in the call's reply slot
// instead of a reply. Sent says whether the message was written to the
// group's ring: if so it stays there and may still be delivered once
// space returns (its outcome is unknown; it is never sent again); if not
// nothing was sent: the group had refused earlier messages that fill
// the client's window to it and has not answered since (a call would
// otherwise wait for them).
type DiskFullError struct {
	Group tree.Group
	Sent  bool
}

func (e *DiskFullError) Error() string {
	if e.Sent {
		return fmt.Sprintf("multicast: group %d refuses writes: disk full (the message is in its ring and may still be delivered once space returns)", e.Group)
	}
	return fmt.Sprintf("multicast: group %d refuses writes: disk full (nothing sent)", e.Group)
}

func (e *DiskFullError) Unwrap() error { return ErrDiskFull }

// Client multicasts messages (TRAM Alg. 1: write m into the client's ring
// on every replica of lca(dst)) and collects the replies that the
// destination groups' leaders write into its own reply region.
//
// It is safe for concurrent use, in one of two ways. A polled client
// (NewClient; the simulator, kvbench's loaders) is driven by Multicast and
// Poll with the caller's clock, and reports outcomes through OnDone. A
// started client (StartClient) serves calls: Begin, Send and Wait on the
// caller's goroutine (call.go), with no goroutine in between.
//
// Groups are isolated: the window is per group (ClientSlots messages to
// each group may be outstanding), so messages that a dead group never
// answers hold only that group's ring and reply slots, and messages to
// the other groups go on. A message's sequence number is the lowest one
// above the last used whose reply slot (seq mod ClientSlots) is free in
// every destination group: numbers are skipped, never reused, so they
// still grow (the replicas' exactly-once table keeps the highest).
type Client struct {
	// mu guards everything below but the fields of call.go that say
	// otherwise; OnDone runs under it (it must not call the client).
	mu    sync.Mutex
	cfg   ClientConfig
	node  rdma.Node
	reg   rdma.Region
	addr  Addr
	base  []rdma.RegionID // per group: regions.Multicast(g)
	peers [][]*peer       // per group, per member
	// leader, per group: the member (index in peers) that wrote the last
	// reply, its leader then; -1 unknown. send writes a message to every
	// member but rings only the leader's doorbell (only a leader scans
	// the rings; a leader not rung finds the message at its next
	// heartbeat's scan), and every member's while it is unknown, which a
	// retry makes it again.
	leader []int
	now    time.Duration
	knobs  testingKnobs // planted bugs of the started client, tests only (knobs.go)

	ready     tree.Set // groups that acknowledged our incarnation
	helloAt   time.Duration
	helloWait time.Duration

	// Whole-group restarts (a started client only: watchRestarts).
	// linkBase, per group, per member: the member's link's connection
	// epoch when the group last answered (answered); 0 not seen. Once every member's link connected again since (each
	// process was replaced, as by a kill -9 of the whole group), the
	// client takes a new incarnation (restarted). stale: groups that
	// registered an older incarnation and not yet the current one (they
	// stay in ready; hello is written to them until they answer).
	watchRestarts bool
	linkBase      [][]uint64
	stale         tree.Set
	restarts      uint64

	seq   uint64
	pos   []uint64   // per group: last ring position written
	busy  [][]uint64 // per group, per ring slot: seq occupying it (0 free)
	rbusy [][]uint64 // per group, per reply slot (seq mod ClientSlots): seq occupying it (0 free)
	calls []call     // Groups x ClientSlots: each group has at most ClientSlots outstanding
	act   []int      // indexes in calls of the outstanding messages
	free  []int      // indexes in calls not in use
	retry uint64     // our retry counter (the header's retry word)
	out   int
	rs    int // reply slot size
	rbuf  []byte
	oc    Outcome

	rt callState // the started client's calls (call.go)

	// full: groups whose leader sent a disk-full notice and no reply
	// since
	full tree.Set
}

type call struct {
	seq     uint64
	dst     tree.Set
	lca     tree.Group
	pos     uint64
	payload []byte
	sent    time.Duration
	retryAt time.Duration
	wait    time.Duration
	got     tree.Set
	replies []Reply
	rbuf    []byte // the replies' results, in arrival order
	rends   []int  // end of each reply's result in rbuf
	retries int
	esum    uint64 // its lca's links' connection epochs (summed) when it was admitted
	ring    bool   // it holds its lca's ring slot (no reply yet)
	gone    bool   // abandoned: dropped once it holds no ring slot
	rec     []byte // the record image send posts (in own, or the user's Call)
	own     []byte // the record image of a polled Multicast or an abandoned Call
	user    *Call  // the started client's call waiting for it, if any
}

// NewClient creates a client on node: it registers its reply region and
// grants every replica of every group write access to it. Call Poll until
// Ready before multicasting.
func NewClient(cfg ClientConfig, node rdma.Node) (*Client, error) {
	if cfg.Tree == nil || len(cfg.Members) != cfg.Tree.Len() {
		return nil, fmt.Errorf("%w: client needs the tree and every group's members", ErrConfig)
	}
	if cfg.Inc == 0 {
		return nil, fmt.Errorf("%w: client incarnation 0", ErrConfig)
	}
	if cfg.ClientSlots == 0 {
		cfg.ClientSlots = DefaultClientSlots
	}
	if cfg.SlotSize == 0 {
		cfg.SlotSize = DefaultSlotSize
	}
	if cfg.MaxResult == 0 {
		cfg.MaxResult = DefaultMaxResult
	}
	cfg.SlotSize, cfg.MaxResult = pad8(cfg.SlotSize), pad8(cfg.MaxResult)
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 50 * time.Millisecond
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = broadcast.DefaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = broadcast.DefaultReconnectMax
	}
	if cfg.ReplyRegion == 0 {
		cfg.ReplyRegion = regions.Client(cfg.Slot)
	}
	ng := cfg.Tree.Len()
	c := &Client{cfg: cfg, node: node, rs: replySlot(cfg.MaxResult)}
	reg, err := node.Register(cfg.ReplyRegion, ng*cfg.ClientSlots*c.rs+ng*8)
	if err != nil {
		return nil, fmt.Errorf("multicast: client %d: register reply region: %w", cfg.Slot, err)
	}
	c.reg = reg
	c.addr = Addr{Node: node.ID(), Region: cfg.ReplyRegion}
	for g, ms := range cfg.Members {
		c.base = append(c.base, regions.Multicast(tree.Group(g)))
		var ps []*peer
		for _, id := range ms {
			if err := reg.Grant(id, rdma.PermWrite); err != nil {
				reg.Close()
				return nil, fmt.Errorf("multicast: client %d: grant %d: %w", cfg.Slot, id, err)
			}
			ps = append(ps, newPeer(node, id, max(64<<10, 4*cfg.SlotSize), cfg.ReconnectMin, cfg.ReconnectMax))
		}
		c.peers = append(c.peers, ps)
		c.leader = append(c.leader, -1)
		c.linkBase = append(c.linkBase, make([]uint64, len(ms)))
		c.busy = append(c.busy, make([]uint64, cfg.ClientSlots))
		c.rbusy = append(c.rbusy, make([]uint64, cfg.ClientSlots))
	}
	c.pos = make([]uint64, ng)
	c.calls = make([]call, ng*cfg.ClientSlots)
	for i := len(c.calls) - 1; i >= 0; i-- {
		c.free = append(c.free, i)
	}
	c.rbuf = make([]byte, c.rs)
	c.helloWait = cfg.RetryAfter
	c.rt.init(node)
	return c, nil
}

// Ready reports whether every group registered this incarnation.
func (c *Client) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.isReady()
}

func (c *Client) isReady() bool { return c.ready == c.cfg.Tree.All() }

// Outstanding is the number of messages waiting for replies.
func (c *Client) Outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out
}

// Window is the number of messages the client may have outstanding to
// each group.
func (c *Client) Window() int { return c.cfg.ClientSlots }

// NextID is the id the next successful Multicast to dst gives its message
// (an application may embed it in the payload).
func (c *Client) NextID(dst tree.Set) MsgID {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq, _ := c.nextSeq(dst)
	return MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: seq}
}

// nextSeq is the lowest sequence number above the last used whose reply
// slot is free in every group of dst; false if none is (the window of a
// group of dst is full).
func (c *Client) nextSeq(dst tree.Set) (uint64, bool) {
	w := uint64(c.cfg.ClientSlots)
	for seq := c.seq + 1; seq <= c.seq+w; seq++ {
		free := true
		for s := dst; !s.Empty(); {
			g, _ := s.Min()
			s = s.Remove(g)
			if int(g) < len(c.rbusy) && c.rbusy[g][seq%w] != 0 {
				free = false
				break
			}
		}
		if free {
			return seq, true
		}
	}
	return c.seq + 1, false
}

// Slot is the client's slot.
func (c *Client) Slot() uint32 { return c.cfg.Slot }

// Close releases the reply region and the Conns; a started client's
// calls under way return ErrClosed.
func (c *Client) Close() error {
	c.stopKeeper()
	c.mu.Lock()
	if c.rt.closed {
		c.mu.Unlock()
		return nil
	}
	c.closeCalls()
	for _, ps := range c.peers {
		for _, p := range ps {
			p.close()
		}
	}
	err := c.reg.Close()
	c.unlock() // the hooks of the calls closeCalls ended
	return err
}

// Multicast writes payload to dst's lca (TRAM Alg. 1) and returns the
// message's id; its Outcome arrives through OnDone. payload is copied.
func (c *Client) Multicast(dst tree.Set, payload []byte) (MsgID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(payload) > maxPayload(c.cfg.SlotSize) {
		return MsgID{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), maxPayload(c.cfg.SlotSize))
	}
	k, err := c.admit(dst)
	if err != nil {
		return MsgID{}, err
	}
	if cap(k.own) < c.cfg.SlotSize {
		k.own = make([]byte, c.cfg.SlotSize)
	}
	rec := record{pos: k.pos, id: MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: k.seq}, dst: k.dst, reply: c.addr, payload: payload}
	k.rec = encodeRecord(k.own[:c.cfg.SlotSize], &rec)
	c.send(k)
	return MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: k.seq}, nil
}

// admit gives a message to dst its sequence number, its lca's ring slot,
// its reply slots and a call (mu held); the caller sets k.rec and sends.
func (c *Client) admit(dst tree.Set) (*call, error) {
	lca, err := c.cfg.Tree.LCA(dst)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDestination, err)
	}
	if need := dst.Add(lca); need&^c.ready != 0 {
		return nil, fmt.Errorf("%w: groups %v have not registered it", ErrNotReady, need&^c.ready)
	}
	w := uint64(c.cfg.ClientSlots)
	seq, ok := c.nextSeq(dst)
	pos := c.pos[lca] + 1
	if !ok || c.busy[lca][pos%w] != 0 || len(c.free) == 0 {
		return nil, ErrWindowFull
	}
	c.seq, c.pos[lca] = seq, pos
	c.busy[lca][pos%w] = seq
	for s := dst; !s.Empty(); {
		g, _ := s.Min()
		s = s.Remove(g)
		c.rbusy[g][seq%w] = seq
	}
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.act = append(c.act, i)
	k := &c.calls[i]
	*k = call{seq: seq, dst: dst, lca: lca, pos: pos, ring: true, own: k.own, esum: c.epochSum(lca),
		sent: c.now, retryAt: c.now + c.cfg.RetryAfter, wait: c.cfg.RetryAfter, replies: k.replies[:0], rbuf: k.rbuf[:0], rends: k.rends[:0]}
	c.out++
	return k, nil
}

// send writes k's record into its ring slot on every replica of its lca.
func (c *Client) send(k *call) {
	w := c.cfg.ClientSlots
	off := uint64((int(c.cfg.Slot)*w + int(k.pos%uint64(w))) * c.cfg.SlotSize)
	li := c.leader[k.lca]
	for i, p := range c.peers[k.lca] {
		p.write(c.now, c.base[k.lca]+regRings, off, k.rec, li < 0 || i == li)
	}
}

// noteLeader records which member of g wrote a reply with flags (mu
// held).
func (c *Client) noteLeader(g tree.Group, flags uint32) {
	id, ok := replyWriter(flags)
	if !ok || c.leader[g] >= 0 && uint32(c.peers[g][c.leader[g]].id)&0xffffff == id {
		return
	}
	c.leader[g] = -1
	for i, p := range c.peers[g] {
		if uint32(p.id)&0xffffff == id {
			c.leader[g] = i
			return
		}
	}
}

// hello writes our header (reply address, then incarnation, then a new
// retry count) to every replica of the groups not yet registered.
func (c *Client) hello(groups tree.Set) {
	c.retry++ // a group that registered us already writes its hello again
	var b [8]byte
	off := uint64(int(c.cfg.Slot) * clientHdrSize)
	for g, ps := range c.peers {
		if !groups.Has(tree.Group(g)) {
			continue
		}
		for _, p := range ps {
			putU64(b[:], c.addr.word())
			p.write(c.now, c.base[g]+regClients, off+hAddr, b[:], false)
			putU64(b[:], c.cfg.Inc)
			p.write(c.now, c.base[g]+regClients, off+hInc, b[:], false)
			putU64(b[:], c.retry)
			p.write(c.now, c.base[g]+regClients, off+hRetry, b[:], true)
		}
	}
}

// askAgain bumps the retry word at every replica of groups: their leader
// writes our replies (and hello) again.
func (c *Client) askAgain(groups tree.Set) {
	c.retry++
	var b [8]byte
	putU64(b[:], c.retry)
	off := uint64(int(c.cfg.Slot)*clientHdrSize + hRetry)
	for g, ps := range c.peers {
		if groups.Has(tree.Group(g)) {
			for _, p := range ps {
				p.write(c.now, c.base[g]+regClients, off, b[:], true)
			}
		}
	}
}

// NextDeadline is when Poll next has timed work.
func (c *Client) NextDeadline() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nextDeadline()
}

func (c *Client) nextDeadline() time.Duration {
	d := c.now + time.Second
	if !c.isReady() || c.stale != 0 {
		d = min(d, c.helloAt)
	}
	for _, i := range c.act {
		d = min(d, c.calls[i].retryAt)
	}
	return d
}

// Poll reads replies from the client's own memory, completes messages,
// and retries what timed out. It reports whether anything progressed.
func (c *Client) Poll(now time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.poll(now)
}

func (c *Client) poll(now time.Duration) bool {
	c.now = now
	progress := false
	for _, ps := range c.peers {
		for _, p := range ps {
			if p.poll(now) {
				progress = true
			}
		}
	}
	mem := c.reg.Bytes()
	ng := c.cfg.Tree.Len()
	w := c.cfg.ClientSlots
	if !c.isReady() || c.stale != 0 {
		helloOff := ng * w * c.rs
		for g := range ng {
			if (!c.ready.Has(tree.Group(g)) || c.stale.Has(tree.Group(g))) && rdma.Load64(mem, helloOff+g*8) == c.cfg.Inc {
				c.ready = c.ready.Add(tree.Group(g))
				c.stale = c.stale.Remove(tree.Group(g))
				c.answered(tree.Group(g))
				progress = true
			}
		}
		if missing := c.cfg.Tree.All()&^c.ready | c.stale; missing != 0 && now >= c.helloAt {
			c.hello(missing)
			c.helloAt = now + c.helloWait
			c.helloWait = min(2*c.helloWait, 20*c.cfg.RetryAfter)
		}
	}
	for j := 0; j < len(c.act); j++ {
		k := &c.calls[c.act[j]]
		for missing := k.dst &^ k.got; !missing.Empty(); {
			g, _ := missing.Min()
			missing = missing.Remove(g)
			off := (int(g)*w + int(k.seq%uint64(w))) * c.rs
			if rdma.Load64(mem, off) != k.seq {
				continue
			}
			copy(c.rbuf, mem[off:off+c.rs])
			rp, ok := decodeReply(c.rbuf, g, c.cfg.Inc, k.seq)
			if !ok {
				continue
			}
			if rp.flags&replyDiskFull != 0 {
				// Not a reply: the lca cannot log the message now. A
				// started call ends (the message stays, abandoned,
				// until the lca orders it); a polled one waits.
				if u := k.user; u != nil && g == k.lca && !k.gone {
					c.full = c.full.Add(g)
					c.abandon(k)
					u.finish(nil, &DiskFullError{Group: g, Sent: true})
					progress = true
				}
				continue
			}
			c.full = c.full.Remove(g)
			k.got = k.got.Add(g)
			c.noteLeader(g, rp.flags)
			if g == k.lca && k.esum == c.epochSum(g) {
				// g took the message from its ring in the processes it
				// was written to: it follows our ring positions
				c.answered(g)
			}
			c.freeReply(g, k.seq)
			if k.ring {
				c.ordered(k)
			}
			// the result bytes go to the call's buffer (Result is set in
			// complete: the buffer may grow until then), nothing allocated
			// once the buffers reached their size
			k.rends = append(k.rends, len(k.rbuf)+len(rp.result))
			k.rbuf = append(k.rbuf, rp.result...)
			k.replies = append(k.replies, Reply{Group: g, Index: rp.index, Truncated: rp.flags&replyTruncated != 0})
			progress = true
		}
		if k.got == k.dst || k.gone && !k.ring {
			// complete may not touch act: the slot leaves it here
			i := c.act[j]
			c.act[j] = c.act[len(c.act)-1]
			c.act = c.act[:len(c.act)-1]
			j--
			c.complete(k)
			c.free = append(c.free, i)
			progress = true
			continue
		}
		if now >= k.retryAt {
			c.leader[k.lca] = -1 // ring every member: the leader may have changed
			if k.ring {
				// (once a reply showed the lca ordered it, its ring slot
				// may hold a later message: only the replies are asked for)
				c.send(k)
			}
			c.askAgain(k.dst &^ k.got)
			k.retries++
			k.wait = min(2*k.wait, 20*c.cfg.RetryAfter)
			k.retryAt = now + k.wait
			progress = true
		}
	}
	// (after the replies: a group that answered did not restart whole)
	if c.watchRestarts && c.restarted() {
		progress = true
	}
	return progress
}

// freeReply frees group g's reply slot of message seq.
func (c *Client) freeReply(g tree.Group, seq uint64) {
	w := uint64(c.cfg.ClientSlots)
	if c.rbusy[g][seq%w] == seq {
		c.rbusy[g][seq%w] = 0
	}
}

// freeRing frees k's slot in its lca's ring.
func (c *Client) freeRing(k *call) {
	if k.ring {
		k.ring = false
		c.busy[k.lca][k.pos%uint64(c.cfg.ClientSlots)] = 0
	}
}

// ordered frees the ring slots of k and of every earlier message of its
// lca's ring: k has a reply, so the lca committed it, and a group consumes
// its client rings strictly in position order. (An abandoned message whose
// replies were lost, its reply slots taken by later messages, thus leaves
// once a later message of the same lca has a reply.)
func (c *Client) ordered(k *call) {
	for _, i := range c.act {
		if o := &c.calls[i]; o.ring && o.lca == k.lca && o.pos <= k.pos {
			c.freeRing(o)
		}
	}
}

// Abandon says that nobody waits for message id's outcome any more (its
// caller gave up): it no longer holds reply slots of the groups that have
// not answered, so that a group that does not answer (a dead lca, which
// never forwards it) holds back only its own messages. It stays only
// while it holds its lca's ring slot (until a reply shows the lca
// committed it; if the lca is a destination, its reply slot there stays
// reserved for that reply), and then leaves without OnDone. A later
// message may take a freed reply slot: it has a higher seq, so the
// replicas' exactly-once table keeps its reply and drops the abandoned
// one's, and the message is still delivered once.
func (c *Client) Abandon(id MsgID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id.Client != c.cfg.Slot || id.Inc != c.cfg.Inc {
		return
	}
	for _, i := range c.act {
		k := &c.calls[i]
		if k.seq != id.Seq || k.gone {
			continue
		}
		c.abandon(k)
		return
	}
}

// abandon marks k abandoned (mu held).
func (c *Client) abandon(k *call) {
	k.gone = true
	if k.user != nil {
		// the Call goes back to its pool: a retry posts a copy
		if cap(k.own) < len(k.rec) {
			k.own = make([]byte, c.cfg.SlotSize)
		}
		k.rec = append(k.own[:0], k.rec...)
		k.user = nil
	}
	for s := k.dst &^ k.got; !s.Empty(); {
		g, _ := s.Min()
		s = s.Remove(g)
		if g != k.lca || !k.ring {
			c.freeReply(g, k.seq)
		}
	}
}

// complete ends k: OnDone with its outcome unless it was abandoned.
func (c *Client) complete(k *call) {
	c.freeRing(k)
	for s := k.dst; !s.Empty(); {
		g, _ := s.Min()
		s = s.Remove(g)
		c.freeReply(g, k.seq)
	}
	if k.gone {
		k.seq = 0
		k.rec = nil
		c.out--
		return
	}
	start := 0
	for i := range k.replies {
		k.replies[i].Result = k.rbuf[start:k.rends[i]:k.rends[i]]
		start = k.rends[i]
	}
	sortReplies(k.replies)
	c.oc = Outcome{ID: MsgID{Client: c.cfg.Slot, Inc: c.cfg.Inc, Seq: k.seq}, Dst: k.dst, Replies: k.replies, Sent: k.sent, Retries: k.retries}
	k.seq = 0
	k.rec = nil
	c.out--
	if c.cfg.OnDone != nil {
		c.cfg.OnDone(&c.oc)
	}
	if u := k.user; u != nil {
		k.user = nil
		u.finish(&c.oc, nil)
	}
}

func sortReplies(rs []Reply) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].Group < rs[j-1].Group; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

// failures counts the failures of the client's Conns.
func (c *Client) failures() uint64 {
	n := uint64(0)
	for _, ps := range c.peers {
		for _, p := range ps {
			n += p.fails
		}
	}
	return n
}

// peerErrList appends each failed Conn's last failure to out.
func (c *Client) peerErrList(out []PeerError) []PeerError {
	for g, ps := range c.peers {
		for _, p := range ps {
			if p.err != nil {
				out = append(out, PeerError{Group: tree.Group(g), Node: p.id, Err: p.err})
			}
		}
	}
	return out
}

// peerErrors describes the last failure of each Conn that failed, for an
// error message (a replica that refuses the client's node because the
// cluster does not list it in ClientNodes shows as a permission error).
func (c *Client) peerErrors() string {
	var b strings.Builder
	for g, ps := range c.peers {
		for _, p := range ps {
			if p.err != nil {
				fmt.Fprintf(&b, "group %d replica %d: %v; ", g, p.id, p.err)
			}
		}
	}
	if b.Len() == 0 {
		return "no Conn failed (are the groups up and electing?)"
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// epochSum is the sum of the connection epochs of the links to group g's
// members: it changes whenever one of them connects again.
func (c *Client) epochSum(g tree.Group) uint64 {
	n := uint64(0)
	for _, p := range c.peers[g] {
		n += p.link.Conn()
	}
	return n
}

// answered notes that group g answered (its hello, or the reply to a
// message it took from its ring in the processes the message was written
// to) with its members' links at their present connection epochs (mu
// held). A reply written again by a new process, for a message an older
// one took, does not count: the group may have lost ring positions since.
func (c *Client) answered(g tree.Group) {
	for i, p := range c.peers[g] {
		c.linkBase[g][i] = p.link.Conn()
	}
}

// restarted looks for a group every replica of which was replaced since
// it last answered (answered): each member's link connected again (a
// replica's process that dies fails the link; its successor's node is a
// new connection). Such a group may have recovered without what its memory
// held: the messages in its rings, and (durability async) even entries it
// had ordered and answered, so that it waits in a client's ring for a
// position the client will never write again. The client then takes a
// new incarnation (mu held): every call under way (to any group: they all
// carry the old one) ends with ErrRestarted, its ring positions and reply
// slots are freed, and the hello of the new incarnation goes to every
// group (a group orders its reset entry, then takes the client's ring
// from position 1 again). Messages of the old incarnation a group has not
// taken are then ignored, never delivered; those it took are delivered
// once, their replies ignored. A group that lost no replica's memory at
// once (a majority kept running) never triggers it, nor does a rolling
// restart under load (the group answers in between).
func (c *Client) restarted() bool {
	var hit tree.Set
	for g, ps := range c.peers {
		if !c.ready.Has(tree.Group(g)) {
			continue
		}
		all := len(ps) > 0
		for i, p := range ps {
			if b := c.linkBase[g][i]; b == 0 || p.link.Conn() <= b {
				all = false
				break
			}
		}
		if all {
			hit = hit.Add(tree.Group(g))
		}
	}
	if hit == 0 {
		return false
	}
	c.restarts++
	c.cfg.Inc = max(c.cfg.Inc+1, uint64(time.Now().UnixNano()))
	for g, ps := range c.peers {
		for i, p := range ps {
			c.linkBase[g][i] = p.link.Conn()
		}
		c.pos[g] = 0
		c.full = c.full.Remove(tree.Group(g))
		clear(c.busy[g])
		clear(c.rbusy[g])
		c.leader[g] = -1
	}
	for _, i := range c.act {
		k := &c.calls[i]
		if u := k.user; u != nil {
			k.user = nil
			u.finish(nil, fmt.Errorf("%w (groups %v)", ErrRestarted, hit))
		}
		k.seq, k.rec, k.ring, k.gone = 0, nil, false, false
		c.free = append(c.free, i)
	}
	c.act = c.act[:0]
	c.out = 0
	c.stale = c.ready
	c.helloWait = c.cfg.RetryAfter
	c.hello(c.stale)
	c.helloAt = c.now + c.helloWait
	return true
}

// Restarts counts the incarnations a started client took because every
// replica of a group restarted.
func (c *Client) Restarts() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restarts
}
