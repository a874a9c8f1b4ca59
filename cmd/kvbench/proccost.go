package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/rdmakv/rdmakv/internal/kvproc"
	"github.com/rdmakv/rdmakv/rdma"
)

// The cost of an op, from the processes' own counters (issue 17's targets
// are per put: allocations in the client, OS wake-ups, CPU time):
//
//   - allocations: runtime.MemStats.Mallocs of this process (the client's:
//     the benchmark's goroutines and the client package's);
//   - wake-ups: voluntary_ctxt_switches + nonvoluntary_ctxt_switches summed
//     over every thread of a process (/proc/PID/task/*/status): each is a
//     thread taken off its CPU, a block (then a wake-up) or a preemption;
//     the nonvoluntary part (preemptions: a busy machine's share) is also
//     given alone;
//   - CPU: utime + stime of a process (/proc/PID/stat, all its threads), in
//     clock ticks of 1/userHZ s (10 ms: a short measurement's CPU per op is
//     coarse).
//
// A snapshot is taken right before and right after a measurement; the
// deltas are divided by every op the measurement completed (warm-up
// included), not only the timed ones.

// userHZ is the unit of /proc/PID/stat's times.
const userHZ = kvproc.UserHZ

// procCounters are one process's wake-up and CPU counters.
type procCounters struct {
	wakeups  uint64 // voluntary + nonvoluntary context switches, all threads
	preempts uint64 // the nonvoluntary ones
	ticks    uint64 // utime + stime
}

// parseCtxtSwitches is voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches of a /proc/PID/task/TID/status text.
func parseCtxtSwitches(status []byte) (vol, nonvol uint64, err error) {
	found := 0
	for _, line := range bytes.Split(status, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch string(name) {
		case "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches":
			n, err := strconv.ParseUint(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("%s: %w", name, err)
			}
			if name[0] == 'v' {
				vol = n
			} else {
				nonvol = n
			}
			found++
		}
	}
	if found != 2 {
		return 0, 0, errors.New("no voluntary_ctxt_switches and nonvoluntary_ctxt_switches lines")
	}
	return vol, nonvol, nil
}

// parseStatTicks is utime + stime of a /proc/PID/stat text (fields 14 and
// 15; field 2, the command name, is in parentheses and may hold spaces
// and parentheses).
func parseStatTicks(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("utime/stime: %w", err)
	}
	return u + s, nil
}

// readProcCounters reads pid's counters. A thread that ends between the
// listing and its read is skipped (its switches then drop out of the sum:
// Go's threads rarely end).
func readProcCounters(pid int) (procCounters, error) {
	var c procCounters
	base := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(base + "/stat")
	if err != nil {
		return c, err
	}
	if c.ticks, err = parseStatTicks(b); err != nil {
		return c, fmt.Errorf("%s/stat: %w", base, err)
	}
	tasks, err := os.ReadDir(base + "/task")
	if err != nil {
		return c, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(base + "/task/" + t.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		vol, nonvol, err := parseCtxtSwitches(b)
		if err != nil {
			return c, fmt.Errorf("%s/task/%s/status: %w", base, t.Name(), err)
		}
		c.wakeups += vol + nonvol
		c.preempts += nonvol
	}
	return c, nil
}

// costSnap is a reading of the client's (this process's) and the
// servers' counters.
type costSnap struct {
	mallocs uint64
	client  procCounters
	servers procCounters // summed over the server processes
	waits   rdma.WaitStats
	pollers *pollerCounts // nil: not read
	err     error
}

// pollerCounts are a kvserver's pollers' counters summed (its /status).
type pollerCounts struct{ spins, spinHits, parks, probes, probeHits uint64 }

// readPollerCounts reads the pollers' counters of the kvserver whose
// control port is addr (nil: no addr, or the read failed).
func readPollerCounts(addr string) *pollerCounts {
	if addr == "" {
		return nil
	}
	st, err := getStatus(addr)
	if err != nil || len(st.Pollers) == 0 {
		return nil
	}
	var c pollerCounts
	for _, p := range st.Pollers {
		c.spins += p.Spins
		c.spinHits += p.SpinHits
		c.parks += p.Parks
		c.probes += p.Probes
		c.probeHits += p.ProbeHits
	}
	return &c
}

// takeCost reads the counters before a measurement: the allocation count
// last, so that the reading's own allocations do not count.
func takeCost(servers []int) costSnap {
	s := readCostProcs(servers)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.mallocs = ms.Mallocs
	return s
}

// takeCostAfter reads them after it: the allocation count first.
func takeCostAfter(servers []int) costSnap {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := readCostProcs(servers)
	s.mallocs = ms.Mallocs
	return s
}

func readCostProcs(servers []int) costSnap {
	var s costSnap
	s.waits = rdma.DoorbellWaits()
	s.client, s.err = readProcCounters(os.Getpid())
	for _, p := range servers {
		c, err := readProcCounters(p)
		s.err = errors.Join(s.err, err)
		s.servers.wakeups += c.wakeups
		s.servers.preempts += c.preempts
		s.servers.ticks += c.ticks
	}
	return s
}

// opCost is a measurement's cost per op.
type opCost struct {
	ok                             bool
	ops                            uint64  // the ops it was divided by
	allocs                         float64 // client process
	clientWakeups, serverWakeups   float64
	clientPreempts, serverPreempts float64 // the nonvoluntary part of the wake-ups
	clientCPU, serverCPU           float64 // µs
	// writesPerMsg: the client's single-key writes per message sent
	// (client.Stats; 0 when it sent none), how much it combined
	writesPerMsg float64
	// the client's doorbell waits (rdma.WaitStats) and, pollersOK, the
	// replicas' pollers' spin phases, spin hits and parks
	clientSpins, clientSpinHits, clientParks float64
	clientWakes, clientWakesNone             float64 // its rings' wake calls, and those that woke no thread
	pollersOK                                bool
	serverSpins, serverSpinHits, serverParks float64
	serverProbes, serverProbeHits            float64
}

// costPerOp is b - a over ops (ok false: a reading failed or no op).
func costPerOp(a, b costSnap, ops uint64) opCost {
	if a.err != nil || b.err != nil || ops == 0 {
		return opCost{}
	}
	n := float64(ops)
	delta := func(x, y uint64) float64 {
		if y < x { // a thread ended: its counts left the sum
			return 0
		}
		return float64(y - x)
	}
	const usPerTick = 1e6 / userHZ
	c := opCost{ok: true, ops: ops,
		clientSpins:     delta(a.waits.Spins, b.waits.Spins) / n,
		clientSpinHits:  delta(a.waits.SpinHits, b.waits.SpinHits) / n,
		clientParks:     delta(a.waits.Parks, b.waits.Parks) / n,
		clientWakes:     delta(a.waits.Wakes, b.waits.Wakes) / n,
		clientWakesNone: delta(a.waits.WakesNone, b.waits.WakesNone) / n,
		allocs:          delta(a.mallocs, b.mallocs) / n,
		clientWakeups:   delta(a.client.wakeups, b.client.wakeups) / n,
		serverWakeups:   delta(a.servers.wakeups, b.servers.wakeups) / n,
		clientPreempts:  delta(a.client.preempts, b.client.preempts) / n,
		serverPreempts:  delta(a.servers.preempts, b.servers.preempts) / n,
		clientCPU:       delta(a.client.ticks, b.client.ticks) * usPerTick / n,
		serverCPU:       delta(a.servers.ticks, b.servers.ticks) * usPerTick / n,
	}
	if a.pollers != nil && b.pollers != nil {
		c.pollersOK = true
		c.serverSpins = delta(a.pollers.spins, b.pollers.spins) / n
		c.serverSpinHits = delta(a.pollers.spinHits, b.pollers.spinHits) / n
		c.serverParks = delta(a.pollers.parks, b.pollers.parks) / n
		c.serverProbes = delta(a.pollers.probes, b.pollers.probes) / n
		c.serverProbeHits = delta(a.pollers.probeHits, b.pollers.probeHits) / n
	}
	return c
}
