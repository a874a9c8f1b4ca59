package broadcast

import (
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reports the process's CPU time per op, a measure of cost that
// other processes on a shared machine disturb less than wall time does.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) *cpuMeter { return &cpuMeter{b: b, start: cpuTime()} }

func (m *cpuMeter) stop() {
	m.b.ReportMetric(float64(cpuTime()-m.start)/float64(m.b.N), "cpu-ns/op")
}

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
	cpu := startCPU(b)
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
	cpu.stop()
}

// BenchmarkLatencyW1 measures one proposal at a time at the leader, three
// replicas each run by a Driver on the mem fabric (goroutines, doorbells).
func BenchmarkLatencyW1(b *testing.B) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	cfg := Config{Members: ids, ElectionTimeout: time.Second, HeartbeatInterval: 10 * time.Millisecond}
	var ms []*rtMember
	for _, id := range ids {
		m := &rtMember{id: id, stable: &MemStable{}}
		startMember(nil, f, cfg, m)
		ms = append(ms, m)
	}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	var leader *rtMember
	for leader == nil {
		for _, m := range ms {
			if m.r.Status().Role == Leader && m.r.Status().Committed.E != 0 {
				leader = m
			}
		}
		time.Sleep(time.Millisecond)
	}
	msg := []byte("0123456789")
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	for i := 0; i < b.N; i++ {
		if _, err := leader.r.Propose(msg).Result(); err != nil {
			b.Fatal(err)
		}
	}
	cpu.stop()
}
