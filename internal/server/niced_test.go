package server

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nicedFault runs fn by runNiced and returns the first property of the
// niced Persist thread it saw broken, nil if none: the thread that runs
// fn is at nice persistNice (read back from /proc while fn runs), and it
// ends with fn, so that no other goroutine (a poller) ever runs on a
// niced thread. gone bounds the wait for the thread's end.
func nicedFault(fn func(), gone time.Duration) error {
	return nicedTry(fn, gone, 5)
}

// nicedTry is nicedFault with at most tries runs (see the main thread's).
func nicedTry(fn func(), gone time.Duration, tries int) error {
	type seen struct {
		tid, nice int
		err       error
	}
	ch := make(chan seen, 1)
	runNiced(func() {
		tid := unix.Gettid()
		n, err := threadNice(tid)
		fn()
		ch <- seen{tid, n, err}
	})
	s := <-ch
	if s.err != nil {
		return s.err
	}
	if s.tid == os.Getpid() && s.nice == persistNice && tries > 1 {
		// The process's main thread: Go never ends it, it parks it for
		// good instead (runtime.mexit), so it runs nothing else niced
		// either. Once more: the next run cannot be on it.
		return nicedTry(fn, gone, tries-1)
	}
	if s.nice != persistNice {
		return fmt.Errorf("niced: nice %d while Persist runs, want %d", s.nice, persistNice)
	}
	deadline := time.Now().Add(gone)
	for {
		n, err := threadNice(s.tid)
		if errors.Is(err, fs.ErrNotExist) || err != nil && strings.Contains(err.Error(), "no such process") {
			return nil // the thread ended with its goroutine
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outlives: thread %d (pid %d) still runs at nice %d %v after its Persist ended", s.tid, os.Getpid(), n, gone)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRunNicedThread: runNiced's thread is at persistNice while fn runs
// and ends with it (or, the main thread, parks for good); the planted noNice is caught as nice 0, the planted
// noLock (the niced thread back in Go's pool) as a thread that outlives
// its Persist.
func TestRunNicedThread(t *testing.T) {
	if err := nicedFault(func() {}, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		set  func(on bool)
		want string
	}{
		{"noNice", func(on bool) { persistKnobs.noNice = on }, "niced: nice 0 while Persist runs"},
		{"noLock", func(on bool) { persistKnobs.noLock = on }, "outlives: thread"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.set(true)
			defer c.set(false)
			err := nicedFault(func() {}, 500*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("planted %s: got %v, want %q", c.name, err, c.want)
			}
		})
	}
}

// TestRunNicedFinishesBusy: with every core busy at nice 0 (one spinning
// shell per CPU, as pollers under load), a niced Persist still finishes:
// the priority is lower, not idle-only (a snapshot that never finished
// would let the log grow). The work is 16 hashes of 1 MiB; the spinners
// must have run meanwhile (their CPU time grew), or the cores were not
// busy and the test proved nothing.
func TestRunNicedFinishesBusy(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	var spin []*exec.Cmd
	defer func() {
		for _, c := range spin {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for range runtime.NumCPU() {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		spin = append(spin, c)
	}
	cpu0 := spinCPU(t, spin)
	buf := make([]byte, 1<<20)
	var sum [32]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := nicedFault(func() {
			for i := range 16 {
				buf[0] = byte(i)
				sum = sha256.Sum256(buf)
			}
		}, 30*time.Second); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("a niced Persist did not finish in 2 minutes with every core busy")
	}
	if sum == [32]byte{} {
		t.Fatal("the work did not run")
	}
	if cpu1 := spinCPU(t, spin); cpu1 <= cpu0 {
		t.Fatalf("the spinners did not run (%d ticks before, %d after): the cores were not busy", cpu0, cpu1)
	}
}

// spinCPU is the spinners' CPU time so far, in clock ticks.
func spinCPU(t *testing.T, spin []*exec.Cmd) int {
	t.Helper()
	n := 0
	for _, c := range spin {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		var u, s int
		fmt.Sscan(f[11], &u) // utime, field 14
		fmt.Sscan(f[12], &s) // stime
		n += u + s
	}
	return n
}

// TestNiceOf reads the nice field of stat lines, a command with spaces
// and parentheses included.
func TestNiceOf(t *testing.T) {
	line := "123 (a ) b) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 20 10 1 0 100"
	if n, err := niceOf([]byte(line)); err != nil || n != 10 {
		t.Fatalf("niceOf = %d, %v, want 10", n, err)
	}
	if _, err := niceOf([]byte("123 (x) S 1 2")); err == nil {
		t.Fatal("a short line read")
	}
}
