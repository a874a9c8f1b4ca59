package shm

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// Cross-process tests: the child is this test binary playing a role from
// helper_test.go.

func TestXStaleFilesAfterKill(t *testing.T) {
	o := newTestOptions(t)
	ch := startChild(t, o, "hold", "id=5", "peer=1")
	ch.expect("ready")
	if _, err := Open(5, o); !errors.Is(err, ErrNodeInUse) {
		t.Fatalf("Open(5) while a live child holds it = %v, want ErrNodeInUse", err)
	}
	ch.kill()
	ch.reap()
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(o.Dir, "rdmakv."+o.Cluster+".5.*"))
		return m
	}
	if len(files()) != 2 {
		t.Fatalf("files of the killed node: %v, want its node and region file", files())
	}
	n1 := mustOpen(t, 1, o)
	if got := files(); len(got) != 0 {
		t.Fatalf("Open left the dead node's files behind: %v", got)
	}
	if _, err := n1.Connect(5); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Fatalf("Connect to the removed node = %v, want ErrUnknownPeer", err)
	}
	n5 := mustOpen(t, 5, o) // the id is free again
	mustRegister(t, n5, 1, 64, 1, rdma.PermReadWrite)
	if err := rdma.Write(mustConnect(t, n1, 5), 1, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
}

func TestXDeadPeer(t *testing.T) {
	o := newTestOptions(t)
	o.PeerTimeout = 200 * time.Millisecond
	ch := startChild(t, o, "hold", "id=2", "peer=1")
	ch.expect("ready")
	n1 := mustOpen(t, 1, o)
	c := mustConnect(t, n1, 2)
	if err := rdma.Write(c, 1, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	ch.kill() // not reaped: a zombie must count as dead too
	deadline := time.Now().Add(20 * time.Second)
	var cs [4]rdma.Completion
	for {
		if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: make([]byte, 8)}); err != nil {
			t.Fatalf("Post after the target died: %v, want a failed completion", err)
		}
		if k := c.Poll(cs[:]); k > 0 {
			if !errors.Is(cs[0].Err, rdma.ErrPeerDead) {
				t.Fatalf("op to a killed target failed with %v, want ErrPeerDead", cs[0].Err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ops to a killed target still succeed after 20s")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := n1.Connect(2); !errors.Is(err, rdma.ErrPeerDead) {
		t.Fatalf("Connect to a dead node = %v, want ErrPeerDead", err)
	}
}

func TestXRevokeWriterKilledMidOp(t *testing.T) {
	o := newTestOptions(t)
	o.PeerTimeout = 5 * time.Second // revoke timeout 10s: the kill must end the wait
	n1 := mustOpen(t, 1, o)
	r := mustRegister(t, n1, 1, 64, 2, rdma.PermReadWrite)
	ch := startChild(t, o, "stuck-writer", "id=2", "peer=1")
	ch.expect("stuck")
	revoked := make(chan error, 1)
	go func() { revoked <- r.Revoke(2) }()
	select {
	case err := <-revoked:
		t.Fatalf("Revoke returned (%v) while a live peer had an op in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	ch.kill()
	select {
	case err := <-revoked:
		if err != nil {
			t.Fatalf("Revoke after the writer died: %v", err)
		}
	case <-time.After(9 * time.Second):
		t.Fatal("Revoke still waits 9s after the in-flight writer was killed")
	}
	ch.reap()
	// A new incarnation of node 2 starts clean: no permission until
	// granted again, then its ops and a second revoke work.
	n2 := mustOpen(t, 2, o)
	if err := rdma.Write(mustConnect(t, n2, 1), 1, 0, make([]byte, 8)); !errors.Is(err, rdma.ErrPermission) {
		t.Fatalf("write after revoke = %v, want ErrPermission", err)
	}
	if err := r.Grant(2, rdma.PermReadWrite); err != nil {
		t.Fatal(err)
	}
	if err := rdma.Write(mustConnect(t, n2, 1), 1, 0, []byte("again!!!")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Revoke(2) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Revoke waits for an in-flight count left by the dead incarnation")
	}
}

func TestXRevokeLiveWriter(t *testing.T) {
	o := newTestOptions(t)
	n1 := mustOpen(t, 1, o)
	r := mustRegister(t, n1, 1, 64, 2, rdma.PermReadWrite)
	ch := startChild(t, o, "writer", "id=2", "peer=1")
	ch.expect("ready")
	time.Sleep(20 * time.Millisecond) // let it write for a while
	if err := r.Revoke(2); err != nil {
		t.Fatal(err)
	}
	after := bytes.Clone(r.Bytes())
	line := ch.expect("stopped")
	if !bytes.Contains([]byte(line), []byte(rdma.ErrPermission.Error())) {
		t.Fatalf("child writer: %q, want its op to fail with ErrPermission", line)
	}
	if !bytes.Equal(after, r.Bytes()) {
		t.Fatal("a write from the child landed after Revoke returned")
	}
	if rdma.Load64(after, 8) == 0 && rdma.Load64(after, 16) == 0 {
		t.Fatal("the child's writes never landed before Revoke")
	}
}

func TestXFutexWake(t *testing.T) {
	o := newTestOptions(t)
	o.Spin = -1
	n1 := mustOpen(t, 1, o)
	mustRegister(t, n1, 1, 64, 2, rdma.PermReadWrite)

	// Parent rings a parked child.
	w := startChild(t, o, "waiter", "id=2", "peer=1")
	w.expect("ready")
	time.Sleep(20 * time.Millisecond) // likely parked by now; correct either way
	c := mustConnect(t, n1, 2)
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: make([]byte, 8)}); err != nil {
		t.Fatal(err)
	}
	if got := w.expect("woken"); got != "woken true" {
		t.Fatalf("child waiter: %q", got)
	}

	// A child rings the parked parent.
	nf := startChild(t, o, "notifier", "id=3", "peer=1")
	nf.expect("ready")
	db := n1.Doorbell()
	s := db.Seq()
	woke := make(chan bool, 1)
	go func() { woke <- db.Wait(s, 20*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	if err := n1.regions[1].Grant(3, rdma.PermWrite); err != nil {
		t.Fatal(err)
	}
	if _, err := nf.stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	nf.expect("rang")
	if !<-woke {
		t.Fatal("a Notify write from another process did not wake the parked node")
	}
}

// TestXRevokeStoppedWriter: a peer process stopped by SIGSTOP in the middle
// of an op is alive, so Revoke cannot wait it out: it returns
// ErrRevokeTimeout after the revoke timeout, and so does a second Revoke
// while the op is still in flight. Once the process runs again its op
// finishes, its next one fails with ErrPermission, and Revoke returns nil.
func TestXRevokeStoppedWriter(t *testing.T) {
	o := newTestOptions(t)
	o.PeerTimeout = 100 * time.Millisecond // revoke timeout: 1s
	n1 := mustOpen(t, 1, o)
	r := mustRegister(t, n1, 1, 4096, 2, rdma.PermReadWrite)
	reg := r.(*Region)
	ch := startChild(t, o, "big-writer", "id=2", "peer=1")
	ch.expect("ready")
	pid := ch.cmd.Process.Pid
	defer unix.Kill(pid, unix.SIGCONT)
	off := findSlot(reg.file, regionSlots, 2)
	if off < 0 {
		t.Fatal("no slot for node 2")
	}
	stop := func() {
		t.Helper()
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			if st, _, err := procStat(pid); err == nil && (st == 'T' || st == 't') {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the writer did not stop within 5s of SIGSTOP")
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	caught := false
	for try := 0; try < 500 && !caught; try++ {
		stop()
		if rdma.Load64(reg.file, off+slotInflight) != 0 {
			caught = true
			break
		}
		unix.Kill(pid, unix.SIGCONT)
		time.Sleep(time.Duration(try%5) * 50 * time.Microsecond)
	}
	if !caught {
		t.Skip("500 SIGSTOPs never caught the writer with an op in flight")
	}
	for i := 1; i <= 2; i++ {
		start := time.Now()
		err := r.Revoke(2)
		if !errors.Is(err, ErrRevokeTimeout) {
			t.Fatalf("Revoke %d with a stopped writer mid-op = %v, want ErrRevokeTimeout", i, err)
		}
		if d := time.Since(start); d < 900*time.Millisecond {
			t.Fatalf("Revoke %d gave up after %v, before the 1s revoke timeout", i, d)
		}
	}
	if err := unix.Kill(pid, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line := ch.expect("stopped")
	if !strings.Contains(line, rdma.ErrPermission.Error()) {
		t.Fatalf("writer after SIGCONT: %q, want its next op to fail with ErrPermission", line)
	}
	if err := r.Revoke(2); err != nil {
		t.Fatalf("Revoke after the stopped op drained: %v", err)
	}
	snap := bytes.Clone(r.Bytes())
	time.Sleep(20 * time.Millisecond)
	if !bytes.Equal(snap, r.Bytes()) {
		t.Fatal("a write landed after Revoke returned nil")
	}
}

// TestXMonitorShared: the peers of every node another process owns share
// one liveness monitor of that process, across this process's Nodes (the
// client's Conns to the replicas of one kvserver, the replicas' Conns to a
// client): one /proc check per interval, not one per peer. A death found
// through one peer's ops fails the others at once, and the monitor goes
// when its last peer does. unshared plants one monitor per peer.
func TestXMonitorShared(t *testing.T) {
	for _, planted := range []bool{false, true} {
		name := "shared"
		if planted {
			name = "planted"
		}
		t.Run(name, func(t *testing.T) {
			monitors.mu.Lock()
			monitors.unshared = planted
			monitors.mu.Unlock()
			defer func() {
				monitors.mu.Lock()
				monitors.unshared = false
				monitors.mu.Unlock()
			}()
			ok := checkMonitorShared(t)
			if ok == planted {
				t.Fatalf("planted %v: every peer of the child's two nodes on one monitor = %v", planted, ok)
			}
		})
	}
}

// checkMonitorShared connects two nodes of this process to two nodes of a
// child and reports whether the four peers share one monitor; the other
// properties (a death seen through every peer, no monitor left) it
// asserts.
func checkMonitorShared(t *testing.T) bool {
	o := newTestOptions(t)
	o.PeerTimeout = 200 * time.Millisecond
	ch := startChild(t, o, "hold", "id=5", "id2=6", "peer=1")
	ch.expect("ready")
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	c15, c16 := mustConnect(t, n1, 5), mustConnect(t, n1, 6)
	c25, c26 := mustConnect(t, n2, 5), mustConnect(t, n2, 6)
	cs := []rdma.Conn{c15, c16, c25, c26}
	mons := map[*procMonitor]bool{}
	for _, c := range cs {
		m := c.(*Conn).peer.mon
		if m == nil {
			t.Fatal("a peer of another process's node has no liveness monitor")
		}
		mons[m] = true
	}
	self := mustConnect(t, n1, 2)
	if self.(*Conn).peer.mon != nil {
		t.Fatal("a peer of a node of this process has a liveness monitor (its closed flag is enough)")
	}
	shared := len(mons) == 1
	if err := rdma.Write(c15, 1, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	ch.kill()
	// Ops through c15 alone keep the monitor(s) in use until the death
	// is found.
	var comp [4]rdma.Completion
	for deadline := time.Now().Add(20 * time.Second); ; {
		if err := c15.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
		if k := c15.Poll(comp[:]); k > 0 && comp[0].Err != nil {
			if !errors.Is(comp[0].Err, rdma.ErrPeerDead) {
				t.Fatalf("op to a killed target failed with %v, want ErrPeerDead", comp[0].Err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ops to a killed target still succeed after 20s")
		}
		time.Sleep(time.Millisecond)
	}
	if shared {
		// the others' first op fails: no check of their own needed
		for _, c := range []rdma.Conn{c16, c25, c26} {
			if err := c.(*Conn).peer.checkLive(); !errors.Is(err, rdma.ErrPeerDead) {
				t.Fatalf("a peer of the dead process sharing its monitor: checkLive = %v, want ErrPeerDead", err)
			}
		}
	}
	ch.reap()
	for _, c := range append(cs, self) {
		c.Close()
	}
	n1.Close()
	n2.Close()
	monitors.mu.Lock()
	left := len(monitors.m)
	monitors.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d monitors left after every peer closed", left)
	}
	for m := range mons {
		if !m.gone.Load() {
			t.Fatal("a monitor still runs after its peers closed")
		}
	}
	return shared
}
