package broadcast

import "github.com/rdmakv/rdmakv/rdma"

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
	SnapshotsRefused  uint64 // snapshot announcements larger than MaxSnapshot
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
	pending := int(r.npending.Load())
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
