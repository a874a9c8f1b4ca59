package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// Status is the state of every replica of the cluster, read one-sided
// from the replicas' table headers (the memory gets read): no server CPU
// is involved, and a replica whose process is stopped but whose memory is
// readable still reports its state.
type Status struct {
	// Name and Fabric are the cluster map's.
	Name   string
	Fabric string
	// Read is when the headers were read (all in parallel).
	Read   time.Time
	Groups []GroupStatus
}

// GroupStatus is one group's state.
type GroupStatus struct {
	Group uint32
	// Leader is the index in Replicas of the reachable replica serving
	// the highest epoch (it serves linearizable gets), -1 if none does.
	Leader int
	// Epoch is the leader's serving epoch (0 if no leader).
	Epoch uint64
	// Confirmed: at least a majority of the group's members promise
	// Epoch, as a linearizable get requires (docs/kv.md, "Gets"); false
	// while an election is under way or too few members are readable.
	Confirmed bool
	// Applied is the highest entry index any reachable replica applied.
	Applied uint64
	// Known is the highest entry index of the group this client has seen
	// (its writes' replies, its linearizable gets).
	Known    uint64
	Replicas []ReplicaStatus
}

// ReplicaStatus is one replica's state as its table header says.
type ReplicaStatus struct {
	// Node is the replica's node id, Member its index in the group.
	Node   rdma.NodeID
	Member int
	// Reachable: its header was read and decoded. Err says why not.
	Reachable bool
	Err       error
	// Leader: it is the group's Leader.
	Leader bool
	// Serving is the epoch it leads and serves linearizable gets in (0:
	// none); Promise is the epoch it last promised (E_new).
	Serving uint64
	Promise uint64
	// Applied is the index of the last entry it applied, AppliedAt when
	// (its wall clock; after a snapshot restore, when it restored; the
	// zero Time if its header does not say); Behind is how many entries
	// it is behind the most advanced reachable replica of the group.
	Applied   uint64
	AppliedAt time.Time
	Behind    uint64
	// Inc is its table's incarnation (it changes when the replica
	// restarts); Layout counts its table's geometry changes and restores.
	Inc    uint64
	Layout uint64
	// Gen is the index generation, Buckets its number of buckets and
	// Slots its capacity in keys; Migrating while the index grows into
	// Gen from the previous generation.
	Gen       int
	Buckets   int
	Slots     int
	Migrating bool
	// CatchingUp: it restarted without its data and cannot vote until a
	// leader catches it up (its header says so). A group whose reachable
	// replicas that can vote are no majority cannot elect a leader.
	CatchingUp bool
}

// statusReadTimeout bounds each header read when ctx allows longer.
const statusReadTimeout = 2 * time.Second

// Status reads the table header of every replica of every group, one-sided
// and in parallel, and reports each replica's state: reachable or not,
// serving epoch, applied index and lag, table size. It fails only if the
// client is closed or ctx ends before the reads are posted; an unreachable
// replica is reported in its ReplicaStatus.
func (c *Client) Status(ctx context.Context) (Status, error) {
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return Status{}, err
	}
	defer end()
	if err := ctx.Err(); err != nil {
		return Status{}, err
	}
	timeout := statusReadTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), time.Millisecond)
	}
	st := Status{Name: c.m.Name, Fabric: c.m.Fabric, Read: time.Now(), Groups: make([]GroupStatus, len(c.m.Groups))}
	var wg sync.WaitGroup
	for g, members := range c.m.Groups {
		gs := &st.Groups[g]
		gs.Group, gs.Leader = uint32(g), -1
		gs.Replicas = make([]ReplicaStatus, len(members))
		for i, id := range members {
			gs.Replicas[i] = ReplicaStatus{Node: id, Member: i}
			wg.Go(func() { c.readReplica(uint32(g), &gs.Replicas[i], timeout) })
		}
	}
	wg.Wait()
	for g := range st.Groups {
		gs := &st.Groups[g]
		gs.Known = c.known(gs.Group, 0)
		for i, r := range gs.Replicas {
			if !r.Reachable {
				continue
			}
			gs.Applied = max(gs.Applied, r.Applied)
			if r.Serving > gs.Epoch {
				gs.Leader, gs.Epoch = i, r.Serving
			}
		}
		promised := 0
		for i := range gs.Replicas {
			r := &gs.Replicas[i]
			if !r.Reachable {
				continue
			}
			r.Behind = gs.Applied - r.Applied
			r.Leader = i == gs.Leader
			if gs.Epoch != 0 && r.Promise == gs.Epoch {
				promised++
			}
		}
		gs.Confirmed = gs.Leader >= 0 && promised >= len(gs.Replicas)/2+1
	}
	return st, nil
}

// readReplica reads one replica's header on a Conn of its own.
func (c *Client) readReplica(g uint32, r *ReplicaStatus, timeout time.Duration) {
	conn, err := c.node.Connect(r.Node)
	if err != nil {
		r.Err = fmt.Errorf("connect to node %d: %w", r.Node, err)
		return
	}
	defer conn.Close()
	h, err := kv.ReadHeader(conn, g, timeout)
	if err != nil {
		r.Err = fmt.Errorf("read node %d's header: %w", r.Node, err)
		return
	}
	r.Reachable = true
	r.Serving, r.Promise = h.Serving, h.Promise
	r.Applied = h.Applied
	if h.AppliedAt != 0 {
		r.AppliedAt = time.Unix(0, h.AppliedAt)
	}
	r.Inc, r.Layout, r.CatchingUp = h.Inc, h.Layout, h.CatchingUp
	r.Gen, r.Buckets, r.Slots, r.Migrating = h.Geometry.Gen, 1<<h.Geometry.LogBuckets, h.Geometry.IndexSlots(), h.Geometry.Migrating
}
