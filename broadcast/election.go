package broadcast

// The failure detector and the election (Acuerdo Fig. 7).

// timers runs the failure detector: a follower whose leader's heartbeat
// stopped, or a leader that no majority follows any more, for
// ElectionTimeout starts electing; so does a member that sees a vote for
// an epoch above the one it promised, unless it hears its leader
// (stickiness). Two rules beyond the paper keep a partial partition from
// making the group elect again and again (docs/broadcast.md, "Pre-vote and
// leader stickiness"):
//
//   - pre-vote: a member votes for itself with a new epoch (Fig. 7
//     l.100-105) only while a majority, itself included, says in fresh
//     CommitSST rows that it hears no leader (follows word 0). A follower
//     whose leader timed out without that majority defers: it stays a
//     follower of its epoch and takes its leader's stream again when the
//     link heals; a member cut off from the others cannot raise E_new;
//   - stickiness: a member that hears its leader ignores a higher vote
//     until it has stood for two election timeouts; a vote that stands
//     longer makes the group elect past it, since its voter can never
//     accept our epoch's diff (Fig. 5 l.54).
func (r *Replica) timers() bool {
	now := r.now
	switch r.role {
	case Follower:
		m := &r.mems[r.idxOf(r.eCur.Leader())]
		// A heartbeat counts while the leader says it leads our epoch
		// (follows): one that lost its majority and stepped down still
		// beats, but is no leader to stay with.
		if m.hb != r.leaderHB && m.follows() == r.eCur {
			r.leaderHB = m.hb
			r.leaderHBAt = now
			r.deferring = false
		}
		if m.inc != r.leaderInc {
			r.tracef("node %d: leader %d restarted", r.self, r.eCur.Leader())
			r.startElection(true)
			return true
		}
		if now-r.leaderHBAt > r.cfg.ElectionTimeout {
			if !r.preVote() || r.fullDefers() {
				if !r.deferring {
					r.deferring = true
					r.ctr.ElectionsDeferred++
					if r.diskFull() {
						r.tracef("node %d: leader %d timed out, but our disk is full: no election", r.self, r.eCur.Leader())
					} else {
						r.tracef("node %d: leader %d timed out, but no majority lost it: no election", r.self, r.eCur.Leader())
					}
				}
				return false
			}
			r.tracef("node %d: leader %d timed out", r.self, r.eCur.Leader())
			r.startElection(true)
			return true
		}
	case Leader:
		r.followed = r.followedBy()
		if r.followed < r.quorum && !r.fullKeeps() {
			r.tracef("node %d: leader lost its majority", r.self)
			r.startElection(true)
			return true
		}
		if r.fullStepDown() {
			return true
		}
	}
	if r.role != Electing {
		hears := r.follows() != 0
		for i := range r.mems {
			m := &r.mems[i]
			if i == r.me || !m.valid[tVote] || m.vote().ENew <= r.eNew {
				m.aboveSince = -1
				continue
			}
			if m.aboveSince < 0 {
				m.aboveSince = now
			}
			if hears && now-m.aboveSince <= 2*r.cfg.ElectionTimeout && !r.knobs.noPreVote {
				continue // leader stickiness
			}
			r.tracef("node %d: sees vote %v from node %d", r.self, m.vote(), m.id)
			r.startElection(false)
			return true
		}
	}
	return false
}

// follows is the epoch whose leader we hear now, as our CommitSST row
// says: E_cur at a follower whose leader's heartbeat moved within the
// election timeout, and at a leader that a majority follows; else 0.
func (r *Replica) follows() Epoch {
	switch r.role {
	case Follower:
		if r.now-r.leaderHBAt <= r.cfg.ElectionTimeout {
			return r.eCur
		}
	case Leader:
		if r.followed >= r.quorum { // as timers counted it in this Poll
			return r.eCur
		}
	}
	return 0
}

// followedBy counts the members (us included) that follow our leadership:
// heard within the election timeout and, once they had the time to take
// our diff, saying that they hear us. A leader that some members hear
// but that cannot reach them (a one-way partition) thus steps down,
// unless it refuses for full disks (fullKeeps: it counts the members it
// hears, and keeps its epoch even when they are fewer than a majority).
func (r *Replica) followedBy() int {
	k := 1
	settled := r.now-r.leaderSince > r.cfg.ElectionTimeout && !r.fullKeeps() // durable.go, "A full disk"
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && r.now-m.heardAt <= r.cfg.ElectionTimeout && (!settled || m.follows() == r.eCur) {
			k++
		}
	}
	return k
}

// preVote reports whether a majority, us included, hears no leader: the
// members whose CommitSST row we heard within the election timeout and
// says follows 0. Only then may we vote for ourselves with a new epoch.
func (r *Replica) preVote() bool {
	if r.knobs.noPreVote {
		return true
	}
	k := 1
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tCommit] && r.now-m.heardAt <= r.cfg.ElectionTimeout && m.follows() == 0 {
			k++
		}
	}
	return k >= r.quorum
}

// recoverENew is the first step of a member that rejoined without its
// stable state (StartRejoin): once it heard rows from a majority of the
// other members (f+1 of them, in this incarnation), it takes the highest
// epoch they show (a vote's e_new, an accepted or committed epoch, the
// epoch they follow) as its E_new, saves it, and publishes it like any
// restarted member (a vote with no accepted header). Any candidate that
// counted the vote this member forgot had the votes of f others, and f+1
// of the 2f others intersect them, so the promise it forgot is at or
// below what it takes now, as far as those members had published it.
// Until then it neither votes nor accepts a diff.
func (r *Replica) recoverENew() bool {
	heard := 0
	mx := r.eNew
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || m.inc == 0 {
			continue
		}
		any := false
		if m.valid[tVote] {
			mx, any = max(mx, m.vote().ENew, m.vote().Acpt.E), true
		}
		if m.valid[tAccept] {
			mx, any = max(mx, m.acceptHdr().E), true
		}
		if m.valid[tCommit] {
			mx, any = max(mx, m.commitHdr().E, m.follows()), true
		}
		if any {
			heard++
		}
	}
	if heard < r.quorum {
		return false
	}
	if !r.saveENew(mx) {
		return false // (an asynchronous save: a later Poll publishes it)
	}
	r.setENew(mx)
	r.recovering = false
	if mx != 0 {
		r.vote = Vote{ENew: mx}
	}
	r.tracef("node %d rejoins: e_new %v from %d members' rows", r.self, mx, heard)
	return true
}

// startElection is Acuerdo Fig. 7 l.96-97: Role = ELECTING; a timeout makes
// the first round vote for self.
func (r *Replica) startElection(timedOut bool) {
	r.ctr.ElectionsStarted++
	r.role = Electing
	r.electingSince = r.now
	r.setLeading()
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

// electRetry puts the next election attempt off when one could not run:
// the pre-vote found no majority that hears no leader (Fig. 7 l.100's
// guard), or the member is catching up and may not vote. The attempt
// waits an eighth of ElectionTimeout, doubled per fruitless attempt in a
// row up to 8 times it (the first retries come soon: a member that lost
// the race to notice a dead leader is not slowed), so that a group that
// cannot elect (a majority down, or
// restarted without its data) parks between attempts instead of polling
// in a loop; a vote that changes (setVote) resets it. No randomness is
// drawn: the wait only spaces out checks of memory that peers write.
func (r *Replica) electRetry() {
	r.ctr.ElectBackoffs++
	r.electAt = r.now + r.cfg.ElectionTimeout/8<<min(r.electFails, 6)
	r.electFails++
}

// elect is one run of Acuerdo Fig. 7.
func (r *Replica) elect() bool {
	if r.forcing() && r.now-r.forcedAt > forceExpiry*r.cfg.ElectionTimeout {
		r.expireForced()
	}
	if r.publishPending() {
		return true // a vote decided earlier, once its E_new is saved
	}
	if r.catchingUp && !(r.awaitsRecovery() && r.recoveryReady()) {
		// A restarted member counts as failed until caught up; it may
		// only join an operator's forced vote (force.go), or (Async,
		// restarted from its disk) vote in a recovery election.
		if r.joinForced() {
			return true
		}
		if r.now >= r.electAt && !r.knobs.noElectBackoff {
			r.electRetry()
		}
		return false
	}
	// Fig. 7 l.98-99: votes_cpy = Vote_SST; mx = max_vote(votes_cpy). (A
	// vote decided and waiting for its save counts as ours: myVote.)
	mx := r.myVote()
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && mx.Less(m.vote()) {
			mx = m.vote()
		}
	}
	if r.forcing() && r.vote.ENew < mx.ENew {
		return r.reforce(mx) // a member that kept its data voted above our forced vote
	}
	timedOut := r.now >= r.electAt
	progress := false
	acpt := r.accepted
	if r.knobs.recoveryVoteEmpty && r.recoveryVoter() {
		acpt = MsgHdr{}
	}
	repairing := r.catchingUp && r.repairVoter()
	if repairing {
		acpt = r.repairHeld() // it joins only (no state to lead with)
	}
	switch {
	case (timedOut || mx.Acpt.Less(acpt) && !r.knobs.voteRule) && !repairing && !r.forcing() && !r.seesForced() && !r.diskFull() && r.preVote():
		// Fig. 7 l.100-105: vote for self with a bigger epoch, once a
		// majority hears no leader (pre-vote).
		e := newBiggerEpoch(r.eNew, mx.ENew, r.self)
		if !r.setVote(Vote{ENew: e, Acpt: acpt}) {
			return false
		}
		r.tracef("node %d votes for itself %v", r.self, r.vote)
		progress = true
	case r.myVote().Less(mx) && (!mx.Acpt.Less(acpt) || r.knobs.voteRule) && mx.ENew > r.eCur && mx.ENew >= r.promised():
		// Fig. 7 l.106-111: join the max vote.
		if !r.setVote(mx) {
			return false
		}
		r.tracef("node %d joins vote %v", r.self, r.vote)
		progress = true
	}
	if timedOut && !progress && r.now >= r.electAt && !r.knobs.noElectBackoff {
		r.electRetry() // the pre-vote failed: try again later, not every Poll
	}
	// Fig. 7 l.114-115: a majority holds our vote, and we are its candidate.
	// (A member that joined our forced vote still counts once its flag
	// lapsed here: it joined while the vote was forced, force.go.)
	if r.vote.ENew.Leader() != r.self || r.vote.ENew != r.eNew || r.vote.ENew <= r.eCur {
		return progress
	}
	if r.pendVote != nil || r.vote.ENew < r.saves.asked {
		// A save of a bigger E_new was asked for (a vote decided since,
		// a diff): it may be on disk already, and we accept nothing below
		// it (promised), our own epoch included.
		return progress
	}
	if r.dur != nil && r.vote.ENew <= r.bootENew && !r.knobs.resumeOldEpoch {
		// Sync, Async: a member restarted from its log never wins an epoch it
		// promised in an earlier incarnation (it may have led it, and its
		// log may not show it): the votes of that epoch it sees are old.
		// It needs a new, bigger one (plan §2).
		return progress
	}
	if r.diskFull() {
		// Leading starts with our epoch's empty diff in the log, which
		// the writer refuses while the disk is full (durable.go).
		return progress
	}
	votes := 1
	for i := range r.mems {
		m := &r.mems[i]
		if v := m.vote(); i != r.me && m.valid[tVote] && v.ENew == r.vote.ENew && v.Acpt == r.vote.Acpt {
			votes++
		}
	}
	if votes >= r.quorum {
		r.becomeLeader()
		progress = true
	}
	return progress
}

// recoveryReady is the recovery election's condition (Async, plan §2
// "Async"): a member restarted from its disk votes, with Acpt = its
// replayed Accepted (dA), only once (i) it hears, within the election
// timeout, a majority of members (itself included) that restarted from
// their disks and wait for this election too (or restarted in Repair,
// which only join votes: repairVoter), so that at most a minority kept
// its memory; (ii) the pre-vote holds (a majority hears no leader);
// (iii) an election timeout passed since it booted, so that members that
// kept their memory show their votes first (they win by Fig. 7 l.106
// when their log is ahead). Before that it is catching up as in Memory
// mode: while a majority with memory may exist, a member whose disk may
// have lost what it acknowledged must not vote.
func (r *Replica) recoveryReady() bool {
	if r.bootAt < 0 || r.now-r.bootAt < r.cfg.ElectionTimeout {
		return false
	}
	k := 1
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && m.rows[tVote][wFromDisk] == 1 && r.now-m.heardAt <= r.cfg.ElectionTimeout {
			k++
		}
	}
	q := r.quorum
	if r.knobs.minorityRecovery {
		q--
	}
	return k >= q && r.preVote()
}

// recoveryLoss is the recovery election winner's count (plan §2,
// "Counting async loss"): the highest commit index any member it heard
// saw (its own and the from-disk voters' VoteSST rows) less what its log
// holds (its commit index and the entries above it, which its diff
// commits). Every entry counted was committed and is on none of those
// disks; entries seen by no one heard are not counted: a lower bound.
func (r *Replica) recoveryLoss() (lost, held uint64) {
	seen := r.seenIdx
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tVote] && m.rows[tVote][wFromDisk] == 1 {
			seen = max(seen, m.rows[tVote][wSeen])
		}
	}
	held = r.index + uint64(r.log.Len()-r.log.above(r.committed))
	if r.knobs.overcountLost {
		held = r.index
	}
	if seen > held {
		lost = seen - held
	}
	return lost, held
}

// recoveryCommitted reports a recovery election's outcome once the
// winner's epoch committed (checkEpochDone): the counters, a trace line
// and EventRecovered (the server logs it).
func (r *Replica) recoveryCommitted() {
	ev := r.recPending
	if ev == nil || r.role != Leader || ev.Epoch != r.eCur {
		return
	}
	r.recPending = nil
	r.recElections++
	r.recLost += ev.Lost
	r.tracef("node %d recovered the group at index %d from its log: %d entries seen committed before the outage are on no disk of the members that voted (async)", r.self, ev.Index, ev.Lost)
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(*ev)
	}
}

// setVote records the vote (E_new first, durably), then publishes it. With
// an AsyncStable whose save of v.ENew has not completed it reports false
// and keeps v as the vote decided (pendVote): the election goes on from
// it as if cast (myVote; the vote timeout restarts), and publishPending
// publishes it once the save completed.
func (r *Replica) setVote(v Vote) bool {
	if v.ENew != r.eNew && r.knobs.voteUnsaved {
		r.knobs.unsaved = true
	} else if v.ENew != r.eNew {
		if !r.saveENew(v.ENew) {
			if r.stableWaiting() && (r.pendVote == nil || *r.pendVote != v) {
				r.pendVote = &v
				r.electAt = r.voteTimeout(r.now)
				r.electFails = 0
			}
			return false
		}
	}
	r.pendVote = nil
	r.setENew(v.ENew)
	r.vote = v
	r.electAt = r.voteTimeout(r.now)
	r.electFails = 0
	return true
}

// myVote is our vote as the election sees it: the one decided and waiting
// for its save (pendVote), else the one published.
func (r *Replica) myVote() Vote {
	if r.pendVote != nil {
		return *r.pendVote
	}
	return r.vote
}

// publishPending publishes the vote setVote decided once its E_new is
// saved (and asks for the save again after a full disk); one overtaken (E_new moved past it: a diff accepted, a later
// vote published) is dropped.
func (r *Replica) publishPending() bool {
	p := r.pendVote
	switch {
	case p == nil:
		return false
	case r.eNew >= p.ENew:
		r.pendVote = nil
		return false
	}
	v := *p
	if !r.setVote(v) {
		return false // (asked again if a full disk failed the save)
	}
	r.tracef("node %d publishes its vote %v: its e_new is saved", r.self, v)
	return true
}

// becomeLeader is Acuerdo Fig. 7 l.116-126: Role = LEADER, Count = 0, and
// a diff to every member built from its Commit_SST entry. The leader's own
// diff is empty; accepting it (Fig. 5 l.58-66) sets E_cur and Accepted.
func (r *Replica) becomeLeader() {
	r.ctr.Elected++
	r.recPending = nil
	if r.catchingUp {
		// Async: a recovery election's winner. Its log is the group's
		// truth from here on (the most up-to-date durable log of the
		// majority that voted, Fig. 7 l.106). What was lost is counted
		// now, from the voters' rows (they clear their from-disk word
		// once they take our diff), and reported once our epoch's diff
		// commits (recoveryCommitted): a candidate whose voters went on
		// to a bigger vote leads an epoch that never commits.
		lost, held := r.recoveryLoss()
		r.catchingUp = false
		r.recPending = &Event{Kind: EventRecovered, Epoch: r.eNew, Lost: lost, Index: held}
	}
	r.role = Leader
	r.vote.Forced = false // won: the forced vote has done its work (force.go)
	r.count = 0
	r.eCur = r.eNew
	// Sync: the leader's own (empty) diff goes to the log, so that replay
	// finds E_cur and Accepted = (E, 0) (durable.go).
	r.walDiff(MsgHdr{E: r.eCur}, r.accepted, nil, MsgHdr{}, 0, nil, nil)
	r.electedFrom = r.accepted
	r.accepted = MsgHdr{E: r.eCur}
	r.epochDone = false
	r.setLeading()
	r.leaderSince = r.now
	r.followed = r.n // within its first election timeout every member heard counts
	r.tracef("node %d leads epoch %v", r.self, r.eCur)
	r.event(EventLeader, r.eCur)
	for i := range r.mems {
		r.mems[i].heardAt = r.now
		if i != r.me {
			r.startSync(i)
		}
	}
}

// setENew sets E_new (saved already) and reports it to Config.OnPromise
// before any row publishes it.
func (r *Replica) setENew(e Epoch) {
	changed := e != r.eNew
	r.eNew = e
	if changed && r.cfg.OnPromise != nil {
		r.cfg.OnPromise(e)
	}
}
