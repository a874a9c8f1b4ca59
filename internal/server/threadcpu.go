package server

import (
	"bytes"
	"errors"
	"os"
	"runtime"
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

// persistNice is the nice value of the threads that build disk and
// network snapshots' images (runNiced): below the pollers' 0, so that on
// cores the pollers fill the OS runs them first, and above 19 (and
// SCHED_IDLE), so that the image still gets about a tenth of a core
// against a busy one (CFS's weights: 110 against 1024) and the snapshot
// finishes under full load: one that did not would let the log grow.
const persistNice = 10

// persistKnobs are the planted bugs of the niced Persist thread's tests
// (TestRunNiced*).
var persistKnobs struct {
	// noNice: the thread is not niced (TestRunNicedThread: nice 0).
	noNice bool
	// noLock: the goroutine is not locked to its thread, so the niced
	// thread goes back to Go's pool when Persist ends and runs pollers
	// later, at the lower priority (TestRunNicedThreadExits).
	noLock bool
}

// runNiced runs fn on a goroutine locked to an OS thread of its own at
// nice persistNice (broadcast.Config.RunPersist): a snapshot's Persist
// walks the whole table and hashes the image, 10-40 ms of CPU at 1 M
// records, beside the pollers on as few cores (issue 19). Raising a
// thread's nice needs no privilege; lowering it back would, so the
// goroutine never unlocks: the thread ends with it (runtime.LockOSThread)
// and no other goroutine ever runs on it niced. On Linux setpriority's
// PRIO_PROCESS takes a thread id and changes only that thread. Where it
// fails, fn runs at the thread's priority.
func runNiced(fn func()) {
	go func() {
		if !persistKnobs.noLock {
			runtime.LockOSThread() // never unlocked: see above
		}
		if !persistKnobs.noNice {
			_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), persistNice)
		}
		fn()
	}()
}

// threadNice is the nice value of thread tid of this process, read back
// from /proc (field 19 of its stat line).
func threadNice(tid int) (int, error) {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return 0, err
	}
	return niceOf(b)
}

// niceOf is the nice value of a /proc stat line: the 17th field after
// the command's closing parenthesis (which may itself hold spaces).
func niceOf(b []byte) (int, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("server: no command in a stat line")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 17 {
		return 0, errors.New("server: a short stat line")
	}
	return strconv.Atoi(string(f[16]))
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
