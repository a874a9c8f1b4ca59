package kv

import "time"

// testingKnobs are the planted bugs of this package's tests (STYLE.md: fault
// knobs live in one unexported struct, as CockroachDB's TestingKnobs do),
// with the little state a bug needs. Each switch breaks the table or the
// reader in one way that a checker must catch: TestSimMutants (the
// linearizability check) and TestMetamorphicCatchesMutants (the comparison
// with a Go map) set them and require the check to fail. Production code
// never sets them: the zero value is the design as written, and every
// check is one read of a bool field of the Table or GroupReader.
type testingKnobs struct {
	// noQuorum (reader): gets trust the leader's serving word without the
	// promise quorum; the simulator also makes a deposed leader keep
	// saying it serves (lastServed).
	noQuorum bool
	// newGenOnly (reader): gets read only the new generation while the
	// index grows, missing keys not migrated yet.
	newGenOnly bool
	// noCondition (table): a compare-and-swap is applied without checking
	// its condition.
	noCondition bool
	// latePromise (table): a member's promise word is published 6 ms after
	// it changed, after its vote went out.
	latePromise bool
	// noRemigrate (table): an op of a request does not migrate its key's
	// buckets again after an earlier op of the request grew the index
	// (the bug the metamorphic tests found).
	noRemigrate bool
	// restoreDupUnchecked (table): Restore places a snapshot's records
	// without looking for an earlier one with the same key, so a
	// snapshot holding a key twice is accepted with both copies
	// (TestRestoreRefusesKeyTwice: "accepted:").
	restoreDupUnchecked bool
	// restoreKeeps (table): Restore keeps the table's records of keys the
	// snapshot lacks (it merges instead of replacing): caught by the
	// identical-tables check after a lagging follower's restore.
	restoreKeeps bool
	// serveEarly (replica): a new leader says it serves (the header's
	// serving word) from its election on, before its diff committed and
	// was applied: caught by the linearizability check when new leaders
	// stall after their election.
	serveEarly bool
	// staleSizeHints (ordered reader): the reader keeps the first used
	// size it learnt of a node and takes a read shorter than the node
	// (it grew since) as the node: the walk refuses it as torn (its used
	// bytes are not all there) on every attempt, and lookups of a grown
	// leaf give up.
	staleSizeHints bool
	// noRecordCheck (reader): a record is accepted without its check
	// word (TestSimTornMutants: a record half rewritten passes).
	noRecordCheck bool
	// anyVersion (reader): a record is accepted whatever its version,
	// not only the slot's.
	anyVersion bool
	// replayDropsOld (table): a growth during the log's replay
	// (Table.replaying) ends the migration without moving the old
	// generation's slots, so the keys placed before it are lost
	// (TestReplayGrowthKeepsRecords).
	replayDropsOld bool
	// movedFirst (table): migration sets a bucket's moved bit before it
	// copies the bucket's slots into the new generation.
	movedFirst bool
	// mergeReplaces (table): a merge into a fielded value replaces the
	// value with the merge's fields, dropping the fields it does not
	// name.
	mergeReplaces bool
	// lateCatchUp (table): SetCatchingUp notes the change but leaves it
	// to the next publication (an applied entry): the header keeps
	// saying a member that caught up cannot vote (TestSimMutants: the
	// simulator's header-versus-broadcast check).
	lateCatchUp bool
	// reuseInFlight (reader): a get posts to a member while a list of
	// an abandoned attempt is still out on it (the pending rule broken),
	// so that two reads may land in the member's buffers
	// (TestReaderPendingRule).
	reuseInFlight bool
	// readCatchingUp (reader): a stale-ok get answers from a member whose
	// header says it is catching up (restarted without its data), so a
	// key the group holds reads as not found (TestStaleOKSkipsCatchingUp).
	readCatchingUp bool
	// persistLive (table): a capture's Persist walks the table's live
	// index instead of the copy taken at capture, so applies after the
	// capture leak into the snapshot (TestCaptureIsStateAtCapture).
	persistLive bool
	// staleLiveBytes (table): an overwrite adds the new record's size to
	// liveBytes without taking the old one's off, so a capture's Size is
	// not what Persist writes (TestCaptureIsStateAtCapture).
	staleLiveBytes bool
	// shareSpare (table): a capture that reuses a released capture's
	// index copy leaves it for the next capture too, so two captures
	// alive at once (a network and a disk snapshot) copy the index into
	// one buffer.
	shareSpare bool
	// spareKeepsLast (table): offerSpare keeps the buffer offered last,
	// not the larger, so a capture persisted after a growth puts its
	// smaller index copy in place of the spare pre-faulted for the grown
	// index, and the next capture faults a fresh buffer in on the poller
	// (TestPrefaultedSpare).
	spareKeepsLast bool
	// readyIgnoresSpare (table): SnapshotReady says true while the spare
	// a capture needs is being made, so the capture copies the index
	// into a fresh buffer on the poller (TestSnapshotReady: "fresh:").
	// onSpareMaking (tests, not a bug) runs in the pre-fault goroutine
	// before it makes a spare.
	readyIgnoresSpare bool
	onSpareMaking     func()
	// spareIgnoresAfter (table): the spare's pre-fault goroutine does not
	// wait for TableConfig.SpareAfter, so a process's start makes its
	// tables' spares beside the builds of its other replicas
	// (TestSpareAfter: a spare made while the gate was shut).
	spareIgnoresAfter bool
	// handOnTwice (table): a capture's Release offers its index copy as
	// the spare although its Persist handed it on already, so a later
	// capture copies into the buffer of one alive (TestPersistHandsOnIndexCopy).
	handOnTwice bool
	// closeNoWait (table): Close unmaps the table's memory without
	// waiting for the captures' Persist walks under way, which then read
	// unmapped memory (SIGSEGV in capture.Persist: TestCloseWaitsForWalks).
	closeNoWait bool
	// walkAfterClose (table): a Persist that starts after Close walks
	// the unmapped table instead of refusing (TestCloseWaitsForWalks).
	walkAfterClose bool
	// onPersistWalk (tests, not a bug): called as a Persist starts its
	// walk, once Close counts it (and, with TableConfig.PersistGate,
	// once it holds its token); what it returns is called as the walk
	// ends, before the token is given back.
	onPersistWalk func() func()
	// persistYieldCount (table): Persist's walk yields its processor
	// every 4096 records whatever they cost (the rule before the time
	// slice), so a slow walk holds it for milliseconds
	// (TestPersistWalkSlices).
	persistYieldCount bool
	// walkClock (tests, not a bug): the clock of Persist's yields
	// instead of rdma.Mono; onWalkYield: called at each of its yields
	// with the records walked before it.
	walkClock   func() time.Duration
	onWalkYield func(recs int)
	// onCloseWait (tests, not a bug): called by Close just before it
	// waits for the Persist walks under way, with how many there are.
	onCloseWait func(walking int)

	// prefaultOnce (table): the heap's pre-fault goroutine is asked for
	// the first PrefaultHeap bytes of the heap only, not for the pages
	// ahead of the bump pointer as it moves (TestPrefaultHeap: pages
	// past the bump found unmapped).
	prefaultOnce bool
	// genNotPrefaulted (table): a new index generation is not asked of
	// the pre-fault goroutine (TestPrefaultHeap: its pages unmapped).
	genNotPrefaulted bool
	// touchChanges (table): the pre-fault goroutine touches a page with
	// a plain store of zero instead of an add of zero, overwriting what
	// the poller wrote there (TestPrefaultHeap: records changed).
	touchChanges bool

	// State of the bugs above (table).
	lastServed uint64 // noQuorum: the last epoch this table served
	promise    uint64 // latePromise: the promise not yet published
	promiseAt  int64  // latePromise: when it changed (TableConfig.Clock)
	// skipOrderedPublish (table): the ordered part's header is not
	// published after its applies (ordered.go, EndBatch), so a one-sided
	// reader's applied index lags the tree it reads (TestSimOrderedMutants).
	skipOrderedPublish bool
	// noPrefetch (table, not a bug): Prefetch and a multi request's
	// prefetch do nothing (prefetch.go); benchmarks and
	// TestPrefetchSameImage compare the apply with and without them.
	noPrefetch bool
	// prefetchMigrates (table): Prefetch migrates each key's old buckets
	// before the batch is applied: the table image differs from the one
	// the apply without prefetch leaves (TestPrefetchSameImage).
	prefetchMigrates bool
}
