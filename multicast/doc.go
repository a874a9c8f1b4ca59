// Package multicast implements TRAM, tree-based atomic multicast for shared
// memory ("Scaling atomic ordering in shared memory", Algorithms 1, 2 and 5,
// the normal case of Fig. 3 and the overlays of Fig. 4), across groups of
// replicas that each run an Acuerdo replica (package broadcast) as TRAM's
// ordering step inside a group. It is the store's ingress: every update of
// a client process, to one group or several, enters through the client's
// input rings and comes back as a reply written into the client's own
// memory. docs/multicast.md is the design; code names the algorithm and
// step it implements, e.g. "TRAM Alg. 5 steps 2-3".
//
// # The story
//
// Groups form a static tree known to clients and replicas (package tree:
// breadth, depth, base, or any tree given as text). A message to a set of
// groups is ordered first at their lowest common ancestor (lca), then, in
// that order, by each group on the paths down to the destinations.
//
//  1. A Client (Alg. 1) writes the message, with its id (client slot,
//     incarnation, sequence number), into its own input ring on every
//     replica of the lca: one RDMA write per replica, ending in a check
//     word.
//  2. The leader of a committed epoch (broadcast.Replica.Leading) scans its
//     input rings fairly, round robin over the client rings and the parent
//     ring, and orders what one scan finds in one log entry, a batch entry
//     of up to Config.MaxBatch messages written in place with
//     broadcast.Replica.AppendFunc (Alg. 2). For each message the entry
//     holds the message, the input position it consumed and the position
//     it takes in each child's parent ring, assigned now so that a later
//     leader re-forwards to the same places.
//  3. Every replica applies the committed entry (the unexported state, the
//     group's broadcast.FSM): it advances the input pointer, keeps the
//     record to forward per child, and, if the group is a destination,
//     hands the payload to the application's FSM and keeps the result in
//     the exactly-once table. An application implementing BatchFSM sees a
//     batch entry's messages between BeginBatch and EndBatch; their
//     replies are sent after EndBatch.
//  4. The leader, on commit, writes the record into the parent ring of
//     every replica of each child on the way, and the reply into the
//     client's reply region; children repeat from step 2.
//
// Flow control bounds every ring: a client has ClientSlots messages
// outstanding at most, and a parent assigns a child's parent-ring position
// only within ParentSlots of the child's credit (the position the child
// committed, which its leader writes back into the parent). Inside a group
// Acuerdo elects and repairs the log in place of TRAM's Algorithms 3 and 4
// (gathering permissions, group catchup);
// a new leader then runs the tree catch-up (Alg. 5): pointers from the
// applied log, every uncredited message written again to the same
// positions, every remembered reply and registration sent again. Lost
// writes are repeated until their effect shows (retransmission after
// RetransmitAfter with backoff; a client's retry word).
//
// # Using it
//
// Each replica of group g creates a Replica with the cluster's tree,
// members and client nodes, the application's broadcast.FSM and an Acuerdo
// stable store, and polls it with the node's other groups:
//
//	r, err := multicast.New(multicast.Config{Group: g, Tree: t, Members: members,
//		ClientNodes: clients, Broadcast: broadcast.Config{Self: self, Start: broadcast.StartNew}},
//		node, app, stable)
//	pg := poller.NewGroup(poller.GroupConfig{}) // Replica is a poller.Task
//	pg.Add(r, node)
//	pg.Add(r2, node)
//	go pg.Run(ctx)
//
//	c, err := multicast.StartClient(ctx, multicast.ClientConfig{Slot: k, Inc: uint64(time.Now().UnixNano()),
//		Tree: t, Members: members}, clientNode)
//	o, err := c.Do(ctx, tree.Of(1, 3), payload) // o.Replies: one per destination group
//
// Replica.Poll is the protocol step (Acuerdo's step, then TRAM's leader
// steps) and takes time as an input; call it from one goroutine. Client is
// a polled state machine too, so the simulator drives clients and replicas
// from one seed. A started client (StartClient) serves calls from any
// goroutine: Begin, Send and Wait (or Do) post and reap on the caller's
// goroutine, the first waiter polling for all (call.go). A client registers once per
// incarnation: every group's leader orders a reset of its slot and writes
// the incarnation into the client's hello word.
//
// # Contracts
//
//   - Validity, uniform agreement, uniform integrity, uniform prefix order
//     and acyclic order, with a majority of every group's replicas up and
//     connected: the paper defines them (Section 2.2) and proves them for
//     TRAM (Section 6, Lemmas 1-7); docs/multicast.md, "Guarantees", says
//     what they mean here, and package mcheck checks each in the
//     simulator.
//   - Exactly once: a message is delivered at most once per group, also
//     when the client retries or a new leader re-forwards it; a retried
//     message gets its original reply (Reply: group, delivery index, the
//     bytes Apply returned, truncated to MaxResult and flagged).
//   - Application: the FSM sees only the messages destined to its group, in
//     order, with consecutive indices.
//   - Regions: group g's replica uses the ids from regions.Multicast(g)
//     (client headers, input rings, parent ring, credits; layout.go draws
//     each), its Acuerdo replica regions.Broadcast(g) unless
//     Config.Broadcast.RegionBase is set, and a client's reply region is
//     regions.Client(Slot) unless ClientConfig.ReplyRegion is set.
//   - Limits: a payload fits one ring slot (MaxPayload(SlotSize)), at most
//     tree.MaxGroups groups.
//
// # Testing
//
// TestSim runs 4 groups of 3 replicas under each tree shape with crashes
// (memory lost), partitions, slow replicas, every leader crashed or cut off
// at once, back pressure, a replica down for good, client crashes, and
// batch entries with crashes aimed at them;
// -seed N, -seeds K and -simtrace select runs (package sim). TestSimMutants
// plants bugs (no deduplication, forwarding before commit, no tree
// catch-up, no flow control, replies before a batch is published) and requires the checker aimed at each to
// catch it. TestRealTime, TestSharedNodes and TestRealTimeTCP check the same
// properties in real time on the mem and tcp fabrics, TestRealProc with
// real processes on shm, and fuzz targets cover every decoder of bytes
// another process wrote.
package multicast
