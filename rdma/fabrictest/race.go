//go:build race

package fabrictest

// raceEnabled reports whether the race detector is on; it allocates on its
// own, so allocation counts are skipped.
const raceEnabled = true
