package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// The netns test's network: a bridge in a namespace of its own, and one
// namespace per host (3 replicas and the client) with a veth pair to the
// bridge. The addresses exist only inside these namespaces.
const (
	netnsSubnet   = "10.213.0."
	netnsClientIP = netnsSubnet + "100"
)

var netnsSeq atomic.Int32

// ipCmd runs ip(8) with args.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netnsNet is the test's network.
type netnsNet struct {
	t      *testing.T
	prefix string
	bridge string // the bridge's namespace
	hosts  map[string]string
}

// newNetnsNet makes the bridge namespace and skips the test if it cannot
// (not root, or no ip netns). Every namespace it makes is deleted at the
// end of the test, with its links.
func newNetnsNet(t *testing.T) *netnsNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("no ip(8) (iproute2): %v", err)
	}
	n := &netnsNet{t: t, prefix: fmt.Sprintf("rdmakv-%d-%d", os.Getpid(), netnsSeq.Add(1)), hosts: map[string]string{}}
	n.bridge = n.prefix + "-br"
	if err := ipCmd("netns", "add", n.bridge); err != nil {
		t.Skipf("ip netns does not work here: %v", err)
	}
	t.Cleanup(func() { n.del(n.bridge) })
	n.must("-n", n.bridge, "link", "add", "br0", "type", "bridge")
	n.must("-n", n.bridge, "link", "set", "br0", "up")
	return n
}

func (n *netnsNet) must(args ...string) {
	n.t.Helper()
	if err := ipCmd(args...); err != nil {
		n.t.Fatal(err)
	}
}

func (n *netnsNet) del(ns string) {
	if err := ipCmd("netns", "del", ns); err != nil {
		n.t.Errorf("cleanup: %v", err)
	}
}

// host makes namespace prefix-name with eth0 at ip/24, linked to the
// bridge by veth port name (h-name in the bridge's namespace), and returns
// the namespace.
func (n *netnsNet) host(name, ip string) string {
	n.t.Helper()
	ns := n.prefix + "-" + name
	n.must("netns", "add", ns)
	n.t.Cleanup(func() { n.del(ns) })
	port, peer := "h-"+name, "p-"+name
	n.must("-n", n.bridge, "link", "add", port, "type", "veth", "peer", "name", peer)
	n.must("-n", n.bridge, "link", "set", peer, "netns", ns)
	n.must("-n", ns, "link", "set", peer, "name", "eth0")
	n.must("-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
	n.must("-n", ns, "link", "set", "eth0", "up")
	n.must("-n", ns, "link", "set", "lo", "up")
	n.must("-n", n.bridge, "link", "set", port, "master", "br0")
	n.must("-n", n.bridge, "link", "set", port, "up")
	n.hosts[name] = ns
	return ns
}

// link sets host name's bridge port up or down: down, the host is cut off
// from every other (its packets and theirs are dropped), as if its cable
// were pulled.
func (n *netnsNet) link(name string, up bool) {
	n.t.Helper()
	state := map[bool]string{true: "up", false: "down"}[up]
	n.must("-n", n.bridge, "link", "set", "h-"+name, state)
}

// dialInNetns dials addr from inside network namespace ns: on a thread of
// its own that enters ns for the socket call and returns to the thread's
// namespace after (a thread that cannot return is left locked and ends
// with its goroutine).
func dialInNetns(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// Helper process: the client of the netns test, run as the test binary
// inside the client's namespace (ip netns exec). It runs a load on one
// client until a line on its stdin (or EOF), then reads every key, and
// prints its history as JSON lines (helperLine).
const (
	helperNetnsClient = "netns-client"
	helperConfigEnv   = "RDMAKV_E2E_CONFIG"
	helperSeedEnv     = "RDMAKV_E2E_SEED"
	helperKeys        = 8
)

// helperLine is one line of the helper's output.
type helperLine struct {
	Type     string      `json:"type"` // open, progress, op, done
	Acked    int64       `json:"acked,omitempty"`
	Ops      int64       `json:"ops,omitempty"`
	Unknown  int64       `json:"unknown,omitempty"`
	NErrs    int         `json:"nerrs,omitempty"`
	Errs     []string    `json:"errs,omitempty"`
	Unknowns []string    `json:"unknowns,omitempty"`
	Op       *kvcheck.Op `json:"op,omitempty"`
	Err      string      `json:"err,omitempty"`
}

// runHelper runs the helper process name and returns its exit code.
func runHelper(name string) int {
	switch name {
	case helperNetnsClient:
		return netnsClient(os.Stdin, os.Stdout)
	case helperReplica:
		return runFaultyReplica()
	case helperBalancer:
		return runBalancerReplica()
	}
	fmt.Fprintf(os.Stderr, "e2e helper: unknown helper %q\n", name)
	return 2
}

func netnsClient(in io.Reader, out io.Writer) int {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	emit := func(l helperLine) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(&l)
	}
	seed, _ := strconv.ParseUint(os.Getenv(helperSeedEnv), 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cl, err := client.Open(ctx, client.WithConfigFile(os.Getenv(helperConfigEnv)), client.WithTimeout(20*time.Second))
	cancel()
	if err != nil {
		emit(helperLine{Type: "done", Err: err.Error()})
		return 1
	}
	defer cl.Close()
	l := newLoad(cl.Map(), helperKeys, 15*time.Second, 2*time.Millisecond)
	l.start(cl, 3, seed)
	emit(helperLine{Type: "open"})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				nerr, _ := l.errors()
				emit(helperLine{Type: "progress", Acked: l.ackedNow()[0], Ops: l.ops.Load(), Unknown: l.unknown.Load(), NErrs: nerr})
			}
		}
	})
	bufio.NewReader(in).ReadString('\n') // the parent says stop (or dies)
	close(stop)
	wg.Wait()
	done := helperLine{Type: "done"}
	if !l.end(2 * l.timeout) {
		done.Err = fmt.Sprintf("the workers' calls had not returned %v after the load stopped", 2*l.timeout)
	} else if _, err := l.finalReads(cl); err != nil {
		done.Err = err.Error()
	}
	for _, op := range l.rec.History() {
		emit(helperLine{Type: "op", Op: &op})
	}
	done.NErrs, done.Errs = l.errors()
	l.mu.Lock()
	done.Unknowns = append(done.Unknowns, l.unknowns...)
	l.mu.Unlock()
	done.Acked, done.Ops, done.Unknown = l.ackedNow()[0], l.ops.Load(), l.unknown.Load()
	emit(done)
	return 0
}

// helperProc is the parent's handle on the client helper.
type helperProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncbuf.Buffer
	opened chan struct{}
	ended  chan struct{} // closed once its stdout ended and it was reaped
	acked  atomic.Int64
	mu     sync.Mutex
	ops    []kvcheck.Op
	done   *helperLine
}

// startClientHelper runs the client helper in namespace ns; it is killed
// at the end of the test if it still runs.
func startClientHelper(t *testing.T, ns, config string) *helperProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &helperProc{stderr: &syncbuf.Buffer{}, opened: make(chan struct{}), ended: make(chan struct{})}
	h.cmd = exec.Command("ip", "netns", "exec", ns, exe, "-test.run=^$")
	h.cmd.Env = append(os.Environ(), helperEnv+"="+helperNetnsClient, helperConfigEnv+"="+config,
		fmt.Sprintf("%s=%d", helperSeedEnv, time.Now().UnixNano()))
	h.cmd.Stderr = h.stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Signal(syscall.SIGKILL)
		<-h.ended
		if t.Failed() {
			t.Logf("client helper stderr:\n%s", tail(h.stderr.String(), 8<<10))
		}
	})
	go func() {
		defer close(h.ended)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		opened := false
		for sc.Scan() {
			var l helperLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				h.stderr.Write([]byte(fmt.Sprintf("(parent: bad line %q: %v)\n", sc.Text(), err)))
				continue
			}
			switch l.Type {
			case "open":
				if !opened {
					opened = true
					close(h.opened)
				}
			case "progress":
				h.acked.Store(l.Acked)
			case "op":
				h.mu.Lock()
				h.ops = append(h.ops, *l.Op)
				h.mu.Unlock()
			case "done":
				h.mu.Lock()
				h.done = &l
				h.mu.Unlock()
			}
		}
		io.Copy(io.Discard, stdout)
		h.cmd.Wait()
	}()
	return h
}

// waitAcked waits up to timeout for the helper to report n acknowledged
// writes more than since.
func (h *helperProc) waitAcked(t *testing.T, c *tcluster, since, n int64, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for h.acked.Load()-since < n {
		select {
		case <-h.ended:
			t.Fatalf("%s: the client helper ended: %s", what, tail(h.stderr.String(), 4<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("+%v: %s: %d writes acknowledged in %v, want %d%s", c.since(), what, h.acked.Load()-since, timeout, n, c.describe())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNetnsPartition runs a group of 3 kvserver replicas on the tcp
// fabric, each in a network namespace of its own (ip netns exec), linked
// by a bridge, and the client in a fourth namespace: a helper process (the
// test binary) that runs a load of gets, puts, deletes and
// compare-and-swaps and reports its history. The test cuts the leader's
// link (its bridge port down) and checks that the other two elect a
// leader and acknowledge writes in every second of the next 3 s; then it
// heals the link and checks that the old leader follows the new one and
// is ready, and that writes go on. At the end the client reads every key,
// every replica must have applied what the leader applied, and the
// client's history must be linearizable (porcupine). It needs root and
// ip(8); it skips, saying why, without them.
func TestNetnsPartition(t *testing.T) {
	n := newNetnsNet(t)
	s := spec{Name: clusterName(t, "netns"), Fabric: "tcp", Heartbeat: "5ms", Election: "100ms", PeerTimeout: "500ms",
		Clients: 2, ClientListen: netnsClientIP + ":7300"}
	s.SecretFile = writeSecret(t, t.TempDir(), "secret")
	var group []replicaSpec
	for i := int64(1); i <= 3; i++ {
		ip := fmt.Sprintf("%s%d", netnsSubnet, 10+i)
		group = append(group, replicaSpec{ID: i, Addr: ip + ":7001", Control: ip + ":7081"})
	}
	s.Groups = [][]replicaSpec{group}
	clientNS := n.host("client", netnsClientIP)
	c := newCluster(t, s)
	c.ns = map[int64]string{}
	for _, r := range group {
		c.ns[r.ID] = n.host(fmt.Sprintf("r%d", r.ID), strings.Split(r.Addr, ":")[0])
	}
	c.logf("network namespaces %s-*: a bridge, replicas at %s11-13, the client at %s", n.prefix, netnsSubnet, netnsClientIP)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	c.logf("3 replicas ready, one per namespace")

	h := startClientHelper(t, clientNS, c.path)
	select {
	case <-h.opened:
	case <-h.ended:
		t.Fatalf("the client helper ended before it connected: %s", h.stderr.String())
	case <-time.After(40 * time.Second):
		t.Fatalf("the client helper did not connect within 40s: %s", h.stderr.String())
	}
	h.waitAcked(t, c, 0, 20, 20*time.Second, "warm-up")
	time.Sleep(500 * time.Millisecond)
	c.logf("client loading from its namespace: %d writes acknowledged", h.acked.Load())

	old := c.leader(0, 10*time.Second)
	name := fmt.Sprintf("r%d", old)
	at := time.Now()
	n.link(name, false)
	nl := c.leader(0, 15*time.Second, old)
	c.logf("leader %d cut off (link down): replica %d leads %v later", old, nl, time.Since(at).Round(time.Millisecond))
	for i := range 3 {
		mark := h.acked.Load()
		time.Sleep(time.Second)
		if h.acked.Load() == mark {
			t.Fatalf("+%v: leader %d cut off, replica %d elected: no write acknowledged in second %d (%d in all)%s",
				c.since(), old, nl, i+1, mark, c.describe())
		}
	}
	if st, err := c.status(old); err == nil {
		c.logf("the cut-off leader %d sees itself as %s at epoch %s (leader %d)", old, st.Role, st.Epoch, st.Leader)
	}
	c.logf("writes acknowledged in every second of the partition: %d in all", h.acked.Load())

	hat := time.Now()
	n.link(name, true)
	st := c.waitFollowing(30*time.Second, old)
	c.logf("link of %d up: it follows %d at epoch %s and is ready %v later", old, st.Leader, st.Epoch, time.Since(hat).Round(time.Millisecond))
	h.waitAcked(t, c, h.acked.Load(), 20, 20*time.Second, "after the heal")

	io.WriteString(h.stdin, "stop\n")
	select {
	case <-h.ended:
	case <-time.After(60 * time.Second):
		t.Fatalf("the client helper did not end within 60s of stop: %s", h.stderr.String())
	}
	h.mu.Lock()
	done, hist := h.done, h.ops
	h.mu.Unlock()
	if done == nil {
		t.Fatalf("the client helper ended without its history (%v): %s", h.cmd.ProcessState, h.stderr.String())
	}
	applied := c.waitConvergedTCP(20*time.Second, "tcp")
	c.logf("client: %d calls, %d acknowledged writes, %d of unknown outcome; every replica applied %d", done.Ops, done.Acked, done.Unknown, applied[0])
	if done.Err != "" {
		t.Errorf("client helper: %s", done.Err)
	}
	for _, e := range done.Errs {
		t.Errorf("unexpected error: %s", e)
	}
	if done.NErrs > len(done.Errs) {
		t.Errorf("and %d more unexpected errors", done.NErrs-len(done.Errs))
	}
	for _, u := range done.Unknowns {
		t.Logf("unknown outcome: %s", u)
	}
	// The final reads are the last helperKeys gets of the history.
	final := map[string]string{}
	var keys []string
	for i := max(0, len(hist)-helperKeys); i < len(hist); i++ {
		o := hist[i]
		keys = append(keys, o.Key)
		if o.Kind == kvcheck.Get && o.Out.Found {
			final[o.Key] = o.Out.Value
		}
	}
	checkFinal(t, hist, keys, final)
	checkHistory(t, hist)
}
