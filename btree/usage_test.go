package btree

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// walkUsage is the usage a walk of every level finds (Stats' walk, with
// the leaves' used bytes summed).
func walkUsage(t *testing.T, tr *Tree) Usage {
	t.Helper()
	st := tr.Stats()
	u := Usage{Leaves: st.Leaves, Inner: st.Inner}
	id := tr.Root()
	for {
		n, err := Decode(tr.a.Bytes(id.Slot()), id)
		if err != nil {
			t.Fatal(err)
		}
		if n.Leaf {
			break
		}
		it := n.Entries()
		e, _ := it.next()
		id = e.Child
	}
	for id != 0 {
		b := tr.a.Bytes(id.Slot())
		u.LeafBytes += int(leU16(b[offUsed:]))
		n, err := Decode(b, id)
		if err != nil {
			t.Fatal(err)
		}
		id = n.Next
	}
	return u
}

// singleNoRace skips a single-goroutine deterministic test under the race
// detector: it builds and checks trees on the test's goroutine alone
// (seeded inputs, no Store node, no reader), so the detector has no second
// goroutine to check and the run is the same without it. make norace runs
// these tests (NORACE_BTREE in the Makefile: a new one goes there too).
func singleNoRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("single-goroutine deterministic test: runs without -race (make norace)")
	}
}

// TestUsageMatchesWalk: the usage the writer keeps at each node write
// (live leaves and inner nodes, the leaves' used bytes) equals what a
// walk of the tree finds, after every kind of change: inserts, in-place
// puts and deletes, splits up to new roots, merges of emptied leaves, and
// a bulk load. While only puts run, every leaf but the first comes from a
// leaf split and every inner node from an inner split or a new root
// (Inner = InnerSplits + height - 1, Leaves = LeafSplits + 1).
//
// A new slot's first install does not read the slot (its zeros are no
// node; branch bt3): the planted unwrittenAll (every install taken for
// one) must be caught as a usage the walk does not find.
func TestUsageMatchesWalk(t *testing.T) {
	singleNoRace(t)
	for _, g := range geometries {
		t.Run(fmt.Sprintf("node%d", g.cfg.NodeSize), func(t *testing.T) {
			usageMatchesWalk(t, g.cfg, g.ops, g.keySpace, g.maxVal, testingKnobs{}, true)
		})
	}
	t.Run("planted-unwrittenAll", func(t *testing.T) {
		g := geometries[0]
		bad := usageMatchesWalk(t, g.cfg, g.ops, g.keySpace, g.maxVal, testingKnobs{unwrittenAll: true}, false)
		if !strings.Contains(bad, "a walk finds") {
			t.Fatalf("planted unwrittenAll not caught as a usage the walk does not find: %q", bad)
		}
		t.Logf("planted unwrittenAll caught: %s", bad)
	})
}

// usageMatchesWalk runs TestUsageMatchesWalk's changes on one geometry:
// the first mismatch, fatal if fatal, else returned ("" if none).
func usageMatchesWalk(t *testing.T, cfg Config, ops, keySpace, maxVal int, knobs testingKnobs, fatal bool) (bad string) {
	g := struct {
		cfg                   Config
		ops, keySpace, maxVal int
	}{cfg, ops, keySpace, maxVal}
	r := rand.New(rand.NewPCG(uint64(g.cfg.NodeSize), 17))
	a := NewArena(g.cfg.NodeSize, 64, nil)
	tr, err := New(g.cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	tr.knobs = knobs
	check := func(i int) {
		t.Helper()
		got, want := tr.Usage(), walkUsage(t, tr)
		if (got.Leaves != want.Leaves || got.Inner != want.Inner || got.LeafBytes != want.LeafBytes) && bad == "" {
			bad = fmt.Sprintf("op %d: usage %+v, a walk finds %+v", i, got, want)
			if fatal {
				t.Fatal(bad)
			}
		}
	}
	for i := 0; i < g.ops; i++ {
		stamp := uint64(i + 2)
		if _, err := tr.Put(randKey(r, g.keySpace, g.cfg.MaxKey), randVal(r, g.maxVal), stamp<<16, stamp); err != nil {
			t.Fatal(err)
		}
		if i%97 == 0 || i == g.ops-1 {
			check(i)
		}
	}
	u := tr.Usage()
	if (u.LeafSplits == 0 || u.Leaves != int(u.LeafSplits)+1 || u.Inner != int(u.InnerSplits)+height(t, tr)-1) && fatal {
		t.Fatalf("puts only: usage %+v, height %d", u, height(t, tr))
	}
	for i := 0; i < g.ops; i++ {
		stamp := uint64(g.ops + i + 2)
		k := randKey(r, g.keySpace, g.cfg.MaxKey)
		if r.IntN(4) == 0 {
			if _, err := tr.Put(k, randVal(r, g.maxVal), stamp<<16, stamp); err != nil {
				t.Fatal(err)
			}
		} else {
			tr.Delete(k, stamp)
		}
		if i%97 == 0 || i == g.ops-1 {
			check(i)
		}
	}
	// A bulk load of what is left into the same arena, reset.
	var ents []KVV
	tr.ascend(nil, func(e Entry) bool {
		ents = append(ents, KVV{Key: append([]byte(nil), e.Key...), Value: append([]byte(nil), e.Value...), Version: e.Version})
		return true
	})
	a.reset()
	if tr, err = Load(g.cfg, a, ents, 0.7, 1); err != nil {
		t.Fatal(err)
	}
	check(-1)
	return bad
}

// TestDefaultArenaHoldsAMillion: a Store of the default geometry has room
// for the nodes of a million records of 16-byte keys and 100-byte values
// (issue 18's size) in one group, with leaves filled ln 2 (random inserts;
// a load in key order fills them more), inner nodes included. With 256
// slots a chunk (127 MiB of nodes) it had not: a kvbench btree load of a
// million records was refused as a full heap at 904 k.
func TestDefaultArenaHoldsAMillion(t *testing.T) {
	s, err := NewStore(StoreConfig{Tablets: []Tablet{All}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const records, ent = 1_000_000, offSize + leafEnt + 16 + 100
	perLeaf := int(0.69 * float64(DefaultConfig.NodeSize-hdrSize-4-2*17-checkSize) / ent)
	leaves := (records + perLeaf - 1) / perLeaf
	need := leaves + leaves/50 // inner nodes: fanout above 100 at ln 2
	if room := s.a.room(); room < need {
		t.Fatalf("room for %d nodes of %d B (%d MiB), a million records need about %d", room, DefaultConfig.NodeSize, room*DefaultConfig.NodeSize>>20, need)
	}
}
