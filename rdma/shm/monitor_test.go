package shm

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// monitoredPeer is a peer of another process whose liveness check is
// check (instead of a /proc read), as connect makes it.
func monitoredPeer(every time.Duration, check func() bool) *peer {
	m := &procMonitor{key: monitorKey{every: every}, refs: 1, alive: check}
	m.start()
	return &peer{nf: make([]byte, nodeFileSize), mon: m, refs: 1}
}

// TestCheckLiveOffPostPath: the liveness check of a peer's process runs on
// the peer's monitor, never on the goroutine that posts: checkLive returns
// while a check is under way (here: blocked), and fails once the monitor
// found the process dead.
func TestCheckLiveOffPostPath(t *testing.T) {
	var checks atomic.Int64
	release := make(chan struct{})
	p := monitoredPeer(time.Millisecond, func() bool {
		checks.Add(1)
		<-release // a slow look at /proc
		return false
	})
	defer func() {
		p.mon.gone.Store(true)
		p.mon.timer.Load().Stop()
	}()
	posted := make(chan error, 1)
	go func() {
		// Posts keep the peer in use until the monitor is inside its check,
		// and then some more: none of them may wait for the check.
		for checks.Load() == 0 {
			if err := p.checkLive(); err != nil {
				posted <- err
				return
			}
		}
		for range 100000 {
			if err := p.checkLive(); err != nil {
				posted <- err
				return
			}
		}
		posted <- nil
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatalf("checkLive = %v while the process was not found dead yet", err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("checkLive waited for the liveness check of the peer's process (it is on the post path)")
	}
	close(release)
	for deadline := time.Now().Add(time.Minute); ; {
		if err := p.checkLive(); errors.Is(err, rdma.ErrPeerDead) {
			break
		} else if err != nil {
			t.Fatalf("checkLive = %v, want ErrPeerDead", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the monitor found the process dead, and checkLive still succeeds a minute later")
		}
		time.Sleep(time.Millisecond)
	}
	if n := checks.Load(); n != 1 {
		t.Errorf("%d checks of the process; dead is sticky, want 1", n)
	}
}

// TestMonitorIdle: a peer no op uses is not checked (its monitor is not
// re-armed), and the first op after the idle spell re-arms it.
func TestMonitorIdle(t *testing.T) {
	var checks atomic.Int64
	p := monitoredPeer(time.Millisecond, func() bool { checks.Add(1); return true })
	defer func() {
		p.mon.gone.Store(true)
		p.mon.timer.Load().Stop()
	}()
	for deadline := time.Now().Add(time.Minute); p.mon.armed.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("the monitor of an unused peer still armed after a minute")
		}
		time.Sleep(time.Millisecond)
	}
	n := checks.Load()
	time.Sleep(50 * time.Millisecond) // 50 intervals: room for checks that must not happen
	if m := checks.Load(); m != n {
		t.Fatalf("%d checks of an idle peer's process", m-n)
	}
	if err := p.checkLive(); err != nil {
		t.Fatal(err)
	}
	if !p.mon.armed.Load() {
		t.Fatal("the first op after an idle spell did not re-arm the monitor")
	}
	for deadline := time.Now().Add(time.Minute); checks.Load() == n; {
		if time.Now().After(deadline) {
			t.Fatal("no check of the peer's process a minute after an op")
		}
		p.checkLive()
		time.Sleep(time.Millisecond)
	}
}

// TestCheckLiveAllocs: checkLive allocates nothing, also when it re-arms
// the monitor.
func TestCheckLiveAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p := monitoredPeer(time.Hour, func() bool { return true })
	defer func() {
		p.mon.gone.Store(true)
		p.mon.timer.Load().Stop()
	}()
	if n := testing.AllocsPerRun(1000, func() {
		p.mon.armed.Store(false)
		if p.checkLive() != nil {
			t.Fatal("dead")
		}
	}); n != 0 {
		t.Fatalf("checkLive made %v allocations", n)
	}
}

// TestMonitorShareRace: peers of one process acquire, use and release its
// shared monitor from many goroutines while its checks run (the race
// detector watches); every acquire while another holds it returns the
// same monitor, and the last release stops it and forgets it.
func TestMonitorShareRace(t *testing.T) {
	self, err := selfIdent()
	if err != nil {
		t.Fatal(err)
	}
	const every = 50 * time.Microsecond // checks of a live process (this one) run throughout
	hold := acquireMonitor(self, every)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				m := acquireMonitor(self, every)
				if m != hold {
					t.Error("a second monitor of one process while the first is held")
				}
				if err := m.use(); err != nil {
					t.Errorf("use of a live process's monitor: %v", err)
				}
				m.release()
			}
		})
	}
	wg.Wait()
	if hold.gone.Load() {
		t.Fatal("the monitor stopped while a peer still held it")
	}
	hold.release()
	if !hold.gone.Load() {
		t.Fatal("the last release did not stop the monitor")
	}
	monitors.mu.Lock()
	left := len(monitors.m)
	monitors.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d monitors left after the last release", left)
	}
	if m := acquireMonitor(self, every); m == hold {
		t.Fatal("an acquire after the last release returned the stopped monitor")
	} else {
		m.release()
	}
}
