package broadcast

import (
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
	"github.com/rdmakv/rdmakv/wal"
)

// A full disk (durable.go, "A full disk"): windows in which one member's
// log directory finds no space. The replica stays up (a stop fails the
// run: "disk:"), acknowledges nothing its disk does not hold ("durability
// promise:", checked at every row change), nothing acknowledged is lost
// across crashes ("acknowledged lost:", total order), proposals refused
// with ErrDiskFull are never delivered, and once space returns every
// member catches up (the liveness check after the faults).

func diskFullCases(window time.Duration) []struct {
	name  string
	o     simOpts
	seeds uint64
} {
	partition := sim.Faults{Until: window, Partition: 1}
	return []struct {
		name  string
		o     simOpts
		seeds uint64
	}{
		// Windows on random members, some overlapping (a majority full:
		// the leader refuses), with proposals from every member.
		{"n3-sync", simOpts{n: 3, until: 4 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 6, appends: true}, 30},
		// The same with random crashes (restarted from the disk image
		// the crash left) and partitions.
		{"n3-sync-crashes", simOpts{n: 3, until: 4 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 6, crashes: true, restarts: true, faults: partition}, 30},
		// And a whole-group crash: what was acknowledged is on a
		// majority's disks although one of them was full for a while.
		{"n5-sync-whole-group", simOpts{n: 5, until: 4 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 8, wholeGroup: 1, staggered: true}, 20},
		// Async: one member's disk (node 2) fills again and again; the
		// loss bound of a whole-group crash still holds (a majority's
		// disks can write).
		{"n3-async-whole-group", simOpts{n: 3, until: 4 * window, durability: Async, maxLog: 24, diskFull: 4, fullNode: 2, wholeGroup: 1}, 20},
	}
}

func TestSimDiskFull(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	for _, tc := range diskFullCases(window) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seeds := tc.seeds
			if raceEnabled {
				seeds = max(seeds/10, 2)
			}
			var total Counters
			for seed := uint64(1); seed <= seeds; seed++ {
				if err := runSim(sim.Seed{Seed: seed}, tc.o, &total); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
			if total.DiskFull == 0 {
				t.Fatalf("no seed found a disk full (%d seeds)", seeds)
			}
			t.Logf("%d seeds: %d disk-full episodes, %d proposals and appends refused, %d leaders stepped down, %d elections", seeds, total.DiskFull, total.DiskFullRefused, total.DiskFullStepDowns, total.ElectionsStarted)
		})
	}
}

// TestSimDiskFullLeaderStepsDown: a leader whose disk stays full while
// the others can log hands the group over (Counters.DiskFullStepDowns)
// and the group goes on: proposals keep being delivered during the
// window. With the fullNoStepDown knob the leader keeps its epoch and
// refuses; the step-down count is then 0.
func TestSimDiskFullLeaderStepsDown(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	run := func(knobs testingKnobs) Counters {
		var total Counters
		for seed := uint64(1); seed <= 10; seed++ {
			// Long windows (up to 24 election timeouts: the leader
			// waits fullStepDownAfter of them) on every member in
			// turn: some fall on the leader.
			o := simOpts{knobs: knobs, n: 3, until: 12 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 4, fullLen: 96 * time.Millisecond}
			if err := runSim(sim.Seed{Seed: seed}, o, &total); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		return total
	}
	good := run(testingKnobs{})
	if good.DiskFullStepDowns == 0 {
		t.Fatalf("no leader stepped down with its disk full: %+v", good)
	}
	bad := run(testingKnobs{fullNoStepDown: true})
	if bad.DiskFullStepDowns != 0 {
		t.Fatalf("the knob kept no leader: %d step-downs", bad.DiskFullStepDowns)
	}
	t.Logf("step-downs %d (refused %d); without: refused %d", good.DiskFullStepDowns, good.DiskFullRefused, bad.DiskFullRefused)
}

// TestSimDiskFullMutant: the ackRefused knob makes a member whose disk is
// full acknowledge what it accepted (the entries of the batch the writer
// cut back and refused): the "durability promise:" check must catch it,
// and not another.
func TestSimDiskFullMutant(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	o := simOpts{knobs: testingKnobs{ackRefused: true}, n: 3, until: 4 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 6}
	catchMutant(t, "ack-refused", o, 100, "durability promise:")
}

// allFullRun runs one seed of a group whose every member's log finds the
// disk full for 100 election timeouts. From 16 election timeouts into the
// window (twice the probe interval: every member found out, by a write or
// by a probe) until its end, the group must keep the leader it had ("all
// full: leader": same member, same epoch, still leading and refusing) and
// start no election ("all full: elections"), although the leader stops
// for 3 election timeouts, twice, and a follower once (a stalled
// process: its peers still write its memory; the second time the
// leader's links are also cut until half an election timeout after it
// resumed). The run's own checks follow: once space
// returns, every member catches up and every proposal resolves. idle: no
// proposal after the first, and the window starts at 40 ms, so that
// nothing but a probe writes in it.
func allFullRun(seed uint64, knobs testingKnobs, idle bool, total *Counters) error {
	const et = 4 * time.Millisecond // the sim's ElectionTimeout
	const window = 100 * et
	from := 16 * time.Millisecond // after the first election (its stable saves run off the poller, on the sim disk)
	if idle {
		// After the first proposal's lazy Commit record went out (it
		// waits FsyncInterval, 10 ms, for a batch): nothing writes then.
		from = 40 * time.Millisecond
	}
	o := simOpts{knobs: knobs, n: 3, until: from + window + 8*time.Millisecond, durability: Sync, promiseCheck: true, maxLog: 24, appends: true,
		fullAll: true, fullAt: from, fullLen: window}
	if idle {
		o.appends, o.proposeEvery = false, time.Hour
	}
	o.script = func(h *simRun) {
		var leader rdma.NodeID
		var epoch Epoch
		var elections uint64
		leading := func() (rdma.NodeID, Epoch) {
			for _, id := range h.s.Nodes() {
				if p := h.procs[id]; p != nil && h.s.Live(id) {
					if e, ok := p.r.Leading(); ok {
						return id, e
					}
				}
			}
			return 0, 0
		}
		h.s.At(from+16*et, func() {
			for _, id := range h.s.Nodes() {
				if st := h.procs[id].r.Status(); !st.DiskFull {
					h.c.fail("all full: node %d does not know its disk is full %v into the window (a write or a probe should have found it)", id, 16*et)
					return
				}
			}
			leader, epoch = leading()
			elections = h.electionsStarted()
			if leader == 0 {
				h.c.fail("all full: no leader %v into the window", 16*et)
			}
		})
		for k, at := range []time.Duration{20 * et, 45 * et, 70 * et} {
			h.s.At(from+at, func() {
				l, _ := leading()
				if l == 0 {
					return
				}
				if k == 1 {
					l = l%3 + 1 // a follower: the leader hears a minority meanwhile
				}
				h.procs[l].pausedUntil = h.s.Now() + 3*et
				if k == 2 {
					// Its links break too, and come back a little after
					// it resumes (a stopped process: the fabric's
					// dead-peer detection closed its Conns).
					if err := h.s.Isolate(l); err != nil {
						h.c.fail("isolate %d: %v", l, err)
					}
					h.s.At(h.s.Now()+3*et+et/2, h.s.HealAll)
				}
			})
		}
		h.s.At(from+window-time.Microsecond, func() {
			if leader == 0 {
				return
			}
			if n := h.electionsStarted() - elections; n != 0 {
				h.c.fail("all full: elections: %d started while every disk was full", n)
				return
			}
			p := h.procs[leader]
			if e, ok := p.r.Leading(); !ok || e != epoch || !p.r.RefusingFull() {
				h.c.fail("all full: leader: node %d led %v; at the end of the window it leads %v (%v), refusing %v", leader, epoch, e, ok, p.r.RefusingFull())
			}
		})
	}
	return runSim(sim.Seed{Seed: seed}, o, total)
}

// TestSimDiskFullAllMembers: a group whose every disk is full keeps its
// leader through the leader's own stalls and starts no election; with the
// fullElects knob (full followers elect when the leader times out, and
// the leader gives them no grace after its stall) the same seeds must
// fail "all full:" (the group elects and has no leader until space
// returns).
func TestSimDiskFullAllMembers(t *testing.T) {
	simNoRace(t)
	seeds := uint64(10)
	if raceEnabled {
		seeds = 3
	}
	var total Counters
	for seed := uint64(1); seed <= seeds; seed++ {
		if err := allFullRun(seed, testingKnobs{}, false, &total); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	// (Members find their disks full by their writes here: probes are
	// TestSimDiskFullProbe's. An idle member with space writes none.)
	if total.DiskFull == 0 {
		t.Fatalf("no disk full: %+v", total)
	}
	t.Logf("%d seeds: %d disk-full episodes, %d probes (%d free-space checks), %d elections deferred, %d refused", seeds, total.DiskFull, total.DiskProbes, total.DiskSpaceChecks, total.ElectionsDeferred, total.DiskFullRefused)
	caught := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		err := allFullRun(seed, testingKnobs{fullElects: true}, false, new(Counters))
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "all full: elections") && !strings.Contains(err.Error(), "all full: leader") {
			t.Fatalf("seed %d: the fullElects knob failed another check than \"all full:\": %v", seed, err)
		}
		if caught++; caught == 1 {
			t.Logf("seed %d caught fullElects: %v", seed, firstLine(err))
		}
	}
	if caught != int(seeds) {
		t.Fatalf("the fullElects knob failed %d of %d seeds, want all", caught, seeds)
	}
}

// TestSimDiskFullProbe: a group that writes nothing (one proposal, at the
// start) finds its disks full through the probe (allFullRun, idle: the
// free-space query answers 0, and the probe's write finds no space) and
// keeps its leader; without the probe (knob noFullProbe), or with a probe
// only when the free-space answer is ignored (knob spaceAlwaysPlenty), no
// member finds out, as none has anything to write: the seeds must fail
// "all full: node N does not know its disk is full".
func TestSimDiskFullProbe(t *testing.T) {
	simNoRace(t)
	seeds := uint64(10)
	if raceEnabled {
		seeds = 3
	}
	var total Counters
	for seed := uint64(1); seed <= seeds; seed++ {
		if err := allFullRun(seed, testingKnobs{}, true, &total); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if total.DiskProbes == 0 || total.DiskFull < 3*seeds {
		t.Fatalf("idle: %d probes, %d disk-full episodes in %d seeds", total.DiskProbes, total.DiskFull, seeds)
	}
	t.Logf("idle, %d seeds: %d probes, %d disk-full episodes", seeds, total.DiskProbes, total.DiskFull)
	if total.DiskSpaceChecks < total.DiskProbes {
		t.Fatalf("idle: %d probes but only %d free-space checks (a probe follows a low answer)", total.DiskProbes, total.DiskSpaceChecks)
	}
	for _, knob := range []struct {
		name  string
		knobs testingKnobs
	}{{"noFullProbe", testingKnobs{noFullProbe: true}}, {"spaceAlwaysPlenty", testingKnobs{spaceAlwaysPlenty: true}}} {
		caught := 0
		for seed := uint64(1); seed <= seeds; seed++ {
			err := allFullRun(seed, knob.knobs, true, new(Counters))
			if err == nil {
				continue
			}
			if !strings.Contains(err.Error(), "does not know its disk is full") {
				t.Fatalf("seed %d: the %s knob failed another check: %v", seed, knob.name, err)
			}
			if caught++; caught == 1 {
				t.Logf("seed %d caught %s: %v", seed, knob.name, firstLine(err))
			}
		}
		if caught != int(seeds) {
			t.Fatalf("the %s knob failed %d of %d seeds, want all", knob.name, caught, seeds)
		}
	}
}

// idleRun runs one seed of a Sync group of 3 that writes nothing after
// its first proposal (allFullRun's idle shape, no disk full), and checks
// what the members' logs do over 100 election timeouts from 40 ms (the
// first proposal's lazy Commit records are synced by then). With space to
// spare (low false) an idle round only asks the device for free space:
// no fsync, no probe ("idle fsyncs:"), but every member asks ("idle
// space checks:"). With low (each disk's capacity set, at the window's
// start, to leave half of wal.Config.LowSpaceBytes free) every member
// writes a probe each round ("idle low:": at least 10 each).
func idleRun(seed uint64, knobs testingKnobs, low bool, total *Counters) error {
	const et = 4 * time.Millisecond // the sim's ElectionTimeout
	const from, window = 40 * time.Millisecond, 100 * et
	o := simOpts{knobs: knobs, n: 3, until: from + window + 8*time.Millisecond, durability: Sync, promiseCheck: true, maxLog: 24, proposeEvery: time.Hour}
	o.script = func(h *simRun) {
		type mark struct{ fsyncs, probes, checks uint64 }
		at := map[rdma.NodeID]mark{}
		now := func(id rdma.NodeID) mark {
			p := h.procs[id]
			c := p.r.Status().Counters
			return mark{p.r.dur.w.Stats().Fsyncs, c.DiskProbes, c.DiskSpaceChecks}
		}
		h.s.At(from, func() {
			for _, id := range h.s.Nodes() {
				at[id] = now(id)
				if low {
					d := h.s.Disk(id)
					d.SetCapacity(d.Used() + h.procs[id].r.dur.w.(*wal.Writer).LowSpaceBytes()/2)
				}
			}
		})
		h.s.At(from+window, func() {
			for _, id := range h.s.Nodes() {
				m, n := at[id], now(id)
				fsyncs, probes, checks := n.fsyncs-m.fsyncs, n.probes-m.probes, n.checks-m.checks
				switch {
				case !low && (fsyncs != 0 || probes != 0):
					h.c.fail("idle fsyncs: node %d synced its log %d times (%d probes) in %v idle with space to spare", id, fsyncs, probes, window)
				case !low && checks < 10:
					h.c.fail("idle space checks: node %d asked for free space %d times in %v idle, want a round every %d election timeouts", id, checks, window, fullProbeEvery)
				case low && (probes < 10 || fsyncs < probes):
					h.c.fail("idle low: node %d wrote %d probes (%d fsyncs) in %v idle with its disk low on space, want one a round", id, probes, fsyncs, window)
				}
			}
		})
	}
	return runSim(sim.Seed{Seed: seed}, o, total)
}

// TestSimIdleNoProbeSync: an idle durable group with space to spare
// syncs nothing (idleRun: no fsync, no probe, a free-space query a
// round), and with its disks low on space probes every round. The
// probeAlways knob (a probe each round without asking, the cost before
// the free-space query) must fail "idle fsyncs:" on every seed.
func TestSimIdleNoProbeSync(t *testing.T) {
	simNoRace(t)
	seeds := uint64(5)
	if raceEnabled {
		seeds = 2
	}
	var plenty, low Counters
	for seed := uint64(1); seed <= seeds; seed++ {
		if err := idleRun(seed, testingKnobs{}, false, &plenty); err != nil {
			t.Fatalf("seed %d, space to spare: %v", seed, err)
		}
		if err := idleRun(seed, testingKnobs{}, true, &low); err != nil {
			t.Fatalf("seed %d, low on space: %v", seed, err)
		}
	}
	t.Logf("%d seeds: space to spare: %d probes, %d free-space checks; low: %d probes, %d checks", seeds, plenty.DiskProbes, plenty.DiskSpaceChecks, low.DiskProbes, low.DiskSpaceChecks)
	for seed := uint64(1); seed <= seeds; seed++ {
		err := idleRun(seed, testingKnobs{probeAlways: true}, false, new(Counters))
		if err == nil || !strings.Contains(err.Error(), "idle fsyncs:") {
			t.Fatalf("seed %d: the probeAlways knob: %v, want \"idle fsyncs:\"", seed, err)
		}
		if seed == 1 {
			t.Logf("seed 1 caught probeAlways: %v", firstLine(err))
		}
	}
}

// staggeredFullRun: the leader's disk fills and it gets a write (one
// proposal at the leader: its log finds no space, its followers log the
// entry); the followers' disks fill 6 election timeouts later while they
// are idle: only their idle rounds (a free-space query answering 0, then
// a probe) can find out. Their round started with the write they logged,
// so they know by about 8 election timeouts into the window, before the
// leader, full since the write, would hand over (fullStepDownAfter, 9):
// 16 election timeouts in, every member knows its disk is full and the
// group has a leader ("staggered full:"). A longer idle round with the
// leader's hand-over still at 9 lets the leader hand over to followers
// that do not know their disks are full yet, which then cannot lead
// (fullProbeEvery 32, fullStepDownAfter 9: "no leader 64ms into the
// window"): the idle round and fullStepDownAfter go together.
func staggeredFullRun(seed uint64, knobs testingKnobs) error {
	const et = 4 * time.Millisecond
	const from, window = 40 * time.Millisecond, 40 * et
	// Every disk full from 6 election timeouts in to the window's end
	// (fullAll); the leader's from the start (the script).
	o := simOpts{knobs: knobs, n: 3, until: from + window + 8*time.Millisecond, durability: Sync, promiseCheck: true, maxLog: 24, proposeEvery: time.Hour,
		fullAll: true, fullAt: from + 6*et, fullLen: window - 6*et}
	o.script = func(h *simRun) {
		leading := func() rdma.NodeID {
			for _, id := range h.s.Nodes() {
				if p := h.procs[id]; p != nil && h.s.Live(id) {
					if _, ok := p.r.Leading(); ok {
						return id
					}
				}
			}
			return 0
		}
		var leader rdma.NodeID
		h.s.At(from, func() {
			if leader = leading(); leader == 0 {
				h.c.fail("staggered full: no leader at the window's start")
				return
			}
			h.s.Disk(leader).SetFull("wal/", true)
			p := h.procs[leader]
			p.next = h.s.Now()
			p.env.WakeAt(h.s.Now())
		})
		h.s.At(from+16*et, func() {
			for _, id := range h.s.Nodes() {
				if !h.procs[id].r.Status().DiskFull {
					h.c.fail("staggered full: node %d does not know its disk is full %v into the window", id, 16*et)
					return
				}
			}
			if leading() == 0 {
				h.c.fail("staggered full: no leader %v into the window (the leader, node %d, handed over to members that could not lead)", 16*et, leader)
			}
		})
	}
	return runSim(sim.Seed{Seed: seed}, o, new(Counters))
}

// TestSimDiskFullStaggered: staggeredFullRun passes on every seed; with
// the spaceAlwaysPlenty knob (the followers' idle rounds never probe) it
// fails "staggered full:" on every seed.
func TestSimDiskFullStaggered(t *testing.T) {
	simNoRace(t)
	seeds := uint64(10)
	if raceEnabled {
		seeds = 3
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		if err := staggeredFullRun(seed, testingKnobs{}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		err := staggeredFullRun(seed, testingKnobs{spaceAlwaysPlenty: true})
		if err == nil || !strings.Contains(err.Error(), "staggered full:") {
			t.Fatalf("seed %d: the spaceAlwaysPlenty knob: %v, want \"staggered full:\"", seed, err)
		}
		if seed == 1 {
			t.Logf("seed 1 caught spaceAlwaysPlenty: %v", firstLine(err))
		}
	}
}
