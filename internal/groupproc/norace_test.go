//go:build !race

package groupproc

// raceEnabled: see race_test.go.
const raceEnabled = false
