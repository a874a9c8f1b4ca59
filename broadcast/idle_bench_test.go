package broadcast

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// BenchmarkIdlePoll measures a Poll with nothing to do, at the leader and
// at a follower of an established 3-replica group on mem (in cache): the
// fixed cost a replica pays per Poll, and so about how late a spinning
// replica notices a write that lands while it polls.
func BenchmarkIdlePoll(b *testing.B) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	var rs []*Replica
	for _, id := range ids {
		n, _ := f.NewNode(id)
		r, err := New(Config{Self: id, Members: ids, ElectionTimeout: time.Hour, HeartbeatInterval: time.Millisecond}, n, &nopFSM{}, &MemStable{})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		rs = append(rs, r)
	}
	now := time.Duration(0)
	poll := func() {
		now += time.Microsecond
		for _, r := range rs {
			r.Poll(now)
		}
	}
	poll()
	rs[0].startElection(true)
	for i := 0; i < 50; i++ {
		poll()
	}
	for _, who := range []int{0, 1} {
		r := rs[who]
		b.Run([]string{"leader", "follower"}[who], func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				now += 10 * time.Nanosecond
				r.Poll(now)
			}
		})
	}
}
