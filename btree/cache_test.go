package btree

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	tbtree "github.com/tidwall/btree"
)

// cacheRun applies random puts and deletes to a tree of small nodes and,
// between them, lookups through three clients' caches (none, a small one
// that evicts, a large one), and returns the first answer that differs
// from tidwall/btree's.
func cacheRun(t *testing.T, knobs testingKnobs, ops int) (caches []*Cache, err error) {
	cfg := Config{NodeSize: 256, MaxKey: 16}
	a := NewArena(cfg.NodeSize, 64, nil)
	tr, err := New(cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	caches = []*Cache{NewCache(0), NewCache(2 << 10), NewCache(1 << 20)}
	for _, c := range caches {
		c.knobs = knobs
	}
	read := arenaRead(a)
	r := rand.New(rand.NewPCG(11, 12))
	var model tbtree.Map[string, string]
	for i := 0; i < ops; i++ {
		k := randKey(r, 3000, cfg.MaxKey)
		switch p := r.IntN(10); {
		case p < 3:
			v := randVal(r, 22)
			if _, err := tr.Put(k, v, uint64(i+2), uint64(i+2)); err != nil {
				t.Fatal(err)
			}
			model.Set(string(k), string(v))
		case p < 4:
			tr.Delete(k, uint64(i+2))
			model.Delete(string(k))
		default:
			c := caches[r.IntN(len(caches))]
			ent, found, _, err := c.Lookup(read, tr.Root(), k)
			v := ent.Value
			mv, mok := model.Get(string(k))
			if err != nil || found != mok || string(v) != mv {
				return caches, fmt.Errorf("op %d: lookup %q through cache %d = %q, %v, %v; model %q, %v", i, k, c.maxBytes, v, found, err, mv, mok)
			}
		}
	}
	return caches, nil
}

// TestCacheLookups: lookups through stale, evicting and empty caches
// answer what the model holds while the tree splits and merges under
// them; the caches stay within their bounds and did drop stale nodes.
func TestCacheLookups(t *testing.T) {
	caches, err := cacheRun(t, testingKnobs{}, 30000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caches {
		s := c.Stats()
		t.Logf("cache of %d bytes: %+v", c.maxBytes, s)
		if c.maxBytes > 0 && s.Bytes > c.maxBytes {
			t.Errorf("cache of %d bytes holds %d", c.maxBytes, s.Bytes)
		}
	}
	if s := caches[1].Stats(); s.Evicted == 0 {
		t.Error("the small cache never evicted: the bound was not exercised")
	}
	if s := caches[2].Stats(); s.Warm == 0 {
		t.Error("no lookup started from a cached level-1 node")
	}
}

// TestCacheCatchesSkipFence: a client that answers from the leaf its
// (stale) cached pointer names, without checking the leaf's fences,
// answers wrongly once the leaf has split, and the lookup check sees it.
func TestCacheCatchesSkipFence(t *testing.T) {
	if _, err := cacheRun(t, testingKnobs{skipFence: true}, 30000); err == nil {
		t.Fatal("skipFence went unnoticed")
	} else {
		t.Logf("caught as expected: %v", err)
	}
}

// TestWarmLookupOneRead: once warm, a read-only lookup through a cache
// large enough for every inner node reads one node, the leaf.
func TestWarmLookupOneRead(t *testing.T) {
	cfg := Config{NodeSize: 512, MaxKey: 32}
	a := NewArena(cfg.NodeSize, 256, nil)
	tr, _ := New(cfg, a, 1)
	r := rand.New(rand.NewPCG(5, 6))
	var keys [][]byte
	for i := 0; i < 20000; i++ {
		k := []byte(fmt.Sprintf("user%016x", r.Uint64()))
		keys = append(keys, k)
		if _, err := tr.Put(k, []byte("0123456789"), uint64(i+2), uint64(i+2)); err != nil {
			t.Fatal(err)
		}
	}
	c := NewCache(16 << 20)
	read := arenaRead(a)
	for _, k := range keys { // warm-up
		if _, found, _, err := c.Lookup(read, tr.Root(), k); err != nil || !found {
			t.Fatalf("warm-up lookup %q: %v %v", k, found, err)
		}
	}
	total := 0
	for i := 0; i < 5000; i++ {
		_, found, reads, err := c.Lookup(read, tr.Root(), keys[r.IntN(len(keys))])
		if err != nil || !found {
			t.Fatal(found, err)
		}
		total += reads
	}
	st := tr.Stats()
	t.Logf("tree %+v; cache %+v; %.3f reads per warm lookup", st, c.Stats(), float64(total)/5000)
	if total != 5000 {
		t.Fatalf("%d node reads for 5000 warm lookups, want one each", total)
	}
}

// TestCacheConcurrent: many goroutines share one small cache over a
// fixed tree (filling, evicting and dropping concurrently); run with
// -race.
func TestCacheConcurrent(t *testing.T) {
	cfg := Config{NodeSize: 256, MaxKey: 16}
	a := NewArena(cfg.NodeSize, 64, nil)
	tr, _ := New(cfg, a, 1)
	for i := 0; i < 3000; i++ {
		tr.Put([]byte(fmt.Sprintf("k%05d", i)), []byte("v"), uint64(i+2), uint64(i+2))
	}
	read := arenaRead(a)
	c := NewCache(4 << 10)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < 2000; i++ {
				k := []byte(fmt.Sprintf("k%05d", r.IntN(3000)))
				if _, found, _, err := c.Lookup(read, tr.Root(), k); err != nil || !found {
					errs <- fmt.Errorf("lookup %q: %v %v", k, found, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestWarmLookupAllocs: a warm lookup (cached inner nodes, one leaf read
// into the caller's buffer) allocates nothing in the cache. In make
// noalloc (skipped under -race, which allocates on its own).
func TestWarmLookupAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	cfg := Config{NodeSize: 512, MaxKey: 32}
	a := NewArena(cfg.NodeSize, 256, nil)
	tr, _ := New(cfg, a, 1)
	for i := 0; i < 5000; i++ {
		if _, err := tr.Put([]byte(fmt.Sprintf("k%06d", i)), []byte("v"), 1, 1); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, cfg.NodeSize)
	read := func(s uint32) ([]byte, error) { copy(buf, a.Bytes(s)); return buf, nil }
	c := NewCache(1 << 20)
	k := []byte("k002500")
	if _, found, _, err := c.Lookup(read, tr.Root(), k); err != nil || !found {
		t.Fatal(found, err)
	}
	if n := testing.AllocsPerRun(1000, func() { c.Lookup(read, tr.Root(), k) }); n > 0 {
		t.Fatalf("a warm lookup allocates %.1f times", n)
	}
}

// TestLookupHintStale: a lookup run again with the hint of an earlier run
// (LookupHinted: the cached node and child it started from) answers as a
// fresh lookup does after the tree changed under the hint: leaves split
// (the key moved right of the hinted leaf), values changed, and keys
// deleted until leaves merged and were freed (the hinted leaf's slot dead
// or reused). The hint is only a start: what is read is checked.
func TestLookupHintStale(t *testing.T) {
	cfg := Config{NodeSize: 512, MaxKey: 32}
	a := NewArena(cfg.NodeSize, 1024, nil)
	tr, _ := New(cfg, a, 1)
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%06d", i)) }
	stamp := uint64(1)
	for i := 0; i < 4000; i += 4 {
		if _, err := tr.Put(key(i), []byte("v0"), stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	read := func(s uint32) ([]byte, error) { return append([]byte(nil), a.Bytes(s)...), nil }
	c := NewCache(1 << 20)
	hints := make([]Hint, 4000)
	for i := 0; i < 4000; i += 4 {
		if _, found, _, err := c.LookupHinted(read, tr.Root(), key(i), &hints[i]); err != nil || !found {
			t.Fatalf("key %d: %v %v", i, found, err)
		}
	}
	check := func(phase string, want func(i int) (string, bool)) {
		t.Helper()
		for i := 0; i < 4000; i += 4 {
			e, found, _, err := c.LookupHinted(read, tr.Root(), key(i), &hints[i])
			v, ok := want(i)
			if err != nil || found != ok || ok && string(e.Value) != v {
				t.Fatalf("%s: key %d with its earlier hint: found %v %q, err %v; want %v %q", phase, i, found, e.Value, err, ok, v)
			}
		}
	}
	// Splits: keys in between; every value changes.
	stamp++
	for i := 0; i < 4000; i++ {
		if _, err := tr.Put(key(i), []byte("v1"), stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	check("after splits", func(int) (string, bool) { return "v1", true })
	// Merges and frees: most keys deleted.
	stamp++
	for i := 0; i < 4000; i++ {
		if i%32 != 0 {
			tr.Delete(key(i), stamp)
		}
	}
	check("after merges", func(i int) (string, bool) { return "v1", i%32 == 0 })
}

// TestCacheOtherReplicaTree: a cache warmed on one replica's tree and
// then used on another's holding the same keys in other nodes (a leader
// change to a replica whose tree was restored: bulk-loaded, its own node
// ids). Cached pointers name slots the second tree never wrote (zeros);
// such a read is no node (ErrNotNode), so the lookup drops the cached
// node and answers. Read as torn, it was read again until the lookup
// gave up (ErrRetry), every time.
func TestCacheOtherReplicaTree(t *testing.T) {
	cfg := Config{NodeSize: 256, MaxKey: 16}
	a := NewArena(cfg.NodeSize, 4096, nil)
	tr, err := New(cfg, a, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var model tbtree.Map[string, string]
	for i := 0; i < 3000; i++ {
		k, v := randKey(r, 3000, cfg.MaxKey), randVal(r, 22)
		if _, err := tr.Put(k, v, uint64(i+2), uint64(i+2)); err != nil {
			t.Fatal(err)
		}
		model.Set(string(k), string(v))
	}
	var ents []KVV
	model.Scan(func(k, v string) bool {
		ents = append(ents, KVV{Key: []byte(k), Value: []byte(v), Version: 1})
		return true
	})
	b := NewArena(cfg.NodeSize, 4096, nil)
	other, err := Load(cfg, b, ents, 1, 5000)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCache(1 << 20)
	for _, e := range ents {
		if _, found, _, err := c.Lookup(arenaRead(a), tr.Root(), e.Key); err != nil || !found {
			t.Fatalf("warm-up lookup %q: %v %v", e.Key, found, err)
		}
	}
	t.Logf("first tree %d slots, second %d", a.Slots(), b.Slots())
	// A one-sided read of a slot in the second replica's registered
	// chunk that it never handed out: zeros.
	readB := func(slot uint32) ([]byte, error) {
		if n := b.Bytes(slot); n != nil || slot >= 4096 {
			return arenaRead(b)(slot)
		}
		return make([]byte, cfg.NodeSize), nil
	}
	for _, e := range ents {
		got, found, _, err := c.Lookup(readB, other.Root(), e.Key)
		if err != nil || !found || string(got.Value) != string(e.Value) {
			t.Fatalf("lookup %q in the other tree through the warm cache: %q %v %v", e.Key, got.Value, found, err)
		}
	}
}
