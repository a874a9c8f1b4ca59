package broadcast

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/sim"
)

// TestSimDeterminism: the protocol is a deterministic function of the
// seed. Every case of the simulator, run twice with the same seed, gives
// the same trace hash (every op, step, fault and output, in order), so a
// failing seed reproduces; different seeds give different runs.
func TestSimDeterminism(t *testing.T) {
	simNoRace(t)
	const window = 16 * time.Millisecond
	cases := map[string]simOpts{
		"crash-restart":      {n: 3, until: window, crashes: true, maxLog: 24},
		"lost-disk":          {n: 5, until: window, crashes: true, loseDisk: 0.5, maxLog: 24, faults: sim.Faults{Until: window, Partition: 1}},
		"crash-at-vote":      {n: 3, until: window, crashAtVote: true, limits: true, faults: sim.Faults{Until: window, Partition: 2, Slow: 1}},
		"leader-to-follower": asymOpts("leader-to-follower", 3, testingKnobs{}),
		// Sync: the writer, the sim disk's latencies and crash model, and
		// recovery are part of the deterministic run.
		"sync-whole-group": {n: 3, until: window, durability: Sync, wholeGroup: 1, staggered: true, crashes: true, maxLog: 24, faults: sim.Faults{Until: window, Partition: 1}},
		// Async: the writer's interval, back-pressure and the recovery
		// election too.
		"async-whole-group": {n: 3, until: window, durability: Async, wholeGroup: 1, staggered: true, crashes: true, maxLog: 24, faults: sim.Faults{Until: window, Partition: 1}},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seen := map[uint64]uint64{}
			for seed := uint64(1); seed <= 10; seed++ {
				var h1, h2 uint64
				o1, o2 := o, o
				o1.hash, o2.hash = &h1, &h2
				err1 := runSim(sim.Seed{Seed: seed}, o1, new(Counters))
				err2 := runSim(sim.Seed{Seed: seed}, o2, new(Counters))
				if h1 != h2 || (err1 == nil) != (err2 == nil) {
					t.Fatalf("seed %d: two runs differ: trace hashes %#x and %#x, errors %v and %v", seed, h1, h2, err1, err2)
				}
				if err1 != nil {
					t.Fatalf("seed %d: %v", seed, err1)
				}
				if s, ok := seen[h1]; ok {
					t.Fatalf("seeds %d and %d gave the same trace hash %#x", s, seed, h1)
				}
				seen[h1] = seed
			}
		})
	}
}
