package broadcast

import (
	"fmt"
)

// An operator's way out of a group that lost the memory of a majority
// (docs/broadcast.md, "Forcing a leader"). In memory mode a member that
// restarts comes back without its Log and catching up: it neither votes
// nor self-votes until a leader's diff reaches it (Acuerdo's crash-stop
// model counts it as failed). With a majority catching up no leader can
// be elected, by design: the survivors alone are no majority, and a
// catching-up member cannot tell whether a member with more entries
// than the survivors' still lives.
//
// ForceLead is the operator telling it that none does: a survivor S
// self-votes <bigger epoch, S.Accepted> with the forced flag (VoteSST
// word wForced); a catching-up member may join that vote, and only that
// one: a forced vote in its candidate's own row, not yet expired. S then
// wins (Fig. 7 l.114), diffs the others (a snapshot: they hold nothing)
// and they leave catching-up through acceptDiff as after any restart.
// What this may lose: entries the old leader committed with the votes of
// members that then lost their memory, beyond S's Log.
//
// Nothing changes while nobody forces: the flag word is 0 and a
// catching-up member sees no forced vote to join.

// forceExpiry is, in election timeouts, how long a forced vote stays
// forced: a command that did not take effect then (the members catching
// up were not reachable) does not take effect later by surprise. Members
// that joined while it was forced still count for it (elect compares
// epoch and header, not the flag) until the candidate votes anew, which
// it does within two election timeouts of the lapse.
const forceExpiry = 4

// forcing reports whether our vote is our own forced vote.
func (r *Replica) forcing() bool { return r.vote.Forced && r.vote.ENew.Leader() == r.self }

// expireForced clears the forced flag of our vote (same epoch: nothing to
// save); members catching up no longer join it.
func (r *Replica) expireForced() {
	r.vote.Forced = false
	r.tracef("node %d: forced vote %v expired", r.self, r.vote)
}

// restartedRow reports whether member m's rows say it restarted without
// its memory and caught up with nobody yet: an incarnation after its
// first and nothing accepted (acceptDiff, the only way out of catching
// up, sets Accepted to a diff's header, never zero).
func restartedRow(m *member) bool {
	return m.valid[tAccept] && m.inc > 1 && m.acceptHdr() == MsgHdr{}
}

// ForceLead casts a forced vote for this replica (see above). confirm is
// the Accepted header the operator saw in this replica's status
// (Status().Accepted), what the group will go on from: if it moved since,
// the group moved, and the command refuses. (Not E_new: a stuck survivor
// raises it at each of its own fruitless election attempts.) It
// refuses, with an error wrapping ErrForceRefused that says why and no
// change of state, unless this replica:
//   - kept its memory (is not catching up, nor rejoining),
//   - is ELECTING and heard no leader for two election timeouts, and no
//     member it hears says it hears one,
//   - heard, within an election timeout, rows of a majority, itself
//     included, whose other members are catching up and linked to it
//     (they will see its vote),
//   - is not outnumbered: the members that kept their memory and that it
//     hears are no majority (they would elect without help), and none of
//     them accepted more than it did, or votes for a log longer than its
//     own (force from that one instead).
//
// It returns the forced vote's epoch. Call it from the goroutine that
// polls the replica (the server runs it through its poller's Handle.Do);
// the next Poll publishes the vote (with an AsyncStable, the Poll that
// finds its E_new saved: setVote).
func (r *Replica) ForceLead(confirm MsgHdr) (Epoch, error) {
	refuse := func(format string, args ...any) (Epoch, error) {
		return 0, fmt.Errorf("%w: node %d: %s", ErrForceRefused, r.self, fmt.Sprintf(format, args...))
	}
	et := r.cfg.ElectionTimeout
	switch {
	case r.recovering:
		return refuse("it rejoined without its stable state and has not learnt its promise from a majority yet")
	case r.catchingUp:
		return refuse("it restarted without its data itself (catching up): force from a member that kept its data")
	case r.role != Electing:
		return refuse("it is the %v of epoch %v: the group has a leader", r.role, r.eCur)
	case confirm != r.accepted:
		return refuse("it accepted %v, not %v as given: the group moved since its status was read", r.accepted, confirm)
	case r.now-r.electingSince < 2*et || r.now-r.leaderHBAt < 2*et:
		return refuse("it heard a leader less than 2 election timeouts (%v) ago: wait", 2*et)
	}
	heard, catching := 1, 0
	var voters []int
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || m.inc == 0 || r.now-m.heardAt > et {
			continue
		}
		heard++
		if m.valid[tCommit] && m.follows() != 0 {
			return refuse("node %d hears the leader of epoch %v", m.id, m.follows())
		}
		if restartedRow(m) {
			if l := r.links[i]; l != nil && l.isUp() {
				catching++ // it will see our vote
			}
			continue
		}
		voters = append(voters, i)
		if m.valid[tAccept] && r.accepted.Less(m.acceptHdr()) {
			return refuse("node %d, which kept its data, accepted %v, more than this node's %v: force from node %d", m.id, m.acceptHdr(), r.accepted, m.id)
		}
		// Its AcceptSST row reaches only its leader; while it elects, its
		// vote shows a log at least as long as its own (Fig. 7 l.102,
		// l.106), its candidate's.
		if v := m.vote(); m.valid[tVote] && r.accepted.Less(v.Acpt) {
			return refuse("node %d, which kept its data, votes %v: node %d's log reaches %v, beyond this node's %v: force from node %d", m.id, v, v.ENew.Leader(), v.Acpt, r.accepted, v.ENew.Leader())
		}
	}
	if 1+catching < r.quorum {
		return refuse("it hears %d of %d members, %d of them catching up: a forced vote needs a majority, itself and members catching up", heard, r.n, catching)
	}
	if 1+len(voters) >= r.quorum {
		return refuse("a majority that kept its data is up (%d of %d): the group elects without help", 1+len(voters), r.n)
	}
	// Fig. 7 l.100-105, forced: a bigger epoch than every vote we see.
	mx := r.vote
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && mx.Less(m.vote()) {
			mx = m.vote()
		}
	}
	e := newBiggerEpoch(r.eNew, mx.ENew, r.self)
	if !r.setVote(Vote{ENew: e, Acpt: r.accepted, Forced: true}) && r.pendVote == nil {
		return 0, fmt.Errorf("broadcast: node %d: saving the forced vote's E_new %v failed (see the trace): nothing published", r.self, e)
	}
	r.forcedAt = r.now
	r.ctr.ForcedVotes++
	r.tracef("node %d forces vote %v (%d of %d members heard, %d catching up)", r.self, r.vote, heard, r.n, catching)
	return e, nil
}

// reforce handles a vote mx above our forced vote, cast by a member that
// kept its data (a survivor that timed out before it saw ours): if its
// log is not ahead of ours, we force again above it, and it joins (it
// does not self-vote while it sees a forced vote it may join,
// seesForced); if it is ahead, the forced vote yields to Fig. 7.
func (r *Replica) reforce(mx Vote) bool {
	if r.accepted.Less(mx.Acpt) {
		r.expireForced()
		return true
	}
	e := newBiggerEpoch(r.eNew, mx.ENew, r.self)
	if !r.setVote(Vote{ENew: e, Acpt: r.accepted, Forced: true}) {
		return false
	}
	r.tracef("node %d forces again above %v: %v", r.self, mx, r.vote)
	return true
}

// seesForced reports whether a member we heard within the election
// timeout shows its own forced vote, one we may join (Fig. 7 l.106: its
// log is not behind ours): a member that kept its data then joins it
// rather than vote for itself.
func (r *Replica) seesForced() bool {
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || !m.valid[tVote] || r.now-m.heardAt > r.cfg.ElectionTimeout {
			continue
		}
		if v := m.vote(); v.Forced && v.ENew.Leader() == m.id && !v.Acpt.Less(r.accepted) {
			return true
		}
	}
	return false
}

// joinForced is a catching-up member's only vote: it joins the forced
// vote a candidate publishes in its own VoteSST row (Fig. 7 l.106-111,
// whose "my log is not ahead" holds: ours is empty), if it is above
// every promise we made. The forceJoinUnforced knob joins any vote.
func (r *Replica) joinForced() bool {
	if r.recovering {
		return false
	}
	var mx Vote
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || !m.valid[tVote] {
			continue
		}
		v := m.vote()
		if r.knobs.forceJoinUnforced {
			if mx.Less(v) {
				mx = v
			}
			continue
		}
		if v.Forced && v.ENew.Leader() == m.id && mx.Less(v) {
			mx = v
		}
	}
	if mx.ENew == 0 || !r.myVote().Less(mx) || mx.ENew <= r.eCur || mx.ENew < r.promised() {
		return false
	}
	if !r.setVote(mx) {
		return false
	}
	r.tracef("node %d, catching up, joins forced vote %v", r.self, r.vote)
	return true
}
