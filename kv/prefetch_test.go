package kv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

var _ multicast.BatchPrefetcher = (*Table)(nil)

// TestPrefetchSameImage: applying random batches with Prefetch (and the
// touch at BeginBatch, and a multi request's own prefetch outside a
// batch) returns the same results, byte for byte, and leaves the same
// table image (index generations, heap, header, counts) after every batch
// as applying them without, while the index grows and migrates under the
// batches: puts, deletes, conditional ops, merges, multi requests,
// malformed payloads, and a group owning part of the keyspace.
func TestPrefetchSameImage(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			if diff := prefetchDiff(t, seed, testingKnobs{}); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}

// TestPrefetchSameImageCatchesMigration: the check catches a prefetch
// that migrates the keys' old buckets ahead of the batch (knob
// prefetchMigrates): the image differs.
func TestPrefetchSameImageCatchesMigration(t *testing.T) {
	diff := prefetchDiff(t, 1, testingKnobs{prefetchMigrates: true})
	if diff == "" {
		t.Fatal("a prefetch that migrates ahead of the batch left the same image")
	}
	t.Logf("caught: %s", diff)
}

// prefetchDiff applies the same random batches to a table without
// prefetch and to one with it (and knobs), and returns the first
// difference it finds, or "".
func prefetchDiff(t *testing.T, seed uint64, knobs testingKnobs) string {
	f := mem.New(mem.Options{})
	clock := func() int64 { return 7 }
	slotMap := make([]uint32, NumHashSlots)
	for i := range slotMap {
		slotMap[i] = uint32(i % 4 / 3) // group 0 owns three slots in four
	}
	var tabs [2]*Table
	for i := range tabs {
		n, err := f.NewNode(rdma.NodeID(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		tb, err := NewTable(TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, Clock: clock, SlotMap: slotMap}, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tb.Close(); n.Close() })
		tabs[i] = tb
	}
	plain, pre := tabs[0], tabs[1]
	plain.knobs.noPrefetch = true
	pre.knobs = knobs
	rng := rand.New(rand.NewPCG(seed, 17))
	const keys = 600
	key := func() []byte { return fmt.Appendf(nil, "key-%d", rng.IntN(keys)) }
	value := func() []byte {
		if rng.IntN(4) == 0 {
			return fielded.Encode(map[string][]byte{"f" + fmt.Sprint(rng.IntN(3)): bytes.Repeat([]byte{'v'}, rng.IntN(40))})
		}
		return bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, rng.IntN(200))
	}
	op := func() Op {
		switch r := rng.IntN(20); {
		case r < 2:
			return Op{Kind: OpDelete, Key: key()}
		case r < 4:
			return Op{Kind: OpMerge, Key: key(), Value: fielded.Encode(map[string][]byte{"f1": []byte(fmt.Sprint(rng.IntN(99)))})}
		case r < 5:
			return Op{Kind: OpPut, Cmp: CmpVersion, CmpVersion: uint64(rng.IntN(2)), Key: key(), Value: value()}
		case r < 6:
			return Op{Kind: OpPut, Cmp: CmpExists, Key: key(), Value: value()}
		}
		return Op{Kind: OpPut, Key: key(), Value: value()}
	}
	message := func() []byte {
		ops := make([]Op, 1+rng.IntN(3)*rng.IntN(2))
		if rng.IntN(3) == 0 {
			ops = make([]Op, 1+rng.IntN(MaxMulti))
		}
		for i := range ops {
			ops[i] = op()
		}
		switch r := rng.IntN(30); {
		case r == 0:
			return []byte{reqFormat, 0, 9} // malformed
		case r < 12:
			return AppendMulti(nil, ops)
		}
		return AppendRequest(nil, ops)
	}
	idx := uint64(0)
	grown := 0
	for batch := range 400 {
		msgs := make([][]byte, 1+rng.IntN(12))
		for i := range msgs {
			msgs[i] = message()
		}
		alone := rng.IntN(4) == 0 // a single entry, no bracket
		if alone {
			msgs = msgs[:1]
		}
		var res [2][][]byte
		for k, tb := range tabs {
			if !alone {
				for _, m := range msgs {
					tb.Prefetch(m)
				}
				tb.BeginBatch()
			}
			for i, m := range msgs {
				r := tb.Apply(broadcast.Entry{Index: idx + uint64(i) + 1, Data: m})
				res[k] = append(res[k], append([]byte(nil), r...))
			}
			if !alone {
				tb.EndBatch()
			}
		}
		idx += uint64(len(msgs))
		for i := range msgs {
			if !bytes.Equal(res[0][i], res[1][i]) {
				return fmt.Sprintf("batch %d message %d: result %x with prefetch, %x without", batch, i, res[1][i], res[0][i])
			}
		}
		if d := imageDiff(plain, pre); d != "" {
			return fmt.Sprintf("batch %d (%d messages): %s", batch, len(msgs), d)
		}
		if plain.old != nil {
			grown++
		}
	}
	if plain.touched != 0 || pre.touched < 1000 {
		t.Fatalf("keys touched: %d without prefetch, %d with", plain.touched, pre.touched)
	}
	if plain.geometry().LogBuckets < 6 || grown == 0 || plain.Len() < keys/2 {
		t.Fatalf("the index reached log %d, %d batches while migrating, %d records: the test did not cover growth", plain.geometry().LogBuckets, grown, plain.Len())
	}
	return ""
}

func imageDiff(a, b *Table) string {
	ha, hb := a.Header(), b.Header()
	ha.Inc, hb.Inc = 0, 0 // each table's incarnation (its start time)
	switch {
	case ha != hb:
		return fmt.Sprintf("headers differ: %+v and %+v", ha, hb)
	case a.count != b.count || a.liveBytes != b.liveBytes || a.layout != b.layout || a.cursor != b.cursor:
		return fmt.Sprintf("counts differ: %d/%d/%d/%d and %d/%d/%d/%d", a.count, a.liveBytes, a.layout, a.cursor, b.count, b.liveBytes, b.layout, b.cursor)
	case a.cur.log != b.cur.log || !bytes.Equal(a.cur.mem, b.cur.mem):
		return fmt.Sprintf("current generations differ (log %d and %d)", a.cur.log, b.cur.log)
	case (a.old == nil) != (b.old == nil) || a.old != nil && !bytes.Equal(a.old.mem, b.old.mem):
		return "old generations differ"
	case len(a.heap.mems) != len(b.heap.mems) || a.heap.cur != b.heap.cur || a.heap.bump != b.heap.bump || a.heap.used != b.heap.used:
		return "heaps differ"
	}
	for i := range a.heap.mems {
		if !bytes.Equal(a.heap.mems[i], b.heap.mems[i]) {
			return fmt.Sprintf("heap region %d differs", i)
		}
	}
	diff := ""
	for _, ab := range [2][2]*heap{{&a.heap, &b.heap}, {&b.heap, &a.heap}} {
		ab[0].free.each(func(c int, l []uint64) {
			if diff == "" && !slices.Equal(l, ab[1].free.list(c)) {
				diff = fmt.Sprintf("free lists of class %d differ", c)
			}
		})
	}
	return diff
}
