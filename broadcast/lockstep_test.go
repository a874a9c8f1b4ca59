package broadcast

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// lockstep is a 3-replica group on the mem fabric (immediate mode) that
// one goroutine polls in turn, on a virtual clock advancing step per
// round; node 1 (rs[0]) is elected and has committed its epoch when
// newLockstep returns. hb is the heartbeat interval (the election timeout
// is an hour: no election happens by itself). Replicas close at the end of
// the test.
type lockstep struct {
	rs   []*Replica
	dbs  []rdma.Doorbell
	now  time.Duration
	step time.Duration
}

func newLockstep(tb testing.TB, hb, step time.Duration) *lockstep {
	tb.Helper()
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	g := &lockstep{step: step}
	for _, id := range ids {
		n, err := f.NewNode(id)
		if err != nil {
			tb.Fatal(err)
		}
		r, err := New(Config{Self: id, Members: ids, Start: StartNew, ElectionTimeout: time.Hour, HeartbeatInterval: hb}, n, &nopFSM{}, &MemStable{})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { r.Close() })
		g.rs = append(g.rs, r)
		g.dbs = append(g.dbs, n.Doorbell())
	}
	g.round()
	g.rs[0].startElection(true)
	for i := 0; i < 100 && g.rs[0].Status().Committed.E == 0; i++ {
		g.round()
	}
	if s := g.rs[0].Status(); s.Role != Leader || s.Committed.E == 0 {
		tb.Fatalf("node 1 did not become leader: %+v", s)
	}
	return g
}

// round advances the clock by one step and polls every replica once.
func (g *lockstep) round() {
	g.now += g.step
	for _, r := range g.rs {
		r.Poll(g.now)
	}
}

// rings is the sum of the replicas' doorbell sequence numbers.
func (g *lockstep) rings() (k uint64) {
	for _, db := range g.dbs {
		k += db.Seq()
	}
	return k
}
