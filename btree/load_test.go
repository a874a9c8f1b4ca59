package btree

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// noWrites is tbs without their write counts.
func noWrites(tbs []Tablet) []Tablet {
	out := slices.Clone(tbs)
	for i := range out {
		out[i].Writes = 0
	}
	return out
}

// TestStoreTabletWrites: every replica counts each tablet's writes at
// apply (puts, and deletes of a key that was there), the counts add up
// to the writes the group applied across splits (the lower half keeps
// the count, the upper counts from 0), and the load area published with
// the directory reads back as the store's counts (writes and keys); a
// restore keeps the tablets and starts the counts from 0. The planted
// splitCopiesWrites (both halves keep the count) breaks the sum, and the
// test catches it.
func TestStoreTabletWrites(t *testing.T) {
	for _, plant := range []bool{false, true} {
		t.Run(fmt.Sprint("plant=", plant), func(t *testing.T) {
			n := memNode(t)
			low := []byte("b")
			cfg := StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, TabletMax: 40, Tablets: []Tablet{{Low: low, HighInf: true}}}
			s1, err := NewStore(cfg, n)
			if err != nil {
				t.Fatal(err)
			}
			defer s1.Close()
			s2, _ := NewStore(cfg, nil)
			s1.knobs.splitCopiesWrites = plant
			s2.knobs.splitCopiesWrites = plant
			rng := rand.New(rand.NewPCG(5, 11))
			present := map[string]bool{}
			writes := uint64(0)
			caught := ""
			for i := range 1500 {
				k := fmt.Sprintf("b%04d", rng.IntN(1000))
				op := Op{Kind: OpPut, Key: []byte(k), Value: []byte("v")}
				if rng.IntN(4) == 0 {
					op = Op{Kind: OpDelete, Key: []byte(k)}
				}
				req := AppendRequest(nil, []Op{op})
				r1, r2 := s1.Apply(uint64(i+1), req), s2.Apply(uint64(i+1), req)
				if op.Kind == OpPut || present[k] {
					writes++
				}
				present[k] = op.Kind == OpPut
				if !bytes.Equal(r1, r2) || fmt.Sprint(s1.Tablets()) != fmt.Sprint(s2.Tablets()) {
					t.Fatalf("op %d: the replicas differ: tablets %v %v", i, s1.Tablets(), s2.Tablets())
				}
				sum := uint64(0)
				for _, tb := range s1.Tablets() {
					sum += tb.Writes
				}
				if sum != writes {
					caught = fmt.Sprintf("sum: after op %d the tablets count %d writes, the group applied %d", i, sum, writes)
					break
				}
				if i%50 == 49 {
					s1.Publish(uint64(i + 1))
					v, tbs, err := DecodeDir(s1.Regions().hdr.Bytes()[HeaderSize:RegionSize])
					if err != nil || v != s1.DirVersion() || len(tbs) != len(s1.Tablets()) {
						t.Fatalf("published: version %d, %d tablets, %v", v, len(tbs), err)
					}
					for j, tb := range tbs {
						if !tb.HasLoad || tb.Writes != s1.Tablets()[j].Writes || tb.Keys != uint64(s1.Counts()[j]) {
							t.Fatalf("published tablet %d: load %v writes %d keys %d, the store's %d %d", j, tb.HasLoad, tb.Writes, tb.Keys, s1.Tablets()[j].Writes, s1.Counts()[j])
						}
					}
				}
			}
			if plant {
				if !strings.HasPrefix(caught, "sum:") {
					t.Fatalf("planted splitCopiesWrites: caught %q, want the sum property", caught)
				}
				t.Logf("planted splitCopiesWrites caught: %s", caught)
				return
			}
			if caught != "" {
				t.Fatal(caught)
			}
			if len(s1.Tablets()) < 5 {
				t.Fatalf("%d tablets: the test wants splits", len(s1.Tablets()))
			}
			s3, _ := NewStore(cfg, nil)
			commit, err := s3.Restore(s1.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			commit(2000)
			if fmt.Sprint(s3.Tablets()) != fmt.Sprint(noWrites(s1.Tablets())) {
				t.Fatalf("restored %v, want %v without writes", s3.Tablets(), noWrites(s1.Tablets()))
			}
		})
	}
}

// TestStoreWritesMoves: a tablet moved in counts from 0 at its target
// (the ingest is not a write), a frozen tablet counts no refused write,
// and writes through the log count in the tablet holding the key only.
func TestStoreWritesMoves(t *testing.T) {
	tbs := []Tablet{{Low: []byte("a"), High: []byte("m")}, {Low: []byte("m"), HighInf: true}}
	g, _ := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, Tablets: tbs}, nil)
	tg, _ := NewStore(StoreConfig{Group: 1, Tree: Config{NodeSize: 512, MaxKey: 16}}, nil)
	apply := (&applier{t: t}).apply
	for i := range 10 {
		apply(g, putReq(fmt.Sprintf("n%d", i), "v"))
	}
	apply(g, putReq("b", "v"))
	if w := []uint64{g.Tablets()[0].Writes, g.Tablets()[1].Writes}; w[0] != 1 || w[1] != 10 {
		t.Fatalf("writes %v, want [1 10]", w)
	}
	hi := Tablet{Low: []byte("m"), HighInf: true}
	if st := apply(g, ctlReq(CtlFreeze, 1, 1, hi)); st != StatusOK {
		t.Fatalf("freeze: %d", st)
	}
	if st := apply(g, putReq("n0", "w")); st != StatusMoving {
		t.Fatalf("a write to a frozen tablet: %d", st)
	}
	if g.Tablets()[1].Writes != 10 {
		t.Fatalf("a refused write counted: %d", g.Tablets()[1].Writes)
	}
	for _, st := range []uint8{
		apply(tg, ctlReq(CtlIngest, 1, 1, hi, KVV{Key: []byte("n0"), Value: []byte("v"), Version: 1 << 16})),
		apply(g, ctlReq(CtlDrop, 1, 1, hi)),
		apply(tg, ctlReq(CtlActivate, 1, 1, hi)),
		apply(tg, putReq("n1", "v")),
	} {
		if st != StatusOK {
			t.Fatalf("move steps: status %d", st)
		}
	}
	if w := tg.Tablets()[0].Writes; w != 1 {
		t.Fatalf("the moved tablet counts %d writes at its target, want 1 (the put after the move)", w)
	}
}

// TestLoadArea: the load area round-trips; a flipped byte in it, or a
// load area of another directory version, leaves the tablets without
// load (HasLoad false) and the directory still decodes.
func TestLoadArea(t *testing.T) {
	tbs := splitAt(1, "b", "k", "x")[0]
	for i := range tbs {
		tbs[i].Writes = uint64(100 * (i + 1))
	}
	counts := []int{3, 0, 7, 9}
	b := make([]byte, DirBytes+LoadBytes)
	encodeDir(b, 7, tbs)
	encodeLoad(b[DirBytes:], 7, tbs, counts, 12345)
	v, got, err := DecodeDir(b)
	if err != nil || v != 7 || len(got) != len(tbs) {
		t.Fatalf("decode: %d %v %v", v, got, err)
	}
	for i := range got {
		if !got[i].HasLoad || got[i].Writes != tbs[i].Writes || got[i].Keys != uint64(counts[i]) {
			t.Fatalf("tablet %d: %+v", i, got[i])
		}
	}
	if g, ok := DecodeGarbage(b); !ok || g != 12345 {
		t.Fatalf("garbage count: %d %v, want 12345", g, ok)
	}
	used := loadHdr + loadEnt*len(tbs) + checkSize
	for i := range used {
		c := slices.Clone(b)
		c[DirBytes+i] ^= 0x10
		_, got, err := DecodeDir(c)
		if err != nil || len(got) != len(tbs) {
			t.Fatalf("a flip of load byte %d fails the directory: %v", i, err)
		}
		for _, tb := range got {
			if tb.HasLoad {
				t.Fatalf("a flip of load byte %d decodes load %+v", i, tb)
			}
		}
	}
	encodeLoad(b[DirBytes:], 6, tbs, counts, 0)
	if _, got, _ := DecodeDir(b); got[0].HasLoad {
		t.Fatal("a load area of version 6 taken for directory version 7")
	}
	if _, got, _ := DecodeDir(b[:DirBytes]); got[0].HasLoad {
		t.Fatal("load from a read without the load area")
	}
}

// FuzzLoad: decodeLoad never panics, and what it accepts encodes back
// to the same bytes.
func FuzzLoad(f *testing.F) {
	b := make([]byte, LoadBytes)
	encodeLoad(b, 3, []Tablet{{Writes: 5}, {Writes: 9}}, []int{1, 2}, 4)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, writes, keys, garbage, ok := decodeLoad(b)
		if !ok {
			return
		}
		tbs := make([]Tablet, len(writes))
		counts := make([]int, len(keys))
		for i := range tbs {
			if keys[i] > math.MaxInt64 {
				return // past an int's range: a store never counts so many
			}
			tbs[i].Writes, counts[i] = writes[i], int(keys[i])
		}
		c := make([]byte, LoadBytes)
		encodeLoad(c, v, tbs, counts, int(garbage))
		if n := loadHdr + loadEnt*len(tbs) + checkSize; !bytes.Equal(c[:n], b[:n]) {
			t.Fatalf("re-encoded differs")
		}
	})
}

// TestStoreCtlSplit: a split request cuts a serving tablet at its median
// key (the lower half keeps the write count); one of a stale generation,
// one of a frozen tablet or of a tablet of fewer than 2 keys changes
// nothing (StatusCondFailed); one sent again changes nothing either and
// answers OK (TestStoreCtlSplitResent).
func TestStoreCtlSplit(t *testing.T) {
	s, apply := tenKeyStore(t, All)
	v0 := s.DirVersion()
	if st := apply(ctlReq(CtlSplit, 0, 2, All)); st != StatusCondFailed || len(s.Tablets()) != 1 {
		t.Fatalf("a split of a stale generation: status %d, %d tablets", st, len(s.Tablets()))
	}
	if st := apply(ctlReq(CtlSplit, 0, 1, All)); st != StatusOK {
		t.Fatalf("split: status %d", st)
	}
	tbs := s.Tablets()
	if len(tbs) != 2 || string(tbs[0].High) != "k5" || string(tbs[1].Low) != "k5" || !tbs[1].HighInf || tbs[0].Writes != 10 || tbs[1].Writes != 0 ||
		fmt.Sprint(s.Counts()) != "[5 5]" || s.DirVersion() == v0 {
		t.Fatalf("after the split: %+v counts %v", tbs, s.Counts())
	}
	if st := apply(ctlReq(CtlSplit, 0, 1, All)); st != StatusOK || len(s.Tablets()) != 2 {
		t.Fatalf("the split sent again: status %d, %d tablets", st, len(s.Tablets()))
	}
	hi := Tablet{Low: []byte("k5"), HighInf: true}
	if st := apply(ctlReq(CtlFreeze, 1, 1, hi)); st != StatusOK {
		t.Fatalf("freeze: %d", st)
	}
	if st := apply(ctlReq(CtlSplit, 0, 1, hi)); st != StatusCondFailed || len(s.Tablets()) != 2 {
		t.Fatalf("a split of a frozen tablet: status %d, %d tablets", st, len(s.Tablets()))
	}
	one, _ := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, Tablets: []Tablet{All}}, nil)
	one.Apply(1, putReq("a", "v"))
	if st := status(t, one.Apply(2, ctlReq(CtlSplit, 0, 1, All))); st != StatusCondFailed || len(one.Tablets()) != 1 {
		t.Fatalf("a split of a tablet of one key: status %d, %d tablets", st, len(one.Tablets()))
	}
}

// tenKeyStore is a store of group 0 owning tablet tb alone, with keys
// k0 to k9 put, and a function that applies a request to it at the next
// log index and returns its status.
func tenKeyStore(t *testing.T, tb Tablet) (*Store, func(req []byte) uint8) {
	t.Helper()
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, Tablets: []Tablet{tb}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{t: t}
	apply := func(req []byte) uint8 { return a.apply(s, req) }
	for i := range 10 {
		if st := apply(putReq(fmt.Sprintf("k%d", i), "v")); st != StatusOK {
			t.Fatalf("put k%d: status %d", i, st)
		}
	}
	return s, apply
}

// TestStoreCtlSplitResent: a split sent again after its answer was lost
// (the step's retry, a leader change) answers OK and changes nothing:
// the same tablets, key counts, write counts and directory version; a
// second resend too. Requests that only look alike stay refused: the
// same fences at another generation, and a split of the lower half's
// own fences at the generation the halves have is a new split (OK, 3
// tablets). With the planted splitResendRefused the resend is refused
// (what SplitTablet reported as an error though the split happened).
func TestStoreCtlSplitResent(t *testing.T) {
	for _, plant := range []bool{false, true} {
		whole := Tablet{Low: []byte("a"), High: []byte("z")}
		s, apply := tenKeyStore(t, whole)
		s.knobs.splitResendRefused = plant
		if st := apply(ctlReq(CtlSplit, 0, 1, whole)); st != StatusOK {
			t.Fatalf("split: status %d", st)
		}
		state := func() string {
			return fmt.Sprintf("%+v %v dir %d own %d", s.Tablets(), s.Counts(), s.DirVersion(), s.OwnVersion())
		}
		after := state()
		var caught string
		for i := range 2 {
			if st := apply(ctlReq(CtlSplit, 0, 1, whole)); st != StatusOK {
				caught = fmt.Sprintf("resend %d: status %d, want OK", i+1, st)
				break
			}
			if got := state(); got != after {
				t.Fatalf("resend %d changed the tablets: %s, was %s", i+1, got, after)
			}
		}
		if plant {
			if caught == "" {
				t.Fatalf("planted splitResendRefused not caught")
			}
			t.Logf("planted splitResendRefused caught: %s", caught)
			continue
		}
		if caught != "" {
			t.Fatal(caught)
		}
		if st := apply(ctlReq(CtlSplit, 0, 2, whole)); st != StatusCondFailed || state() != after {
			t.Fatalf("the split's fences at another generation: status %d, %s", st, state())
		}
		lo := Tablet{Low: []byte("a"), High: []byte("k5")}
		if st := apply(ctlReq(CtlSplit, 0, 1, lo)); st != StatusOK || len(s.Tablets()) != 3 {
			t.Fatalf("a split of the lower half: status %d, %d tablets", st, len(s.Tablets()))
		}
	}
}

// TestLoadAfterDrop: a drop publishes the directory area in the middle
// of its apply; the Publish that ends the batch writes the load area of
// that version, though no write was counted since (before the fix the
// group's tablets were read without load from then until its next
// write).
func TestLoadAfterDrop(t *testing.T) {
	n := memNode(t)
	tbs := []Tablet{{Low: []byte("a"), High: []byte("m")}, {Low: []byte("m"), HighInf: true}}
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 16}, Tablets: tbs}, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Apply(1, putReq("b", "v"))
	s.Apply(2, putReq("n", "v"))
	s.Publish(2)
	hi := Tablet{Low: []byte("m"), HighInf: true}
	for i, req := range [][]byte{ctlReq(CtlFreeze, 1, 1, hi), ctlReq(CtlDrop, 1, 1, hi)} {
		if st := status(t, s.Apply(uint64(3+i), req)); st != StatusOK {
			t.Fatalf("step %d: status %d", i, st)
		}
		s.Publish(uint64(3 + i))
	}
	v, got, err := DecodeDir(s.Regions().hdr.Bytes()[HeaderSize:RegionSize])
	if err != nil || v != s.DirVersion() || len(got) != 1 {
		t.Fatalf("after the drop: version %d, %v, %v", v, got, err)
	}
	if !got[0].HasLoad || got[0].Writes != 1 || got[0].Keys != 1 {
		t.Fatalf("after the drop the tablet reads %+v, want its load (1 write, 1 key)", got[0])
	}
}
