package shm

import (
	"errors"
	"io/fs"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The exit watch: a monitor learns that its process ended from a pidfd
// (pidfd_open(2), Linux 5.3+; non-blocking since 5.10), which turns
// readable once the process has exited, zombie or reaped. The runtime's
// poller waits on it, so a live process costs no timer, no wake-up and
// no /proc read, and an exit is seen as soon as the runtime's poller
// runs. Where a pidfd cannot be opened (an older kernel, a seccomp
// filter, the planted noPidfd) the monitor falls back on the timer and
// procWatch.

// openExitWatch opens the exit watch of p. ok false: no pidfd here (use
// the timer); dead true: p is gone already (f is nil).
func openExitWatch(p procIdent) (f *os.File, dead, ok bool) {
	if p == 0 || exitKnobs.noPidfd.Load() {
		return nil, false, false
	}
	fd, err := unix.PidfdOpen(p.pid(), unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH {
		return nil, true, true
	}
	if err != nil {
		return nil, false, false
	}
	// The pidfd names whatever process had the pid at the open. p
	// started before it; if p still runs now, it ran at the open too, so
	// a match of its start time here proves the pidfd is p's.
	state, start, err := procStat(p.pid())
	switch {
	case err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)):
		unix.Close(fd)
		return nil, true, true
	case err != nil:
		unix.Close(fd) // cannot tell whose pidfd it is: the timer decides
		return nil, false, false
	case state == 'Z' || state == 'X' || start != uint64(p)>>pidBits:
		unix.Close(fd)
		return nil, true, true
	}
	// Non-blocking, so os.NewFile registers it with the runtime's poller.
	return os.NewFile(uintptr(fd), "pidfd"), false, true
}

// waitExit blocks until the process exits (dead) or the monitor stops
// (its file closed). A pidfd the runtime's poller refuses, or a poll that
// fails, hands the watch back to the timer.
func (m *procMonitor) waitExit(f *os.File) {
	exited := false
	rc, err := f.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool {
			if exitKnobs.ignoreExit.Load() {
				return false
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr := unix.Poll(pfd, 0)
			switch {
			case perr == unix.EINTR:
				return false
			case perr != nil:
				return true // not exited: the timer takes over below
			}
			exited = n > 0 && pfd[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
			return exited
		})
	}
	switch {
	case m.gone.Load():
		return
	case exited:
		m.dead.Store(true)
	default:
		_ = err // the runtime's poller refused the pidfd, or poll failed
		m.startTimer()
	}
}

// exitKnobs plant bugs (tests; atomic: watches of earlier tests may
// still be running).
var exitKnobs struct {
	noPidfd    atomic.Bool // never open a pidfd: the timer and /proc only
	ignoreExit atomic.Bool // the exit watch never sees the pidfd readable
}
