//go:build !race

package tcp

// raceEnabled: the race detector allocates on its own.
const raceEnabled = false
