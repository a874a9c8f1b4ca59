package shm

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// startSleeper starts a child that runs until killed and returns its
// identity; the cleanup kills and reaps it.
func startSleeper(t *testing.T) (*exec.Cmd, procIdent) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	_, start, err := procStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, procIdent(start<<pidBits | uint64(cmd.Process.Pid))
}

// havePidfd skips the test where the kernel gives no pidfd.
func havePidfd(t *testing.T) {
	t.Helper()
	fd, err := unix.PidfdOpen(unix.Getpid(), unix.PIDFD_NONBLOCK)
	if err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	unix.Close(fd)
}

// deadWithin reports whether the monitor finds its process dead within d.
func deadWithin(m *procMonitor, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if err := m.use(); errors.Is(err, rdma.ErrPeerDead) {
			return true
		}
	}
	return false
}

// exitSeen runs a monitor (at a 2 ms check interval) of a child that is
// killed and left unreaped (a zombie), and says whether the monitor saw
// the death within d and whether it ran on a timer.
func exitSeen(t *testing.T, d time.Duration) (seen, timer bool) {
	cmd, id := startSleeper(t)
	m := acquireMonitor(id, 2*time.Millisecond)
	defer m.release()
	if err := m.use(); err != nil {
		t.Fatalf("use of a running process's monitor = %v", err)
	}
	timer = m.timer.Load() != nil
	cmd.Process.Kill() // not reaped yet: a zombie
	return deadWithin(m, d), timer
}

// TestExitWatch: with a pidfd the monitor sees a peer process's exit
// through the runtime's poller, with no timer (a live peer costs nothing);
// without one (the fallback) the timer's /proc check sees it. Planted: an
// exit watch that never sees the pidfd readable is caught by the death
// going unseen.
func TestExitWatch(t *testing.T) {
	havePidfd(t)
	if seen, timer := exitSeen(t, time.Minute); !seen || timer {
		t.Fatalf("pidfd watch: death seen %v (want true), timer %v (want none)", seen, timer)
	}
	t.Run("fallback", func(t *testing.T) {
		exitKnobs.noPidfd.Store(true)
		defer exitKnobs.noPidfd.Store(false)
		if seen, timer := exitSeen(t, time.Minute); !seen || !timer {
			t.Fatalf("without a pidfd: death seen %v (want true), timer %v (want one)", seen, timer)
		}
	})
	t.Run("planted-ignoreExit", func(t *testing.T) {
		exitKnobs.ignoreExit.Store(true)
		defer exitKnobs.ignoreExit.Store(false)
		if seen, _ := exitSeen(t, 300*time.Millisecond); seen {
			t.Fatal("planted ignoreExit: the death was seen anyway; the test does not look at the exit watch")
		}
	})
}

// TestExitWatchAtOpen: a process already gone, or a pid now held by
// another process (a different start time), is dead from the start, with
// neither a pidfd nor a timer.
func TestExitWatchAtOpen(t *testing.T) {
	havePidfd(t)
	cmd, id := startSleeper(t)
	cmd.Process.Kill()
	cmd.Wait()
	self, err := selfIdent()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		id   procIdent
	}{{"reaped", id}, {"reused pid", self + 1<<pidBits}} {
		m := acquireMonitor(c.id, time.Millisecond)
		err := m.use()
		exit, timer := m.exit != nil, m.timer.Load() != nil
		m.release()
		if !errors.Is(err, rdma.ErrPeerDead) || exit || timer {
			t.Errorf("%s: use = %v (want ErrPeerDead), pidfd %v, timer %v (want neither)", c.name, err, exit, timer)
		}
	}
	m := acquireMonitor(self, time.Millisecond)
	defer m.release()
	if err := m.use(); err != nil || m.exit == nil {
		t.Fatalf("this process: use = %v, pidfd %v: want alive through a pidfd", err, m.exit != nil)
	}
}
