//go:build race

package client_test

// raceEnabled: the race detector slows the clusters several times, so the
// metamorphic test runs fewer seeds and operations under it.
const raceEnabled = true
