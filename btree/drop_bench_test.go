package btree

import (
	"fmt"
	"testing"
	"time"
)

// dropBenchStore is a store of one tablet [k, +inf) of n keys (16-byte
// keys, 100-byte values, 4 KiB nodes) and a tablet [a, k) of one key,
// restored from a section (a bulk load), its big tablet frozen for a
// move to group 1.
func dropBenchStore(b *testing.B, section []byte, n, step int) (*Store, Tablet) {
	big := Tablet{Low: []byte("k"), HighInf: true}
	cfg := StoreConfig{Tablets: []Tablet{{Low: []byte("a"), High: []byte("k")}, big}, TabletMax: -1, GarbageStep: step}
	s, err := NewStore(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	commit, err := s.Restore(section)
	if err != nil {
		b.Fatal(err)
	}
	commit(10)
	if s.Tree().Len() != n+1 {
		b.Fatalf("%d keys, want %d", s.Tree().Len(), n+1)
	}
	if st := s.Apply(11, ctlReq(CtlFreeze, 1, 1, big)); st[0] != StatusOK {
		b.Fatalf("freeze: %d", st[0])
	}
	return s, big
}

// dropBenchSection is the section of such a store (built once per size).
func dropBenchSection(b *testing.B, n int) []byte {
	cfg := StoreConfig{Tablets: []Tablet{{Low: []byte("a"), High: []byte("k")}, {Low: []byte("k"), HighInf: true}}, TabletMax: -1}
	s, err := NewStore(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 100)
	ents := []KVV{{Key: []byte("a0"), Value: val, Version: 1 << 16}}
	for i := range n {
		ents = append(ents, KVV{Key: fmt.Appendf(nil, "k%015d", i), Value: val, Version: uint64(i+2) << 16})
	}
	t, err := Load(s.cfg.Tree, s.a, ents, s.cfg.Fill, 1)
	if err != nil {
		b.Fatal(err)
	}
	s.setTree(t)
	s.counts = []int{1, n}
	return s.Snapshot()
}

// BenchmarkDrop measures the drop of a tablet of 64 Ki and 1 Mi keys at
// its source (CtlDrop's apply), then the ordered applies (one-key puts
// into the other tablet) that follow until the tablet's keys are gone
// from the tree: ns/op is the drop's apply; max-apply-ns the longest
// single apply from the drop until the keys are gone (the drop's own
// included: on a loaded machine it is mostly the scheduler's and the
// garbage collector's), after-apply-ns the mean of the applies after the
// drop, applies the number of applies that took (1: the drop did it
// all). Figures, not asserts (docs/btree.md, "Dropping a tablet").
func BenchmarkDrop(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		section := dropBenchSection(b, n)
		for _, v := range []struct {
			step     int
			keyByKey bool
		}{{DefaultGarbageStep, false}, {-1, false}, {-1, true}} {
			step := v.step
			name := fmt.Sprintf("keys=%d/step=%d", n, step)
			if v.keyByKey {
				name += "/keybykey"
			}
			b.Run(name, func(b *testing.B) {
				var maxApply time.Duration
				applies, drops := 0, 0
				var after time.Duration
				for b.Loop() {
					b.StopTimer()
					s, big := dropBenchStore(b, section, n, step)
					s.knobs.keyByKey = v.keyByKey
					idx := uint64(12)
					b.StartTimer()
					t0 := time.Now()
					res := s.Apply(idx, ctlReq(CtlDrop, 1, 1, big))
					s.Publish(idx)
					d := time.Since(t0)
					b.StopTimer()
					if res[0] != StatusOK {
						b.Fatalf("drop: %d", res[0])
					}
					maxApply = max(maxApply, d)
					applies++
					for i := 0; s.Tree().Len() > 1+i; i++ {
						idx++
						t0 := time.Now()
						s.Apply(idx, putReq(fmt.Sprintf("b%07d", i), "v"))
						s.Publish(idx)
						d := time.Since(t0)
						maxApply = max(maxApply, d)
						after += d
						applies++
					}
					drops++
					s.Close()
					b.StartTimer()
				}
				b.ReportMetric(float64(maxApply.Nanoseconds()), "max-apply-ns")
				b.ReportMetric(float64(applies)/float64(drops), "applies")
				if applies > drops {
					b.ReportMetric(float64(after.Nanoseconds())/float64(applies-drops), "after-apply-ns")
				}
			})
		}
	}
}

// BenchmarkIngest measures one CtlIngest apply at a move's target as the
// mover sends them: as many 16-byte keys with 100-byte values as fit a
// slot (multicast.MaxPayload; the default slot is 4 KiB), into a tree of
// 64 Ki keys. The ingest's work is bounded by the slot, as every
// request's is: pairs/op is how many one apply puts.
func BenchmarkIngest(b *testing.B) {
	for _, slot := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprint("slot=", slot), func(b *testing.B) {
			s, err := NewStore(StoreConfig{Tablets: []Tablet{{Low: []byte("a"), High: []byte("k")}}, TabletMax: -1}, nil)
			if err != nil {
				b.Fatal(err)
			}
			val := make([]byte, 100)
			var ents []KVV
			for i := range 64 << 10 {
				ents = append(ents, KVV{Key: fmt.Appendf(nil, "b%015d", i), Value: val, Version: 1 << 16})
			}
			t, err := Load(s.cfg.Tree, s.a, ents, s.cfg.Fill, 1)
			if err != nil {
				b.Fatal(err)
			}
			s.setTree(t)
			s.counts = []int{len(ents)}
			in := Tablet{Low: []byte("x"), High: []byte("y")}
			var reqs [][]byte
			pairs := 0
			for r := 0; r < 64; r++ {
				var es []KVV
				for i := 0; ; i++ {
					e := KVV{Key: fmt.Appendf(nil, "x%06d%08d", r, i), Value: val, Version: 1 << 16}
					if CtlSize(in, append(es, e)) > slot-64 {
						break
					}
					es = append(es, e)
				}
				pairs = len(es)
				reqs = append(reqs, ctlReq(CtlIngest, 0, 1, in, es...))
			}
			idx := uint64(100)
			for i := 0; b.Loop(); i++ {
				idx++
				if res := s.Apply(idx, reqs[i%len(reqs)]); res[0] != StatusOK {
					b.Fatalf("ingest: %d", res[0])
				}
				s.Publish(idx)
			}
			b.ReportMetric(float64(pairs), "pairs/op")
		})
	}
}
