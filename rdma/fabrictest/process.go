package fabrictest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/syncbuf"
	"github.com/rdmakv/rdmakv/rdma"
)

// Helper processes. The suite re-executes the test binary (os.Args[0] with
// -test.run=^$) with RoleEnv naming a role and ParamsEnv carrying a JSON
// roleParams; Main sees RoleEnv and plays the role instead of running tests.
// A helper talks to the suite in lines: it prints "ready" once it can be
// used, reads commands ("go") on stdin, prints results ("done", "err ...",
// "faa v v ...") on stdout, logs on stderr, and exits when stdin reaches EOF,
// so that helpers never outlive a dead suite.

// ParamsEnv is the environment variable that carries a helper's parameters
// (JSON) next to RoleEnv.
const ParamsEnv = "RDMAKV_FABRICTEST_PARAMS"

// Helper roles.
const (
	roleServe   = "serve"   // own Region of Size bytes, grant Grants, live until stdin EOF
	roleFIFO    = "fifo"    // on "go": write N FIFO slots and counters into Peer's Region
	roleHammer  = "hammer"  // write area K of Peer's region 1 until an op fails
	roleAtomics = "atomics" // on "go": N FetchAdds at 0 and N/2 CAS increments at 8
	rolePinger  = "pinger"  // own Region, answer N doorbell ping-pong rounds from Peer
)

// roleParams are a helper's parameters.
type roleParams struct {
	Config string                    // the cluster, as from Harness.NewCluster
	ID     rdma.NodeID               // the node the helper opens
	Peer   rdma.NodeID               // the node it connects to
	Region rdma.RegionID             // the region it owns (serve, pinger) or targets
	Size   int                       // size of the region it owns
	Grants map[rdma.NodeID]rdma.Perm // grants on the region it owns
	N      int                       // rounds
	K      int                       // hammer: area index
}

// Main runs the test binary: when RoleEnv is set, the process is a helper
// started by the suite and plays that role with h; otherwise it runs the
// tests. Call it from TestMain of every fabric's tests.
func Main(m *testing.M, h Harness) {
	if role := os.Getenv(RoleEnv); role != "" {
		os.Exit(runRole(role, os.Getenv(ParamsEnv), h))
	}
	os.Exit(m.Run())
}

// helperIO is a helper's side of the line protocol.
type helperIO struct {
	mu   sync.Mutex
	out  *bufio.Writer
	cmds chan string // lines from stdin; closed at EOF
}

func (h *helperIO) say(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.out, format+"\n", args...)
	h.out.Flush()
}

// await waits for command cmd; it reports false at stdin EOF.
func (h *helperIO) await(cmd string) bool {
	for line := range h.cmds {
		if line == cmd {
			return true
		}
	}
	return false
}

// runRole plays role and returns the process exit code.
func runRole(role, params string, h Harness) int {
	var p roleParams
	if err := json.Unmarshal([]byte(params), &p); err != nil {
		fmt.Fprintf(os.Stderr, "fabrictest helper %s: bad %s: %v\n", role, ParamsEnv, err)
		return 2
	}
	hio := &helperIO{out: bufio.NewWriter(os.Stdout), cmds: make(chan string, 16)}
	eof := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			hio.cmds <- sc.Text()
		}
		close(hio.cmds)
		close(eof)
	}()
	n, err := h.Open(p.Config, p.ID)
	if err != nil {
		hio.say("err open node %d: %v", p.ID, err)
		return 1
	}
	go func() {
		// The suite closed stdin or died: leave, closing the node if that
		// does not hang.
		<-eof
		done := make(chan struct{})
		go func() { n.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		os.Exit(0)
	}()
	if err := playRole(role, p, n, hio); err != nil {
		hio.say("err %v", err)
		fmt.Fprintf(os.Stderr, "fabrictest helper %s node %d: %v\n", role, p.ID, err)
	}
	<-eof // the suite decides when helpers end; the goroutine above exits
	time.Sleep(5 * time.Second)
	return 0
}

func playRole(role string, p roleParams, n rdma.Node, hio *helperIO) error {
	var r rdma.Region
	if role == roleServe || role == rolePinger {
		var err error
		if r, err = n.Register(p.Region, p.Size); err != nil {
			return fmt.Errorf("register region %d: %w", p.Region, err)
		}
		for peer, perm := range p.Grants {
			if err := r.Grant(peer, perm); err != nil {
				return fmt.Errorf("grant %v to node %d: %w", perm, peer, err)
			}
		}
	}
	var c rdma.Conn
	if role != roleServe {
		var err error
		if c, err = n.Connect(p.Peer); err != nil {
			return fmt.Errorf("connect to node %d: %w", p.Peer, err)
		}
	}
	hio.say("ready")
	switch role {
	case roleServe:
		return nil
	case roleFIFO:
		if !hio.await("go") {
			return nil
		}
		if _, err := fifoWriter(c, p.Region, p.N); err != nil {
			return err
		}
	case roleHammer:
		var never atomic.Bool
		err := hammer(c, p.K, &never, nil)
		hio.say("stopped perm=%v cause=%v connerr=%v", errors.Is(err, rdma.ErrPermission), err, errors.Is(c.Err(), rdma.ErrPermission))
		return nil
	case roleAtomics:
		if !hio.await("go") {
			return nil
		}
		faas, cass, err := atomicsWorker(c, p.Region, 0, 8, fixedQuota(p.N))
		if err != nil {
			return err
		}
		hio.say("faa %s", joinUints(faas))
		hio.say("cas %s", joinUints(cass))
	case rolePinger:
		if err := pingPong(c, n.Doorbell(), r.Bytes(), p.N, false); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	hio.say("done")
	return nil
}

func joinUints(vs []uint64) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatUint(v, 10))
	}
	return b.String()
}

func parseUints(s string) ([]uint64, error) {
	var vs []uint64
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// child is a helper process seen from the suite.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout lines; closed at EOF
	stderr *syncbuf.Buffer
	exited chan struct{}
}

// spawn starts a helper playing role as node p.ID of cl and waits until it
// is ready. It is killed when the test ends.
func spawn(cl *cluster, role string, p roleParams) *child {
	t := cl.t
	t.Helper()
	p.Config = cl.cfg
	params, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("helper params: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), RoleEnv+"="+role, ParamsEnv+"="+string(params))
	c := &child{t: t, name: fmt.Sprintf("helper %s (node %d)", role, p.ID), cmd: cmd,
		lines: make(chan string, 64), stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.stop)
	if _, err := c.expect("ready", liveTimeout+10*time.Second); err != nil {
		t.Fatalf("%v (does TestMain call fabrictest.Main?)", err)
	}
	return c
}

// stop ends the helper: stdin EOF first, SIGKILL if it lingers.
func (c *child) stop() {
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(3 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
	if c.t.Failed() {
		if s := c.stderr.String(); s != "" {
			c.t.Logf("%s stderr:\n%s", c.name, s)
		}
	}
}

// kill sends SIGKILL, as a crash, and waits until the process is gone.
func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.exited
}

func (c *child) send(line string) {
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Errorf("%s: send %q: %v", c.name, line, err)
	}
}

// expect waits for the helper's next line starting with word and returns
// the rest. An "err" line, EOF or the timeout is an error.
func (c *child) expect(word string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				return "", fmt.Errorf("%s exited before printing %q; stderr:\n%s", c.name, word, c.stderr.String())
			}
			if line == word || strings.HasPrefix(line, word+" ") {
				return strings.TrimPrefix(strings.TrimPrefix(line, word), " "), nil
			}
			if strings.HasPrefix(line, "err ") {
				return "", fmt.Errorf("%s: %s", c.name, strings.TrimPrefix(line, "err "))
			}
			c.t.Logf("%s: %s", c.name, line)
		case <-deadline:
			return "", fmt.Errorf("%s printed no %q within %v", c.name, word, timeout)
		}
	}
}
