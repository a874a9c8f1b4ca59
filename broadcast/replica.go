package broadcast

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

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
	// progressAt is when its AcceptSST row last changed: it accepted, or
	// fetched snapshot bytes (serve's stall check, prune's catch-up hold).
	progressAt time.Duration
	// aboveSince is since when its vote has been above our E_new (-1: it
	// is not); leader stickiness ignores such a vote for a while.
	aboveSince time.Duration
}

// follows is the epoch whose leader the member said it hears (0: none).
func (m *member) follows() Epoch { return Epoch(m.rows[tCommit][wFollows]) }

func (m *member) acceptHdr() MsgHdr {
	return MsgHdr{E: Epoch(m.rows[tAccept][0]), Cnt: m.rows[tAccept][1]}
}

func (m *member) commitHdr() MsgHdr {
	return MsgHdr{E: Epoch(m.rows[tCommit][0]), Cnt: m.rows[tCommit][1]}
}

func (m *member) vote() Vote {
	r := &m.rows[tVote]
	return Vote{ENew: Epoch(r[0]), Acpt: MsgHdr{E: Epoch(r[1]), Cnt: r[2]}, Forced: r[wForced] == 1}
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
	// ended: its end was read, and it waits for its E_new's save (the
	// end record stays in the ring and is read again: acceptDiffPart)
	ended bool
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
	reset    bool   // Async: the member's commit point is not in our history: it must install the snapshot (diffReset)
	snapSent bool
	next     MsgHdr // streaming: last header written to the follower's ring
	sentAt   time.Duration
}

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
	saves  stableSaves // the stable state's saves (stable.go)
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

	// snapshots (snapshot.go)
	snap        *leaderSnap // the one this leader serves, or is making
	snapSlot    int
	snapRetryAt time.Duration
	persisting  sync.WaitGroup // the goroutines startPersist runs; Close waits for them
	runPersist  func(func())   // runs a snapshot's Persist: a goroutine (tests: inline)
	fetched     uint64         // snapshot bytes fetched, all fetches: progress in our AcceptSST row

	// Acuerdo Fig. 1 l.11-17.
	eCur, eNew Epoch
	accepted   MsgHdr
	committed  MsgHdr
	count      uint64
	role       Role
	log        entryLog
	index      uint64 // entries delivered so far
	pruned     MsgHdr // every entry <= pruned left the Log
	catchingUp bool   // restarted with empty memory, no diff accepted yet
	recovering bool   // rejoined without stable state: E_new not learnt from a majority yet (recoverENew)

	// electingSince is when we last became ELECTING (startElection);
	// forcedAt when ForceLead cast our forced vote (force.go).
	electingSince, forcedAt time.Duration
	pendVote                *Vote // a vote decided, waiting for the save of its E_new (setVote)

	vote        Vote // our published VoteSST row
	electAt     time.Duration
	electFails  int // fruitless election attempts in a row (electRetry)
	leaderHB    uint64
	leaderHBAt  time.Duration
	leaderInc   uint64        // incarnation of the leader whose diff we accepted
	leaderSince time.Duration // when we became leader
	followed    int           // followedBy, as timers counted it in the last Poll (a leader)
	deferring   bool          // our leader timed out but another member still hears a leader: no election (pre-vote)
	heartbeat   uint64
	nextHB      time.Duration
	beat        bool // this Poll is a heartbeat
	commitMoved bool // Committed moved since our CommitSST row last went to all
	nextPrune   time.Duration
	myRows      [nTables]row
	sealed      [nTables]row  // myRows with their check words, as pushed
	epochDone   bool          // committed >= (eCur, 0): proposals may be handed over
	leading     atomic.Uint64 // E_cur while we lead it and epochDone, else 0 (Leading); set by setLeading
	table       []tableRec
	keys        keyTable // keyed proposals' last delivery per client (keyed.go)
	scratch     []byte
	acceptCur   slabCursor // accepted data is copied into slabs (arena.go); driver only
	commitVals  []MsgHdr   // commit's scratch: the Accept_SST headers of our epoch
	slabs       slabPool   // free data slabs, for acceptCur and propCur
	replies     replyArena // copies of FSM results for Proposal.Reply; driver only

	// proposals
	mu         sync.Mutex
	inbox      []*Proposal
	inboxLen   atomic.Int64 // len(inbox), read without the lock by Poll
	inboxSpare []*Proposal  // the inbox's other backing array, swapped in under mu
	propSlab   []Proposal   // handles are carved from it, under mu
	propCur    slabCursor   // proposal data copies are carved from it, under mu
	closed     bool
	waiting    []*Proposal // not handed to a leader, in pseq order
	inflight   []*Proposal // handed to the leader of inflight[i].epoch, fate unknown
	pseq       uint64
	npending   atomic.Int64 // len(inbox)+len(waiting)+len(inflight); added to under mu

	dur                              *durable      // Sync and Async modes' log (durable.go); nil in Memory mode
	fromDisk                         bool          // replayed its log at start
	bootENew                         Epoch         // E_new as the stable state held it at start (durable modes: never won again)
	repair                           bool          // its log was corrupt: catching up instead
	seenIdx                          uint64        // the highest commit index seen (durable modes: Commit records, async loss counting)
	recElections, recLost, diskLateN uint64        // Status.RecoveryElections, RecoveryLost, DiskLate
	recPending                       *Event        // a recovery election won, reported once the epoch commits
	fullRefuse                       bool          // a leader that refuses new entries with ErrDiskFull (durable.go, updateFull)
	electedFrom                      MsgHdr        // our Accepted when we won our epoch (Async: diffReset)
	bootAt                           time.Duration // the first Poll's time (-1 before it): the recovery election waits an election timeout after it
	closeUnsaved                     []string      // disk snapshots Close dropped or abandoned (ClosedUnsaved)

	now    time.Duration
	ctr    Counters
	knobs  testingKnobs // planted bugs, tests only (knobs.go)
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
	rejoin := false
	switch {
	case err != nil && cfg.Start != StartRejoin:
		return nil, fmt.Errorf("broadcast: member %d: %w (if its stable state is lost for good, start it with Start: StartRejoin)", cfg.Self, err)
	case err == nil && st.Incarnation > 0:
		// A restart with its stable state, whatever the mode.
	case cfg.Start == StartExisting:
		return nil, fmt.Errorf("broadcast: member %d: %w: a member that ran before must keep it (start a member of a new group with Start: StartNew, one whose state was lost with Start: StartRejoin): %w", cfg.Self, ErrNoStableState, ErrConfig)
	case cfg.Start == StartRejoin:
		if st.Incarnation >= cfg.RejoinIncarnation {
			return nil, fmt.Errorf("broadcast: member %d: rejoin incarnation %d is not above the %d found: %w", cfg.Self, cfg.RejoinIncarnation, st.Incarnation, ErrConfig)
		}
		st = StableState{Incarnation: cfg.RejoinIncarnation - 1}
		rejoin = true
	}
	r := &Replica{
		cfg:     cfg,
		node:    node,
		fsm:     fsm,
		stable:  stable,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5bd1e995)),
		self:    cfg.Self,
		n:       len(cfg.Members),
		quorum:  len(cfg.Members)/2 + 1,
		scratch: make([]byte, cfg.MaxRecord),
	}
	r.slabs.size(maxProposal(cfg.MaxRecord)) // entries up to a whole proposal reuse slabs
	r.runPersist = func(fn func()) { go fn() }
	if cfg.PersistInline {
		r.runPersist = func(fn func()) { fn() }
	}
	r.me = slices.Index(cfg.Members, cfg.Self)
	r.catchingUp = st.Incarnation > 0
	r.recovering = rejoin
	r.inc = st.Incarnation + 1
	r.eNew = st.ENew
	if err := stable.Save(StableState{Incarnation: r.inc, ENew: r.eNew}); err != nil {
		return nil, err
	}
	// The boot save is synchronous (not on a poller yet); later ones run
	// off the polling goroutine if the Stable can (stable.go).
	r.saves.saved = r.eNew
	r.saves.asked = r.eNew
	if a, ok := stable.(AsyncStable); ok {
		r.saves.async = a
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
		r.mems[i].aboveSince = -1
		if i != r.me {
			r.links[i] = r.newLink(id, i)
		}
	}
	r.role = Electing
	r.electAt = r.voteTimeout(0)
	r.bootAt = -1
	if cfg.Durability != Memory {
		r.dur = &durable{w: cfg.WAL, flushedFor: -1}
		r.bootENew = r.eNew
		async := cfg.Durability == Async
		switch rc := cfg.Recovery; {
		case rejoin:
			// No stable state: whatever the log holds, E_new is unknown;
			// rejoin as today (recoverENew), catching up.
		case rc != nil && rc.Repair:
			r.tracef("node %d: %s", r.self, rc.Reason)
			r.repair = true
		case rc != nil:
			// Plan §2: in Sync mode a member restarted from an intact log
			// is a full voter at once, with Accepted = dA.
			if err := r.replay(rc); err != nil {
				r.closeRegions()
				return nil, err
			}
			// Async (plan §2 "Async"): it may have acknowledged entries
			// its disk lost; it stays catching up, its log replayed, and
			// votes only in a recovery election (election.go).
			r.catchingUp = async && st.Incarnation > 0
		case async && st.Incarnation > 0:
			r.fromDisk = true // an empty log after a restart: dA is nothing, still a recovery voter
		default:
			r.catchingUp = false // an empty log: the initial state, durably
		}
		if rc := cfg.Recovery; rc != nil {
			rc.release() // replayed (or not to be: Repair, rejoin)
		}
	}
	if (r.catchingUp || r.dur != nil) && r.eNew != 0 {
		// Publish the promise we kept on disk (with no accepted header, so
		// that no candidate counts it): members of a smaller epoch see it
		// and elect past it, or we could never accept their diff (Fig. 5
		// l.54).
		r.vote = Vote{ENew: r.eNew}
	}
	if r.eNew != 0 && cfg.OnPromise != nil {
		cfg.OnPromise(r.eNew)
	}
	r.updateRows()
	r.publishStatus()
	r.tracef("node %d boots incarnation %d, e_new %v, catching up %v, rejoining %v", r.self, r.inc, r.eNew, r.catchingUp, r.recovering)
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
	r.waitPersist() // a Persist writes into a region we would close, or reads the FSM's memory
	if r.snap != nil {
		r.releaseSnap()
		r.waitPersist()
	}
}

// persistKind names what a goroutine of startPersist does.
type persistKind uint8

const (
	persistNet     persistKind = iota + 1 // a network snapshot's Persist into its regions (snapshot.go)
	persistRelease                        // a network snapshot's regions closed, its capture released
	persistDisk                           // a disk snapshot's Persist into its file image (snapstore.go)
	persistDiff                           // the file image of the snapshot a diff installed (durable.go)
)

// startPersist runs fn off the polling goroutine (runPersist), counted
// in persisting: Close waits for it. Every such goroutine must be: a
// snapshot's Persist reads the FSM's memory (kv's table: mapped heap
// regions), which its owner unmaps once Close returned.
func (r *Replica) startPersist(k persistKind, fn func()) {
	if r.knobs.uncounted == k {
		r.runPersist(fn) // planted: Close does not wait for it
		return
	}
	r.persisting.Add(1)
	r.runPersist(func() {
		defer r.persisting.Done()
		fn()
	})
}

// waitPersist waits for every goroutine startPersist runs (Close).
func (r *Replica) waitPersist() { r.persisting.Wait() }

// Close releases the replica's regions and connections and fails every
// proposal not yet resolved with ErrStopped (outcome unknown). Call it once
// nothing polls the replica any more (after its poller let it go).
func (r *Replica) Close() error {
	r.leading.Store(0)
	r.mu.Lock()
	r.closed = true
	ps := append(append(append([]*Proposal(nil), r.inbox...), r.waiting...), r.inflight...)
	r.inbox, r.waiting, r.inflight = nil, nil, nil
	r.npending.Store(0)
	r.mu.Unlock()
	for _, p := range ps {
		p.finish(0, nil, ErrStopped)
	}
	for _, l := range r.links {
		if l != nil {
			l.io.Close()
			l.stopFetch()
			if l.fetchDial != nil {
				l.fetchDial.Close()
			}
		}
	}
	r.closeRegions()
	r.closeDiskSnap() // after closeRegions: the Persist goroutines ended
	r.saveGateClose()
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
// elections, Stable.Save if the Stable is not an AsyncStable).
func (r *Replica) Poll(now time.Duration) bool {
	r.now = now
	if r.bootAt < 0 {
		r.bootAt = now
	}
	if r.saves.err != nil {
		return false // fail-stop: a save of the stable state failed (ErrDisk)
	}
	r.reapStable() // completions first: a vote or an accept may go out now
	if r.saves.err != nil {
		r.publishStatus()
		return false
	}
	walProgress := false
	if r.dur != nil {
		if r.dur.err != nil {
			return false // fail-stop: the log failed (ErrDisk)
		}
		walProgress = r.walPoll(now) // completions first: dA may have moved
		r.updateFull()
	}
	if r.knobs.unsaved {
		r.knobs.unsaved = false
		r.saveENew(r.eNew)
	}
	progress := false
	if r.role == Follower {
		// The commit path first: a follower accepts what its leader
		// streamed (Fig. 5 l.47-51) and pushes its AcceptSST row (l.52)
		// before anything else this Poll does. A record of a sender
		// incarnation readRows has not seen yet is left for later.
		if i := r.idxOf(r.eCur.Leader()); i >= 0 && i != r.me && r.links[i] != nil && r.links[i].isUp() && r.readRing(i) {
			progress = true
			r.push()
		}
	}
	if r.drainInbox() {
		progress = true
	}
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
	r.updateFull()
	r.readAcks()
	accepted := r.accepted
	for i := range r.ins {
		if i != r.me && r.readRing(i) {
			progress = true
		}
	}
	if r.role == Follower && r.accepted != accepted {
		// The leader waits for our AcceptSST row (Fig. 5 l.52) to commit:
		// push it before delivering what the leader committed.
		r.push()
	}
	if r.commit() {
		progress = true
	}
	if r.recovering && r.recoverENew() {
		progress = true
	}
	if r.timers() {
		progress = true
	}
	if r.role == Electing && r.elect() {
		progress = true
	}
	r.adoptSaved()
	// Proposals made while this Poll ran (a completion callback of
	// commit proposes the next message) go out in this Poll, not the next.
	if r.drainInbox() {
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
	if r.dur != nil {
		// This Poll's records go to the disk now (Sync: group commit).
		r.walCommit()
		r.diskSnapPoll()
		if r.walPoll(now) || walProgress {
			progress = true
		}
		r.updateFull() // for Append and AppendRoom until the next Poll
		if r.dur.err != nil {
			r.publishStatus()
			return progress
		}
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
	if r.dur != nil && r.dur.err != nil || r.saves.err != nil {
		return wal.Never // stopped (ErrDisk): no timer is worth a Poll
	}
	d := r.nextHB
	if r.role == Electing && !(r.electAt <= r.now && r.stableWaiting()) {
		// (An election step that waits for its vote's save is woken by
		// the save's completion.)
		d = min(d, r.electAt)
	}
	if s := &r.saves; s.full && s.retryAt > r.now {
		d = min(d, s.retryAt) // a save that found the disk full is asked again
	}
	for _, l := range r.links {
		if l != nil {
			d = min(d, l.io.NextDeadline())
		}
	}
	if r.dur != nil && r.dur.err == nil {
		d = min(d, r.dur.w.NextDeadline())
		if o := r.dur.w.OldestUnsynced(); o >= 0 && r.cfg.Durability == Async && o != r.dur.flushedFor {
			d = min(d, o+r.cfg.FsyncInterval) // walPoll flushes the writer then
		}
	}
	return d
}
