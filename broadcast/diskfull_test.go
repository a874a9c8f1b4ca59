package broadcast

import (
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/sim"
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
	const window = 16 * time.Millisecond
	run := func(knobs testingKnobs) Counters {
		var total Counters
		for seed := uint64(1); seed <= 10; seed++ {
			// Long windows (up to 8 election timeouts) on every member
			// in turn: some fall on the leader.
			o := simOpts{knobs: knobs, n: 3, until: 6 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 4, fullLen: 32 * time.Millisecond}
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
	const window = 16 * time.Millisecond
	o := simOpts{knobs: testingKnobs{ackRefused: true}, n: 3, until: 4 * window, durability: Sync, promiseCheck: true, maxLog: 24, diskFull: 6}
	for seed := uint64(1); seed <= 100; seed++ {
		err := runSim(sim.Seed{Seed: seed}, o, new(Counters))
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "durability promise:") {
			t.Fatalf("seed %d: the ack-refused mutant failed another check than \"durability promise:\": %v", seed, err)
		}
		t.Logf("seed %d caught the ack-refused mutant: %v", seed, firstLine(err))
		return
	}
	t.Fatal("100 seeds of the ack-refused mutant passed the \"durability promise:\" check")
}
