// Package rdma is the one contract every rdmakv protocol rests on: regions
// of registered memory, reliable connections that post one-sided verbs
// (Write, Read, CompareAndSwap, FetchAdd) to a peer's region, selective
// completion signalling, and doorbells to park on instead of spinning.
//
// The protocols above (broadcast, multicast, kv, btree) only use these
// interfaces; three fabrics implement them with the same semantics, checked
// by one conformance suite (package fabrictest):
//
//   - mem: nodes in one process; direct copies. Also the simulator's fabric,
//     where a seeded scheduler decides when each queued op lands.
//   - shm: processes on one host; regions are files in /dev/shm mapped
//     MAP_SHARED, and a remote write is the initiator's own store into the
//     mapping, so the target's CPU takes no part.
//   - tcp: processes on many hosts; a software RNIC in each process applies
//     incoming verbs to its regions in connection order.
//
// # Semantics every fabric gives
//
//   - FIFO per Conn: if a later write is visible at the target, so is every
//     earlier one; completions are reported in posting order.
//   - Aligned 8-byte words are written and read atomically. Larger accesses
//     may be seen torn by a concurrent reader, so readers validate them with
//     a canary, version or checksum written in the same op.
//   - Bounds: an op outside its region fails with ErrBounds and touches no
//     memory. A missing region fails with ErrNoRegion.
//   - Permissions: reads need PermRead, writes PermWrite, atomics both. When
//     Region.Revoke returns nil, no op from that peer lands any more; the
//     peer's next op fails with ErrPermission. On shm a Revoke that times
//     out (ErrRevokeTimeout: the peer process is alive but stopped) leaves
//     the ops it had in flight free to land later (see Region.Revoke).
//   - Errors break the Conn (an RC queue pair's error state): the failing
//     op's Completion carries the cause, later posts fail with ErrConnBroken,
//     and the user reconnects explicitly with Node.Connect.
//   - A dead or unreachable peer makes ops fail with ErrPeerDead after the
//     fabric's timeout; nothing waits forever.
//   - A write posted with Notify rings the target's Doorbell after it is
//     visible; asynchronous completions ring the initiator's. Doorbell.Wait
//     spins briefly, then parks; the Seq/Wait protocol loses no wake-up.
//
// Words in regions are native-endian (all supported hosts are
// little-endian); use Load64 and Store64 for words that peers write.
package rdma
