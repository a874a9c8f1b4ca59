// Package groupproc runs one Acuerdo replica (package broadcast) as an OS
// process, so that tests and benchmarks can build a group of real
// processes, kill -9 one of them, restart it and compare what every member
// delivered.
//
// # The story
//
// A Member is one replica at work: an rdma node (shm, tcp, or any node the
// caller opened, e.g. on the mem fabric), a broadcast.Replica polled by a
// poller.Group of one poller on its own goroutine, an FSM that records what was
// delivered (Config.Record: every entry, for tests; otherwise a count and a
// running hash, so that benchmarks run for hours in bounded memory), with
// an optional ballast state of Config.StateBytes bytes captured copy on
// write for snapshots (large-snapshot catch-up benchmarks), and
// the protocol milestones with their times (for timing elections). A Member
// can also be its own client: Load keeps a window of proposals outstanding
// and measures commit latency.
//
// Serve makes a Member a process: the parent writes the Config as the first
// JSON line on the child's stdin and then requests, one JSON line each
// (propose, status, dump, events, load, stop-load); the child answers each
// with one JSON line carrying the request's id, in any order (a proposal is
// answered when it resolves). EOF on stdin closes the replica and the node
// and ends Serve, so a parent that dies takes its children with it.
//
// Proc is the parent's handle: Spawn starts a child (the caller says which
// executable and arguments make a process call Serve, e.g. a re-executed
// test binary), and its methods send requests and wait for answers. Kill is
// kill -9.
//
// # Restarts
//
// A member restarted with the same Config (same Self, same StablePath, same
// tcp address) and empty memory is what broadcast calls a restart: it loads
// its incarnation and promised epoch from the FileStable and catches up by
// diff or snapshot. On shm, opening the node removes the files its killed
// predecessor left behind.
package groupproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
)

// Fabrics a Config can open in a process of its own.
const (
	FabricShm = "shm"
	FabricTCP = "tcp"
)

// Config describes one member. It is JSON-encoded on the child's stdin, so
// every field is plain data. Zero fields take the documented defaults.
type Config struct {
	// Fabric is FabricShm or FabricTCP for Serve (see FabricSpec); Start
	// accepts a node of any fabric and ignores it.
	Fabric string `json:"fabric"`
	// Self is this member's node id, one of Members.
	Self rdma.NodeID `json:"self"`
	// Members is the group, the same list at every member.
	Members []rdma.NodeID `json:"members"`
	// ShmDir and ShmCluster name the shm cluster (shm.Options.Dir and
	// Cluster); ShmDir defaults to /dev/shm.
	ShmDir     string `json:"shm_dir,omitempty"`
	ShmCluster string `json:"shm_cluster,omitempty"`
	// Addrs maps every member to its tcp listen address (127.0.0.1:port);
	// this member listens on Addrs[Self].
	Addrs map[rdma.NodeID]string `json:"addrs,omitempty"`
	// Secret is the tcp cluster secret (at least tcp.MinSecret bytes).
	Secret []byte `json:"secret,omitempty"`
	// Spin is the fabric's doorbell spin budget (Options.Spin) and the
	// member's poller's: 0 means rdma.DefaultSpin, negative parks at once.
	Spin time.Duration `json:"spin,omitempty"`
	// PeerTimeout is the fabric's dead-peer timeout; 0 keeps the
	// fabric's default (2 s).
	PeerTimeout time.Duration `json:"peer_timeout,omitempty"`
	// StablePath is the broadcast.FileStable file; "" keeps the stable
	// state in memory (a restart is then a new member, which broadcast
	// does not support while others remember it).
	StablePath string `json:"stable_path,omitempty"`
	// Start is broadcast.Config.Start with a StablePath: StartNew for a
	// member of a group starting for the first time, the default
	// (StartExisting) for a restart, which then fails if the stable file
	// is gone. Without a StablePath the member is always new.
	Start broadcast.StartMode `json:"start,omitempty"`
	// Record makes the FSM keep every delivered entry (Dump returns them);
	// otherwise it keeps their count and a running hash only.
	Record bool `json:"record,omitempty"`
	// StateBytes gives the FSM a ballast state of that many bytes,
	// replicated like the rest of it (see FSM): a member behind the
	// leader's pruned Log catches up with a snapshot at least this large.
	StateBytes int64 `json:"state_bytes,omitempty"`
	// Tuning is handed to broadcast.Config.
	Tuning Tuning `json:"tuning"`
}

// Tuning carries the broadcast.Config fields a process member can set;
// zero fields take broadcast's defaults.
type Tuning struct {
	RingSize          int           `json:"ring_size,omitempty"`
	MaxRecord         int           `json:"max_record,omitempty"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval,omitempty"`
	ElectionTimeout   time.Duration `json:"election_timeout,omitempty"`
	MaxLogEntries     int           `json:"max_log_entries,omitempty"`
	// MaxCatchUpLogEntries: broadcast.Config.MaxCatchUpLogEntries (0: 8 x
	// MaxLogEntries).
	MaxCatchUpLogEntries int           `json:"max_catchup_log_entries,omitempty"`
	MaxUncommitted       int           `json:"max_uncommitted,omitempty"`
	MaxPending           int           `json:"max_pending,omitempty"`
	ProposeTimeout       time.Duration `json:"propose_timeout,omitempty"`
}

// FabricSpec is the Spec of the member's fabric (shm or tcp), for
// fabric.Open.
func (c Config) FabricSpec() fabric.Spec {
	return fabric.Spec{Fabric: c.Fabric, ShmDir: c.ShmDir, Cluster: c.ShmCluster, Addrs: c.Addrs,
		Secret: c.Secret, Spin: c.Spin, PeerTimeout: c.PeerTimeout}
}

// TimedEvent is a broadcast milestone with the wall-clock time this member
// saw it (Unix nanoseconds; comparable across processes of one host).
type TimedEvent struct {
	Kind   broadcast.EventKind `json:"kind"`
	Epoch  broadcast.Epoch     `json:"epoch"`
	UnixNS int64               `json:"unix_ns"`
}

// Member is one replica at work: node, replica, driver goroutine, FSM and
// event record.
type Member struct {
	cfg  Config
	node rdma.Node
	r    *broadcast.Replica
	fsm  *FSM

	cancel context.CancelFunc
	done   chan struct{}

	evmu   sync.Mutex
	events []TimedEvent

	lmu   sync.Mutex
	loads map[*loader]struct{} // running loads (Mark)
}

// maxEvents bounds the event record (oldest dropped first).
const maxEvents = 4096

// Start runs a member on node (which it takes over: Close closes it),
// polled by a poller group of one poller of its own.
func Start(cfg Config, node rdma.Node) (*Member, error) {
	return StartOn(cfg, node, nil, -1)
}

// StartOn is Start with the member polled by pg (running, or run by the
// caller later) instead of a group of its own: added with affinity key
// (poller.Group.AddTo) if key >= 0, so that the members of one group in
// one process share a poller as kvserver's replicas do. Close and Crash
// take it out of pg (Handle.Remove); pg stays the caller's.
func StartOn(cfg Config, node rdma.Node, pg *poller.Group, key int) (*Member, error) {
	m := &Member{cfg: cfg, node: node, fsm: NewStateFSM(cfg.Record, cfg.StateBytes), done: make(chan struct{})}
	var stable broadcast.Stable = &broadcast.MemStable{}
	if cfg.StablePath != "" {
		stable = broadcast.FileStable{Path: cfg.StablePath}
	}
	t := cfg.Tuning
	bc := broadcast.Config{
		Self: cfg.Self, Members: cfg.Members,
		RingSize: t.RingSize, MaxRecord: t.MaxRecord,
		HeartbeatInterval: t.HeartbeatInterval, ElectionTimeout: t.ElectionTimeout,
		MaxLogEntries: t.MaxLogEntries, MaxCatchUpLogEntries: t.MaxCatchUpLogEntries, MaxUncommitted: t.MaxUncommitted,
		MaxPending: t.MaxPending, ProposeTimeout: t.ProposeTimeout,
		OnEvent: m.onEvent,
		Start:   cfg.Start,
	}
	if cfg.StablePath == "" {
		bc.Start = broadcast.StartNew
	}
	r, err := broadcast.New(bc, node, m.fsm, stable)
	if err != nil {
		node.Close()
		return nil, fmt.Errorf("groupproc: member %d: %w", cfg.Self, err)
	}
	m.r = r
	if pg != nil {
		var h *poller.Handle
		if key >= 0 {
			h = pg.AddTo(key, r, node)
		} else {
			h = pg.Add(r, node)
		}
		// stop: once Remove returns no Poll of r runs any more.
		m.cancel = func() { h.Remove() }
		close(m.done)
		return m, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	g := poller.NewGroup(poller.GroupConfig{Pollers: 1, Spin: cfg.Spin})
	g.Add(r, node)
	go func() {
		defer close(m.done)
		g.Run(ctx)
	}()
	return m, nil
}

func (m *Member) onEvent(e broadcast.Event) {
	m.evmu.Lock()
	defer m.evmu.Unlock()
	if len(m.events) == maxEvents {
		m.events = append(m.events[:0], m.events[maxEvents/2:]...)
	}
	m.events = append(m.events, TimedEvent{Kind: e.Kind, Epoch: e.Epoch, UnixNS: time.Now().UnixNano()})
}

// Replica is the member's replica (Propose, Status).
func (m *Member) Replica() *broadcast.Replica { return m.r }

// Node is the member's node.
func (m *Member) Node() rdma.Node { return m.node }

// FSM is the member's state machine.
func (m *Member) FSM() *FSM { return m.fsm }

// Events returns the milestones seen so far, oldest first.
func (m *Member) Events() []TimedEvent {
	m.evmu.Lock()
	defer m.evmu.Unlock()
	return append([]TimedEvent(nil), m.events...)
}

// Close stops the driver, then closes the replica (unresolved proposals
// fail with broadcast.ErrStopped) and the node.
func (m *Member) Close() error {
	m.cancel()
	<-m.done
	return errors.Join(m.r.Close(), m.node.Close())
}

// Crash stops the member as abruptly as an in-process member can: the
// driver stops polling and the node closes at once, without waiting for
// anything in flight (the mem fabric's model of a crashed process).
func (m *Member) Crash() error {
	m.cancel()
	<-m.done
	err := m.node.Close()
	m.r.Close()
	return err
}
