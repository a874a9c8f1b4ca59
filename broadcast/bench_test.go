package broadcast

import (
	"fmt"
	"slices"
	"sync"
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

func (f *nopFSM) Apply(e Entry) []byte           { f.n = e.Index; return nil }
func (f *nopFSM) Snapshot() (FSMSnapshot, error) { return BytesSnapshot(nil), nil }
func (f *nopFSM) Restore([]byte) error           { return nil }

// BenchmarkPipelined measures the protocol's CPU cost per message: three
// replicas on the mem fabric in one goroutine, the leader proposing in
// a closed loop of 1, 16 or 256 outstanding 10-byte messages (and 256 of
// 1000 bytes); virtual time advances a microsecond
// per round of polls, so heartbeats and Log pruning run as they would.
// rings/msg counts doorbell rings (wake-ups of a parked replica: a futex
// wake on shm) per message. It reports msgs/s and allocations per
// committed message (all three replicas' work together).
func BenchmarkPipelined(b *testing.B) {
	for _, w := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("W=%d", w), func(b *testing.B) { benchPipelined(b, w, 10) })
	}
	b.Run("W=256/1000B", func(b *testing.B) { benchPipelined(b, 256, 1000) })
}

func benchPipelined(b *testing.B, window, size int) {
	// A virtual microsecond per round: heartbeats and pruning run.
	g := newLockstep(b, time.Millisecond, time.Microsecond)
	leader, poll, rings := g.rs[0], g.round, g.rings
	msg := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	rung := rings()
	start := time.Now()
	// A closed loop: keep window proposals outstanding, replacing each
	// resolved one (they resolve in order) by a new one.
	q := make([]*Proposal, window)
	issued, done := 0, 0
	for done < b.N {
		for issued < b.N && issued-done < window {
			q[issued%window] = leader.Propose(msg)
			issued++
		}
		poll()
		for done < issued {
			if _, err, ok := q[done%window].result(); !ok {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			done++
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(rings()-rung)/float64(b.N), "rings/msg")
	cpu.stop()
}

// BenchmarkLatencyW1 measures one proposal at a time at the leader, three
// replicas each run by a Driver on the mem fabric (goroutines, doorbells).
func BenchmarkLatencyW1(b *testing.B) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	cfg := Config{Members: ids, Start: StartNew, ElectionTimeout: time.Second, HeartbeatInterval: 10 * time.Millisecond}
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
	if err := awaitCond("a leader", testWait, cond(func() bool {
		for _, m := range ms {
			if m.r.Status().Role == Leader && m.r.Status().Committed.E != 0 {
				leader = m
			}
		}
		return leader != nil
	})); err != nil {
		b.Fatal(err)
	}
	msg := []byte("0123456789")
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	for i := 0; i < b.N; i++ {
		if _, err := waitProposal(b, leader.r.Propose(msg), "message", testWait); err != nil {
			b.Fatal(err)
		}
	}
	cpu.stop()
}

// BenchmarkElection measures elections in real time: three replicas with
// Drivers on the mem fabric; each iteration closes the leader, and times
// the new leader from its detection of the failure (EventElecting) to its
// epoch's first commit (EventEpochCommitted), the span of the paper's
// Table 1; then the old leader restarts with empty memory and catches up.
func BenchmarkElection(b *testing.B) {
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	type ev struct {
		id rdma.NodeID
		e  Event
		at time.Time
	}
	var mu sync.Mutex
	var evs []ev
	ms := make([]*rtMember, len(ids))
	start := func(m *rtMember) {
		cfg := Config{Members: ids, Start: StartNew, HeartbeatInterval: time.Millisecond, ElectionTimeout: 20 * time.Millisecond,
			OnEvent: func(e Event) {
				mu.Lock()
				evs = append(evs, ev{m.id, e, time.Now()})
				mu.Unlock()
			}}
		startMember(b, f, cfg, m)
	}
	for i, id := range ids {
		ms[i] = &rtMember{id: id, stable: &MemStable{}}
		start(ms[i])
	}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	// leader waits for a leader whose epoch committed everywhere.
	leader := func() *rtMember {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var l *rtMember
			ok := true
			for _, m := range ms {
				s := m.r.Status()
				if s.Role == Leader {
					l = m
				}
				if s.Role == Electing || s.CatchingUp || s.Committed.E != s.ECur {
					ok = false
				}
			}
			if l != nil && ok {
				return l
			}
			time.Sleep(time.Millisecond)
		}
		b.Fatal("no stable leader")
		return nil
	}
	var spans []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		old := leader()
		oldEpoch := old.r.Status().ECur
		mu.Lock()
		evs = evs[:0]
		mu.Unlock()
		old.stop()
		var span time.Duration
		for span == 0 {
			time.Sleep(time.Millisecond)
			mu.Lock()
			for k, c := range evs {
				if c.e.Kind != EventEpochCommitted || c.e.Epoch <= oldEpoch || c.e.Epoch.Leader() != c.id {
					continue
				}
				for j := k - 1; j >= 0; j-- { // the winner's last detection before its commit
					if evs[j].id == c.id && evs[j].e.Kind == EventElecting {
						span = c.at.Sub(evs[j].at)
						break
					}
				}
				break
			}
			mu.Unlock()
		}
		spans = append(spans, span)
		start(old) // same Stable, empty memory

	}
	b.StopTimer()
	slices.Sort(spans)
	b.ReportMetric(float64(spans[len(spans)/2].Nanoseconds()), "elect-p50-ns")
	b.ReportMetric(float64(spans[len(spans)-1].Nanoseconds()), "elect-max-ns")
}

// TestProposeFunc checks the callback form of Propose: at the leader and at
// a follower (forwarded) the callback reports the index the data was
// delivered at, once; a proposal that cannot fit fails at once.
func TestProposeFunc(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.settle(nil)
	type outcome struct {
		index uint64
		err   error
	}
	var got []outcome
	record := func(i uint64, _ []byte, err error) { got = append(got, outcome{i, err}) }
	c.get(1).r.ProposeFunc([]byte("a"), record)
	c.get(2).r.ProposeFunc([]byte("b"), record)
	for k := 0; k < 3; k++ {
		c.settle(nil)
	}
	if len(got) != 2 {
		t.Fatalf("callbacks: %v, want 2", got)
	}
	seq := c.delivered(1)
	for k, want := range []string{"a", "b"} {
		o := got[k]
		if o.err != nil || o.index == 0 || int(o.index) > len(seq) || seq[o.index-1] != want {
			t.Errorf("%s: callback %+v; delivered %v", want, o, seq)
		}
	}
	got = nil
	c.get(1).r.ProposeFunc(make([]byte, c.cfg.RingSize), record) // above MaxRecord (RingSize/8)
	if len(got) != 1 || got[0].err != ErrTooLarge {
		t.Errorf("oversized proposal: %v, want one ErrTooLarge at once", got)
	}
}
