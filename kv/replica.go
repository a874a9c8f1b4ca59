package kv

import (
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/rdma"
)

// ReplicaConfig configures one replica of a kv group: its TRAM replica
// (which orders the group's updates, single-group and multi-group alike)
// and its table.
type ReplicaConfig struct {
	Multicast multicast.Config
	// Table's Group is filled in from Multicast.Group; its Readers get the
	// cluster's client nodes and the group's members added.
	Table TableConfig
}

// Replica is one replica of a kv group: a TRAM replica whose application
// is the table. It is a poller.Task: a poller.Group polls it with the
// other replicas of the process.
type Replica struct {
	mc *multicast.Replica
	t  *Table
}

// NewReplica registers the table and starts the group's replica on node.
func NewReplica(cfg ReplicaConfig, node rdma.Node, stable broadcast.Stable) (*Replica, error) {
	tc := cfg.Table
	tc.Group = uint32(cfg.Multicast.Group)
	tc.Readers = append(append(append([]rdma.NodeID(nil), tc.Readers...), cfg.Multicast.ClientNodes...), cfg.Multicast.Members[cfg.Multicast.Group]...)
	t, err := NewTable(tc, node)
	if err != nil {
		return nil, err
	}
	mcfg := cfg.Multicast
	prev := mcfg.Broadcast.OnPromise
	mcfg.Broadcast.OnPromise = func(e broadcast.Epoch) {
		t.Promise(e)
		if prev != nil {
			prev(e)
		}
	}
	// A durable replica's periodic capture waits for the spare its index
	// copy needs while it is being made (issue 19: no page faults of a
	// fresh copy on the poller).
	if mcfg.Broadcast.CaptureReady == nil {
		mcfg.Broadcast.CaptureReady = t.SnapshotReady
	}
	// broadcast.New replays a durable replica's log into t before it
	// returns (Table.replaying: growth migrates at once).
	t.replaying = true
	mc, err := multicast.New(mcfg, node, t, stable)
	if err != nil {
		t.Close()
		return nil, err
	}
	t.endReplay()
	t.SetCatchingUp(mc.Broadcast().Status().CatchingUp)
	return &Replica{mc: mc, t: t}, nil
}

// Poll polls the TRAM replica, then publishes whether this replica serves
// linearizable gets: it leads an epoch whose diff committed, so every entry
// of earlier epochs is applied here (broadcast.Replica.Leading), and
// whether it still catches up (it cannot vote: clients tell from it that
// a group cannot elect a leader).
func (r *Replica) Poll(now time.Duration) bool {
	p := r.mc.Poll(now)
	if r.t.catchingUp {
		// Status costs a lock and a copy, paid only while catching up: a
		// member catches up once per incarnation (from its start to its
		// first diff), and never again after.
		r.t.SetCatchingUp(r.mc.Broadcast().Status().CatchingUp)
	}
	e, _ := r.mc.Broadcast().Leading()
	if r.t.knobs.serveEarly && e == 0 {
		// Planted bug: serve from the election on, before the epoch's
		// diff committed and was applied here.
		if st := r.mc.Broadcast().Status(); st.Role == broadcast.Leader {
			e = st.ECur
		}
	}
	r.t.SetServing(uint64(e))
	return p
}

// HeartbeatInterval is the group replica's (broadcast.Heartbeater).
func (r *Replica) HeartbeatInterval() time.Duration { return r.mc.HeartbeatInterval() }

// NextDeadline is the TRAM replica's.
func (r *Replica) NextDeadline() time.Duration { return r.mc.NextDeadline() }

// Table is the replica's table (read it from the polling goroutine).
func (r *Replica) Table() *Table { return r.t }

// Multicast is the replica's TRAM replica.
func (r *Replica) Multicast() *multicast.Replica { return r.mc }

// Close stops the replica and releases its regions.
func (r *Replica) Close() error {
	err := r.mc.Close()
	r.t.Close()
	return err
}
