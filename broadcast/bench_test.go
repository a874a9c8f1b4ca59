package broadcast

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

type nopFSM struct{ n uint64 }

func (f *nopFSM) Apply(index uint64, data []byte) { f.n = index }
func (f *nopFSM) Snapshot() ([]byte, error)       { return nil, nil }
func (f *nopFSM) Restore([]byte) error            { return nil }

// BenchmarkPipelined measures the protocol's CPU cost per message: three
// replicas on the mem fabric in one goroutine, the leader proposing in
// windows of 256, 10-byte messages. It reports msgs/s and allocations per
// committed message (all three replicas' work together).
func BenchmarkPipelined(b *testing.B) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	var rs []*Replica
	for _, id := range ids {
		n, err := f.NewNode(id)
		if err != nil {
			b.Fatal(err)
		}
		r, err := New(Config{Self: id, Members: ids, ElectionTimeout: time.Hour, HeartbeatInterval: time.Minute}, n, &nopFSM{}, &MemStable{})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		rs = append(rs, r)
	}
	now := time.Duration(0)
	poll := func() {
		for _, r := range rs {
			r.Poll(now)
		}
	}
	poll()
	rs[0].startElection(true)
	for i := 0; i < 20 && rs[0].Status().Committed.E == 0; i++ {
		poll()
	}
	leader := rs[0]
	if leader.Status().Role != Leader {
		b.Fatal("no leader")
	}
	msg := []byte("0123456789")
	const window = 256
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; {
		k := min(window, b.N-done)
		ps := make([]*Proposal, k)
		for i := range ps {
			ps[i] = leader.Propose(msg)
		}
		for {
			poll()
			select {
			case <-ps[k-1].Done():
			default:
				continue
			}
			break
		}
		done += k
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
