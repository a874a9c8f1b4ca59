package sim

import (
	"strings"
	"testing"
)

// A body that panics is reported as that seed's failure (with the panic
// value), not as a bare crash of the test binary that names no seed.
func TestRunSeedTurnsPanicIntoError(t *testing.T) {
	err := runSeed(func(sd Seed) error {
		var m map[string]int
		m["x"] = int(sd.Seed) // nil map: panics
		return nil
	}, Seed{Seed: 7})
	if err == nil || !strings.Contains(err.Error(), "panic: assignment to entry in nil map") {
		t.Fatalf("runSeed of a panicking body = %v, want an error carrying the panic", err)
	}
	if err := runSeed(func(Seed) error { return nil }, Seed{Seed: 1}); err != nil {
		t.Fatalf("runSeed of a passing body = %v", err)
	}
}
