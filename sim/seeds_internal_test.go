package sim

import (
	"flag"
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

// A -seeds the user gives is obeyed whatever its value, the test's own
// count or DefaultSeeds included (it once ran the test's count instead
// when it equalled DefaultSeeds); without it the test's count runs, a
// tenth with -short.
func TestSeedsFlagObeyed(t *testing.T) {
	for _, c := range []struct {
		args  []string
		def   int
		short bool
		want  int
	}{
		{nil, 150, false, 150},
		{nil, 150, true, 15},
		{nil, 3, true, 1},
		{[]string{"-seeds", "1000"}, 150, false, 1000}, // = DefaultSeeds
		{[]string{"-seeds", "1000"}, 150, true, 1000},
		{[]string{"-seeds", "150"}, 150, false, 150},
		{[]string{"-seeds", "2"}, 350, false, 2},
		{[]string{"-seeds", "2"}, 350, true, 2},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := RegisterFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if got := seedCount(f.Seeds, c.def, c.short); got != c.want {
			t.Errorf("%q, test's count %d, short %v: %d seeds, want %d", c.args, c.def, c.short, got, c.want)
		}
	}
	// Flags.WithDefault is that with the test binary's -short.
	if got := (Flags{Seeds: DefaultSeeds}).WithDefault(150).Seeds; got != DefaultSeeds {
		t.Errorf("-seeds %d with a test count of 150: WithDefault gives %d", DefaultSeeds, got)
	}
}
