package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// e2e is a running kvserver (the embedded local cluster, on a private map,
// name and shm directory) and the kvcli binary to drive it.
type e2e struct {
	dir     string // everything of the test: map, shm, HOME, TMPDIR
	kvcli   string
	mapFile string
	name    string
	env     []string // kvcli's: private HOME, XDG_STATE_HOME and TMPDIR
}

// startE2E builds kvserver and kvcli and starts the cluster (kvserver's
// flags: extra added); cleanup stops it (SIGTERM) and checks it left
// nothing in its shm directory.
func startE2E(t *testing.T, extra ...string) *e2e {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs kvserver and kvcli")
	}
	dir := t.TempDir()
	kvserver := build(t, "./cmd/kvserver")
	e := &e2e{dir: dir, kvcli: build(t, "./cmd/kvcli"), mapFile: filepath.Join(dir, "run", "cluster.json"), name: fmt.Sprintf("kvcli%d", os.Getpid())}
	for _, d := range []string{"shm", "home", "state", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(dir, "home"),
		"XDG_STATE_HOME=" + filepath.Join(dir, "state"), "TMPDIR=" + filepath.Join(dir, "tmp"), "TERM=xterm-256color", "LANG=C.UTF-8"}
	shmDir := filepath.Join(dir, "shm")
	srv := exec.Command(kvserver, append([]string{"--memory", "--map", e.mapFile, "--shm-dir", shmDir, "--name", e.name}, extra...)...)
	srv.Env = e.env
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("kvserver after SIGTERM: %v; stderr: %s", err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			srv.Process.Kill()
			<-done
			t.Errorf("kvserver did not stop within 30 s of SIGTERM")
		}
		left, _ := os.ReadDir(shmDir)
		for _, f := range left {
			t.Errorf("left in the shm directory: %s", f.Name())
		}
	})
	up := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "stop:") {
				said = true
				close(up)
			}
		}
		done <- srv.Wait()
	}()
	select {
	case <-up:
	case <-time.After(60 * time.Second):
		t.Fatalf("kvserver did not come up; stderr: %s", stderr.String())
	}
	return e
}

// cli runs kvcli --map M args with stdin.
func (e *e2e) cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.kvcli, append([]string{"--map", e.mapFile}, args...)...)
	cmd.Env = e.env
	cmd.Stdin = strings.NewReader(stdin)
	var o, er strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &er
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kvcli %q: %v", args, err)
	}
	return o.String(), er.String(), code
}

// must runs kvcli and checks its exit code and, if want is not empty, its
// whole stdout.
func (e *e2e) must(t *testing.T, code int, want string, args ...string) string {
	t.Helper()
	out, stderr, c := e.cli(t, "", args...)
	if c != code || want != "" && out != want {
		t.Fatalf("kvcli %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q", args, c, out, stderr, code, want)
	}
	return out
}

// TestEndToEnd drives the real binaries: one-shot commands (batch, status,
// leaders, watch and --json among them), commands piped in, and the
// interactive shell in a terminal (tmux).
func TestEndToEnd(t *testing.T) {
	e := startE2E(t)
	t.Run("oneshot", func(t *testing.T) { testOneShot(t, e) })
	t.Run("piped", func(t *testing.T) { testPiped(t, e) })
	t.Run("ordered", func(t *testing.T) { testOrdered(t, e) })
	t.Run("shell", func(t *testing.T) { testShell(t, e) })
}

func testOneShot(t *testing.T, e *e2e) {
	e.must(t, 0, "OK\n", "put", "hello", "world")
	e.must(t, 0, "world\n", "get", "hello")
	// A stale-ok get reads the nearest replica, which may lag behind.
	if out, _, code := e.cli(t, "", "get", "--consistency", "stale-ok", "hello"); !(code == 0 && out == "world\n" || code == 1) {
		t.Fatalf("stale-ok get: %q exit %d", out, code)
	}
	var got result
	if err := json.Unmarshal([]byte(e.must(t, 0, "", "--json", "get", "hello")), &got); err != nil || got.Value != "world" || got.Version == 0 {
		t.Fatalf("--json get: %+v %v", got, err)
	}
	// Version compare-and-swap and delete.
	e.must(t, 0, "OK\n", "cas", "--version", fmt.Sprint(got.Version), "hello", "there")
	e.must(t, 3, "", "cas", "--version", fmt.Sprint(got.Version), "hello", "again")
	e.must(t, 3, "", "del", "--version", fmt.Sprint(got.Version), "hello")
	e.must(t, 0, "there\n", "get", "hello")
	e.must(t, 0, "OK\n", "cas", "--absent", "fresh", "new")
	e.must(t, 3, "", "cas", "--version", "0", "fresh", "newer")
	// Values from a file and from stdin.
	f := filepath.Join(e.dir, "value")
	if err := os.WriteFile(f, []byte("line 1\nline 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.must(t, 0, "OK\n", "put", "--file", f, "file")
	e.must(t, 0, "line 1\nline 2\n\n", "get", "file")
	if out, _, code := e.cli(t, "piped value", "put", "stdin", "-"); code != 0 || out != "OK\n" {
		t.Fatalf("put -: %q exit %d", out, code)
	}
	e.must(t, 0, "piped value\n", "get", "stdin")

	// A batch: every op applied, the versions per op.
	e.must(t, 0, "OK\n", "batch", "put", "b1", "one", "put", "b2", "two", "put", "b3", "three")
	var br batchResult
	out := e.must(t, 0, "", "--json", "batch", "put", "b1", "uno", "del", "b2", "put", "b4", "four")
	if err := json.Unmarshal([]byte(out), &br); err != nil || br.Ops != 3 || len(br.Versions) != 3 || len(br.Groups) == 0 {
		t.Fatalf("--json batch: %s (%v)", out, err)
	}
	e.must(t, 0, "uno\n", "get", "b1")
	e.must(t, 1, "", "get", "b2")
	e.must(t, 0, "three\n", "get", "b3")
	e.must(t, 0, "four\n", "get", "b4")
	ops := filepath.Join(e.dir, "ops")
	if err := os.WriteFile(ops, []byte("# ops\nput 'b 5' \"five five\"\ndel b1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.must(t, 0, "OK\n", "batch", "--file", ops)
	e.must(t, 0, "five five\n", "get", "b 5")
	e.must(t, 1, "", "get", "b1")
	if out, _, code := e.cli(t, "put b6 six\n", "batch", "-"); code != 0 || out != "OK\n" {
		t.Fatalf("batch -: %q exit %d", out, code)
	}
	e.must(t, 0, "six\n", "get", "b6")

	// Not found, with --json: the error in the object, exit 1.
	out, _, code := e.cli(t, "", "--json", "get", "missing")
	if code != 1 || !strings.Contains(out, `"error":"rdmakv: key not found"`) {
		t.Fatalf("--json get missing: %q exit %d", out, code)
	}
	// Argument errors: exit 2 before anything is sent.
	if _, stderr, code := e.cli(t, "", "put", "k"); code != 2 || stderr != "kvcli: put takes 2 arguments, got 1\n" {
		t.Fatalf("put k: %q exit %d", stderr, code)
	}

	// status and leaders.
	out = e.must(t, 0, "", "status")
	for _, want := range []string{fmt.Sprintf("cluster %q (shm), 2 groups", e.name), "group 0: leader node", "group 1: leader node", "NODE", "leader", "follower"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status does not say %q:\n%s", want, out)
		}
	}
	t.Logf("kvcli status:\n%s", out)
	var st statusJSON
	out = e.must(t, 0, "", "--json", "status")
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Cluster != e.name || len(st.Groups) != 2 {
		t.Fatalf("--json status: %s (%v)", out, err)
	}
	for _, g := range st.Groups {
		leaders := 0
		for _, r := range g.Replicas {
			if !r.Reachable || r.Slots == 0 {
				t.Fatalf("--json status: group %d replica %+v", g.Group, r)
			}
			if r.Leader {
				leaders++
				if g.Leader == nil || *g.Leader != r.Node || r.Serving != g.Epoch {
					t.Fatalf("--json status: group %+v", g)
				}
			}
		}
		if len(g.Replicas) != 3 || leaders != 1 || !g.Confirmed || g.Applied == 0 {
			t.Fatalf("--json status: group %+v", g)
		}
	}
	out = e.must(t, 0, "", "leaders")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "group 0: leader node ") || !strings.HasPrefix(lines[1], "group 1: leader node ") {
		t.Fatalf("leaders:\n%s", out)
	}
	out = e.must(t, 0, "", "--json", "leaders")
	st = statusJSON{}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Groups) != 2 || st.Groups[1].Leader == nil || st.Groups[1].Replicas != nil {
		t.Fatalf("--json leaders: %s (%v)", out, err)
	}

	// watch: the first state, then a change made by another process.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := exec.CommandContext(ctx, e.kvcli, "--map", e.mapFile, "watch", "--interval", "20ms", "--count", "3", "watched")
	w.Env = e.env
	wout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(wout)
	var lines []string
	next := func() string {
		t.Helper()
		if !sc.Scan() {
			t.Fatalf("watch ended after %q", lines)
		}
		lines = append(lines, sc.Text())
		return sc.Text()
	}
	if l := next(); !strings.HasSuffix(l, "  (not found)") {
		t.Fatalf("watch's first line: %q", l)
	}
	e.must(t, 0, "OK\n", "put", "watched", "first value")
	if l := next(); !strings.Contains(l, "  v") || !strings.HasSuffix(l, " first value") {
		t.Fatalf("watch after a put: %q", l)
	}
	e.must(t, 0, "OK\n", "del", "watched")
	if l := next(); !strings.HasSuffix(l, "  (deleted)") {
		t.Fatalf("watch after a delete: %q", l)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("watch --count 3: %v", err)
	}
	// Ctrl-C (SIGINT) ends a watch with exit 0.
	w = exec.Command(e.kvcli, "--map", e.mapFile, "--json", "watch", "hello")
	w.Env = e.env
	wout, _ = w.StdoutPipe()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	sc = bufio.NewScanner(wout)
	if l := next(); !strings.Contains(l, `"value":"there"`) {
		t.Fatalf("--json watch: %q", l)
	}
	w.Process.Signal(syscall.SIGINT)
	if err := w.Wait(); err != nil {
		t.Fatalf("watch after SIGINT: %v", err)
	}
}

func testPiped(t *testing.T, e *e2e) {
	// Stops at the first failure, with its exit code.
	out, stderr, code := e.cli(t, "put p 1\nget p\n\n# a comment\nget missing\nput p 2\n")
	if code != 1 || out != "OK\n1\n" || !strings.Contains(stderr, "kvcli: line 5: get: exit 1") {
		t.Fatalf("piped: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	e.must(t, 0, "1\n", "get", "p")
	// --keep-going runs every line; the exit code is the first failure's.
	out, _, code = e.cli(t, "put p 1\nget missing\nbatch put p 2 put 'q r' 's t'\nget p\nget 'q r'\ncas p 1 3\nleaders --json\n", "--keep-going")
	if code != 1 || !strings.HasPrefix(out, "OK\nOK\n2\ns t\n") || !strings.Contains(out, `"command":"leaders"`) {
		t.Fatalf("piped --keep-going: exit %d, stdout %q", code, out)
	}
	// A value from stdin is refused: stdin holds the commands.
	_, stderr, code = e.cli(t, "put p -\n")
	if code != 2 || !strings.Contains(stderr, "use --file F") {
		t.Fatalf("piped put -: exit %d: %s", code, stderr)
	}
}

// tmux drives a terminal: a private tmux server (its own socket, no
// config) whose session runs kvcli.
type tmux struct {
	t    *testing.T
	e    *e2e
	sock string
}

func (x *tmux) run(args ...string) (string, error) {
	cmd := exec.Command("tmux", append([]string{"-S", x.sock, "-f", "/dev/null"}, args...)...)
	cmd.Env = x.e.env
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func (x *tmux) must(args ...string) string {
	x.t.Helper()
	out, err := x.run(args...)
	if err != nil {
		x.t.Fatalf("tmux %q: %v: %s", args, err, out)
	}
	return out
}

// start runs kvcli in a new session of 120 x 40. The server outlives
// its sessions (exit-empty off): otherwise a session started right after
// the last one ended could reach a server on its way out ("server exited
// unexpectedly", seen under load).
func (x *tmux) start(session string) {
	x.t.Helper()
	x.must("new-session", "-d", "-s", session, "-x", "120", "-y", "40",
		fmt.Sprintf("exec %q --map %q", x.e.kvcli, x.e.mapFile),
		";", "set-option", "-g", "exit-empty", "off")
}

// keys types text (literally) then presses keys.
func (x *tmux) keys(session, text string, keys ...string) {
	x.t.Helper()
	if text != "" {
		x.must("send-keys", "-t", session, "-l", text)
	}
	if len(keys) > 0 {
		x.must(append([]string{"send-keys", "-t", session}, keys...)...)
	}
}

func (x *tmux) screen(session string) string {
	x.t.Helper()
	return x.must("capture-pane", "-p", "-t", session)
}

// wait waits until the screen satisfies ok.
func (x *tmux) wait(session, what string, ok func(screen string) bool) string {
	x.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := x.screen(session)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the terminal does not show %s:\n%s", what, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (x *tmux) waitFor(session, text string) string {
	x.t.Helper()
	return x.wait(session, fmt.Sprintf("%q", text), func(s string) bool { return strings.Contains(s, text) })
}

// waitLine waits for a line of the screen equal to line (blanks at its
// end aside).
func (x *tmux) waitLine(session, line string) string {
	x.t.Helper()
	return x.wait(session, fmt.Sprintf("the line %q", line), func(s string) bool {
		for _, l := range strings.Split(s, "\n") {
			if strings.TrimRight(l, " ") == line {
				return true
			}
		}
		return false
	})
}

// waitGone waits until the session ended (kvcli exited).
func (x *tmux) waitGone(session string) {
	x.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := x.run("has-session", "-t", session); err != nil {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("kvcli did not exit:\n%s", x.screen(session))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testShell(t *testing.T, e *e2e) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed")
	}
	x := &tmux{t: t, e: e, sock: filepath.Join(e.dir, "tmux.sock")}
	t.Cleanup(func() { x.run("kill-server") })
	p := e.name + "> " // the prompt
	const s1 = "kvcli1"
	x.start(s1)
	x.waitFor(s1, "Type help for the commands")
	x.waitFor(s1, fmt.Sprintf("kvcli: cluster %q, 2 groups x 3 replicas on shm", e.name))

	// A put and a get.
	x.keys(s1, `put greeting "hello world"`, "Enter")
	x.waitLine(s1, "OK")
	x.keys(s1, "get greeting", "Enter")
	x.waitLine(s1, "hello world")

	// Tab completes a command, a flag and its value.
	x.keys(s1, "lead", "Tab")
	x.waitLine(s1, p+"leaders")
	x.keys(s1, "", "Enter")
	x.waitFor(s1, "group 1: leader node ")
	x.keys(s1, "get --cons", "Tab")
	x.waitLine(s1, p+"get --consistency")
	x.keys(s1, "st", "Tab")
	x.waitLine(s1, p+"get --consistency stale-ok")
	x.keys(s1, "greeting", "Enter")
	x.wait(s1, "hello world twice", func(s string) bool { return strings.Count(s, "\nhello world\n") == 2 })

	// Errors are one readable line and the usage; the shell goes on.
	x.keys(s1, "get", "Enter")
	x.waitLine(s1, "usage: get [--consistency linearizable|stale-ok] [--json] [--timeout D] KEY")

	// use picks an ordered keyspace (Tab completes its name; the prompt
	// shows it); scan and keys run there; use alone goes back.
	x.keys(s1, "use ord", "Tab")
	x.waitLine(s1, p+"use ordered")
	x.keys(s1, "", "Enter")
	x.waitFor(s1, `using ordered keyspace "ordered"`)
	x.keys(s1, "put shellkey v1", "Enter")
	x.waitLine(s1, "OK")
	x.keys(s1, "keys shell", "Enter")
	x.waitLine(s1, "shellkey")
	x.waitFor(s1, e.name+"/ordered> ")
	x.keys(s1, "use", "Enter")
	x.waitFor(s1, "using the default (hashed) keyspace")
	x.keys(s1, "get shellkey", "Enter")
	x.waitLine(s1, "(not found)")
	// Ctrl-C drops the line being typed.
	x.keys(s1, "del greeting", "C-c")
	x.waitLine(s1, p+"del greeting^C")
	// watch prints changes until Ctrl-C.
	x.keys(s1, "watch --interval 50ms greeting", "Enter")
	x.wait(s1, "watch's first line", func(s string) bool { return strings.Contains(s, "  v") && strings.Contains(s, " hello world\n") })
	e.must(t, 0, "OK\n", "put", "greeting", "changed")
	x.wait(s1, "the change", func(s string) bool { return strings.Contains(s, " changed\n") })
	x.keys(s1, "", "C-c")
	x.waitLine(s1, "^C")
	x.keys(s1, "get greeting", "Enter")
	x.waitLine(s1, "changed")
	e.must(t, 0, "changed\n", "get", "greeting") // the dropped del did not run
	x.keys(s1, "help", "Enter")
	hist := filepath.Join(e.dir, "state", "rdmakv", "kvcli_history")
	x.waitFor(s1, "kept in "+hist)
	t.Logf("the first session:\n%s", x.screen(s1))
	x.keys(s1, "exit", "Enter")
	x.waitGone(s1)

	// The history was saved, privately, without the dropped line.
	b, err := os.ReadFile(hist)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(hist); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the history file's mode: %v %v", fi.Mode(), err)
	}
	if h := string(b); !strings.Contains(h, "put greeting \"hello world\"\nget greeting\nleaders\n") || strings.Contains(h, "del greeting") {
		t.Fatalf("history:\n%s", h)
	}

	// A second session finds it: Up recalls the last lines.
	const s2 = "kvcli2"
	x.start(s2)
	x.waitFor(s2, "Type help for the commands")
	x.keys(s2, "", "Up")
	x.waitLine(s2, p+"exit")
	x.keys(s2, "", "Up")
	x.waitLine(s2, p+"help")
	x.keys(s2, "", "Up", "Up")
	x.waitLine(s2, p+"watch --interval 50ms greeting")
	x.keys(s2, "", "C-c")
	// Ctrl-R searches it.
	x.keys(s2, "", "C-r")
	x.keys(s2, "hello w")
	x.waitFor(s2, `put greeting "hello world"`)
	x.keys(s2, "", "Enter") // leaves the search and runs the line
	x.wait(s2, "the put run again", func(s string) bool { return strings.Contains(s, "\nOK\n") })
	e.must(t, 0, "hello world\n", "get", "greeting")
	t.Logf("the second session:\n%s", x.screen(s2))
	// Ctrl-D leaves.
	x.keys(s2, "", "C-d")
	x.waitGone(s2)
}

// The binaries build made, one per package for the whole test binary:
// TestEndToEnd, TestTabletOps and the degraded tests each built kvserver
// and kvcli again (ten links of the same two programs a run).
var (
	builtMu  sync.Mutex
	builtDir string
	built    = map[string]string{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// build compiles the module's package pkg (e.g. "./cmd/kvcli") once per
// test binary, into a directory TestMain removes (or takes it from
// RDMAKV_TEST_BIN, where make unit built it), and returns the binary's
// path.
func build(t *testing.T, pkg string) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if out, ok := built[pkg]; ok {
		return out
	}
	if builtDir == "" && os.Getenv("RDMAKV_TEST_BIN") == "" {
		d, err := os.MkdirTemp("", "rdmakv-kvcli-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		builtDir = d
	}
	if d := os.Getenv("RDMAKV_TEST_BIN"); d != "" {
		// make unit built kvserver and kvcli once for every package.
		out := filepath.Join(d, filepath.Base(pkg))
		if _, err := os.Stat(out); err != nil {
			t.Fatalf("%s from RDMAKV_TEST_BIN: %v", pkg, err)
		}
		built[pkg] = out
		return out
	}
	out := filepath.Join(builtDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = "../.."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

// testOrdered: the embedded cluster's "ordered" keyspace through
// --keyspace (one-shot) and use (piped): scan, keys, --json, the default
// limit, and the errors.
func testOrdered(t *testing.T, e *e2e) {
	ks := []string{"--keyspace", "ordered"}
	for _, k := range []string{"b", "a", "c", "ab", "d"} {
		e.must(t, 0, "OK\n", append(ks, "put", k, "v"+k)...)
	}
	e.must(t, 0, "vab\n", append(ks, "get", "ab")...)
	// The hashed keyspace does not see ordered keys.
	if _, _, code := e.cli(t, "", "get", "ab"); code != 1 {
		t.Fatalf("get ab in the hashed keyspace: exit %d, want 1 (not found)", code)
	}
	e.must(t, 0, "a\tva\nab\tvab\nb\tvb\nc\tvc\n", append(ks, "scan", "a", "d")...)
	e.must(t, 0, "d\tvd\nc\tvc\n", append(ks, "scan", "", "", "--reverse", "--limit", "2")...)
	e.must(t, 0, "a\nab\n", append(ks, "keys", "a")...)
	e.must(t, 0, "a\n", append(ks, "keys", "a", "--limit", "1")...)
	out, stderr, code := e.cli(t, "", append(ks, "scan", "--limit", "2", "a")...)
	if code != 0 || out != "a\tva\nab\tvab\n" || !strings.Contains(stderr, "there are more") {
		t.Fatalf("scan --limit 2: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// --json: one object a pair, then the count.
	out = e.must(t, 0, "", append(ks, "scan", "--json", "b", "d")...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("scan --json: %q", out)
	}
	var kv struct {
		Key, Value string
		Version    uint64
	}
	var end struct {
		Command string
		Count   int
		More    bool
	}
	if err := json.Unmarshal([]byte(lines[0]), &kv); err != nil || kv.Key != "b" || kv.Value != "vb" || kv.Version == 0 {
		t.Fatalf("scan --json first line %q: %+v %v", lines[0], kv, err)
	}
	if err := json.Unmarshal([]byte(lines[2]), &end); err != nil || end.Command != "scan" || end.Count != 2 || end.More {
		t.Fatalf("scan --json last line %q: %+v %v", lines[2], end, err)
	}
	// The default limit: 100 shown, and a note says there are more.
	var in strings.Builder
	in.WriteString("use ordered\n")
	for i := range 101 {
		fmt.Fprintf(&in, "put lim%03d x\n", i)
	}
	in.WriteString("keys lim\n")
	out, stderr, code = e.cli(t, in.String())
	if code != 0 || strings.Count(out, "\nlim") != 100 || strings.Contains(out, "lim100") || !strings.Contains(stderr, "the default limit") {
		t.Fatalf("piped keys over 101 keys: exit %d, %d keys, stderr %q", code, strings.Count(out, "\nlim"), stderr)
	}
	// Errors: scan on the hashed keyspace; an unknown keyspace, naming
	// the declared ones; use of one.
	_, stderr, code = e.cli(t, "", "scan", "a")
	if code != 2 || !strings.Contains(stderr, "needs an ordered keyspace") || !strings.Contains(stderr, "ordered") {
		t.Fatalf("scan without a keyspace: exit %d, stderr %q", code, stderr)
	}
	_, stderr, code = e.cli(t, "", "--keyspace", "nope", "get", "a")
	if code != 2 || !strings.Contains(stderr, `unknown keyspace "nope"`) || !strings.Contains(stderr, "ordered") {
		t.Fatalf("--keyspace nope: exit %d, stderr %q", code, stderr)
	}
	_, stderr, code = e.cli(t, "use nope\n")
	if code != 2 || !strings.Contains(stderr, `unknown keyspace "nope"`) {
		t.Fatalf("use nope: exit %d, stderr %q", code, stderr)
	}
	_, stderr, code = e.cli(t, "", "use", "ordered")
	if code != 2 || !strings.Contains(stderr, "shell command") {
		t.Fatalf("one-shot use: exit %d, stderr %q", code, stderr)
	}
	// Tablets: the keyspace declares no split points, so group 0 serves
	// the one tablet; move-tablet hands it to group 1, and the keys are
	// read from there; balance has nothing to do (1 tablet, 2 groups).
	// Each line ends with the tablet's load: its keys, and the writes
	// its group applied to it (a moved tablet counts from 0 at its
	// target).
	e.must(t, 0, "min\tmax\tgroup 0\tserving\t106 keys, 106 writes\n", "tablets")
	e.must(t, 0, "OK\n", "move-tablet", "min", "1")
	e.must(t, 0, "min\tmax\tgroup 1\tserving\t106 keys, 0 writes\n", "tablets")
	e.must(t, 0, "vab\n", append(ks, "get", "ab")...)
	e.must(t, 0, "a\tva\nab\tvab\nb\tvb\nc\tvc\n", append(ks, "scan", "a", "d")...)
	e.must(t, 0, "OK\n", append(ks, "put", "e", "ve")...)
	e.must(t, 0, "0 moves\n", "balance")
	if _, stderr, code := e.cli(t, "", "move-tablet", "nope:a", "1"); code != 2 || !strings.Contains(stderr, "nope") {
		t.Fatalf("move-tablet of an unknown keyspace's key: exit %d, stderr %q", code, stderr)
	}
}

// TestTabletOps: split-tablet and collect on the real binaries, with the
// tablet balancer off (nothing moves, splits or collects but the test's
// commands). A split cuts the one tablet in two halves in group 0;
// moving the upper half to group 1 leaves its keys as garbage in group
// 0 beyond what the drop's own log entry deletes (GarbageStep); tablets
// shows group 0's count and collect reclaims them. A split sent again
// (the tablet is split already) prints OK.
func TestTabletOps(t *testing.T) {
	e := startE2E(t, "--balance-interval", "0")
	const n = 1200
	var in strings.Builder
	in.WriteString("use ordered\n")
	for i := range n {
		fmt.Fprintf(&in, "put k%04d v\n", i)
	}
	if out, stderr, code := e.cli(t, in.String()); code != 0 || strings.Count(out, "OK\n") != n {
		t.Fatalf("loading %d keys: exit %d, %d OKs, stderr %q", n, code, strings.Count(out, "OK\n"), stderr)
	}
	e.must(t, 0, fmt.Sprintf("min\tmax\tgroup 0\tserving\t%d keys, %d writes\n", n, n), "tablets")
	e.must(t, 0, "OK\n", "split-tablet", "min")
	// The median key: the first of the upper half.
	mid := fmt.Sprintf("ordered:k%04d", n/2)
	e.must(t, 0, fmt.Sprintf("min\t%s\tgroup 0\tserving\t%d keys, %d writes\n%s\tmax\tgroup 0\tserving\t%d keys, 0 writes\n", mid, n/2, n, mid, n/2), "tablets")
	// --json: one object a tablet.
	out := e.must(t, 0, "", "tablets", "--json")
	var tl []tabletLine
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var l tabletLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("tablets --json line %q: %v", line, err)
		}
		tl = append(tl, l)
	}
	if len(tl) != 2 || tl[0].From != "min" || tl[0].To != mid || tl[1].From != mid || tl[1].To != "max" {
		t.Fatalf("tablets --json after the split: %s", out)
	}
	// Errors: a fence no tablet starts at (exit 5, as move-tablet); a
	// malformed fence and a group the cluster has not (exit 2).
	if _, stderr, code := e.cli(t, "", "split-tablet", "ordered:k0001"); code != 5 || !strings.Contains(stderr, "no tablet starts at") {
		t.Fatalf("split-tablet of no tablet: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := e.cli(t, "", "split-tablet", "nope:a"); code != 2 || !strings.Contains(stderr, "nope") {
		t.Fatalf("split-tablet of an unknown keyspace's key: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := e.cli(t, "", "collect", "9"); code != 2 || !strings.Contains(stderr, `collect: group "9"`) {
		t.Fatalf("collect 9: exit %d, stderr %q", code, stderr)
	}

	e.must(t, 0, "OK\n", "move-tablet", mid, "1")
	// Group 0's garbage as it published it: read from the nearest
	// replica, which may not have applied the drop yet, so read until
	// the line shows (nothing collects it meanwhile).
	var garbage int
	for try := 0; ; try++ {
		out := e.must(t, 0, "", "tablets")
		if i := strings.Index(out, "\ngroup 0\t"); i >= 0 {
			if _, err := fmt.Sscanf(out[i+1:], "group 0\t%d garbage keys", &garbage); err != nil {
				t.Fatalf("tablets: garbage line: %v in %q", err, out)
			}
			break
		}
		if try == 200 {
			t.Fatalf("tablets never showed group 0's garbage: %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if garbage <= 0 || garbage > n/2 {
		t.Fatalf("group 0's garbage: %d keys, want 1..%d (the moved half's keys the drop's entry left)", garbage, n/2)
	}
	out = e.must(t, 0, "", "collect")
	var g0, g1 int
	if _, err := fmt.Sscanf(out, "group 0: %d keys reclaimed\ngroup 1: %d keys reclaimed\n", &g0, &g1); err != nil {
		t.Fatalf("collect: %q: %v", out, err)
	}
	if g0 != garbage || g1 != 0 {
		t.Fatalf("collect reclaimed %d keys in group 0 and %d in group 1, want %d (what tablets showed) and 0", g0, g1, garbage)
	}
	// Nothing left: collect again reclaims 0, --json says so.
	out = e.must(t, 0, "", "collect", "--json", "0")
	var cl collectLine
	if err := json.Unmarshal([]byte(out), &cl); err != nil || cl != (collectLine{Command: "collect", Group: 0}) {
		t.Fatalf("collect --json 0 again: %q: %+v %v", out, cl, err)
	}
	for try := 0; ; try++ {
		out := e.must(t, 0, "", "tablets")
		if !strings.Contains(out, "garbage") {
			break
		}
		if try == 200 {
			t.Fatalf("tablets still shows garbage after collect: %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The keys are all there, read from both groups.
	out = e.must(t, 0, "", "--keyspace", "ordered", "scan", "--limit", "0", "")
	if c := strings.Count(out, "\n"); c != n {
		t.Fatalf("scan after the move and collect: %d keys, want %d", c, n)
	}
}
