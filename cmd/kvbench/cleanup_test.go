package main

import (
	"bufio"
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests run kvbench as a real process (built with go build, not the
// test binary: signals and exit codes are the subject) against a --shm-dir
// of their own under /dev/shm.

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// kvbenchBin builds kvbench once per test binary run (or takes the one
// make unit built, RDMAKV_TEST_BIN).
func kvbenchBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if d := os.Getenv("RDMAKV_TEST_BIN"); d != "" {
			// make unit built kvbench once (not under -race).
			buildBin = filepath.Join(d, "kvbench")
			if _, err := os.Stat(buildBin); err != nil {
				buildErr = &buildError{err: err}
			}
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "kvbench-bin-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "kvbench")
		out, err := exec.Command("go", "build", "-o", buildBin, ".").CombinedOutput()
		if err != nil {
			buildErr = &buildError{err: err, out: out}
		}
	})
	if buildErr != nil {
		t.Fatalf("go build kvbench: %v", buildErr)
	}
	return buildBin
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + ":\n" + string(e.out) }

// shmTestDir is a fresh --shm-dir under /dev/shm, removed after the test.
func shmTestDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "kvbench-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// filesBelow lists every path below dir.
func filesBelow(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dir {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// countNodes counts shm node files below dir.
func countNodes(dir string) int {
	n := 0
	for _, p := range filesBelow(dir) {
		if strings.HasSuffix(p, ".node") {
			n++
		}
	}
	return n
}

// waitFor polls cond every 10ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// childrenOf lists pid's live children, as childPids does for this process.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[0] != "Z" && f[1] == strconv.Itoa(pid) {
			c, _ := strconv.Atoi(e.Name())
			out = append(out, c)
		}
	}
	return out
}

// gone reports whether pid no longer runs (no process, or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// exitOf waits up to d for cmd and returns its exit code (-1: killed by
// a signal).
func exitOf(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("kvbench did not exit within %v", d)
	}
	return 0
}

// TestSignalCleansUp interrupts real kvbench runs mid-measurement, with
// their child processes up and their shm files in place: SIGINT during a
// broadcast commit table (3 replica processes), SIGTERM during a fabric
// measurement (one peer process). Each must exit with 128+signal and one
// line on stderr, leave no child process, and leave --shm-dir empty.
func TestSignalCleansUp(t *testing.T) {
	bin := kvbenchBin(t)
	cases := []struct {
		name  string
		sig   syscall.Signal
		args  []string
		nodes int // node files to wait for before the signal
	}{
		{"SIGINT broadcast", syscall.SIGINT, []string{"broadcast", "--groups", "shm:3", "--tables", "commit", "--sizes", "10",
			"--max-window", "1", "--duration", "3s", "--runs", "1", "--retries", "0"}, 3}, // one-way baseline 3s, then the group
		{"SIGTERM fabric", syscall.SIGTERM, []string{"fabric", "--fabrics", "shm", "--modes", "spin", "--ops", "write",
			"--no-baselines", "--duration", "20s", "--runs", "1"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := shmTestDir(t)
			var stderr bytes.Buffer
			cmd := exec.Command(bin, append(tc.args, "--shm-dir", dir)...)
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if !waitFor(30*time.Second, func() bool { return countNodes(dir) >= tc.nodes }) {
				cmd.Process.Kill()
				t.Fatalf("kvbench never had %d node files in %s: %v; stderr:\n%s", tc.nodes, dir, filesBelow(dir), stderr.String())
			}
			kids := childrenOf(cmd.Process.Pid)
			if len(kids) == 0 {
				t.Fatal("kvbench has no child processes mid-run")
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if code := exitOf(t, cmd, 15*time.Second); code != 128+int(tc.sig) {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, 128+int(tc.sig), stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if last := lines[len(lines)-1]; !strings.Contains(last, "interrupted") || !strings.Contains(last, "removed "+dir) {
				t.Errorf("last stderr line %q, want the interruption and the removed work directory", last)
			}
			for _, l := range lines {
				if strings.Contains(l, "peer died") || strings.Contains(l, "member process exited") {
					t.Errorf("stderr has an error line from the teardown: %q", l)
				}
			}
			if left := filesBelow(dir); len(left) != 0 {
				t.Errorf("left in --shm-dir: %v", left)
			}
			for _, k := range kids {
				if !waitFor(5*time.Second, func() bool { return gone(k) }) {
					t.Errorf("child process %d still runs after kvbench exited", k)
				}
			}
		})
	}
}

// TestClosedStdoutCleansUp closes the reading end of kvbench's stdout after
// the first lines of a soak (which prints as it goes): the next write fails
// with EPIPE, and kvbench stops, cleans up and exits 1.
func TestClosedStdoutCleansUp(t *testing.T) {
	bin := kvbenchBin(t)
	dir := shmTestDir(t)
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "broadcast", "--soak", "20s", "--soak-every", "300ms", "--soak-warmup", "100ms", "--shm-dir", dir)
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(out)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("no first line: %v; stderr:\n%s", err, stderr.String())
	}
	out.(io.Closer).Close()
	if code := exitOf(t, cmd, 20*time.Second); code != 1 {
		t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "broken pipe") || !strings.Contains(last, "removed "+dir) {
		t.Errorf("last stderr line %q, want the broken pipe and the removed work directory", last)
	}
	if left := filesBelow(dir); len(left) != 0 {
		t.Errorf("left in --shm-dir: %v", left)
	}
}

// TestKilledRunSweptAtNextStart SIGKILLs kvbench mid-run, so it cleans up
// nothing; its child dies with it (parent-death signal), and the next
// kvbench on the same --shm-dir removes the work directory and says so.
func TestKilledRunSweptAtNextStart(t *testing.T) {
	bin := kvbenchBin(t)
	dir := shmTestDir(t)
	cmd := exec.Command(bin, "fabric", "--fabrics", "shm", "--modes", "spin", "--ops", "write",
		"--no-baselines", "--duration", "20s", "--runs", "1", "--shm-dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if !waitFor(30*time.Second, func() bool { return countNodes(dir) >= 2 }) {
		t.Fatalf("kvbench never had 2 node files in %s", dir)
	}
	kids := childrenOf(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	for _, k := range kids {
		if !waitFor(5*time.Second, func() bool { return gone(k) }) {
			t.Fatalf("child %d outlived its SIGKILLed parent", k)
		}
	}
	left := filesBelow(dir)
	if len(left) == 0 {
		t.Fatal("a SIGKILLed kvbench left nothing: the test tests nothing")
	}
	var stdout, stderr bytes.Buffer
	next := exec.Command(bin, "fabric", "--fabrics", "mem", "--modes", "spin", "--ops", "write", "--no-baselines",
		"--duration", "20ms", "--runs", "1", "--retries", "0", "--shm-dir", dir)
	next.Stdout, next.Stderr = &stdout, &stderr
	if err := next.Run(); err != nil {
		t.Fatalf("next kvbench: %v; stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "kvbench: removed "+dir+"/kvbench-") {
		t.Errorf("next kvbench did not report the removal; stderr:\n%s", stderr.String())
	}
	if left := filesBelow(dir); len(left) != 0 {
		t.Errorf("left in --shm-dir after the next run: %v", left)
	}
}
