package btree

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/kv/fielded"
)

// FuzzRequest: DecodeRequest never panics, fails only with
// ErrMalformedRequest, and what it accepts encodes back to the same bytes;
// a store applying any bytes never panics and keeps a tree that checks.
func FuzzRequest(f *testing.F) {
	for _, ops := range [][]Op{
		{{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}},
		{{Kind: OpDelete, Key: []byte("abcdefghi")}},
		{{Kind: OpPut, Cmp: CmpValue, Key: []byte("a"), Value: []byte("2"), CmpValue: []byte("1")}, {Kind: OpDelete, Key: []byte("b"), Cmp: CmpExists}},
		{{Kind: OpPut, Cmp: CmpVersion, Key: []byte("a"), CmpVersion: 5 << 16}},
		{{Kind: OpMerge, Key: []byte("m"), Value: fielded.Encode(map[string][]byte{"f": []byte("v")})}},
		{{Kind: OpGet, Key: []byte("a")}},
		{{Kind: OpScan, Key: nil, Value: []byte("z"), CmpVersion: 10}},
		{{Kind: OpScan, Key: []byte("b")}},
		{{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}, {Kind: OpPut, Key: []byte("h"), Hashed: true}},
	} {
		f.Add(AppendRequest(nil, ops))
	}
	f.Add([]byte{RequestFormat, 0, 0, 0})
	f.Add([]byte{RequestFormat, 0, 1, 0, OpGet, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := DecodeRequest(b, nil)
		if err != nil {
			if !errors.Is(err, ErrMalformedRequest) {
				t.Fatalf("error %v is not ErrMalformedRequest", err)
			}
		} else if enc := AppendRequest(nil, ops); !bytes.Equal(enc, b) {
			t.Fatalf("decoded %+v from %x, which encodes to %x", ops, b, enc)
		}
		s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 4, MaxChunks: 4, Tablets: []Tablet{{Low: []byte("a"), High: []byte("n")}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			out := s.Apply(uint64(i+1), b)
			if len(out) < resSize {
				t.Fatalf("a result of %d bytes", len(out))
			}
		}
		if err := s.Tree().Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzReadResult: DecodeReadResult never panics, and what it accepts is a
// header and pairs that encode back to the same bytes.
func FuzzReadResult(f *testing.F) {
	f.Add(appendPair(appendReadHeader(nil, StatusOK, 0, false, 1, 7), []byte("k"), []byte("v"), 7<<16))
	f.Add(appendReadHeader(nil, StatusMoved, 0, false, 0, 9))
	f.Add(appendPair(appendPair(appendReadHeader(nil, StatusOK, 0, true, 2, 3), []byte("a"), nil, 1), []byte("bcdefghij"), []byte("0123456789"), 2))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReadResult(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedRequest) {
				t.Fatalf("error %v", err)
			}
			return
		}
		enc := appendReadHeader(nil, r.Status, r.FailedOp, r.More, len(r.Pairs), r.Index)
		for _, p := range r.Pairs {
			enc = appendPair(enc, p.Key, p.Value, p.Version)
		}
		if !bytes.Equal(enc, b) {
			t.Fatalf("decoded %+v from %x, which encodes to %x", r, b, enc)
		}
	})
}

// FuzzSnapshot: Restore of any bytes never panics; a section it refuses
// leaves the store as it was; one it accepts installs exactly its entries
// in a tree that checks, whose own snapshot is the same bytes.
func FuzzSnapshot(f *testing.F) {
	cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 4, MaxChunks: 8, Tablets: []Tablet{All}}
	for _, n := range []int{0, 1, 5, 40} {
		s, _ := NewStore(cfg, nil)
		for i := range n {
			s.Apply(uint64(i+1), AppendRequest(nil, []Op{{Kind: OpPut, Key: fmt.Appendf(nil, "k%02d", i), Value: []byte("value")}}))
		}
		f.Add(s.Snapshot())
	}
	s, _ := NewStore(StoreConfig{Tree: cfg.Tree, Tablets: []Tablet{{Low: []byte("b"), High: []byte("d")}}}, nil)
	s.Apply(1, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("c"), Value: []byte("x")}}))
	f.Add(s.Snapshot())
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := NewStore(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(1, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("before"), Value: []byte("1")}}))
		before := s.Snapshot()
		commit, err := s.Restore(b)
		if err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v is not ErrSnapshot", err)
			}
			if !bytes.Equal(s.Snapshot(), before) {
				t.Fatal("a refused section changed the store")
			}
			return
		}
		commit(9)
		if err := s.Tree().Check(); err != nil {
			t.Fatal(err)
		}
		if got := s.Snapshot(); !bytes.Equal(got, b) {
			t.Fatalf("restored %x, which snapshots as %x", b, got)
		}
	})
}
