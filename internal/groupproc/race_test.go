//go:build race

package groupproc

// raceEnabled: timing tests skip under the race detector; make norace
// runs them without it.
const raceEnabled = true
