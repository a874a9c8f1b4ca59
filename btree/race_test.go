//go:build race

package btree

// raceEnabled: the race detector allocates on its own, so allocation
// tests skip under it (make noalloc runs them without -race).
const raceEnabled = true
