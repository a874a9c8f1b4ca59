package kv

import (
	"cmp"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/sim"
)

// One-sided reads that overlap a replica's stores (sim Options.ReadOverlap,
// docs/simulator.md). In TestSim a read lands between two steps of the
// replica it reads, so it sees every apply whole: a reader that skipped
// the record's check word, or a migration that set a bucket's moved bit
// before copying its slots, passed it. Here a read may be held at the
// replica and land in the middle of one of its later steps (at a Yield:
// kv's Table yields between the stores readers rely on the order of), and
// each of its 8-byte words is the word as it was when the read arrived or
// as it is when it lands.

const kvTornSeeds = 30

// -tornblind runs TestSimTornMutants' planted bugs without overlapping
// reads, over kvSimSeeds seeds, and expects none caught: it shows the
// blind spot of TestSim that ReadOverlap closes.
var tornBlind = flag.Bool("tornblind", false, "kv: run the torn-read mutants without ReadOverlap and expect them missed")

var kvTornCases = []struct {
	name string
	o    kvOpts
}{
	// Puts, deletes, batches and multi requests on 24 keys: records freed
	// and reused while gets read them, slots rewritten, headers
	// republished, layouts odd while batches apply.
	{"torn-calm", kvOpts{ops: 80, gap: 100 * time.Microsecond, overlap: 0.5}},
	// The index grows through several generations while gets read both
	// generations; crashes make replicas restore snapshots.
	{"torn-growth", kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond, crashes: true, overlap: 0.5}},
}

func kvTornOpts(o kvOpts) kvOpts {
	o.groups, o.replicas, o.clients, o.keys = 2, 3, 3, cmp.Or(o.keysSet, 24)
	o.until = 60 * time.Millisecond
	return o
}

func TestSimTorn(t *testing.T) {
	flags := *simFlags
	if flags.Seed == 0 && flags.Seeds == sim.DefaultSeeds {
		flags.Seeds = kvTornSeeds
		if raceEnabled {
			flags.Seeds = 2
		}
		if testing.Short() {
			flags.Seeds = max(1, flags.Seeds/10)
		}
	}
	for _, c := range kvTornCases {
		t.Run(c.name, func(t *testing.T) {
			o := kvTornOpts(c.o)
			var mixed uint64
			flags.Run(t, func(sd sim.Seed) error {
				h, err := runKV(sd.WithLog(t), o)
				if h != nil {
					mixed += h.s.OverlapMixed()
				}
				return err
			})
			// The mode must do what it is for: reads that saw a
			// replica in the middle of a change.
			if mixed == 0 {
				t.Fatalf("no read returned words from two moments")
			}
			t.Logf("%d reads returned words from two moments", mixed)
		})
	}
}

// TestSimTornMutants plants bugs of readers and of the index's migration
// and checks that TestSimTorn's checks catch each within a few seeds with
// ReadOverlap. With -tornblind it runs those TestSim misses (every case,
// 150 seeds each, was checked) without the mode, and expects them missed
// there too: the blind spot the mode closes.
func TestSimTornMutants(t *testing.T) {
	for _, m := range []struct {
		name  string
		knobs testingKnobs
		o     kvOpts
		// seen: TestSim catches it without overlapping reads too (a
		// record's memory reused between a get's two rounds is common).
		seen bool
	}{
		{"no-record-check", testingKnobs{noRecordCheck: true}, kvOpts{ops: 150, gap: 30 * time.Microsecond}, false},
		{"any-version", testingKnobs{anyVersion: true}, kvOpts{ops: 80, gap: 100 * time.Microsecond}, true},
		{"moved-first", testingKnobs{movedFirst: true}, kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond}, false},
	} {
		t.Run(m.name, func(t *testing.T) {
			o := kvTornOpts(m.o)
			o.knobs = m.knobs
			if *tornBlind && m.seen {
				t.Skip("TestSim catches it without overlapping reads")
			}
			if *tornBlind {
				for seed := uint64(1); seed <= kvSimSeeds; seed++ {
					if _, err := runKV(sim.Seed{Seed: seed}, o); err != nil {
						t.Fatalf("seed %d caught it without overlapping reads: %v", seed, firstLine(err.Error()))
					}
				}
				t.Logf("missed in %d seeds without overlapping reads", kvSimSeeds)
				return
			}
			o.overlap = 0.5
			for seed := uint64(1); seed <= 20; seed++ {
				_, err := runKV(sim.Seed{Seed: seed}, o)
				if err == nil {
					continue
				}
				// The checks of what gets returned: porcupine, or
				// CheckStale for a stale-ok get.
				if !strings.HasPrefix(err.Error(), "linearizability") && !strings.HasPrefix(err.Error(), "stale-ok gets") {
					t.Fatalf("seed %d: caught by the wrong check: %v", seed, err)
				}
				t.Logf("seed %d caught it: %s", seed, firstLine(err.Error()))
				return
			}
			t.Fatalf("not caught in 20 seeds")
		})
	}
}
