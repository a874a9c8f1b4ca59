package broadcast

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// TestShmGroup runs a three-replica group on the shm fabric (nodes in this
// process, regions in /dev/shm files written one-sidedly by the peers):
// concurrent proposals at every member are delivered in one order.
func TestShmGroup(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	ids := []rdma.NodeID{1, 2, 3}
	cluster := fmt.Sprintf("bcast-test-%d", os.Getpid())
	cfg := Config{Members: ids, Start: StartNew, RingSize: 256 << 10, HeartbeatInterval: time.Millisecond, ElectionTimeout: 100 * time.Millisecond}
	type member struct {
		node *shm.Node
		r    *Replica
		fsm  *syncFSM
	}
	ms := make([]member, len(ids))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, id := range ids {
		n, err := shm.Open(id, shm.Options{Cluster: cluster})
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Self = id
		fsm := &syncFSM{}
		r, err := New(c, n, fsm, &MemStable{})
		if err != nil {
			t.Fatal(err)
		}
		ms[i] = member{n, r, fsm}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runPolled(ctx, r, n)
		}()
	}
	defer func() {
		cancel()
		if !waitGroup(&wg, testWait) {
			t.Errorf("the drivers did not return within %v of their cancel", testWait)
			return // the replicas may still be polled: leave them open
		}
		for _, m := range ms {
			m.r.Close()
			m.node.Close()
		}
	}()
	rs := []*Replica{ms[0].r, ms[1].r, ms[2].r}
	var pw sync.WaitGroup
	errs := make(chan error, len(ms))
	for _, m := range ms {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for k := 0; k < 200; k++ {
				d := fmt.Sprintf("n%d-%d", m.node.ID(), k)
				p := m.r.Propose([]byte(d))
				if err := awaitResolved(p, d, testWait, rs...); err != nil {
					errs <- err
					return
				}
				if _, err := p.Result(); err != nil {
					errs <- fmt.Errorf("%s: %w", d, err)
					return
				}
			}
		}()
	}
	pw.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitCond(t, "all three members deliver the same 600 entries", testWait, func() error {
		a, b, c := ms[0].fsm.seqCopy(), ms[1].fsm.seqCopy(), ms[2].fsm.seqCopy()
		if len(a) == 600 && fmt.Sprint(a) == fmt.Sprint(b) && fmt.Sprint(b) == fmt.Sprint(c) {
			return nil
		}
		return fmt.Errorf("%d, %d, %d entries", len(a), len(b), len(c))
	}, rs...)
}

// BenchmarkShmLatencyW1 measures one proposal at a time at the leader of a
// three-replica shm group (all in this process).
func BenchmarkShmLatencyW1(b *testing.B) {
	ids := []rdma.NodeID{1, 2, 3}
	cluster := fmt.Sprintf("bcast-bench-%d", os.Getpid())
	cfg := Config{Members: ids, Start: StartNew, HeartbeatInterval: 10 * time.Millisecond, ElectionTimeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var rs []*Replica
	var nodes []*shm.Node
	for _, id := range ids {
		n, err := shm.Open(id, shm.Options{Cluster: cluster})
		if err != nil {
			b.Fatal(err)
		}
		c := cfg
		c.Self = id
		r, err := New(c, n, &nopFSM{}, &MemStable{})
		if err != nil {
			b.Fatal(err)
		}
		rs, nodes = append(rs, r), append(nodes, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runPolled(ctx, r, n)
		}()
	}
	defer func() {
		cancel()
		if !waitGroup(&wg, testWait) {
			b.Errorf("the drivers did not return within %v of their cancel", testWait)
			return
		}
		for i := range rs {
			rs[i].Close()
			nodes[i].Close()
		}
	}()
	var leader *Replica
	if err := awaitCond("a leader that committed its epoch", testWait, func() error {
		for _, r := range rs {
			if s := r.Status(); s.Role == Leader && s.Committed.E != 0 {
				leader = r
				return nil
			}
		}
		return errors.New("none")
	}, rs...); err != nil {
		b.Fatal(err)
	}
	// A watchdog bounds each wait: it cancels wctx when a proposal has not
	// resolved within testWait (resetting a timer costs far less than the
	// round trip measured).
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watchdog := time.AfterFunc(testWait, wcancel)
	defer watchdog.Stop()
	msg := []byte("0123456789")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		watchdog.Reset(testWait)
		p := leader.Propose(msg)
		if _, err := p.Wait(wctx); err != nil {
			if wctx.Err() != nil {
				b.Fatal(awaitResolved(p, fmt.Sprintf("%d of %d", i+1, b.N), 0, rs...))
			}
			b.Fatal(err)
		}
	}
}
