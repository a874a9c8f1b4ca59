package sim

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// DefaultSeeds is how many seeds a simulation test runs when -seeds is not
// given and the test picks no count of its own (a tenth of it with -short).
const DefaultSeeds = 1000

// Flags select the seeds of simulation tests: -seed N runs seed N alone,
// -seeds K runs seeds 1..K, -simtrace logs every event of the runs. A test
// package defines them once, in a _test.go file:
//
//	var simFlags = sim.RegisterFlags(flag.CommandLine)
//
// and each test runs its seeds with simFlags.Run. A test with a count of
// its own runs simFlags.WithDefault(n).Run: a -seeds the user gives wins,
// whatever its value (-seeds 1000 runs 1,000 seeds, not the test's count).
type Flags struct {
	Seed  uint64 // -seed: the one seed to run; 0 means none was given
	Seeds int    // -seeds: how many seeds to run, from 1; 0 means none was given
	Trace bool   // -simtrace: log every event
}

// RegisterFlags defines -seed, -seeds and -simtrace on fs and returns where
// their values go (read them after flag parsing, that is inside tests).
// (The event trace flag is not -trace: go test owns that one.)
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.Uint64Var(&f.Seed, "seed", 0, "sim: run only this seed (with -simtrace, log its events)")
	fs.IntVar(&f.Seeds, "seeds", 0, fmt.Sprintf("sim: number of seeds to run, seeds 1..N (when not given, the test's own count or %d; a tenth with -short)", DefaultSeeds))
	fs.BoolVar(&f.Trace, "simtrace", false, "sim: log every event of every run")
	return f
}

// WithDefault returns f set to run def seeds (a tenth of def, at least 1,
// with -short) when neither -seeds nor -seed was given. A given -seeds is
// kept as is, even when it equals def or DefaultSeeds.
func (f Flags) WithDefault(def int) Flags {
	f.Seeds = seedCount(f.Seeds, def, testing.Short())
	return f
}

// seedCount is how many seeds to run: given when -seeds was given (not 0),
// else def, a tenth of it (at least 1) when short.
func seedCount(given, def int, short bool) int {
	if given != 0 {
		return given
	}
	if short {
		return max(1, def/10)
	}
	return def
}

// Seed is one run handed to a simulation test's body.
type Seed struct {
	Seed  uint64
	Trace bool
	t     testing.TB
}

// WithLog returns sd logging to t when tracing, for tests that pick their
// seeds themselves.
func (sd Seed) WithLog(t testing.TB) Seed {
	sd.t = t
	return sd
}

// Options returns Options with this seed, and with Logf and Trace wired to
// the test's log when tracing.
func (sd Seed) Options() Options {
	o := Options{Seed: sd.Seed, Trace: sd.Trace}
	if sd.Trace && sd.t != nil {
		o.Logf = sd.t.Logf
	}
	return o
}

// Run runs body once per selected seed, in order. The first seed whose
// body returns an error fails the test with the seed, the error (a
// *Failure also shows the events that led to it) and the command that
// reruns exactly that seed; later seeds are not run. A panic in the body
// is reported the same way.
func (f Flags) Run(t *testing.T, body func(sd Seed) error) {
	t.Helper()
	seeds := []uint64{}
	switch {
	case f.Seed != 0:
		seeds = append(seeds, f.Seed)
	default:
		k := seedCount(f.Seeds, DefaultSeeds, testing.Short())
		if k < 0 {
			t.Fatalf("-seeds %d: want a count of seeds, 1 or more", k)
		}
		for i := 1; i <= k; i++ {
			seeds = append(seeds, uint64(i))
		}
	}
	start := time.Now()
	for _, seed := range seeds {
		err := runSeed(body, Seed{Seed: seed, Trace: f.Trace, t: t})
		if err == nil {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d failed: %v\n", seed, err)
		var fl *Failure
		if errors.As(err, &fl) && len(fl.Recent) > 0 {
			b.WriteString("last events:\n")
			for _, ev := range fl.Recent {
				fmt.Fprintf(&b, "  %v\n", ev)
			}
		}
		fmt.Fprintf(&b, "rerun: %s", RerunCommand(t.Name(), seed))
		t.Fatal(b.String())
	}
	t.Logf("%d seeds passed in %v", len(seeds), time.Since(start).Round(time.Millisecond))
}

// runSeed runs body for one seed, turning a panic into an error that
// carries the panic value and stack, so that a crashing seed is reported
// with its number and rerun command like a failing one.
func runSeed(body func(sd Seed) error, sd Seed) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return body(sd)
}

// RerunCommand is the go test command that reruns test name (as t.Name()
// gives it) with one seed, from the module root.
func RerunCommand(name string, seed uint64) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + p + "$"
	}
	return fmt.Sprintf("go test %s -run '%s' -seed %d -v -simtrace", packageDir(), strings.Join(parts, "/"), seed)
}

// packageDir is the test's package directory relative to the module root
// ("./sim"), or "." if it cannot be found.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}
