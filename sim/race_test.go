//go:build race

package sim_test

// raceEnabled: the race detector slows the simulator several times, so
// TestReadOverlap runs fewer seeds under it.
const raceEnabled = true
