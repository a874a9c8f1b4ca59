//go:build race

package broadcast

// raceEnabled: the race detector slows everything several times, so
// timing assertions are skipped under it (the noalloc/norace pass of make
// test runs them).
const raceEnabled = true
