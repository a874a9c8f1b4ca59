// Package kvproc runs one kv replica (kv.NewReplica: a TRAM replica whose
// application is the table) as an OS process on the shm fabric, so that a
// test can build a cluster of real processes, let clients of its own
// process (package client) load it, kill -9 or SIGSTOP replicas, restart
// them, and check the recorded history with internal/kvcheck.
//
// It is internal/mcproc's counterpart for kv, with the same control
// protocol (internal/childproc): the parent writes the Config as the first
// JSON line on the child's stdin, then requests, one JSON line each; the
// child writes one JSON Line per answer (carrying the request's id) and,
// unasked, a Line with an Event whenever its role changes (it starts or
// stops leading, starts or finishes catching up, restores a snapshot), so
// that the parent sees who leads without asking.
//
// A replica opens its own shm node (the cluster map's node
// Groups[Group][Replica], with the map's ShmDir and Name), builds its
// configuration with cluster.Map.ReplicaConfig, keeps its Acuerdo stable
// state in a broadcast.FileStable file, and is driven by
// a server.Process (the node runtime). EOF on stdin ends it cleanly: it stops
// polling, closes the replica and the node (which removes its shm files)
// and exits. A restarted replica (same Config, with Start StartExisting and
// the same StablePath) opens its node again, which removes the files its
// killed predecessor left behind, and rejoins its group with empty memory:
// it catches up by diff or snapshot.
//
// Proc is the parent's handle: Spawn starts a child (the caller says which
// executable and arguments make a process call Serve, e.g. a re-executed
// test binary); Status asks for its state; Signal stops and continues it.
package kvproc

import (
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
)

// Config describes one replica process: plain data, JSON-encoded on its
// stdin. Map must be the same in every process of a cluster (clients
// included) and on the shm fabric.
type Config struct {
	Map cluster.Map `json:"map"`
	// Group and Replica say which replica this is: node
	// Map.Groups[Group][Replica].
	Group   int `json:"group"`
	Replica int `json:"replica"`
	// Inc is the replica's incarnation as the parent counts them (1 for
	// the first start, 2 for the first restart, ...), echoed in Status.
	Inc int `json:"inc,omitempty"`
	// StablePath is the broadcast.FileStable file; "" keeps the stable
	// state in memory (the replica is then always new).
	StablePath string `json:"stable_path,omitempty"`
	// Start is broadcast.Config.Start: StartNew the first time, the
	// default StartExisting for a restart (which then needs the file).
	Start broadcast.StartMode `json:"start,omitempty"`
	// Spin and PeerTimeout are the node's shm.Options (0: the defaults;
	// a negative Spin parks at once); Spin is the poller's too.
	Spin        time.Duration `json:"spin,omitempty"`
	PeerTimeout time.Duration `json:"peer_timeout,omitempty"`
	// Tuning is handed to the replica's broadcast.Config (0: defaults).
	Tuning Tuning `json:"tuning"`
}

// Tuning is the part of broadcast.Config a test may want to set.
type Tuning struct {
	RingSize             int           `json:"ring_size,omitempty"`
	HeartbeatInterval    time.Duration `json:"heartbeat_interval,omitempty"`
	ElectionTimeout      time.Duration `json:"election_timeout,omitempty"`
	MaxLogEntries        int           `json:"max_log_entries,omitempty"`
	MaxCatchUpLogEntries int           `json:"max_catchup_log_entries,omitempty"`
	ProposeTimeout       time.Duration `json:"propose_timeout,omitempty"`
	ReconnectMin         time.Duration `json:"reconnect_min,omitempty"`
	ReconnectMax         time.Duration `json:"reconnect_max,omitempty"`
}

// Commands of the control protocol (Request.Cmd).
const (
	CmdStatus = "status" // answered with Status
)

// Request is one line from the parent.
type Request struct {
	ID  uint64 `json:"id"`
	Cmd string `json:"cmd"`
}

// Line is one line from the child: an answer (ID set, or Ready on the
// first line) or an event (Event set, ID 0).
type Line struct {
	ID     uint64  `json:"id,omitempty"`
	Ready  bool    `json:"ready,omitempty"`
	Pid    int     `json:"pid,omitempty"`
	Err    string  `json:"err,omitempty"`
	Status *Status `json:"status,omitempty"`
	// Event is a Status sent unasked when Leading, Epoch, CatchingUp or
	// SnapshotsRestored changed.
	Event *Status `json:"event,omitempty"`
}

// Status is a replica's state, as of its last few milliseconds of
// polling.
type Status struct {
	Group   int `json:"group"`
	Replica int `json:"replica"`
	Inc     int `json:"inc"`
	Pid     int `json:"pid"`
	// Leading and Epoch: broadcast.Replica.Leading (the leader of a
	// committed epoch, which serves linearizable gets).
	Leading bool            `json:"leading"`
	Epoch   broadcast.Epoch `json:"epoch"`
	// Delivered is the TRAM replica's delivery count; Applied the table's
	// last applied entry index (what gets report); Records the table's
	// live records.
	Delivered uint64 `json:"delivered"`
	Applied   uint64 `json:"applied"`
	Records   int    `json:"records"`
	// CatchingUp: the replica is catching up (broadcast.Status).
	CatchingUp bool `json:"catching_up"`
	// SnapshotsRestored counts snapshots this replica installed.
	SnapshotsRestored uint64 `json:"snapshots_restored"`
	// Dups, Gaps and Stale are multicast.Replica.Anomalies: zero in a
	// correct run.
	Dups  uint64 `json:"dups"`
	Gaps  uint64 `json:"gaps"`
	Stale uint64 `json:"stale"`
	// UnixNS is when the state was copied.
	UnixNS int64 `json:"unix_ns"`
}
