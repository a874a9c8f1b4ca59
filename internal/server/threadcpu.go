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
