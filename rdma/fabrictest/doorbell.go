package fabrictest

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// dbWait is the timeout of each doorbell wait: far longer than any wake-up
// takes, so a wait that returns false means a lost wake-up.
const dbWait = 10 * time.Second

// awaitWord parks on db until the word at off of mem equals want, with the
// Seq/Wait protocol against lost wake-ups. It fails if a Wait times out
// while the word is still not there.
func awaitWord(db rdma.Doorbell, mem []byte, off int, want uint64) error {
	for {
		s := db.Seq()
		if got := rdma.Load64(mem, off); got == want {
			return nil
		} else if got > want {
			return fmt.Errorf("word = %d while waiting for %d", got, want)
		}
		if !db.Wait(s, dbWait) {
			if rdma.Load64(mem, off) == want {
				return fmt.Errorf("word %d landed but the Notify write did not ring the doorbell within %v (lost wake-up)", want, dbWait)
			}
			return fmt.Errorf("waited %v for word %d, doorbell never rang (lost wake-up or lost write)", dbWait, want)
		}
	}
}

// pingPong plays one side: for rounds 1..n, the side that starts writes
// round i into the peer's word with Notify and waits for the peer to echo it.
func pingPong(c rdma.Conn, db rdma.Doorbell, mine []byte, n int, starts bool) error {
	p := newPipe(c, 16)
	for i := uint64(1); i <= uint64(n); i++ {
		if !starts {
			if err := awaitWord(db, mine, 0, i); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
		}
		if _, err := p.write64(1, 0, i, rdma.Notify); err != nil {
			return fmt.Errorf("round %d: write: %w", i, err)
		}
		if starts {
			if err := awaitWord(db, mine, 0, i); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
		}
	}
	return p.sync(1, 8, 1)
}

// testDoorbell: Notify writes wake a parked peer in a ping-pong with no lost
// wake-up; Ring wakes a waiter; Wait on an unchanged Seq times out.
func testDoorbell(t *testing.T, h Harness) {
	t.Run("PingPong", func(t *testing.T) {
		const rounds = 300
		cl := newCluster(t, h, 2)
		a, b := cl.open(1), cl.open(2)
		ra, rb := register(t, a, 1, 64), register(t, b, 1, 64)
		grant(t, ra, 2, rdma.PermReadWrite)
		grant(t, rb, 1, rdma.PermReadWrite)
		ab, ba := connect(t, a, 2), connect(t, b, 1)
		errc := make(chan error, 1)
		go func() { errc <- pingPong(ba, b.Doorbell(), rb.Bytes(), rounds, false) }()
		start := time.Now()
		if err := pingPong(ab, a.Doorbell(), ra.Bytes(), rounds, true); err != nil {
			t.Error("node 1:", err)
		}
		if err := <-errc; err != nil {
			t.Error("node 2:", err)
		}
		t.Logf("%d round trips in %v", rounds, time.Since(start).Round(time.Millisecond))
	})
	t.Run("Ring", func(t *testing.T) {
		cl := newCluster(t, h, 1)
		db := cl.open(1).Doorbell()
		for i := range 20 {
			s := db.Seq()
			woke := make(chan bool, 1)
			go func() { woke <- db.Wait(s, dbWait) }()
			if i%2 == 1 {
				time.Sleep(2 * time.Millisecond) // let the waiter park
			}
			db.Ring()
			select {
			case ok := <-woke:
				if !ok {
					t.Fatalf("try %d: Wait returned false after Ring: lost wake-up", i)
				}
			case <-time.After(dbWait + 5*time.Second):
				t.Fatalf("try %d: Wait hung past its timeout after Ring", i)
			}
			if db.Seq() == s {
				t.Fatalf("try %d: Seq unchanged after Ring", i)
			}
		}
		s := db.Seq()
		db.Ring()
		if !db.Wait(s, dbWait) {
			t.Fatal("Wait on a Seq read before a Ring returned false")
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		cl := newCluster(t, h, 1)
		db := cl.open(1).Doorbell()
		const d = 100 * time.Millisecond
		s := db.Seq()
		start := time.Now()
		ok := db.Wait(s, d)
		el := time.Since(start)
		if db.Seq() != s {
			t.Skipf("the idle node's doorbell rang by itself (Seq %d -> %d)", s, db.Seq())
		}
		if ok {
			t.Fatal("Wait on an unchanged Seq returned true")
		}
		if el < d/2 {
			t.Errorf("Wait(%v) returned false after only %v", d, el)
		}
		if db.Wait(s, 0) {
			t.Error("Wait with zero timeout on an unchanged Seq returned true")
		}
	})
}
