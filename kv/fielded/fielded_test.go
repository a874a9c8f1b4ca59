package fielded

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
)

func equalFields(a, b map[string][]byte) bool {
	return maps.EqualFunc(a, b, bytes.Equal)
}

func TestFieldsRoundTrip(t *testing.T) {
	ycsbRecord := map[string][]byte{}
	for i := range 10 {
		ycsbRecord[fmt.Sprintf("field%d", i)] = bytes.Repeat([]byte{byte('a' + i)}, 100)
	}
	for _, m := range []map[string][]byte{
		{},
		{"": nil},
		{"a": {}},
		{"field0": []byte("x"), "field1": []byte("yy")},
		{"b": []byte("2"), "a": []byte("1"), "c": bytes.Repeat([]byte{0xff}, 300)},
		ycsbRecord,
	} {
		b := Encode(m)
		if len(b) != Size(m) {
			t.Fatalf("%v: %d bytes, Size says %d", m, len(b), Size(m))
		}
		got, err := Decode(b)
		if err != nil || !equalFields(got, m) {
			t.Fatalf("decode(encode(%v)) = %v, %v", m, got, err)
		}
		if again := Encode(got); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	}
	if n := len(Encode(ycsbRecord)); n != 1081 {
		t.Errorf("a YCSB record of 10 x 100 bytes takes %d bytes, the package comment says 1,081", n)
	}
	// Order of insertion does not matter: one encoding per record.
	a := Encode(map[string][]byte{"x": []byte("1"), "y": []byte("2")})
	b := Encode(map[string][]byte{"y": []byte("2"), "x": []byte("1")})
	if !bytes.Equal(a, b) {
		t.Fatalf("two encodings of one record: %x %x", a, b)
	}
}

func TestDecodeSelected(t *testing.T) {
	b := Encode(map[string][]byte{"field0": []byte("a"), "field1": []byte("b"), "field2": []byte("c")})
	got, err := DecodeSelected(b, []string{"field2", "field0", "nope"})
	want := map[string][]byte{"field0": []byte("a"), "field2": []byte("c")}
	if err != nil || !equalFields(got, want) {
		t.Fatalf("selected: %v %v, want %v", got, err, want)
	}
	if got, err := DecodeSelected(b, nil); err != nil || len(got) != 3 {
		t.Fatalf("no names: %v %v, want all 3", got, err)
	}
	// The whole record is checked even when a field is picked.
	if _, err := DecodeSelected(append(b, 0), []string{"field0"}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: %v, want ErrMalformed", err)
	}
}

func TestDecodeAliasing(t *testing.T) {
	b := Encode(map[string][]byte{"a": []byte("1"), "b": []byte("2")})
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(m["a"], 'X') // must not overwrite b's next bytes
	if got, err := Decode(b); err != nil || string(got["b"]) != "2" {
		t.Fatalf("after an append to a decoded value: %v %v", got, err)
	}
}

func TestDecodeMalformed(t *testing.T) {
	valid := Encode(map[string][]byte{"a": []byte("1"), "b": []byte("22")})
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated count", []byte{0x80}},
		{"count too large", []byte{5, 0, 0}},
		{"huge count", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"overflowing count", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
		{"non-minimal count", []byte{0x81, 0x00, 0, 0}},
		{"non-minimal length", []byte{1, 0x81, 0x00, 'a', 0}},
		{"name past the end", []byte{1, 5, 'a', 0}},
		{"value past the end", []byte{1, 1, 'a', 9, 'x'}},
		{"truncated", valid[:len(valid)-1]},
		{"trailing byte", append(append([]byte(nil), valid...), 0)},
		{"unsorted", []byte{2, 1, 'b', 0, 1, 'a', 0}},
		{"duplicate", []byte{2, 1, 'a', 0, 1, 'a', 0}},
	} {
		if m, err := Decode(tc.b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s (%x): %v %v, want ErrMalformed", tc.name, tc.b, m, err)
		}
	}
}

// fieldsFrom builds a record from arbitrary bytes: each field is a name
// and a value whose lengths are the next two bytes (mod 8 and mod 64).
func fieldsFrom(data []byte) map[string][]byte {
	m := map[string][]byte{}
	for len(data) >= 2 {
		nl, vl := int(data[0]%8), int(data[1]%64)
		data = data[2:]
		nl = min(nl, len(data))
		name := string(data[:nl])
		data = data[nl:]
		vl = min(vl, len(data))
		m[name] = data[:vl]
		data = data[vl:]
	}
	return m
}

// FuzzDecodeFields: decoding arbitrary bytes never panics, and either
// fails or gives fields whose encoding is those bytes; and
// decode(encode(x)) == x for records built from the input.
func FuzzDecodeFields(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add(Encode(map[string][]byte{"field0": []byte("value"), "field1": nil}))
	f.Add([]byte{2, 1, 'a', 0, 1, 'a', 0})
	f.Add([]byte{0x81, 0x00})
	f.Add([]byte{3, 6, 'f', 'i', 'e', 'l', 'd', '0', 2, 'h', 'i'})
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := Decode(data); err == nil {
			if again := Encode(m); !bytes.Equal(again, data) {
				t.Fatalf("decoded %x to %v, which encodes to %x", data, m, again)
			}
			if sel, err := DecodeSelected(data, []string{"field0"}); err != nil || len(sel) > 1 {
				t.Fatalf("DecodeSelected of a valid record: %v %v", sel, err)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		x := fieldsFrom(data)
		b := Encode(x)
		got, err := Decode(b)
		if err != nil || !equalFields(got, x) {
			t.Fatalf("decode(encode(%v)) = %v, %v", x, got, err)
		}
	})
}

// refMerge is the reference merge: maps.
func refMerge(cur, upd map[string][]byte) map[string][]byte {
	out := maps.Clone(cur)
	if out == nil {
		out = map[string][]byte{}
	}
	maps.Copy(out, upd)
	return out
}

func TestMerge(t *testing.T) {
	for _, tc := range []struct{ cur, upd map[string][]byte }{
		{map[string][]byte{}, map[string][]byte{}},
		{map[string][]byte{"a": []byte("1")}, map[string][]byte{}},
		{map[string][]byte{}, map[string][]byte{"a": []byte("1")}},
		{map[string][]byte{"a": []byte("1"), "c": []byte("3")}, map[string][]byte{"b": []byte("2")}},
		{map[string][]byte{"a": []byte("1"), "b": []byte("old")}, map[string][]byte{"b": []byte("new"), "z": nil}},
		{map[string][]byte{"field0": bytes.Repeat([]byte("x"), 200)}, map[string][]byte{"field0": nil, "": []byte("e")}},
	} {
		got, err := Merge([]byte("prefix"), Encode(tc.cur), Encode(tc.upd))
		want := append([]byte("prefix"), Encode(refMerge(tc.cur, tc.upd))...)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Merge(%q, %q) = %x, %v; want %x", tc.cur, tc.upd, got, err, want)
		}
	}
	valid := Encode(map[string][]byte{"a": nil})
	for _, bad := range [][]byte{nil, {}, {2, 1, 'b', 0, 1, 'a', 0}, append(append([]byte(nil), valid...), 0)} {
		if _, err := Merge(nil, bad, valid); !errors.Is(err, ErrMalformed) {
			t.Errorf("Merge(cur %x): %v, want ErrMalformed", bad, err)
		}
		if _, err := Merge(nil, valid, bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Merge(upd %x): %v, want ErrMalformed", bad, err)
		}
		if err := Valid(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Valid(%x): %v, want ErrMalformed", bad, err)
		}
	}
}

// FuzzMergeFields: Merge of two fielded values is the encoding of the
// reference map merge; Merge and Valid agree with Decode on arbitrary
// bytes and never panic.
func FuzzMergeFields(f *testing.F) {
	f.Add([]byte{}, []byte{})
	f.Add([]byte{1, 1, 'a', 1, 'b'}, []byte{2, 1, 'a', 0, 1, 'c'})
	f.Add([]byte{0}, []byte{0})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		cur, upd := fieldsFrom(a), fieldsFrom(b)
		got, err := Merge(nil, Encode(cur), Encode(upd))
		if want := Encode(refMerge(cur, upd)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Merge(%q, %q) = %x, %v; want %x", cur, upd, got, err, want)
		}
		_, derrA := Decode(a)
		_, derrB := Decode(b)
		if (Valid(a) == nil) != (derrA == nil) {
			t.Fatalf("Valid(%x) = %v, Decode: %v", a, Valid(a), derrA)
		}
		m, err := Merge(nil, a, b)
		if (err == nil) != (derrA == nil && derrB == nil) {
			t.Fatalf("Merge(%x, %x): %v; Decode: %v, %v", a, b, err, derrA, derrB)
		}
		if err == nil {
			ca, _ := Decode(a)
			cb, _ := Decode(b)
			if want := Encode(refMerge(ca, cb)); !bytes.Equal(m, want) {
				t.Fatalf("Merge(%x, %x) = %x, want %x", a, b, m, want)
			}
		}
	})
}

// FuzzSelector: a Selector reused over records decodes each exactly as
// DecodeSelected does (the same map, or an error wrapping ErrMalformed
// where it fails), for any names, with or without duplicates or order,
// and any bytes, also after a record with other field names.
func FuzzSelector(f *testing.F) {
	rec := map[string][]byte{}
	for i := range 10 {
		rec[fmt.Sprintf("field%d", i)] = bytes.Repeat([]byte{byte('a' + i)}, 100)
	}
	f.Add(Encode(rec), "field3,field0,nope,field3")
	f.Add(Encode(rec), "")
	f.Add([]byte{2, 1, 'a', 0, 1, 'b', 0}, "b,a")
	f.Add([]byte{2, 1, 'b', 0, 1, 'a', 0}, "a")
	f.Add(append(Encode(rec), 0), "field1")
	f.Fuzz(func(t *testing.T, data []byte, list string) {
		var names []string
		if list != "" {
			names = strings.Split(list, ",")
		}
		s := NewSelector(names)
		other := Encode(fieldsFrom(data))
		for i, b := range [][]byte{data, other, data, Encode(rec), data} {
			want, werr := DecodeSelected(b, names)
			got, err := s.Decode(b)
			if (werr == nil) != (err == nil) || err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("record %d %x, names %q: Selector %v, DecodeSelected %v", i, b, names, err, werr)
			}
			if err == nil && !equalFields(got, want) {
				t.Fatalf("record %d %x, names %q: Selector %v, DecodeSelected %v", i, b, names, got, want)
			}
		}
	})
}

var sink map[string][]byte

// tenFields is a record of 10 fields of 100 bytes (YCSB's shape),
// encoded, and its field names in order.
func tenFields() ([]string, []byte) {
	rec := map[string][]byte{}
	names := []string{}
	for i := range 10 {
		names = append(names, fmt.Sprintf("field%d", i))
		rec[names[i]] = bytes.Repeat([]byte{byte('a' + i)}, 100)
	}
	return names, Encode(rec)
}

// TestSelectorAllocations: decoding a scan's records through one Selector
// allocates only each record's map (what a map of that many fields with
// keys already held costs), not a string per field name, with every field
// and with a few named.
func TestSelectorAllocations(t *testing.T) {
	names, b := tenFields()
	for _, sel := range [][]string{nil, names, {"field7", "field2"}} {
		n := len(names)
		if sel != nil {
			n = len(sel)
		}
		mapOnly := testing.AllocsPerRun(100, func() {
			m := make(map[string][]byte, n)
			for _, name := range names[:n] {
				m[name] = b
			}
			sink = m // escapes, as a decoded record does
		})
		s := NewSelector(sel)
		got := testing.AllocsPerRun(100, func() {
			if _, err := s.Decode(b); err != nil {
				t.Fatal(err)
			}
		})
		old := testing.AllocsPerRun(100, func() {
			if _, err := DecodeSelected(b, sel); err != nil {
				t.Fatal(err)
			}
		})
		if got > mapOnly {
			t.Errorf("names %q: %v allocations per record, a map of %d fields alone takes %v (DecodeSelected: %v)", sel, got, n, mapOnly, old)
		}
		t.Logf("names %q: Selector %v allocations per record, DecodeSelected %v", sel, got, old)
	}
}

// TestMergeAllocations: a replica's merge of a YCSB update (one field of
// 100 bytes into a record of 10) into a dst with room allocates nothing
// (the field names were once compared as strings.Compare(string(a),
// string(b)), two heap copies a step: 28 allocations a merge).
func TestMergeAllocations(t *testing.T) {
	rec := map[string][]byte{}
	for i := range 10 {
		rec[fmt.Sprintf("field%d", i)] = bytes.Repeat([]byte{byte('a' + i)}, 100)
	}
	cur := Encode(rec)
	upd := Encode(map[string][]byte{"field3": bytes.Repeat([]byte{'z'}, 100), "field31": nil})
	dst := make([]byte, 0, 2*len(cur))
	if n := testing.AllocsPerRun(100, func() {
		if _, err := Merge(dst[:0], cur, upd); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Merge: %v allocations, want 0", n)
	}
}

// TestDecodeAllocations: DecodeSelected of every field of a 10-field
// record allocates the map and a string per field name, nothing for the
// check of the names' order.
func TestDecodeAllocations(t *testing.T) {
	names, b := tenFields()
	mapOnly := testing.AllocsPerRun(100, func() {
		m := make(map[string][]byte, len(names))
		for _, name := range names {
			m[name] = b
		}
		sink = m
	})
	got := testing.AllocsPerRun(100, func() {
		if _, err := DecodeSelected(b, nil); err != nil {
			t.Fatal(err)
		}
	})
	if want := mapOnly + float64(len(names)); got > want {
		t.Errorf("DecodeSelected: %v allocations, want at most %v (the map: %v, and a name each)", got, want, mapOnly)
	}
}
