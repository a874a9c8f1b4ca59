package main

import (
	"os"
	"strconv"
	"strings"
)

// Background load. Spin-mode figures on a small machine are only
// meaningful while both ends have a CPU each: a third runnable process
// makes two spinners share one CPU, and a ping-pong then takes scheduler
// time slices (milliseconds) instead of cache-line transfers. So every
// measurement records how many CPUs other processes used meanwhile, from
// /proc/stat less this process and the peer's /proc/<pid>/stat, and a
// measurement disturbed by more than --max-other CPUs is repeated.

// cpuSnap is a reading of the CPU counters, in clock ticks.
type cpuSnap struct {
	busy, total uint64 // all CPUs, from /proc/stat
	ours        uint64 // user+system of this process and the peer
	ok          bool
}

// takeCPU reads the counters; peerPid 0 means the peer is this process.
func takeCPU(peerPid int) cpuSnap {
	var s cpuSnap
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return s
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return s
		}
		if i >= 8 { // guest time is already in user
			break
		}
		s.total += n
		if i != 3 && i != 4 { // idle, iowait
			s.busy += n
		}
	}
	self, ok := procTicks(os.Getpid())
	if !ok {
		return s
	}
	s.ours = self
	if peerPid != 0 {
		p, ok := procTicks(peerPid)
		if !ok {
			return s
		}
		s.ours += p
	}
	s.ok = true
	return s
}

// procTicks is a process's user+system time in clock ticks.
func procTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 13 { // utime and stime are fields 14 and 15 of the line
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	return u + s, err1 == nil && err2 == nil
}

// otherCPUs is how many CPUs processes other than ours kept busy between
// a and b, on average; -1 if unknown.
func otherCPUs(a, b cpuSnap, ncpu int) float64 {
	if !a.ok || !b.ok || b.total <= a.total {
		return -1
	}
	busy := float64(b.busy-a.busy) - float64(b.ours-a.ours)
	return max(busy, 0) / float64(b.total-a.total) * float64(ncpu)
}
