package vfs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"strings"
	"testing"
)

// TestSyncGivesUpP: the fdatasync of a vfs.OS file hands its goroutine's
// P off as it enters the kernel (entersyscallblock), not when sysmon takes
// it back: in the execution trace, the next event of the thread that
// entered the system call from osFile.Sync is its P going idle. With a
// plain system call the thread keeps the P until the call returns (or
// sysmon steals it, an event of another thread), and the device
// goroutines of the other replicas that the same poller pass made
// runnable wait behind it (docs/dev/durability-plan.md, "dio").
func TestSyncGivesUpP(t *testing.T) {
	dir := t.TempDir()
	f, err := OS.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	checkGivesUpP(t, dir, "osFile.Sync", "fdatasync", func() error { return f.Sync() })
}

// TestBigWriteGivesUpP: a WriteAt of BigWrite bytes or more hands its P
// off as it enters pwrite (as TestSyncGivesUpP), and writes the bytes
// where they belong; a shorter one is os.File's.
func TestBigWriteGivesUpP(t *testing.T) {
	dir := t.TempDir()
	f, err := OS.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	big := bytes.Repeat([]byte("0123456789abcdef"), BigWrite/16+1)
	small := []byte("small write")
	checkGivesUpP(t, dir, "osFile.WriteAt", "pwrite", func() error {
		if n, err := f.WriteAt(big, 4096); err != nil || n != len(big) {
			return fmt.Errorf("big WriteAt: %d of %d bytes, %v", n, len(big), err)
		}
		return nil
	})
	if n, err := f.WriteAt(small, 100); err != nil || n != len(small) {
		t.Fatalf("small WriteAt: %d of %d bytes, %v", n, len(small), err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4096+len(big))
	copy(want[4096:], big)
	copy(want[100:], small)
	if !bytes.Equal(got, want) {
		t.Fatalf("the file holds %d bytes, not the %d written (or other bytes)", len(got), len(want))
	}
	if _, err := f.WriteAt(big, -1); err == nil {
		t.Fatal("a big WriteAt at a negative offset succeeded")
	}
}

// checkGivesUpP runs call under the execution trace and checks that the
// thread entering the system call sys from the function from (both in
// the event's stack) next gives its P up: its next event is the P going
// idle (Running->Idle), not the thread taking the P back at the call's
// end or sysmon stealing it (an event of another thread).
func checkGivesUpP(t *testing.T, dir, from, sys string, call func() error) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("execution trace unavailable: %v", err)
	}
	err = call()
	trace.Stop()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "trace.out")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goTool, "tool", "trace", "-d=parsed", path).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool trace -d=parsed: %v\n%s", err, out)
	}
	// Events start with "M=<thread> P=... G=..." and run to the next one.
	var evs []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "M=") || len(evs) == 0 {
			evs = append(evs, line)
		} else {
			evs[len(evs)-1] += "\n" + line
		}
	}
	found := false
	for i, ev := range evs {
		// The system call itself (its stack names it: vfs.fdatasync or
		// vfs.pwrite; unix.Fdatasync, or the os package's pwrite, with a
		// plain system call), not another one the function might make.
		if !strings.Contains(ev, "Running->Syscall") || !strings.Contains(ev, from) || !strings.Contains(strings.ToLower(ev), sys) {
			continue
		}
		found = true
		m, _, _ := strings.Cut(ev, " ")
		next := ""
		for _, e := range evs[i+1:] {
			if strings.HasPrefix(e, m+" ") {
				next, _, _ = strings.Cut(e, "\n")
				break
			}
		}
		if !strings.Contains(next, "ProcID=") || !strings.Contains(next, "Running->Idle") {
			t.Fatalf("the thread that entered %s from %s kept its P: its next event is %q, want its P going idle (Running->Idle)", sys, from, next)
		}
	}
	if !found {
		t.Fatalf("no %s system call from %s in the trace (%d events): the parsed trace's format changed?", sys, from, len(evs))
	}
}
