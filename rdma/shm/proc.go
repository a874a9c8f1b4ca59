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
	state, start, ok := parseStat(b)
	if !ok {
		return 0, 0, fmt.Errorf("shm: malformed /proc/%d/stat", pid)
	}
	return state, start, nil
}

// parseStat returns the state letter (field 3) and the start time (field
// 22) of a /proc/<pid>/stat line, allocating nothing. comm (field 2) may
// hold spaces and parentheses, so the fields are counted from after the
// last ')'.
func parseStat(b []byte) (state byte, start uint64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	field := 2 // the field b[i] ends
	for j := i + 1; j < len(b); {
		for j < len(b) && b[j] == ' ' {
			j++
		}
		k := j
		for k < len(b) && b[k] != ' ' && b[k] != '\n' {
			k++
		}
		if k == j {
			break
		}
		field++
		switch field {
		case 3:
			if k-j != 1 || !isStateLetter(b[j]) {
				return 0, 0, false // the kernel writes one letter (R, S, D, Z, T, ...)
			}
			state = b[j]
		case 22:
			var v uint64
			for _, c := range b[j:k] {
				d := uint64(c - '0')
				if c < '0' || c > '9' || v > (1<<64-1-d)/10 {
					return 0, 0, false // not a number, or over 64 bits
				}
				v = v*10 + d
			}
			return state, v, true
		}
		j = k
	}
	return 0, 0, false
}

func isStateLetter(c byte) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' }

// procWatch checks that one process still runs without allocating: it
// holds /proc/<pid>/stat open from the start and rereads it. The open file
// stays bound to that process, not to its pid number: once the process is
// reaped a read fails with ESRCH, even if the pid is reused meanwhile. The
// start time is compared as well (the file may have been opened after a
// reuse). Not safe for concurrent use.
type procWatch struct {
	p   procIdent
	fd  int // -1 when the open failed for a reason other than death
	buf [512]byte
}

// newProcWatch opens p's stat file; a failure to open it other than
// death leaves the watch to fall back on procIdent.alive.
func newProcWatch(p procIdent) *procWatch {
	w := &procWatch{p: p, fd: -1}
	if p != 0 {
		if fd, err := unix.Open("/proc/"+strconv.Itoa(p.pid())+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			w.fd = fd
		}
	}
	return w
}

// alive answers as procIdent.alive does (false only on evidence of
// death), with one pread and no allocation when the file is open.
func (w *procWatch) alive() bool {
	if w.fd < 0 {
		return w.p.alive()
	}
	n, err := unix.Pread(w.fd, w.buf[:], 0)
	if err == unix.ESRCH {
		return false
	}
	if err != nil {
		return true // a failure to look is not death (see alive)
	}
	state, start, ok := parseStat(w.buf[:n])
	if !ok {
		return true
	}
	return state != 'Z' && state != 'X' && start == uint64(w.p)>>pidBits
}

// close releases the stat file.
func (w *procWatch) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
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
