package shm

import (
	"runtime/metrics"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// inSyscalls is the number of this process's goroutines in system calls
// (or cgo), from the runtime's metrics.
func inSyscalls(t *testing.T) uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("runtime has no /sched/goroutines/not-in-go metric")
	}
	return s[0].Value.Uint64()
}

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
	time.Sleep(20 * time.Millisecond) // into the futex or the hub by now
}

// TestParkedNodesLeavePs: the parked doorbell waiters of a process's
// several nodes do not each sit in a futex(2) system call (each would keep
// a P from the Go runtime until sysmon takes it back, up to 10 ms later:
// with six replicas in one process, writes waited a heartbeat for that).
// They park in the Go runtime and one goroutine waits for all of them; a
// Notify write wakes exactly its node's waiter, one that parks while the
// hub sleeps is woken too, and timeouts still end waits.
func TestParkedNodesLeavePs(t *testing.T) {
	if !hasWaitv() {
		t.Skip("no FUTEX_WAITV here: every waiter parks in FUTEX_WAIT")
	}
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
	base := inSyscalls(t)
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
	// while the others (and the hub) sleep.
	for i := range k - 1 {
		park(i)
	}
	waitParked(t, ns[:k-1]...)
	park(k - 1)
	waitParked(t, ns...)
	if got := inSyscalls(t); got > base+1 {
		t.Fatalf("%d parked waiters: %d goroutines in system calls (%d before), want at most one more", k, got, base)
	}
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
	// A timeout still ends a wait, and the hub then has nothing left.
	db := ns[0].Doorbell()
	start := time.Now()
	if db.Wait(db.Seq(), 30*time.Millisecond) {
		t.Fatal("Wait with no ring reported one")
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Wait(30ms) took %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		hub.mu.Lock()
		n, running := len(hub.waiters), hub.running
		hub.mu.Unlock()
		if n == 0 && !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub still has %d waiters (running %v) after every wait ended", n, running)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestXFutexWakeHub: a Notify write from another process wakes a node of
// a process that parks its waiters through the hub.
func TestXFutexWakeHub(t *testing.T) {
	if !hasWaitv() {
		t.Skip("no FUTEX_WAITV here")
	}
	o := newTestOptions(t)
	o.Spin = -1
	n1, n4 := mustOpen(t, 1, o), mustOpen(t, 4, o)
	r1 := mustRegister(t, n1, 1, 64, 4, rdma.PermReadWrite)
	nf := startChild(t, o, "notifier", "id=3", "peer=1")
	nf.expect("ready")
	if err := r1.Grant(3, rdma.PermWrite); err != nil {
		t.Fatal(err)
	}
	woke := make(chan rdma.NodeID, 2)
	for _, n := range []*Node{n1, n4} {
		db := n.Doorbell()
		s := db.Seq()
		go func() {
			if db.Wait(s, 20*time.Second) {
				woke <- n.id
			}
		}()
	}
	waitParked(t, n1, n4)
	if _, err := nf.stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	nf.expect("rang")
	select {
	case id := <-woke:
		if id != 1 {
			t.Fatalf("the child rang node 1, node %d woke", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Notify write from another process did not wake the parked node")
	}
	n4.Doorbell().Ring()
	if id := <-woke; id != 4 {
		t.Fatalf("rang node 4, node %d woke", id)
	}
}
