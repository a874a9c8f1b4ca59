package shm

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// waitParked waits until every node's doorbell has a parked waiter.
func waitParked(t *testing.T, ns ...*Node) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range ns {
		for rdma.Load64(n.nf, nodeParkedW) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("node %d's waiter did not park", n.id)
			}
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(20 * time.Millisecond) // into the futex by now
}

// TestParkedNodesWake: the parked doorbell waiters of a process's several
// nodes each sleep on their own node's word (no hub thread): a Notify
// write wakes exactly its node's waiter, one that parks while the others
// sleep is woken too, and timeouts still end waits.
func TestParkedNodesWake(t *testing.T) {
	o := newTestOptions(t)
	o.Spin = -1 // park at once
	const k = 4
	ringer := mustOpen(t, 100, o)
	var ns []*Node
	var conns []rdma.Conn
	for i := range k {
		n := mustOpen(t, rdma.NodeID(i+1), o)
		mustRegister(t, n, 1, 64, 100, rdma.PermReadWrite)
		ns = append(ns, n)
		conns = append(conns, mustConnect(t, ringer, n.id))
	}
	woke := make(chan int, k)
	park := func(i int) {
		db := ns[i].Doorbell()
		s := db.Seq()
		go func() {
			if db.Wait(s, 20*time.Second) {
				woke <- i
			} else {
				woke <- -1
			}
		}()
	}
	// Park all but the last, let them settle, then park the last one
	// while the others sleep.
	for i := range k - 1 {
		park(i)
	}
	waitParked(t, ns[:k-1]...)
	park(k - 1)
	waitParked(t, ns...)
	// Ring them one at a time, the last parked first: only the rung one
	// wakes.
	for _, i := range []int{k - 1, 1, 0, 2} {
		if err := conns[i].Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-woke:
			if got != i {
				t.Fatalf("rang node %d, woke %d", ns[i].id, got)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a Notify write did not wake node %d's parked waiter", ns[i].id)
		}
	}
	// A timeout still ends a wait.
	db := ns[0].Doorbell()
	start := time.Now()
	if db.Wait(db.Seq(), 30*time.Millisecond) {
		t.Fatal("Wait with no ring reported one")
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Wait(30ms) took %v", d)
	}
}
