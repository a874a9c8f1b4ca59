//go:build !race

package broadcast

// raceEnabled: see race_test.go.
const raceEnabled = false
