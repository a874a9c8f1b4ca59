// Package tcp is the rdma fabric for many hosts: every process runs a
// software RNIC that applies its peers' one-sided verbs to its own
// registered regions.
//
// A Node listens on Options.Listen. Node.Connect dials a peer (addresses
// come from Options.Peers and SetPeer) and opens one TCP connection per
// rdma.Conn, like an RC queue pair. The two nodes first run a versioned
// handshake in which each proves, with HMAC-SHA256 over fresh random
// nonces from both sides, that it holds the cluster secret (the secret
// itself never crosses the wire); a wrong node id, a wrong secret or a
// different protocol version is rejected with a clear error at the dialer
// (rdma.ErrUnknownPeer, ErrAuth, ErrVersion).
//
// After the handshake the initiator sends length-prefixed, versioned
// request frames (write, read, compare-and-swap, fetch-and-add, ping; the
// layout is drawn in wire.go). The target's RNIC, one goroutine per
// incoming connection, applies them strictly in order: for each op it
// takes the region's lock for reading, checks the initiator's permission
// and the bounds, and copies; Grant, Revoke and Region.Close take the lock
// for writing, so once Revoke returns no op of that peer lands any more. A
// Notify write rings the target node's Doorbell after it is applied. The
// RNIC answers reads and atomics with their results and acknowledges
// writes cumulatively ("applied through op N"), lazily: once its input runs
// dry if a write asked for it (signaled writes, every 64th op, and any
// while a quarter of the send queue is outstanding), and in any case every
// few hundred ops and on each keepalive ping. That frees the initiator's
// send queue slots and completes signaled ops in posting order, while an
// unsignaled write costs no ack frame and no wake-up of the initiator. The first op
// that fails (permission, bounds, missing region) is reported for that op
// and ends the connection: later ops fail with rdma.ErrConnBroken. A frame
// that is malformed, too long (Options.MaxFrame), of an unknown type, or
// sent before the handshake completed closes the connection without
// touching memory.
//
// Completions are queued on the Conn (rdma.CQ) and ring the initiator's
// Doorbell (rdma.LocalDoorbell), so a node may park instead of spinning.
//
// Performance: Post encodes the frame into a send buffer under the Conn's
// mutex (PostList encodes a whole list). When no answer is pending Post
// writes it itself (no goroutine hop on the latency path; TCP_NODELAY is
// set); otherwise a flusher goroutine sends everything posted while its
// previous write was in progress in one system call. Conn.Wait blocks in the network poller
// itself (on a duplicate descriptor) and handles the answer in the
// caller's goroutine, as a raw TCP client would; a reader goroutine serves
// users that park on the doorbell instead, and Poll drains the socket
// inline now and then when a caller spins on it. The RNIC reads through a
// large buffer with blocking system calls on a socket taken out of Go's
// network poller, so a request wakes its thread directly even when the
// process's goroutines are busy, and it coalesces its answers into one
// write per batch. Steady-state Post, Poll and Wait allocate nothing.
//
// Dead peers: each node pings the targets of its Conns every
// PeerTimeout/4. A Conn whose peer has sent nothing for PeerTimeout, or
// whose socket fails, fails every outstanding op with rdma.ErrPeerDead;
// Connect to an unreachable address fails within PeerTimeout. An RNIC
// drops an incoming connection that has been silent for twice
// PeerTimeout.
package tcp
