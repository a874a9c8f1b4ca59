package btree

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// blindAgainstLookup applies the same random write requests to a Store
// with knobs and to one that looks every request's first key up before
// its writes (noBlindPut): requests of one put (blind: no lookup), multi
// requests of puts (each op blind), and conditional puts and deletes
// (not blind) over few keys, so that puts overwrite as often as they
// insert, in 256-byte nodes, so that they split. The two must answer
// the same results, with the same Prev, and leave the same node bytes.
func blindAgainstLookup(k testingKnobs) error {
	rng := rand.New(rand.NewPCG(5, 18))
	cfg := StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 16}, ChunkSlots: 16, FreeAfter: 8, Tablets: []Tablet{All}}
	a, err := NewStore(cfg, nil)
	if err != nil {
		return err
	}
	b, _ := NewStore(cfg, nil)
	a.knobs, b.knobs.noBlindPut = k, true
	key := func() []byte { return fmt.Appendf(nil, "k%03d", rng.IntN(300)) }
	val := func() []byte { return bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, 1+rng.IntN(12)) }
	var ra, rb []Result
	for i := range 3000 {
		var req []byte
		switch r := rng.IntN(10); {
		case r < 5:
			req = AppendRequest(nil, []Op{{Kind: OpPut, Key: key(), Value: val()}})
		case r < 8:
			ops := make([]Op, 1+rng.IntN(6))
			for j := range ops {
				ops[j] = Op{Kind: OpPut, Key: key(), Value: val()}
			}
			req = AppendMulti(nil, ops)
		case r < 9:
			req = AppendRequest(nil, []Op{{Kind: OpPut, Cmp: CmpVersion, Key: key(), Value: val()}})
		default:
			req = AppendRequest(nil, []Op{{Kind: OpDelete, Key: key()}})
		}
		index := uint64(i + 1)
		got := bytes.Clone(a.Apply(index, req))
		want := b.Apply(index, req)
		if ra, err = decodeAny(req, got, ra); err != nil {
			return err
		}
		if rb, err = decodeAny(req, want, rb); err != nil {
			return err
		}
		for j := range rb {
			if j < len(ra) && ra[j].Prev != rb[j].Prev {
				return fmt.Errorf("request %d op %d: Prev %x, the lookup's %x", i, j, ra[j].Prev, rb[j].Prev)
			}
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("request %d: result %x, the lookup's %x", i, got, want)
		}
	}
	if a.a.Slots() != b.a.Slots() {
		return fmt.Errorf("%d slots, the lookup's %d", a.a.Slots(), b.a.Slots())
	}
	for s := 1; s <= a.a.Slots(); s++ {
		if !bytes.Equal(a.a.bytes(uint32(s)), b.a.bytes(uint32(s))) {
			return fmt.Errorf("slot %d: bytes differ", s)
		}
	}
	return a.Tree().Check()
}

// decodeAny decodes req's result out: a multi result's, or one result.
func decodeAny(req, out []byte, rs []Result) ([]Result, error) {
	if IsMulti(req) {
		return DecodeMultiResult(out, rs)
	}
	r, err := DecodeResult(out)
	return append(rs[:0], r), err
}

// TestStoreBlindPut: a blind put (one unconditional put, alone or in a
// multi request) that skips the lookup before it answers the results
// and writes the node bytes of the path that looks the key up first; the
// planted blindNoPrev (the Prev of an overwrite left 0) is caught as a
// Prev that differs.
func TestStoreBlindPut(t *testing.T) {
	if err := blindAgainstLookup(testingKnobs{}); err != nil {
		t.Fatal(err)
	}
	mustCatch(t, "blindNoPrev", blindAgainstLookup(testingKnobs{blindNoPrev: true}), `Prev 0, the lookup's [0-9a-f]+$`)
}
