package kvcheck

import (
	"strings"
	"testing"
)

func mergeOp(c int, k string, ok bool, kv ...string) Op {
	f := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		f[kv[i]] = kv[i+1]
	}
	return Op{Client: c, Kind: Merge, Key: k, Fields: f, Out: Output{OK: ok}}
}

// TestLinearizableMerge: concurrent merges of different fields both
// survive in any order; the model fails a history whose get lost a
// merged field (a merge that replaced the value: the bug a blind merge
// must not have), whose merge into a value that is not fielded reported
// OK, or whose merge that should have applied reported failure.
func TestLinearizableMerge(t *testing.T) {
	both := EncodeFields(map[string]string{"a": "1", "b": "2", "c": "0"})
	h := []Op{
		at(putOp(0, "k", EncodeFields(map[string]string{"c": "0"})), 0, 10),
		at(mergeOp(1, "k", true, "a", "1"), 20, 40),
		at(mergeOp(2, "k", true, "b", "2"), 25, 35),
		at(getOp(3, "k", true, both), 50, 60),
	}
	mustLinearizable(t, h)
	// A merge into an absent key stores the fields.
	mustLinearizable(t, []Op{
		at(mergeOp(1, "n", true, "x", "y"), 0, 10),
		at(getOp(2, "n", true, EncodeFields(map[string]string{"x": "y"})), 20, 30),
	})

	// A lost field: the get shows only the later merge's field (the
	// second merge replaced the value).
	lost := append([]Op(nil), h...)
	lost[3] = at(getOp(3, "k", true, EncodeFields(map[string]string{"b": "2"})), 50, 60)
	res := mustIllegalIn(t, lost, "k")
	if !strings.Contains(res.Err().Error(), "not linearizable") {
		t.Fatalf("error %v", res.Err())
	}
	// Nor may the one merge's field win with the other's value lost.
	lost[3] = at(getOp(3, "k", true, EncodeFields(map[string]string{"a": "1", "c": "0"})), 50, 60)
	mustIllegalIn(t, lost, "k")

	// A merge into a raw value must fail, and one into a fielded value
	// must apply.
	raw := []Op{
		at(putOp(0, "r", "raw bytes"), 0, 10),
		at(mergeOp(1, "r", true, "a", "1"), 20, 30),
	}
	mustIllegalIn(t, raw, "r")
	raw[1].Out.OK = false
	mustLinearizable(t, raw)
	h[1].Out.OK = false
	mustIllegalIn(t, h, "k")
	// A merge of unknown outcome may or may not have applied.
	h[1] = unknown(h[1])
	mustLinearizable(t, h)
	h[3] = at(getOp(3, "k", true, EncodeFields(map[string]string{"b": "2", "c": "0"})), 50, 60)
	mustLinearizable(t, h)

	// Stale gets of merged keys are skipped by CheckStale.
	if err := CheckStale([]Op{h[0], h[1], h[2], staleGet(4, "k", true, "anything", 1)}); err != nil {
		t.Fatalf("CheckStale of a merged key: %v", err)
	}
	if s := mergeOp(1, "k", true, "b", "2", "a", "1"); !strings.Contains(s.String(), `merge("k", {"a": "1", "b": "2"}) -> ok`) {
		t.Fatalf("String: %s", s.String())
	}
}
