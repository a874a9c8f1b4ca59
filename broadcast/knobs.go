package broadcast

import "time"

// testingKnobs are the planted bugs of this package's tests (STYLE.md: fault
// knobs live in one unexported struct, as CockroachDB's TestingKnobs do).
// Each switch makes a Replica break the protocol in one way that a
// checker must catch: TestSimMutants, TestSimAsymmetricMutant,
// TestLogBoundedMemberDown and TestSnapshotBehindCommit set them and
// require the property they name to fail. Production code never sets
// them: the zero value is the protocol as written, and every check is
// one read of a bool field of the Replica.
type testingKnobs struct {
	// noElectBackoff: a member that cannot run an election (pre-vote
	// failed, or catching up) tries again at every Poll (TestStuckGroupParks).
	noElectBackoff bool
	// minorityCommit: the leader commits without a majority (total order).
	minorityCommit bool
	// unboundedLog: a diff being sent holds the Log past MaxLogEntries
	// (log bound).
	unboundedLog bool
	// noPreVote: no pre-vote and no leader stickiness (stickiness).
	noPreVote bool
	// dupDeliver: a follower delivers the first entry of a commit batch
	// twice (duplication).
	dupDeliver bool
	// uncommitted: a follower delivers what it accepted, not what its
	// leader committed (total order).
	uncommitted bool
	// voteRule: Fig. 7 l.106 broken: join the max vote even when our log
	// is ahead of it (total order).
	voteRule bool
	// voteUnsaved: a vote is published before E_new is saved; it is saved
	// at the next Poll (promise lost).
	voteUnsaved bool
	// lateCommitRow: a member restarted from its disk withholds its
	// CommitSST row for its first two election timeouts (a schedule, not
	// a bug: rows land when they land). A leader must not sync it before
	// it has that row (TestSimAsyncSyncWaitsCommitRow).
	lateCommitRow bool
	// publishAsked: with an AsyncStable, a vote or an accept that raises
	// E_new is published once its save is asked for, not once it
	// completed (promise lost).
	publishAsked bool
	// snapRollback: a fetched snapshot is installed even behind our
	// commit point (rollback).
	snapRollback bool
	// slabLeak: a pruned entry keeps its data slab (slab bound).
	slabLeak bool
	// forceJoinUnforced: a member catching up joins any vote, not only a
	// forced one (total order).
	forceJoinUnforced bool

	// ackUnsynced: in Sync mode the AcceptSST row (and the leader's own
	// count) carries Accepted, not min(Accepted, dA): acknowledgements of
	// records not yet on disk (acknowledged lost).
	ackUnsynced bool
	// resumeOldEpoch: in Sync mode a member restarted from its log may
	// win the epoch it promised before the crash, counting the old votes
	// it sees; if it led that epoch and its log lost the entries, the
	// epoch gets two different entries at one header (total order).
	resumeOldEpoch bool
	// ackBeforeSnapSync: in Sync mode a diff that installs a network
	// snapshot counts in dA (the AcceptSST row) once its records are
	// synced, before the snapshot file is: a crash then leaves a log
	// naming a snapshot that is not there (durability promise).
	ackBeforeSnapSync bool
	// snapImgKept: a durable save's file image is not handed on to the
	// next capture's Persist, which makes a fresh one (its pages faulted
	// in beside the pollers): TestSnapImageReuse ("reuse:").
	snapImgKept bool
	// snapImgNoClear: an image handed on is written into without
	// clearing what the new state's Persist and the seal do not write
	// (paddings), so the file keeps an earlier image's bytes there
	// (TestSnapImageReuse: "pad:"). poisonSpareImg (tests, not a bug)
	// fills a handed-on image with 0xab before the capture takes it.
	snapImgNoClear, poisonSpareImg bool
	// saveGateIgnored: a periodic capture starts without taking the
	// Config.SaveGate, so that replicas sharing it save at once
	// (TestSaveGate: "overlap:"). saveGateKept: a replica keeps the gate
	// after its save (and captures again with it), so that the others never capture again
	// (TestSaveGate: "starved:"). saveGateUnfair: the last holder takes
	// a free gate again before a replica refused it, so that the first
	// in the poll order saves again and again (TestSaveGate:
	// "starved:").
	saveGateIgnored, saveGateKept, saveGateUnfair bool
	// netSaveUnsynced: the snapshot a diff installed goes to the store
	// before the diff's records are synced, so that the store's removal
	// of the snapshots it replaced can reach the disk before the log
	// names the install: a crash then leaves the installed snapshot and a
	// log that continues the removed one (TestNetSaveAfterDiffSynced,
	// and the simulator's checkInstallNamed in TestSimAsyncMutants:
	// "recoverable:").
	netSaveUnsynced bool
	// ackRefused: while the disk is full, the AcceptSST row (and a Sync
	// leader's own count) carries Accepted: it acknowledges the entries
	// of the batch the writer refused, which are not on disk (durability
	// promise).
	ackRefused bool
	// fullNoStepDown: a leader whose disk stays full keeps its epoch (not
	// a safety bug: the group stops taking writes although a majority
	// could log them; TestSimDiskFullLeaderStepsDown counts it).
	fullNoStepDown bool
	// fullElects: a follower whose disk is full starts an election when
	// its leader times out, and a leader refusing for full disks steps
	// down when fewer than a majority say they follow it (not a safety bug:
	// a group whose every disk is full then elects and has no leader
	// until space returns; TestSimDiskFullAllMembers counts it).
	fullElects bool
	// noFullProbe: a writer that takes no record is never probed: a
	// member finds its disk full only when it has something to write
	// (TestSimDiskFullProbe).
	noFullProbe bool
	// spaceAlwaysPlenty: an idle writer's free-space answer counts as
	// plenty whatever it says (or a failed query): no probe, so a member
	// whose disk filled while idle never finds out (TestSimDiskFullProbe).
	spaceAlwaysPlenty bool
	// probeAlways: an idle writer gets a probe record every
	// fullProbeEvery election timeouts without asking for free space
	// first (the cost, not a safety bug: an idle group fsyncs for ever;
	// TestSimIdleNoProbeSync counts it).
	probeAlways bool
	// eagerCommit: a Commit record is appended like an entry, so that in
	// Sync mode it starts a batch, and an fsync, of its own (not a safety
	// bug: the cost TestSimSyncFsyncsPerEntry counts).
	eagerCommit bool
	// asyncNoBackpressure: in Async mode the replica accepts whatever
	// the disk's lag (async loss bound, with a slow disk).
	asyncNoBackpressure bool
	// timeOnlyBackpressure: Async back-pressure by age only, not by
	// queued bytes: larger batches and longer lags, which drive
	// TestSimAsyncResetEpochStart's scenario (not a bug by itself there).
	timeOnlyBackpressure bool
	// minorityRecovery: in Async mode a member restarted from its disk
	// votes in a recovery election once it heard one member fewer than
	// a majority of members restarted from their disks (total order, or
	// async loss bound).
	minorityRecovery bool
	// overcountLost: a recovery election's winner counts the entries it
	// holds above its commit point as lost (async loss bound: the count
	// must be a lower bound).
	overcountLost bool
	// recoveryVoteEmpty: in a recovery election a member restarted from
	// its disk votes as if its log were empty (Acpt 0 instead of its
	// replayed Accepted, Fig. 7 l.103 and l.107's comparison): a winner
	// whose disk lacks entries the disks of a majority hold (async loss
	// bound: the protected prefix).
	recoveryVoteEmpty bool
	// uncounted: the goroutines of this kind run off the polling
	// goroutine without being counted in persisting, so Close does not
	// wait for them (persistDisk: a disk snapshot's Persist reads the
	// FSM's memory after Close returned, and its owner unmaps it then;
	// the SIGSEGV in capture.Persist of 3de1b0c). TestCloseWaitsForPersist.
	uncounted persistKind
	// closeSaveExpired (tests, not a bug): Close finds the time it gives
	// a disk snapshot's save under way to finish passed already (the
	// periodic save's closeSaveBudget and an install's closeSaveTimeout
	// both 0), and abandons the save (TestCloseLeavesNoTmp).
	closeSaveExpired bool
	// closeWaitsSave: Close lets a periodic disk snapshot's save under
	// way run until it ends, however long (and hands a persisted capture
	// to the store first), instead of abandoning it after closeSaveBudget:
	// a slow or queued save holds up the stop (TestCloseAbandonsHeldSave:
	// "waited:"). saveGateOpenAtClose: a closed SaveGate still lets a
	// replica that waited for it capture, so that the replicas of a
	// closing process save one after another as each closes
	// (TestSaveGateClosed: "queued:").
	closeWaitsSave, saveGateOpenAtClose bool
	// closeClock (tests, not a bug): closeDiskSnap reads this clock
	// instead of the wall clock and does not sleep between its Polls, so
	// that its budgets pass in a known number of Polls whatever the
	// machine's load (TestCloseAbandonsHeldSave).
	closeClock func() time.Time
	// repairUncounted: in Async mode a member restarted in Repair (its
	// log not replayed) neither counts among the members that lost their
	// memory in a recovery election's condition nor votes (repairVoter):
	// a majority crash that leaves one member from its disk and one in
	// Repair never elects again (liveness).
	repairUncounted bool
	// repairVoteZero: a member restarted in Repair votes in a recovery
	// election with Acpt 0, not with what its disk held before the
	// install that never became durable (Recovery.held): it joins any
	// candidate, one from its disk whose log is shorter than its own
	// among them, and with it wins while a member whose disk holds the
	// entries both had acknowledged is still down: the entries are lost
	// (TestSimAsyncRepairHeld: "async loss bound:").
	repairVoteZero bool

	// unsaved is voteUnsaved's state: E_new published, not saved yet.
	unsaved bool
}

// recoverKnobs are the planted bugs of recovery (loadFor, recoverFrom):
// plain functions, not a Replica's, so the knobs travel with the call
// (LoadFor and RecoverFrom pass the zero value, the rules as written).
type recoverKnobs struct {
	// staleSnapUsed: the log's last install is not consulted: a disk
	// snapshot taken before the diff that replaced the state (above the
	// snapshot its SnapMark names, below the diff) is chosen and
	// replayed over (kv's async-staggered seed 208). Caught by
	// TestRecoverStaleSnapshot ("state:").
	staleSnapUsed bool
}
