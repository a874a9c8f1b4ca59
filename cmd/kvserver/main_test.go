package main_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// builtEnv names the directory of the commands a test binary built, for
// the child test binaries it runs (TestDurableEnvFailureLeavesNoSlotLock's
// child uses its parent's kvserver rather than building its own).
const builtEnv = "RDMAKV_KVSERVER_TEST_BUILT"

// testBinEnv names a directory of kvserver, kvcli and kvbench that make
// unit built once (with -buildvcs=true) for every package's tests that run
// them as processes (e2e, kvcli, kvserver, kvbench): set, build takes the
// command from there and builds nothing.
const testBinEnv = "RDMAKV_TEST_BIN"

// The commands this test binary built (build), in a directory TestMain
// removes: each is built once per test binary, not once per test (nine
// go builds of kvserver and kvcli were seven links too many).
var (
	builtMu  sync.Mutex
	builtDir = cmp.Or(os.Getenv(builtEnv), os.Getenv(testBinEnv))
	prebuilt = builtDir != "" // a parent's or make unit's: not ours to build or remove
	built    = map[string]string{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if !prebuilt && builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// build compiles a command of this module (pkg: ./cmd/NAME) once per test
// binary and returns the path of its executable. It stamps the commit
// (-buildvcs=true: GOFLAGS may turn stamping off), which
// TestVersionNamesCommit checks.
func build(t *testing.T, pkg string) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if out, ok := built[pkg]; ok {
		return out
	}
	if builtDir == "" {
		d, err := os.MkdirTemp("", "rdmakv-kvserver-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		builtDir = d
	}
	out := filepath.Join(builtDir, filepath.Base(pkg))
	if !prebuilt {
		cmd := exec.Command("go", "build", "-buildvcs=true", "-o", out, pkg)
		cmd.Dir = "../.."
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	} else if _, err := os.Stat(out); err != nil {
		t.Fatalf("%s from the parent test binary or %s: %v", pkg, testBinEnv, err)
	}
	built[pkg] = out
	return out
}

// startServer starts kvserver with args (killed when the test ends, or
// with the test process) and waits up to a minute for its banner, the
// lines up to the one that says how to stop it; it returns the process,
// the banner and the process's stderr.
func startServer(t *testing.T, kvserver string, args ...string) (*exec.Cmd, string, *syncbuf.Buffer) {
	t.Helper()
	srv := exec.Command(kvserver, args...)
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncbuf.Buffer{}
	srv.Stderr = stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill() })
	up := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), "stop:") {
				up <- strings.Join(lines, "\n")
			}
		}
	}()
	select {
	case banner := <-up:
		return srv, banner, stderr
	case <-time.After(60 * time.Second):
		t.Fatalf("kvserver did not come up; stderr: %s", stderr.String())
		return nil, "", nil
	}
}

// TestLocalClusterWithKvcli is the README's run command end to end: real
// processes. kvserver with no cluster config starts the embedded local
// cluster and writes its map; kvcli puts and gets through it (exit codes
// included); a second kvserver on the same map is refused; SIGTERM stops
// the cluster, which leaves no file behind.
func TestLocalClusterWithKvcli(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the commands")
	}
	dir := t.TempDir()
	kvserver := build(t, "./cmd/kvserver")
	kvcli := build(t, "./cmd/kvcli")
	shmDir := filepath.Join(dir, "shm")
	if err := os.Mkdir(shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	mapFile := filepath.Join(dir, "run", "cluster.json")
	name := fmt.Sprintf("e2e%d", os.Getpid())
	srv, banner, stderr := startServer(t, kvserver, "--memory", "--map", mapFile, "--shm-dir", shmDir, "--name", name)
	t.Logf("kvserver says:\n%s", banner)
	if !strings.Contains(banner, mapFile) {
		t.Fatalf("the banner does not name the map file %s", mapFile)
	}

	cli := func(stdin string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, kvcli, append([]string{"--map", mapFile}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		b, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("kvcli %v: %v", args, err)
		}
		return strings.TrimSpace(string(b)), code
	}
	for _, c := range []struct {
		stdin string
		args  []string
		out   string
		code  int
	}{
		{"", []string{"put", "hello", "world"}, "OK", 0},
		{"", []string{"get", "hello"}, "world", 0},
		{"", []string{"get", "missing"}, "(not found)", 1},
		{"", []string{"cas", "hello", "nope", "x"}, "kvcli: rdmakv: compare-and-swap mismatch", 3},
		{"", []string{"cas", "hello", "world", "there"}, "OK", 0},
		{"from stdin", []string{"put", "k", "-"}, "OK", 0},
		{"", []string{"get", "k"}, "from stdin", 0},
		{"", []string{"--absent", "cas", "fresh", "v"}, "OK", 0},
		{"", []string{"del", "k"}, "OK", 0},
		{"", []string{"get", "k"}, "(not found)", 1},
		{"", []string{"frobnicate"}, `kvcli: unknown command "frobnicate" (commands: get, put, del, cas, batch, status, leaders, watch, scan, keys, tablets, move-tablet, abort-move, split-tablet, collect, balance, help)`, 2},
		{"", []string{"get"}, "kvcli: get takes 1 argument, got 0", 2},
	} {
		got, code := cli(c.stdin, c.args...)
		if code != c.code || (c.out != "" && got != c.out) {
			t.Fatalf("kvcli %v: %q, exit %d; want %q, exit %d", c.args, got, code, c.out, c.code)
		}
	}
	// A stale-ok get reads the nearest replica, which may lag behind.
	if got, code := cli("", "--consistency", "stale-ok", "get", "hello"); code > 1 || code == 0 && got != "there" && got != "world" {
		t.Fatalf("kvcli stale-ok get: %q, exit %d", got, code)
	}
	if got, code := cli("", "--json", "get", "hello"); code != 0 || !strings.Contains(got, `"value":"there"`) {
		t.Fatalf("kvcli --json get: %q, exit %d", got, code)
	}

	// The embedded cluster declares the ordered keyspace "ordered"
	// (docs/operations.md): a Go client reaches it by name.
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Open(ctx, client.WithMapFile(mapFile), client.WithSlot(5))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ks := c.Keyspace(cluster.DefaultOrderedKeyspace)
		for _, k := range []string{"b", "c", "a"} {
			if _, err := ks.Put(ctx, []byte(k), []byte(k+k)); err != nil {
				t.Fatalf("put to the embedded ordered keyspace: %v", err)
			}
		}
		var got []string
		for kv, err := range ks.Scan(ctx, nil, nil) {
			if err != nil {
				t.Fatalf("scan of the embedded ordered keyspace: %v", err)
			}
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if strings.Join(got, ",") != "a=aa,b=bb,c=cc" {
			t.Fatalf("scan of the embedded ordered keyspace: %v", got)
		}
	}()

	// A second embedded cluster on the same map is refused in one line.
	second := exec.Command(kvserver, "--memory", "--map", mapFile, "--shm-dir", shmDir, "--name", name+"b")
	b, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "already runs") {
		t.Fatalf("a second kvserver on the same map: %v: %s", err, b)
	}

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kvserver after SIGTERM: %v; stderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kvserver did not stop within 30 s of SIGTERM")
	}
	left, _ := os.ReadDir(shmDir)
	for _, e := range left {
		t.Errorf("left in the shm directory: %s", e.Name())
	}
	if _, err := os.Stat(mapFile); !os.IsNotExist(err) {
		t.Errorf("the map file is still there (%v)", err)
	}
	if _, err := os.Stat(mapFile + ".lock"); !os.IsNotExist(err) {
		t.Errorf("the lock file is still there (%v)", err)
	}
	// With the cluster gone, kvcli says so.
	if got, code := cli("", "get", "hello"); code != 4 || !strings.Contains(got, "no cluster map") {
		t.Fatalf("kvcli with no cluster: %q, exit %d", got, code)
	}
}
