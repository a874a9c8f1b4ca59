package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// A cluster of kvserver processes run from a TOML config (one process per
// replica, kvserver --config FILE --id N), so that single replicas can be
// killed; kvcli reaches it with --config.
type procCluster struct {
	t      *testing.T
	dir    string
	kvcli  string
	config string
	env    []string
	ctl    map[int]string // control address by replica id
	procs  map[int]*exec.Cmd
	groups [][]int
}

// freeLoopbackPorts returns n loopback ports that were free a moment ago
// (consecutive if consecutive).
func freeLoopbackPorts(t *testing.T, n int, consecutive bool) []int {
	t.Helper()
	for range 200 {
		var ls []net.Listener
		var ps []int
		ok := true
		for i := range n {
			addr := "127.0.0.1:0"
			if consecutive && i > 0 {
				addr = fmt.Sprintf("127.0.0.1:%d", ps[0]+i)
			}
			l, err := net.Listen("tcp", addr)
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
			ps = append(ps, l.Addr().(*net.TCPAddr).Port)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return ps
		}
	}
	t.Fatalf("no %d free loopback ports", n)
	return nil
}

func randomSecret(t *testing.T, path string) {
	t.Helper()
	b := make([]byte, 24)
	if f, err := os.Open("/dev/urandom"); err == nil {
		f.Read(b)
		f.Close()
	}
	if err := os.WriteFile(path, fmt.Appendf(nil, "%x\n", b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startProcCluster builds kvserver and kvcli and runs groups x 3 replica
// processes on fabric (shm, or tcp on loopback), ready when it returns.
func startProcCluster(t *testing.T, fabric string, groups int) *procCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs kvserver and kvcli")
	}
	dir := t.TempDir()
	kvserver := build(t, "./cmd/kvserver")
	c := &procCluster{t: t, dir: dir, kvcli: build(t, "./cmd/kvcli"), config: filepath.Join(dir, "cluster.toml"),
		ctl: map[int]string{}, procs: map[int]*exec.Cmd{}}
	for _, d := range []string{"home", "state", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(dir, "home"),
		"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "TMPDIR=" + filepath.Join(dir, "tmp"), "LANG=C.UTF-8"}
	var b strings.Builder
	fmt.Fprintf(&b, "name = %q\nfabric = %q\ndata_dir = \"data\"\n", fmt.Sprintf("kvcli-deg-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6), fabric)
	switch fabric {
	case "shm":
		shm, err := os.MkdirTemp("/dev/shm", "rdmakv-kvcli-")
		if err != nil {
			shm = filepath.Join(dir, "shm")
			os.Mkdir(shm, 0o700)
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
		fmt.Fprintf(&b, "shm_dir = %q\n", shm)
	case "tcp":
		randomSecret(t, filepath.Join(dir, "secret"))
		fmt.Fprintf(&b, "secret_file = \"secret\"\n")
	}
	b.WriteString("\n[timing]\nheartbeat = \"5ms\"\nelection_timeout = \"100ms\"\n")
	if fabric == "tcp" {
		b.WriteString("peer_timeout = \"500ms\"\n")
	}
	ports := freeLoopbackPorts(t, 6*groups, false)
	for g := range groups {
		b.WriteString("\n[[group]]\n")
		var ids []int
		for i := range 3 {
			id := g*3 + i + 1
			ids = append(ids, id)
			c.ctl[id] = fmt.Sprintf("127.0.0.1:%d", ports[2*(id-1)])
			fmt.Fprintf(&b, "  [[group.replica]]\n  id = %d\n  control = %q\n", id, c.ctl[id])
			if fabric == "tcp" {
				fmt.Fprintf(&b, "  addr = \"127.0.0.1:%d\"\n", ports[2*(id-1)+1])
			}
		}
		c.groups = append(c.groups, ids)
	}
	b.WriteString("\n[[clients]]\ncount = 4\n")
	if fabric == "tcp" {
		fmt.Fprintf(&b, "listen = \"127.0.0.1:%d\"\n", freeLoopbackPorts(t, 4, true)[0])
	}
	if err := os.WriteFile(c.config, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stopAll)
	for _, ids := range c.groups {
		for _, id := range ids {
			cmd := exec.Command(kvserver, "--config", c.config, "--id", fmt.Sprint(id))
			cmd.Env = c.env
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			c.procs[id] = cmd
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for id, addr := range c.ctl {
		for {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d not ready within 60s (%v)", id, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// kill is kill -9 of replica id.
func (c *procCluster) kill(id int) {
	c.t.Helper()
	p := c.procs[id]
	p.Process.Signal(syscall.SIGKILL)
	p.Wait()
	delete(c.procs, id)
}

func (c *procCluster) stopAll() {
	for id, p := range c.procs {
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.Process.Kill()
			<-done
		}
		delete(c.procs, id)
	}
}

// cli runs kvcli with args (and --config unless args hold a connection
// flag) and returns its stdout, stderr and exit code.
func (c *procCluster) cli(args ...string) (string, string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kvcli, args...)
	cmd.Env = c.env
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("kvcli %q: %v", args, err)
	}
	return o.String(), e.String(), code
}

// TestStatusWithDeadMajority: with two of group 0's three replicas killed,
// kvcli status and leaders must print their table (the dead replicas as
// unreachable, group 0 without a confirmed leader) and exit 4, and a
// write to group 1 must still work; with a one-group cluster (no group to
// serve), a write must fail saying "group 0 has no leader: replicas 2 and
// 3 unreachable" and exit 4.
//
// It first caught status and leaders failing to open a client (which
// needed every group to register it) and printing a long registration
// error instead of the table.
func TestStatusWithDeadMajority(t *testing.T) {
	c := startProcCluster(t, "shm", 2)
	conf := "--config=" + c.config
	if out, errOut, code := c.cli(conf, "put", "k", "v"); code != exitOK {
		t.Fatalf("put before the kill: exit %d: %s%s", code, out, errOut)
	}
	c.kill(2)
	c.kill(3)

	// Group 1 may be between leaders at any one read (an election on a
	// loaded machine): status says so, which is right; read again until
	// it shows group 1's leader, for at most a minute.
	var out, errOut string
	var code int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		out, errOut, code = c.cli(conf, "--timeout=5s", "status")
		if strings.Contains(out, "group 1: leader node") || time.Now().After(deadline) {
			break
		}
	}
	if code != exitUnavailable {
		t.Fatalf("status with group 0's majority dead: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUnavailable, out, errOut)
	}
	for _, id := range []int{2, 3} {
		if !regexpLine(out, fmt.Sprintf("  %d  ", id), "unreachable") {
			t.Errorf("status does not show replica %d as unreachable:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "group 1: leader node") || !strings.Contains(out, "group 0: ") {
		t.Errorf("status does not show both groups:\n%s", out)
	}
	if errOut != "" {
		t.Errorf("status printed on stderr: %q", errOut)
	}
	t.Logf("status:\n%s", out)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		out, errOut, code = c.cli(conf, "--timeout=5s", "leaders")
		if strings.Contains(out, "group 1: leader node") || time.Now().After(deadline) {
			break
		}
	}
	if code != exitUnavailable || !strings.Contains(out, "group 0: ") || !strings.Contains(out, "group 1: leader node") {
		t.Fatalf("leaders with group 0's majority dead: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitUnavailable, out, errOut)
	}
	if strings.Contains(out, "group 0: leader node") && !strings.Contains(out, "not confirmed") {
		t.Errorf("leaders shows group 0 with a confirmed leader:\n%s", out)
	}
	t.Logf("leaders:\n%s", out)

	// The live group still takes writes, the dead one says why not.
	k1, k0 := keyIn(t, c.config, 1), keyIn(t, c.config, 0)
	if out, errOut, code := c.cli(conf, "--timeout=10s", "put", k1, "v"); code != exitOK {
		t.Fatalf("put to group 1 with group 0 dead: exit %d: %s%s", code, out, errOut)
	}
	_, errOut, code = c.cli(conf, "--timeout=10s", "put", k0, "v")
	if want := "group 0 unavailable: no leader: replicas 2 and 3 unreachable"; code != exitUnavailable || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("put to group 0 with its majority dead: exit %d, stderr %q; want exit %d and one line saying %q", code, errOut, exitUnavailable, want)
	}
	t.Logf("put to group 0: %s", errOut)
}

// TestOpenErrorNamesDeadReplicas: a one-group cluster with two of its
// three replicas killed: a command that needs a group fails with exit 4
// and one line saying "group 0 has no leader: replicas 2 and 3
// unreachable" (it used to print the multicast client's registration
// error, with a shm error per replica), and status still prints its table.
func TestOpenErrorNamesDeadReplicas(t *testing.T) {
	c := startProcCluster(t, "shm", 1)
	conf := "--config=" + c.config
	c.kill(2)
	c.kill(3)
	_, errOut, code := c.cli(conf, "--timeout=10s", "get", "k")
	want := "group 0 has no leader: replicas 2 and 3 unreachable"
	if code != exitUnavailable || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("get with the only group's majority dead: exit %d, stderr %q; want exit %d and one line saying %q", code, errOut, exitUnavailable, want)
	}
	t.Logf("get: %s", errOut)
	out, errOut, code := c.cli(conf, "--timeout=5s", "status")
	if code != exitUnavailable || !regexpLine(out, "  2  ", "unreachable") || !regexpLine(out, "  3  ", "unreachable") {
		t.Fatalf("status with the only group's majority dead: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestWrongSecret: a tcp client whose secret differs from the cluster's
// must fail at once with the authentication error (not wait out its
// deadline and report a timeout), say it once, name the config to fix,
// and kvcli must exit 2 (a usage or config error).
//
// It first caught Open retrying the refused Conns until its deadline
// (kvcli exited 4 after 10 s) and then printing "authentication failed
// (cluster secrets differ)" once per replica.
func TestWrongSecret(t *testing.T) {
	c := startProcCluster(t, "tcp", 1)
	b, err := os.ReadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	randomSecret(t, filepath.Join(c.dir, "wrong-secret"))
	wrong := filepath.Join(c.dir, "wrong.toml")
	if err := os.WriteFile(wrong, []byte(strings.Replace(string(b), `secret_file = "secret"`, `secret_file = "wrong-secret"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	// The library: the error is the authentication failure, final.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := client.Open(ctx, client.WithConfigFile(wrong), client.WithTimeout(30*time.Second))
	if err == nil {
		cl.Close()
		t.Fatal("open with a wrong secret succeeded")
	}
	if !errors.Is(err, tcp.ErrAuth) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		t.Fatalf("open with a wrong secret: %v; want tcp.ErrAuth, not a deadline", err)
	}
	if n := strings.Count(err.Error(), "authentication failed"); n != 1 || !strings.Contains(err.Error(), wrong) {
		t.Fatalf("open with a wrong secret: %q: want the failure said once and config %s named", err, wrong)
	}

	// kvcli: exit 2, one line.
	_, errOut, code := c.cli("--config="+wrong, "--timeout=30s", "get", "k")
	if code != exitUsage || strings.Count(errOut, "authentication failed") != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, wrong) {
		t.Fatalf("kvcli with a wrong secret: exit %d, stderr %q; want exit %d and one line naming %s", code, errOut, exitUsage, wrong)
	}
	t.Logf("kvcli with a wrong secret: %s", errOut)
	// The right secret still works.
	if out, errOut, code := c.cli("--config="+c.config, "put", "k", "v"); code != exitOK {
		t.Fatalf("put with the right secret: exit %d: %s%s", code, out, errOut)
	}
}

// regexpLine reports whether a line of out holds both a and b.
func regexpLine(out, a, b string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, a) && strings.Contains(l, b) {
			return true
		}
	}
	return false
}

// keyIn returns a key that group g of the config's cluster holds.
func keyIn(t *testing.T, config string, g uint32) string {
	t.Helper()
	cfg, err := cluster.LoadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cfg.Map()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		k := fmt.Sprintf("key-%d", i)
		if m.GroupOf([]byte(k)) == g {
			return k
		}
	}
}
