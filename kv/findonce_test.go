package kv

import (
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
)

// TestApplyFindsOnce: a request of one op, and every op of a multi
// request (each applied as a request of one op), looks its key up in the
// index once: the condition check's lookup is the write's (issue 17: the
// second lookup was 13-21% of a replica's CPU at 64 writers). Requests of
// several ops still look each key up again for the write (an earlier op
// may have grown the index). The table must still hold what a map holds,
// while the index grows and migrates under the puts.
func TestApplyFindsOnce(t *testing.T) {
	tb, r := soloTable(t, TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
	model := map[string]string{}
	idx := uint64(0)
	const keys = 300
	for round := range 6 {
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			val := fmt.Sprintf("v%d-%d", round, k)
			idx++
			before := tb.finds
			var res Result
			switch {
			case round%3 == 2 && k%7 == 0:
				res = put(tb, idx, Op{Kind: OpDelete, Key: []byte(key)})
				delete(model, key)
			case round%2 == 1:
				rs, err := DecodeMultiResult(tb.Apply(broadcast.Entry{Index: idx, Data: AppendMulti(nil, []Op{{Kind: OpPut, Key: []byte(key), Value: []byte(val)}})}), nil)
				if err != nil || len(rs) != 1 {
					t.Fatalf("multi put %s: %v %v", key, rs, err)
				}
				res = rs[0]
				model[key] = val
			default:
				res = put(tb, idx, Op{Kind: OpPut, Key: []byte(key), Value: []byte(val)})
				model[key] = val
			}
			if res.Status != StatusOK {
				t.Fatalf("request %d on %s: %+v", idx, key, res)
			}
			if n := tb.finds - before; n != 1 {
				t.Fatalf("request %d (round %d) on %s: %d index lookups, want 1", idx, round, key, n)
			}
		}
	}
	if tb.geometry().LogBuckets <= 2 {
		t.Fatalf("the index never grew (log %d): the test did not cover migration", tb.geometry().LogBuckets)
	}
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		g, err := r.Get([]byte(key), Linearizable)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		want, ok := model[key]
		if g.Found != ok || string(g.Value) != want {
			t.Fatalf("get %s: found %v %q, want %v %q", key, g.Found, g.Value, ok, want)
		}
	}
	// Several ops: each key is looked up for the check and again for the
	// write.
	idx++
	before := tb.finds
	if res := put(tb, idx, Op{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}, Op{Kind: OpPut, Key: []byte("b"), Value: []byte("2")}); res.Status != StatusOK {
		t.Fatalf("two puts: %+v", res)
	}
	if n := tb.finds - before; n != 4 {
		t.Fatalf("a request of two ops: %d lookups, want 4", n)
	}
}
