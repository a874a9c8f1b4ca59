package shm

import (
	"bytes"
	"errors"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/fabrictest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		runRole(role) // this package's own helper roles (helper_test.go)
	}
	fabrictest.Main(m, harness)
}

// opErr posts wr signaled and returns the completion's error (or Post's).
func opErr(c rdma.Conn, wr rdma.WR) error {
	_, err := rdma.Do(c, wr, 5*time.Second)
	return err
}

func TestVerbs(t *testing.T) {
	o := newTestOptions(t)
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	r := mustRegister(t, n2, 1, 100, 1, rdma.PermReadWrite)
	if got := len(r.Bytes()); got != 104 {
		t.Fatalf("region of 100 bytes has %d, want 104 (rounded to 8)", got)
	}
	c := mustConnect(t, n1, 2)
	if err := rdma.Write(c, 1, 8, []byte("hello, w")); err != nil {
		t.Fatal(err)
	}
	if got := string(r.Bytes()[8:16]); got != "hello, w" {
		t.Fatalf("owner sees %q after write", got)
	}
	buf := make([]byte, 8)
	if err := rdma.Read(c, 1, 8, buf); err != nil || string(buf) != "hello, w" {
		t.Fatalf("read = %q, %v", buf, err)
	}
	if old, err := rdma.FetchAdd(c, 1, 16, 5); err != nil || old != 0 {
		t.Fatalf("faa = %d, %v", old, err)
	}
	if old, err := rdma.CompareAndSwap(c, 1, 16, 5, 9); err != nil || old != 5 {
		t.Fatalf("cas = %d, %v", old, err)
	}
	if old, err := rdma.CompareAndSwap(c, 1, 16, 5, 7); err != nil || old != 9 {
		t.Fatalf("failed cas = %d, %v", old, err)
	}
	if got := rdma.Load64(r.Bytes(), 16); got != 9 {
		t.Fatalf("word after atomics = %d, want 9", got)
	}
	if err := c.Post(rdma.WR{Kind: rdma.OpFetchAdd, Region: 1, Offset: 4}); !errors.Is(err, rdma.ErrUnaligned) {
		t.Fatalf("unaligned faa: Post = %v, want ErrUnaligned", err)
	}
	if c.Err() != nil {
		t.Fatalf("a rejected Post broke the Conn: %v", c.Err())
	}
}

func TestErrorsBreakConn(t *testing.T) {
	o := newTestOptions(t)
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	r := mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	mustRegister(t, n2, 2, 64, 1, rdma.PermRead)
	mustRegister(t, n2, 3, 64, 3, rdma.PermReadWrite) // another peer only
	before := bytes.Clone(r.Bytes())
	cases := []struct {
		name string
		wr   rdma.WR
		want error
	}{
		{"write past end", rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: 60, Buf: make([]byte, 8)}, rdma.ErrBounds},
		{"offset overflow", rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: ^uint64(0) - 3, Buf: []byte{1, 2, 3, 4, 5, 6, 7, 8}}, rdma.ErrBounds},
		{"faa past end", rdma.WR{Kind: rdma.OpFetchAdd, Region: 1, Offset: 64, Value: 1}, rdma.ErrBounds},
		{"write read-only", rdma.WR{Kind: rdma.OpWrite, Region: 2, Buf: make([]byte, 8)}, rdma.ErrPermission},
		{"cas read-only", rdma.WR{Kind: rdma.OpCompareAndSwap, Region: 2}, rdma.ErrPermission},
		{"never granted", rdma.WR{Kind: rdma.OpRead, Region: 3, Buf: make([]byte, 8)}, rdma.ErrPermission},
		{"no region", rdma.WR{Kind: rdma.OpRead, Region: 9, Buf: make([]byte, 8)}, rdma.ErrNoRegion},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustConnect(t, n1, 2)
			err := opErr(c, tc.wr)
			var oe *rdma.OpError
			if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Peer != 2 {
				t.Fatalf("op error = %v, want an OpError wrapping %v", err, tc.want)
			}
			if err := c.Post(rdma.WR{Kind: rdma.OpRead, Region: 1, Buf: make([]byte, 8)}); !errors.Is(err, rdma.ErrConnBroken) {
				t.Fatalf("Post after a failed op = %v, want ErrConnBroken", err)
			}
			if !bytes.Equal(r.Bytes(), before) {
				t.Fatal("a failed op changed region memory")
			}
			if err := rdma.Write(mustConnect(t, n1, 2), 1, 0, make([]byte, 8)); err != nil {
				t.Fatalf("a new Conn after the error: %v", err)
			}
		})
	}
}

func TestRegionCloseAndReregister(t *testing.T) {
	o := newTestOptions(t)
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	r := mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	if _, err := n2.Register(1, 64); !errors.Is(err, rdma.ErrRegionExists) {
		t.Fatalf("second Register(1) = %v, want ErrRegionExists", err)
	}
	c := mustConnect(t, n1, 2)
	if err := rdma.Write(c, 1, 0, []byte("AAAAAAAA")); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := opErr(mustConnect(t, n1, 2), rdma.WR{Kind: rdma.OpRead, Region: 1, Buf: make([]byte, 8)}); !errors.Is(err, rdma.ErrNoRegion) {
		t.Fatalf("op on a closed region = %v, want ErrNoRegion", err)
	}
	r2 := mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	// c mapped the old file; its next op must land in the new region.
	if err := rdma.Write(c, 1, 0, []byte("BBBBBBBB")); err != nil {
		t.Fatal(err)
	}
	if got := string(r2.Bytes()[:8]); got != "BBBBBBBB" {
		t.Fatalf("new region holds %q after a write through an old Conn", got)
	}
}

func TestFilesAndNodeIDs(t *testing.T) {
	o := newTestOptions(t)
	if _, err := Open(1, Options{Dir: o.Dir, Cluster: "bad.name"}); err == nil {
		t.Fatal("Open accepted cluster name with a dot")
	}
	if _, err := Open(1, Options{Dir: filepath.Join(o.Dir, "missing"), Cluster: "c"}); err == nil {
		t.Fatal("Open accepted a directory that does not exist")
	}
	n, err := Open(1, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Register(1, 128); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(1, o); !errors.Is(err, ErrNodeInUse) {
		t.Fatalf("second Open(1) = %v, want ErrNodeInUse", err)
	}
	if ents, _ := os.ReadDir(o.Dir); len(ents) != 2 {
		t.Fatalf("directory holds %d files with a node and a region open, want 2", len(ents))
	}
	if _, err := n.Connect(99); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Fatalf("Connect(99) = %v, want ErrUnknownPeer", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(o.Dir); len(ents) != 0 {
		t.Fatalf("directory holds %v after Close, want nothing", ents)
	}
	big := mustOpen(t, 0xFFFFFFFF, o) // any uint32 id
	mustRegister(t, big, 0xFFFFFFFF, 8, 0xFFFFFFFF, rdma.PermReadWrite)
	if err := rdma.Write(mustConnect(t, big, 0xFFFFFFFF), 0xFFFFFFFF, 0, make([]byte, 8)); err != nil {
		t.Fatalf("loopback write with the largest ids: %v", err)
	}
}

func TestClosedPeer(t *testing.T) {
	o := newTestOptions(t)
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, n1, 2)
	if err := rdma.Write(c, 1, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	n2.Close()
	if err := opErr(c, rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: make([]byte, 8)}); !errors.Is(err, rdma.ErrPeerDead) {
		t.Fatalf("write to a closed node = %v, want ErrPeerDead", err)
	}
	// A restarted node 2 is reachable through a new Conn.
	n2b := mustOpen(t, 2, o)
	r := mustRegister(t, n2b, 1, 64, 1, rdma.PermReadWrite)
	if err := rdma.Write(mustConnect(t, n1, 2), 1, 0, []byte("restart!")); err != nil {
		t.Fatal(err)
	}
	if string(r.Bytes()[:8]) != "restart!" {
		t.Fatal("write to the restarted node did not land")
	}
}

func TestCorruptFiles(t *testing.T) {
	o := newTestOptions(t)
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(o.Dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	garbage := bytes.Repeat([]byte{0xA5}, nodeFileSize)
	write(nodeFileName(o.Cluster, 7), garbage)
	write(nodeFileName(o.Cluster, 8), []byte("short"))
	n1 := mustOpen(t, 1, o) // a foreign file does not stop other nodes
	n2 := mustOpen(t, 2, o)
	for _, id := range []rdma.NodeID{7, 8} {
		if _, err := n1.Connect(id); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Connect(%d) to a corrupt node file = %v, want ErrCorrupt", id, err)
		}
		if _, err := Open(id, o); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Open(%d) over a corrupt node file = %v, want ErrCorrupt", id, err)
		}
	}
	// A valid node file under another node's name.
	nf, err := os.ReadFile(filepath.Join(o.Dir, nodeFileName(o.Cluster, 2)))
	if err != nil {
		t.Fatal(err)
	}
	write(nodeFileName(o.Cluster, 9), nf)
	if _, err := n1.Connect(9); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Connect(9) to a copy of node 2's file = %v, want ErrCorrupt", err)
	}
	if _, err := Open(9, o); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open(9) over a copy of node 2's file = %v, want ErrCorrupt", err)
	}
	// Region files: garbage, too short, and a valid header whose sizes lie.
	write(regionFileName(o.Cluster, 2, 5), garbage)
	write(regionFileName(o.Cluster, 2, 6), []byte("x"))
	lying := make([]byte, regionDataOff+64)
	encodeRegionHeader(lying, regionHeader{size: 1 << 20, node: 2, region: 7, owner: n2.self, slots: regionSlots, dataOff: regionDataOff})
	write(regionFileName(o.Cluster, 2, 7), lying)
	for _, rid := range []rdma.RegionID{5, 6, 7} {
		err := opErr(mustConnect(t, n1, 2), rdma.WR{Kind: rdma.OpWrite, Region: rid, Buf: make([]byte, 8)})
		if !errors.Is(err, rdma.ErrNoRegion) || !errors.Is(err, ErrCorrupt) {
			t.Errorf("write to corrupt region file %d = %v, want ErrNoRegion and ErrCorrupt", rid, err)
		}
	}
}

func TestRevokeStopsWriter(t *testing.T) {
	o := newTestOptions(t)
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	r := mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, n1, 2)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 8)
		var cs [1]rdma.Completion
		for v := uint64(1); ; v++ {
			buf[0] = byte(v)
			if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(v%8) * 8, Buf: buf}); err != nil {
				done <- err
				return
			}
			if v == 100 {
				close(started)
			}
			if c.Poll(cs[:]) > 0 {
				done <- cs[0].Err
				return
			}
		}
	}()
	<-started
	if err := r.Revoke(1); err != nil {
		t.Fatal(err)
	}
	after := bytes.Clone(r.Bytes())
	err := <-done
	if !errors.Is(err, rdma.ErrPermission) {
		t.Fatalf("writer's op after Revoke failed with %v, want ErrPermission", err)
	}
	if !bytes.Equal(after, r.Bytes()) {
		t.Fatal("a write landed after Revoke returned")
	}
	// A downgrade to read-only: reads work, writes do not.
	if err := r.Grant(1, rdma.PermReadWrite); err != nil {
		t.Fatal(err)
	}
	if err := r.Grant(1, rdma.PermRead); err != nil {
		t.Fatal(err)
	}
	c2 := mustConnect(t, n1, 2)
	if err := rdma.Read(c2, 1, 0, make([]byte, 8)); err != nil {
		t.Fatalf("read after downgrade: %v", err)
	}
	if err := rdma.Write(c2, 1, 0, make([]byte, 8)); !errors.Is(err, rdma.ErrPermission) {
		t.Fatalf("write after downgrade = %v, want ErrPermission", err)
	}
}

func TestDoorbell(t *testing.T) {
	o := newTestOptions(t)
	o.Spin = -1 // park at once: exercise the futex path
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	db := n2.Doorbell()
	s := db.Seq()
	if db.Wait(s, 20*time.Millisecond) {
		t.Fatal("Wait returned true with no ring")
	}
	db.Ring()
	if !db.Wait(s, time.Second) || db.Seq() == s {
		t.Fatal("Wait after Ring did not see it")
	}
	// A parked waiter is woken by a Notify write, and by Close.
	mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, n1, 2)
	woke := make(chan bool)
	s = db.Seq()
	go func() { woke <- db.Wait(s, 20*time.Second) }()
	time.Sleep(10 * time.Millisecond)
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: make([]byte, 8)}); err != nil {
		t.Fatal(err)
	}
	if !<-woke {
		t.Fatal("Notify write did not wake the parked waiter")
	}
	s = db.Seq()
	go func() { woke <- db.Wait(s, 20*time.Second) }()
	time.Sleep(10 * time.Millisecond)
	n2.Close()
	if !<-woke {
		t.Fatal("Close did not wake the parked waiter")
	}
	if s = db.Seq(); db.Wait(s, 10*time.Millisecond) {
		t.Fatal("Wait on a closed node's final Seq reported a ring")
	}
}

// TestDoorbellPingPong passes a token back and forth with Notify writes
// between two parked nodes; a lost wake-up shows as a 10 s stall.
func TestDoorbellPingPong(t *testing.T) {
	o := newTestOptions(t)
	for _, spin := range []time.Duration{-1, 0} {
		o.Spin = spin
		a, b := mustOpen(t, 1, o), mustOpen(t, 2, o)
		ra := mustRegister(t, a, 1, 8, 2, rdma.PermReadWrite)
		rb := mustRegister(t, b, 1, 8, 1, rdma.PermReadWrite)
		const rounds = 300
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		play := func(self *Node, mine rdma.Region, other rdma.NodeID, first bool) {
			defer wg.Done()
			c, err := self.Connect(other)
			if err != nil {
				errs <- err
				return
			}
			buf := make([]byte, 8)
			for i := uint64(1); i <= rounds; i++ {
				want := i // the other's i-th token, or its (i-1)-th if we lead
				if first {
					want--
				}
				if want > 0 {
					for {
						s := self.Doorbell().Seq()
						if rdma.Load64(mine.Bytes(), 0) >= want {
							break
						}
						if !self.Doorbell().Wait(s, 10*time.Second) {
							errs <- errors.New("lost wake-up: no ring in 10s")
							return
						}
					}
				}
				buf[0], buf[1] = byte(i), byte(i>>8)
				if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: buf}); err != nil {
					errs <- err
					return
				}
			}
		}
		wg.Add(2)
		go play(a, ra, 2, true)
		go play(b, rb, 1, false)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("spin %v: %v", spin, err)
		}
		a.Close()
		b.Close()
	}
}

func TestProcIdent(t *testing.T) {
	self, err := selfIdent()
	if err != nil {
		t.Fatal(err)
	}
	if !self.alive() {
		t.Fatal("own process is not alive")
	}
	if other := self + 1<<pidBits; other.alive() {
		t.Fatal("own pid with another start time (a reused pid) counts as alive")
	}
	if procIdent(0).alive() {
		t.Fatal("identity 0 counts as alive")
	}
}

// TestProcIdentFailureToLookIsNotDeath: when /proc cannot be read (here:
// the process is out of file descriptors) a live process still counts as
// alive. A wrong "dead" would let Revoke return with a write in flight and
// would cut a live peer off for good.
func TestProcIdentFailureToLookIsNotDeath(t *testing.T) {
	self, err := selfIdent()
	if err != nil {
		t.Fatal(err)
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
		unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	}()
	low := old
	low.Cur = 256
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		held = append(held, fd)
	}
	if _, _, err := procStat(self.pid()); err == nil {
		t.Fatal("procStat succeeded with no file descriptor left: the test does not exercise the failure")
	}
	if !self.alive() {
		t.Fatal("own process counts as dead because /proc could not be read")
	}
}

// TestRevokeTimeout: a live peer that never finishes its op (simulated by
// announcing one in its in-flight word) makes Revoke give up with
// ErrRevokeTimeout instead of waiting forever.
func TestRevokeTimeout(t *testing.T) {
	o := newTestOptions(t)
	o.PeerTimeout = 100 * time.Millisecond // revoke timeout: 1s
	n1, n2 := mustOpen(t, 1, o), mustOpen(t, 2, o)
	r := mustRegister(t, n2, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, n1, 2)
	if err := rdma.Write(c, 1, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	rr := c.(*Conn).regions[1]
	inflight := int(rr.slot.Load()) + slotInflight
	rdma.Add64(rr.file, inflight, 1)
	if err := r.Revoke(1); !errors.Is(err, ErrRevokeTimeout) {
		t.Fatalf("Revoke with a live op stuck in flight = %v, want ErrRevokeTimeout", err)
	}
	rdma.Add64(rr.file, inflight, ^uint64(0))
	if err := rdma.Write(c, 1, 0, make([]byte, 8)); !errors.Is(err, rdma.ErrPermission) {
		t.Fatalf("write after the timed-out revoke = %v, want ErrPermission", err)
	}
	if err := r.Grant(1, rdma.PermReadWrite); err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(1); err != nil {
		t.Fatalf("Revoke once the op finished: %v", err)
	}
}

func TestPeerTableFull(t *testing.T) {
	o := newTestOptions(t)
	n := mustOpen(t, 1, o)
	r, err := n.Register(1, 8)
	if err != nil {
		t.Fatal(err)
	}
	for p := range rdma.NodeID(regionSlots) {
		if err := r.Grant(p*7919, rdma.PermRead); err != nil {
			t.Fatalf("grant to peer %d of %d: %v", p, regionSlots, err)
		}
	}
	if err := r.Grant(1<<31, rdma.PermRead); err == nil {
		t.Fatalf("grant to peer %d beyond the table's %d slots succeeded", regionSlots+1, regionSlots)
	}
	// In a full table a granted peer is found and an ungranted one is
	// refused (the probe ends).
	granted := mustOpen(t, 7919, o)
	if err := rdma.Read(mustConnect(t, granted, 1), 1, 0, make([]byte, 8)); err != nil {
		t.Fatalf("read by granted node 7919: %v", err)
	}
	if err := rdma.Read(mustConnect(t, n, 1), 1, 0, make([]byte, 8)); !errors.Is(err, rdma.ErrPermission) {
		t.Fatalf("read by the never-granted node 1 = %v, want ErrPermission", err)
	}
	if err := r.Revoke(7919 * 5); err != nil {
		t.Fatal(err)
	}
}

// TestDoorbellWaitStats checks rdma.DoorbellWaits' counts of the shm
// doorbell's waits: a ring during the spin is a spin hit and no park; a
// wait that parks is a park, a ring-ended one a park wake too.
func TestDoorbellWaitStats(t *testing.T) {
	o := newTestOptions(t)
	o.Spin = time.Hour // spins until rung
	n := mustOpen(t, 1, o)
	db := n.Doorbell()
	w0 := rdma.DoorbellWaits()
	s := db.Seq()
	go func() {
		time.Sleep(time.Millisecond)
		db.Ring()
	}()
	if !db.Wait(s, time.Minute) {
		t.Fatal("Wait did not see the ring")
	}
	w1 := rdma.DoorbellWaits()
	if got := (rdma.WaitStats{Spins: w1.Spins - w0.Spins, SpinHits: w1.SpinHits - w0.SpinHits, Parks: w1.Parks - w0.Parks}); got != (rdma.WaitStats{Spins: 1, SpinHits: 1}) {
		t.Fatalf("a wait rung while spinning counted %+v, want one spin, one hit, no park", got)
	}

	o2 := newTestOptions(t)
	o2.Spin = -1 // park at once
	db2 := mustOpen(t, 2, o2).Doorbell()
	s = db2.Seq()
	if db2.Wait(s, time.Millisecond) {
		t.Fatal("Wait returned true with no ring")
	}
	go func() {
		time.Sleep(time.Millisecond)
		db2.Ring()
	}()
	if !db2.Wait(s, time.Minute) {
		t.Fatal("Wait did not see the ring")
	}
	w2 := rdma.DoorbellWaits()
	if got := (rdma.WaitStats{Spins: w2.Spins - w1.Spins, Parks: w2.Parks - w1.Parks, ParkWakes: w2.ParkWakes - w1.ParkWakes}); got != (rdma.WaitStats{Parks: 2, ParkWakes: 1}) {
		t.Fatalf("a timed-out park and a rung one counted %+v, want two parks, one woken, no spin", got)
	}
}
