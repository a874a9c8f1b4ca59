package vfs

import (
	"bytes"
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
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := t.TempDir()
	f, err := OS.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("execution trace unavailable: %v", err)
	}
	err = f.Sync()
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
		// The fdatasync itself (its stack names it: vfs.fdatasync, or
		// unix.Fdatasync), not another system call Sync might make.
		if !strings.Contains(ev, "Running->Syscall") || !strings.Contains(ev, "osFile.Sync") || !strings.Contains(strings.ToLower(ev), "fdatasync") {
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
			t.Fatalf("the thread that entered fdatasync from osFile.Sync kept its P: its next event is %q, want its P going idle (Running->Idle)", next)
		}
	}
	if !found {
		t.Fatalf("no fdatasync system call from osFile.Sync in the trace (%d events): the parsed trace's format changed?", len(evs))
	}
}
