package opwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var errBad = errors.New("bad")

// TestRoundTrip: what AppendRequestHeader and AppendOp write, the decoder
// reads back (header fields, parts of their lengths, capacity cut), at
// Size bytes an op; nothing trails.
func TestRoundTrip(t *testing.T) {
	type op struct {
		kind, cmp, space byte
		cver             uint64
		key, val, cv     []byte
	}
	ops := []op{{1, 2, 1, 7, []byte("key"), []byte("12345678"), []byte("x")}, {9, 0, 0, 0, nil, nil, nil}, {3, 3, 0, 1 << 60, []byte("k"), nil, []byte("123456789")}}
	b := AppendRequestHeader([]byte("pre"), 5, 1, len(ops))
	want := len("pre") + ReqHdr
	for _, o := range ops {
		b = AppendOp(b, o.kind, o.cmp, o.space, o.cver, o.key, o.val, o.cv)
		want += Size(o.key, o.val, o.cv)
	}
	if len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	d, n, err := NewDecoder(b[3:], 5, 1, errBad)
	if err != nil || n != len(ops) {
		t.Fatalf("NewDecoder: %d ops, %v", n, err)
	}
	for i, o := range ops {
		h, err := d.Header()
		if err != nil || h.Kind != o.kind || h.Cmp != o.cmp || h.Space != o.space || h.Pad != 0 || h.CmpVersion != o.cver {
			t.Fatalf("op %d header %+v, %v", i, h, err)
		}
		k, v, c, err := d.Parts(h)
		if err != nil || !bytes.Equal(k, o.key) || !bytes.Equal(v, o.val) || !bytes.Equal(c, o.cv) || cap(k) != len(k) || cap(v) != len(v) || cap(c) != len(c) {
			t.Fatalf("op %d parts %q %q %q, %v", i, k, v, c, err)
		}
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
}

// TestMalformed: each way a request breaks the layout is an error
// wrapping the decoder's, naming what broke.
func TestMalformed(t *testing.T) {
	good := AppendOp(AppendRequestHeader(nil, 1, 0, 1), 1, 0, 0, 0, []byte("k"), []byte("v"), nil)
	badPad := bytes.Clone(good)
	badPad[ReqHdr+OpHdr+1] = 1
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", good[:3], "bad"},
		{"format", append([]byte{2}, good[1:]...), "bad"},
		{"flags", append([]byte{1, 1}, good[2:]...), "bad"},
		{"no ops", AppendRequestHeader(nil, 1, 0, 0), "no operations"},
		{"truncated header", good[:ReqHdr+OpHdr-1], "truncated"},
		{"truncated part", good[:len(good)-1], "truncated"},
		{"padding", badPad, "padding not zero"},
		{"trailing", append(bytes.Clone(good), 0), "1 trailing bytes"},
	} {
		err := walk(c.b)
		if !errors.Is(err, errBad) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if err := walk(good); err != nil {
		t.Fatal(err)
	}
}

func walk(b []byte) error {
	d, n, err := NewDecoder(b, 1, 0, errBad)
	if err != nil {
		return err
	}
	for range n {
		h, err := d.Header()
		if err != nil {
			return err
		}
		if _, _, _, err := d.Parts(h); err != nil {
			return err
		}
	}
	return d.End()
}
