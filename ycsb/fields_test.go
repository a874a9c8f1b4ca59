package ycsb

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
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
		b := EncodeFields(m)
		if len(b) != EncodedSize(m) {
			t.Fatalf("%v: %d bytes, EncodedSize says %d", m, len(b), EncodedSize(m))
		}
		got, err := DecodeFields(b)
		if err != nil || !equalFields(got, m) {
			t.Fatalf("decode(encode(%v)) = %v, %v", m, got, err)
		}
		if again := EncodeFields(got); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	}
	if n := len(EncodeFields(ycsbRecord)); n != 1081 {
		t.Errorf("a YCSB record of 10 x 100 bytes takes %d bytes, the package comment says 1,081", n)
	}
	// Order of insertion does not matter: one encoding per record.
	a := EncodeFields(map[string][]byte{"x": []byte("1"), "y": []byte("2")})
	b := EncodeFields(map[string][]byte{"y": []byte("2"), "x": []byte("1")})
	if !bytes.Equal(a, b) {
		t.Fatalf("two encodings of one record: %x %x", a, b)
	}
}

func TestDecodeSelected(t *testing.T) {
	b := EncodeFields(map[string][]byte{"field0": []byte("a"), "field1": []byte("b"), "field2": []byte("c")})
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
	b := EncodeFields(map[string][]byte{"a": []byte("1"), "b": []byte("2")})
	m, err := DecodeFields(b)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(m["a"], 'X') // must not overwrite b's next bytes
	if got, err := DecodeFields(b); err != nil || string(got["b"]) != "2" {
		t.Fatalf("after an append to a decoded value: %v %v", got, err)
	}
}

func TestDecodeMalformed(t *testing.T) {
	valid := EncodeFields(map[string][]byte{"a": []byte("1"), "b": []byte("22")})
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
		if m, err := DecodeFields(tc.b); !errors.Is(err, ErrMalformed) {
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
	f.Add(EncodeFields(map[string][]byte{"field0": []byte("value"), "field1": nil}))
	f.Add([]byte{2, 1, 'a', 0, 1, 'a', 0})
	f.Add([]byte{0x81, 0x00})
	f.Add([]byte{3, 6, 'f', 'i', 'e', 'l', 'd', '0', 2, 'h', 'i'})
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := DecodeFields(data); err == nil {
			if again := EncodeFields(m); !bytes.Equal(again, data) {
				t.Fatalf("decoded %x to %v, which encodes to %x", data, m, again)
			}
			if sel, err := DecodeSelected(data, []string{"field0"}); err != nil || len(sel) > 1 {
				t.Fatalf("DecodeSelected of a valid record: %v %v", sel, err)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		x := fieldsFrom(data)
		b := EncodeFields(x)
		got, err := DecodeFields(b)
		if err != nil || !equalFields(got, x) {
			t.Fatalf("decode(encode(%v)) = %v, %v", x, got, err)
		}
	})
}
