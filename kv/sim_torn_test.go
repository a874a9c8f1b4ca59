package kv

import (
	"cmp"
	"flag"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/kvcheck"
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
	// republished, layouts odd while batches apply. Each client gets the
	// key it writes while the write is under way.
	{"torn-calm", kvOpts{ops: 80, gap: 100 * time.Microsecond, overlap: 0.5, readBack: true}},
	// The index grows through several generations while gets read both
	// generations; crashes make replicas restore snapshots.
	{"torn-growth", kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond, crashes: true, overlap: 0.5, readBack: true}},
}

func kvTornOpts(o kvOpts) kvOpts {
	o.groups, o.replicas, o.clients, o.keys = 2, 3, 3, cmp.Or(o.keysSet, 24)
	o.until = 60 * time.Millisecond
	return o
}

func TestSimTorn(t *testing.T) {
	simNoRace(t)
	// -seeds N runs N a case; without it kvTornSeeds a case, 1 under the
	// race detector, a tenth with -short.
	def := kvTornSeeds
	if raceEnabled {
		def = 1
	}
	flags := simFlags.WithDefault(def)
	for _, c := range kvTornCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each seed is its own single-goroutine Sim
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
		c     int // the kvTornCases case
		seeds uint64
		// seen: TestSim catches it without overlapping reads too (a
		// record's memory reused between a get's two rounds is common).
		seen bool
	}{
		{"no-record-check", testingKnobs{noRecordCheck: true}, 0, 20, false},
		{"any-version", testingKnobs{anyVersion: true}, 0, 20, true},
		// A get must be under way at a replica while it migrates the
		// key's own bucket: about one seed in 15 (docs/kv.md). Which
		// seeds do moves with any change of schedule (the first was 66
		// once the multicast client's window became per group): 150.
		{"moved-first", testingKnobs{movedFirst: true}, 1, 150, false},
	} {
		t.Run(m.name, func(t *testing.T) {
			if raceEnabled {
				t.Skip("slow under -race: make norace runs it")
			}
			t.Parallel()
			o := kvTornOpts(kvTornCases[m.c].o)
			o.knobs = m.knobs
			if *tornBlind && m.seen {
				t.Skip("TestSim catches it without overlapping reads")
			}
			if *tornBlind {
				o.overlap = 0
				for seed := uint64(1); seed <= kvSimSeeds; seed++ {
					if _, err := runKV(sim.Seed{Seed: seed}, o); err != nil {
						t.Fatalf("seed %d caught it without overlapping reads: %v", seed, firstLine(err.Error()))
					}
				}
				t.Logf("missed in %d seeds without overlapping reads", kvSimSeeds)
				return
			}
			for seed := uint64(1); seed <= m.seeds; seed++ {
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
			t.Fatalf("not caught in %d seeds", m.seeds)
		})
	}
}

// readBack gets key k, if its group's reader is idle, while the client's
// write of it is under way: the get's reads reach the replicas while they
// apply the write, and so, while the index grows, while the key's old
// buckets migrate (kvOpts.readBack).
func (p *kvCliProc) readBack(now time.Duration, rng *rand.Rand, k string) {
	h := p.h
	g := int(h.slots[HashSlot([]byte(k))])
	r := p.readers[g]
	if r.Busy() {
		return
	}
	mode, stale := Linearizable, rng.IntN(3) == 0
	if stale {
		mode = StaleOK
		h.stats.stale++
	}
	h.stats.gets++
	p.getRec[g] = h.rec.Begin(p.slot, kvcheck.Op{Client: p.slot, Kind: kvcheck.Get, Key: k, Stale: stale})
	r.Begin([]byte(k), mode)
	if r.Poll(now) {
		p.endGet(g)
	}
}
