//go:build race

package multicast

// raceEnabled: the simulator tests skip under the race detector
// (simNoRace; make norace runs them).
const raceEnabled = true
