package kv

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv/fielded"
)

func enc(kv ...string) []byte {
	m := map[string][]byte{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = []byte(kv[i+1])
	}
	return fielded.Encode(m)
}

func merge(key string, fields []byte) Op { return Op{Kind: OpMerge, Key: []byte(key), Value: fields} }

// TestTableMerge: OpMerge sets the named fields of a key's fielded value
// and keeps the others; an absent key takes the fields; a value that is
// not a fielded value fails the request (StatusCondFailed, nothing
// applied); a merged value over MaxValue is refused (LimitValue, the
// merged size); a merge sees the request's earlier ops on its key, in a
// request and in a multi request; versions and Prev are a put's.
func TestTableMerge(t *testing.T) {
	tb, r := soloTable(t, TableConfig{MaxValue: 64})
	get := func(k string) ([]byte, uint64, bool) {
		t.Helper()
		g, err := r.Get([]byte(k), Linearizable)
		if err != nil {
			t.Fatal(err)
		}
		return g.Value, g.Version, g.Found
	}
	want := func(k string, v []byte) {
		t.Helper()
		got, _, ok := get(k)
		if !ok || !bytes.Equal(got, v) {
			t.Fatalf("%s = %x (found %v), want %x", k, got, ok, v)
		}
	}

	// Absent: the fields.
	res := put(tb, 1, merge("a", enc("f1", "x", "f0", "y")))
	if res.Status != StatusOK || res.Version != 1<<16 || res.Prev != 0 || res.Count != 1 {
		t.Fatalf("merge into absent: %+v", res)
	}
	want("a", enc("f0", "y", "f1", "x"))
	// Fields replaced and added, others kept.
	res = put(tb, 2, merge("a", enc("f1", "X", "f2", "z")))
	if res.Status != StatusOK || res.Version != 2<<16 || res.Prev != 1<<16 {
		t.Fatalf("merge: %+v", res)
	}
	want("a", enc("f0", "y", "f1", "X", "f2", "z"))

	// Not a fielded value: refused, nothing written.
	put(tb, 3, Op{Kind: OpPut, Key: []byte("raw"), Value: []byte("not fielded")})
	res = put(tb, 4, Op{Kind: OpPut, Key: []byte("b"), Value: []byte("1")}, merge("raw", enc("f", "v")))
	if res.Status != StatusCondFailed || res.FailedOp != 1 {
		t.Fatalf("merge into a raw value: %+v, want StatusCondFailed at op 1", res)
	}
	want("raw", []byte("not fielded"))
	if _, _, ok := get("b"); ok {
		t.Fatal("the request's other op was applied")
	}
	// An empty value is not a fielded value either (no fields is 0x00).
	put(tb, 5, Op{Kind: OpPut, Key: []byte("empty"), Value: []byte{}})
	if res := put(tb, 6, merge("empty", enc("f", "v"))); res.Status != StatusCondFailed || res.Prev != 5<<16 {
		t.Fatalf("merge into an empty value: %+v", res)
	}

	// Over MaxValue after the merge: refused with the merged size.
	big := string(bytes.Repeat([]byte("v"), 45)) // 45 bytes alone fit, merged not
	res = put(tb, 7, merge("a", enc("big", big)))
	if res.Status != StatusRefused || res.Limit != LimitValue || res.Max != 64 || res.Size != uint64(len(enc("f0", "y", "f1", "X", "f2", "z", "big", big))) {
		t.Fatalf("merge over max_value: %+v", res)
	}
	want("a", enc("f0", "y", "f1", "X", "f2", "z"))

	// Earlier ops of the request on the key: a put, a delete, a merge.
	res = put(tb, 8, Op{Kind: OpPut, Key: []byte("c"), Value: enc("p", "1")}, merge("c", enc("q", "2")), merge("c", enc("p", "3")))
	if res.Status != StatusOK || res.Count != 3 {
		t.Fatalf("put, merge, merge: %+v", res)
	}
	want("c", enc("p", "3", "q", "2"))
	put(tb, 9, Op{Kind: OpDelete, Key: []byte("c")}, merge("c", enc("r", "4")))
	want("c", enc("r", "4"))
	res = put(tb, 10, Op{Kind: OpPut, Key: []byte("c"), Value: []byte("raw")}, merge("c", enc("r", "4")))
	if res.Status != StatusCondFailed || res.FailedOp != 1 {
		t.Fatalf("merge after a raw put in one request: %+v", res)
	}
	want("c", enc("r", "4"))

	// A multi request: each merge on its own, seeing the ones before.
	out := tb.Apply(broadcast.Entry{Index: 11, Data: AppendMulti(nil, []Op{
		merge("d", enc("a", "1")), merge("raw", enc("a", "1")), merge("d", enc("b", "2")),
	})})
	rs, err := DecodeMultiResult(out, nil)
	if err != nil || len(rs) != 3 || rs[0].Status != StatusOK || rs[1].Status != StatusCondFailed || rs[2].Status != StatusOK || rs[2].Prev != 11<<16 {
		t.Fatalf("multi: %+v %v", rs, err)
	}
	want("d", enc("a", "1", "b", "2"))

	// CmpExists: a merge (or a put) only if the key has a value; a
	// failed one's Prev is 0.
	exists := func(k string, fields []byte) Op {
		return Op{Kind: OpMerge, Cmp: CmpExists, Key: []byte(k), Value: fields}
	}
	if res := put(tb, 12, exists("nobody", enc("a", "1"))); res.Status != StatusCondFailed || res.Prev != 0 {
		t.Fatalf("merge if exists of an absent key: %+v", res)
	}
	if _, _, ok := get("nobody"); ok {
		t.Fatal("a merge if exists created the key")
	}
	if res := put(tb, 13, exists("d", enc("c", "3"))); res.Status != StatusOK || res.Prev != 11<<16|2 {
		t.Fatalf("merge if exists: %+v", res)
	}
	want("d", enc("a", "1", "b", "2", "c", "3"))
	if res := put(tb, 14, exists("raw", enc("c", "3"))); res.Status != StatusCondFailed || res.Prev != 3<<16 {
		t.Fatalf("merge if exists into a raw value: %+v", res)
	}
	if res := put(tb, 15, Op{Kind: OpPut, Cmp: CmpExists, Key: []byte("nobody"), Value: []byte("v")}); res.Status != StatusCondFailed {
		t.Fatalf("put if exists of an absent key: %+v", res)
	}

	// A merge whose fields are not a fielded value, or with another
	// condition, does not decode.
	for _, op := range []Op{merge("e", []byte("junk")), {Kind: OpMerge, Cmp: CmpVersion, Key: []byte("e"), Value: enc()},
		{Kind: OpMerge, Cmp: CmpExists, CmpVersion: 1, Key: []byte("e"), Value: enc()}} {
		if res := put(tb, 16, op); res.Status != StatusMalformed {
			t.Fatalf("%+v: %+v, want StatusMalformed", op, res)
		}
	}
}

// FuzzMerge: a sequence of puts, deletes and merges (single requests and
// requests of several ops, as opsFrom-like bytes give them) applied to a
// table gives, key by key, what a reference Go map of field maps gives;
// a merge into a value that is not fielded fails its request and changes
// nothing.
func FuzzMerge(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{2, 0, 3, 1, 2, 0, 5, 5, 2, 1, 0, 0, 2, 0})
	f.Add(bytes.Repeat([]byte{2, 7, 1}, 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		tb, r := soloTable(t, TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 200})
		type val struct {
			raw    []byte // not nil: a value that is not fielded
			fields map[string][]byte
		}
		model := map[string]val{}
		keys := []string{"k0", "k1", "k2"}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		fieldsOf := func() map[string][]byte {
			m := map[string][]byte{}
			for range int(next() % 4) {
				m[fmt.Sprintf("f%d", next()%5)] = bytes.Repeat([]byte{next()}, int(next()%12))
			}
			return m
		}
		encode := func(v val) []byte {
			if v.raw != nil {
				return v.raw
			}
			return fielded.Encode(v.fields)
		}
		for idx := uint64(1); len(data) > 0; idx++ {
			nops := 1 + int(next()%3)
			var ops []Op
			after := maps.Clone(model) // the model after the request, if it applies
			ok, limit := true, false
			for range nops {
				k := keys[int(next())%len(keys)]
				switch next() % 4 {
				case 0:
					ops = append(ops, Op{Kind: OpDelete, Key: []byte(k)})
					delete(after, k)
				case 1:
					v := val{fields: fieldsOf()}
					ops = append(ops, Op{Kind: OpPut, Key: []byte(k), Value: fielded.Encode(v.fields)})
					after[k] = v
				case 2:
					v := val{raw: []byte{0xff, next()}} // never a fielded value
					ops = append(ops, Op{Kind: OpPut, Key: []byte(k), Value: v.raw})
					after[k] = v
				default:
					upd := fieldsOf()
					ops = append(ops, merge(k, fielded.Encode(upd)))
					cur, found := after[k]
					switch {
					case !found:
						after[k] = val{fields: upd}
					case cur.raw != nil:
						ok = false
					default:
						m := maps.Clone(cur.fields)
						maps.Copy(m, upd)
						after[k] = val{fields: m}
						if len(fielded.Encode(m)) > 200 {
							limit = true
						}
					}
				}
			}
			res := put(tb, idx, ops...)
			switch {
			case !ok:
				if res.Status != StatusCondFailed {
					t.Fatalf("request %d %+v: %+v, want StatusCondFailed", idx, ops, res)
				}
			case limit:
				if res.Status != StatusRefused || res.Limit != LimitValue {
					t.Fatalf("request %d %+v: %+v, want a max_value refusal", idx, ops, res)
				}
			default:
				if res.Status != StatusOK {
					t.Fatalf("request %d %+v: %+v", idx, ops, res)
				}
				model = after
			}
			for _, k := range keys {
				g, err := r.Get([]byte(k), Linearizable)
				if err != nil {
					t.Fatal(err)
				}
				v, found := model[k]
				if g.Found != found || found && !bytes.Equal(g.Value, encode(v)) {
					t.Fatalf("after request %d (%+v): %s = %x (found %v), want %x (found %v)", idx, ops, k, g.Value, g.Found, encode(v), found)
				}
			}
		}
	})
}

// TestMergeAllocs: applying a merge request (decode, merge, put)
// allocates nothing in the steady state, as a put does.
func TestMergeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	tb, _ := soloTable(t, TableConfig{})
	put(tb, 1, Op{Kind: OpPut, Key: []byte("k"), Value: enc("a", "1", "b", "2", "c", "3")})
	reqs := [][]byte{
		AppendRequest(nil, []Op{merge("k", enc("b", "x"))}),
		AppendRequest(nil, []Op{merge("k", enc("b", "y", "d", "4"))}),
		AppendMulti(nil, []Op{merge("k", enc("a", "z")), merge("k", enc("e", "5"))}),
	}
	idx := uint64(2)
	for range 50 { // warm the scratch buffers and the heap's free lists
		tb.Apply(broadcast.Entry{Index: idx, Data: reqs[idx%3]})
		idx++
	}
	if n := testing.AllocsPerRun(200, func() {
		tb.Apply(broadcast.Entry{Index: idx, Data: reqs[idx%3]})
		idx++
	}); n != 0 {
		t.Fatalf("%.1f allocations per merge apply, want 0", n)
	}
}
