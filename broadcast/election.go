package broadcast

// The failure detector and the election (Acuerdo Fig. 7).

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
