package multicast

import (
	"cmp"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/mcheck"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

var simFlags = sim.RegisterFlags(flag.CommandLine)

// diskStable keeps broadcast's StableState on a simulated node's Disk.
type diskStable struct{ d *sim.Disk }

func (s diskStable) Load() (broadcast.StableState, error) {
	b, ok := s.d.Get("acuerdo")
	if !ok {
		return broadcast.StableState{}, nil
	}
	if len(b) != 16 {
		return broadcast.StableState{}, broadcast.ErrCorrupt
	}
	return broadcast.StableState{Incarnation: binary.LittleEndian.Uint64(b), ENew: broadcast.Epoch(binary.LittleEndian.Uint64(b[8:]))}, nil
}

func (s diskStable) Save(st broadcast.StableState) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], st.Incarnation)
	binary.LittleEndian.PutUint64(b[8:], uint64(st.ENew))
	return s.d.Put("acuerdo", b[:])
}

// recFSM is the application of a simulated replica: it records every
// delivery with the checker and returns a result derived from the group,
// the index and the message, so that replies can be checked byte for
// byte. Its state (the delivered ids and results) travels in snapshots.
type recFSM struct {
	h    *mcRun
	g    tree.Group
	rep  uint32 // member index
	inc  int
	seq  []delivered
	last uint64 // last index reported to the checker in this incarnation
	// As a BatchFSM, it "publishes" a batch's deliveries at EndBatch (a
	// delivery outside a batch at once): published is the last index
	// published, which every reply handed to the leader must not pass
	// (repProc's publish-order check).
	inBatch   bool
	published uint64
}

func (f *recFSM) BeginBatch() { f.inBatch = true }

func (f *recFSM) EndBatch() {
	f.inBatch = false
	f.published = uint64(len(f.seq))
}

type delivered struct {
	id  mcheck.MsgID
	res []byte
}

// payload layout of a simulated message: [slot u32][pad u32][inc u64][seq u64] then filler
func msgPayload(id MsgID, size int) []byte {
	b := make([]byte, max(24, size))
	binary.LittleEndian.PutUint32(b, id.Client)
	binary.LittleEndian.PutUint64(b[8:], id.Inc)
	binary.LittleEndian.PutUint64(b[16:], id.Seq)
	for i := 24; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

func checkID(id MsgID) mcheck.MsgID {
	return mcheck.MsgID{Client: uint64(id.Client)<<32 | id.Inc&0xffffffff, Seq: id.Seq}
}

func (f *recFSM) Apply(e broadcast.Entry) []byte {
	id := MsgID{Client: binary.LittleEndian.Uint32(e.Data), Inc: binary.LittleEndian.Uint64(e.Data[8:]), Seq: binary.LittleEndian.Uint64(e.Data[16:])}
	res := []byte(fmt.Sprintf("g%d@%d:%v", f.g, e.Index, id))
	if e.Index != uint64(len(f.seq))+1 {
		f.h.fail(fmt.Errorf("group %d replica %d: Apply index %d after %d deliveries", f.g, f.rep, e.Index, len(f.seq)))
	}
	f.seq = append(f.seq, delivered{checkID(id), res})
	f.report(e.Index)
	if !f.inBatch {
		f.published = e.Index
	}
	return res
}

func (f *recFSM) report(index uint64) {
	if index <= f.last {
		return
	}
	d := f.seq[index-1]
	if err := f.h.chk.Deliver(f.g, f.rep, f.inc, index, d.id, d.res); err != nil {
		f.h.fail(err)
	}
	f.last = index
}

func (f *recFSM) Snapshot() (broadcast.FSMSnapshot, error) {
	var b []byte
	for _, d := range f.seq {
		b = binary.LittleEndian.AppendUint64(b, d.id.Client)
		b = binary.LittleEndian.AppendUint64(b, d.id.Seq)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(d.res)))
		b = append(b, d.res...)
	}
	return broadcast.BytesSnapshot(b), nil
}

func (f *recFSM) Restore(b []byte) error {
	var seq []delivered
	for len(b) > 0 {
		if len(b) < 20 {
			return errors.New("recFSM: truncated snapshot")
		}
		id := mcheck.MsgID{Client: binary.LittleEndian.Uint64(b), Seq: binary.LittleEndian.Uint64(b[8:])}
		n := int(binary.LittleEndian.Uint32(b[16:]))
		seq = append(seq, delivered{id, append([]byte(nil), b[20:20+n]...)})
		b = b[20+n:]
	}
	if len(seq) < len(f.seq) {
		f.h.fail(fmt.Errorf("group %d replica %d: restored %d deliveries after %d (rollback)", f.g, f.rep, len(seq), len(f.seq)))
	}
	f.seq = seq
	f.published = uint64(len(seq))
	for i := range f.seq {
		f.report(uint64(i + 1))
	}
	return nil
}

type mcOpts struct {
	shape    string
	groups   int
	replicas int
	clients  int
	msgs     int           // per client
	until    time.Duration // clients stop issuing new messages then; faults end then
	maxDst   int           // destinations drawn 1..maxDst (0: all groups)
	size     int           // payload size (0: 24)
	pslots   int           // parent ring slots (0: 16)
	gap      time.Duration // a client's mean gap between messages (0: 250 µs)

	crashes     bool // crash and restart random replicas (disk kept), at most f per group down
	loseMemory  bool // (always: a crash loses memory; the disk is kept)
	partitions  bool // cut random replica pairs, both ways or one way
	slow        bool // slow random replicas
	leaders     int  // crash every group's leader at once this many times (TRAM section 8.7)
	downForGood bool // one replica of every group crashes at 3 ms and never comes back
	// isolate cuts every group's leader from the rest of its group (not
	// from clients or other groups) this many times: a deposed leader
	// that goes on writing to children and clients.
	isolate     int
	clientCrash bool // clients crash and restart with a new incarnation
	slowGroups  bool // slow every replica of a random group at once
	// abandon: clients abandon a third of their messages (Client.Abandon,
	// as a caller that gives up) up to 2 ms after sending them; those need
	// no reply (they must still be delivered exactly once if at all, and
	// must leave the client: it converges).
	abandon bool

	// calm: no fault at all, so no write is ever lost and nothing may be
	// retransmitted or retried (idle gaps longer than RetransmitAfter
	// included).
	calm bool
	// catchUp crashes the leaders of the groups at even depth this many
	// times, 12 ms apart, each slowed for the last 0.5 to 2 ms before
	// (crashEvenLeaders; each restarts 3 to 6 ms later), and
	// nothing else: the groups at odd depth keep their leaders, their
	// memory and their links, so a correct tree catch-up by their parent's
	// new leader gives them every message and the parent never needs to
	// retransmit to them. Any retransmission to such a child fails the
	// run (a catch-up that skips a message is repaired by retransmission,
	// which Validity alone would not notice).
	catchUp int
	// retryAfter is the clients' retry timeout (0: 20 ms).
	retryAfter time.Duration
	// knobs plant bugs (TestSimMutants).
	knobs testingKnobs
	// clientRate is the replicas' Config.ClientRate (TestSimClientRate).
	clientRate float64
	// maxBatch is the replicas' Config.MaxBatch (0: the default).
	maxBatch int
	// batchFaults crashes, this many times (one at a time, each down 1 to
	// 3 ms), a node
	// at the end of a step in which a leader ordered a batch of several
	// messages or applied one: the leader itself (after Append, its
	// writes to the followers possibly lost; or after the batch
	// committed, its replies possibly lost), a follower of its group, or
	// a client with a message in the batch, each kind in turn. The run
	// fails unless batches of several messages were ordered (crashes
	// keep at most f replicas of a group down).
	batchFaults int
	// allKinds: the run also fails unless every kind of batchFaults
	// happened and some batch held messages of the parent ring and of
	// clients.
	allKinds bool
}

// Kinds of batchFaults.
const (
	bfLeaderAppended = iota // the leader, in the step it appended a batch
	bfLeaderApplied         // the leader, in the step it applied (committed) one
	bfFollower              // a follower, as its leader appended a batch
	bfClient                // a client with a message in the batch appended
	bfKinds
)

type mcRun struct {
	o       mcOpts
	s       *sim.Sim
	chk     *mcheck.Checker
	t       *tree.Tree
	members [][]rdma.NodeID
	cnodes  []rdma.NodeID
	group   map[rdma.NodeID]tree.Group
	rep     map[rdma.NodeID]uint32
	procs   map[rdma.NodeID]*repProc
	clients map[rdma.NodeID]*cliProc
	rng     *rand.Rand
	down    map[rdma.NodeID]bool
	err     error
	issued  int
	done    int
	// completed holds the messages whose client got every reply; a
	// crashed client's other messages need not be delivered (validity is
	// for correct clients), though they may be.
	completed map[mcheck.MsgID]bool
	retries   int // client retries of completed messages
	incs      int // client incarnations started
	ctr       Counters
	// rtTo counts retransmissions to each child group, by every
	// incarnation of its parent's replicas.
	rtTo [tree.MaxGroups]uint64
	// batchFaults done, by kind, and when the next may be
	bf     [bfKinds]int
	bfNext time.Duration
	// multi counts the batches of several messages ordered, and
	// parentIn those holding a message from the parent ring and one from
	// a client
	multi, parentIn int
}

func (h *mcRun) fail(err error) {
	if h.err == nil && err != nil {
		h.err = err
	}
}

type repProc struct {
	h   *mcRun
	env *sim.Env
	r   *Replica
	fsm *recFSM
	rt  []uint64 // r.rtCount as last added to h.rtTo
}

func (p *repProc) Start(env *sim.Env) error {
	h := p.h
	p.env = env
	id := env.ID()
	g := h.group[id]
	bc := broadcast.Config{
		Self: id, Seed: env.Rand().Uint64() | 1, Start: broadcast.StartNew,
		RingSize: 32 << 10, MaxRecord: 4 << 10, PersistInline: true,
		HeartbeatInterval: time.Millisecond, ElectionTimeout: 4 * time.Millisecond,
		MaxLogEntries: 256, MaxCatchUpLogEntries: 512, ProposeTimeout: time.Second,
		ReconnectMin: 100 * time.Microsecond, ReconnectMax: time.Millisecond,
	}
	if env.Incarnation() > 1 {
		bc.Start = broadcast.StartExisting
	}
	cfg := Config{Group: g, Tree: h.t, Members: h.members, ClientNodes: h.cnodes,
		ClientSlots: 4, ParentSlots: cmp.Or(h.o.pslots, 16), SlotSize: 256 + max(h.o.size, 24), MaxResult: 64,
		RetransmitAfter: 5 * time.Millisecond, ClientRate: h.o.clientRate, MaxBatch: h.o.maxBatch, Broadcast: bc}
	p.fsm = &recFSM{h: h, g: g, rep: h.rep[id], inc: env.Incarnation()}
	r, err := New(cfg, env.Node(), p.fsm, diskStable{env.Disk()})
	if err != nil {
		return err
	}
	r.knobs = h.o.knobs
	// Publish order: a reply reaches the leader's reply path only once
	// the application published the delivery it acknowledges.
	onReply := r.st.onReply
	r.st.onReply = func(c uint32, slot int) {
		if idx := r.st.replies[slot].index; idx > p.fsm.published {
			h.fail(fmt.Errorf("publish order: group %d node %d: the reply for delivery %d handed on before the application published it (published up to %d)", g, id, idx, p.fsm.published))
		}
		onReply(c, slot)
	}
	p.r = r
	p.rt = make([]uint64, len(r.rtCount))
	h.procs[id] = p
	return nil
}

func (p *repProc) Step(now time.Duration) bool {
	batches, ordered, delivered := p.r.ctr.Batches, p.r.ctr.Ordered, p.r.Delivered()
	progress := p.r.Poll(now)
	if err := p.r.checkBusy(); err != nil {
		p.h.fail(err)
	}
	appended := p.r.ctr.Batches > batches && p.r.ctr.Ordered-ordered >= 2
	if appended {
		p.h.multi++
		fromParent, fromClient := false, false
		for _, m := range p.r.batch {
			fromParent = fromParent || m.src == p.r.nsrc-1
			fromClient = fromClient || m.src < p.r.nsrc-1
		}
		if fromParent && fromClient {
			p.h.parentIn++
		}
	}
	if p.h.o.batchFaults > 0 {
		p.h.batchFault(p, appended, p.r.lead != 0 && p.r.Delivered()-delivered >= 2)
	}
	for i, c := range p.r.st.children {
		p.h.rtTo[c] += p.r.rtCount[i] - p.rt[i]
		p.rt[i] = p.r.rtCount[i]
	}
	if d, g, s := p.r.Anomalies(); d+g+s != 0 && p.h.o.knobs == (testingKnobs{}) {
		p.h.fail(fmt.Errorf("group %d node %d: log anomalies: %d duplicates, %d gaps, %d stale entries", p.r.g, p.env.ID(), d, g, s))
	}
	p.env.WakeAt(p.r.NextDeadline())
	return progress
}

// batchFault may crash a node at the end of leader p's step, in which it
// appended a batch of several messages or applied several:
// mcOpts.batchFaults.
func (h *mcRun) batchFault(p *repProc, appended, applied bool) {
	now := h.s.Now()
	done := 0
	for _, n := range h.bf {
		done += n
	}
	if !appended && !applied || done >= h.o.batchFaults || now < h.bfNext || now >= h.o.until-5*time.Millisecond {
		return
	}
	g := p.r.g
	// Kinds in turn (each must happen): the next is the one done least;
	// a step that does not offer it waits for one that does.
	kind := 0
	for k := range h.bf {
		if h.bf[k] < h.bf[kind] {
			kind = k
		}
	}
	if kind == bfLeaderApplied && !applied || kind != bfLeaderApplied && !appended {
		return
	}
	kinds := []int{kind}
	for _, kind := range kinds {
		var id rdma.NodeID
		switch kind {
		case bfLeaderAppended, bfLeaderApplied:
			id = p.env.ID()
		case bfFollower:
			for _, m := range h.members[g] {
				if m != p.env.ID() && !h.down[m] {
					id = m
					break
				}
			}
		case bfClient:
			for _, m := range p.r.batch {
				if m.src < p.r.nsrc-1 && !h.down[h.cnodes[m.src]] {
					id = h.cnodes[m.src]
					break
				}
			}
		}
		if id == 0 || kind != bfClient && h.downIn(g) >= (len(h.members[g])-1)/2 {
			continue
		}
		h.bf[kind]++
		// down for 1 to 3 ms, and the next one after it is back
		d := time.Millisecond + time.Duration(h.rng.Int64N(int64(2*time.Millisecond)))
		h.bfNext = now + d + time.Millisecond
		h.s.At(now, func() { h.crashFor(id, d) })
		return
	}
}

type cliProc struct {
	h        *mcRun
	env      *sim.Env
	c        *Client
	slot     uint32
	issued   int
	next     time.Duration
	abandons []abandonAt
}

type abandonAt struct {
	id MsgID
	at time.Duration
}

func (p *cliProc) Start(env *sim.Env) error {
	h := p.h
	p.env = env
	cfg := ClientConfig{Slot: p.slot, Inc: uint64(env.Incarnation()), Tree: h.t, Members: h.members,
		ClientSlots: 4, SlotSize: 256 + max(h.o.size, 24), MaxResult: 64, RetryAfter: h.o.retryAfter,
		ReconnectMin: 100 * time.Microsecond, ReconnectMax: time.Millisecond,
		OnDone: func(o *Outcome) {
			h.done++
			h.retries += o.Retries
			h.completed[checkID(o.ID)] = true
			for _, rp := range o.Replies {
				if err := h.chk.Reply(checkID(o.ID), rp.Group, rp.Index, rp.Result); err != nil {
					h.fail(err)
				}
			}
		}}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 20 * time.Millisecond
	}
	c, err := NewClient(cfg, env.Node())
	if err != nil {
		return err
	}
	p.c = c
	h.clients[env.ID()] = p
	h.incs++
	return nil
}

func (p *cliProc) Step(now time.Duration) bool {
	h := p.h
	keep := p.abandons[:0]
	for _, a := range p.abandons {
		if now >= a.at {
			p.c.Abandon(a.id)
		} else {
			keep = append(keep, a)
		}
	}
	p.abandons = keep
	progress := p.c.Poll(now)
	for p.c.Ready() && p.issued < h.o.msgs && now < h.o.until && now >= p.next && p.c.Outstanding() < p.c.Window() {
		dst := h.randomDst()
		id := p.c.NextID(dst)
		if _, err := p.c.Multicast(dst, msgPayload(id, h.o.size)); err != nil {
			if errors.Is(err, ErrWindowFull) {
				break
			}
			h.fail(fmt.Errorf("client %d: multicast: %v", p.slot, err))
			return false
		}
		if err := h.chk.Multicast(checkID(id), uint64(dst)); err != nil {
			h.fail(err)
		}
		if h.o.abandon && p.env.Rand().IntN(3) == 0 {
			p.abandons = append(p.abandons, abandonAt{id: id, at: now + time.Duration(p.env.Rand().Int64N(int64(2*time.Millisecond)))})
		}
		p.issued++
		h.issued++
		p.next = now + time.Duration(p.env.Rand().Int64N(int64(2*cmp.Or(h.o.gap, 250*time.Microsecond))))
		progress = true
	}
	wake := p.c.NextDeadline()
	for _, a := range p.abandons {
		wake = min(wake, a.at)
	}
	if p.issued < h.o.msgs && now < h.o.until {
		wake = min(wake, max(p.next, now+100*time.Microsecond))
	}
	p.env.WakeAt(wake)
	return progress
}

func (h *mcRun) randomDst() tree.Set {
	n := h.t.Len()
	k := 1 + h.rng.IntN(min(n, max(h.o.maxDst, 1)))
	if h.o.maxDst == 0 {
		k = 1 + h.rng.IntN(n)
	}
	var s tree.Set
	for s.Len() < k {
		s = s.Add(tree.Group(h.rng.IntN(n)))
	}
	return s
}

// leaderOf returns group g's current leader node, if a live replica leads
// a committed epoch.
func (h *mcRun) leaderOf(g tree.Group) (rdma.NodeID, bool) {
	for _, id := range h.members[g] {
		if p := h.procs[id]; p != nil && h.s.Live(id) {
			if _, ok := p.r.b.Leading(); ok {
				return id, true
			}
		}
	}
	return 0, false
}

// downIn counts group g's replicas that are down or restarted and not
// caught up yet (Acuerdo needs a majority of caught-up members: at most f
// may be either).
func (h *mcRun) downIn(g tree.Group) int {
	k := 0
	for _, id := range h.members[g] {
		if h.down[id] || h.procs[id] != nil && h.s.Live(id) && h.procs[id].r.b.Status().CatchingUp {
			k++
		}
	}
	return k
}

func (h *mcRun) crashFor(id rdma.NodeID, d time.Duration) {
	if h.down[id] || !h.s.Live(id) {
		return
	}
	if err := h.s.Crash(id); err != nil {
		h.fail(err)
		return
	}
	h.down[id] = true
	h.s.At(h.s.Now()+d, func() {
		if !h.s.Live(id) {
			if err := h.s.Restart(id, true); err != nil {
				h.fail(fmt.Errorf("restart %d: %v", id, err))
			}
		}
		delete(h.down, id)
	})
}

// scheduleFaults draws replica faults from the run's rng until o.until:
// crashes (memory lost, disk kept; at most f per group down), partitions
// of replica pairs (possibly one way), slow replicas.
func (h *mcRun) scheduleFaults(at time.Duration) {
	h.s.At(at, func() {
		now := h.s.Now()
		if now >= h.o.until-5*time.Millisecond {
			return
		}
		var kinds []int
		if h.o.crashes {
			kinds = append(kinds, 0)
		}
		if h.o.partitions {
			kinds = append(kinds, 1)
		}
		if h.o.slow {
			kinds = append(kinds, 2)
		}
		if h.o.slowGroups {
			kinds = append(kinds, 3)
		}
		if h.o.clientCrash {
			kinds = append(kinds, 4)
		}
		g := tree.Group(h.rng.IntN(h.t.Len()))
		ms := h.members[g]
		id := ms[h.rng.IntN(len(ms))]
		d := time.Millisecond + time.Duration(h.rng.Int64N(int64(8*time.Millisecond)))
		switch kinds[h.rng.IntN(len(kinds))] {
		case 0:
			if h.downIn(g) < (len(ms)-1)/2 {
				h.crashFor(id, d)
			}
		case 1:
			// a replica cut from another node: a replica of its group, of a
			// neighbouring group, or a client; one way or both
			all := h.s.Nodes()
			other := all[h.rng.IntN(len(all))]
			if other != id {
				oneWay := h.rng.IntN(2) == 0
				if oneWay {
					h.s.Cut(id, other)
				} else {
					h.s.Partition(id, other)
				}
				h.s.At(now+d, func() {
					h.s.Heal(id, other)
					h.s.Heal(other, id)
				})
			}
		case 2:
			h.s.SetSlow(id, 2+h.rng.IntN(8))
			h.s.At(now+d, func() { h.s.SetSlow(id, 1) })
		case 3:
			k := 2 + h.rng.IntN(8)
			for _, m := range ms {
				h.s.SetSlow(m, k)
			}
			h.s.At(now+d, func() {
				for _, m := range ms {
					h.s.SetSlow(m, 1)
				}
			})
		case 4:
			c := h.cnodes[h.rng.IntN(len(h.cnodes))]
			if !h.down[c] {
				h.crashFor(c, d)
			}
		}
		h.scheduleFaults(now + time.Millisecond + time.Duration(h.rng.Int64N(int64(3*time.Millisecond))))
	})
}

// crashLeaders crashes every group's leader at the same instant (TRAM
// section 8.7's worst case), restarting each after a few milliseconds.
func (h *mcRun) crashLeaders(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g := range h.t.Len() {
			if id, ok := h.leaderOf(tree.Group(g)); ok && h.downIn(tree.Group(g)) < (len(h.members[g])-1)/2 {
				h.crashFor(id, 3*time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond))))
			}
		}
		h.crashLeaders(at+12*time.Millisecond, times-1)
	})
}

// crashEvenLeaders slows the leaders of the groups at even depth, then
// crashes each 0.5 to 2 ms later, restarting it a few milliseconds after
// that (the catchUp option).
func (h *mcRun) crashEvenLeaders(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g := range h.t.Len() {
			if h.t.Depth(tree.Group(g))%2 != 0 {
				continue
			}
			id, ok := h.leaderOf(tree.Group(g))
			if !ok || h.downIn(tree.Group(g)) >= (len(h.members[g])-1)/2 {
				continue
			}
			// Slowed first, so that the crash finds forwards to the
			// children still in flight (lost) and entries its followers
			// accepted that it has not seen commit (never forwarded):
			// its successor's catch-up must write them.
			h.s.SetSlow(id, 4+h.rng.IntN(5))
			h.s.At(at+500*time.Microsecond+time.Duration(h.rng.Int64N(int64(1500*time.Microsecond))), func() {
				h.s.SetSlow(id, 1)
				h.crashFor(id, 3*time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond))))
			})
		}
		h.crashEvenLeaders(at+12*time.Millisecond, times-1)
	})
}

// isolateLeaders cuts every group's leader from its group-mates for a few
// milliseconds, times times, 10 ms apart.
func (h *mcRun) isolateLeaders(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g := range h.t.Len() {
			id, ok := h.leaderOf(tree.Group(g))
			if !ok {
				continue
			}
			for _, m := range h.members[g] {
				if m != id {
					h.s.Partition(id, m)
					h.s.At(at+3*time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond))), func() { h.s.HealPair(id, m) })
				}
			}
		}
		h.isolateLeaders(at+10*time.Millisecond, times-1)
	})
}

func runMC(sd sim.Seed, o mcOpts) (*mcRun, error) {
	opts := sd.Options()
	opts.Tick = -1
	s := sim.New(opts)
	defer s.Close()
	t, err := tree.Shape(o.shape, o.groups)
	if err != nil {
		return nil, err
	}
	h := &mcRun{o: o, s: s, t: t, chk: mcheck.New(o.groups), group: map[rdma.NodeID]tree.Group{}, rep: map[rdma.NodeID]uint32{},
		procs: map[rdma.NodeID]*repProc{}, clients: map[rdma.NodeID]*cliProc{},
		rng: rand.New(rand.NewPCG(sd.Seed, 0x7a11)), down: map[rdma.NodeID]bool{}, completed: map[mcheck.MsgID]bool{}}
	next := rdma.NodeID(1)
	for g := range o.groups {
		var ms []rdma.NodeID
		for i := range o.replicas {
			ms = append(ms, next)
			h.group[next] = tree.Group(g)
			h.rep[next] = uint32(i)
			next++
		}
		h.members = append(h.members, ms)
	}
	for range o.clients {
		h.cnodes = append(h.cnodes, next)
		next++
	}
	for _, ms := range h.members {
		for _, id := range ms {
			if err := s.AddNode(id, func() sim.Process { return &repProc{h: h} }); err != nil {
				return nil, err
			}
		}
	}
	for k, id := range h.cnodes {
		if err := s.AddNode(id, func() sim.Process { return &cliProc{h: h, slot: uint32(k)} }); err != nil {
			return nil, err
		}
	}
	s.Invariant(func() error { return h.err })
	if o.crashes || o.partitions || o.slow {
		h.scheduleFaults(5 * time.Millisecond)
	}
	h.crashLeaders(8*time.Millisecond, o.leaders)
	h.isolateLeaders(10*time.Millisecond, o.isolate)
	h.crashEvenLeaders(8*time.Millisecond, o.catchUp)
	gone := map[rdma.NodeID]bool{}
	if o.downForGood {
		s.At(3*time.Millisecond, func() {
			for _, ms := range h.members {
				id := ms[h.rng.IntN(len(ms))]
				if err := s.Crash(id); err != nil {
					h.fail(err)
				}
				h.down[id], gone[id] = true, true
			}
		})
	}
	if err := s.RunUntil(o.until); err != nil {
		return h, err
	}
	// Converge: every client's messages answered, every live replica
	// caught up with its group.
	total := o.clients * o.msgs
	converged := func() bool {
		for id, p := range h.clients {
			if h.s.Live(id) && (p.c.Outstanding() > 0 || !p.c.Ready()) {
				return false
			}
		}
		for _, ms := range h.members {
			var want uint64
			for _, id := range ms {
				want = max(want, h.procs[id].r.Delivered())
			}
			for _, id := range ms {
				if !gone[id] && h.procs[id].r.Delivered() != want {
					return false
				}
			}
		}
		return true
	}
	var convErr error
	if err := s.Await(converged, o.until+2*time.Second); err != nil {
		if h.err != nil {
			return h, h.err
		}
		convErr = fmt.Errorf("no convergence: %d of %d issued (%d planned) answered: %w\n%s", h.done, h.issued, total, err, h.dump())
	}
	if h.err != nil {
		return h, h.err
	}
	live := map[uint32][]uint32{}
	for g, ms := range h.members {
		for i, id := range ms {
			if !gone[id] {
				live[uint32(g)] = append(live[uint32(g)], uint32(i))
			}
		}
	}
	for _, p := range h.procs {
		c := p.r.Counters()
		h.ctr.Ordered += c.Ordered
		h.ctr.Batches += c.Batches
		h.ctr.Retransmits += c.Retransmits
		h.ctr.Replies += c.Replies
		h.ctr.Blocked += c.Blocked
		h.ctr.Resets += c.Resets
		h.ctr.Forwarded += c.Forwarded
	}
	if sd.Trace || testing.Verbose() && sd.Seed <= 2 {
		st := h.chk.Stats()
		fmt.Printf("seed %d %s: %d messages, %d deliveries, %d retries, %+v, %d client incarnations\n", sd.Seed, o.shape, st.Messages, st.Deliveries, h.retries, h.ctr, h.incs)
	}
	if o.calm && (h.ctr.Retransmits != 0 || h.retries != 0) {
		return h, fmt.Errorf("calm run: %d retransmissions to children and %d client retries, want none", h.ctr.Retransmits, h.retries)
	}
	if o.catchUp > 0 {
		for g := range h.t.Len() {
			if c := tree.Group(g); h.t.Depth(c)%2 == 1 && h.rtTo[c] != 0 {
				return h, fmt.Errorf("catch-up: %d retransmissions to group %d, whose leader, memory and links were untouched: a correct tree catch-up by its parent's new leaders needs none", h.rtTo[c], c)
			}
		}
	}
	if o.batchFaults > 0 {
		if h.multi == 0 || h.parentIn == 0 && o.allKinds {
			return h, fmt.Errorf("batches: %d batches of several messages, %d with the parent ring's and a client's, want some of each", h.multi, h.parentIn)
		}
		for k, n := range h.bf {
			if n == 0 && o.allKinds {
				return h, fmt.Errorf("batches: crashes by kind %v: kind %d never happened", h.bf, k)
			}
		}
	}
	fo := mcheck.FinalOptions{Live: live}
	if o.clientCrash || o.abandon || o.batchFaults > 0 {
		fo.Completed = func(id mcheck.MsgID) bool { return h.completed[id] }
	}
	if err := h.chk.Final(fo); err != nil || convErr != nil {
		return h, errors.Join(err, convErr)
	}
	return h, nil
}

// simSeeds is how many seeds each case runs by default (make norace:
// CI's budget; README names the command for more).
const simSeeds = 100

// simCases are the simulator cases: each tree shape, with replica faults
// of every kind and with every leader crashing at once.
var simCases = []struct {
	name string
	o    mcOpts
}{
	{"calm", mcOpts{clients: 3, msgs: 30, until: 100 * time.Millisecond, gap: 2 * time.Millisecond, calm: true}},
	{"faults", mcOpts{clients: 3, msgs: 40, until: 80 * time.Millisecond, crashes: true, partitions: true, slow: true}},
	{"leaders", mcOpts{clients: 4, msgs: 60, until: 80 * time.Millisecond, leaders: 3, isolate: 3, maxDst: 8, gap: time.Millisecond}},
	{"backpressure", mcOpts{clients: 4, msgs: 50, until: 60 * time.Millisecond, pslots: 4, slow: true, partitions: true}},
	{"down-for-good", mcOpts{clients: 3, msgs: 30, until: 60 * time.Millisecond, downForGood: true, partitions: true}},
	{"retries", mcOpts{clients: 3, msgs: 40, until: 60 * time.Millisecond, retryAfter: time.Millisecond, crashes: true, slowGroups: true, clientCrash: true}},
	// catch-up: the leaders of the groups at even depth crash at once,
	// three times, under steady traffic; no retransmission to the groups
	// at odd depth is allowed (mcOpts.catchUp).
	{"catch-up", mcOpts{clients: 4, msgs: 60, until: 60 * time.Millisecond, catchUp: 3, maxDst: 8, gap: 500 * time.Microsecond}},
	// batches: busy clients and forwarding (several clients' and the
	// parent ring's messages in one entry), with crashes aimed at batches:
	// the leader after it appended one and after one committed, a
	// follower, a client with a message in one (mcOpts.batchFaults).
	{"batches", mcOpts{clients: 6, msgs: 100, until: 60 * time.Millisecond, gap: 100 * time.Microsecond, maxDst: 8, batchFaults: 8, allKinds: true}},
	// small batches (MaxBatch 3) and large messages (a few fill a
	// proposal): both caps end batches.
	{"batch-caps", mcOpts{clients: 5, msgs: 80, until: 60 * time.Millisecond, gap: 100 * time.Microsecond, maxDst: 8, batchFaults: 8, maxBatch: 3}},
	{"batch-size", mcOpts{clients: 5, msgs: 80, until: 60 * time.Millisecond, gap: 100 * time.Microsecond, maxDst: 8, batchFaults: 8, size: 1200}},
}

// simNoRace skips a test whose runs are each one deterministic Sim on one
// goroutine under the race detector: it has nothing to check in them,
// and the same seeds find the same bugs without it. make norace runs
// them (NORACE_MULTICAST in the Makefile; scripts/check-norace fails
// when a test that calls this is not in it).
func simNoRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("single-goroutine simulation: runs without -race (make norace)")
	}
}

// Without -seeds (or -seed) each case runs simSeeds seeds, the three batch
// cases a fifth of that: 760 seeds per tree shape (make norace runs
// them). It skips under the race detector (a seed is one goroutine: the
// detector has nothing to check in it). -short runs a tenth. -seeds N runs
// N a case, whatever N (-seeds 250 or -seeds 1000 included). The cases
// run in parallel (each seed is its own single-goroutine Sim).
func TestSim(t *testing.T) {
	simNoRace(t)
	def, batchDef := simSeeds, simSeeds/5 // the batch cases are 2 to 5 times longer
	flags := simFlags.WithDefault(def)
	batchFlags := simFlags.WithDefault(batchDef)
	for _, shape := range []string{"breadth", "depth", "base"} {
		for _, c := range simCases {
			t.Run(shape+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				o := c.o
				o.shape, o.groups, o.replicas = shape, 4, 3
				f := flags
				if o.batchFaults > 0 {
					f = batchFlags
				}
				f.Run(t, func(sd sim.Seed) error {
					_, err := runMC(sd.WithLog(t), o)
					return err
				})
			})
		}
	}
}

// dump describes every replica and client, for a failed run.
func (h *mcRun) dump() string {
	var b strings.Builder
	for g, ms := range h.members {
		for _, id := range ms {
			p := h.procs[id]
			if p == nil {
				continue
			}
			r := p.r
			e, lead := r.b.Leading()
			fmt.Fprintf(&b, "g%d n%d live=%v lead=%v(%v) delivered=%d cpos=%v ppos=%d out=%v tout=%v fwdSent=%v credit=%v tinc=%v cinc=%v ctr=%+v\n",
				g, id, h.s.Live(id), lead, e, r.st.delivered, r.st.cpos, r.st.ppos, r.st.out, r.tout, r.fwdSent, r.credit, r.tinc, r.st.cinc, r.Counters())
		}
	}
	for _, id := range h.cnodes {
		p := h.clients[id]
		if p == nil {
			continue
		}
		c := p.c
		fmt.Fprintf(&b, "client %d: ready=%v issued=%d out=%d pos=%v\n", p.slot, c.ready, p.issued, c.out, c.pos)
		for _, k := range c.calls {
			if k.seq != 0 {
				fmt.Fprintf(&b, "  seq %d dst %v lca %d pos %d got %v retries %d\n", k.seq, k.dst, k.lca, k.pos, k.got, k.retries)
			}
		}
	}
	return b.String()
}

// TestSimAbandon runs clients that abandon a third of their messages
// (callers that gave up), with replicas crashing and whole groups slowed:
// the abandoned messages' reply slots are reused by later messages, and
// every property must still hold, and every client must converge (an
// abandoned message leaves once its lca ordered it).
func TestSimAbandon(t *testing.T) {
	simNoRace(t)
	def := simSeeds / 3
	flags := simFlags.WithDefault(def)
	for _, shape := range []string{"breadth", "depth", "base"} {
		t.Run(shape, func(t *testing.T) {
			o := mcOpts{shape: shape, groups: 4, replicas: 3, clients: 3, msgs: 50, until: 60 * time.Millisecond,
				crashes: true, slowGroups: true, abandon: true, gap: 100 * time.Microsecond}
			flags.Run(t, func(sd sim.Seed) error {
				_, err := runMC(sd.WithLog(t), o)
				return err
			})
		})
	}
}

// TestSimMutants plants one bug at a time and checks that the checker
// aimed at it catches it within a few seeds. Each seed is one
// single-goroutine Sim, deterministic, so the race detector has nothing
// to check in it and the same seed catches the same bug with it or
// without: it runs in make norace (1.7 s of CPU there against 34 s under
// -race, both at load ~25), and skips under -race.
func TestSimMutants(t *testing.T) {
	simNoRace(t)
	cases := []struct {
		name  string
		knobs testingKnobs
		o     mcOpts
		want  mcheck.Property
		or    mcheck.Property // a second property the bug may show up as first
		// wantErr: caught by a check of the run outside mcheck, whose
		// error (its first line) says so (want is then empty).
		wantErr string
	}{
		{"no-dedup", testingKnobs{noDedup: true}, mcOpts{shape: "base", clients: 3, msgs: 30, until: 40 * time.Millisecond}, mcheck.ExactlyOnce, "", ""},
		{"forward-early", testingKnobs{forwardEarly: true}, mcOpts{shape: "breadth", clients: 4, msgs: 60, until: 80 * time.Millisecond, isolate: 5, gap: 500 * time.Microsecond}, mcheck.ExactlyOnce, mcheck.Validity, ""},
		{"no-catch-up", testingKnobs{noCatchUp: true}, mcOpts{shape: "depth", clients: 4, msgs: 40, until: 80 * time.Millisecond, leaders: 2}, mcheck.Validity, "", ""},
		{"no-flow-control", testingKnobs{noFlowControl: true}, mcOpts{shape: "breadth", clients: 4, msgs: 60, until: 60 * time.Millisecond, pslots: 4, slow: true}, mcheck.Validity, "", ""},
		// Validity and ExactlyOnce hold (retransmission repairs the
		// skipped message): only the retransmission count sees it.
		// a batch's replies handed on as its messages are applied, before
		// the application's EndBatch published them: only the publish-order
		// check sees it (the step is atomic to other nodes).
		{"reply-before-publish", testingKnobs{replyBeforePublish: true}, mcOpts{shape: "base", clients: 5, msgs: 60, until: 50 * time.Millisecond, gap: 100 * time.Microsecond, maxDst: 8, batchFaults: 8, allKinds: true}, "", "", "publish order:"},
		{"skip-catch-up", testingKnobs{skipCatchUp: true}, mcOpts{shape: "depth", clients: 4, msgs: 60, until: 60 * time.Millisecond, catchUp: 3, maxDst: 8, gap: 500 * time.Microsecond}, "", "", "catch-up:"},
		// The scan's sources and the header scan's pace (scanHeaders):
		// a slot registered while the leader leads must join the scan; a
		// client that restarts with a new incarnation must be heard again
		// (it never registers, so the run does not converge).
		{"stale-sources", testingKnobs{staleSources: true}, mcOpts{shape: "base", clients: 3, msgs: 30, until: 40 * time.Millisecond}, mcheck.Validity, "", ""},
		// pollPeers reaps only the peers written to: one with writes in
		// flight must stay in its list until its link is idle.
		{"drop-busy", testingKnobs{dropBusy: true}, mcOpts{shape: "base", clients: 3, msgs: 30, until: 40 * time.Millisecond}, "", "", "reap list:"},
		{"headers-once", testingKnobs{headersOnce: true}, mcOpts{shape: "base", clients: 3, msgs: 40, until: 60 * time.Millisecond, retryAfter: time.Millisecond, slow: true, clientCrash: true}, "", "", "no convergence:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.groups, o.replicas, o.knobs = 4, 3, c.knobs
			var caught []string
			for seed := uint64(1); seed <= 30; seed++ {
				_, err := runMC(sim.Seed{Seed: seed}, o)
				if err == nil {
					continue
				}
				var v *mcheck.Violation
				if c.wantErr != "" {
					caught = append(caught, firstLine(err.Error()))
					if strings.Contains(firstLine(err.Error()), c.wantErr) {
						t.Logf("seed %d: caught: %s", seed, firstLine(err.Error()))
						return
					}
				} else if errors.As(err, &v) {
					caught = append(caught, string(v.Property))
					if v.Property == c.want || c.or != "" && v.Property == c.or {
						t.Logf("seed %d: caught by %s: %.200s", seed, v.Property, v.Detail)
						return
					}
				} else {
					caught = append(caught, firstLine(err.Error()))
				}
			}
			t.Fatalf("planted bug %s not caught by %s in 30 seeds (caught by: %q)", c.name, cmp.Or(string(c.want), c.wantErr), caught)
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
