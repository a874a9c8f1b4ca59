package fabrictest

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// runCrossProcess runs the cases whose peers are helper processes.
func runCrossProcess(t *testing.T, h Harness) {
	t.Run("FIFOVisibility", func(t *testing.T) { xFIFO(t, h) })
	t.Run("AtomicsContention", func(t *testing.T) { xAtomics(t, h) })
	t.Run("RevokeRacingWriter", func(t *testing.T) { xRevoke(t, h) })
	t.Run("RevokeKilledWriter", func(t *testing.T) { xRevokeKilled(t, h) })
	t.Run("DeadPeerKilled", func(t *testing.T) { xDeadPeer(t, h) })
	t.Run("Doorbell", func(t *testing.T) { xDoorbell(t, h) })
}

// xFIFO: a helper process writes slots and counters; a reader here (the
// owner's memory) and a remote reader here must see them in order.
func xFIFO(t *testing.T, h Harness) {
	const n = 3000
	cl := newCluster(t, h, 3)
	owner, rn := cl.open(1), cl.open(3)
	r := register(t, owner, 1, fifoRegionSize(n))
	grant(t, r, 2, rdma.PermWrite)
	grant(t, r, 3, rdma.PermRead)
	rc := connect(t, rn, 1)
	w := spawn(cl, roleFIFO, roleParams{ID: 2, Peer: 1, Region: 1, N: n})

	stop := make(chan struct{})
	errs := make(chan error, 2)
	go func() { errs <- fifoLocalReader(r.Bytes(), n, stop) }()
	go func() { errs <- fifoRemoteReader(rc, 1, n, stop) }()
	w.send("go")
	if _, err := w.expect("done", 60*time.Second); err != nil {
		close(stop)
		<-errs
		<-errs
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// xAtomics: FetchAdd and CAS increments from two helper processes and this
// one on one word; no update lost, each old value returned once.
func xAtomics(t *testing.T, h Harness) {
	const nFAA = 500
	cl := newCluster(t, h, 4)
	owner := cl.open(1)
	r := register(t, owner, 1, 64)
	for id := rdma.NodeID(2); id <= 4; id++ {
		grant(t, r, id, rdma.PermReadWrite)
	}
	c := connect(t, cl.open(4), 1)
	kids := []*child{
		spawn(cl, roleAtomics, roleParams{ID: 2, Peer: 1, Region: 1, N: nFAA}),
		spawn(cl, roleAtomics, roleParams{ID: 3, Peer: 1, Region: 1, N: nFAA}),
	}
	for _, k := range kids {
		k.send("go")
	}
	faas, cass, err := atomicsWorker(c, 1, 0, 8, fixedQuota(nFAA))
	if err != nil {
		t.Fatalf("worker in the test process: %v", err)
	}
	allFAA, allCAS := [][]uint64{faas}, [][]uint64{cass}
	for _, k := range kids {
		for _, what := range []string{"faa", "cas"} {
			line, err := k.expect(what, 60*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			vs, err := parseUints(line)
			if err != nil {
				t.Fatalf("%s: bad %s line: %v", k.name, what, err)
			}
			if what == "faa" {
				allFAA = append(allFAA, vs)
			} else {
				allCAS = append(allCAS, vs)
			}
		}
	}
	mem := r.Bytes()
	if got := rdma.Load64(mem, 0); got != 3*nFAA {
		t.Errorf("FetchAdd word = %d after 3 processes x %d increments: updates lost", got, nFAA)
	}
	if got := rdma.Load64(mem, 8); got != 3*(nFAA/2) {
		t.Errorf("CAS word = %d after 3 processes x %d CAS increments: updates lost", got, nFAA/2)
	}
	checkPermutation(t, "FetchAdd", allFAA, 3*nFAA)
	checkPermutation(t, "CompareAndSwap", allCAS, 3*(nFAA/2))
}

// revokeSetup makes node 1 (here) own region 1 with two hammer areas and
// waits for the helper (node 2, area 0) to make progress.
func revokeSetup(t *testing.T, h Harness, n int) (*cluster, rdma.Region, *child) {
	cl := newCluster(t, h, n)
	owner := cl.open(1)
	r := register(t, owner, 1, 2*hammerArea)
	grant(t, r, 2, rdma.PermWrite)
	w := spawn(cl, roleHammer, roleParams{ID: 2, Peer: 1, Region: 1, K: 0})
	mem := r.Bytes()
	if !eventually(liveTimeout, func() bool { return rdma.Load64(mem, int(hammerOff(0))) >= 50 }) {
		t.Fatalf("%s made no progress: counter %d", w.name, rdma.Load64(mem, int(hammerOff(0))))
	}
	return cl, r, w
}

// revokeBounded calls Revoke and fails the test if it does not return
// within deadTimeout.
func revokeBounded(t *testing.T, r rdma.Region, peer rdma.NodeID) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Revoke(peer) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Revoke(%d): %v", peer, err)
		}
		t.Logf("Revoke(%d) returned after %v", peer, time.Since(start).Round(time.Millisecond))
	case <-time.After(deadTimeout):
		t.Fatalf("Revoke(%d) did not return within %v", peer, deadTimeout)
	}
}

// xRevoke: revoke a helper process mid-stream while a writer here goes on.
func xRevoke(t *testing.T, h Harness) {
	cl, r, w := revokeSetup(t, h, 3)
	mem := r.Bytes()
	grant(t, r, 3, rdma.PermWrite)
	c := connect(t, cl.open(3), 1)
	var stop atomic.Bool
	var local error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); local = hammer(c, 1, &stop, nil) }()
	defer func() { stop.Store(true); wg.Wait() }()
	counter := func(k int) uint64 { return rdma.Load64(mem, int(hammerOff(k))) }
	if !eventually(liveTimeout, func() bool { return counter(1) >= 50 }) {
		t.Fatalf("writer in the test process made no progress")
	}

	revokeBounded(t, r, 2)
	snap := snapshot(mem[:hammerArea])
	at := counter(1)
	if err := watchUnchanged(mem, 0, hammerArea, snap, 300*time.Millisecond); err != nil {
		t.Error(err)
	}
	if !eventually(liveTimeout, func() bool { return counter(1) > at+50 }) {
		t.Errorf("the other writer stalled after the helper was revoked")
	}
	line, err := w.expect("stopped", liveTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(line, "perm=true") || !strings.Contains(line, "connerr=true") {
		t.Errorf("revoked helper's writes ended with %q, want ErrPermission from the op and Conn.Err", line)
	}
	if d := firstDiff(snap, snapshot(mem[:hammerArea])); d >= 0 {
		t.Errorf("byte %d of the revoked helper's area changed after Revoke returned", d)
	}
	stop.Store(true)
	wg.Wait()
	if local != nil {
		t.Errorf("writer in the test process: %v", local)
	}
}

// xRevokeKilled: the writer's process dies by SIGKILL mid-stream; Revoke
// still returns, nothing lands afterwards, and the region works for others.
func xRevokeKilled(t *testing.T, h Harness) {
	cl, r, w := revokeSetup(t, h, 3)
	mem := r.Bytes()
	w.cmd.Process.Kill() // no wait: Revoke may race the process's death
	revokeBounded(t, r, 2)
	snap := snapshot(mem[:hammerArea])
	if err := watchUnchanged(mem, 0, hammerArea, snap, 200*time.Millisecond); err != nil {
		t.Error(err)
	}
	<-w.exited
	grant(t, r, 3, rdma.PermWrite)
	c := connect(t, cl.open(3), 1)
	if err := write(c, 1, hammerOff(1), word(77)); err != nil {
		t.Fatalf("write by another peer after revoking a killed writer: %v", err)
	}
	if got := rdma.Load64(mem, int(hammerOff(1))); got != 77 {
		t.Errorf("word = %d after another peer's write of 77", got)
	}
}

// xDeadPeer: the process owning the target region is killed with SIGKILL;
// in-flight and later ops fail in bounded time.
func xDeadPeer(t *testing.T, h Harness) {
	cl := newCluster(t, h, 2)
	me := cl.open(1)
	s := spawn(cl, roleServe, roleParams{ID: 2, Region: 1, Size: 64, Grants: map[rdma.NodeID]rdma.Perm{1: rdma.PermReadWrite}})
	c := connect(t, me, 2)
	if err := write(c, 1, 0, word(5)); err != nil {
		t.Fatalf("write to the helper's region: %v", err)
	}
	if v, err := read64(c, 1, 0); err != nil || v != 5 {
		t.Fatalf("read back from the helper's region: %d, %v; want 5", v, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- awaitDeath(c, deadTimeout) }()
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	s.kill()
	err := <-errc
	t.Logf("first error %v after SIGKILL: %v", time.Since(start).Round(time.Millisecond), err)
	if errors.Is(err, errNoCompletion) || !deadErr(err) {
		t.Fatalf("ops to a killed process's region: %v, want ErrPeerDead", err)
	}
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: word(1)}); !errors.Is(err, rdma.ErrConnBroken) {
		t.Errorf("Post after the dead-peer error: %v, want ErrConnBroken", err)
	}
	if c2, err := me.Connect(2); err == nil {
		defer c2.Close()
		if err := awaitDeath(c2, deadTimeout); !deadErr(err) {
			t.Errorf("ops on a new Conn to the killed process: %v, want ErrPeerDead", err)
		}
	}
}

// xDoorbell: doorbell ping-pong with a helper process.
func xDoorbell(t *testing.T, h Harness) {
	const rounds = 200
	cl := newCluster(t, h, 2)
	me := cl.open(1)
	r := register(t, me, 1, 64)
	grant(t, r, 2, rdma.PermReadWrite)
	p := spawn(cl, rolePinger, roleParams{ID: 2, Peer: 1, Region: 1, Size: 64, N: rounds,
		Grants: map[rdma.NodeID]rdma.Perm{1: rdma.PermReadWrite}})
	c := connect(t, me, 2)
	start := time.Now()
	if err := pingPong(c, me.Doorbell(), r.Bytes(), rounds, true); err != nil {
		t.Fatalf("test process side: %v", err)
	}
	if _, err := p.expect("done", liveTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d cross-process round trips in %v", rounds, time.Since(start).Round(time.Millisecond))
}
