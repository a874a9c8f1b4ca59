package btree

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// garbageRig applies requests to a store as kv.Table does outside
// batches: each apply, then Publish (which renews the garbage budget).
type garbageRig struct {
	t   *testing.T
	idx *uint64
}

func (r garbageRig) apply(s *Store, b []byte) []byte {
	r.t.Helper()
	*r.idx++
	out := s.Apply(*r.idx, b)
	s.Publish(*r.idx)
	return out
}

func (r garbageRig) ok(s *Store, b []byte, what string) {
	r.t.Helper()
	if st := status(r.t, r.apply(s, b)); st != StatusOK {
		r.t.Fatalf("%s: status %d", what, st)
	}
}

// tabletEntries are s's entries in tb.
func tabletEntries(s *Store, tb Tablet) []KVV {
	var es []KVV
	s.Tree().ascend(tb.Low, func(e Entry) bool {
		if !tb.Contains(e.Key) {
			return false
		}
		es = append(es, KVV{Key: bytes.Clone(e.Key), Value: bytes.Clone(e.Value), Version: e.Version})
		return true
	})
	return es
}

// move moves tb from g to to (group ids gid, tid) through the four
// steps, the ingest in parts of 50 pairs.
func (r garbageRig) move(g, to *Store, tid uint32, tb Tablet, gen uint64) {
	r.t.Helper()
	r.ok(g, ctlReq(CtlFreeze, tid, gen, tb), "freeze")
	es := tabletEntries(g, tb)
	for i := 0; i < len(es) || i == 0; i += 50 {
		r.ok(to, ctlReq(CtlIngest, tid, gen, tb, es[i:min(i+50, len(es))]...), "ingest")
	}
	r.ok(g, ctlReq(CtlDrop, tid, gen, tb), "drop")
	r.ok(to, ctlReq(CtlActivate, tid, gen, tb), "activate")
}

// TestDropChunked: a drop takes its tablet out of the group's list and
// changes the ownership version at once, and leaves its keys as garbage
// that the following applies delete, at most GarbageStep per published
// batch (several applies in one batch share one budget); the counts
// (Stats, Garbage) say how many remain, CheckKeys holds after every
// apply, and once enough batches went by the keys are gone and the tree
// holds exactly the other tablet's. A snapshot taken halfway (captured
// and persisted, equal to Snapshot) restores a replica that holds the
// same garbage and deletes the same keys at the same entries.
func TestDropChunked(t *testing.T) {
	const n, step = 3000, 100
	low := Tablet{Low: []byte("a"), High: []byte("k")}
	big := Tablet{Low: []byte("k"), HighInf: true}
	cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 16}, FreeAfter: 8, Tablets: []Tablet{low, big}, TabletMax: -1, GarbageStep: step}
	g, err := NewStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	idx := uint64(0)
	r := garbageRig{t, &idx}
	for i := range n {
		r.ok(g, putReq(fmt.Sprintf("k%05d", i), "v"), "put")
	}
	for i := range 20 {
		r.ok(g, putReq(fmt.Sprintf("b%05d", i), "w"), "put")
	}
	r.ok(g, ctlReq(CtlFreeze, 1, 1, big), "freeze")
	own := g.OwnVersion()
	r.ok(g, ctlReq(CtlDrop, 1, 1, big), "drop")
	if len(g.Tablets()) != 1 || g.OwnVersion() != own+1 {
		t.Fatalf("after the drop: tablets %+v own %d (was %d)", g.Tablets(), g.OwnVersion(), own)
	}
	gr, left := g.Garbage()
	if len(gr) != 1 || left != n-step || g.Tree().Len() != 20+n-step || g.Stats().GarbageKeys != left {
		t.Fatalf("after the drop: garbage %d ranges %d keys, tree %d keys, stats %+v", len(gr), left, g.Tree().Len(), g.Stats())
	}
	if res := r.apply(g, AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte("k02999")}})); res[0] != StatusMoved {
		t.Fatalf("a log read of a garbage key: status %d, want StatusMoved", res[0])
	}
	// Several applies in one batch (no Publish between): one budget.
	before := g.Tree().Len()
	for i := range 5 {
		idx++
		if st := status(t, g.Apply(idx, putReq(fmt.Sprintf("c%05d", i), "x"))); st != StatusOK {
			t.Fatal(st)
		}
	}
	g.Publish(idx)
	if d := before + 5 - g.Tree().Len(); d != step {
		t.Fatalf("a batch of 5 applies deleted %d garbage keys, want %d (one budget per batch)", d, step)
	}
	// A snapshot halfway, restored into a second replica.
	for range 10 {
		r.ok(g, putReq("b00000", "y"), "put")
	}
	g2, err := NewStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit, err := g2.Restore(capturedSection(t, g))
	if err != nil {
		t.Fatal(err)
	}
	commit(idx)
	applies := 0
	for {
		_, left := g.Garbage()
		if err := g.CheckKeys(); err != nil {
			t.Fatalf("after %d applies: %v", applies, err)
		}
		if err := g2.CheckKeys(); err != nil {
			t.Fatalf("restored replica, after %d applies: %v", applies, err)
		}
		if err := samePairs(storePairs(g), storePairs(g2)); err != nil {
			t.Fatalf("after %d applies, the restored replica differs: %v", applies, err)
		}
		if left == 0 {
			break
		}
		if applies++; applies > n/step+5 {
			t.Fatalf("%d garbage keys left after %d applies", left, applies)
		}
		b := putReq(fmt.Sprintf("d%05d", applies), "z")
		before := g.Tree().Len()
		r.apply(g, b)
		g2.Apply(idx, b)
		g2.Publish(idx)
		if d := before + 1 - g.Tree().Len(); d > step || d != min(step, left) {
			t.Fatalf("one apply deleted %d garbage keys of %d, the step is %d", d, left, step)
		}
	}
	if gr, _ := g.Garbage(); len(gr) != 0 || g.Stats().GarbageRanges != 0 || g.Stats().GarbageDeleted != n {
		t.Fatalf("garbage done: %d ranges, stats %+v", len(gr), g.Stats())
	}
	for _, e := range storePairs(g) {
		if big.Contains(e.Key) {
			t.Fatalf("key %q of the dropped tablet still in the tree", e.Key)
		}
	}
	if err := g.Tree().Check(); err != nil {
		t.Fatal(err)
	}
}

// TestDropMoveBack: a tablet moves from g to t and, while g still holds
// its keys as garbage, half of it (t split it) moves back to g. The
// ingest at g clears the garbage in the returning half and cuts it out of
// the garbage range; the rest of the range is still deleted in steps.
// Keys deleted at t stay deleted at g, values changed at t are t's, and
// once g's garbage is done g holds exactly what t held of the half. The
// planted gcKeepsRange leaves the returning half in the garbage range, so
// later steps delete keys g took back in: CheckKeys finds a garbage range
// overlapping a tablet, and keys of the tablet are missing.
func TestDropMoveBack(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			const n, step = 2000, 50
			x := Tablet{Low: []byte("k"), High: []byte("t")}
			base := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 16}, FreeAfter: 8, GarbageStep: step}
			cg, ct := base, base
			cg.Group, cg.Tablets, cg.TabletMax = 0, []Tablet{{Low: []byte("a"), High: []byte("k")}, x}, -1
			ct.Group, ct.Tablets, ct.TabletMax = 1, []Tablet{{Low: []byte("t"), HighInf: true}}, n+5
			g, _ := NewStore(cg, nil)
			tg, _ := NewStore(ct, nil)
			if plant {
				g.knobs.gcKeepsRange = true
			}
			idx := uint64(0)
			r := garbageRig{t, &idx}
			for i := range n {
				r.ok(g, putReq(fmt.Sprintf("k%05d", i*2), "g"), "put")
			}
			r.move(g, tg, 1, x, 1)
			if _, left := g.Garbage(); left < n-3*step {
				t.Fatalf("g's garbage after the move: %d keys (the test wants most of them left)", left)
			}
			// At t: new keys (the tablet splits), deletes, updates.
			for i := range 20 {
				r.ok(tg, putReq(fmt.Sprintf("k%05d", i*2+1), "t"), "put")
			}
			if len(tg.Tablets()) != 3 {
				t.Fatalf("t's tablets %+v: the test wants x split", tg.Tablets())
			}
			half := tg.Tablets()[1]
			for i := n / 2; i < n; i += 3 {
				k := fmt.Sprintf("k%05d", i*2)
				r.ok(tg, AppendRequest(nil, []Op{{Kind: OpDelete, Key: []byte(k)}}), "delete")
				r.ok(tg, putReq(fmt.Sprintf("k%05d", i*2+2), "u"), "update")
			}
			want := tabletEntries(tg, half)
			r.move(tg, g, 0, half, half.Gen+1)
			got := tabletEntries(g, half)
			if err := sameKVV(got, want); err != nil {
				t.Fatalf("the half back at g: %v", err)
			}
			// Drive both groups' garbage to its end.
			var failed error
			for i := 0; i < 4*n/step; i++ {
				r.ok(g, putReq(fmt.Sprintf("b%05d", i), "w"), "put")
				r.ok(tg, putReq(fmt.Sprintf("z%05d", i), "w"), "put")
				if err := g.CheckKeys(); err != nil && failed == nil {
					failed = err
				}
			}
			got = tabletEntries(g, half)
			switch {
			case !plant && failed != nil:
				t.Fatal(failed)
			case !plant:
				if err := sameKVV(got, want); err != nil {
					t.Fatalf("the half at g after its garbage was deleted: %v", err)
				}
				if gr, left := g.Garbage(); len(gr) != 0 || left != 0 {
					t.Fatalf("g's garbage not done: %+v, %d keys", gr, left)
				}
				for _, e := range storePairs(g) {
					if x.Contains(e.Key) && !half.Contains(e.Key) {
						t.Fatalf("g holds %q, of x's half that stayed at t", e.Key)
					}
				}
				for _, s := range []*Store{g, tg} {
					if err := s.CheckKeys(); err != nil {
						t.Fatal(err)
					}
					if err := s.Tree().Check(); err != nil {
						t.Fatal(err)
					}
				}
				t.Logf("cleared at once by the ingest: %d keys; deleted in steps: %d", g.Stats().GarbageCleared, g.Stats().GarbageDeleted)
			case failed == nil || !strings.HasPrefix(failed.Error(), "ranges:") || !strings.Contains(failed.Error(), "overlap"):
				t.Fatalf("planted gcKeepsRange: CheckKeys said %v, want a garbage range overlapping a tablet", failed)
			case len(got) >= len(want):
				t.Fatalf("planted gcKeepsRange: %d keys of the half at g, %d moved back (the test no longer exercises it)", len(got), len(want))
			default:
				t.Logf("planted gcKeepsRange caught: %v (%d of %d keys left)", failed, len(got), len(want))
			}
		})
	}
}

func sameKVV(got, want []KVV) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d pairs, want %d", len(got), len(want))
	}
	for i := range got {
		if string(got[i].Key) != string(want[i].Key) || string(got[i].Value) != string(want[i].Value) || got[i].Version != want[i].Version {
			return fmt.Errorf("pair %d: %q=%q@%x, want %q=%q@%x", i, got[i].Key, got[i].Value, got[i].Version, want[i].Key, want[i].Value, want[i].Version)
		}
	}
	return nil
}

// TestGarbageMerges: drops of neighbouring tablets leave one garbage
// range (a group holds at most one more garbage range than tablets),
// and an abort makes an installing tablet's keys garbage too; the
// snapshot of such a store restores.
func TestGarbageMerges(t *testing.T) {
	var tbs []Tablet
	for _, f := range []string{"a", "c", "e", "g", "i"} {
		tbs = append(tbs, Tablet{Low: []byte(f), High: []byte{f[0] + 2}})
	}
	cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 16}, Tablets: tbs, TabletMax: -1, GarbageStep: 10}
	g, _ := NewStore(cfg, nil)
	idx := uint64(0)
	r := garbageRig{t, &idx}
	for _, tb := range tbs {
		for i := range 40 {
			r.ok(g, putReq(fmt.Sprintf("%s%03d", tb.Low, i), "v"), "put")
		}
	}
	// Drop c, then g, then e: [c, i) becomes one range; a and i stay.
	for _, i := range []int{1, 3, 2} {
		r.ok(g, ctlReq(CtlFreeze, 1, 1, tbs[i]), "freeze")
		r.ok(g, ctlReq(CtlDrop, 1, 1, tbs[i]), "drop")
		if err := g.CheckKeys(); err != nil {
			t.Fatal(err)
		}
	}
	gr, _ := g.Garbage()
	if len(gr) != 1 || string(gr[0].High) != "i" {
		t.Fatalf("garbage ranges %+v, want one ending at i", gr)
	}
	// An installing tablet aborted: its keys are garbage as well.
	in := Tablet{Low: []byte("x"), High: []byte("z")}
	r.ok(g, ctlReq(CtlIngest, 0, 3, in, KVV{Key: []byte("x1"), Value: []byte("v"), Version: 1 << 16}, KVV{Key: []byte("y1"), Value: []byte("v"), Version: 1 << 16}), "ingest")
	r.ok(g, ctlReq(CtlAbort, 0, 3, in), "abort")
	if err := g.CheckKeys(); err != nil {
		t.Fatal(err)
	}
	g2, _ := NewStore(cfg, nil)
	commit, err := g2.Restore(capturedSection(t, g))
	if err != nil {
		t.Fatal(err)
	}
	commit(idx)
	gr2, left2 := g2.Garbage()
	gr, left := g.Garbage()
	if len(gr2) != len(gr) || left2 != left || g2.CheckKeys() != nil {
		t.Fatalf("restored garbage %+v (%d keys), want %+v (%d keys): %v", gr2, left2, gr, left, g2.CheckKeys())
	}
	for range 20 {
		r.ok(g, putReq("a000", "w"), "put")
	}
	if gr, left := g.Garbage(); len(gr) != 0 || left != 0 || g.Tree().Len() != 80 {
		t.Fatalf("after 20 applies: garbage %+v %d keys, tree %d keys", gr, left, g.Tree().Len())
	}
}

// TestGarbageDeleteKeys: garbage deleted one write per leaf
// (Tree.deleteKeys) leaves the same entries as deleted one key at a time
// (the keyByKey reference), after every apply, over random trees whose
// leaves straddle the dropped tablet's fences, for several node sizes and
// steps: the trees check (fences, links, counts), and their key counts
// and section sizes agree.
func TestGarbageDeleteKeys(t *testing.T) {
	for _, size := range []int{256, 512, 4096} {
		for _, step := range []int{5, 64, -1} {
			t.Run(fmt.Sprintf("node=%d/step=%d", size, step), func(t *testing.T) {
				mid := Tablet{Low: []byte("k3"), High: []byte("k7")}
				tbs := []Tablet{{Low: []byte("a"), High: []byte("k3")}, mid, {Low: []byte("k7"), HighInf: true}}
				cfg := StoreConfig{Tree: Config{NodeSize: size, MaxKey: 16}, FreeAfter: 4, Tablets: tbs, TabletMax: -1, GarbageStep: step}
				a, _ := NewStore(cfg, nil)
				b, _ := NewStore(cfg, nil)
				b.knobs.keyByKey = true
				idx := uint64(0)
				both := func(req []byte, what string) {
					idx++
					for _, s := range []*Store{a, b} {
						if st := status(t, s.Apply(idx, req)); st != StatusOK {
							t.Fatalf("%s: status %d", what, st)
						}
						s.Publish(idx)
					}
				}
				rng := uint64(size*131 + step + 7)
				next := func() uint64 { rng = rng*6364136223846793005 + 1442695040888963407; return rng >> 33 }
				for range 1000 {
					k := fmt.Sprintf("k%04d", next()%10000)
					v := strings.Repeat("v", int(next()%20))
					both(putReq(k, v), "put")
				}
				both(ctlReq(CtlFreeze, 1, 1, mid), "freeze")
				both(ctlReq(CtlDrop, 1, 1, mid), "drop")
				for i := 0; ; i++ {
					if err := samePairs(storePairs(a), storePairs(b)); err != nil {
						t.Fatalf("after %d applies: %v", i, err)
					}
					for _, s := range []*Store{a, b} {
						if err := s.Tree().Check(); err != nil {
							t.Fatalf("after %d applies: %v", i, err)
						}
						if err := s.CheckKeys(); err != nil {
							t.Fatalf("after %d applies: %v", i, err)
						}
					}
					if a.Capture().Size() != b.Capture().Size() {
						t.Fatalf("after %d applies: sections of %d and %d bytes", i, a.Capture().Size(), b.Capture().Size())
					}
					if _, left := a.Garbage(); left == 0 {
						break
					}
					both(putReq(fmt.Sprintf("b%04d", i), "x"), "put")
				}
			})
		}
	}
}
