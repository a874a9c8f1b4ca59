package server

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time (broadcast.Config.StatCPUClock).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// threadRunDelay is the calling thread's time spent runnable on the OS's
// run queue, not running (the second field of /proc/thread-self/schedstat;
// 0 where there is none): broadcast.Config.StatRunDelay, read on the
// thread cpuClock locked.
func threadRunDelay() time.Duration {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0
	}
	return runDelayOf(b)
}

// runDelayOf is the run delay of a schedstat line ("run wait slices"), 0
// for one it cannot read.
func runDelayOf(b []byte) time.Duration {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	n, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n)
}

// threadSched is the calling thread's scheduler counters: its time on a
// CPU (its CPU clock) and waiting on the OS's run queue (schedstat), and its page faults
// and context switches (getrusage RUSAGE_THREAD). Read around a Poll
// locked to its thread, their differences tell where a long Poll's wall
// time went (PollDetail's thread_*).
type threadSched struct {
	ok                            bool
	tid                           int
	cpu, runDelay                 time.Duration
	minflt, majflt, nvcsw, nivcsw int64
}

// readThreadSched reads the calling thread's threadSched (ok false where
// /proc or getrusage is not there).
func readThreadSched() threadSched {
	t := threadSched{tid: unix.Gettid()}
	fd, err := unix.Open("/proc/thread-self/schedstat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return t
	}
	var buf [96]byte
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil || n <= 0 {
		return t
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return t
	}
	f := bytes.Fields(buf[:n])
	if len(f) < 2 {
		return t
	}
	// schedstat's first field, the time on a CPU, is the kernel's sum as
	// of the thread's last accounting (up to a tick stale for the
	// thread running now); the CPU clock is current.
	wait, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return t
	}
	t.ok, t.cpu, t.runDelay = true, threadCPU(), time.Duration(wait)
	t.minflt, t.majflt, t.nvcsw, t.nivcsw = ru.Minflt, ru.Majflt, ru.Nvcsw, ru.Nivcsw
	return t
}
