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

// TestWakeOnceLostWakeup: a ring to a node whose waiter parked again
// after an earlier ring's wake call makes a wake call of its own (the
// waiter cleared woken when it announced the park), and a second ring
// before the woken waiter runs again makes none. The skipClearWoken knob
// (a waiter that leaves woken set) must lose the wake-up: the ring finds
// woken set and skips its call while the waiter sleeps.
func TestWakeOnceLostWakeup(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(map[bool]string{false: "fixed", true: "planted"}[planted], func(t *testing.T) {
			skipClearWoken = planted
			defer func() { skipClearWoken = false }()
			o := newTestOptions(t)
			o.Spin = -1 // park at once
			n := mustOpen(t, 1, o)
			db := n.Doorbell()
			wait := func() chan bool {
				ch := make(chan bool, 1)
				s := db.Seq()
				go func() { ch <- db.Wait(s, 2*time.Second) }()
				waitParked(t, n)
				return ch
			}
			// first park: woken's first ring makes the call
			ch := wait()
			w0 := rdma.DoorbellWaits()
			ringNode(n.nf)
			<-ch
			// second park: its ring must make a call too
			ch = wait()
			w1 := rdma.DoorbellWaits()
			ringNode(n.nf)
			ringNode(n.nf) // no call needed if the woken waiter has not run yet (none if it left)
			<-ch
			w2 := rdma.DoorbellWaits()
			first, second := w1.Wakes-w0.Wakes, w2.Wakes-w1.Wakes
			skipped := w2.WakesSkipped - w1.WakesSkipped
			if planted {
				if second != 0 {
					t.Fatalf("planted bug: the second park's ring made %d wake calls, want 0 (the lost wake-up the knob plants)", second)
				}
				return
			}
			if first != 1 || second < 1 {
				t.Fatalf("wake calls: %d for the first park's ring, %d for the second park's two rings; want 1 and at least 1 (a waiter that parked again after a wake call must get a call)", first, second)
			}
			if second+skipped > 2 {
				t.Fatalf("the second park's two rings: %d calls + %d skipped, want at most 2 in all", second, skipped)
			}
		})
	}
}

// TestWakeOnceOldOwner: a node whose owner does not announce featWakeOnce
// (built before it: its waiters never clear woken) gets a wake call on
// every ring while a waiter is parked.
func TestWakeOnceOldOwner(t *testing.T) {
	nodeFeatures = 0
	defer func() { nodeFeatures = featWakeOnce }()
	skipClearWoken = true // an old owner's waiter
	defer func() { skipClearWoken = false }()
	o := newTestOptions(t)
	o.Spin = -1
	n := mustOpen(t, 1, o)
	db := n.Doorbell()
	for range 3 {
		s := db.Seq()
		ch := make(chan bool, 1)
		go func() { ch <- db.Wait(s, 2*time.Second) }()
		waitParked(t, n)
		w0 := rdma.DoorbellWaits()
		ringNode(n.nf)
		<-ch
		if w := rdma.DoorbellWaits(); w.Wakes-w0.Wakes != 1 || w.WakesSkipped != w0.WakesSkipped {
			t.Fatalf("a ring to an old owner's parked waiter: %d wake calls, %d skipped; want 1, 0", w.Wakes-w0.Wakes, w.WakesSkipped-w0.WakesSkipped)
		}
	}
}

// TestWakeOnceSkips: with a waiter announced (parked, no thread behind
// it here), the first ring makes the wake call and the next ones skip it
// until a waiter announces again.
func TestWakeOnceSkips(t *testing.T) {
	o := newTestOptions(t)
	o.Spin = -1
	n := mustOpen(t, 1, o)
	announcePark(n.nf)
	w0 := rdma.DoorbellWaits()
	for range 3 {
		ringNode(n.nf)
	}
	w1 := rdma.DoorbellWaits()
	if calls, skipped := w1.Wakes-w0.Wakes, w1.WakesSkipped-w0.WakesSkipped; calls != 1 || skipped != 2 {
		t.Fatalf("three rings to one announced park: %d wake calls, %d skipped; want 1, 2", calls, skipped)
	}
	announcePark(n.nf) // a second waiter: the next ring calls again
	ringNode(n.nf)
	if w2 := rdma.DoorbellWaits(); w2.Wakes-w1.Wakes != 1 {
		t.Fatalf("a ring after a new announce: %d wake calls, want 1", w2.Wakes-w1.Wakes)
	}
	rdma.Add64(n.nf, nodeParkedW, ^uint64(1)) // both announces gone
}
