package kvproc

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// Freeze stops process pid (SIGSTOP) and returns once /proc shows it
// stopped (state T), so that a benchmark's baseline runs with none of the
// process's CPU taken from it; Thaw resumes it. The process keeps its
// memory, sockets and shm: a frozen cluster serves again after Thaw (its
// replicas may first hold an election, their heartbeats having paused).
// A stopped process still dies of SIGKILL.
func Freeze(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("kvproc: stop process %d: %w", pid, err)
	}
	return waitState(pid, func(s byte) bool { return s == 'T' }, "stopped")
}

// Thaw resumes a process Freeze stopped (SIGCONT) and returns once /proc
// no longer shows it stopped.
func Thaw(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("kvproc: continue process %d: %w", pid, err)
	}
	return waitState(pid, func(s byte) bool { return s != 'T' }, "running")
}

// waitState waits up to 10 s for pid's state letter to satisfy ok.
func waitState(pid int, ok func(byte) bool, want string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, s, err := CPUTime(pid)
		if err != nil {
			return err
		}
		if ok(s) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvproc: process %d not %s after 10 s (state %c)", pid, want, s)
		}
		time.Sleep(time.Millisecond)
	}
}

// WaitServes waits up to timeout until read(ctx, i) succeeds for each i
// of 16 (the caller's keys, spread over the groups: a linearizable read
// that succeeds or finds no key), each try bounded by 2 s, so that a
// thawed cluster serves every group again before the next measurement
// (a replica whose heartbeats paused may first stand for election).
func WaitServes(ctx context.Context, timeout time.Duration, read func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i := range 16 {
		for {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			err := read(rctx, i)
			rcancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("the cluster does not serve after its thaw: %w", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// UserHZ is the unit of /proc/<pid>/stat's times (USER_HZ: 100 on every
// Linux port Go supports).
const UserHZ = 100

// During is what processes did over a span (a baseline's measurement):
// their state letters at its start and at its end (T: stopped), and the
// CPU they used meanwhile. Watch starts it, End completes it.
type During struct {
	State      string
	CPUSeconds float64
	pids       []int
	ticks0     uint64
}

// Watch starts a During of pids (a process /proc cannot read shows '?').
func Watch(pids ...int) *During {
	d := &During{pids: pids}
	d.ticks0 = d.sample()
	return d
}

// End completes d at the end of the span.
func (d *During) End() {
	t := d.sample()
	d.CPUSeconds = float64(t-min(t, d.ticks0)) / UserHZ
}

func (d *During) sample() (ticks uint64) {
	for _, pid := range d.pids {
		t, s, err := CPUTime(pid)
		if err != nil {
			s = '?'
		}
		ticks += t
		d.State += string(s)
	}
	return ticks
}

// Stopped reports whether every process was stopped at both ends.
func (d *During) Stopped() bool { return Stopped(d.State) }

// Stopped reports whether a During's State says stopped throughout: some
// letters, all T.
func Stopped(state string) bool { return state != "" && strings.Trim(state, "T") == "" }
