package main_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// procState is process pid's state letter in /proc (T: stopped).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return '?'
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return '?'
	}
	return b[i+2]
}

// waitFor polls cond for up to 30 s.
func waitFor(cond func() bool) bool {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// openPTY opens a pseudo-terminal: its master (what a terminal emulator
// holds) and its slave (the terminal the programs run on).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatalf("unlock the pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatalf("pty number: %v", err)
	}
	sl, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("no pseudo-terminal: %v", err)
	}
	return m, sl
}

// TestMakeRunCtrlC is `make run` stopped by Ctrl-C at a terminal: make
// runs in a session of its own on a pseudo-terminal, as a shell's
// foreground job, and the test types Ctrl-Z, continues the job, then types
// Ctrl-C, which the terminal turns into SIGINT to its foreground process
// group. kvserver stops cleanly,
// removes its files, and make exits 0: with `go run` in the recipe, go
// run exited 1 and make printed "*** [run] Error 1"; with kvserver in
// make's process group, make got the SIGINT too and died of it (exit
// status 130 at a shell).
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
	mapFile := filepath.Join(dir, "cluster.json")
	args := "--memory --map " + mapFile + " --shm-dir " + shmDir + " --name makerun --control -"
	cmd := exec.Command(makeBin, "--no-print-directory", "run", "RUNBIN="+filepath.Join(dir, "kvserver"), "ARGS="+args)
	cmd.Dir = "../.."
	master, slave := openPTY(t)
	defer master.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own with the pty as its controlling terminal: make
	// is the terminal's foreground job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	var out syncbuf.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&out, master); close(copied) }() // ends with EIO once every holder of the slave is gone
	if err := os.Mkdir(shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	sid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		syscall.Kill(-sid, syscall.SIGKILL)
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
	pid := 0
	if m := regexp.MustCompile(`, pid (\d+)`).FindStringSubmatch(out.String()); m != nil {
		pid, _ = strconv.Atoi(m[1])
	} else {
		t.Fatalf("no pid in the banner:\n%s", out.String())
	}

	// Ctrl-Z stops the job, make with kvserver, as a shell expects of its
	// job; continued (what fg does without a shell: SIGCONT to the job, which
	// kept the terminal), kvserver takes the terminal again.
	if _, err := master.Write([]byte{26}); err != nil { // Ctrl-Z
		t.Fatal(err)
	}
	for _, p := range []int{sid, pid} {
		if !waitFor(func() bool { return procState(p) == 'T' }) {
			t.Errorf("process %d (state %c) not stopped after Ctrl-Z (make %d, kvserver %d):\n%s", p, procState(p), sid, pid, out.String())
		}
	}
	syscall.Kill(-sid, syscall.SIGCONT)
	if !waitFor(func() bool {
		fg, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP)
		return err == nil && fg == pid
	}) {
		fg, _ := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP)
		t.Errorf("kvserver (pid %d) is not the terminal's foreground but group %d (make %d)", pid, fg, sid)
	}

	if _, err := master.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("make run did not end within a minute of Ctrl-C:\n%s", out.String())
	}
	select {
	case <-copied:
	case <-time.After(10 * time.Second):
	}
	o := out.String()
	if !strings.Contains(o, "kvserver: stopping") {
		t.Errorf("kvserver did not stop cleanly:\n%s", o)
	}
	if strings.Contains(o, "Error") || strings.Contains(o, "exit status") {
		t.Errorf("make run after Ctrl-C reports a failure:\n%s", o)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled():
		t.Errorf("make run died of %v after Ctrl-C, want exit 0 (a shell says exit status %d):\n%s", ee.Sys().(syscall.WaitStatus).Signal(), 128+int(ee.Sys().(syscall.WaitStatus).Signal()), o)
	case err != nil:
		t.Errorf("make run after Ctrl-C: %v, want exit 0:\n%s", err, o)
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
