package broadcast

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/tidwall/btree"
)

// entry is one message of the Log (Acuerdo Fig. 1 l.33).
type entry struct {
	hdr  MsgHdr
	id   proposalID
	data []byte
}

// member is what this replica knows of one member from its SST rows.
type member struct {
	id      rdma.NodeID
	inc     uint64 // highest incarnation seen in its rows; 0: never heard
	rows    [nTables]row
	valid   [nTables]bool // rows[t] is of incarnation inc
	raw     [nTables]row  // the row last decoded, valid or not
	rawOK   [nTables]bool // raw validated
	hb      uint64        // last heartbeat seen in its CommitSST row
	heardAt time.Duration // when a row of it last changed
}

func (m *member) acceptHdr() MsgHdr {
	return MsgHdr{E: Epoch(m.rows[tAccept][0]), Cnt: m.rows[tAccept][1]}
}

func (m *member) commitHdr() MsgHdr {
	return MsgHdr{E: Epoch(m.rows[tCommit][0]), Cnt: m.rows[tCommit][1]}
}

func (m *member) vote() Vote {
	r := &m.rows[tVote]
	return Vote{ENew: Epoch(r[0]), Acpt: MsgHdr{E: Epoch(r[1]), Cnt: r[2]}}
}

// inRing is the receiver side of the ring from one sender.
type inRing struct {
	region rdma.Region
	mem    []byte
	sinc   uint64 // sender incarnation whose records we accept; 0: unknown
	cursor uint64 // absolute position of the next record
	acked  uint64 // cursor last acknowledged to the sender
	diff   pendingDiff
}

// pendingDiff collects the parts of a multi-part diff (docs/broadcast.md,
// "Diffs, made precise").
type pendingDiff struct {
	hdr     MsgHdr
	base    MsgHdr
	flags   uint64
	entries []*entry
}

// follower is the leader's per-follower state: a cursor into the Log and
// the diff being sent (Acuerdo Fig. 7 l.119-126, streamed).
type follower struct {
	state    uint8
	inc      uint64 // follower incarnation this state is for
	base     MsgHdr // diff base: the follower's Commit_SST entry (comm_cpy[j]) or the snapshot point
	end      MsgHdr // diff header: the leader's Accepted when the sync began
	packed   MsgHdr // last entry put into a diff part
	snap     bool   // the diff's base is a snapshot
	snapSent bool
	next     MsgHdr // streaming: last header written to the follower's ring
	sentAt   time.Duration
}

// Deliberate bugs for tests that prove the checkers bite.
const (
	bugNone           = iota
	bugMinorityCommit // the leader commits without a majority
)

const (
	fsIdle   = iota // not serving (not leader)
	fsSync          // sending a diff
	fsStream        // sending new messages as they are broadcast
)

type tableRec struct {
	oinc uint32
	pseq uint64
}

// Replica is one member of an Acuerdo group: a deterministic polled state
// machine. Poll is called by one goroutine (a driver or the simulator);
// Propose and Status are safe from any goroutine.
type Replica struct {
	cfg    Config
	node   rdma.Node
	fsm    FSM
	stable Stable
	rng    *rand.Rand

	self   rdma.NodeID
	me     int // index of self in Members
	n      int
	quorum int
	inc    uint64 // incarnation

	sst    rdma.Region
	sstMem []byte
	ins    []inRing
	links  []*link // nil at me
	mems   []member
	fol    []follower
	snaps  []rdma.Region

	// Acuerdo Fig. 1 l.11-17.
	eCur, eNew Epoch
	accepted   MsgHdr
	committed  MsgHdr
	count      uint64
	role       Role
	log        *btree.BTreeG[*entry]
	index      uint64 // entries delivered so far
	pruned     MsgHdr // every entry <= pruned left the Log
	catchingUp bool   // restarted with empty memory, no diff accepted yet

	vote        Vote // our published VoteSST row
	electAt     time.Duration
	leaderHB    uint64
	leaderHBAt  time.Duration
	leaderInc   uint64 // incarnation of the leader whose diff we accepted
	heartbeat   uint64
	nextHB      time.Duration
	beat        bool // this Poll is a heartbeat
	commitMoved bool // Committed moved since our CommitSST row last went to all
	nextPrune   time.Duration
	myRows      [nTables]row
	epochDone   bool // committed >= (eCur, 0): proposals may be handed over
	table       []tableRec
	scratch     []byte
	batch       []*entry       // commit's delivery batch, reused
	pivot       entry          // search key, reused
	setHint     btree.PathHint // Log access hints: appends and lookups are sequential
	getHint     btree.PathHint
	ascHint     btree.PathHint
	entSlab     []entry // entries are carved from slabs: no allocation per message
	dataSlab    []byte

	// proposals
	mu       sync.Mutex
	inbox    []*Proposal
	inboxLen atomic.Int64 // len(inbox), read without the lock by Poll
	closed   bool
	waiting  []*Proposal // not handed to a leader, in pseq order
	inflight []*Proposal // handed to the leader of inflight[i].epoch, fate unknown
	pseq     uint64
	npending int // len(inbox)+len(waiting)+len(inflight), under mu

	now    time.Duration
	ctr    Counters
	bug    int // tests only: a deliberate protocol bug the checkers must catch
	status Status
	stmu   sync.Mutex
}

// New creates a replica on node: it registers its regions and loads its
// stable state (a new incarnation). A replica whose stable state shows an
// earlier incarnation restarted with empty memory: it counts as failed
// (it neither votes nor counts as accepting) until a leader's diff caught it
// up. The first Poll connects to the peers.
func New(cfg Config, node rdma.Node, fsm FSM, stable Stable) (*Replica, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if node.ID() != cfg.Self {
		return nil, fmt.Errorf("broadcast: node id %d differs from config self %d: %w", node.ID(), cfg.Self, ErrConfig)
	}
	st, err := stable.Load()
	if err != nil {
		return nil, err
	}
	r := &Replica{
		cfg:    cfg,
		node:   node,
		fsm:    fsm,
		stable: stable,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5bd1e995)),
		self:   cfg.Self,
		n:      len(cfg.Members),
		quorum: len(cfg.Members)/2 + 1,
		log: btree.NewBTreeGOptions(func(a, b *entry) bool { return a.hdr.Less(b.hdr) },
			btree.Options{NoLocks: true}),
		scratch: make([]byte, cfg.MaxRecord),
	}
	r.me = slices.Index(cfg.Members, cfg.Self)
	r.catchingUp = st.Incarnation > 0
	r.inc = st.Incarnation + 1
	r.eNew = st.ENew
	if err := stable.Save(StableState{Incarnation: r.inc, ENew: r.eNew}); err != nil {
		return nil, err
	}
	if err := r.register(); err != nil {
		r.closeRegions()
		return nil, err
	}
	r.links = make([]*link, r.n)
	r.mems = make([]member, r.n)
	r.fol = make([]follower, r.n)
	r.table = make([]tableRec, r.n)
	for i, id := range cfg.Members {
		r.mems[i].id = id
		if i != r.me {
			r.links[i] = newLink(id, i, cfg.RingSize)
		}
	}
	r.role = Electing
	r.electAt = r.voteTimeout(0)
	if r.catchingUp && r.eNew != 0 {
		// Publish the promise we kept on disk (with no accepted header, so
		// that no candidate counts it): members of a smaller epoch see it
		// and elect past it, or we could never accept their diff (Fig. 5
		// l.54).
		r.vote = Vote{ENew: r.eNew}
	}
	r.updateRows()
	r.publishStatus()
	r.tracef("node %d boots incarnation %d, e_new %v, catching up %v", r.self, r.inc, r.eNew, r.catchingUp)
	return r, nil
}

func (r *Replica) register() error {
	var err error
	base := r.cfg.RegionBase
	if r.sst, err = r.node.Register(base, sstSize(r.n)); err != nil {
		return fmt.Errorf("broadcast: register SST region: %w", err)
	}
	r.sstMem = r.sst.Bytes()
	r.ins = make([]inRing, r.n)
	r.snaps = make([]rdma.Region, r.n)
	for i, id := range r.cfg.Members {
		if i == r.me {
			continue
		}
		if err := r.sst.Grant(id, rdma.PermWrite); err != nil {
			return fmt.Errorf("broadcast: grant SST to %d: %w", id, err)
		}
		reg, err := r.node.Register(base+1+rdma.RegionID(i), r.cfg.RingSize)
		if err != nil {
			return fmt.Errorf("broadcast: register ring from %d: %w", id, err)
		}
		r.ins[i].region = reg
		r.ins[i].mem = reg.Bytes()
		if err := reg.Grant(id, rdma.PermWrite); err != nil {
			return fmt.Errorf("broadcast: grant ring to %d: %w", id, err)
		}
	}
	return nil
}

func (r *Replica) closeRegions() {
	if r.sst != nil {
		r.sst.Close()
	}
	for i := range r.ins {
		if r.ins[i].region != nil {
			r.ins[i].region.Close()
		}
	}
	for _, s := range r.snaps {
		if s != nil {
			s.Close()
		}
	}
}

// Close releases the replica's regions and connections and fails every
// proposal not yet resolved with ErrStopped (outcome unknown). Call it once
// nothing polls the replica any more (after its Driver returned).
func (r *Replica) Close() error {
	r.mu.Lock()
	r.closed = true
	ps := append(append(append([]*Proposal(nil), r.inbox...), r.waiting...), r.inflight...)
	r.inbox, r.waiting, r.inflight = nil, nil, nil
	r.npending = 0
	r.mu.Unlock()
	for _, p := range ps {
		p.finish(0, ErrStopped)
	}
	for _, l := range r.links {
		if l != nil && l.conn != nil {
			l.conn.Close()
		}
	}
	r.closeRegions()
	return nil
}

func (r *Replica) event(k EventKind, e Epoch) {
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(Event{Kind: k, Epoch: e})
	}
}

func (r *Replica) tracef(format string, args ...any) {
	if r.cfg.Trace != nil {
		r.cfg.Trace(format, args...)
	}
}

func (r *Replica) voteTimeout(now time.Duration) time.Duration {
	t := r.cfg.ElectionTimeout
	return now + t + time.Duration(r.rng.Int64N(int64(t)))
}

func (r *Replica) idxOf(id rdma.NodeID) int {
	for i, m := range r.cfg.Members {
		if m == id {
			return i
		}
	}
	return -1
}

// Poll runs one step at virtual or real time now (a monotonic duration
// since any fixed origin): it reads local memory, runs Acuerdo's handlers,
// posts verbs, and reports whether anything happened. It never blocks and
// makes no system calls other than the fabric's verbs (and, during
// elections, Stable.Save).
func (r *Replica) Poll(now time.Duration) bool {
	r.now = now
	progress := r.drainInbox()
	for _, l := range r.links {
		if l == nil {
			continue
		}
		l.connect(r, now)
		if l.pollCompletions(r, now) {
			progress = true
		}
	}
	if r.readRows() {
		progress = true
	}
	r.readAcks()
	for i := range r.ins {
		if i != r.me && r.readRing(i) {
			progress = true
		}
	}
	if r.commit() {
		progress = true
	}
	if r.timers() {
		progress = true
	}
	if r.role == Electing && r.elect() {
		progress = true
	}
	if r.submit() {
		progress = true
	}
	if r.role == Leader {
		for i := range r.fol {
			if i != r.me && r.serve(i) {
				progress = true
			}
		}
	}
	if now >= r.nextPrune {
		r.nextPrune = now + r.cfg.HeartbeatInterval
		r.prune()
	}
	if r.push() {
		progress = true
	}
	if r.expireWaiting() || progress || r.beat {
		r.publishStatus()
	}
	return progress
}

// NextDeadline is the latest time the replica wants its next Poll even if
// nothing lands in its memory (heartbeats, timeouts, reconnects).
func (r *Replica) NextDeadline() time.Duration {
	d := r.nextHB
	if r.role == Electing {
		d = min(d, r.electAt)
	}
	for _, l := range r.links {
		if l != nil && !l.up {
			d = min(d, l.retryAt)
		}
	}
	return d
}

// ---- SST rows ----

// updateRows recomputes our three rows from the protocol state and marks
// changed ones for pushing: AcceptSST to the leader (Acuerdo Fig. 5 l.52),
// CommitSST and VoteSST to all (Fig. 6 l.95, Fig. 7 l.104).
func (r *Replica) updateRows() {
	var rs [nTables]row
	rs[tAccept] = row{uint64(r.accepted.E), r.accepted.Cnt, 0, r.inc}
	rs[tCommit] = row{uint64(r.committed.E), r.committed.Cnt, r.heartbeat, r.inc, r.index}
	if r.vote != (Vote{}) {
		rs[tVote] = row{uint64(r.vote.ENew), uint64(r.vote.Acpt.E), r.vote.Acpt.Cnt, r.inc}
	}
	for t := range rs {
		if rs[t] == r.myRows[t] {
			continue
		}
		if t == tVote && r.vote == (Vote{}) {
			continue
		}
		// A follower's CommitSST row matters at once to its leader only
		// (its heartbeat is the leader's failure detector); the others use
		// it for diff bases and pruning (Fig. 7 l.113) and get it at the
		// next beat after the commit point moved, and every fourth beat.
		beatOnly := false
		if t == tCommit && r.role == Follower {
			if r.beat && (r.heartbeat%4 == 0 || r.commitMoved) {
				r.commitMoved = false
			} else {
				beatOnly = true
			}
		}
		r.myRows[t] = rs[t]
		for i, l := range r.links {
			if l == nil {
				continue
			}
			if (t == tAccept || beatOnly) && r.role != Electing && r.mems[i].id != r.eCur.Leader() {
				continue
			}
			l.dirty[t] = true
		}
	}
}

// push writes dirty rows, acknowledgements and ring records to the peers.
func (r *Replica) push() bool {
	now := r.now
	r.beat = now >= r.nextHB
	if r.beat {
		// Acuerdo Fig. 6 l.93-95: push Commit_SST[Self] periodically; its
		// heartbeat counter is the failure detector.
		r.heartbeat++
		r.nextHB = now + r.cfg.HeartbeatInterval
	}
	r.updateRows()
	progress := false
	for i, l := range r.links {
		if l == nil || !l.up {
			continue
		}
		for t := range l.dirty {
			if !l.dirty[t] {
				continue
			}
			slot, buf := l.stageSlot()
			if buf == nil {
				break
			}
			rw := r.myRows[t]
			encodeRow(buf, &rw, t, r.me)
			// Ring the peer's doorbell unless only the heartbeat moved: a
			// parked peer wakes for its own timers anyway.
			hdr := MsgHdr{E: Epoch(rw[0]), Cnt: rw[1]}
			notify := t != tCommit || hdr != l.commitSent
			if l.postStaged(r, now, slot, buf, r.cfg.RegionBase, rowOffset(t, r.me, r.n), notify) {
				l.dirty[t] = false
				if t == tCommit {
					l.commitSent = hdr
				}
				progress = true
			}
		}
		if l.ackDirty && r.ins[i].sinc != 0 {
			slot, buf := l.stageSlot()
			if buf != nil {
				in := &r.ins[i]
				binary.LittleEndian.PutUint64(buf, ackWord(in.sinc, r.inc, in.cursor))
				if l.postStaged(r, now, slot, buf[:8], r.cfg.RegionBase, ackOffset(r.me, r.n), true) {
					l.ackDirty = false
					in.acked = in.cursor
					progress = true
				}
			}
		}
		if l.out.rinc != 0 && l.flushRing(r, now, r.cfg.RegionBase+1+rdma.RegionID(r.me)) {
			progress = true
		}
		if r.driveFetch(l) {
			progress = true
		}
	}
	return progress
}

// readRows reads every member's rows from our SST region.
func (r *Replica) readRows() bool {
	progress := false
	for i := range r.mems {
		if i == r.me {
			continue
		}
		m := &r.mems[i]
		for t := 0; t < nTables; t++ {
			if rowUnchanged(r.sstMem, t, i, r.n, &m.raw[t], m.rawOK[t]) {
				continue
			}
			rw, ok := decodeRow(r.sstMem, t, i, r.n)
			m.raw[t], m.rawOK[t] = rw, ok
			if !ok || rw[wIncarnation] < m.inc {
				continue
			}
			if rw[wIncarnation] > m.inc {
				r.memberRestarted(i, rw[wIncarnation])
			}
			if m.valid[t] && m.rows[t] == rw {
				continue
			}
			m.rows[t] = rw
			m.valid[t] = true
			m.heardAt = r.now
			progress = true
			if t == tCommit && rw[2] != m.hb {
				m.hb = rw[2]
			}
		}
	}
	return progress
}

// memberRestarted handles the first row of a new incarnation of member i:
// its memory is new, so both rings between us start afresh.
func (r *Replica) memberRestarted(i int, inc uint64) {
	m := &r.mems[i]
	r.tracef("node %d sees node %d incarnation %d", r.self, m.id, inc)
	m.inc = inc
	m.valid = [nTables]bool{}
	m.heardAt = r.now
	in := &r.ins[i]
	in.sinc = inc
	in.cursor, in.acked = 0, 0
	in.diff = pendingDiff{}
	l := r.links[i]
	l.ackDirty = true
	l.out.reset(inc)
	l.fetch = snapFetch{}
	for t := range l.dirty {
		l.dirty[t] = true
	}
	if r.fol[i].state != fsIdle {
		r.fol[i] = follower{state: fsIdle}
	}
}

// readAcks reads the ring acknowledgements peers wrote into our SST region.
func (r *Replica) readAcks() {
	for i, l := range r.links {
		if l == nil || l.out.rinc == 0 {
			continue
		}
		w := rdma.Load64(r.sstMem, ackOffset(i, r.n))
		if w>>56 != r.inc&0xff || (w>>48)&0xff != l.out.rinc&0xff {
			continue
		}
		c := liftAck(w&ackMask, l.out.sent)
		if c > l.out.consumed && c <= l.out.sent {
			l.out.consumed = c
		}
	}
}

// ---- rings: accepting (Acuerdo Fig. 5) ----

const maxBatch = 4096

// readRing accepts the valid records the sender wrote, as one batch, and
// acknowledges only the last one (Acuerdo Fig. 5; earlier ones are implied
// by FIFO).
func (r *Replica) readRing(i int) bool {
	in := &r.ins[i]
	if in.sinc == 0 {
		return false
	}
	sender := r.mems[i].id
	rs := uint64(len(in.mem))
	start := in.cursor
	acc := r.accepted
	for k := 0; k < maxBatch; k++ {
		off := in.cursor % rs
		if rs-off < recHdr+8 {
			in.cursor += rs - off
			continue
		}
		h, size, ok := decodeRecord(in.mem, int(off), in.cursor)
		if !ok || h.sinc != uint8(in.sinc) || h.rinc != uint8(r.inc) {
			break
		}
		payload := in.mem[int(off)+recHdr : int(off)+recHdr+h.len]
		done := true
		switch h.kind {
		case kPad:
			in.cursor += rs - off
			continue
		case kMsg:
			r.acceptMsg(sender, h.hdr, payload)
		case kForward:
			done = r.acceptForward(h.hdr, payload)
		case kSnapshot:
			done = r.acceptSnapshot(i, h.hdr, payload)
		case kDiffPart, kDiffEnd:
			r.acceptDiffPart(i, sender, h.kind, h.hdr, payload)
		}
		if !done {
			break
		}
		in.cursor += uint64(size)
	}
	// Flow control: acknowledge consumed ring bytes once a quarter of the
	// ring is consumed, and at every heartbeat.
	if in.cursor-in.acked >= rs/4 || (in.cursor != in.acked && r.now >= r.nextHB) {
		r.links[i].ackDirty = true
	}
	if r.cfg.Trace != nil && r.accepted != acc && r.role == Follower && r.accepted.Cnt > 0 {
		r.tracef("node %d accepts up to %v", r.self, r.accepted)
	}
	return in.cursor != start
}

// acceptMsg is Acuerdo Fig. 5 l.47-53: normal message acceptance.
func (r *Replica) acceptMsg(sender rdma.NodeID, hdr MsgHdr, payload []byte) {
	// Acuerdo Fig. 5 l.47: only messages of the epoch we are in.
	if hdr.E != r.eNew || hdr.E != r.eCur || r.role != Follower || hdr.E.Leader() != sender || len(payload) < entryMeta {
		return
	}
	if !r.accepted.Less(hdr) {
		return
	}
	// Acuerdo Fig. 5 l.49-51: Log[hdr] = M; Accepted = hdr; Accept_SST[Self] = hdr.
	e := r.newEntry(hdr, getMeta(payload), payload[entryMeta:])
	r.log.SetHint(e, &r.setHint)
	r.accepted = hdr
	// Fig. 5 l.52 (push to the leader) happens once per batch in push.
}

// acceptForward takes a proposal a follower forwarded to us as the leader
// of hdr.E. It reports false to leave it in the ring (back pressure).
func (r *Replica) acceptForward(hdr MsgHdr, payload []byte) bool {
	if r.role != Leader || hdr.E != r.eCur || !r.epochDone || len(payload) < entryMeta {
		return true // not for us: the follower re-forwards after the next epoch's diff
	}
	if r.uncommitted() >= r.cfg.MaxUncommitted {
		return false
	}
	r.broadcast(getMeta(payload), r.copyData(payload[entryMeta:]))
	return true
}

// acceptSnapshot handles a snapshot announcement: fetch it with one-sided
// reads before looking further in the ring.
func (r *Replica) acceptSnapshot(i int, hdr MsgHdr, payload []byte) bool {
	if len(payload) < snapRecLen {
		return true
	}
	f := &r.links[i].fetch
	region := rdma.RegionID(binary.LittleEndian.Uint64(payload[0:]))
	size := int(binary.LittleEndian.Uint64(payload[8:]))
	check := binary.LittleEndian.Uint64(payload[16:])
	commit := MsgHdr{E: Epoch(binary.LittleEndian.Uint64(payload[24:])), Cnt: binary.LittleEndian.Uint64(payload[32:])}
	if hdr.E < r.eNew || size < snapMetaWords*8 || size > 1<<40 {
		return true // Fig. 5 l.54 would refuse the diff it belongs to
	}
	if !f.active || f.region != region || f.check != check || f.commit != commit || len(f.buf) != size {
		*f = snapFetch{active: true, region: region, check: check, commit: commit, buf: make([]byte, size)}
		r.tracef("node %d fetches snapshot at %v (%d bytes) from node %d", r.self, commit, size, r.mems[i].id)
	}
	if f.failed {
		*f = snapFetch{}
		return true
	}
	return f.ready
}

// driveFetch posts the reads of a snapshot fetch and verifies it.
func (r *Replica) driveFetch(l *link) bool {
	f := &l.fetch
	if !f.active || f.ready || f.failed {
		return false
	}
	progress := false
	const chunk = 64 << 10
	for l.up && f.nextOff < len(f.buf) && len(f.inflight) < 16 {
		n := min(chunk, len(f.buf)-f.nextOff)
		wr := rdma.WR{Kind: rdma.OpRead, Region: f.region, Offset: uint64(f.nextOff), Buf: f.buf[f.nextOff : f.nextOff+n]}
		if !l.post(r, r.now, wr) {
			break
		}
		f.nextOff += n
		f.inflight = append(f.inflight, f.nextOff)
		progress = true
	}
	if f.doneOff == len(f.buf) {
		if xxhash.Sum64(f.buf) == f.check {
			f.ready = true
		} else {
			f.failed = true
		}
		progress = true
	}
	return progress
}

// acceptDiffPart collects diff parts and accepts the diff on its last part.
func (r *Replica) acceptDiffPart(i int, sender rdma.NodeID, kind uint8, hdr MsgHdr, payload []byte) {
	in := &r.ins[i]
	if len(payload) < diffHdr {
		return
	}
	base := MsgHdr{E: Epoch(binary.LittleEndian.Uint64(payload[0:])), Cnt: binary.LittleEndian.Uint64(payload[8:])}
	flags := binary.LittleEndian.Uint64(payload[16:])
	r.ctr.DiffParts++
	d := &in.diff
	if d.hdr != hdr || d.base != base || d.flags != flags {
		*d = pendingDiff{hdr: hdr, base: base, flags: flags}
	}
	for p := payload[diffHdr:]; len(p) > 0; {
		e, size, ok := getDiffEntry(p)
		if !ok {
			*d = pendingDiff{}
			return
		}
		d.entries = append(d.entries, e)
		p = p[size:]
	}
	if kind == kDiffEnd {
		r.acceptDiff(i, sender, d)
		*d = pendingDiff{}
	}
}

// acceptDiff is Acuerdo Fig. 5 l.54-66: diff acceptance and transition into
// broadcast, with the base fix of docs/broadcast.md: entries above the
// diff's base are removed, not only those from the diff's first key.
func (r *Replica) acceptDiff(i int, sender rdma.NodeID, d *pendingDiff) {
	e := d.hdr.E
	// Acuerdo Fig. 5 l.54: accept unless we promised a bigger epoch.
	if e < r.eNew || e.Leader() != sender {
		return
	}
	f := &r.links[i].fetch
	useSnap := false
	if d.flags&diffSnapshot != 0 {
		if r.committed.Less(d.base) {
			if !f.ready || f.commit != d.base {
				return // the snapshot did not arrive: the leader re-syncs us
			}
			useSnap = true
		}
	} else if r.committed.Less(d.base) {
		return // a gap: the leader's view of our commit is stale; it re-syncs us
	}
	if e > r.eNew {
		// A vote is recorded before it is published: E_new before the accept.
		if err := r.stable.Save(StableState{Incarnation: r.inc, ENew: e}); err != nil {
			r.tracef("node %d: save e_new: %v", r.self, err)
			return
		}
	}
	if useSnap {
		if err := r.restore(f.buf, d.base); err != nil {
			r.tracef("node %d: restore snapshot: %v", r.self, err)
			*f = snapFetch{}
			return
		}
	}
	*f = snapFetch{}
	// Acuerdo Fig. 5 l.58-60: E_new = E_cur = e; Role = FOLLOWER.
	newEpoch := e != r.eCur
	r.eNew, r.eCur = e, e
	if e.Leader() != r.self {
		r.role = Follower
	}
	// Acuerdo Fig. 5 l.62-63, with the base: remove entries above the base,
	// then insert the diff's entries.
	for {
		last, ok := r.log.Max()
		if !ok || !d.base.Less(last.hdr) {
			break
		}
		r.log.PopMax()
	}
	for _, en := range d.entries {
		r.log.Set(en)
	}
	// Acuerdo Fig. 5 l.64: Accepted = hdr.
	r.accepted = d.hdr
	r.catchingUp = false
	if newEpoch {
		r.epochDone = false
	}
	r.leaderHBAt = r.now
	r.leaderHB = r.mems[i].hb
	r.leaderInc = r.mems[i].inc
	r.ctr.DiffsAccepted++
	if newEpoch && r.role == Follower {
		r.event(EventFollower, e)
	}
	r.tracef("node %d accepts diff %v base %v with %d entries from node %d (snapshot %v)", r.self, d.hdr, d.base, len(d.entries), sender, useSnap)
}

// restore installs a fetched snapshot taken at commit point at.
func (r *Replica) restore(b []byte, at MsgHdr) error {
	if len(b) < snapMetaWords*8 {
		return fmt.Errorf("broadcast: snapshot of %d bytes: %w", len(b), ErrCorrupt)
	}
	index := binary.LittleEndian.Uint64(b[0:])
	nt := binary.LittleEndian.Uint64(b[8:])
	if nt != uint64(r.n) || len(b) < 16+int(nt)*16 {
		return fmt.Errorf("broadcast: snapshot table of %d rows for %d members: %w", nt, r.n, ErrCorrupt)
	}
	table := make([]tableRec, r.n)
	for k := range table {
		w := b[16+k*16:]
		table[k] = tableRec{oinc: binary.LittleEndian.Uint32(w[4:]), pseq: binary.LittleEndian.Uint64(w[8:])}
	}
	if err := r.fsm.Restore(b[16+r.n*16:]); err != nil {
		return err
	}
	r.ctr.SnapshotsRestored++
	r.index = index
	r.table = table
	r.committed = at
	r.log.Clear()
	r.pruned = at
	// Proposals of ours the snapshot covers were delivered; where is unknown.
	if t := r.table[r.me]; t.oinc == uint32(r.inc) {
		r.resolveThrough(t.pseq, 0)
	}
	return nil
}

// snapshotBytes serialises the snapshot region contents at our commit point.
func (r *Replica) snapshotBytes() ([]byte, error) {
	data, err := r.fsm.Snapshot()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 16+r.n*16+len(data))
	binary.LittleEndian.PutUint64(b[0:], r.index)
	binary.LittleEndian.PutUint64(b[8:], uint64(r.n))
	for k, t := range r.table {
		w := b[16+k*16:]
		binary.LittleEndian.PutUint32(w[0:], uint32(r.cfg.Members[k]))
		binary.LittleEndian.PutUint32(w[4:], t.oinc)
		binary.LittleEndian.PutUint64(w[8:], t.pseq)
	}
	copy(b[16+r.n*16:], data)
	return b, nil
}

// nextAfter returns the Log entry following h, or nil. Within an epoch
// counts are consecutive, so a lookup of (e, cnt+1) usually finds it
// without allocating.
func (r *Replica) nextAfter(h MsgHdr) *entry {
	r.pivot.hdr = MsgHdr{E: h.E, Cnt: h.Cnt + 1}
	if e, ok := r.log.GetHint(&r.pivot, &r.getHint); ok {
		return e
	}
	var next *entry
	r.log.Ascend(&r.pivot, func(e *entry) bool {
		next = e
		return false
	})
	return next
}

// newEntry returns a Log entry holding a copy of data, carved from the
// replica's slabs (a slab is freed by the GC once no entry in it is live).
func (r *Replica) newEntry(hdr MsgHdr, id proposalID, data []byte) *entry {
	if len(r.entSlab) == 0 {
		r.entSlab = make([]entry, 256)
	}
	e := &r.entSlab[0]
	r.entSlab = r.entSlab[1:]
	*e = entry{hdr: hdr, id: id}
	if data != nil {
		e.data = r.copyData(data)
	}
	return e
}

// copyData copies data into the replica's data slab.
func (r *Replica) copyData(data []byte) []byte {
	n := len(data)
	if n > 4096 {
		return append([]byte(nil), data...)
	}
	if len(r.dataSlab) < n {
		r.dataSlab = make([]byte, 64<<10)
	}
	d := r.dataSlab[:n:n]
	r.dataSlab = r.dataSlab[n:]
	copy(d, data)
	return d
}

// ---- committing (Acuerdo Fig. 6) ----

func (r *Replica) uncommitted() int {
	if r.accepted.E != r.eCur || r.committed.E != r.eCur {
		return 0
	}
	return int(r.accepted.Cnt - r.committed.Cnt)
}

// commit is Acuerdo Fig. 6 l.69-91. The leader commits up to the header a
// majority of Accept_SST entries of its epoch reached (l.72-74); a follower
// up to its leader's Commit_SST entry of its epoch (l.76-77). Entries are
// delivered in Log order (l.79-88: a diff's entries, then the epoch's).
// Committed also advances to (E_cur, 0) when the diff commits, so that an
// empty diff's commit is visible to followers.
func (r *Replica) commit() bool {
	var bound MsgHdr
	switch r.role {
	case Leader:
		var vals [256]MsgHdr
		k := 0
		vals[k] = r.accepted
		k++
		for i := range r.mems {
			m := &r.mems[i]
			if i != r.me && m.valid[tAccept] {
				if h := m.acceptHdr(); h.E == r.eCur {
					vals[k] = h
					k++
				}
			}
		}
		q := r.quorum
		if r.bug == bugMinorityCommit {
			q--
		}
		if k < q {
			return false
		}
		s := vals[:k]
		slices.SortFunc(s, func(a, b MsgHdr) int {
			if b.Less(a) {
				return -1
			}
			if a.Less(b) {
				return 1
			}
			return 0
		})
		bound = s[q-1]
	case Follower:
		m := &r.mems[r.idxOf(r.eCur.Leader())]
		if !m.valid[tCommit] {
			return false
		}
		h := m.commitHdr()
		if h.E != r.eCur {
			return false
		}
		bound = minHdr(h, r.accepted)
	default:
		return false
	}
	if bound.E != r.eCur || !r.committed.Less(bound) {
		r.checkEpochDone()
		return false
	}
	batch := r.batch[:0]
	r.pivot.hdr = MsgHdr{E: r.committed.E, Cnt: r.committed.Cnt + 1}
	r.log.AscendHint(&r.pivot, func(e *entry) bool {
		if bound.Less(e.hdr) {
			return false
		}
		batch = append(batch, e)
		return true
	}, &r.ascHint)
	for _, e := range batch {
		r.deliver(e)
	}
	clear(batch)
	r.batch = batch[:0]
	r.committed = bound
	r.commitMoved = true
	if r.cfg.Trace != nil {
		r.tracef("node %d commits up to %v (delivered %d)", r.self, bound, r.index)
	}
	r.checkEpochDone()
	return true
}

// checkEpochDone notes when this epoch's diff has committed here
// (Committed >= (E_cur, 0)), also when a snapshot took us past it.
func (r *Replica) checkEpochDone() {
	if !r.epochDone && r.role != Electing && r.committed.E == r.eCur {
		r.epochDone = true
		r.event(EventEpochCommitted, r.eCur)
		r.newEpochCommitted()
	}
}

// deliver hands one committed entry to the application.
func (r *Replica) deliver(e *entry) {
	r.index++
	r.ctr.Delivered++
	r.fsm.Apply(r.index, e.data)
	if k := r.idxOf(e.id.origin); k >= 0 {
		r.table[k] = tableRec{oinc: e.id.oinc, pseq: e.id.pseq}
	}
	if e.id.origin == r.self && e.id.oinc == uint32(r.inc) {
		r.resolveThrough(e.id.pseq, r.index)
	}
}

// ---- timers and election (Acuerdo Fig. 7) ----

// timers runs the failure detector: a follower whose leader's heartbeat
// stopped, or a leader that has not heard from a majority, for
// ElectionTimeout starts electing; so does anyone who sees a vote for an
// epoch above the one it promised.
func (r *Replica) timers() bool {
	now := r.now
	switch r.role {
	case Follower:
		m := &r.mems[r.idxOf(r.eCur.Leader())]
		if m.hb != r.leaderHB {
			r.leaderHB = m.hb
			r.leaderHBAt = now
		}
		if m.inc != r.leaderInc {
			r.tracef("node %d: leader %d restarted", r.self, r.eCur.Leader())
			r.startElection(true)
			return true
		}
		if now-r.leaderHBAt > r.cfg.ElectionTimeout {
			r.tracef("node %d: leader %d timed out", r.self, r.eCur.Leader())
			r.startElection(true)
			return true
		}
	case Leader:
		heard := 1
		for i := range r.mems {
			if i != r.me && now-r.mems[i].heardAt <= r.cfg.ElectionTimeout {
				heard++
			}
		}
		if heard < r.quorum {
			r.tracef("node %d: leader lost its majority", r.self)
			r.startElection(true)
			return true
		}
	}
	if r.role != Electing {
		for i := range r.mems {
			m := &r.mems[i]
			if i != r.me && m.valid[tVote] && m.vote().ENew > r.eNew {
				r.tracef("node %d: sees vote %v from node %d", r.self, m.vote(), m.id)
				r.startElection(false)
				return true
			}
		}
	}
	return false
}

// startElection is Acuerdo Fig. 7 l.96-97: Role = ELECTING; a timeout makes
// the first round vote for self.
func (r *Replica) startElection(timedOut bool) {
	r.ctr.ElectionsStarted++
	r.role = Electing
	r.event(EventElecting, r.eCur)
	if timedOut {
		r.electAt = r.now
	} else {
		r.electAt = r.voteTimeout(r.now)
	}
	for i := range r.fol {
		r.fol[i] = follower{}
	}
}

// elect is one run of Acuerdo Fig. 7.
func (r *Replica) elect() bool {
	if r.catchingUp {
		return false // a restarted member counts as failed until caught up
	}
	// Fig. 7 l.98-99: votes_cpy = Vote_SST; mx = max_vote(votes_cpy).
	mx := r.vote
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && mx.Less(m.vote()) {
			mx = m.vote()
		}
	}
	timedOut := r.now >= r.electAt
	progress := false
	switch {
	case timedOut || mx.Acpt.Less(r.accepted):
		// Fig. 7 l.100-105: vote for self with a bigger epoch.
		e := newBiggerEpoch(r.eNew, mx.ENew, r.self)
		if !r.setVote(Vote{ENew: e, Acpt: r.accepted}) {
			return false
		}
		r.tracef("node %d votes for itself %v", r.self, r.vote)
		progress = true
	case r.vote.Less(mx) && !mx.Acpt.Less(r.accepted) && mx.ENew > r.eCur && mx.ENew >= r.eNew:
		// Fig. 7 l.106-111: join the max vote.
		if !r.setVote(mx) {
			return false
		}
		r.tracef("node %d joins vote %v", r.self, r.vote)
		progress = true
	}
	// Fig. 7 l.114-115: a majority holds our vote, and we are its candidate.
	if r.vote.ENew.Leader() != r.self || r.vote.ENew != r.eNew || r.vote.ENew <= r.eCur {
		return progress
	}
	votes := 1
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && m.vote() == r.vote {
			votes++
		}
	}
	if votes >= r.quorum {
		r.becomeLeader()
		progress = true
	}
	return progress
}

// setVote records the vote (E_new first, durably), then publishes it.
func (r *Replica) setVote(v Vote) bool {
	if v.ENew != r.eNew {
		if err := r.stable.Save(StableState{Incarnation: r.inc, ENew: v.ENew}); err != nil {
			r.tracef("node %d: save e_new: %v", r.self, err)
			return false
		}
	}
	r.eNew = v.ENew
	r.vote = v
	r.electAt = r.voteTimeout(r.now)
	return true
}

// becomeLeader is Acuerdo Fig. 7 l.116-126: Role = LEADER, Count = 0, and
// a diff to every member built from its Commit_SST entry. The leader's own
// diff is empty; accepting it (Fig. 5 l.58-66) sets E_cur and Accepted.
func (r *Replica) becomeLeader() {
	r.ctr.Elected++
	r.role = Leader
	r.count = 0
	r.eCur = r.eNew
	r.accepted = MsgHdr{E: r.eCur}
	r.epochDone = false
	r.tracef("node %d leads epoch %v", r.self, r.eCur)
	r.event(EventLeader, r.eCur)
	for i := range r.mems {
		r.mems[i].heardAt = r.now
		if i != r.me {
			r.startSync(i)
		}
	}
}

// ---- broadcasting (Acuerdo Fig. 4) and serving followers ----

// broadcast is Acuerdo Fig. 4 l.38-41: hdr = (E_new, ++Count), added to the
// Log (the leader is a receiver too); serve writes it to each follower.
func (r *Replica) broadcast(id proposalID, data []byte) MsgHdr {
	r.count++
	hdr := MsgHdr{E: r.eNew, Cnt: r.count}
	e := r.newEntry(hdr, id, nil)
	e.data = data
	r.log.SetHint(e, &r.setHint)
	r.accepted = hdr
	return hdr
}

// startSync begins a diff for member i (Acuerdo Fig. 7 l.119-126): base is
// comm_cpy[i], the diff runs to our Accepted.
func (r *Replica) startSync(i int) {
	m := &r.mems[i]
	f := &r.fol[i]
	*f = follower{state: fsSync, inc: m.inc, end: r.accepted, sentAt: r.now}
	if m.valid[tCommit] {
		f.base = m.commitHdr()
	}
	if f.base.Less(r.pruned) {
		f.snap = true
	}
	f.base = minHdr(f.base, r.accepted)
	f.packed = f.base
}

// serve writes what follower i needs next into its ring: the diff, then
// new messages as they are broadcast, while the ring has room.
func (r *Replica) serve(i int) bool {
	m := &r.mems[i]
	f := &r.fol[i]
	l := r.links[i]
	if m.inc == 0 || l.out.rinc != m.inc {
		return false
	}
	if f.state == fsIdle || f.inc != m.inc {
		r.startSync(i)
	}
	if f.state == fsStream {
		// A follower whose next entry was pruned, or that never accepted
		// the diff, is synced again.
		stalled := m.valid[tAccept] && m.acceptHdr().Less(f.end) && r.now-f.sentAt > 20*r.cfg.ElectionTimeout
		if f.next.Less(r.pruned) || stalled {
			r.tracef("node %d re-syncs node %d (stalled %v)", r.self, m.id, stalled)
			r.startSync(i)
		}
	}
	progress := false
	if f.state == fsSync {
		if !r.sendDiff(i, f, l) {
			return progress
		}
		progress = true
	}
	// Stream new messages (Fig. 4 l.41: outgoing_buff.send_to_all).
	for {
		next := r.nextAfter(f.next)
		if next == nil {
			break
		}
		size := recSize(entryMeta + len(next.data))
		if !l.out.room(size) {
			break
		}
		buf := l.out.reserve(size, r.inc)
		putMeta(buf[recHdr:], next.id)
		copy(buf[recHdr+entryMeta:], next.data)
		l.out.commitRecord(recHeader{len: entryMeta + len(next.data), kind: kMsg, hdr: next.hdr}, r.inc)
		f.next = next.hdr
		progress = true
	}
	return progress
}

// sendDiff writes the snapshot announcement and diff parts for follower i;
// it reports true once the whole diff is in the ring.
func (r *Replica) sendDiff(i int, f *follower, l *link) bool {
	if f.snap && !f.snapSent {
		if !l.out.room(recSize(snapRecLen)) {
			return false
		}
		b, err := r.snapshotBytes()
		if err != nil {
			r.tracef("node %d: snapshot: %v", r.self, err)
			return false
		}
		id := r.cfg.RegionBase + 1 + rdma.RegionID(r.n+i)
		if r.snaps[i] != nil {
			r.snaps[i].Close()
			r.snaps[i] = nil
		}
		reg, err := r.node.Register(id, len(b))
		if err != nil {
			r.tracef("node %d: register snapshot region: %v", r.self, err)
			return false
		}
		copy(reg.Bytes(), b)
		if err := reg.Grant(r.mems[i].id, rdma.PermRead); err != nil {
			reg.Close()
			return false
		}
		r.snaps[i] = reg
		f.base = r.committed
		f.packed = f.base
		buf := l.out.reserve(recSize(snapRecLen), r.inc)
		p := buf[recHdr:]
		binary.LittleEndian.PutUint64(p[0:], uint64(id))
		binary.LittleEndian.PutUint64(p[8:], uint64(len(b)))
		binary.LittleEndian.PutUint64(p[16:], xxhash.Sum64(b))
		binary.LittleEndian.PutUint64(p[24:], uint64(f.base.E))
		binary.LittleEndian.PutUint64(p[32:], f.base.Cnt)
		l.out.commitRecord(recHeader{len: snapRecLen, kind: kSnapshot, hdr: f.end}, r.inc)
		f.snapSent = true
		r.ctr.SnapshotsSent++
		r.tracef("node %d sends node %d a snapshot at %v (%d bytes)", r.self, r.mems[i].id, f.base, len(b))
	}
	var flags uint64
	if f.snap {
		flags = diffSnapshot
	}
	for {
		// Fig. 7 l.121-124: the entries h with comm_cpy[j] <= h <= Accepted,
		// packed into parts of at most MaxRecord bytes.
		p := r.scratch
		binary.LittleEndian.PutUint64(p[0:], uint64(f.base.E))
		binary.LittleEndian.PutUint64(p[8:], f.base.Cnt)
		binary.LittleEndian.PutUint64(p[16:], flags)
		n := diffHdr
		last := f.packed
		more := false
		r.log.Ascend(&entry{hdr: MsgHdr{E: f.packed.E, Cnt: f.packed.Cnt + 1}}, func(e *entry) bool {
			if f.end.Less(e.hdr) {
				return false
			}
			if n+diffEntrySize(e) > len(p) {
				more = true
				return false
			}
			n += putDiffEntry(p[n:], e)
			last = e.hdr
			return true
		})
		kind := uint8(kDiffEnd)
		if more {
			kind = kDiffPart
		}
		size := recSize(n)
		if !l.out.room(size) {
			return false
		}
		buf := l.out.reserve(size, r.inc)
		copy(buf[recHdr:], p[:n])
		l.out.commitRecord(recHeader{len: n, kind: kind, hdr: f.end}, r.inc)
		f.packed = last
		if kind == kDiffEnd {
			f.state = fsStream
			f.next = f.end
			f.sentAt = r.now
			r.tracef("node %d sends node %d diff %v base %v", r.self, r.mems[i].id, f.end, f.base)
			return true
		}
	}
}

// ---- log bounds ----

// prune removes committed entries nobody is expected to need: below every
// member's Commit_SST entry heard within the timeout and every follower
// cursor, and in any case beyond MaxLogEntries committed entries (a member
// that far behind gets a snapshot).
func (r *Replica) prune() {
	floor := r.committed
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || r.now-m.heardAt > r.cfg.ElectionTimeout || !m.valid[tCommit] {
			continue
		}
		floor = minHdr(floor, m.commitHdr())
	}
	keep := MsgHdr{E: ^Epoch(0), Cnt: ^uint64(0)} // entries above keep are needed by a diff being sent
	if r.role == Leader {
		for i := range r.fol {
			f := &r.fol[i]
			switch f.state {
			case fsSync:
				keep = minHdr(keep, f.packed)
			case fsStream:
				floor = minHdr(floor, f.next)
			}
		}
	}
	floor = minHdr(floor, keep)
	ncommitted := r.log.Len()
	r.log.Reverse(func(e *entry) bool {
		if !r.committed.Less(e.hdr) {
			return false
		}
		ncommitted--
		return true
	})
	for {
		e, ok := r.log.Min()
		if !ok || r.committed.Less(e.hdr) {
			return
		}
		if floor.Less(e.hdr) && (ncommitted <= r.cfg.MaxLogEntries || keep.Less(e.hdr)) {
			return
		}
		r.log.PopMin()
		r.pruned = maxHdr(r.pruned, e.hdr)
		ncommitted--
	}
}

// ---- status ----

// Status is a snapshot of a replica's protocol state.
type Status struct {
	Self        rdma.NodeID
	Incarnation uint64
	Role        Role
	ECur, ENew  Epoch
	Accepted    MsgHdr
	Committed   MsgHdr
	Index       uint64 // entries delivered
	LogLen      int
	Pruned      MsgHdr
	Vote        Vote
	CatchingUp  bool
	Pending     int // proposals not yet resolved
	Counters    Counters
}

// Counters count protocol events since the replica started.
type Counters struct {
	Elected           uint64 // epochs this replica won
	ElectionsStarted  uint64 // times it became ELECTING
	DiffsAccepted     uint64 // diffs accepted (Fig. 5 l.54-66)
	DiffParts         uint64 // diff records received, parts and ends
	SnapshotsSent     uint64
	SnapshotsRestored uint64
	Reconnects        uint64 // Conns re-opened after breaking
	Requeued          uint64 // proposals handed back after an epoch ended without them
	Delivered         uint64
}

// Leader returns the leader's node id if this replica follows or leads an
// epoch.
func (s Status) Leader() (rdma.NodeID, bool) {
	if s.Role == Electing {
		return 0, false
	}
	return s.ECur.Leader(), true
}

func (r *Replica) publishStatus() {
	r.mu.Lock()
	pending := r.npending
	r.mu.Unlock()
	s := Status{Self: r.self, Incarnation: r.inc, Role: r.role, ECur: r.eCur, ENew: r.eNew,
		Accepted: r.accepted, Committed: r.committed, Index: r.index, LogLen: r.log.Len(),
		Pruned: r.pruned, Vote: r.vote, CatchingUp: r.catchingUp, Pending: pending, Counters: r.ctr}
	r.stmu.Lock()
	r.status = s
	r.stmu.Unlock()
}

// Status returns the state as of the last Poll; safe from any goroutine.
func (r *Replica) Status() Status {
	r.stmu.Lock()
	defer r.stmu.Unlock()
	return r.status
}
