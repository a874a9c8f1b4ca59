package shm

import (
	"errors"
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
