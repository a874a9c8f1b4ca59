package multicast

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
)

// Config configures one TRAM replica: a member of one group. Zero fields
// take the documented defaults; the ring geometry (ClientSlots,
// ParentSlots, SlotSize, MaxResult) and the client list must be the same
// on every replica and client of the cluster.
type Config struct {
	// Group is this replica's group, a group of Tree.
	Group tree.Group
	// Tree is the overlay (static, known to clients and replicas).
	Tree *tree.Tree
	// Members lists every group's replicas, indexed by group id.
	Members [][]rdma.NodeID
	// ClientNodes names the node of each client slot (slot c is
	// ClientNodes[c]): replicas grant those nodes write access to the
	// client headers and rings. A node may hold several slots.
	ClientNodes []rdma.NodeID
	// ClientSlots is the size of each client's input ring, and the
	// number of messages a client may have outstanding. Default 8.
	ClientSlots int
	// ParentSlots is the size of the parent ring: how many forwarded
	// messages a parent may have written ahead of this group's commits.
	// Default 256.
	ParentSlots int
	// SlotSize is the byte size of one ring slot; a message's payload may
	// have up to SlotSize-56 bytes (MaxPayload). Default 1024.
	SlotSize int
	// MaxResult bounds the result bytes of a reply; a longer result is
	// truncated and flagged. Default 64.
	MaxResult int
	// RetransmitAfter is how long a leader waits for a child's credit to
	// move before it writes the uncredited messages again (a child
	// replica that restarted, a write lost with a broken Conn, a stale
	// write of a deposed leader: events of failures, which take an
	// election timeout to matter). Each retransmission that brings no
	// credit doubles the wait, up to 32 x RetransmitAfter, so that a child
	// that is only slow is not flooded with copies. Default the group's
	// election timeout (broadcast's default if unset).
	RetransmitAfter time.Duration
	// ClientRate bounds the messages per second this group's leader
	// takes from each client's input ring (0: no bound). A client over
	// its rate is not refused: its ring fills and its writes wait, the
	// back pressure every client already handles. Each message counts
	// once, however many operations it carries.
	ClientRate float64
	// ClientBurst is how many messages a client may send at once after
	// being idle (the token bucket's depth); default ClientSlots.
	ClientBurst int
	// MaxBatch bounds the messages the leader orders in one log entry:
	// every message one scan of the input rings finds goes into one
	// Acuerdo entry (a batch entry, also bounded by the group's largest
	// proposal), applied with one BatchFSM bracket. 1 orders each message
	// in an entry of its own. Default 64; at most 65535.
	MaxBatch int
	// Broadcast configures the group's Acuerdo replica; Members and
	// RegionBase are filled in (regions.Broadcast(Group)).
	Broadcast broadcast.Config
}

// Defaults.
const (
	DefaultClientSlots = 8
	DefaultParentSlots = 256
	DefaultSlotSize    = 1024
	DefaultMaxResult   = 64
	DefaultMaxBatch    = 64
)

// ErrConfig reports an invalid configuration.
var ErrConfig = errors.New("multicast: invalid configuration")

func (c Config) withDefaults() (Config, error) {
	if c.Tree == nil {
		return c, fmt.Errorf("%w: no tree", ErrConfig)
	}
	if !c.Tree.Contains(c.Group) {
		return c, fmt.Errorf("%w: group %d is not in the tree %v", ErrConfig, c.Group, c.Tree)
	}
	if len(c.Members) != c.Tree.Len() {
		return c, fmt.Errorf("%w: members of %d groups, the tree has %d", ErrConfig, len(c.Members), c.Tree.Len())
	}
	for g, m := range c.Members {
		if len(m) == 0 {
			return c, fmt.Errorf("%w: group %d has no members", ErrConfig, g)
		}
	}
	if c.ClientSlots == 0 {
		c.ClientSlots = DefaultClientSlots
	}
	if c.ParentSlots == 0 {
		c.ParentSlots = DefaultParentSlots
	}
	if c.SlotSize == 0 {
		c.SlotSize = DefaultSlotSize
	}
	if c.MaxResult == 0 {
		c.MaxResult = DefaultMaxResult
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	c.SlotSize = pad8(c.SlotSize)
	c.MaxResult = pad8(c.MaxResult)
	switch {
	case c.ClientSlots < 1 || c.ClientSlots > 1<<16:
		return c, fmt.Errorf("%w: ClientSlots %d not in [1, 65536]", ErrConfig, c.ClientSlots)
	case c.ParentSlots < 4:
		return c, fmt.Errorf("%w: ParentSlots %d below 4", ErrConfig, c.ParentSlots)
	case c.SlotSize < recHdr+recCheck+8:
		return c, fmt.Errorf("%w: SlotSize %d below %d", ErrConfig, c.SlotSize, recHdr+recCheck+8)
	case c.MaxResult < 0 || c.MaxResult > 1<<20:
		return c, fmt.Errorf("%w: MaxResult %d", ErrConfig, c.MaxResult)
	case c.MaxBatch < 1 || c.MaxBatch > 1<<16-1:
		return c, fmt.Errorf("%w: MaxBatch %d not in [1, 65535]", ErrConfig, c.MaxBatch)
	case c.ClientRate < 0 || c.ClientBurst < 0:
		return c, fmt.Errorf("%w: ClientRate %v, ClientBurst %d", ErrConfig, c.ClientRate, c.ClientBurst)
	}
	if c.ClientBurst == 0 {
		c.ClientBurst = c.ClientSlots
	}
	b := c.Broadcast
	b.Members = c.Members[c.Group]
	if b.RegionBase == 0 {
		b.RegionBase = regions.Broadcast(c.Group)
	}
	if b.HeartbeatInterval == 0 {
		b.HeartbeatInterval = broadcast.DefaultHeartbeatInterval
	}
	c.Broadcast = b
	if c.RetransmitAfter == 0 {
		c.RetransmitAfter = cmp.Or(b.ElectionTimeout, broadcast.DefaultElectionTimeout)
	}
	return c, nil
}

// MaxPayload is the largest payload a message may have with slots of
// slotSize bytes.
func MaxPayload(slotSize int) int { return maxPayload(pad8(slotSize)) }

// Replica is one member of a group running TRAM (Alg. 2) on top of the
// group's Acuerdo replica: as leader of a committed epoch it scans its
// input rings, orders messages with broadcast.Replica.Append, and once
// they commit forwards them to its children, writes replies to clients
// and credits to its parent; every replica applies the log (state).
//
// Poll, like broadcast's, is the whole protocol; call it from one
// goroutine (a poller.Group's poller runs several groups' replicas in its
// passes).
type Replica struct {
	cfg  Config
	g    tree.Group
	node rdma.Node
	self rdma.NodeID // node's id, which signs our replies
	b    *broadcast.Replica
	st   *state
	base rdma.RegionID
	regs [numRegions]rdma.Region
	now  time.Duration
	nsrc int // client slots + 1 (the parent ring is source nsrc-1)
	// Per-client token buckets (Config.ClientRate): tokens as of tokAt,
	// and when the earliest throttled client has a token again.
	tokens   []float64
	tokAt    []time.Duration
	tokReady time.Duration
	hbeat    time.Duration

	parent     tree.Group
	hasParent  bool
	childOfPar int // our index among our parent's children

	// leader-local (not replicated): TRAM Alg. 2's private variables.
	lead     broadcast.Epoch // the epoch we lead and have set up (0: none)
	tinc     []uint64        // tentative registered incarnation per client
	tpos     []uint64        // tentative in[] per client
	tppos    uint64          // tentative in[] of the parent ring
	tout     []uint64        // tentative out[] per child
	fwdSent  []uint64        // per child: forwarded up to this position
	credit   []uint64        // per child: highest credit seen
	creditAt []time.Duration // per child: when its credit last moved (or we last wrote to it)
	rtWait   []time.Duration // per child: the wait before the next retransmission (backoff)
	rtCount  []uint64        // per child: retransmissions (Counters.Retransmits by child; the simulator checks them)
	skipQ    []uint64        // per child: the position the skipCatchUp knob's catch-up leaves out
	rr       int             // round-robin start of the next scan (an index into srcs)
	// srcs: the sources scan visits, in order: every client slot with a
	// registered incarnation (tinc != 0) and the parent ring (nsrc-1) if
	// the group has a parent. A slot no incarnation registered has no ring
	// a leader may take from (take refuses it), so leaving it out changes
	// nothing but the cost of a scan. Rebuilt whenever tinc changes
	// (setSources).
	srcs []int
	// hdrAt: when the client headers are next looked at (scanHeaders):
	// at once when we start leading, then every heartbeat interval, and at
	// once again after a registration the log had no room for.
	hdrAt       time.Duration
	headerScans uint64 // scanHeaders runs (tests)
	retrySeen   []uint64
	creditOut   uint64 // the credit last sent to our parent
	creditAtT   time.Duration
	replyQ      []int    // reply slots to write
	helloQ      []uint32 // clients to say hello to
	resyncAt    time.Duration

	children [][]*peer // per child, per member
	parents  []*peer
	clients  map[rdma.NodeID]*peer
	peers    []*peer // every peer above, once (ClientNodes order for the clients)
	// busy: the peers written to whose links may have completions to
	// reap (peer.busy); pollPeers reaps only these
	busy []*peer

	entry []byte // scratch
	rec   []byte // scratch
	rbuf  []byte // scratch reply
	fwdv  []uint64

	// disk-full notices (noticeFull): per client slot, the incarnation
	// and ring position up to which its messages were told; nbuf copies
	// a record
	noticeInc, noticed []uint64
	nbuf               []byte

	// The batch one scan builds (scan, take, fillBatch): the messages,
	// their child positions (bfwd), their records copied out of the rings
	// (bbuf, MaxBatch slots), and the entry's size so far.
	batch  []pending
	bfwd   []uint64
	bbuf   []byte
	bused  int
	bsize  int
	fillFn func([]byte) // fillBatch, made once (AppendFunc's fill)

	ctr Counters

	knobs testingKnobs // planted bugs, tests only (knobs.go)
}

// Counters are a replica's cumulative counts.
type Counters struct {
	Ordered     uint64 // messages this replica ordered as leader
	Batches     uint64 // log entries those messages were ordered in
	Forwarded   uint64 // forward writes (per child replica)
	Retransmits uint64 // times a child's uncredited messages were written again
	Replies     uint64 // reply writes
	Resets      uint64 // client registrations ordered
	Blocked     uint64 // scans stopped by a full child ring
	Dropped     uint64 // writes dropped (Conn down or stage full), to be repeated
	Malformed   uint64 // client records refused (bad destinations or size)
	FullNotices uint64 // disk-full notices written to clients (the leader could not log their messages)
}

// New creates the replica of cfg.Group on node, with the application's
// FSM app (it sees the messages destined to this group, in order) and the
// Acuerdo replica's stable store.
func New(cfg Config, node rdma.Node, app broadcast.FSM, stable broadcast.Stable) (*Replica, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Replica{cfg: cfg, g: cfg.Group, node: node, self: node.ID(), base: regions.Multicast(cfg.Group), hbeat: cfg.Broadcast.HeartbeatInterval}
	r.st = newState(&cfg, app, &r.knobs)
	r.st.onReply = func(_ uint32, slot int) { r.replyQ = append(r.replyQ, slot) }
	r.st.onHello = func(c uint32) { r.helloQ = append(r.helloQ, c) }
	nc := len(cfg.ClientNodes)
	r.nsrc = nc + 1
	r.tinc, r.tpos, r.retrySeen = make([]uint64, nc), make([]uint64, nc), make([]uint64, nc)
	if cfg.ClientRate > 0 {
		r.tokens, r.tokAt = make([]float64, nc), make([]time.Duration, nc)
		for c := range r.tokens {
			r.tokens[c] = float64(cfg.ClientBurst)
		}
	}
	kids := cfg.Tree.Children(cfg.Group)
	r.tout, r.fwdSent, r.credit, r.creditAt = make([]uint64, len(kids)), make([]uint64, len(kids)), make([]uint64, len(kids)), make([]time.Duration, len(kids))
	r.rtWait, r.rtCount, r.skipQ = make([]time.Duration, len(kids)), make([]uint64, len(kids)), make([]uint64, len(kids))
	r.parent, r.hasParent = cfg.Tree.Parent(cfg.Group)
	if r.hasParent {
		for i, c := range cfg.Tree.Children(r.parent) {
			if c == r.g {
				r.childOfPar = i
			}
		}
	}
	r.rec = make([]byte, cfg.SlotSize)
	r.batch = make([]pending, 0, cfg.MaxBatch)
	r.bfwd = make([]uint64, 0, cfg.MaxBatch*len(kids))
	r.fillFn = r.fillBatch
	r.rbuf = make([]byte, replySlot(cfg.MaxResult))
	r.nbuf = make([]byte, cfg.SlotSize)
	r.noticeInc, r.noticed = make([]uint64, nc), make([]uint64, nc)
	if err := r.register(kids); err != nil {
		r.closeRegions()
		return nil, err
	}
	minB, maxB := cfg.Broadcast.ReconnectMin, cfg.Broadcast.ReconnectMax
	if minB == 0 {
		minB = broadcast.DefaultReconnectMin
	}
	if maxB == 0 {
		maxB = broadcast.DefaultReconnectMax
	}
	stage := max(64<<10, 4*cfg.SlotSize)
	for _, c := range kids {
		var ps []*peer
		for _, id := range cfg.Members[c] {
			ps = append(ps, newPeer(node, id, max(stage, cfg.ParentSlots*cfg.SlotSize/2), minB, maxB))
		}
		r.children = append(r.children, ps)
	}
	if r.hasParent {
		for _, id := range cfg.Members[r.parent] {
			r.parents = append(r.parents, newPeer(node, id, 4096, minB, maxB))
		}
	}
	r.clients = map[rdma.NodeID]*peer{}
	for _, id := range cfg.ClientNodes {
		if r.clients[id] == nil {
			r.clients[id] = newPeer(node, id, max(16<<10, 4*replySlot(cfg.MaxResult)*cfg.ClientSlots), minB, maxB)
		}
	}
	r.peers = r.allPeers()
	for _, p := range r.peers {
		p.busy = &r.busy
	}
	b, err := broadcast.New(cfg.Broadcast, node, r.st, stable)
	if err != nil {
		r.closeRegions()
		return nil, err
	}
	r.b = b
	// An entry holds a whole slot's record plus its header and one
	// position per child: it must fit one Acuerdo proposal.
	if need := entryHdr + 8*len(kids) + cfg.SlotSize; need > b.MaxProposal() {
		r.Close()
		return nil, fmt.Errorf("%w: SlotSize %d needs entries of %d bytes, the group's largest proposal is %d (raise Broadcast.MaxRecord or RingSize)", ErrConfig, cfg.SlotSize, need, b.MaxProposal())
	}
	// A batch's records, copied out of the rings: at most MaxBatch, and
	// (each smaller than its sub-entry) at most a proposal's worth plus
	// the slot being looked at.
	r.bbuf = make([]byte, min(cfg.MaxBatch*cfg.SlotSize, b.MaxProposal()+cfg.SlotSize))
	return r, nil
}

func (r *Replica) register(kids []tree.Group) error {
	cfg := &r.cfg
	nc := len(cfg.ClientNodes)
	sizes := [numRegions]int{
		regClients: max(8, nc*clientHdrSize),
		regRings:   max(8, nc*cfg.ClientSlots*cfg.SlotSize),
		regParent:  cfg.ParentSlots * cfg.SlotSize,
		regCredits: max(8, len(kids)*8),
	}
	for k, size := range sizes {
		reg, err := r.node.Register(r.base+rdma.RegionID(k), size)
		if err != nil {
			return fmt.Errorf("multicast: group %d: register region %d: %w", r.g, k, err)
		}
		r.regs[k] = reg
	}
	grant := func(k int, ids []rdma.NodeID) error {
		for _, id := range ids { // also this node: several groups may share a node, and write to each other
			if err := r.regs[k].Grant(id, rdma.PermWrite); err != nil {
				return fmt.Errorf("multicast: group %d: grant %d: %w", r.g, id, err)
			}
		}
		return nil
	}
	if err := grant(regClients, cfg.ClientNodes); err != nil {
		return err
	}
	if err := grant(regRings, cfg.ClientNodes); err != nil {
		return err
	}
	if p, ok := cfg.Tree.Parent(r.g); ok {
		if err := grant(regParent, cfg.Members[p]); err != nil {
			return err
		}
	}
	for _, c := range kids {
		if err := grant(regCredits, cfg.Members[c]); err != nil {
			return err
		}
	}
	return nil
}

func (r *Replica) closeRegions() {
	for _, reg := range r.regs {
		if reg != nil {
			reg.Close()
		}
	}
}

// Close closes the replica: its Acuerdo replica, its regions and Conns.
func (r *Replica) Close() error {
	var err error
	if r.b != nil {
		err = r.b.Close()
	}
	for _, ps := range r.children {
		for _, p := range ps {
			p.close()
		}
	}
	for _, p := range r.parents {
		p.close()
	}
	for _, p := range r.clients {
		p.close()
	}
	r.closeRegions()
	return err
}

// Broadcast is the group's Acuerdo replica (status, counters).
func (r *Replica) Broadcast() *broadcast.Replica { return r.b }

// Group is the replica's group.
func (r *Replica) Group() tree.Group { return r.g }

// Counters returns the replica's counters; call from the polling goroutine.
func (r *Replica) Counters() Counters {
	c := r.ctr
	for _, p := range r.allPeers() {
		c.Dropped += p.dropped
	}
	return c
}

// Delivered is the number of messages delivered in this group at this
// replica; call from the polling goroutine.
func (r *Replica) Delivered() uint64 { return r.st.delivered }

// Anomalies returns counts that a correct run keeps at zero: duplicate
// entries dropped on apply, gaps in positions, and entries of an
// unregistered client incarnation. Call from the polling goroutine.
func (r *Replica) Anomalies() (dups, gaps, stale uint64) { return r.st.dups, r.st.gaps, r.st.stale }

func (r *Replica) allPeers() []*peer {
	var ps []*peer
	for _, c := range r.children {
		ps = append(ps, c...)
	}
	ps = append(ps, r.parents...)
	for _, id := range r.cfg.ClientNodes {
		ps = append(ps, r.clients[id])
	}
	return ps
}

// HeartbeatInterval is its Acuerdo replica's (broadcast.Heartbeater).
func (r *Replica) HeartbeatInterval() time.Duration { return r.b.HeartbeatInterval() }

// NextDeadline is when Poll next has timed work (the Acuerdo replica's
// timers, and this layer's periodic credit, retransmission and header
// scans while leading).
func (r *Replica) NextDeadline() time.Duration {
	d := r.b.NextDeadline()
	if r.lead != 0 {
		d = min(d, r.now+r.hbeat)
		if r.hdrAt > r.now {
			// (a header scan already due, after a registration the log
			// had no room for, waits for the next Poll as it did: a full
			// log must not make the leader due at once and spin)
			d = min(d, r.hdrAt)
		}
		if r.tokReady > r.now {
			d = min(d, r.tokReady)
		}
		if r.knobs.spinDeadline {
			d = r.now
		}
	}
	return d
}

// Poll runs one step: the Acuerdo replica's (which applies committed
// entries), then, at the leader of a committed epoch, TRAM's leader
// steps. It reports whether anything progressed.
func (r *Replica) Poll(now time.Duration) bool {
	r.now = now
	progress := false
	// Scan before Acuerdo's step, so that what we append goes out to the
	// followers in this Poll, not the next.
	if e, ok := r.b.Leading(); ok && e == r.lead {
		if r.now >= r.hdrAt && r.scanHeaders() {
			progress = true
		}
		if r.scan() {
			progress = true
		}
		if r.b.RefusingFull() && r.noticeFull() {
			progress = true
		}
	}
	if r.b.Poll(now) {
		progress = true
	}
	e, leading := r.b.Leading()
	if !leading {
		r.lead = 0
		r.replyQ, r.helloQ = r.replyQ[:0], r.helloQ[:0] // a new leader sends them all
		return r.pollPeers() || progress
	}
	if e != r.lead {
		r.becomeLeader(e)
		progress = true
	}
	if r.pollPeers() {
		progress = true
	}
	if r.readCredits() {
		progress = true
	}
	if r.forward() {
		progress = true
	}
	if r.sendReplies() {
		progress = true
	}
	r.sendCredit(false)
	return progress
}

// pollPeers reaps the completions of every peer written to since its
// link was last idle (r.busy), and drops the peers that are idle now: a
// link with nothing in flight or queued has nothing to reap (its Reap
// returns at once and changes no counter), so the cost of a pass follows
// the peers written to, not the configured client slots.
func (r *Replica) pollPeers() bool {
	progress := false
	keep := r.busy[:0]
	for _, p := range r.busy {
		if p.poll(r.now) {
			progress = true
		}
		if p.link.Idle() || r.knobs.dropBusy {
			p.listed = false
		} else {
			keep = append(keep, p)
		}
	}
	clear(r.busy[len(keep):])
	r.busy = keep
	return progress
}

// checkBusy is the rule pollPeers keeps (the simulator checks it after
// every step): a peer whose link is not idle is in the reap list.
func (r *Replica) checkBusy() error {
	for _, p := range r.peers {
		if !p.link.Idle() && !p.listed {
			return fmt.Errorf("reap list: group %d node %d: the link to node %d has writes in flight or queued and is not in the reap list", r.g, r.self, p.id)
		}
	}
	return nil
}

// becomeLeader sets up the leader's private variables once its epoch's
// diff committed (TRAM Alg. 5, tree catch-up): input and output pointers
// from the applied log (step 1), everything not known to be in the
// children written again to the same positions (steps 2-3), and every
// remembered reply and registration sent again (the old leader may have
// died before sending them).
func (r *Replica) becomeLeader(e broadcast.Epoch) {
	r.lead = e
	copy(r.tinc, r.st.cinc)
	copy(r.tpos, r.st.cpos)
	r.setSources()
	r.hdrAt = 0 // look at the headers in the next Poll
	r.tppos = r.st.ppos
	copy(r.tout, r.st.out)
	for i := range r.fwdSent {
		r.fwdSent[i] = r.resendFrom(i)
		if r.knobs.noCatchUp {
			r.fwdSent[i] = r.st.out[i]
		}
		if r.knobs.skipCatchUp && r.fwdSent[i] < r.st.out[i] {
			r.skipQ[i] = r.st.out[i]
		}
		r.creditAt[i] = r.now
	}
	r.replyQ = r.replyQ[:0]
	for i := range r.st.replies {
		if r.st.replies[i].seq != 0 {
			r.replyQ = append(r.replyQ, i)
		}
	}
	r.helloQ = r.helloQ[:0]
	for c := range r.st.cinc {
		if r.st.cinc[c] != 0 {
			r.helloQ = append(r.helloQ, uint32(c))
		}
	}
	r.creditOut = 0
	r.sendCredit(true)
}

// resendFrom is the position after which child i's messages are written
// (again): the child's credit, or what the forward buffer still holds.
func (r *Replica) resendFrom(i int) uint64 {
	from := r.credit[i]
	if out := r.st.out[i]; out > uint64(r.cfg.ParentSlots) {
		from = max(from, out-uint64(r.cfg.ParentSlots))
	}
	return min(from, r.st.out[i])
}

// readCredits reads the children's credit words (written by their
// leaders into our memory) and schedules retransmission to a child whose
// credit has not moved for RetransmitAfter while messages are outstanding
// (doubling the wait after each retransmission that brought no credit).
func (r *Replica) readCredits() bool {
	mem := r.regs[regCredits].Bytes()
	progress := false
	for i := range r.credit {
		if r.rtWait[i] == 0 {
			r.rtWait[i] = r.cfg.RetransmitAfter
		}
		if v := rdma.Load64(mem, i*8); v > r.credit[i] && v <= r.st.out[i]+uint64(r.cfg.ParentSlots) {
			r.credit[i] = min(v, r.tout[i])
			r.creditAt[i] = r.now
			r.rtWait[i] = r.cfg.RetransmitAfter
			progress = true
		}
		if r.credit[i] < r.st.out[i] && r.now-r.creditAt[i] > r.rtWait[i] && r.fwdSent[i] >= r.st.out[i] && !r.knobs.noCatchUp {
			r.fwdSent[i] = r.resendFrom(i)
			r.creditAt[i] = r.now
			r.rtWait[i] = min(2*r.rtWait[i], 32*r.cfg.RetransmitAfter)
			r.ctr.Retransmits++
			r.rtCount[i]++
		}
	}
	return progress
}

// forward writes the committed messages assigned positions in each child
// that it has not written yet into the parent ring of every replica of
// the child (TRAM Alg. 2, "forwarding to children"), in position order.
func (r *Replica) forward() bool {
	progress := false
	for i, c := range r.st.children {
		if r.fwdSent[i] >= r.st.out[i] {
			continue
		}
		reg := regions.Multicast(c) + regParent
		if r.credit[i] >= r.fwdSent[i] {
			// the child had everything: its credit is not late from now,
			// but only RetransmitAfter after these writes
			r.creditAt[i] = r.now
		}
		for q := r.fwdSent[i] + 1; q <= r.st.out[i]; q++ {
			if q == r.skipQ[i] {
				r.skipQ[i] = 0 // knobs.skipCatchUp
				continue
			}
			slot := r.st.fwdSlot(i, q)
			rec := slot[:recordSize(int(leU32(slot[28:])))]
			off := uint64(int(q%uint64(r.cfg.ParentSlots)) * r.cfg.SlotSize)
			last := q == r.st.out[i]
			for _, p := range r.children[i] {
				if p.write(r.now, reg, off, rec, last) {
					r.ctr.Forwarded++
				}
			}
		}
		r.fwdSent[i] = r.st.out[i]
		progress = true
	}
	return progress
}

// sendReplies writes the queued replies into their clients' reply
// regions (the reply path: one write per destination group's leader).
// What one Poll produced for one client node goes out as one list of
// writes with one doorbell ring (peer.queue, peer.flush): the client reads
// all its reply slots when woken, and the Conn lands them in order.
func (r *Replica) sendReplies() bool {
	if len(r.replyQ) == 0 && len(r.helloQ) == 0 {
		return false
	}
	w := r.cfg.ClientSlots
	rs := replySlot(r.cfg.MaxResult)
	for _, slot := range r.replyQ {
		rec := &r.st.replies[slot]
		p := r.clients[rec.addr.Node]
		if p == nil {
			continue
		}
		off := uint64((int(r.g)*w + int(rec.seq%uint64(w))) * rs)
		// Signed with our id: the client rings only us (the leader)
		// with its next messages.
		rp := rec.reply
		rp.flags |= replyFromBits(r.self)
		b := encodeReply(r.rbuf, r.g, &rp)
		if p.queue(r.now, rec.addr.Region, off, b) {
			r.ctr.Replies++
		}
	}
	r.replyQ = r.replyQ[:0]
	for _, c := range r.helloQ {
		addr := r.st.caddr[c]
		p := r.clients[addr.Node]
		if p == nil {
			continue
		}
		off := uint64(r.cfg.Tree.Len()*w*rs + int(r.g)*8)
		var b [8]byte
		putU64(b[:], r.st.cinc[c])
		p.queue(r.now, addr.Region, off, b[:])
	}
	r.helloQ = r.helloQ[:0]
	r.flushQueued()
	return true
}

// flushQueued posts what sendReplies and noticeFull queued: every peer a
// write was queued on is in the reap list (peer.queueWrite), so only its
// links are looked at, not every client node's.
func (r *Replica) flushQueued() {
	for _, p := range r.busy {
		if p.link.Queued() > 0 {
			p.flush(r.now)
		}
	}
}

// sendCredit writes the committed parent-ring position to every replica
// of the parent, when it moved a quarter ring, after a heartbeat interval
// since it moved, or every 10 intervals anyway (a parent replica may have
// restarted with empty memory).
func (r *Replica) sendCredit(force bool) {
	if !r.hasParent {
		return
	}
	v := r.st.ppos
	due := force || v >= r.creditOut+uint64(r.cfg.ParentSlots/4) ||
		v > r.creditOut && r.now-r.creditAtT >= r.hbeat ||
		r.now-r.creditAtT >= 10*r.hbeat
	if !due {
		return
	}
	var b [8]byte
	putU64(b[:], v)
	reg := regions.Multicast(r.parent) + regCredits
	for _, p := range r.parents {
		p.write(r.now, reg, uint64(r.childOfPar*8), b[:], v > r.creditOut)
	}
	r.creditOut, r.creditAtT = v, r.now
}

// scanHeaders looks at every client header: a new incarnation is
// registered by ordering a reset entry; a moved retry word makes the
// leader write that client's replies and hello again. It runs when
// hdrAt is due (Poll): once a heartbeat interval, not on every pass,
// since headers change only when a client registers or asks again (the
// leader's cost per pass would otherwise grow with the configured client
// slots, not with the clients sending). A header written meanwhile waits
// at most a heartbeat interval: NextDeadline includes hdrAt, so a parked
// leader wakes for it. A registration the log had no room for is looked
// at again in the next Poll.
func (r *Replica) scanHeaders() bool {
	mem := r.regs[regClients].Bytes()
	progress, again, added := false, false, false
	for c := range r.tinc {
		off := c * clientHdrSize
		inc := rdma.Load64(mem, off+hInc)
		if inc > r.tinc[c] {
			addr := addrOf(rdma.Load64(mem, off+hAddr))
			r.entry = appendResetEntry(r.entry[:0], uint32(c), inc, addr)
			if r.b.AppendRoom() == 0 || r.b.Append(r.entry) != nil {
				again = true
			} else {
				added = added || r.tinc[c] == 0
				r.tinc[c], r.tpos[c] = inc, 0
				r.ctr.Resets++
				progress = true
			}
		}
		if retry := rdma.Load64(mem, off+hRetry); retry != r.retrySeen[c] {
			r.retrySeen[c] = retry
			r.noticed[c] = 0 // its disk-full notices too, if a write was lost
			w := r.cfg.ClientSlots
			for k := c * w; k < (c+1)*w; k++ {
				if r.st.replies[k].seq != 0 && r.st.replies[k].inc == r.st.cinc[c] {
					r.replyQ = append(r.replyQ, k)
				}
			}
			if r.st.cinc[c] != 0 {
				r.helloQ = append(r.helloQ, uint32(c))
			}
			progress = true
		}
	}
	if added && !r.knobs.staleSources {
		r.setSources()
	}
	r.hdrAt = r.now + r.hbeat
	if r.knobs.headersOnce {
		r.hdrAt = 1<<63 - 1
	}
	if again {
		r.hdrAt = r.now
	}
	r.headerScans++
	return progress
}

// setSources rebuilds srcs from tinc: the registered client slots, then
// the parent ring.
func (r *Replica) setSources() {
	r.srcs = r.srcs[:0]
	for c, inc := range r.tinc {
		if inc != 0 {
			r.srcs = append(r.srcs, c)
		}
	}
	if r.hasParent {
		r.srcs = append(r.srcs, r.nsrc-1)
	}
	if len(r.srcs) > 0 {
		r.rr %= len(r.srcs)
	} else {
		r.rr = 0
	}
}

// A scan takes from each client ring at most the client's window
// (ClientSlots: more cannot be outstanding), so every message a client
// has in flight goes into the scan's one batch entry, and a busy client
// still cannot shut out the others (sources are served round-robin, each
// at most one window a scan); the parent ring, which carries many
// clients' messages, gets parentBurst.

// scan finds messages in the input rings and orders them (TRAM Alg. 2,
// "finding a message" and "ordering messages"): sources round-robin, at
// most a burst from each per scan, each ring strictly in position order.
// Every message one scan finds goes into one log entry, a batch entry
// (up to Config.MaxBatch messages and the group's largest proposal; a
// message alone is a plain message entry), which the leader fills in
// place in the broadcast slab (AppendFunc). Positions, child positions
// and flow control are decided per message as it is taken, exactly as
// for an entry of its own; if the entry is refused, every tentative
// pointer it moved is put back.
func (r *Replica) scan() bool {
	parentBurst := max(r.cfg.ClientSlots, r.cfg.ParentSlots/4)
	r.tokReady = 0
	if r.b.AppendRoom() == 0 {
		return false
	}
	r.batch, r.bfwd, r.bused, r.bsize = r.batch[:0], r.bfwd[:0], 0, batchHdr
	full := false
	ns := len(r.srcs)
	for k := 0; k < ns && !full; k++ {
		src := r.srcs[(r.rr+k)%ns]
		burst := r.cfg.ClientSlots
		if src == r.nsrc-1 {
			burst = parentBurst
		} else if r.tokens != nil {
			burst = min(burst, r.refill(src))
		}
		for n := 0; n < burst; n++ {
			ok, stop := r.take(src)
			if stop {
				full = true
				break
			}
			if !ok {
				break
			}
			if r.tokens != nil && src < r.nsrc-1 {
				r.tokens[src]--
			}
		}
		if r.tokens != nil && src < r.nsrc-1 && r.tokens[src] < 1 {
			// Throttled: wake when it has a token again.
			at := r.now + time.Duration((1-r.tokens[src])/r.cfg.ClientRate*float64(time.Second)) + 1
			if r.tokReady == 0 || at < r.tokReady {
				r.tokReady = at
			}
		}
	}
	if ns > 0 {
		r.rr = (r.rr + 1) % ns
	}
	if len(r.batch) == 0 {
		return false
	}
	size := r.bsize
	if len(r.batch) == 1 {
		size = r.batch[0].size
	}
	if err := r.b.AppendFunc(size, r.fillFn); err != nil {
		r.undoBatch()
		return false
	}
	r.ctr.Batches++
	for i := range r.batch {
		m := &r.batch[i]
		r.ctr.Ordered++
		if r.knobs.forwardEarly {
			r.forwardEarly(m)
		}
	}
	return true
}

// noticeFull runs while the Acuerdo replica refuses new entries for a
// full disk (broadcast.Replica.RefusingFull): every client message waiting
// in a ring, or taken into an entry not committed yet, gets, once, a
// notice in its reply slot (flag replyDiskFull,
// no result) so that the client's call ends at once with ErrDiskFull
// instead of waiting for its deadline. The message stays in the ring: a
// leader that can log it later (space returned, or another leader)
// orders it, and its real reply overwrites the notice.
func (r *Replica) noticeFull() bool {
	mem := r.regs[regRings].Bytes()
	w := r.cfg.ClientSlots
	rs := replySlot(r.cfg.MaxResult)
	sent := false
	for c := range r.tinc {
		if r.tinc[c] == 0 {
			continue
		}
		if r.noticeInc[c] != r.tinc[c] {
			r.noticeInc[c], r.noticed[c] = r.tinc[c], 0
		}
		// From the position applied: a message taken into an entry that
		// has not committed (the group became full meanwhile) waits too.
		from := r.tpos[c]
		if r.st.cinc[c] == r.tinc[c] {
			from = min(from, r.st.cpos[c])
		}
		for pos := max(from, r.noticed[c]) + 1; pos <= from+uint64(w); pos++ {
			off := (c*w + int(pos%uint64(w))) * r.cfg.SlotSize
			if rdma.Load64(mem, off) != pos {
				break
			}
			rec, err := copyRecord(r.nbuf, mem, off, r.cfg.SlotSize, pos)
			if err != nil || rec.id.Inc != r.tinc[c] || rec.id.Client != uint32(c) {
				break // torn, or not written yet: looked at again next Poll
			}
			p := r.clients[rec.reply.Node]
			if p == nil {
				r.noticed[c] = pos
				continue
			}
			rp := reply{seq: rec.id.Seq, inc: rec.id.Inc, flags: replyDiskFull | replyFromBits(r.self)}
			b := encodeReply(r.rbuf, r.g, &rp)
			sent = true
			if !p.queue(r.now, rec.reply.Region, uint64((int(r.g)*w+int(rec.id.Seq%uint64(w)))*rs), b) {
				break // not queued (its Conn is down or its stage full): told at a later Poll
			}
			r.ctr.FullNotices++
			r.noticed[c] = pos
		}
	}
	if sent {
		r.flushQueued()
	}
	return sent
}

// pending is a message taken into the batch being built.
type pending struct {
	src  int    // the source (r.nsrc-1: the parent ring)
	pos  uint64 // its position there
	rec  record // payload aliases bbuf
	fwd  []uint64
	size int // its message entry's size, unpadded
}

// fillBatch writes the batch scan built into dst (AppendFunc's fill):
// one message entry, or a batch entry of all of them.
func (r *Replica) fillBatch(dst []byte) {
	b := dst[:0]
	if len(r.batch) == 1 {
		b = r.appendPending(b, &r.batch[0], false)
	} else {
		b = appendBatchHeader(b, len(r.batch))
		for i := range r.batch {
			b = r.appendPending(b, &r.batch[i], true)
		}
	}
	if len(b) != len(dst) || &b[0] != &dst[0] {
		panic(fmt.Sprintf("multicast: group %d: a batch of %d messages filled %d bytes of %d", r.g, len(r.batch), len(b), len(dst)))
	}
}

func (r *Replica) appendPending(b []byte, m *pending, sub bool) []byte {
	s, client := uint8(srcClient), uint32(m.src)
	if m.src == r.nsrc-1 {
		s, client = srcParent, 0
	}
	if sub {
		return appendBatchSub(b, s, client, m.pos, m.fwd, &m.rec)
	}
	return appendMessageEntry(b, s, client, m.pos, m.fwd, &m.rec)
}

// undoBatch puts back the tentative pointers (and tokens) the batch's
// messages moved, newest first, so that they are taken again.
func (r *Replica) undoBatch() {
	for i := len(r.batch) - 1; i >= 0; i-- {
		m := &r.batch[i]
		if m.src == r.nsrc-1 {
			r.tppos = m.pos - 1
		} else {
			r.tpos[m.src] = m.pos - 1
			if r.tokens != nil {
				r.tokens[m.src]++
			}
		}
		next := r.cfg.Tree.Next(r.g, m.rec.dst)
		k := 0
		for ci, c := range r.st.children {
			if next.Has(c) {
				r.tout[ci] = m.fwd[k] - 1
				k++
			}
		}
	}
	r.batch = r.batch[:0]
}

// forwardEarly is the forwardEarly knob's bug: m forwarded to its
// children as soon as it is ordered, before it commits.
func (r *Replica) forwardEarly(m *pending) {
	next := r.cfg.Tree.Next(r.g, m.rec.dst)
	k := 0
	for i, c := range r.st.children {
		if !next.Has(c) {
			continue
		}
		fr := m.rec
		fr.pos = m.fwd[k]
		k++
		b := encodeRecord(r.rec, &fr)
		off := uint64(int(fr.pos%uint64(r.cfg.ParentSlots)) * r.cfg.SlotSize)
		for _, p := range r.children[i] {
			p.write(r.now, regions.Multicast(c)+regParent, off, b, true)
		}
		r.fwdSent[i] = max(r.fwdSent[i], fr.pos)
	}
}

// refill adds client src's tokens earned since it was last refilled
// (Config.ClientRate a second, up to ClientBurst) and returns how many
// whole messages it may send now.
func (r *Replica) refill(src int) int {
	dt := r.now - r.tokAt[src]
	r.tokAt[src] = r.now
	if dt > 0 {
		r.tokens[src] = min(float64(r.cfg.ClientBurst), r.tokens[src]+dt.Seconds()*r.cfg.ClientRate)
	}
	return int(r.tokens[src])
}

// take adds the next message of source src to the batch if there is
// one. stop means the batch is full (Config.MaxBatch, or the message
// would take the entry past the group's largest proposal): the message
// stays for the next scan.
func (r *Replica) take(src int) (ok, stop bool) {
	if len(r.batch) == r.cfg.MaxBatch {
		return false, true
	}
	var mem []byte
	var pos uint64
	var off int
	fromParent := src == r.nsrc-1
	if fromParent {
		pos = r.tppos + 1
		mem = r.regs[regParent].Bytes()
		off = int(pos%uint64(r.cfg.ParentSlots)) * r.cfg.SlotSize
	} else {
		if r.tinc[src] == 0 {
			return false, false
		}
		pos = r.tpos[src] + 1
		mem = r.regs[regRings].Bytes()
		off = (src*r.cfg.ClientSlots + int(pos%uint64(r.cfg.ClientSlots))) * r.cfg.SlotSize
	}
	want := pos
	if r.knobs.noDedup {
		want = rdma.Load64(mem, off) // any lap
		if want == 0 || want > pos {
			return false, false
		}
	}
	if rdma.Load64(mem, off) != want {
		return false, false
	}
	// Copy the record's bytes only (its length from the header word), and
	// validate the copy before anything is acted on.
	rec, err := copyRecord(r.bbuf[r.bused:], mem, off, r.cfg.SlotSize, want)
	if err != nil {
		return false, false // torn, not yet written completely, or malformed: look again later
	}
	if !fromParent && (rec.id.Inc != r.tinc[src] || rec.id.Client != uint32(src)) {
		return false, false // a record of an older incarnation: the client rewrites the slot
	}
	// Destinations: a client writes to a group whose reach holds them
	// all (the lca); a parent forwards what reaches us. A record outside
	// is consumed as a delivery to nobody (a malformed request changes
	// nothing) and counted.
	reach := r.cfg.Tree.Reach(r.g)
	malformed := rec.dst&reach == 0 || !fromParent && rec.dst&^reach != 0
	if malformed {
		rec.dst = 0
	}
	// Flow control: each child the message goes to must have room in its
	// parent ring for the position we assign.
	next := r.cfg.Tree.Next(r.g, rec.dst)
	nf := len(r.bfwd)
	for i, c := range r.st.children {
		if !next.Has(c) {
			continue
		}
		q := r.tout[i] + 1
		if q > r.credit[i]+uint64(r.cfg.ParentSlots) && !r.knobs.noFlowControl {
			r.ctr.Blocked++
			r.bfwd = r.bfwd[:nf]
			return false, false
		}
		r.bfwd = append(r.bfwd, q)
	}
	fwd := r.bfwd[nf:len(r.bfwd):len(r.bfwd)]
	size := messageEntrySize(len(fwd), len(rec.payload))
	if len(r.batch) > 0 && r.bsize+pad8(size) > r.b.MaxProposal() {
		r.bfwd = r.bfwd[:nf]
		return false, true
	}
	if malformed {
		r.ctr.Malformed++
	}
	k := 0
	for i, c := range r.st.children {
		if next.Has(c) {
			r.tout[i] = fwd[k]
			k++
		}
	}
	if fromParent {
		r.tppos = pos
	} else {
		r.tpos[src] = pos
	}
	r.batch = append(r.batch, pending{src: src, pos: pos, rec: rec, fwd: fwd, size: size})
	r.bused += recordSize(len(rec.payload))
	r.bsize += pad8(size)
	return true, false
}
