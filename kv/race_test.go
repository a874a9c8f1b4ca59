//go:build race

package kv

// raceEnabled: the race detector slows the simulator several times, so
// TestSim runs fewer seeds under it (make norace runs them all).
const raceEnabled = true
