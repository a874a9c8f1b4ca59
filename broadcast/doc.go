// Package broadcast implements Acuerdo atomic broadcast (Izraelevitz et al.,
// ICPP '22, section 3, Figs. 1 and 4-7) inside one group of n = 2f+1
// replicas, over the rdma contract only: every replica talks to the others
// with one-sided writes into their registered memory and reads its own.
// docs/broadcast.md is the design; code names the figure and line it
// implements, e.g. "Acuerdo Fig. 7 l.100: vote for self".
//
// # The story
//
// A leader assigns each proposal a header (epoch, count) and writes it into
// a ring buffer at every follower (Fig. 4), one RDMA write per message with
// a checksum. Followers poll their rings, accept what they find as a batch
// and acknowledge only the last header in their AcceptSST row (Fig. 5). The
// leader commits when a majority of AcceptSST rows of its epoch reached a
// header, and followers commit up to the leader's CommitSST row (Fig. 6),
// delivering entries in order to the application's FSM. CommitSST rows,
// pushed periodically with a heartbeat counter, are the failure detector: a
// follower that stops seeing its leader's heartbeat elects (Fig. 7) a new
// leader that is guaranteed to be the most up-to-date of a majority, which
// sends each member a diff built from that member's commit point.
//
// Beyond the paper the package bounds memory (rings are finite, the Log is
// pruned), catches up replicas that fell behind the pruned Log or restarted
// with empty memory by a snapshot fetched with one-sided reads, keeps a
// partial partition from making the group elect again and again (pre-vote
// and leader stickiness over the SST rows), records its
// votes in a Stable store before publishing them, reconnects broken
// connections with backoff, and forwards proposals made at followers to
// the leader so that every proposer learns its proposal's outcome.
//
// # Using it
//
// Each member creates a Replica on its rdma.Node with the same Config
// member list, an FSM and a Stable store, and then polls it:
//
//	r, err := broadcast.New(broadcast.Config{Self: id, Members: ids, Start: broadcast.StartNew}, node, fsm, stable)
//	pg := poller.NewGroup(poller.GroupConfig{}) // or call r.Poll(now) yourself
//	pg.Add(r, node) // and other groups' replicas, on this node or others
//	go pg.Run(ctx)
//	p := r.Propose([]byte("x"))
//	index, err := p.Wait(ctx) // delivered at index, or ErrBusy/ErrTimeout: not delivered
//	result := p.Reply()       // what this replica's FSM.Apply returned for it
//
// FSM.Apply receives each committed Entry (index, header, data) and
// returns its result; the replica where the entry was proposed resolves
// the proposal with the result its own FSM returned (FSMs are
// deterministic, so every replica computes the same one and none travels
// on the wire). ProposeFunc takes a completion callback instead of
// returning a handle; the callback runs on the polling goroutine, so a
// closed-loop client that proposes its next message from it costs no
// goroutine hand-off per message. A layer above that orders its own
// entries uses Leading and Append instead: on the polling goroutine, the
// leader of an epoch whose diff committed appends entries that are
// broadcast like its proposals, without a handle and never retried.
//
// Replica.Poll(now) is the whole protocol: a deterministic step that reads
// local memory, runs the handlers, posts verbs and returns whether it made
// progress. Time (a time.Duration since any fixed origin) and randomness
// (Config.Seed) are inputs, so the simulator (package sim) drives the same
// code from a seed; a poller (package poller) runs it in real time,
// spinning briefly and then parking on its nodes' doorbells until
// NextDeadline. Poll must be called by
// one goroutine at a time; Propose, Status and the Proposal handles are safe
// from any goroutine, and so is Leading (whether this replica leads an
// epoch whose diff committed here). FSM methods, Config.Trace and
// Config.OnEvent (role changes and an epoch's first commit, to time
// elections) are called from Poll. Status reports the protocol state and Counters (elections, diffs,
// snapshots, reconnects).
//
// # The hot path
//
// In steady state nothing is allocated per message: proposal handles and
// data copies come from slabs, the Log is a ring buffer of entries by value
// (appends, pruning and the next-entry lookup are O(1)), records accepted
// from a ring are copied into a data slab. The leader writes the records a
// Poll produced to each follower as one RDMA write per contiguous run, and
// each Poll rings a peer's doorbell at most once: the last write to that
// peer carries Notify when any of them should wake it (a ring record, an
// AcceptSST or VoteSST row, a leader's moved commit point, a quarter-ring
// acknowledgement). Heartbeats and followers' commit points do not wake.
//
// # Contracts
//
//   - Delivery: every replica delivers the same sequence of entries, each at
//     most once, in the same order (indices 1, 2, ...); a replica that
//     catches up by snapshot restores the FSM and continues after it.
//   - Proposals: a Proposal resolves once: delivered at an index, or
//     ErrBusy / ErrTimeout / ErrTooLarge, which guarantee the data was not and
//     will not be delivered (retrying is safe). ErrStopped (the replica was
//     closed) leaves the outcome unknown.
//   - Persistence: a vote or an accept that raised E_new is published only
//     once a save of it completed (Stable.Save, or with an AsyncStable a
//     save run off the polling goroutine and reaped by a later Poll; a
//     failed one stops the replica with ErrDisk). Restarting with the same Stable and empty
//     memory is supported while at most f members are down or catching up.
//     A replica without stable state starts only as Config.Start says:
//     StartNew (a new group), StartRejoin (a lost disk: it learns E_new from
//     a majority and catches up), or not at all (the default).
//   - Snapshots: FSM.Snapshot is a cheap capture taken in Poll; Persist
//     runs on a goroutine of the replica's, and a RegionSnapshot is served
//     from the FSM's registered memory without a copy.
//   - Memory: the Log holds at most MaxLogEntries committed entries, or
//     MaxCatchUpLogEntries while a member that makes progress needs them;
//     proposals are at most MaxProposal bytes.
//   - Regions: a group uses region ids Config.RegionBase .. +n+4 on every
//     member; several groups on one node need disjoint ranges, which
//     rdma/regions hands out (regions.Broadcast(g)), and may share
//     one poller.
//   - Failures: n = 2f+1 members tolerate f crashed, partitioned or
//     catching-up members at once. In Memory mode (the default) nothing
//     but the stable state is durable: if more than f members lose their
//     memory at once (a whole-group restart included), committed entries
//     can be lost and restarted members wait for a diff forever, unless
//     an operator forces a survivor to lead (Replica.ForceLead: they may
//     join its forced vote, and what only the lost memories held is
//     lost). Config.Durability Sync loses no acknowledged entry while a
//     majority's disks survive; Async may lose, at a whole-group crash,
//     the entries committed within about 2 x FsyncInterval (plus two
//     batches' writes) before it, and its restarted members elect among
//     themselves once a majority of them is back (docs/broadcast.md,
//     "Durability").
//   - Testing: -seed N, -seeds K and -simtrace select simulator runs of
//     this package's tests (see package sim).
package broadcast
