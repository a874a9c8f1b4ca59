//go:build !race

package poller

// raceEnabled: the race detector allocates on its own.
const raceEnabled = false
