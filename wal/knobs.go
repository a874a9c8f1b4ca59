package wal

// testingKnobs are the planted bugs of this package's tests (STYLE.md: one
// unexported struct, as in every package). Production code never sets
// them.
type testingKnobs struct {
	// retrySync: after a failed fsync the Writer syncs again and, if that
	// succeeds, counts the batch as durable (PostgreSQL's fsyncgate bug).
	// Caught by TestSyncErrorFailStop (Synced moved past a record that
	// is not on the disk).
	retrySync bool
	// cutCorrupt: Recover treats an invalid record as a torn tail even
	// when a valid batch follows it: it cuts synced records. Caught by
	// TestRecoverCorruptNotCut and FuzzRecover.
	cutCorrupt bool
	// ignoreShortWrite: a short write of a batch counts as written (the
	// next batch goes after its full length, leaving a hole). Caught by
	// TestShortWriteRewrites (records lost, corruption reported).
	ignoreShortWrite bool
	// keepFailedSegment: ENOSPC while creating the next segment leaves the
	// half-made file behind. Caught by TestDiskFullOnRotation (files
	// changed).
	keepFailedSegment bool
	// noRecoverSync: Recover returns what it read without syncing the
	// segments and the directory (a process crash leaves them in the
	// page cache only). Caught by TestRecoverCatchesNoRecoverSync.
	noRecoverSync bool
	// noZeroProbe: Recover takes a zero record header for the end of a
	// segment without probing the bytes after it, so a batch torn with
	// its first page lost stays in the log. Caught by
	// TestRecoverReadsWrittenPart (the torn tail is not cut).
	noZeroProbe bool
	// muxMixStreams: RecoverMux keys streams by their id's low byte
	// (streams 1 and 257 become one). Caught by TestMuxCatchesMixStreams
	// ("recover:" the split's seq check, or "stream N:" records differ).
	muxMixStreams bool
	// muxDropOwnMark: a Mux drops the segments one stream's DropBefore
	// mark passed, not every stream's: another stream's records above its
	// mark go. Caught by TestMuxCatchesDropOwnMark ("stream N: synced
	// record lost").
	muxDropOwnMark bool
	// muxNoEvidence: a Mux drops a segment holding a stream's last record
	// although no later record or marker of it is synced: the stream's
	// next seq is lost with it. Caught by TestMuxCatchesNoEvidence
	// ("stream N: next seq").
	muxNoEvidence bool
	// muxHideLoss: RecoverMux reports no corruption to a stream whose
	// records fell in a corrupt range of the log (the stream's seqs jump
	// over the loss unreported). Caught by TestMuxCatchesHideLoss ("stream
	// N: seq X follows Y" or "synced record lost").
	muxHideLoss bool
	// gatherUnbounded: the gather (Config.GatherWindow) holds a lone
	// stream's batch until another stream's record comes, past the
	// window: one writer's puts stall while no other stream writes.
	// Caught by TestMuxGather ("window:").
	gatherUnbounded bool
	// gatherKeepsHolding: the gather keeps holding a batch after the
	// streams it waits for wrote (the Mux notes only the batch's first
	// stream): every commit waits for the whole window. Caught by
	// TestMuxGather ("streams came:").
	gatherKeepsHolding bool
	// gatherWhileBusy: the gather also holds a batch whose first eager
	// record came while a batch was in flight (it waited for that fsync
	// already): the window adds to every batch under load. Caught by
	// TestMuxGather ("in flight:").
	gatherWhileBusy bool
	// prepareWhileBusy: a Mux prepares its device (Preparer) for a batch
	// whose first record came while a batch was in flight: the device's
	// goroutine spins for an IO the completion's Continue submits anyway.
	// Caught by TestMuxPrepare ("busy:").
	prepareWhileBusy bool
	// prepareEveryRecord: a Mux prepares its device at every eager
	// record, not once a batch. Caught by TestMuxPrepare ("once:").
	prepareEveryRecord bool
	// gatherNoPass: a stream the gather waits for keeps the batch held
	// after it was polled without appending (only its record or the
	// window ends the hold): a follower that accepts nothing this round
	// delays its leader's commit by the whole window. Caught by
	// TestMuxGather ("passed:").
	gatherNoPass bool
	// gatherAllGroups: a batch waits for every grouped stream of the log,
	// not only for the groups of its records: at one writer over two
	// groups each commit waits for the other group's replicas too.
	// Caught by TestMuxGather ("other group:").
	gatherAllGroups bool
	// gatherRound: the gather before groups (27 Nov, slog2): a batch
	// waits for the streams of the last round its first stream started,
	// released by their records or by the window alone, whatever Polls
	// ran. With the window the shared log had (50 us), followers polled
	// in the pass after their leader's, once the pass took longer than
	// the window, missed its batch: two fsyncs in series per commit.
	// Caught by TestGroupCommitOneFsync ("fsyncs:").
	gatherRound bool
	// continueNoStart: Mux.Continue does nothing (the next batch waits
	// for a stream's Poll, as before Continue: the device idles between a
	// sync and the next write while a poller is scheduled). Caught by TestMuxContinue ("continued:").
	continueNoStart bool
	// muxRefWrongTarget: RecoverMux resolves a reference to the whole
	// record before its target. Caught by resolveRef's length and hash check
	// (TestMuxRefCatches: "does not match it").
	muxRefWrongTarget bool
	// muxRefNoCheck: resolveRef skips the length and hash check. With
	// muxRefWrongTarget, caught by muxRun's comparison with what was
	// written (TestMuxRefCatches: "that it was not written").
	muxRefNoCheck bool
	// muxRefAcrossBatches: the Mux takes a table entry of an earlier
	// batch for a match (length and hash, no batch tag, no bytes): a
	// reference names a record of another batch, maybe of a segment
	// dropped since. Caught by resolveRef (TestMuxRefCatches: "not
	// earlier in its batch").
	muxRefAcrossBatches bool
	// muxStalePub: the Mux does not publish what its streams' getters
	// read without its mutex (Mux.publish): OldestUnsynced, Synced,
	// NextSeq, BytesWritten, UnsyncedBytes, Err and Full keep the values
	// they had when the stream was made. Caught by muxRun's check of every
	// getter against the locked state (TestMuxCatchesStalePub:
	// "published").
	muxStalePub bool
	// zeroAlignDown: a zero-ahead write (Config.ZeroAhead) starts at the
	// page boundary below the tail, not at the tail: it overwrites the
	// synced records of the tail's page with zeros. Caught by
	// TestMuxCatchesZeroAlignDown ("synced record lost" in the crash
	// seeds) and TestZeroAhead ("recovered:").
	zeroAlignDown bool
	// muxQuietKeepsFlush: Flush does not republish the Mux's quietUntil,
	// so the streams' Polls go on skipping until the open batch's
	// interval ends: a flush (a stopping process's, an Async replica's
	// at its interval) waits. Caught by TestMuxQuietPollsCatches
	// ("flush:"; muxRun flushes nothing).
	muxQuietKeepsFlush bool
	// muxQuietStaleAppend: an append does not republish quietUntil: the
	// first record of an empty batch leaves it at Never (nothing was
	// open), and the streams' Polls never start the batch. Caught by
	// TestMuxQuietPollsCatches ("interval:", and muxRun's check of
	// quietUntil: "quiet:").
	muxQuietStaleAppend bool
	// muxQuietInFlight: quietUntil is set while an IO is in flight
	// although the device does not continue the log after completions
	// (no SetDeviceContinues): nothing reaps the completion, and the
	// streams' Polls skip for ever. Caught by TestMuxQuietPollsCatches
	// ("synced:", and muxRun's "quiet:").
	muxQuietInFlight bool
	// muxQuietAlways: quietUntil is Never whatever the state: every
	// Stream Poll skips. The check's own planted case
	// (TestMuxQuietPollsCatches: muxRun's "quiet:").
	muxQuietAlways bool
}
