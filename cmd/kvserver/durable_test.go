package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// durableEnv runs kvserver processes with HOME, XDG_STATE_HOME and
// TMPDIR in a temporary directory (never the user's ~/.local/state) and a
// private shm directory. TMPDIR is the test process's too: the shm
// clients' slot lock files ($TMPDIR/rdmakv-slots/<name>/) stay in the
// test's directory, also those of a client a failed test did not close
// (CI found /tmp/rdmakv-slots/dur<pid>/slot-0.lock).
type durableEnv struct {
	t        *testing.T
	dir      string
	kvserver string
	shmDir   string
	state    string // XDG_STATE_HOME
	mapFile  string
	name     string
}

func newDurableEnv(t *testing.T) *durableEnv {
	dir := t.TempDir()
	e := &durableEnv{t: t, dir: dir, kvserver: build(t, "./cmd/kvserver"), shmDir: filepath.Join(dir, "shm"),
		state: filepath.Join(dir, "state"), mapFile: filepath.Join(dir, "run", "cluster.json"), name: fmt.Sprintf("dur%d", os.Getpid())}
	tmp := filepath.Join(dir, "tmp")
	for _, d := range []string{e.shmDir, tmp} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TMPDIR", tmp)
	t.Cleanup(func() {
		if ents, _ := os.ReadDir(e.shmDir); len(ents) > 0 {
			t.Errorf("%d files left in the shm dir", len(ents))
		}
		// Every client is closed by now (open's cleanup): a closed
		// client removes its slot's lock file and the directories.
		if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
			t.Errorf("%d entries left in TMPDIR (%s...)", len(ents), ents[0].Name())
		}
	})
	return e
}

// proc is a running kvserver.
type proc struct {
	cmd    *exec.Cmd
	out    string // its stdout up to the line it was waited for
	stderr *syncbuf.Buffer
	done   chan error
}

// waitLog waits (up to a minute) for want in p's stderr. A replica logs
// its recovery once New has replayed its log, which may come after the
// start-up line the test waited for: reading stderr once raced with it
// (CI caught it).
func (p *proc) waitLog(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(p.stderr.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("no %q line in the log:\n%s", want, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *durableEnv) command(args ...string) *exec.Cmd {
	cmd := exec.Command(e.kvserver, args...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(e.dir, "home"), "XDG_STATE_HOME="+e.state)
	return cmd
}

// start runs kvserver with args and waits for the stdout line holding up.
func (e *durableEnv) start(up string, args ...string) *proc {
	e.t.Helper()
	cmd := e.command(args...)
	p := &proc{cmd: cmd, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		// A clean stop (it removes its shm files), else a kill.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	seen := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), up) {
				seen <- strings.Join(lines, "\n")
			}
		}
		io.Copy(io.Discard, out)
		p.done <- cmd.Wait()
	}()
	select {
	case p.out = <-seen:
	case err := <-p.done:
		p.done <- err
		e.t.Fatalf("kvserver %v exited before %q: %v\nstderr: %s", args, up, err, p.stderr.String())
	case <-time.After(2 * time.Minute):
		e.t.Fatalf("kvserver %v: no %q in 2 minutes\nstderr: %s", args, up, p.stderr.String())
	}
	return p
}

// stop sends sig and waits for the exit; it returns the exit code.
func (p *proc) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		p.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		t.Fatalf("kvserver did not exit a minute after %v\nstderr: %s", sig, p.stderr.String())
	}
	return -1
}

// run runs kvserver with args to its end: exit code, stderr.
func (e *durableEnv) run(args ...string) (int, string) {
	cmd := e.command(args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return 0, stderr.String()
}

// open opens a client; a cleanup closes it if the test did not (a failed
// test: Close releases its slot; Close is idempotent).
func (e *durableEnv) open(opts ...client.Option) *client.Client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if len(opts) == 0 {
		opts = []client.Option{client.WithMapFile(e.mapFile)}
	}
	c, err := client.Open(ctx, append(opts, client.WithTimeout(30*time.Second))...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// putKeys puts n keys (8 writers) and fails the test on any error: every
// put returned is acknowledged.
func putKeys(t *testing.T, c *client.Client, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := c.Put(ctx, fmt.Appendf(nil, "%s%d", prefix, i), fmt.Appendf(nil, "v%d", i))
				cancel()
				if err != nil {
					errs <- fmt.Errorf("put %s%d: %w", prefix, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// checkKeys reads the n keys back: every one must hold its value.
func checkKeys(t *testing.T, c *client.Client, prefix string, n int) {
	t.Helper()
	missing := 0
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		v, err := c.Get(ctx, fmt.Appendf(nil, "%s%d", prefix, i))
		cancel()
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			if missing < 5 {
				t.Errorf("%s%d: %q, %v; want v%d", prefix, i, v, err, i)
			}
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged keys lost", missing, n)
	}
}

// TestEmbeddedDurable is `make run`'s data across restarts, with real
// processes: the embedded cluster keeps every acknowledged put across
// Ctrl-C (SIGINT) in async mode (the default) and sync mode, and across
// kill -9 in sync mode (its default data dir under
// XDG_STATE_HOME, named in the banner); --memory keeps nothing and writes
// nothing to disk; a data dir of another shape is refused.
func TestEmbeddedDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	e := newDurableEnv(t)
	common := []string{"--map", e.mapFile, "--shm-dir", e.shmDir, "--control", "-", "--log-level", "info"}
	data := filepath.Join(e.dir, "data")
	const n = 1000

	// A clean stop (SIGINT, Ctrl-C) loses nothing in either durable mode:
	// sync acknowledges only what a majority synced; async writes and
	// syncs what every replica's log has queued before it exits. Async's
	// restart is a recovery election whose winner logs what was lost
	// (nothing). Async is the default: its case gives no --durability.
	// The sync case's data dir is the one other-shape refuses below.
	for _, tc := range []struct {
		name, mode, dir, cluster, prefix string
		recovery                         string // the line the restarted cluster logs
	}{
		{"sigint", "sync", data, e.name, "int", "recovered "},
		{"sigint-async", "async", filepath.Join(e.dir, "data-async"), e.name + "a", "async",
			": 0 entries acknowledged before the outage were not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--data-dir", tc.dir, "--name", tc.cluster}, common...)
			if tc.mode != "async" {
				args = append([]string{"--durability", tc.mode}, args...)
			}
			p := e.start("stop:", args...)
			if !strings.Contains(p.out, tc.dir+" (durability "+tc.mode) {
				t.Fatalf("the banner does not name the data dir %s (durability %s):\n%s", tc.dir, tc.mode, p.out)
			}
			c := e.open()
			putKeys(t, c, tc.prefix, n)
			c.Close()
			if code := p.stop(t, syscall.SIGINT); code != 0 {
				t.Fatalf("exit %d after SIGINT\nstderr: %s", code, p.stderr.String())
			}
			p = e.start("stop:", args...)
			c = e.open()
			checkKeys(t, c, tc.prefix, n)
			c.Close()
			p.waitLog(t, tc.recovery)
			if code := p.stop(t, syscall.SIGINT); code != 0 {
				t.Fatalf("exit %d after SIGINT\nstderr: %s", code, p.stderr.String())
			}
		})
	}

	t.Run("other-shape", func(t *testing.T) {
		for _, extra := range [][]string{{"--groups", "3"}, {"--replicas", "5"}, {"--name", e.name + "x"}} {
			args := append(append([]string{"--durability", "sync", "--data-dir", data, "--name", e.name}, common...), extra...)
			code, stderr := e.run(args...)
			if code != 1 || !strings.Contains(stderr, "data dir "+data+" holds the data of cluster") || !strings.Contains(stderr, "give another --data-dir") {
				t.Errorf("kvserver %v: exit %d, stderr %q; want exit 1 and a refusal naming the data dir", extra, code, stderr)
			}
		}
	})

	t.Run("kill", func(t *testing.T) {
		// The default data dir: XDG_STATE_HOME/rdmakv/<name>.
		name := e.name + "k"
		def := filepath.Join(e.state, "rdmakv", name)
		// kill -9 keeps every acknowledged put in sync mode (async may
		// lose the last fsync interval's: internal/e2e
		// TestWholeGroupKillAsync).
		args := append([]string{"--durability", "sync", "--name", name}, common...)
		p := e.start("stop:", args...)
		if !strings.Contains(p.out, def) {
			t.Fatalf("the banner does not name the default data dir %s:\n%s", def, p.out)
		}
		c := e.open()
		putKeys(t, c, "kill", n)
		c.Close()
		if code := p.stop(t, syscall.SIGKILL); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("exit %d after SIGKILL", code)
		}
		p = e.start("stop:", args...)
		c = e.open()
		checkKeys(t, c, "kill", n)
		c.Close()
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d after SIGTERM\nstderr: %s", code, p.stderr.String())
		}
	})

	t.Run("memory", func(t *testing.T) {
		name := e.name + "m"
		args := append([]string{"--memory", "--name", name}, common...)
		p := e.start("stop:", args...)
		if !strings.Contains(p.out, "in memory only (--memory)") {
			t.Errorf("the banner does not say memory mode:\n%s", p.out)
		}
		c := e.open()
		putKeys(t, c, "mem", 50)
		c.Close()
		if code := p.stop(t, syscall.SIGINT); code != 0 {
			t.Fatalf("exit %d after SIGINT", code)
		}
		if _, err := os.Stat(filepath.Join(e.state, "rdmakv", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--memory wrote a data dir (%v)", err)
		}
		p = e.start("stop:", args...)
		c = e.open()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		v, err := c.Get(ctx, []byte("mem1"))
		cancel()
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("--memory after a restart: mem1 = %q, %v; want not found", v, err)
		}
		c.Close()
		p.stop(t, syscall.SIGINT)
		if code, stderr := e.run("--memory", "--data-dir", data); code != 2 || !strings.Contains(stderr, "memory mode keeps nothing on disk") {
			t.Errorf("--memory --data-dir: exit %d, %q", code, stderr)
		}
		if code, stderr := e.run("--memory", "--snapshot-log-bytes", "8MiB"); code != 2 || !strings.Contains(stderr, "memory mode keeps nothing on disk") {
			t.Errorf("--memory --snapshot-log-bytes: exit %d, %q", code, stderr)
		}
		if code, stderr := e.run("--snapshot-log-bytes", "64KiB"); code != 2 || !strings.Contains(stderr, "want at least 1MiB") {
			t.Errorf("--snapshot-log-bytes 64KiB: exit %d, %q", code, stderr)
		}
	})
}

// TestReplicaDurableRestart: a 1x3 group of kvserver --config replicas
// (one process each) with durability sync; every replica is killed with
// SIGKILL at once and restarted from its data dir: the group elects again
// and every acknowledged put reads back. A replica's log and snapshots are
// in data_dir/replica-<id>.
func TestReplicaDurableRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	e := newDurableEnv(t)
	config := filepath.Join(e.dir, "cluster.toml")
	data := filepath.Join(e.dir, "data")
	toml := fmt.Sprintf(`name = "rd%d"
fabric = "shm"
shm_dir = %q
data_dir = %q
durability = "sync"
[timing]
heartbeat = "5ms"
election_timeout = "100ms"
[[group]]
[[group.replica]]
id = 1
[[group.replica]]
id = 2
[[group.replica]]
id = 3
[[clients]]
count = 2
`, os.Getpid(), e.shmDir, data)
	if err := os.WriteFile(config, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	startAll := func() []*proc {
		var ps []*proc
		for id := 1; id <= 3; id++ {
			ps = append(ps, e.start("runs (pid", "--config", config, "--id", fmt.Sprint(id), "--control", "-", "--log-level", "info"))
		}
		return ps
	}
	ps := startAll()
	c := e.open(client.WithConfigFile(config))
	putKeys(t, c, "r", 300)
	c.Close()
	for _, p := range ps {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, p := range ps {
		if code := p.stop(t, syscall.SIGKILL); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("exit %d after SIGKILL", code)
		}
	}
	for id := 1; id <= 3; id++ {
		if ents, err := os.ReadDir(filepath.Join(data, fmt.Sprintf("replica-%d", id), "wal")); err != nil || len(ents) == 0 {
			t.Fatalf("replica %d has no log in its data dir: %v", id, err)
		}
	}
	ps = startAll()
	c = e.open(client.WithConfigFile(config))
	checkKeys(t, c, "r", 300)
	c.Close()
	for _, p := range ps {
		p.waitLog(t, "recovered ")
	}
	for _, p := range ps {
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Errorf("exit %d after SIGTERM\nstderr: %s", code, p.stderr.String())
		}
	}
}

// TestDurableEnvFailureLeavesNoSlotLock: a durableEnv test that fails
// while its client is open (t.Fatal skips the test's Close) leaves
// nothing in TMPDIR: neither its client's slot lock file
// (rdmakv-slots/<name>/slot-0.lock, which no later client of its
// per-process cluster name sweeps) nor anything else. Real processes:
// this test binary runs itself, with a TMPDIR of its own, as the failing
// test (an embedded kvserver, a client open, a planted t.Fatal).
func TestDurableEnvFailureLeavesNoSlotLock(t *testing.T) {
	if os.Getenv("RDMAKV_DURABLE_FAIL_CHILD") != "" {
		e := newDurableEnv(t)
		e.start("stop:", "--memory", "--name", e.name, "--map", e.mapFile, "--shm-dir", e.shmDir, "--control", "-")
		e.open()
		t.Fatal("planted failure with a client open")
	}
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	tmp := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestDurableEnvFailureLeavesNoSlotLock$", "-test.v")
	kvserver := build(t, "./cmd/kvserver") // the child runs this one
	child.Env = append(os.Environ(), "RDMAKV_DURABLE_FAIL_CHILD=1", "TMPDIR="+tmp, builtEnv+"="+filepath.Dir(kvserver))
	out, err := child.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "planted failure with a client open") {
		t.Fatalf("the child test: %v, want its planted failure:\n%s", err, out)
	}
	var left []string
	filepath.WalkDir(tmp, func(path string, d fs.DirEntry, err error) error {
		if path != tmp {
			left = append(left, strings.TrimPrefix(path, tmp+"/"))
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("the failed test left in its TMPDIR: %v", left)
	}
}
