//go:build race

package sim_test

// raceEnabled: the race detector slows the simulator several times, so
// TestReadOverlap and TestCounterSim run fewer seeds under it (make
// norace runs TestCounterSim's 1,000).
const raceEnabled = true
