package shm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// procIdent names one process for its lifetime: its start time (clock ticks
// since boot, field 22 of /proc/<pid>/stat) << 22 | its pid. Linux pids are
// below 2^22, so a reused pid has a different start time and a different
// identity. 0 is no process.
type procIdent uint64

const pidBits = 22

func (p procIdent) pid() int { return int(p & (1<<pidBits - 1)) }

func (p procIdent) String() string {
	return fmt.Sprintf("pid %d (start %d)", p.pid(), uint64(p)>>pidBits)
}

// procStat returns the state letter and start time of pid from
// /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses, so
	// the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("shm: malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("shm: malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("shm: malformed /proc/%d/stat", pid)
	}
	return f[0][0], start, nil
}

// selfIdent is the identity of the calling process.
func selfIdent() (procIdent, error) {
	pid := os.Getpid()
	_, start, err := procStat(pid)
	if err != nil {
		return 0, fmt.Errorf("shm: read own process start time: %w", err)
	}
	if pid >= 1<<pidBits {
		return 0, fmt.Errorf("shm: pid %d does not fit in %d bits", pid, pidBits)
	}
	return procIdent(start<<pidBits | uint64(pid)), nil
}

// alive reports whether the process p may still run. It answers false only
// on evidence of death: no such pid, no /proc entry, a zombie, or a
// different start time (a reused pid). Any other failure to look (out of
// file descriptors, a transient read error) counts as alive, because a
// wrong "dead" would let Revoke return while that process still has a
// write in flight, and would cut off a live peer.
func (p procIdent) alive() bool {
	if p == 0 {
		return false
	}
	pid := p.pid()
	if err := unix.Kill(pid, 0); err == unix.ESRCH {
		return false
	}
	state, start, err := procStat(pid)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ESRCH)
	}
	return state != 'Z' && state != 'X' && start == uint64(p)>>pidBits
}
