package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestMakeRunCtrlC is `make run` stopped by Ctrl-C as a terminal sends it:
// SIGINT to the whole foreground process group (make and what it runs).
// kvserver stops cleanly and make reports no failed recipe (with `go run`
// in the recipe, go run exited 1 and make printed "*** [run] Error 1").
func TestMakeRunCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver under make")
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	dir := t.TempDir()
	shmDir := filepath.Join(dir, "shm")
	args := "--map " + filepath.Join(dir, "cluster.json") + " --shm-dir " + shmDir + " --name makerun --control -"
	cmd := exec.Command(makeBin, "--no-print-directory", "run", "RUNBIN="+filepath.Join(dir, "kvserver"), "ARGS="+args)
	cmd.Dir = "../.."
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group, as a terminal's foreground job
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := os.Mkdir(shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		syscall.Kill(-pgid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
		}
	}()
	up := time.After(5 * time.Minute) // a build on a loaded machine
	for !strings.Contains(out.String(), "is up in") {
		select {
		case err := <-done:
			t.Fatalf("make run ended before the cluster was up: %v\n%s", err, out.String())
		case <-up:
			t.Fatalf("the cluster is not up after 5 minutes:\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("make run did not end within a minute of Ctrl-C:\n%s", out.String())
	}
	o := out.String()
	if !strings.Contains(o, "kvserver: stopping") {
		t.Errorf("kvserver did not stop cleanly:\n%s", o)
	}
	if strings.Contains(o, "Error") || strings.Contains(o, "exit status") {
		t.Errorf("make run after Ctrl-C reports a failure:\n%s", o)
	}
	// make itself got the SIGINT too: GNU make waits for its recipe,
	// then dies of the signal (as at a terminal, silently). Anything
	// else is a failure make saw.
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT) {
		t.Errorf("make run after Ctrl-C: %v, want exit 0 or death by SIGINT:\n%s", err, o)
	}
}
