//go:build race

package shm

// raceEnabled: the race detector allocates on its own.
const raceEnabled = true
