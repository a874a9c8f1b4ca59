package btree

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"testing"

	tbtree "github.com/tidwall/btree"
)

// scanEnv is a tree of small nodes, its model, and a writer that applies
// random puts and deletes (stamped by entry index) to both.
type scanEnv struct {
	t     *testing.T
	r     *rand.Rand
	tr    *Tree
	a     *Arena
	model tbtree.Map[string, string]
	stamp uint64
}

func newScanEnv(t *testing.T, seed uint64, keys int) *scanEnv {
	e := newTreeEnv(t, 256, rand.New(rand.NewPCG(seed, 99)))
	for i := 0; i < keys; i++ {
		e.write()
	}
	return e
}

// newTreeEnv is an empty tree of nodeSize-byte nodes (keys up to 16
// bytes) on an arena of its own, its empty model, stamp 1, and r.
func newTreeEnv(t *testing.T, nodeSize int, r *rand.Rand) *scanEnv {
	cfg := Config{NodeSize: nodeSize, MaxKey: 16}
	a := NewArena(cfg.NodeSize, 64, nil)
	tr, err := New(cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &scanEnv{t: t, r: r, tr: tr, a: a, stamp: 1}
}

// write applies one random op as the next entry. Half the ops go to keys
// of one hot range, so that scans of it race with splits and merges.
func (e *scanEnv) write() {
	e.stamp++
	var k []byte
	if e.r.IntN(2) == 0 {
		k = []byte(fmt.Sprintf("h%03d", e.r.IntN(400)))
	} else {
		k = randKey(e.r, 2000, e.tr.cfg.MaxKey)
	}
	if e.r.IntN(10) < 7 {
		v := randVal(e.r, 22)
		if _, err := e.tr.Put(k, v, e.stamp, e.stamp); err != nil {
			e.t.Fatal(err)
		}
		e.model.Set(string(k), string(v))
	} else {
		e.tr.Delete(k, e.stamp)
		e.model.Delete(string(k))
	}
}

// wantRange is the model's answer to a scan of [start, end) (end nil:
// no end), at most limit pairs (0: no limit), in descending key order
// when reverse.
func wantRange(m *tbtree.Map[string, string], start, end []byte, limit int, reverse bool) []KV {
	var out []KV
	f := func(k, v string) bool {
		if reverse && k < string(start) || !reverse && end != nil && k >= string(end) {
			return false
		}
		if reverse && end != nil && k >= string(end) {
			return true
		}
		out = append(out, KV{Key: []byte(k), Value: []byte(v)})
		return limit <= 0 || len(out) < limit
	}
	switch {
	case !reverse:
		m.Ascend(string(start), f)
	case end == nil:
		m.Reverse(f)
	default:
		m.Descend(string(end), f)
	}
	return out
}

// firstDiff describes where two scans part.
func firstDiff(got, want []KV) string {
	for i := 0; i < len(got) && i < len(want); i++ {
		if string(got[i].Key) != string(want[i].Key) || string(got[i].Value) != string(want[i].Value) {
			return fmt.Sprintf("pair %d: got %q=%q, want %q=%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
	return fmt.Sprintf("%d pairs, want %d", len(got), len(want))
}

func sameKVs(a, b []KV) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i].Key) != string(b[i].Key) || string(a[i].Value) != string(b[i].Value) {
			return false
		}
	}
	return true
}

func (e *scanEnv) randRange() (start, end []byte, limit int) {
	start = []byte(fmt.Sprintf("h%03d", e.r.IntN(400)))
	if e.r.IntN(4) > 0 {
		end = []byte(fmt.Sprintf("h%03d", e.r.IntN(400)+e.r.IntN(200)))
	}
	if e.r.IntN(2) == 0 {
		limit = 1 + e.r.IntN(100)
	}
	if e.r.IntN(8) == 0 {
		start = []byte("0")
	}
	return
}

// scanRacing runs scans through a cache while the writer applies ops
// between the scan's node reads (in the same goroutine, so every read
// sees whole node images, as a one-sided read validated by its check
// word does). A scan that reports ErrChanged is retried from a fresh
// applied index; a scan that succeeds must equal the model as of the
// applied index it started from (strict), or at least the state at one
// moment of the scan's window (not strict: linearizable). It returns the
// first violation.
func scanRacing(t *testing.T, knobs testingKnobs, scans int, strict bool) (changed int, err error) {
	e := newScanEnv(t, 21, 1500)
	c := NewCache(1 << 20)
	c.knobs = knobs
	e.tr.knobs.inPlaceOldStamp = knobs.inPlaceOldStamp // the writer's
	// Writes land between the reads of each scan's first attempt (a
	// retry runs alone, so long scans end).
	racing := false
	var states []*tbtree.Map[string, string] // the model after each write of the scan's window
	read := func(slot uint32) ([]byte, error) {
		if racing && e.r.IntN(8) == 0 {
			e.write()
			states = append(states, e.model.Copy())
		}
		return arenaRead(e.a)(slot)
	}
	for i := 0; i < scans; i++ {
		start, end, limit := e.randRange()
		for try := 0; ; try++ {
			applied, snap := e.stamp, e.model.Copy()
			states = append(states[:0], snap)
			racing = try == 0
			reverse := i%2 == 1
			var got []KV
			var err error
			if reverse {
				got, _, err = c.ReverseScan(read, e.tr.Root(), applied, start, end, limit, nil)
			} else {
				got, _, err = c.Scan(read, e.tr.Root(), applied, start, end, limit, nil)
			}
			if errors.Is(err, ErrChanged) && try == 0 {
				changed++
				continue
			}
			if err != nil {
				return changed, fmt.Errorf("scan %d [%q, %q) limit %d: %v", i, start, end, limit, err)
			}
			want := wantRange(snap, start, end, limit, reverse)
			if !sameKVs(got, want) {
				// Linearizable at all: equal to the state at some one
				// moment of the scan's window?
				later := false
				for _, st := range states[1:] {
					later = later || sameKVs(got, wantRange(st, start, end, limit, reverse))
				}
				if later && strict {
					return changed, fmt.Errorf("scan %d [%q, %q) limit %d: the state at a later index than applied %d", i, start, end, limit, applied)
				}
				if later {
					break
				}
				return changed, fmt.Errorf("not linearizable: scan %d [%q, %q) limit %d at applied %d matches no state of its window: %s", i, start, end, limit, applied, firstDiff(got, want))
			}
			break
		}
	}
	return changed, e.tr.Check()
}

// TestScanRacingWrites: scans and reverse scans that race with writes are
// each the state at the applied index they began from, or are retried.
func TestScanRacingWrites(t *testing.T) {
	changed, err := scanRacing(t, testingKnobs{}, 1500, true)
	if err != nil {
		t.Fatal(err)
	}
	if changed == 0 {
		t.Fatal("no scan met a change: the race was not exercised")
	}
	t.Logf("%d retries on ErrChanged", changed)
}

// TestScanCatchesSkipStamp: a scan that accepts leaves written after its
// applied index returns a mix of states that no single moment of its
// window had, and the linearizability check sees it.
func TestScanCatchesSkipStamp(t *testing.T) {
	_, err := scanRacing(t, testingKnobs{skipStamp: true}, 1500, false)
	mustCatch(t, "skipStamp", err, "^not linearizable")
}

// staleListScans warms a cache with the tree's level-1 nodes, splits the
// hot range's leaves with inserts the cache does not see, then scans the
// range (no writes during the scans): the cached parents list leaves that
// no longer reach their old high fences.
func staleListScans(t *testing.T, knobs testingKnobs) error {
	e := newScanEnv(t, 5, 400)
	c := NewCache(1 << 20)
	c.knobs = knobs
	read := arenaRead(e.a)
	for i := 0; i < 400; i++ {
		c.Lookup(read, e.tr.Root(), []byte(fmt.Sprintf("h%03d", i)))
	}
	for i := 0; i < 400; i++ {
		e.stamp++
		k := []byte(fmt.Sprintf("h%03d-%d", i%400, i))
		if _, err := e.tr.Put(k, []byte("0123456789"), e.stamp, e.stamp); err != nil {
			t.Fatal(err)
		}
		e.model.Set(string(k), "0123456789")
	}
	// Each scan starts from the parents cached before the splits (a scan
	// drops the stale parent it meets, so a shared cache would soon be
	// fresh and the case no longer exercised).
	warm := c
	drops := uint64(0)
	for i := 0; i < 300; i++ {
		drops += c.Stats().Drops
		c = cloneCache(warm)
		start, end, limit := e.randRange()
		got, _, err := c.Scan(read, e.tr.Root(), e.stamp, start, end, limit, nil)
		if err != nil {
			return fmt.Errorf("scan [%q, %q): %v", start, end, err)
		}
		if want := wantRange(&e.model, start, end, limit, false); !sameKVs(got, want) {
			return fmt.Errorf("scan %d [%q, %q) limit %d: %s", i, start, end, limit, firstDiff(got, want))
		}
		got, _, err = c.ReverseScan(read, e.tr.Root(), e.stamp, start, end, limit, nil)
		if err != nil {
			return fmt.Errorf("reverse scan [%q, %q): %v", start, end, err)
		}
		if want := wantRange(&e.model, start, end, limit, true); !sameKVs(got, want) {
			return fmt.Errorf("reverse scan %d [%q, %q) limit %d: %s", i, start, end, limit, firstDiff(got, want))
		}
	}
	if drops+c.Stats().Drops == 0 {
		return errors.New("no cached parent was found stale: the case was not exercised")
	}
	return nil
}

// cloneCache is a copy of c's cached nodes (and knobs) that shares no
// state with it.
func cloneCache(c *Cache) *Cache {
	c.mu.RLock()
	defer c.mu.RUnlock()
	d := NewCache(c.maxBytes)
	d.knobs = c.knobs
	d.levels = make([]*tbtree.BTreeG[*cached], len(c.levels))
	for _, e := range c.ring {
		x := &cached{id: e.id, level: e.level, low: e.low, high: e.high, highInf: e.highInf, keys: e.keys, kids: e.kids, size: e.size, ring: len(d.ring)}
		lv := d.levels[e.level-1]
		if lv == nil {
			lv = tbtree.NewBTreeGOptions(byLow, tbtree.Options{NoLocks: true})
			d.levels[e.level-1] = lv
		}
		lv.Set(x)
		d.ring = append(d.ring, x)
		d.bytes += x.size
	}
	return d
}

// TestScanStaleParents: scans through parents cached before splits find
// every key (contiguity sends them through right links).
func TestScanStaleParents(t *testing.T) {
	if err := staleListScans(t, testingKnobs{}); err != nil {
		t.Fatal(err)
	}
}

// TestScanCatchesSkipContiguity: Sherman's issue 18 planted: without the
// contiguity check, scans through stale parents miss keys.
func TestScanCatchesSkipContiguity(t *testing.T) {
	// Caught by a scan's answer (a missed key), not by the guard that the
	// case ran at all.
	mustCatch(t, "skipContiguity", staleListScans(t, testingKnobs{skipContiguity: true}), "^scan ")
}

// TestScanCatchesInPlaceOldStamp: a leaf changed in place that keeps its
// old stamp (the planted bug: the writer changes the node but not what
// scans validate) is accepted by a scan whose applied index predates the
// change, and the scan mixes states: the linearizability check sees it.
func TestScanCatchesInPlaceOldStamp(t *testing.T) {
	_, err := scanRacing(t, testingKnobs{inPlaceOldStamp: true}, 1500, false)
	mustCatch(t, "inPlaceOldStamp", err, "^not linearizable")
}

// mustCatch checks that the planted bug plant was caught (err) by the
// check aimed at it: err's text matches the regexp check.
func mustCatch(t *testing.T, plant string, err error, check string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s went unnoticed", plant)
	}
	if !regexp.MustCompile(check).MatchString(err.Error()) {
		t.Fatalf("%s caught by the wrong check (want %q): %v", plant, check, err)
	}
	t.Logf("caught as expected: %v", err)
}
