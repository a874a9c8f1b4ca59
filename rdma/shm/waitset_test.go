package shm

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/fabrictest"
)

// TestWaitSetFallback: without FUTEX_WAITV a WaitSet sleeps in FUTEX_WAIT
// on its first node (never a hub thread) and still wakes for a ring of
// any node, a Kick, or its deadline.
func TestWaitSetFallback(t *testing.T) {
	noWaitv.Store(true)
	defer noWaitv.Store(false)
	fabrictest.RunWaitSet(t, harness)
}

// TestWaitSetHolding: WaitHolding (FUTEX_WAITV in a plain system call,
// keeping the P) wakes for a ring of any node, a Kick, or its deadline, as
// Wait does.
func TestWaitSetHolding(t *testing.T) {
	holdWaits.Store(true)
	defer holdWaits.Store(false)
	fabrictest.RunWaitSet(t, harness)
}

// TestXWaitSetWake: a Notify write from another process wakes a WaitSet
// parked on this process's two nodes, with or without FUTEX_WAITV.
func TestXWaitSetWake(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		noWaitv.Store(fallback)
		o := newTestOptions(t)
		n4, n1 := mustOpen(t, 4, o), mustOpen(t, 1, o)
		r1 := mustRegister(t, n1, 1, 64, 4, rdma.PermReadWrite)
		nf := startChild(t, o, "notifier", "id=3", "peer=1")
		nf.expect("ready")
		if err := r1.Grant(3, rdma.PermWrite); err != nil {
			t.Fatal(err)
		}
		ws := rdma.NewWaitSet([]rdma.Doorbell{n4.Doorbell(), n1.Doorbell()})
		snap := ws.Snapshot(nil)
		woke := make(chan bool, 1)
		go func() { woke <- ws.Wait(snap, rdma.Mono()+time.Minute) }()
		waitParked(t, n1, n4)
		if _, err := nf.stdin.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		nf.expect("rang")
		select {
		case ok := <-woke:
			if !ok {
				t.Fatalf("fallback %v: the WaitSet's Wait returned false", fallback)
			}
		case <-time.After(25 * time.Second):
			t.Fatalf("fallback %v: a Notify write from another process did not wake the WaitSet", fallback)
		}
		if rdma.Load64(n1.nf, nodeParkedW) != 0 || rdma.Load64(n4.nf, nodeParkedW) != 0 {
			t.Fatalf("fallback %v: a node still counts a parked waiter after the Wait", fallback)
		}
		ws.Close()
	}
	noWaitv.Store(false)
}

// TestWaitSetClosedNode: a WaitSet whose first node closed (its owner
// should have dropped it first, but may not have yet) still parks, and a
// Kick or a ring of its other node wakes it, with or without FUTEX_WAITV.
func TestWaitSetClosedNode(t *testing.T) {
	defer noWaitv.Store(false)
	for _, fallback := range []bool{false, true} {
		noWaitv.Store(fallback)
		o := newTestOptions(t)
		a, err := Open(1, o)
		if err != nil {
			t.Fatal(err)
		}
		b := mustOpen(t, 2, o)
		ws := rdma.NewWaitSet([]rdma.Doorbell{a.Doorbell(), b.Doorbell()})
		a.Close()
		for _, wake := range []func(){ws.Kick, b.Doorbell().Ring} {
			snap := ws.Snapshot(nil)
			if ws.Wait(snap, rdma.Mono()+10*time.Millisecond) {
				t.Fatalf("fallback %v: a WaitSet with a closed node woke with nothing rung", fallback)
			}
			woke := make(chan bool, 1)
			go func() { woke <- ws.Wait(snap, rdma.Mono()+time.Minute) }()
			time.Sleep(5 * time.Millisecond)
			wake()
			select {
			case ok := <-woke:
				if !ok {
					t.Fatalf("fallback %v: Wait returned false after a wake", fallback)
				}
			case <-time.After(20 * time.Second): // a lost wake-up: Wait sleeps out its minute
				t.Fatalf("fallback %v: a WaitSet with a closed first node was not woken", fallback)
			}
		}
		ws.Close()
	}
}
