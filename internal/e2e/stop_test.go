package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestStoppedReplica runs a group of 3 kvserver processes, on shm and on
// tcp over loopback (peer timeout 500 ms), under a load of gets, puts,
// deletes and compare-and-swaps, and stops replicas with SIGSTOP: a
// stopped process is alive to the kernel (on tcp its sockets accept
// connections and data) but answers nothing, like a hung host.
//
//   - A follower is stopped for 4 s: the leader and the other follower are
//     a majority, so writes must be acknowledged throughout (never two
//     seconds in a row, nor the last second, without one).
//     After SIGCONT the follower must be ready again.
//   - The leader is stopped: the other two must elect a leader and
//     acknowledge writes throughout the next 4 s. After SIGCONT
//     the old leader must follow and be ready again.
//
// Then the history is checked with porcupine, with a final read of every
// key, and every replica must have applied what the leader applied.
//
// On tcp it first caught pollers blocking in tcp.Node.Connect to the
// stopped peer (the kernel accepts the dial and the secret handshake waits
// for the peer timeout): the group stopped heartbeating and elected
// forever. Pollers now connect through rdma.Connector in the background.
//
// On tcp it then found, about one run in six, the old leader resumed,
// following the new leader and caught up by its own account, with its
// delivered index hundreds of entries behind for good: the new leader had
// synced it again while it was stopped, its snapshot (taken later) was
// beyond the diff's end and released before the member could fetch it,
// and the member, refusing the diff, accepted the stream after it past a
// hole. Package broadcast's TestSnapshotReleasedWhileCommitting covers it.
func TestStoppedReplica(t *testing.T) {
	for _, fabric := range []string{"shm", "tcp"} {
		t.Run(fabric, func(t *testing.T) { testStopped(t, fabric) })
	}
}

func testStopped(t *testing.T, fabric string) {
	const keys, workers = 8, 3
	const hold = 4 * time.Second
	c := newCluster(t, loopbackSpec(t, "stop", fabric, 1))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	l := newLoad(cl.Map(), keys, 15*time.Second, 2*time.Millisecond)
	t.Cleanup(func() { l.end(0) })
	l.start(cl, workers, uint64(time.Now().UnixNano()))
	l.waitProgress(t, []int64{0}, 20, 20*time.Second, "warm-up", c.describe)

	// steady requires writes to be acknowledged throughout hold: at most
	// one second in a row without one. A group held up by its stopped
	// member (the bug this test first caught) acknowledges nothing for
	// the whole hold; a machine at load 35 (CI with other work on its 2
	// cores) once starved the two live tcp replicas past their 500 ms
	// peer timeout, and their election left one second empty.
	steady := func(what string) {
		t.Helper()
		empty := 0
		for i := range int(hold / time.Second) {
			mark := l.ackedNow()
			time.Sleep(time.Second)
			if now := l.ackedNow(); now[0] != mark[0] {
				empty = 0
				continue
			}
			empty++
			nerr, errs := l.errors()
			msg := fmt.Sprintf("+%v: %s: no write acknowledged in second %d (%d in all; %d unexpected errors %q, %d unknown outcomes)%s",
				c.since(), what, i+1, l.ackedNow()[0], nerr, errs, l.unknown.Load(), c.describe())
			if empty > 1 {
				t.Fatal(msg)
			}
			c.logf("%s", msg)
		}
		if empty > 0 {
			t.Fatalf("+%v: %s: no write acknowledged in the last second of the hold%s", c.since(), what, c.describe())
		}
	}

	ldr := c.leader(0, 10*time.Second)
	f := c.followers(0, ldr)[0]
	at := time.Now()
	c.stop(f)
	steady(fmt.Sprintf("follower %d stopped (SIGSTOP)", f))
	c.logf("follower %d stopped for %v: writes acknowledged throughout", f, time.Since(at).Round(time.Millisecond))
	c.cont(f)
	c.waitReady(20*time.Second, f)
	c.logf("follower %d ready %v after SIGCONT", f, time.Since(at).Round(time.Millisecond))

	ldr = c.leader(0, 10*time.Second)
	at = time.Now()
	c.stop(ldr)
	nl := c.leader(0, 10*time.Second, ldr)
	c.logf("leader %d stopped: replica %d leads %v later", ldr, nl, time.Since(at).Round(time.Millisecond))
	steady(fmt.Sprintf("leader %d stopped (SIGSTOP), %d elected", ldr, nl))
	c.logf("leader %d stopped for %v: writes acknowledged throughout", ldr, time.Since(at).Round(time.Millisecond))
	c.cont(ldr)
	cat := time.Now()
	st := c.waitFollowing(20*time.Second, ldr)
	c.logf("old leader %d follows %d at epoch %s and is ready %v after SIGCONT", ldr, st.Leader, st.Epoch, time.Since(cat).Round(time.Millisecond))
	l.waitProgress(t, l.ackedNow(), 20, 20*time.Second, "after SIGCONT", c.describe)

	if !l.end(2 * l.timeout) {
		t.Fatalf("the workers' calls had not returned %v after the load stopped%s", 2*l.timeout, c.describe())
	}
	final, err := l.finalReads(cl)
	if err != nil {
		t.Fatal(err)
	}
	applied := c.waitConvergedTCP(20*time.Second, fabric)
	c.logf("load stopped: %d calls, %d acknowledged writes, %d of unknown outcome; every replica applied %d", l.ops.Load(), l.ackedNow()[0], l.unknown.Load(), applied[0])
	nerr, errs := l.errors()
	for _, e := range errs {
		t.Errorf("unexpected error: %s", e)
	}
	if nerr > len(errs) {
		t.Errorf("and %d more unexpected errors", nerr-len(errs))
	}
	h := l.rec.History()
	checkFinal(t, h, l.keys, final)
	checkHistory(t, h)
}
