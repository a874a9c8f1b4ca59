package btree

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// captureStore is a store with small nodes, small chunks (the arena grows
// after a capture), tablets that split at 40 keys and a grace of 1 entry
// (unlinked slots are reused soon after), loaded with ops random writes.
func captureStore(t *testing.T, ns int, seed uint64, ops int) (*Store, *model, *rand.Rand, *uint64) {
	t.Helper()
	cfg := StoreConfig{Tree: Config{NodeSize: ns, MaxKey: 16}, ChunkSlots: 8, FreeAfter: 1, MaxResult: 1 << 20,
		TabletMax: 40, Tablets: []Tablet{All}}
	s, err := NewStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, uint64(ns)))
	md := &model{}
	idx := new(uint64)
	for range ops {
		applyRandom(t, s, md, rng, idx)
	}
	return s, md, rng, idx
}

// applyRandom applies one random write request (puts, deletes, merges
// over 300 keys) and checks its result against the model.
func applyRandom(t *testing.T, s *Store, md *model, rng *rand.Rand, idx *uint64) {
	t.Helper()
	*idx++
	ops := randOps(rng, 300, md, min(40, s.cfg.Tree.MaxInline()/2))
	want := md.apply(*idx, ops)
	got, err := DecodeResult(s.Apply(*idx, AppendRequest(nil, ops)))
	if err != nil || got != want {
		t.Fatalf("entry %d: result %+v (%v), model %+v", *idx, got, err, want)
	}
}

// deleteHalf deletes every other key the model holds (leaves empty out
// and merge, their slots freed and, a grace later, reused).
func deleteHalf(t *testing.T, s *Store, md *model, idx *uint64) {
	t.Helper()
	var keys []string
	md.m.Scan(func(k string, _ mval) bool { keys = append(keys, k); return true })
	for i, k := range keys {
		if i%2 == 1 {
			continue
		}
		*idx++
		ops := []Op{{Kind: OpDelete, Key: []byte(k)}}
		md.apply(*idx, ops)
		if r, _ := DecodeResult(s.Apply(*idx, AppendRequest(nil, ops))); r.Status != StatusOK {
			t.Fatalf("delete %q: %+v", k, r)
		}
	}
}

// putNew puts n keys after every random one (splits at the right end,
// a tablet split, the arena's growth).
func putNew(t *testing.T, s *Store, md *model, idx *uint64, n int) {
	t.Helper()
	for i := range n {
		*idx++
		ops := []Op{{Kind: OpPut, Key: []byte(fmt.Sprintf("z%05d", i)), Value: bytes.Repeat([]byte{'v'}, i%20)}}
		md.apply(*idx, ops)
		if r, _ := DecodeResult(s.Apply(*idx, AppendRequest(nil, ops))); r.Status != StatusOK {
			t.Fatalf("put: %+v", r)
		}
	}
}

// TestCaptureIsStateAtCapture: a capture (Capture, metadata only) followed
// by puts that split leaves and tablets, overwrites of other sizes,
// deletes that merge leaves and free their slots (reused after the grace),
// and the arena's growth, persists exactly the section Snapshot returned at
// capture, of Size bytes; the writer saved the images it overwrote, and
// stops saving once the capture is persisted. Planted persistLive
// (Persist reads the live nodes, not the saved images), after overwrites
// in place, persists a section that validates but differs from the one
// at capture.
func TestCaptureIsStateAtCapture(t *testing.T) {
	for _, planted := range []bool{false, true} {
		for _, ns := range []int{256, 4096} {
			for seed := range uint64(3) {
				t.Run(fmt.Sprintf("planted=%v/node%d/seed%d", planted, ns, seed), func(t *testing.T) {
					s, md, rng, idx := captureStore(t, ns, seed, 400)
					s.knobs.persistLive = planted
					want := s.Snapshot()
					tablets, slots := len(s.Tablets()), s.a.Slots()
					c := s.Capture()
					if c.Size() != len(want) {
						t.Fatalf("Size %d, the section at capture has %d bytes", c.Size(), len(want))
					}
					if planted {
						// Overwrites in place of the same length: a
						// Persist that reads the live nodes finds
						// nodes that validate, with other values.
						var keys []string
						md.m.Scan(func(k string, _ mval) bool { keys = append(keys, k); return true })
						for _, k := range keys {
							v, _ := md.m.Get(k)
							*idx++
							ops := []Op{{Kind: OpPut, Key: []byte(k), Value: bytes.Repeat([]byte{'w'}, len(v.v))}}
							md.apply(*idx, ops)
							s.Apply(*idx, AppendRequest(nil, ops))
						}
						got := make([]byte, c.Size())
						err := c.Persist(got)
						if err != nil {
							t.Fatalf("planted persistLive: Persist failed (%v); want a section that validates", err)
						}
						if bytes.Equal(got, want) {
							t.Fatal("planted persistLive: the persisted section equals the one at capture")
						}
						t.Log("planted persistLive caught: the persisted section differs from the one at capture")
						return
					}
					for range 300 {
						applyRandom(t, s, md, rng, idx)
					}
					deleteHalf(t, s, md, idx)
					for range 300 {
						applyRandom(t, s, md, rng, idx)
					}
					putNew(t, s, md, idx, 1000)
					if err := s.Tree().Check(); err != nil {
						t.Fatal(err)
					}
					// The changes covered what they must: tablets split,
					// the arena grew, slots were freed and reused, and
					// the writer saved images for the capture.
					c.cow.mu.Lock()
					saved := len(c.cow.saved)
					c.cow.mu.Unlock()
					if len(s.Tablets()) <= tablets || s.a.Slots() <= slots || saved == 0 || len(s.a.cows) != 1 {
						t.Fatalf("after the capture: %d -> %d tablets, %d -> %d slots, %d images saved, %d live captures",
							tablets, len(s.Tablets()), slots, s.a.Slots(), saved, len(s.a.cows))
					}
					got := make([]byte, c.Size())
					err := c.Persist(got)
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("persisted section differs from the one at capture (err %v)", err)
					}
					// Persisted: the next write drops the capture, and
					// saves nothing more.
					putNew(t, s, md, idx, 1)
					if len(s.a.cows) != 0 {
						t.Fatalf("%d captures still saved for after Persist", len(s.a.cows))
					}
					if err := c.Persist(got); err == nil {
						t.Fatal("a second Persist succeeded")
					}
					// The section restores to the state at capture.
					s2, _ := NewStore(s.cfg, nil)
					commit, err := s2.Restore(got)
					if err != nil {
						t.Fatal(err)
					}
					commit(1)
					if !bytes.Equal(s2.Snapshot(), want) {
						t.Fatal("the persisted section does not restore to the state at capture")
					}
				})
			}
		}
	}
}

// TestCapturePersistRacesWriter: Persist runs on its own goroutine while
// the writer applies (what a replica does): the section is the one at
// capture. Run with -race: every node read is under the capture's lock.
func TestCapturePersistRacesWriter(t *testing.T) {
	for seed := range uint64(3) {
		s, md, rng, idx := captureStore(t, 256, seed, 400)
		want := s.Snapshot()
		c := s.Capture()
		got := make([]byte, c.Size())
		var err error
		var wg sync.WaitGroup
		wg.Go(func() { err = c.Persist(got) })
		for range 400 {
			applyRandom(t, s, md, rng, idx)
		}
		deleteHalf(t, s, md, idx)
		putNew(t, s, md, idx, 500)
		wg.Wait()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("seed %d: persisted section differs from the one at capture (err %v)", seed, err)
		}
	}
}

// TestCaptureBrokenByRestore: a restore while a capture waits for its
// Persist makes the Persist fail (it would read the restored tree); a
// released capture saves nothing.
func TestCaptureBrokenByRestore(t *testing.T) {
	s, _, _, _ := captureStore(t, 256, 1, 300)
	other, _, _, _ := captureStore(t, 256, 2, 300)
	c := s.Capture()
	commit, err := s.Restore(other.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	commit(1000)
	if err := c.Persist(make([]byte, c.Size())); !errors.Is(err, errCaptureBroken) {
		t.Fatalf("Persist after a restore: %v, want %v", err, errCaptureBroken)
	}
	c2 := s.Capture()
	c2.Release()
	s.Apply(1001, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k001"), Value: []byte("x")}}))
	if len(s.a.cows) != 0 || c2.cow.saved != nil {
		t.Fatalf("a released capture: %d live captures, saved %v", len(s.a.cows), c2.cow.saved)
	}
}
