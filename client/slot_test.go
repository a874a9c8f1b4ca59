package client

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestSlotLockFiles checks the shm clients' slot claims: at most one
// holder of a slot at a time while holders remove their lock files as
// they release them (the race a removed-and-recreated lock file opens),
// and nothing left in the directory once every slot is released.
func TestSlotLockFiles(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	m := &cluster.Map{Name: "slots", Fabric: "shm", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100, 101}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	slotLockHook = func() { time.Sleep(20 * time.Microsecond) } // widen the race
	defer func() { slotLockHook = nil }()
	var holders [2]atomic.Int32
	var claims atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 300 {
				k, f, err := claimSlot(m)
				if err != nil {
					continue // both slots held
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("slot %d has %d holders", k, n)
				}
				claims.Add(1)
				holders[k].Add(-1)
				releaseSlot(f)
			}
		})
	}
	wg.Wait()
	if claims.Load() < 300 {
		t.Errorf("only %d claims succeeded", claims.Load())
	}
	dir := filepath.Join(os.TempDir(), "rdmakv-slots")
	left, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("left behind: %d entries in %s", len(ents), dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind (%v)", dir, err)
	}
}

// TestSlotLockFilesOfKilledClient: a client killed with SIGKILL cannot
// remove its slot's lock file; the next client to claim or release a slot
// removes it (nobody holds it any more), and the last one out removes the
// directories, rdmakv-slots included. Real processes: a child process of
// this test binary claims slot 1 while this process holds slot 0, and is
// killed -9; then this process releases slot 0, and a new client claims
// and releases a slot.
func TestSlotLockFilesOfKilledClient(t *testing.T) {
	if os.Getenv("RDMAKV_SLOT_CHILD") != "" {
		slotChild()
		return
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	m := slotTestMap(t)
	slots := filepath.Join(tmp, "rdmakv-slots")
	k, f, err := claimSlot(m)
	if err != nil || k != 0 {
		t.Fatalf("claim: slot %d, %v; want slot 0", k, err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestSlotLockFilesOfKilledClient$")
	child.Env = append(os.Environ(), "RDMAKV_SLOT_CHILD=1", "TMPDIR="+tmp)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "slot 1" {
		t.Fatalf("the child claimed %q (%v), want slot 1", line, err)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	if _, err := os.Stat(filepath.Join(slots, m.Name, "slot-1.lock")); err != nil {
		t.Fatalf("the killed child's lock file: %v, want it left (the test needs it)", err)
	}
	// The slot is free again: a claim while slot 0 is held gets it.
	k2, f2, err := claimSlot(m)
	if err != nil || k2 != 1 {
		t.Fatalf("claim after the kill: slot %d, %v; want slot 1", k2, err)
	}
	releaseSlot(f2)
	releaseSlot(f)
	if left := slotFiles(slots); len(left) > 0 {
		t.Errorf("after every client released its slot, left behind: %v", left)
	}

	// Again, the killed client's file not being the one the next client
	// claims: slot 0 held here, slot 1 by the child, which is killed; the
	// release of slot 0 removes slot 1's file.
	if k, f, err = claimSlot(m); err != nil || k != 0 {
		t.Fatalf("claim: slot %d, %v; want slot 0", k, err)
	}
	child = exec.Command(os.Args[0], "-test.run=^TestSlotLockFilesOfKilledClient$")
	child.Env = append(os.Environ(), "RDMAKV_SLOT_CHILD=1", "TMPDIR="+tmp)
	if out, err = child.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	if line, err = bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "slot 1" {
		t.Fatalf("the child claimed %q (%v), want slot 1", line, err)
	}
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	releaseSlot(f)
	// A new client opens and closes.
	if k, f, err = claimSlot(m); err != nil {
		t.Fatal(err)
	}
	releaseSlot(f)
	if left := slotFiles(slots); len(left) > 0 {
		t.Errorf("after a killed client and a client that opened and closed, left behind: %v", left)
	}
}

// slotChild claims a slot, says which on stdout, and waits to be killed.
func slotChild() {
	k, _, err := claimSlot(slotTestMap(nil))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("slot %d\n", k)
	time.Sleep(time.Minute)
	os.Exit(1)
}

func slotTestMap(t *testing.T) *cluster.Map {
	m := &cluster.Map{Name: "killed", Fabric: "shm", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100, 101, 102}}
	if err := m.Fill(); err != nil {
		if t == nil {
			panic(err)
		}
		t.Fatal(err)
	}
	return m
}

// slotFiles lists what is in and under dir, dir itself included if it
// exists.
func slotFiles(dir string) []string {
	var left []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			left = append(left, p)
		}
		return nil
	})
	return left
}
