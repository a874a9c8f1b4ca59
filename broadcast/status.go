package broadcast

import (
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Status: what the replica shows other goroutines.

// Status is a snapshot of a replica's protocol state.
type Status struct {
	Self        rdma.NodeID
	Incarnation uint64
	Role        Role
	ECur, ENew  Epoch
	Accepted    MsgHdr
	Committed   MsgHdr
	Index       uint64 // entries delivered
	LogLen      int    // entries in the Log (at most MaxLogEntries committed ones plus the uncommitted)
	Slabs       int    // 64 KiB data slabs in use (Log entries and unresolved proposals)
	Pruned      MsgHdr
	Vote        Vote
	CatchingUp  bool
	Pending     int // proposals not yet resolved
	// Durable is dA, the last accepted header on disk (Sync; Accepted in
	// Memory mode); DiskErr the log failure that stopped the replica.
	Durable MsgHdr
	DiskErr error
	// FromDisk: this incarnation replayed its log at start (Sync: a full
	// voter at once; Async: catching up until a recovery election or a
	// diff); Repair: its log was corrupt, not replayed, and it
	// boots catching up.
	FromDisk, Repair bool
	// SeenIdx is the highest commit index this replica saw (its own
	// delivered count, or its leader's), as its Commit records keep it:
	// after a whole-group crash in Async mode, what recovery compares
	// with what the disks held (Counters.RecoveryLost).
	SeenIdx uint64
	// Async (counts since the replica started): RecoveryElections is the
	// recovery elections it won (its group restarted from its disks);
	// RecoveryLost the entries their winner found seen committed by a
	// member it heard and held by none of their disks, a lower bound of
	// what the group lost (EventRecovered); DiskLate the ring reads put
	// off because its oldest unsynced record was older than 2 x
	// FsyncInterval (back-pressure).
	RecoveryElections, RecoveryLost, DiskLate uint64
	// DiskFull (Sync, Async): the log found its disk full and refuses
	// records until a retry succeeds (DiskFullErr names the file): the
	// replica takes no new entry meanwhile (durable.go, "A full disk").
	// GroupDiskFull: this leader refuses proposals and appends with
	// ErrDiskFull (its own disk, or too few members that can log).
	DiskFull, GroupDiskFull bool
	DiskFullErr             error
	// StableSaveMax is the longest asynchronous save of the stable state
	// (Counters.StableSaves); StableFullErr the error of a save that
	// found the disk full, until one succeeds.
	StableSaveMax time.Duration
	StableFullErr error
	// Members is what this replica knows of each member (itself included),
	// in Config.Members order, as of its last heartbeat or role change; a
	// leader also says how it serves each one.
	Members  []MemberStatus
	Counters Counters
}

// MemberState is how a replica sees one member of its group.
type MemberState uint8

// Member states, as Status.Members reports them.
const (
	// MemberUnknown: never heard from (not started, or unreachable since
	// this replica started).
	MemberUnknown MemberState = iota
	// MemberSelf: this replica.
	MemberSelf
	// MemberUnreachable: heard from before, but none of its rows changed
	// for an election timeout (crashed, partitioned, or stopped).
	MemberUnreachable
	// MemberUp: its rows move (a follower's view of the others, or a
	// leader's view of a member it is not serving yet).
	MemberUp
	// MemberSyncing: the leader is sending it a diff (Acuerdo Fig. 7
	// l.119-126), from its Log.
	MemberSyncing
	// MemberSnapshot: the leader is catching it up with a snapshot (it
	// was behind the pruned Log, or restarted with empty memory).
	MemberSnapshot
	// MemberStreaming: the diff went out; the leader streams new
	// messages to it as they are broadcast.
	MemberStreaming
)

// String returns the state's name.
func (s MemberState) String() string {
	switch s {
	case MemberUnknown:
		return "unknown"
	case MemberSelf:
		return "self"
	case MemberUnreachable:
		return "unreachable"
	case MemberUp:
		return "up"
	case MemberSyncing:
		return "syncing"
	case MemberSnapshot:
		return "snapshot"
	case MemberStreaming:
		return "streaming"
	}
	return "state(?)"
}

// MemberStatus is what a replica knows of one member.
type MemberStatus struct {
	ID          rdma.NodeID
	State       MemberState
	Incarnation uint64 // of its rows; 0: never heard
	Accepted    MsgHdr // its AcceptSST row (a leader hears it; others may not)
	Committed   MsgHdr // its CommitSST row
	// HeardAt is when one of its rows last changed (the replica's clock,
	// as passed to Poll); Silent is how long ago that was, as of the
	// Status (0 for self).
	HeardAt time.Duration
	Silent  time.Duration
	LinkUp  bool // this replica's Conn to it is up
}

// Counters count protocol events since the replica started.
type Counters struct {
	Elected               uint64 // epochs this replica won
	ElectionsStarted      uint64 // times it became ELECTING
	ElectionsDeferred     uint64 // leader timeouts that did not start an election: another member still heard a leader (pre-vote), or its disk was full
	ElectBackoffs         uint64 // election attempts put off: the pre-vote failed, or the member was catching up (electRetry)
	ForcedVotes           uint64 // forced votes this replica cast (ForceLead)
	DiffsAccepted         uint64 // diffs accepted (Fig. 5 l.54-66)
	DiffParts             uint64 // diff records received, parts and ends
	SnapshotsTaken        uint64 // FSM captures this leader served (one serves every member behind)
	SnapshotsSent         uint64 // snapshot announcements to members
	SnapshotsRestored     uint64
	SnapshotsRefused      uint64 // snapshots larger than MaxSnapshot, not fetched
	SnapshotFetchesFailed uint64 // fetches abandoned: refused, malformed, or released by the leader
	Reconnects            uint64 // Conns re-opened after breaking
	Requeued              uint64 // proposals handed back after an epoch ended without them
	Delivered             uint64
	Duplicates            uint64 // keyed entries delivered as duplicates (not applied; counted in Delivered)
	DiskFull              uint64 // times the log found the disk full (episodes: the replica took no new entry until space returned)
	DiskFullRefused       uint64 // proposals and appends this leader refused with ErrDiskFull
	DiskFullStepDowns     uint64 // times this leader handed its group over because its disk stayed full
	DiskProbes            uint64 // records its log took only to find out whether the disk can write (it took no other for a while, and its disk is low on space)
	DiskSpaceChecks       uint64 // free-space queries (statfs) of its idle log; only a low answer is followed by a probe
	// StableSaves: saves of the stable state (E_new before a vote or an
	// accept of a new epoch) completed off the polling goroutine (an
	// AsyncStable); StableSaveNanos their total time, from the Poll that
	// asked to the one that reaped it; StableSavesFull the times a save
	// found the disk full (retried; nothing published meanwhile).
	StableSaves, StableSaveNanos, StableSavesFull uint64
	// DiskLateSpells (Async): the times its back-pressure began (the
	// oldest unsynced record older than 2 x FsyncInterval, or half the
	// log's MaxUnsyncedBytes queued: it took no new entry until the disk
	// caught up), as its Polls saw it; DiskLateNanos their total time,
	// from the Poll that found the replica late to the one that found it
	// caught up.
	DiskLateSpells, DiskLateNanos uint64
}

// Leader returns the leader's node id if this replica follows or leads an
// epoch.
func (s Status) Leader() (rdma.NodeID, bool) {
	if s.Role == Electing {
		return 0, false
	}
	return s.ECur.Leader(), true
}

// memberStatus fills ms with what we know of member i.
func (r *Replica) memberStatus(i int, ms *MemberStatus) {
	m := &r.mems[i]
	*ms = MemberStatus{ID: m.id, Incarnation: m.inc, HeardAt: m.heardAt}
	if i == r.me {
		ms.State, ms.Incarnation, ms.Accepted, ms.Committed, ms.HeardAt = MemberSelf, r.inc, r.accepted, r.committed, r.now
		return
	}
	ms.LinkUp = r.links[i].isUp()
	if m.valid[tAccept] {
		ms.Accepted = m.acceptHdr()
	}
	if m.valid[tCommit] {
		ms.Committed = m.commitHdr()
	}
	ms.Silent = r.now - m.heardAt
	switch {
	case m.inc == 0:
		ms.State = MemberUnknown
	case ms.Silent > r.cfg.ElectionTimeout:
		ms.State = MemberUnreachable
	case r.role != Leader || r.fol[i].state == fsIdle:
		ms.State = MemberUp
	case r.fol[i].state == fsStream:
		ms.State = MemberStreaming
	case r.fol[i].snap:
		ms.State = MemberSnapshot
	default:
		ms.State = MemberSyncing
	}
}

func (r *Replica) publishStatus() {
	pending := int(r.npending.Load())
	r.stmu.Lock()
	ms := r.status.Members
	if len(ms) != r.n || r.beat || r.role != r.status.Role {
		// The member view changes slowly: it is refreshed at heartbeats
		// and role changes, not in every Poll of the hot path.
		if len(ms) != r.n {
			ms = make([]MemberStatus, r.n)
		}
		for i := range ms {
			r.memberStatus(i, &ms[i])
		}
	}
	r.status = Status{Self: r.self, Incarnation: r.inc, Role: r.role, ECur: r.eCur, ENew: r.eNew,
		Accepted: r.accepted, Committed: r.committed, Index: r.index, LogLen: r.log.Len(),
		Slabs: int(r.slabs.live.Load()), Pruned: r.pruned, Vote: r.vote, CatchingUp: r.catchingUp,
		Pending: pending, Members: ms, Counters: r.ctr, Durable: r.durableHdr(),
		FromDisk: r.fromDisk, Repair: r.repair, SeenIdx: r.seenIdx,
		RecoveryElections: r.recElections, RecoveryLost: r.recLost, DiskLate: r.diskLateN}
	r.status.StableSaveMax, r.status.StableFullErr = r.saves.maxTook, r.saves.fullErr
	if r.saves.err != nil {
		r.status.DiskErr = r.saves.err
	}
	if r.dur != nil {
		if r.dur.err != nil {
			r.status.DiskErr = r.dur.err
		}
		r.status.DiskFull, r.status.GroupDiskFull = r.dur.full, r.fullRefuse
		if r.dur.full {
			r.status.DiskFullErr = r.dur.fullErr
		}
	}
	r.stmu.Unlock()
}

// Status returns the state as of the last Poll; safe from any goroutine.
func (r *Replica) Status() Status {
	r.stmu.Lock()
	defer r.stmu.Unlock()
	s := r.status
	s.Members = append([]MemberStatus(nil), s.Members...)
	return s
}
