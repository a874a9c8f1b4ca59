package rdma

import (
	"errors"
	"fmt"
	"time"
)

// NodeID names one endpoint of a fabric. IDs are assigned by the cluster
// configuration; 0 is a valid ID.
type NodeID uint32

// RegionID names a registered region on its owner. The owner chooses it at
// Register time, so peers can address well-known regions (a protocol's
// AcceptSST, a ring buffer) without an exchange, as if rkeys were agreed in
// advance.
type RegionID uint32

// Perm is the access a region's owner grants to one peer.
type Perm uint8

// Permissions. Atomics (CompareAndSwap, FetchAdd) need PermReadWrite.
const (
	PermNone      Perm = 0
	PermRead      Perm = 1 << 0
	PermWrite     Perm = 1 << 1
	PermReadWrite      = PermRead | PermWrite
)

// String returns "none", "r", "w" or "rw".
func (p Perm) String() string {
	switch p & PermReadWrite {
	case PermRead:
		return "r"
	case PermWrite:
		return "w"
	case PermReadWrite:
		return "rw"
	}
	return "none"
}

// OpKind is the verb of a work request.
type OpKind uint8

// Verbs.
const (
	OpWrite OpKind = iota + 1
	OpRead
	OpCompareAndSwap
	OpFetchAdd
)

// String returns the verb's name.
func (k OpKind) String() string {
	switch k {
	case OpWrite:
		return "write"
	case OpRead:
		return "read"
	case OpCompareAndSwap:
		return "cas"
	case OpFetchAdd:
		return "faa"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Flags modify a work request.
type Flags uint8

const (
	// Signaled asks for a Completion when the op completes. Unsignaled ops
	// complete silently; a later signaled completion implies they completed
	// (selective signalling). Errors are always reported.
	Signaled Flags = 1 << iota
	// Notify rings the target node's doorbell once the write is visible,
	// like RDMA write-with-immediate on a completion channel. Use it on the
	// write a parked target waits for (a ring slot, a tail pointer, an SST
	// row), not on every write of a batch.
	Notify
)

// WR is a work request: one verb at (Region, Offset) on the connection's peer.
//
// Buffers follow RDMA rules: for a write, Buf must not be modified until the
// op completes (a fabric may read it at any time until then); for a read,
// Buf must not be read until the op completes. Post copies the WR itself.
type WR struct {
	ID      uint64 // caller's tag, returned in the Completion (wr_id)
	Kind    OpKind
	Flags   Flags
	Region  RegionID
	Offset  uint64
	Buf     []byte // write: source; read: destination
	Compare uint64 // CompareAndSwap: expected value
	Value   uint64 // CompareAndSwap: new value; FetchAdd: addend
}

// Completion reports a completed (or failed) work request.
type Completion struct {
	ID    uint64
	Kind  OpKind
	Value uint64 // CompareAndSwap, FetchAdd: the word's previous value
	Err   error  // nil on success; see OpError
}

// Conn is a reliable connection to one peer (an RC queue pair).
//
// Ops complete in the order they were posted. The first failed op puts the
// Conn in the error state, as an RC queue pair: that op's completion carries
// the cause, every later op fails with ErrConnBroken, and recovery is an
// explicit new Node.Connect. A Conn is used by one goroutine at a time.
type Conn interface {
	// Local is the initiating node, Peer the target.
	Local() NodeID
	Peer() NodeID
	// Post queues wr. It returns an error without posting if the Conn is
	// broken or closed, if the request is malformed (ErrUnaligned,
	// ErrInvalidOp) or if the send queue is full (ErrQueueFull: poll
	// completions and retry). Permission, bounds and peer failures are
	// reported in a Completion, never by Post.
	Post(wr WR) error
	// PostList posts wrs in order, as ibv_post_send does with a chain of
	// work requests: the same as calling Post on each, but a fabric may
	// amortise its per-post costs (locks, liveness and permission checks,
	// one system call) over the list. It returns how many were posted and,
	// if fewer than len(wrs), the error that stopped it at wrs[n].
	PostList(wrs []WR) (int, error)
	// Poll moves up to len(cs) completions into cs without blocking.
	Poll(cs []Completion) int
	// Wait blocks until a completion is available or timeout passes, then
	// polls. It returns 0 on timeout.
	Wait(cs []Completion, timeout time.Duration) int
	// Outstanding is the number of posted ops not yet completed.
	Outstanding() int
	// Err is nil while the Conn is usable and the cause once it is broken.
	Err() error
	// Close releases the Conn; outstanding ops may or may not land.
	Close() error
}

// Region is registered memory owned by this node.
type Region interface {
	ID() RegionID
	// Bytes is the owner's view of the memory, 8-byte aligned. Peers write
	// it concurrently: read words with Load64 and validate larger records
	// (canary, version, checksum); never keep slices of it after Close.
	Bytes() []byte
	// Grant sets peer's access. Granting PermNone is Revoke.
	Grant(peer NodeID, p Perm) error
	// Revoke removes peer's access at once: every op of peer on this
	// region that has not begun by then (tcp: that the RNIC has not begun
	// to apply) fails with ErrPermission and breaks its Conn. What it
	// returns says whether ops already under way may still land:
	//
	//   - nil: no write or atomic from peer lands any more, also when peer
	//     was mid-operation or its process has died. On mem and tcp every
	//     op is applied in this process under the region's lock, which
	//     Revoke takes, so this holds without waiting for the peer. On shm
	//     the peer's process stores into the memory itself, so Revoke
	//     waits until the ops it had in flight finished or that process is
	//     provably dead.
	//   - an error wrapping shm.ErrRevokeTimeout (shm only): a live peer
	//     process (stopped by SIGSTOP, or not scheduled) kept an op in
	//     flight for the whole revoke timeout, max(2*PeerTimeout, 1s).
	//     Later ops fail as above, but the ops in flight then (at most one
	//     Post or PostList run per Conn of that peer) may still land,
	//     whenever that process runs again. Revoke again to wait again (it
	//     returns nil once they drained), or Close the region: nothing
	//     lands in this node's memory after Close.
	//   - an error wrapping ErrClosed: the region is closed; nothing lands
	//     in it.
	Revoke(peer NodeID) error
	// Close deregisters the region; peers' later ops fail with ErrNoRegion.
	Close() error
}

// Doorbell lets a node park until a Notify write lands (or its own
// connections complete ops) instead of spinning.
//
// The protocol against lost wake-ups: read s := Seq(), look at memory, and
// if there is nothing to do call Wait(s, d). Any ring after the Seq read
// makes Wait return at once.
type Doorbell interface {
	// Seq counts rings so far.
	Seq() uint64
	// Wait returns true as soon as Seq() != seq, or false after timeout.
	// It spins for the node's spin budget before parking.
	Wait(seq uint64, timeout time.Duration) bool
	// Ring wakes the node from this process (a local proposal, shutdown).
	Ring()
}

// Node is one endpoint of a fabric: it owns regions, opens connections to
// peers and has one doorbell.
type Node interface {
	ID() NodeID
	// Register creates a zeroed region of size bytes (rounded up to 8).
	// ErrRegionExists if id is taken on this node.
	Register(id RegionID, size int) (Region, error)
	// Connect opens a new connection to peer. ErrUnknownPeer if the fabric
	// has no such node configured.
	Connect(peer NodeID) (Conn, error)
	Doorbell() Doorbell
	// Close closes every region and connection of the node.
	Close() error
}

// Sentinel errors. Errors from ops wrap one of these in an *OpError; test
// with errors.Is.
var (
	ErrPermission   = errors.New("rdma: permission denied")
	ErrBounds       = errors.New("rdma: access out of region bounds")
	ErrUnaligned    = errors.New("rdma: atomic target not 8-byte aligned")
	ErrInvalidOp    = errors.New("rdma: invalid work request")
	ErrNoRegion     = errors.New("rdma: no such region")
	ErrRegionExists = errors.New("rdma: region id already registered")
	ErrUnknownPeer  = errors.New("rdma: unknown peer")
	ErrPeerDead     = errors.New("rdma: peer unreachable or dead")
	ErrConnBroken   = errors.New("rdma: connection is in the error state")
	ErrQueueFull    = errors.New("rdma: send queue full")
	ErrClosed       = errors.New("rdma: closed")
)

// OpError describes a failed op.
type OpError struct {
	Op     OpKind
	Peer   NodeID
	Region RegionID
	Offset uint64
	Len    int
	Err    error
}

func (e *OpError) Error() string {
	return fmt.Sprintf("rdma: %s node %d region %d [%d,+%d): %v", e.Op, e.Peer, e.Region, e.Offset, e.Len, e.Err)
}

// Unwrap returns the sentinel cause.
func (e *OpError) Unwrap() error { return e.Err }

// PostEach is PostList for fabrics with nothing to amortise: Post on each
// work request in order, stopping at the first error.
func PostEach(c Conn, wrs []WR) (int, error) {
	for i := range wrs {
		if err := c.Post(wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// CheckWR validates the shape of a work request (not permissions or bounds,
// which the target checks). Fabrics call it in Post.
func CheckWR(wr *WR) error {
	switch wr.Kind {
	case OpWrite, OpRead:
		if len(wr.Buf) == 0 {
			return ErrInvalidOp
		}
	case OpCompareAndSwap, OpFetchAdd:
		if wr.Offset%8 != 0 {
			return ErrUnaligned
		}
	default:
		return ErrInvalidOp
	}
	return nil
}

// Len is the number of region bytes the op touches.
func (wr *WR) Len() int {
	if wr.Kind == OpCompareAndSwap || wr.Kind == OpFetchAdd {
		return 8
	}
	return len(wr.Buf)
}

// NeedPerm is the permission the target must hold for wr.
func (wr *WR) NeedPerm() Perm {
	switch wr.Kind {
	case OpRead:
		return PermRead
	case OpWrite:
		return PermWrite
	}
	return PermReadWrite
}

// InBounds reports whether [off, off+n) lies inside a region of size bytes,
// without overflow.
func InBounds(off uint64, n int, size int) bool {
	return n >= 0 && off <= uint64(size) && uint64(n) <= uint64(size)-off
}
