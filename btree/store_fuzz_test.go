package btree

import (
	"bytes"
	"encoding/binary"
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
	// A section with a garbage range (a dropped tablet's keys, not all
	// deleted yet: garbage.go).
	gt := Tablet{Low: []byte("d"), High: []byte("f")}
	s, _ = NewStore(StoreConfig{Tree: cfg.Tree, Tablets: []Tablet{{Low: []byte("b"), High: []byte("d")}, gt}, GarbageStep: 1}, nil)
	for i, k := range []string{"c", "d1", "d2", "e"} {
		s.Apply(uint64(i+1), AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte(k), Value: []byte("x")}}))
	}
	s.Publish(4)
	s.Apply(5, AppendCtl(nil, &Ctl{Cmd: CtlFreeze, To: 1, Gen: 1, Tablet: gt}))
	s.Publish(5)
	s.Apply(6, AppendCtl(nil, &Ctl{Cmd: CtlDrop, To: 1, Gen: 1, Tablet: gt}))
	if _, n := s.Garbage(); n != 2 {
		f.Fatalf("the garbage seed holds %d garbage keys", n)
	}
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
		if err := s.CheckKeys(); err != nil {
			t.Fatal(err)
		}
		got := s.Snapshot()
		if bytes.Equal(got, b) {
			return
		}
		if len(b) < 8 || binary.LittleEndian.Uint64(b) != snapMagic1 {
			t.Fatalf("restored %x, which snapshots as %x", b, got)
		}
		// A section of the first layout (btsnap1) is upgraded: it
		// snapshots in the current layout, which restores to itself,
		// with the same entries.
		s2, _ := NewStore(cfg, nil)
		commit2, err := s2.Restore(got)
		if err != nil {
			t.Fatalf("the upgrade %x of %x does not restore: %v", got, b, err)
		}
		commit2(9)
		if again := s2.Snapshot(); !bytes.Equal(again, got) {
			t.Fatalf("the upgrade %x of %x snapshots as %x", got, b, again)
		}
		var e1, e2 []Entry
		s.Tree().ascend(nil, func(e Entry) bool { e1 = append(e1, e); return true })
		s2.Tree().ascend(nil, func(e Entry) bool { e2 = append(e2, e); return true })
		if fmt.Sprint(e1) != fmt.Sprint(e2) {
			t.Fatalf("the upgrade of %x holds %v, the first layout %v", b, e2, e1)
		}
	})
}

// FuzzMulti: DecodeMulti never panics, fails only with
// ErrMalformedRequest, accepts only writes and re-encodes what it accepts
// to the same bytes; a store applying any bytes of the multi form answers
// one result per op it accepted (at most MaxMulti), the whole message
// refused with LimitMulti (more), or StatusMalformed (bytes it refused),
// and keeps a tree that checks; DecodeMultiResult accepts only a header
// and its results, which re-encode to the same bytes.
func FuzzMulti(f *testing.F) {
	f.Add(AppendMulti(nil, []Op{{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}, {Kind: OpDelete, Cmp: CmpVersion, Key: []byte("b"), CmpVersion: 7}}))
	f.Add(AppendMulti(nil, []Op{{Kind: OpPut, Cmp: CmpValue, Key: []byte("c"), Value: []byte("2"), CmpValue: []byte("1")}, {Kind: OpPut, Key: []byte("z")}, {Kind: OpPut, Key: []byte("h"), Hashed: true}}))
	f.Add(AppendMulti(nil, []Op{{Kind: OpMerge, Key: []byte("m"), Value: fielded.Encode(map[string][]byte{"f": []byte("v")})}}))
	f.Add(AppendMulti(nil, []Op{{Kind: OpGet, Key: []byte("a")}}))
	f.Add([]byte{RequestFormat, FlagMulti, 0, 0})
	mres := appendMultiHeader(nil, 2)
	mres = AppendResult(mres, &Result{Status: StatusOK, Count: 1, Version: 7 << 16})
	mres = AppendResult(mres, &Result{Status: StatusRefused, Limit: LimitKey, Max: 8, Size: 9})
	f.Add(mres)
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := DecodeMulti(b, nil)
		if err != nil {
			if !errors.Is(err, ErrMalformedRequest) {
				t.Fatalf("error %v is not ErrMalformedRequest", err)
			}
		} else {
			for i := range ops {
				if ops[i].Kind == OpGet || ops[i].Kind == OpScan {
					t.Fatalf("accepted a read (op %d of %d)", i, len(ops))
				}
			}
			if len(ops) == 0 {
				t.Fatal("accepted a multi request of no ops")
			}
			if enc := AppendMulti(nil, ops); !bytes.Equal(enc, b) {
				t.Fatalf("decoded %+v from %x, which encodes to %x", ops, b, enc)
			}
		}
		s, serr := NewStore(StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 4, MaxChunks: 4, Tablets: []Tablet{{Low: []byte("a"), High: []byte("n")}}}, nil)
		if serr != nil {
			t.Fatal(serr)
		}
		if IsMulti(b) {
			out := s.Apply(1, b)
			switch {
			case err != nil:
				if r, rerr := DecodeResult(out); rerr != nil || r.Status != StatusMalformed {
					t.Fatalf("refused bytes answered %x (%+v, %v), want StatusMalformed", out, r, rerr)
				}
			case len(ops) > MaxMulti:
				if r, rerr := DecodeResult(out); rerr != nil || r.Status != StatusRefused || r.Limit != LimitMulti {
					t.Fatalf("%d ops answered %x (%+v, %v), want LimitMulti", len(ops), out, r, rerr)
				}
			default:
				rs, rerr := DecodeMultiResult(out, nil)
				if rerr != nil || len(rs) != len(ops) {
					t.Fatalf("%d ops answered %d results (%v)", len(ops), len(rs), rerr)
				}
			}
			if err := s.Tree().Check(); err != nil {
				t.Fatal(err)
			}
		}
		if rs, err := DecodeMultiResult(b, nil); err == nil {
			enc := appendMultiHeader(nil, len(rs))
			for i := range rs {
				enc = AppendResult(enc, &rs[i])
			}
			if !bytes.Equal(enc, b) {
				t.Fatalf("multi result %x re-encodes as %x", b, enc)
			}
		} else if !errors.Is(err, ErrMalformedRequest) {
			t.Fatalf("DecodeMultiResult error %v is not ErrMalformedRequest", err)
		}
	})
}
