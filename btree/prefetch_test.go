package btree

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// prefetchRun applies the same random batches to two Stores, one with
// the batch's prefetch (prefetch.go, with knobs planted in its tree) and
// one without (noPrefetch), as kv.Table drives them (Prefetch of each
// message, TouchBatch, the applies, Publish), and returns the first
// difference: a result, or a slot's bytes after a batch. Batches hold 1
// to 6 messages, each a multi request (independent writes, some on the
// previous op's key) or a request of 1 to 4 atomic ops: puts of new and
// old keys, deletes (empty leaves merge, their slots are freed and
// reused), compare-and-swaps, merges. Small nodes split every few
// inserts, so kept paths go stale within a batch (a split of their leaf,
// of its parent, a new root). It also returns the kept leaves the
// applies took and, of those, the ones taken after a split changed the
// tree's shape since they were kept.
func prefetchRun(cfg Config, knobs testingKnobs, seed uint64, batches, nkeys int) (used, late uint64, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	rng := rand.New(rand.NewPCG(seed, uint64(cfg.NodeSize)))
	var st [2]*Store
	for i := range st {
		s, err := NewStore(StoreConfig{Tree: cfg, Tablets: []Tablet{All}, ChunkSlots: 64, FreeAfter: 8}, nil)
		if err != nil {
			return 0, 0, err
		}
		st[i] = s
	}
	st[0].t.knobs = knobs
	st[1].t.knobs.noPrefetch = true
	md := &model{}
	valMax := min(40, cfg.MaxInline()/2)
	index := uint64(1)
	for b := range batches {
		var msgs [][]byte
		for range 1 + rng.IntN(6) {
			if rng.IntN(3) > 0 {
				var ops []Op
				for n := 1 + rng.IntN(MaxMulti); len(ops) < n; {
					op := randOps(rng, nkeys, md, valMax)[0]
					if len(ops) > 0 && rng.IntN(6) == 0 {
						op.Key = ops[len(ops)-1].Key
					}
					ops = append(ops, op)
				}
				msgs = append(msgs, AppendMulti(nil, ops))
			} else {
				msgs = append(msgs, AppendRequest(nil, randOps(rng, nkeys, md, valMax)))
			}
		}
		var res [2][][]byte
		for i, s := range st {
			for _, m := range msgs {
				s.Prefetch(m)
			}
			s.TouchBatch()
			for j, m := range msgs {
				res[i] = append(res[i], bytes.Clone(s.Apply(index+uint64(j), m)))
			}
			s.Publish(index + uint64(len(msgs)) - 1)
		}
		index += uint64(len(msgs))
		for j := range msgs {
			if !bytes.Equal(res[0][j], res[1][j]) {
				return 0, 0, fmt.Errorf("batch %d message %d: the result differs from the store without prefetch", b, j)
			}
		}
		a0, a1 := st[0].a, st[1].a
		if a0.n != a1.n || st[0].t.root != st[1].t.root {
			return 0, 0, fmt.Errorf("batch %d: the tree differs from the store without prefetch: slots %d/%d, roots %v/%v", b, a0.n, a1.n, st[0].t.root, st[1].t.root)
		}
		for s := uint32(1); s < a0.n; s++ {
			if !bytes.Equal(a0.bytes(s), a1.bytes(s)) {
				return 0, 0, fmt.Errorf("batch %d: slot %d differs from the store without prefetch", b, s)
			}
		}
	}
	if err := st[0].t.Check(); err != nil {
		return 0, 0, err
	}
	return st[0].t.prefetchUsed, st[0].t.prefetchLate, nil
}

// TestPrefetchSameBytes: a batch's prefetch changes no result and no
// byte of any node, for small nodes (tall trees, splits in most batches)
// and the default 4 KiB, and its kept leaves are taken, also after a
// split changed the tree's shape since the prefetch (the leaf check).
// The planted prefetchSkipFence (a kept leaf taken after a split without
// its fence check) puts keys into a leaf that no longer holds them, and
// prefetchIgnoreShape (a kept path's parents taken after a split) splits
// a leaf under a parent that no longer holds it: both caught.
func TestPrefetchSameBytes(t *testing.T) {
	for _, g := range []struct {
		cfg      Config
		nkeys    int
		batches  int
		plantsOn bool
	}{
		{Config{NodeSize: 256, MaxKey: 16}, 999, 300, true},
		{Config{NodeSize: 512, MaxKey: 32}, 999, 120, true},
		{Config{NodeSize: 4096, MaxKey: 256}, 999, 100, false},
	} {
		t.Run(fmt.Sprintf("node%d", g.cfg.NodeSize), func(t *testing.T) {
			used, late, err := prefetchRun(g.cfg, testingKnobs{}, 1, g.batches, g.nkeys)
			if err != nil {
				t.Fatal(err)
			}
			if used == 0 || g.plantsOn && late == 0 {
				t.Fatalf("kept leaves taken: %d, after a split: %d", used, late)
			}
			t.Logf("kept leaves taken: %d, after a split: %d", used, late)
			if !g.plantsOn {
				return
			}
			for _, p := range []struct {
				name  string
				knobs testingKnobs
				check string
			}{
				{"prefetchSkipFence", testingKnobs{prefetchSkipFence: true}, "differs from the store without prefetch"},
				{"prefetchIgnoreShape", testingKnobs{prefetchIgnoreShape: true}, "differs from the store without prefetch|panic: btree: node .* is not a child of"},
			} {
				_, _, err := prefetchRun(g.cfg, p.knobs, 1, g.batches, g.nkeys)
				mustCatch(t, p.name, err, p.check)
			}
		})
	}
}
