package multicast

// testingKnobs are the planted bugs of this package's tests (STYLE.md: fault
// knobs live in one unexported struct, as CockroachDB's TestingKnobs do).
// Each switch breaks TRAM in one way that the checker aimed at it must
// catch: TestSimMutants and TestIdleParks set them and require that
// checker to fail. Production code never sets them: the zero value is the
// protocol as written, and every check is one read of a bool field (the
// Replica's knobs; its state reads the same struct through a pointer).
type testingKnobs struct {
	// ownSpareEarly: Snapshot offers its own part's buffer to the next
	// Snapshot at once, not after its Persist copied it, so a capture
	// taken before the last one persisted overwrites it
	// (TestSnapshotOwnReuse).
	ownSpareEarly bool
	// noDedup: a leader takes whatever valid record sits in the slot of
	// its next input position, also one of an earlier lap (a message
	// re-forwarded or retried and already ordered), and Apply does not
	// drop duplicates: caught by ExactlyOnce.
	noDedup bool
	// forwardEarly: a leader forwards a message to its children when it
	// orders it, before it commits: caught when leaders crash
	// (ExactlyOnce or Validity).
	forwardEarly bool
	// noCatchUp: a new leader neither re-forwards what its predecessor
	// may not have (TRAM Alg. 5 steps 2-3) nor retransmits: caught by
	// Validity.
	noCatchUp bool
	// noFlowControl: positions are assigned in a child's parent ring
	// without waiting for its credit, overwriting unconsumed messages:
	// caught by Validity.
	noFlowControl bool
	// spinDeadline: a leader says it is always due, so its driver never
	// parks: caught by TestIdleParks.
	spinDeadline bool
	// skipCatchUp: a new leader's tree catch-up (TRAM Alg. 5 steps 2-3)
	// leaves out the newest message, the one a child most likely lacks.
	// Retransmission repairs it, so Validity holds: caught by the count
	// of retransmissions to children that a correct catch-up leaves at
	// zero (the sim's "catch-up" case).
	skipCatchUp bool
	// replyBeforePublish: Apply hands each reply of a batch entry to the
	// leader's reply path as its message is applied, before the
	// application's EndBatch published the batch (BatchFSM): caught by
	// the simulator's publish-order check on every reply.
	replyBeforePublish bool
	// staleSources: a leader does not add a client slot to the sources
	// its scan visits when it orders the slot's first registration (only
	// a new leadership rebuilds them), so a client that registered with
	// the leader in place is never read: caught by Validity.
	staleSources bool
	// headersOnce: a leader looks at the client headers once, when it
	// starts leading, and never again (hdrAt not re-armed), so a client
	// registering later, or asking again for replies a crash lost, is
	// not heard: caught as a run that does not converge (a restarted
	// client never ready).
	headersOnce bool
	// dropBusy: pollPeers drops a peer from its reap list after one reap,
	// writes in flight or not, so their completions (and a failure) are
	// reaped only when the peer's stage fills: caught by the simulator's
	// reap-list check (Replica.checkBusy).
	dropBusy bool

	// The started client's (Client.knobs; call.go), caught by
	// TestOnDoneHook and TestAwaitEarlyDeadline:
	// hookLost: OnDone on a call already done (its reply beat the hook,
	// as the client package's flush may see) does not queue the hook, so
	// it never runs: caught as the Waiter it settles never done.
	hookLost bool
	// releaseKeepsHook: Release leaves a pending hook queued, so it runs
	// on a call already back in the pool: caught as a released call's
	// hook running.
	releaseKeepsHook bool
	// earlySleeps: a waiter whose deadline is earlier than the end of the
	// parked reaper's park does not ring the doorbell, so nobody looks at
	// its deadline until that park ends: caught as the reaper's park
	// ending at its own deadline instead of by a ring.
	earlySleeps bool
}
