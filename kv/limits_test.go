package kv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
)

func apply(tb *Table, idx uint64, data []byte) Result {
	res, err := DecodeResult(tb.Apply(broadcast.Entry{Index: idx, Data: data}))
	if err != nil {
		panic(err)
	}
	return res
}

// keyOf returns a key of the given length whose slot the slot map gives
// group g.
func keyOf(slots []uint32, g uint32, n int, tag string) []byte {
	for i := 0; ; i++ {
		k := fmt.Appendf(nil, "%s%d-", tag, i)
		k = append(k, bytes.Repeat([]byte("k"), max(0, n-len(k)))...)[:n]
		if slots[HashSlot(k)] == g {
			return k
		}
	}
}

// TestTableRefusesOverLimits: every limit the table enforces on a request
// (max key, max value, max request, whole or staged, max staged requests
// per client, max multi) gives a
// StatusRefused result naming the limit, its value and what the request
// had, and nothing of the request is applied: a batch is checked whole,
// also its ops on other groups' keys (so that every group refuses it), and
// a multi request's ops are refused one by one. Before the fix the table
// skipped over-limit ops and answered OK.
func TestTableRefusesOverLimits(t *testing.T) {
	slots := make([]uint32, NumHashSlots)
	for i := range slots {
		slots[i] = uint32(i % 2)
	}
	const maxKey, maxValue, maxRequest = 16, 64, 512
	tb, r := soloTable(t, TableConfig{Group: 0, SlotMap: slots, MaxKey: maxKey, MaxValue: maxValue, MaxRequest: maxRequest})
	own := keyOf(slots, 0, 8, "own")
	own2 := keyOf(slots, 0, 8, "two")
	other := keyOf(slots, 1, 8, "oth")
	longOwn := keyOf(slots, 0, maxKey+1, "lo")
	longOther := keyOf(slots, 1, maxKey+1, "lt")
	val := bytes.Repeat([]byte("v"), maxValue)
	long := bytes.Repeat([]byte("v"), maxValue+1)
	want := func(what string, got Result, limit uint8, op int, max, size int) {
		t.Helper()
		w := Result{Status: StatusRefused, Limit: limit, FailedOp: op, Max: uint64(max), Size: uint64(size)}
		if got != w {
			t.Errorf("%s: result %+v, want %+v", what, got, w)
		}
	}
	absent := func(what string, keys ...[]byte) {
		t.Helper()
		for _, k := range keys {
			g, err := r.Get(k, Linearizable)
			if err != nil || g.Found {
				t.Errorf("%s: key %q found %v (%d bytes), %v: the refused request was applied", what, k, g.Found, len(g.Value), err)
			}
		}
	}
	idx := uint64(0)
	next := func() uint64 { idx++; return idx }

	want("put of a long key", put(tb, next(), Op{Kind: OpPut, Key: longOwn, Value: []byte("v")}), LimitKey, 0, maxKey, maxKey+1)
	absent("put of a long key", longOwn)
	want("delete of a long key", put(tb, next(), Op{Kind: OpDelete, Key: longOwn}), LimitKey, 0, maxKey, maxKey+1)
	want("put of a long value", put(tb, next(), Op{Kind: OpPut, Key: own, Value: long}), LimitValue, 0, maxValue, maxValue+1)
	absent("put of a long value", own)
	want("compare-and-swap of a long value", put(tb, next(), Op{Kind: OpPut, Cmp: CmpVersion, Key: own, Value: long}), LimitValue, 0, maxValue, maxValue+1)
	absent("compare-and-swap of a long value", own)
	// A batch whose over-limit op is another group's: refused here too.
	want("batch with another group's long key", put(tb, next(),
		Op{Kind: OpPut, Key: own, Value: val}, Op{Kind: OpPut, Key: other, Value: val}, Op{Kind: OpPut, Key: longOther, Value: val}),
		LimitKey, 2, maxKey, maxKey+1)
	want("batch with another group's long value", put(tb, next(),
		Op{Kind: OpPut, Key: own, Value: val}, Op{Kind: OpPut, Key: other, Value: long}), LimitValue, 1, maxValue, maxValue+1)
	absent("batches", own)
	big := []Op{{Kind: OpPut, Key: own, Value: val}, {Kind: OpPut, Key: own2, Value: val}, {Kind: OpPut, Key: other, Value: val},
		{Kind: OpPut, Key: []byte("a"), Value: val}, {Kind: OpPut, Key: []byte("b"), Value: val}, {Kind: OpPut, Key: []byte("c"), Value: val}}
	want("batch over max_request", put(tb, next(), big...), LimitRequest, 0, maxRequest, RequestSize(big))
	absent("batch over max_request", own, own2)

	// Staged: a request over max_request is refused at its first part,
	// and nothing is staged; one within it but with a long key is refused
	// at its commit.
	id := StageID{Client: 1, Inc: 1, Stage: 1}
	req := AppendRequest(nil, big)
	want("part of a request over max_request", apply(tb, next(), AppendPart(nil, id, len(req), 0, req[:100])), LimitRequest, 0, maxRequest, len(req))
	if n, _ := tb.Staged(); n != 0 {
		t.Errorf("%d requests staged after a refused part", n)
	}
	id.Stage++
	req = AppendRequest(nil, []Op{{Kind: OpPut, Key: own, Value: val}, {Kind: OpPut, Key: longOwn, Value: val}})
	if res := apply(tb, next(), AppendPart(nil, id, len(req), 0, req)); res.Status != StatusOK {
		t.Fatalf("part: %+v", res)
	}
	want("commit of a staged request with a long key", apply(tb, next(), AppendCommit(nil, id, len(req))), LimitKey, 1, maxKey, maxKey+1)
	absent("staged request", own)

	// A client slot's staged requests beyond MaxStages evict the oldest:
	// its commit is refused naming the limit.
	var reqs [MaxStages + 1][]byte
	for i := range reqs {
		id.Stage++
		reqs[i] = AppendRequest(nil, []Op{{Kind: OpPut, Key: fmt.Appendf(nil, "st%d", i), Value: []byte("v")}})
		if res := apply(tb, next(), AppendPart(nil, id, len(reqs[i]), 0, reqs[i])); res.Status != StatusOK {
			t.Fatalf("part %d: %+v", i, res)
		}
	}
	first := id
	first.Stage -= MaxStages
	want("commit of an evicted staged request", apply(tb, next(), AppendCommit(nil, first, len(reqs[0]))), LimitStages, 0, MaxStages, len(reqs[0]))
	absent("evicted staged request", []byte("st0"))
	if res := apply(tb, next(), AppendCommit(nil, id, len(reqs[MaxStages]))); res.Status != StatusOK || res.Count != 1 {
		t.Errorf("commit of the newest staged request: %+v", res)
	}

	// A multi request: each op on its own.
	ops := []Op{{Kind: OpPut, Key: own, Value: []byte("1")}, {Kind: OpPut, Key: longOwn, Value: []byte("2")},
		{Kind: OpPut, Key: own2, Value: long}, {Kind: OpPut, Key: own2, Value: []byte("4")}}
	mi := next()
	rs, err := DecodeMultiResult(tb.Apply(broadcast.Entry{Index: mi, Data: AppendMulti(nil, ops)}), nil)
	if err != nil || len(rs) != len(ops) {
		t.Fatalf("multi result: %+v, %v", rs, err)
	}
	if rs[0].Status != StatusOK || rs[0].Version != mi<<16 || rs[3].Status != StatusOK || rs[3].Version != mi<<16|3 {
		t.Errorf("multi: the ops within the limits: %+v and %+v, want applied", rs[0], rs[3])
	}
	want("multi op 1 (long key)", rs[1], LimitKey, 0, maxKey, maxKey+1)
	want("multi op 2 (long value)", rs[2], LimitValue, 0, maxValue, maxValue+1)
	for k, v := range map[string]string{string(own): "1", string(own2): "4"} {
		if g, err := r.Get([]byte(k), Linearizable); err != nil || !g.Found || string(g.Value) != v {
			t.Errorf("multi: get %q: %q found %v, %v; want %q", k, g.Value, g.Found, err, v)
		}
	}
	absent("multi", longOwn)
	many := make([]Op, MaxMulti+1)
	for i := range many {
		many[i] = Op{Kind: OpPut, Key: fmt.Appendf(nil, "m%d", i), Value: []byte("v")}
	}
	want("multi of too many ops", apply(tb, next(), AppendMulti(nil, many)), LimitMulti, MaxMulti, MaxMulti, MaxMulti+1)
	absent("multi of too many ops", many[0].Key)
}

// TestTableRefusesWhenHeapFull: a put the heap cannot hold (every heap
// region in use) is refused naming the heap, and a batch is refused whole
// when its records do not all fit; a freed record's room is used again.
// Before the fix the table skipped the put and answered OK.
func TestTableRefusesWhenHeapFull(t *testing.T) {
	// One 1 KiB record per 2 KiB region: maxHeaps records fill the heap.
	const region = 2048
	tb, r := soloTable(t, TableConfig{MaxKey: 16, MaxValue: 1000, HeapRegionSize: region})
	val := bytes.Repeat([]byte("v"), 1000)
	key := func(i int) []byte { return fmt.Appendf(nil, "h%03d", i) }
	idx := uint64(0)
	for i := range maxHeaps {
		idx++
		if res := put(tb, idx, Op{Kind: OpPut, Key: key(i), Value: val}); res.Status != StatusOK || res.Count != 1 {
			t.Fatalf("put %d: %+v", i, res)
		}
	}
	idx++
	res := put(tb, idx, Op{Kind: OpPut, Key: key(maxHeaps), Value: val})
	if res.Status != StatusRefused || res.Limit != LimitHeap || res.Max != maxHeaps*region {
		t.Fatalf("put into a full heap: %+v, want refused (heap, %d bytes)", res, maxHeaps*region)
	}
	// One record's room freed: a batch of two puts does not fit, and is
	// refused whole (the delete in it too); one put fits.
	idx++
	if res := put(tb, idx, Op{Kind: OpDelete, Key: key(0)}); res.Status != StatusOK {
		t.Fatalf("delete: %+v", res)
	}
	idx++
	res = put(tb, idx, Op{Kind: OpDelete, Key: key(1)}, Op{Kind: OpPut, Key: []byte("x1"), Value: val}, Op{Kind: OpPut, Key: []byte("x2"), Value: val})
	if res.Status != StatusRefused || res.Limit != LimitHeap {
		t.Fatalf("batch of two puts into room for one: %+v, want refused (heap)", res)
	}
	for _, k := range [][]byte{[]byte("x1"), []byte("x2")} {
		if g, err := r.Get(k, Linearizable); err != nil || g.Found {
			t.Errorf("key %q of the refused batch: found %v, %v", k, g.Found, err)
		}
	}
	if g, err := r.Get(key(1), Linearizable); err != nil || !g.Found {
		t.Errorf("key %q deleted by the refused batch: found %v, %v", key(1), g.Found, err)
	}
	idx++
	if res := put(tb, idx, Op{Kind: OpPut, Key: []byte("x1"), Value: val}); res.Status != StatusOK || res.Count != 1 {
		t.Fatalf("put into the freed room: %+v", res)
	}
}
