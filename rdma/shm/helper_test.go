package shm

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Cross-process tests re-execute the test binary with roleEnv set; the
// child plays the role (see runRole), talks over stdout lines and reads
// stdin until it is closed or it is killed.
const (
	roleEnv    = "RDMAKV_SHM_TEST_ROLE"
	dirEnv     = "RDMAKV_SHM_TEST_DIR"
	clusterEnv = "RDMAKV_SHM_TEST_CLUSTER"
)

// newTestOptions returns options for a fresh cluster in a fresh directory
// under /dev/shm, removed when the test ends.
func newTestOptions(t testing.TB) Options {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-shmtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return Options{Dir: dir, Cluster: "test", PeerTimeout: 2 * time.Second}
}

func mustOpen(t testing.TB, id rdma.NodeID, o Options) *Node {
	t.Helper()
	n, err := Open(id, o)
	if err != nil {
		t.Fatalf("Open(%d): %v", id, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func mustRegister(t testing.TB, n *Node, id rdma.RegionID, size int, peer rdma.NodeID, p rdma.Perm) rdma.Region {
	t.Helper()
	r, err := n.Register(id, size)
	if err != nil {
		t.Fatalf("Register(%d): %v", id, err)
	}
	if err := r.Grant(peer, p); err != nil {
		t.Fatalf("Grant: %v", err)
	}
	return r
}

func mustConnect(t testing.TB, n *Node, peer rdma.NodeID) rdma.Conn {
	t.Helper()
	c, err := n.Connect(peer)
	if err != nil {
		t.Fatalf("Connect(%d -> %d): %v", n.ID(), peer, err)
	}
	return c
}

// child is a re-executed test binary playing a role.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startChild runs role with args in a child process of the cluster o.
func startChild(t *testing.T, o Options, role string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role, dirEnv+"="+o.Dir, clusterEnv+"="+o.Cluster)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// expect waits for the child's next line and checks its prefix.
func (c *child) expect(prefix string) string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("child exited while the test waited for %q", prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			c.t.Fatalf("child said %q, want %q...", l, prefix)
		}
		return l
	case <-time.After(20 * time.Second):
		c.t.Fatalf("child silent for 20s while the test waited for %q", prefix)
	}
	return ""
}

// kill SIGKILLs the child without reaping it: it stays a zombie until
// reap, as a crashed process whose parent is slow.
func (c *child) kill() {
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *child) reap() { c.cmd.Wait() }

// awaitZombie waits (at most 10 s) until the killed, unreaped child is a
// zombie: SIGKILL is delivered asynchronously, so right after kill the
// process may still be running.
func (c *child) awaitZombie() {
	stat := fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return // gone altogether
		}
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return
		}
	}
	c.t.Fatalf("child %d did not become a zombie within 10 s of its kill", c.cmd.Process.Pid)
}

// runRole plays the role named by roleEnv and exits the process.
func runRole(role string) {
	o := Options{Dir: os.Getenv(dirEnv), Cluster: os.Getenv(clusterEnv), PeerTimeout: 2 * time.Second}
	args := map[string]uint64{}
	for _, a := range os.Args[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			args[k] = n
		}
	}
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "shm test role %s: "+format+"\n", append([]any{role}, a...)...)
		os.Exit(3)
	}
	if role == "waiter" {
		o.Spin = -1
	}
	if role == "owned" { // the node lives in a directory of its own, marked as ours
		d, err := MkdirOwned(o.Dir, "owned-")
		if err != nil {
			fail("mkdir: %v", err)
		}
		o.Dir = d
	}
	n, err := Open(rdma.NodeID(args["id"]), o)
	if err != nil {
		fail("open: %v", err)
	}
	// A region granted to peer, so the parent can write (and Notify) here.
	if r, err := n.Register(1, 4096); err != nil {
		fail("register: %v", err)
	} else if err := r.Grant(rdma.NodeID(args["peer"]), rdma.PermReadWrite); err != nil {
		fail("grant: %v", err)
	}
	var n2 *Node // a second node of this process (id2), granting peer as well
	if id2 := args["id2"]; id2 != 0 {
		if n2, err = Open(rdma.NodeID(id2), o); err != nil {
			fail("open %d: %v", id2, err)
		}
		if r, err := n2.Register(1, 4096); err != nil {
			fail("register: %v", err)
		} else if err := r.Grant(rdma.NodeID(args["peer"]), rdma.PermReadWrite); err != nil {
			fail("grant: %v", err)
		}
	}
	switch role {
	case "hold":
		fmt.Println("ready")
	case "owned":
		fmt.Println("ready", o.Dir)
	case "waiter":
		db := n.Doorbell()
		seq := db.Seq()
		fmt.Println("ready")
		fmt.Printf("woken %v\n", db.Wait(seq, 20*time.Second))
	case "notifier":
		c, err := n.Connect(rdma.NodeID(args["peer"]))
		if err != nil {
			fail("connect: %v", err)
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n') // "go"
		if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: make([]byte, 8)}); err != nil {
			fail("post: %v", err)
		}
		fmt.Println("rang")
	case "stuck-writer", "writer", "big-writer":
		c, err := n.Connect(rdma.NodeID(args["peer"]))
		if err != nil {
			fail("connect: %v", err)
		}
		if err := rdma.Write(c, 1, 0, make([]byte, 8)); err != nil {
			fail("first write: %v", err)
		}
		if role == "stuck-writer" {
			// Announce an op and never finish it, as a process killed
			// between its in-flight increment and its store.
			rr := c.(*Conn).regions[1]
			rdma.Add64(rr.file, int(rr.slot.Load())+slotInflight, 1)
			fmt.Println("stuck")
			break
		}
		fmt.Println("ready")
		buf := make([]byte, 8)
		if role == "big-writer" {
			// Whole-region writes: the op's window is open most of the
			// time, so a SIGSTOP likely catches one in flight.
			buf = make([]byte, 4096)
		}
		for v := uint64(1); ; v++ {
			binary.LittleEndian.PutUint64(buf, v)
			off := 8 * (v % 8)
			if role == "big-writer" {
				off = 0
			}
			if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: off, Buf: buf}); err != nil {
				fail("post: %v", err)
			}
			var cs [1]rdma.Completion
			if c.Poll(cs[:]) > 0 {
				fmt.Printf("stopped %d %v\n", v, cs[0].Err)
				break
			}
		}
	default:
		fail("unknown role")
	}
	io.Copy(io.Discard, os.Stdin) // until the parent closes stdin or kills us
	n.Close()
	if n2 != nil {
		n2.Close()
	}
	os.Exit(0)
}
