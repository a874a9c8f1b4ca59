package broadcast

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// regionFSM keeps its state in memory it registered itself (as the kv
// layer's table will): a region of regionState bytes that members may read.
// Its snapshots are RegionSnapshots: the capture is the region as it is,
// and later Applies go to a fresh region (the state copied over, which is
// this FSM's way of keeping the capture unchanged; the kv layer versions
// its records instead).
type regionFSM struct {
	node    rdma.Node
	members []rdma.NodeID
	next    rdma.RegionID
	cur     rdma.Region
	index   uint64
}

const regionState = 256 << 10

func newRegionFSM(t testing.TB, node rdma.Node, members []rdma.NodeID) *regionFSM {
	f := &regionFSM{node: node, members: members, next: 0x9000}
	f.cur = f.register(t)
	return f
}

func (f *regionFSM) register(t testing.TB) rdma.Region {
	reg, err := f.node.Register(f.next, regionState)
	if err != nil {
		t.Fatal(err)
	}
	f.next++
	for _, m := range f.members {
		if m != f.node.ID() {
			reg.Grant(m, rdma.PermRead)
		}
	}
	return reg
}

func (f *regionFSM) Apply(e Entry) []byte {
	index, data := e.Index, e.Data
	f.index = index
	b := f.cur.Bytes()
	binary.LittleEndian.PutUint64(b, index)
	copy(b[8+int(index*16)%(regionState-64):], data)
	return nil
}

type regionCapture struct {
	reg  rdma.Region
	size int
}

func (c *regionCapture) Size() int { return c.size }
func (c *regionCapture) Persist([]byte) error {
	return fmt.Errorf("a RegionSnapshot is never persisted")
}
func (c *regionCapture) Release()                   { c.reg.Close() }
func (c *regionCapture) Region() (rdma.Region, int) { return c.reg, 0 }
func (f *regionFSM) Snapshot() (FSMSnapshot, error) {
	c := &regionCapture{reg: f.cur, size: regionState}
	fresh, err := f.node.Register(f.next, regionState)
	if err != nil {
		return nil, err
	}
	f.next++
	for _, m := range f.members {
		if m != f.node.ID() {
			fresh.Grant(m, rdma.PermRead)
		}
	}
	copy(fresh.Bytes(), f.cur.Bytes())
	f.cur = fresh
	return c, nil
}

func (f *regionFSM) Restore(b []byte) error {
	if len(b) != regionState {
		return fmt.Errorf("region snapshot of %d bytes", len(b))
	}
	copy(f.cur.Bytes(), b)
	f.index = binary.LittleEndian.Uint64(b)
	return nil
}

// TestRegionSnapshot: an FSM whose state lives in registered memory hands
// the replica a RegionSnapshot; the leader serves the member behind its
// pruned Log straight from that region (it registers no state region of
// its own and never calls Persist) and the member ends with the same
// bytes.
func TestRegionSnapshot(t *testing.T) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	var rs []*Replica
	var fsms []*regionFSM
	for _, id := range ids {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		fsm := newRegionFSM(t, n, ids)
		r, err := New(Config{Self: id, Members: ids, Start: StartNew, ElectionTimeout: time.Hour, HeartbeatInterval: time.Millisecond, MaxLogEntries: 8, RingSize: 4096}, n, fsm, &MemStable{})
		if err != nil {
			t.Fatal(err)
		}
		r.runPersist = func(fn func()) { fn() }
		t.Cleanup(func() { r.Close(); n.Close() })
		rs, fsms = append(rs, r), append(fsms, fsm)
	}
	now := time.Duration(0)
	round := func(skip int) {
		now += time.Millisecond / 4
		for i, r := range rs {
			if i != skip {
				r.Poll(now)
			}
		}
	}
	round(-1)
	rs[0].startElection(true)
	for i := 0; i < 100 && rs[0].Status().Committed.E == 0; i++ {
		round(-1)
	}
	// Node 3 stops polling while 2000 entries commit (its ring fills, the
	// Log is pruned past it), then polls again.
	for i := 0; i < 2000; i++ {
		rs[0].Propose([]byte(fmt.Sprintf("entry %d", i)))
		if i%50 == 0 {
			for k := 0; k < 10; k++ {
				round(2)
			}
		}
	}
	for k := 0; k < 50; k++ {
		round(2)
	}
	for k := 0; k < 2000 && rs[2].Status().Index < rs[0].Status().Index; k++ {
		round(-1)
	}
	ls, fs := rs[0].Status(), rs[2].Status()
	if fs.Index != ls.Index || fs.Counters.SnapshotsRestored == 0 {
		t.Fatalf("node 3 at %d (restored %d snapshots), the leader at %d", fs.Index, fs.Counters.SnapshotsRestored, ls.Index)
	}
	if ls.Counters.SnapshotsTaken == 0 {
		t.Fatalf("the leader took no snapshot: %+v", ls.Counters)
	}
	_, stateID := rs[0].snapRegionIDs(rs[0].snapSlot)
	if reg, err := rs[0].node.Register(stateID, 8); err != nil {
		t.Errorf("the leader registered a state region of its own (%d): %v", stateID, err)
	} else {
		reg.Close()
	}
	if !bytes.Equal(fsms[0].cur.Bytes(), fsms[2].cur.Bytes()) {
		t.Errorf("node 3's state differs from the leader's")
	}
}
