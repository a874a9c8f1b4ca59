package main

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// A thread's /proc/PID/task/TID/status, as Linux 6.x writes it (cut).
const sampleTaskStatus = `Name:	kvserver
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Pid:	4250
VmRSS:	   10240 kB
Threads:	9
SigQ:	0/7823
Cpus_allowed_list:	0-1
voluntary_ctxt_switches:	1234
nonvoluntary_ctxt_switches:	56
`

// A /proc/PID/stat whose command name holds spaces and a ')': utime 300,
// stime 45 (fields 14 and 15).
const sampleStat = `4242 (kv server) (x)) S 1 4242 4242 0 -1 4194560 5000 0 0 0 300 45 0 0 20 0 9 0 1000 800000000 2500 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0
`

func TestParseCtxtSwitches(t *testing.T) {
	vol, nonvol, err := parseCtxtSwitches([]byte(sampleTaskStatus))
	if err != nil || vol != 1234 || nonvol != 56 {
		t.Errorf("parseCtxtSwitches(sample) = %d, %d, %v; want 1234, 56", vol, nonvol, err)
	}
	// Either line missing, or a bad number: an error, not a wrong sum.
	for name, text := range map[string]string{
		"no nonvoluntary": strings.Replace(sampleTaskStatus, "nonvoluntary_ctxt_switches:\t56\n", "", 1),
		"no voluntary":    strings.Replace(sampleTaskStatus, "\nvoluntary_ctxt_switches:\t1234\n", "\n", 1),
		"bad number":      strings.Replace(sampleTaskStatus, "\t56", "\tx56", 1),
		"empty":           "",
	} {
		if vol, nonvol, err := parseCtxtSwitches([]byte(text)); err == nil {
			t.Errorf("%s: parseCtxtSwitches = %d, %d, nil; want an error", name, vol, nonvol)
		}
	}
}

func TestParseStatTicks(t *testing.T) {
	n, err := parseStatTicks([]byte(sampleStat))
	if err != nil || n != 345 {
		t.Errorf("parseStatTicks(sample) = %d, %v; want 345 (utime 300 + stime 45)", n, err)
	}
	for name, text := range map[string]string{
		"no parenthesis": "4242 kvserver S 1",
		"short":          "4242 (kvserver) S 1 4242 4242 0 -1 4194560 5000 0 0 0",
		"bad utime":      strings.Replace(sampleStat, " 300 45 ", " x 45 ", 1),
	} {
		if n, err := parseStatTicks([]byte(text)); err == nil {
			t.Errorf("%s: parseStatTicks = %d, nil; want an error", name, n)
		}
	}
}

// TestReadProcCounters reads this process's counters: they parse, and a
// thread of it has been switched out at least once.
func TestReadProcCounters(t *testing.T) {
	c, err := readProcCounters(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if c.wakeups == 0 {
		t.Errorf("readProcCounters(self) = %+v: no context switch in any thread", c)
	}
}

func TestCostPerOp(t *testing.T) {
	a := costSnap{mallocs: 1000, client: procCounters{wakeups: 10, preempts: 1, ticks: 5}, servers: procCounters{wakeups: 100, preempts: 7, ticks: 50}}
	b := costSnap{mallocs: 1000 + 25*400, client: procCounters{wakeups: 10 + 2*400, preempts: 1 + 200, ticks: 5 + 4},
		servers: procCounters{wakeups: 100 + 3*400, preempts: 7 + 400, ticks: 50 + 8}}
	c := costPerOp(a, b, 400)
	want := opCost{ok: true, ops: 400, allocs: 25, clientWakeups: 2, serverWakeups: 3, clientPreempts: 0.5, serverPreempts: 1,
		clientCPU: 4 * 1e4 / 400, serverCPU: 8 * 1e4 / 400} // a tick is 10 ms
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	if !c.ok || c.ops != want.ops || !near(c.allocs, want.allocs) || !near(c.clientWakeups, want.clientWakeups) ||
		!near(c.serverWakeups, want.serverWakeups) || !near(c.clientPreempts, want.clientPreempts) || !near(c.serverPreempts, want.serverPreempts) ||
		!near(c.clientCPU, want.clientCPU) || !near(c.serverCPU, want.serverCPU) {
		t.Errorf("costPerOp = %+v, want %+v", c, want)
	}
	// A server thread that ended drops its counts: no negative figure.
	b.servers.wakeups = 50
	if c := costPerOp(a, b, 400); c.serverWakeups != 0 {
		t.Errorf("costPerOp with fewer server switches after than before: %v wake-ups per op, want 0", c.serverWakeups)
	}
	if c := costPerOp(a, b, 0); c.ok {
		t.Errorf("costPerOp over no op: ok")
	}
	a.err = os.ErrNotExist
	if c := costPerOp(a, b, 400); c.ok {
		t.Errorf("costPerOp with a failed reading: ok")
	}
}

// TestCostPerOpWaits: the client's doorbell waits and the pollers'
// counters per op; without both pollers' readings no poller figures.
func TestCostPerOpWaits(t *testing.T) {
	a := costSnap{waits: rdma.WaitStats{Spins: 10, SpinHits: 5, Parks: 3}, pollers: &pollerCounts{spins: 100, spinHits: 10, parks: 50}}
	b := costSnap{waits: rdma.WaitStats{Spins: 10 + 200, SpinHits: 5 + 100, Parks: 3 + 100}, pollers: &pollerCounts{spins: 100 + 300, spinHits: 10 + 20, parks: 50 + 400}}
	c := costPerOp(a, b, 200)
	if c.clientSpins != 1 || c.clientSpinHits != 0.5 || c.clientParks != 0.5 || !c.pollersOK ||
		c.serverSpins != 1.5 || c.serverSpinHits != 0.1 || c.serverParks != 2 {
		t.Errorf("costPerOp = %+v, want client 1 spin, 0.5 hits, 0.5 parks; pollers 1.5, 0.1, 2", c)
	}
	b.pollers = nil
	if c := costPerOp(a, b, 200); c.pollersOK {
		t.Errorf("costPerOp without the pollers' second reading: pollersOK")
	}
}
