// Package kv is the replicated hash table of rdmakv: the state machine
// every replica of a group applies, laid out in registered memory so that
// clients read it with one-sided reads and no server CPU. docs/kv.md is the
// design; layout.go declares every byte another process reads, once, with
// its drawing.
//
// # The story
//
// Updates (puts, deletes, compare-and-swaps, field merges, batches) enter through TRAM
// (package multicast), which orders them inside the group with Acuerdo
// (package broadcast) and across groups for batches; every replica applies
// them in the same order to its own Table. Gets never enter the log.
//
// A Table is a header, an index of 128-byte buckets of 7 slots, and heap
// regions of immutable records. A key hashes to two candidate buckets whose
// neighbours serve as shared overflow buckets, as in RACE hashing (Zuo et
// al., ATC '21): 28 possible slots, read in two 256-byte reads. A slot
// holds a version (the entry's index and the op's position: never reused)
// and where the record lies; a record carries the same version, its key and
// a check word, so a reader that validates it holds exactly the bytes of the
// write the slot named, whatever the memory went through since. When the
// index is 75% full it grows into a generation of four times the buckets
// while small (twice past 2^QuadGrowthLog buckets), a few buckets
// migrated per applied op, with no stop-the-world step; readers read
// the old generation before the new one while it migrates.
//
// A get (GroupReader) reads, in one posted list, the key's bucket pairs
// and the replica's header, then the record: two dependent reads on a hit,
// one on a miss. The header's layout counter (odd while a request of
// several ops is applied) brackets the round, so a get never sees a layout
// change or half a request. A linearizable get reads the leader, which
// publishes serving = E once its epoch E's diff committed and was applied,
// and reads the promise word (Acuerdo's E_new, through
// broadcast.Config.OnPromise) of f other members: f+1 members promising
// exactly E means, by quorum intersection with any later election, that no
// later leader existed when the get began. A stale-ok get reads one
// replica and reports how far behind it may be (Applied, AppliedAt,
// Behind).
//
// Requests larger than a client slot travel in parts (AppendPart) that each
// group stages in its replicated state, then a commit (AppendCommit)
// applies them as one request. Snapshots list the live slots on the
// polling goroutine and copy the immutable records on another (Persist);
// Restore validates everything before it changes anything.
//
// # Using it
//
// A server creates one Replica per group it hosts and hands them to its
// pollers (package poller: one per core, each waiting on the doorbells of
// the nodes of its replicas):
//
//	r, err := kv.NewReplica(kv.ReplicaConfig{Multicast: mcfg, Table: kv.TableConfig{SlotMap: m}}, node, stable)
//	g := poller.NewGroup(poller.GroupConfig{})
//	g.Add(r, node) // Replica is a poller.Task
//	go g.Run(ctx)
//
// Clients build requests with AppendRequest (AppendMulti for write
// combining) and multicast them with package multicast; each group's reply
// carries its Result (DecodeResult). Gets go through a GroupReader per
// group, one goroutine at a time:
//
//	gr := kv.NewGroupReader(clientNode, g, members, near)
//	res, err := gr.Get(key, kv.Linearizable) // or kv.StaleOK; GetCtx bounds it
//
// GroupReader is a polled state machine (Begin, Poll, Result), so the
// simulator drives gets and replicas from one seed; Get runs one in real
// time. Table methods (Apply, Snapshot, Restore: it is the broadcast.FSM
// multicast applies) run on the polling goroutine. ReadHeader and
// HeaderRegion let a monitor read a replica's header one-sided.
//
// # Contracts
//
//   - Linearizability: writes and linearizable gets are linearizable per
//     key; a batch over several groups is atomic within each group (a get
//     never sees part of one group's share) and ordered consistently across
//     groups by TRAM, but groups apply their shares at different instants.
//     The argument is in docs/kv.md, "Linearizable gets" and "Batches
//     across groups", and at the top of reader.go.
//   - Stale-ok gets return the key's state after entry Applied or a later
//     one, never older (internal/kvcheck.CheckStale).
//   - Exactly once: updates are deduplicated by TRAM; a retried request is
//     applied once and answered with its original reply.
//   - Conditions (CmpVersion, CmpValue) are all checked before anything of
//     a request is written; if one fails the group applies nothing.
//   - Regions: group g's table uses the ids from regions.KV(g) (the header,
//     60 index generations, up to 192 heap regions); limits on keys, values
//     and requests are TableConfig's.
//
// # Testing
//
// TestSim runs 2 groups x 3 replicas and 3 clients under crashes,
// partitions, stalled leaders, growth and full tables, checking every write
// and linearizable get with porcupine (internal/kvcheck) and stale-ok gets
// with CheckStale; -seed N, -seeds K and -simtrace select runs (package
// sim). TestSimMutants plants bugs (no promise quorum, gets that read only
// the new generation, ignored conditions, late promises) and requires the
// linearizability check to catch each. The metamorphic tests run one
// seeded sequence against many geometries and must agree with a Go map
// (TestMetamorphicCatchesMutants: a put that grows the index mid-request
// and ignored conditions); fuzz targets cover every decoder of bytes
// another process wrote. Real replica processes on shm are tested in
// internal/kvproc.
package kv
