// Package mcproc runs one TRAM replica or one TRAM client (package
// multicast) as an OS process on the shm fabric, so that a test can build
// a cluster of real processes, kill -9 group leaders under load, restart
// them, and check the recorded history with multicast/mcheck.
//
// It is internal/groupproc's counterpart for multicast, with the same
// control protocol: the parent writes the Config as the first JSON line on
// the child's stdin, then requests, one JSON line each; the child writes
// one JSON Line per answer (carrying the request's id) and, unasked, one
// Line per event as it happens:
//
//   - a replica reports every delivery of its application FSM (group,
//     replica, incarnation, index, message id, result) and every snapshot
//     it restored (Restore: the index the snapshot covers), and answers
//     status requests (leading or not, delivered count, counters);
//   - a client runs a load (Config.Load: K goroutines multicasting to
//     random destination sets through a started multicast.Client, each
//     payload embedding its message id) and reports each message (id and
//     destinations) before it is sent, each outcome (id and replies) when
//     it completes, and each failed call; a stop request ends the load
//     (the calls in progress complete first) and is answered with the
//     load's counts.
//
// Event lines are queued by the goroutine that produces them and written
// by one writer goroutine, which flushes whenever its queue empties: a
// process killed with -9 loses at most the lines of the last few
// milliseconds, everything before them has reached the parent's pipe. A
// client's Multicast line is the exception: the client waits until it is
// in the pipe before it writes the message, so that the parent knows
// every message that may be delivered, also of a client killed with -9.
//
// EOF on stdin ends a process cleanly: it stops the load or the replica's
// polling, closes the replica or the client and the node (which removes
// its shm files) and exits. A restarted replica (same Config, with Start
// StartExisting and the same StablePath) opens its node again, which
// removes the files its killed predecessor left behind, and rejoins its
// group with empty memory: it catches up by diff or snapshot.
//
// Proc is the parent's handle: Spawn starts a child (the caller says which
// executable and arguments make a process call Serve, e.g. a re-executed
// test binary) and hands every event line to a callback.
package mcproc

import (
	"encoding/binary"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/mcheck"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// Roles a Config can give a process.
const (
	RoleReplica = "replica"
	RoleClient  = "client"
)

// Config describes one process: plain data, JSON-encoded on its stdin.
// The cluster fields must be the same in every process of a cluster.
type Config struct {
	// Role is RoleReplica or RoleClient.
	Role string `json:"role"`

	// ShmDir and ShmCluster name the shm cluster (shm.Options.Dir and
	// Cluster; ShmDir defaults to /dev/shm); Spin and PeerTimeout are the
	// node's shm.Options (0: the defaults; a negative Spin parks at once);
	// Spin is the poller's too.
	ShmDir      string        `json:"shm_dir,omitempty"`
	ShmCluster  string        `json:"shm_cluster"`
	Spin        time.Duration `json:"spin,omitempty"`
	PeerTimeout time.Duration `json:"peer_timeout,omitempty"`

	// Tree is the overlay as text (tree.Parse: "0:1,2", or a shape).
	Tree string `json:"tree"`
	// Members lists every group's replicas, indexed by group.
	Members [][]rdma.NodeID `json:"members"`
	// ClientNodes is multicast.Config.ClientNodes: the node of each
	// client slot.
	ClientNodes []rdma.NodeID `json:"client_nodes"`
	// Ring geometry (multicast.Config; 0: the defaults).
	ClientSlots int `json:"client_slots,omitempty"`
	ParentSlots int `json:"parent_slots,omitempty"`
	SlotSize    int `json:"slot_size,omitempty"`
	MaxResult   int `json:"max_result,omitempty"`
	// ReconnectMin and ReconnectMax bound the backoff of broken Conns
	// (replicas and clients; 0: broadcast's defaults).
	ReconnectMin time.Duration `json:"reconnect_min,omitempty"`
	ReconnectMax time.Duration `json:"reconnect_max,omitempty"`

	// Group and Replica say which replica this is (RoleReplica): node
	// Members[Group][Replica].
	Group   tree.Group `json:"group,omitempty"`
	Replica uint32     `json:"replica,omitempty"`
	// Inc is the replica's incarnation as the parent counts them (1 for
	// the first start, 2 for the first restart, ...): the incarnation its
	// Delivery and Restore lines carry, for mcheck.
	Inc int `json:"inc,omitempty"`
	// StablePath is the broadcast.FileStable file; "" keeps the stable
	// state in memory (the replica is then always new).
	StablePath string `json:"stable_path,omitempty"`
	// Start is broadcast.Config.Start: StartNew the first time, the
	// default StartExisting for a restart (which then needs the file).
	Start broadcast.StartMode `json:"start,omitempty"`
	// RetransmitAfter is multicast.Config.RetransmitAfter.
	RetransmitAfter time.Duration `json:"retransmit_after,omitempty"`
	// Tuning is handed to the replica's broadcast.Config.
	Tuning groupproc.Tuning `json:"tuning"`

	// Slot is the client's slot (RoleClient): node ClientNodes[Slot].
	Slot uint32 `json:"slot,omitempty"`
	// RetryAfter is multicast.ClientConfig.RetryAfter.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Load is the load the client runs from the start.
	Load LoadSpec `json:"load"`
}

// LoadSpec describes a client's load.
type LoadSpec struct {
	// Workers is the number of goroutines multicasting one message at a
	// time each; default the client's window (ClientSlots).
	Workers int `json:"workers,omitempty"`
	// PayloadSize is the payload's size, at least PayloadMin; default 64.
	PayloadSize int `json:"payload_size,omitempty"`
	// MaxDst bounds the number of destination groups of a message
	// (0: any nonempty subset of the groups, drawn uniformly).
	MaxDst int `json:"max_dst,omitempty"`
	// CallTimeout bounds one call; default 30 s. A call that ends
	// without an outcome is reported as a Failure.
	CallTimeout time.Duration `json:"call_timeout,omitempty"`
	// Seed seeds the destinations' draw.
	Seed uint64 `json:"seed,omitempty"`
}

// Commands of the control protocol (Request.Cmd).
const (
	CmdStatus   = "status"    // answered with Status (replica) or Load so far (client)
	CmdStopLoad = "stop-load" // client: end the load; answered with Load once its calls ended
)

// Request is one line from the parent.
type Request struct {
	ID  uint64 `json:"id"`
	Cmd string `json:"cmd"`
}

// Line is one line from the child: an answer (ID set, or Ready on the
// first line) or one event (exactly one of the event fields set).
type Line struct {
	ID    uint64 `json:"id,omitempty"`
	Ready bool   `json:"ready,omitempty"`
	Pid   int    `json:"pid,omitempty"`
	Err   string `json:"err,omitempty"`
	// ClientInc is the client's incarnation (on its Ready line).
	ClientInc uint64      `json:"client_inc,omitempty"`
	Status    *Status     `json:"status,omitempty"`
	Load      *LoadResult `json:"load,omitempty"`

	Deliver   *Delivery `json:"deliver,omitempty"`
	Restore   *Restore  `json:"restore,omitempty"`
	Multicast *Sent     `json:"multicast,omitempty"`
	Outcome   *Outcome  `json:"outcome,omitempty"`
	Failure   *Failure  `json:"failure,omitempty"`
}

// Delivery is one delivery of a replica's application FSM.
type Delivery struct {
	Group   tree.Group      `json:"g"`
	Replica uint32          `json:"r"`
	Inc     int             `json:"inc"`
	Index   uint64          `json:"i"`
	Msg     multicast.MsgID `json:"m"`
	Result  []byte          `json:"res"`
	// Malformed: the payload did not hold a message id.
	Malformed bool `json:"bad,omitempty"`
}

// Restore is a snapshot a replica's FSM restored: the group's sequence
// through Index.
type Restore struct {
	Group   tree.Group `json:"g"`
	Replica uint32     `json:"r"`
	Inc     int        `json:"inc"`
	Index   uint64     `json:"i"`
}

// Sent is a message a client is about to write: its id and destinations.
type Sent struct {
	Msg multicast.MsgID `json:"m"`
	Dst tree.Set        `json:"dst"`
}

// Outcome is a message's outcome at its client.
type Outcome struct {
	Msg     multicast.MsgID   `json:"m"`
	Dst     tree.Set          `json:"dst"`
	Replies []multicast.Reply `json:"replies"`
	Retries int               `json:"retries,omitempty"`
	// StartNS and DoneNS are the wall-clock times (Unix nanoseconds)
	// the call began and returned.
	StartNS int64 `json:"start_ns"`
	DoneNS  int64 `json:"done_ns"`
}

// Failure is something that must not happen: a client call that ended
// without an outcome (Msg is zero if its id was never assigned), or a
// replica's FSM seeing an index out of sequence or a bad snapshot.
type Failure struct {
	Msg multicast.MsgID `json:"m"`
	Dst tree.Set        `json:"dst,omitempty"`
	Err string          `json:"err"`
	// UnixNS is when it happened.
	UnixNS int64 `json:"unix_ns"`
}

// Status is a replica's state.
type Status struct {
	Group   tree.Group `json:"group"`
	Replica uint32     `json:"replica"`
	Inc     int        `json:"inc"`
	// Leading and Epoch: broadcast.Replica.Leading (the leader of a
	// committed epoch: TRAM's leader).
	Leading bool            `json:"leading"`
	Epoch   broadcast.Epoch `json:"epoch"`
	// Delivered is the application FSM's delivery index.
	Delivered uint64 `json:"delivered"`
	// Counters and the anomaly counts (multicast.Replica.Anomalies, zero
	// in a correct run), as of the last few milliseconds.
	Counters          multicast.Counters `json:"counters"`
	Dups, Gaps, Stale uint64
	// Broadcast is the group's Acuerdo replica's status.
	Broadcast broadcast.Status `json:"broadcast"`
}

// LoadResult counts a client's load.
type LoadResult struct {
	Multicast int `json:"multicast"` // messages handed to the client
	Completed int `json:"completed"` // outcomes
	Failed    int `json:"failed"`    // calls ended without an outcome
	Retried   int `json:"retried"`   // outcomes with Retries > 0
	Retries   int `json:"retries"`   // sum of Retries
}

// PayloadMin is the smallest payload: the message id.
const PayloadMin = 24

// Payload returns a payload of size bytes (at least PayloadMin) that
// embeds id: [client u32][0 u32][inc u64][seq u64] then filler, all
// little-endian (the layout multicast's simulator uses).
func Payload(id multicast.MsgID, size int) []byte {
	b := make([]byte, max(PayloadMin, size))
	binary.LittleEndian.PutUint32(b, id.Client)
	binary.LittleEndian.PutUint64(b[8:], id.Inc)
	binary.LittleEndian.PutUint64(b[16:], id.Seq)
	for i := PayloadMin; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

// PayloadID returns the message id a Payload embeds.
func PayloadID(b []byte) (multicast.MsgID, bool) {
	if len(b) < PayloadMin || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return multicast.MsgID{}, false
	}
	return multicast.MsgID{Client: binary.LittleEndian.Uint32(b), Inc: binary.LittleEndian.Uint64(b[8:]), Seq: binary.LittleEndian.Uint64(b[16:])}, true
}

// CheckID is a message id as mcheck knows it: the client slot and the low
// 32 bits of its incarnation, and the sequence number.
func CheckID(id multicast.MsgID) mcheck.MsgID {
	return mcheck.MsgID{Client: uint64(id.Client)<<32 | id.Inc&0xffffffff, Seq: id.Seq}
}
