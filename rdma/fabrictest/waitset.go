package fabrictest

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// RunWaitSet runs the WaitSet cases alone (a fabric's tests run them again
// with another setting, e.g. shm without FUTEX_WAITV).
func RunWaitSet(t *testing.T, h Harness) { testWaitSet(t, h) }

// testWaitSet: a WaitSet over three nodes' doorbells is woken by a Notify
// write to any of them, by a Ring and by a Kick (also one before the
// Wait), returns false at its deadline when nothing rang, and neither
// Snapshot nor Wait allocates.
func testWaitSet(t *testing.T, h Harness) {
	setup := func(t *testing.T) (nodes []rdma.Node, conns []rdma.Conn, ws rdma.WaitSet) {
		cl := newCluster(t, h, 4)
		ringer := cl.open(4)
		var dbs []rdma.Doorbell
		for id := rdma.NodeID(1); id <= 3; id++ {
			n := cl.open(id)
			grant(t, register(t, n, 1, 64), 4, rdma.PermReadWrite)
			nodes = append(nodes, n)
			conns = append(conns, connect(t, ringer, id))
			dbs = append(dbs, n.Doorbell())
		}
		ws = rdma.NewWaitSet(dbs)
		t.Cleanup(ws.Close)
		return nodes, conns, ws
	}
	// parkThen parks ws (from a fresh snapshot) and calls wake once the
	// waiter has had time to park (or not: either way it must wake).
	parkThen := func(t *testing.T, ws rdma.WaitSet, pause bool, wake func()) {
		t.Helper()
		snap := ws.Snapshot(nil)
		woke := make(chan bool, 1)
		go func() { woke <- ws.Wait(snap, rdma.Mono()+dbWait) }()
		if pause {
			time.Sleep(2 * time.Millisecond)
		}
		wake()
		select {
		case ok := <-woke:
			if !ok {
				t.Fatal("Wait returned false: lost wake-up")
			}
		case <-time.After(dbWait + 5*time.Second):
			t.Fatal("Wait hung past its deadline")
		}
	}
	t.Run("Wake", func(t *testing.T) {
		nodes, conns, ws := setup(t)
		for i := range 12 {
			k := i % 3
			switch i / 3 % 4 {
			case 0, 1: // a Notify write from another node
				parkThen(t, ws, i%2 == 1, func() {
					if err := conns[k].Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: make([]byte, 8)}); err != nil {
						t.Error(err)
					}
				})
			case 2:
				parkThen(t, ws, i%2 == 1, nodes[k].Doorbell().Ring)
			case 3:
				parkThen(t, ws, i%2 == 1, ws.Kick)
			}
		}
		ws.Kick()
		if !ws.Wait(ws.Snapshot(nil), rdma.Mono()+dbWait) {
			t.Fatal("a Kick before Wait did not make it return true")
		}
		snap := ws.Snapshot(nil)
		nodes[2].Doorbell().Ring()
		if !ws.Wait(snap, 0) {
			t.Fatal("Wait with a past deadline missed a ring since its Snapshot")
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		_, _, ws := setup(t)
		snap := ws.Snapshot(nil)
		if ws.Wait(snap, 0) {
			t.Fatal("Wait with a past deadline and nothing rung returned true")
		}
		const d = 50 * time.Millisecond
		start := time.Now()
		ok := ws.Wait(snap, rdma.Mono()+d)
		if el := time.Since(start); !ok && el < d {
			t.Fatalf("Wait returned false after %v, before its deadline %v", el, d)
		}
		if got := ws.Snapshot(nil); ok && equal(got, snap) {
			t.Fatal("Wait reported a wake-up with nothing rung")
		}
	})
	t.Run("NoAllocs", func(t *testing.T) {
		if raceEnabled {
			t.Skip("the race detector allocates on its own")
		}
		_, _, ws := setup(t)
		snap := make([]uint64, 0, 8)
		run := func() {
			snap = ws.Snapshot(snap[:0])
			ws.Wait(snap, 0)
			ws.Wait(snap, rdma.Mono()+50*time.Microsecond) // parks
		}
		run()
		if allocs := testing.AllocsPerRun(50, run); allocs != 0 {
			t.Errorf("Snapshot and two Waits (one parking): %v allocations, want 0", allocs)
		}
	})
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
