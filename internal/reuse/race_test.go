//go:build race

package reuse

// raceEnabled: the planted warmEarly is a data race, which the race
// detector reports before the check can name it.
const raceEnabled = true
