package main_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadmeRunOnFreshClone is the README's set-up on a fresh checkout:
// on this repository's committed HEAD (so it checks what CI and a
// newcomer get, not the working tree), it runs the README's run command,
// `make run`, in the background (with ARGS giving a private map, name and
// shm directory, so it runs beside a developer's own local cluster),
// uses kvcli against it as the README says, stops it with Ctrl-C's
// signal and checks that nothing is left behind.
//
// A working tree that holds exactly HEAD's files (git status, ignored
// files included, prints nothing: CI's fresh checkout) is HEAD: the test
// runs there, with make run's binary in a temporary directory (RUNBIN),
// so that nothing is written into the tree. Any other tree is cloned
// first. A clone lives in a directory of its own, and go's build cache
// keys every compiled package of the module by its directory (without
// -trimpath): the clone compiled kvserver's and kvcli's packages of the
// module a second time, for sources identical to the tree's (the test
// took 31 s of CPU and 192-208 s at load 21-23 with the clone, 6-9 s of
// CPU and 45-69 s at load 19-20 in the tree, alternated).
func TestReadmeRunOnFreshClone(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and builds the commands")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	dir := t.TempDir()
	src := strings.TrimSpace(string(root)) // where make run and kvcli run
	makeArgs := []string{"-s", "run"}
	if st, err := exec.Command("git", "-C", src, "status", "--porcelain", "--ignored", "--untracked-files=all").Output(); err != nil || len(st) > 0 {
		t.Logf("the working tree is not HEAD (git status: %v, %d bytes): cloning HEAD", err, len(st))
		src = filepath.Join(dir, "clone")
		if b, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(root)), src).CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v\n%s", err, b)
		}
	} else {
		t.Logf("the working tree is HEAD: make run in %s", src)
		makeArgs = append(makeArgs, "RUNBIN="+filepath.Join(dir, "kvserver"))
	}
	shmDir := filepath.Join(dir, "shm")
	os.Mkdir(shmDir, 0o755)
	mapFile := filepath.Join(dir, "run", "cluster.json")
	name := fmt.Sprintf("fresh%d", os.Getpid())
	run := exec.Command("make", append(makeArgs, fmt.Sprintf("ARGS=--data-dir %s --map %s --shm-dir %s --name %s", filepath.Join(dir, "data"), mapFile, shmDir, name))...)
	run.Dir = src
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C signals the whole group
	out, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	run.Stderr = &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	defer syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
	up := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var b strings.Builder
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "stop:") {
				up <- b.String()
			}
		}
	}()
	select {
	case banner := <-up:
		if !strings.Contains(banner, "is up") || !strings.Contains(banner, mapFile) || !strings.Contains(banner, "kvcli put hello world") {
			t.Errorf("banner:\n%s", banner)
		}
	case err := <-exited:
		t.Fatalf("make run exited: %v\n%s", err, stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("make run: no banner in 3 minutes\n%s", stderr.String())
	}

	kvcli := func(args ...string) string {
		cmd := exec.Command("go", append([]string{"run", "./cmd/kvcli", "--map", mapFile}, args...)...)
		cmd.Dir = src
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kvcli %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	kvcli("put", "hello", "world")
	if got := kvcli("get", "hello"); strings.TrimSpace(got) != "world" {
		t.Errorf("kvcli get hello = %q, want world", got)
	}

	syscall.Kill(-run.Process.Pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("make run did not stop on SIGINT\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "Error") {
		t.Errorf("make run reports an error after Ctrl-C:\n%s", stderr.String())
	}
	for _, p := range []string{mapFile, mapFile + ".lock"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left behind", p)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(shmDir, "*")); len(left) > 0 {
		t.Errorf("left in the shm dir: %v", left)
	}
}
