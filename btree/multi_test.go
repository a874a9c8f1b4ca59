package btree

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// multiRun applies random multi requests (through their encoding) to a
// Store owning the tablet [k000, k300) and to the model, each op of a
// message as a request of its own at its position, and returns the first
// disagreement. Messages hold 1..MaxMulti independent writes (puts,
// deletes, both compare-and-swaps, merges; a quarter on the previous op's
// key) with, mixed in, ops that fail
// on their own: a key outside the tablet (StatusMoved), a key over MaxKey
// (StatusRefused, LimitKey), an op on the hashed keyspace (StatusMixed),
// a failed condition. Now and then a message of MaxMulti+1 ops, refused
// whole (LimitMulti, nothing applied).
func multiRun(knobs testingKnobs, ns int, seed uint64, messages int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	rng := rand.New(rand.NewPCG(seed, uint64(ns)+7))
	cfg := StoreConfig{Tree: Config{NodeSize: ns, MaxKey: 16}, ChunkSlots: 16, FreeAfter: 8,
		Tablets: []Tablet{{Low: []byte("k000"), High: []byte("k300")}}}
	s, serr := NewStore(cfg, nil)
	if serr != nil {
		return serr
	}
	s.knobs = knobs
	s.t.knobs.keepDescentMemo = knobs.keepDescentMemo
	md := &model{}
	const nkeys = 330 // k300..k329 lie outside the tablet
	valMax := min(40, s.cfg.Tree.MaxInline()/2)
	statuses := map[uint8]int{}
	for i := range messages {
		index := uint64(i + 1)
		n := 1 + rng.IntN(MaxMulti)
		if rng.IntN(30) == 0 {
			n = MaxMulti + 1
		}
		var ops []Op
		for len(ops) < n {
			op := randOps(rng, nkeys, md, valMax)[0]
			if len(ops) > 0 && rng.IntN(4) == 0 && op.Cmp != CmpVersion && op.Cmp != CmpValue {
				op.Key = ops[len(ops)-1].Key // the same key again
			}
			switch rng.IntN(25) {
			case 0:
				op.Key = []byte("k0" + strings.Repeat("x", 15)) // in the tablet
			case 1:
				if op.Kind != OpMerge && op.Cmp != CmpExists {
					op.Hashed = true
				}
			}
			ops = append(ops, op)
		}
		out := s.Apply(index, AppendMulti(nil, ops))
		if n > MaxMulti {
			r, err := DecodeResult(out)
			want := Result{Status: StatusRefused, Limit: LimitMulti, FailedOp: MaxMulti, Max: MaxMulti, Size: uint64(n)}
			if err != nil || r != want {
				return fmt.Errorf("message %d of %d ops: result %+v (%v), want the whole message refused %+v", i, n, r, err, want)
			}
			continue
		}
		rs, err := DecodeMultiResult(out, nil)
		if err != nil {
			return fmt.Errorf("message %d: %v", i, err)
		}
		if len(rs) != n {
			return fmt.Errorf("message %d: %d results for %d ops", i, len(rs), n)
		}
		for j := range ops {
			op := &ops[j]
			var want Result
			switch {
			case op.Hashed:
				want = Result{Status: StatusMixed}
			case !cfg.Tablets[0].Contains(op.Key):
				want = Result{Status: StatusMoved}
			case len(op.Key) > cfg.Tree.MaxKey:
				want = refusedRes(LimitKey, 0, cfg.Tree.MaxKey, len(op.Key))
			default:
				want = md.applyAt(index, j, ops[j:j+1])
			}
			statuses[want.Status]++
			if rs[j] != want {
				return fmt.Errorf("message %d, op %d of %d (%+v): result %+v, want %+v (the op applied alone at its position)", i, j, n, *op, rs[j], want)
			}
		}
		if i%40 == 0 {
			if err := s.Tree().Check(); err != nil {
				return fmt.Errorf("message %d: %v", i, err)
			}
		}
	}
	if err := s.Tree().Check(); err != nil {
		return err
	}
	if err := samePairs(storePairs(s), md.scan("", "", 0)); err != nil {
		return fmt.Errorf("the tree after %d messages: %v", messages, err)
	}
	for _, st := range []uint8{StatusOK, StatusCondFailed, StatusRefused, StatusMoved, StatusMixed} {
		if statuses[st] == 0 {
			return fmt.Errorf("no op got status %d (%v): the run does not cover it", st, statuses)
		}
	}
	return nil
}

// TestStoreMulti: a multi request's ops are applied independently, in
// order, each as a request of that one op at its position, and each gets
// its own result, whatever its neighbours' (TestStoreMetamorphic's model
// decides each), over several node sizes and seeds.
func TestStoreMulti(t *testing.T) {
	singleNoRace(t)
	for _, ns := range []int{256, 1024, 4096} {
		for seed := range uint64(3) {
			if err := multiRun(testingKnobs{}, ns, seed, 300); err != nil {
				t.Fatalf("node size %d, seed %d: %v", ns, seed, err)
			}
		}
	}
}

// TestStoreMultiMutant: the planted shiftMultiResults (each op applied
// once, but handed its neighbour's result) is caught by the per-op
// comparison of multiRun.
func TestStoreMultiMutant(t *testing.T) {
	err := multiRun(testingKnobs{shiftMultiResults: true}, 1024, 0, 300)
	if err == nil || !strings.Contains(err.Error(), "the op applied alone at its position") {
		t.Fatalf("shiftMultiResults not caught by the per-op results: %v", err)
	}
}

// TestMultiDecode: the multi form's encoding and its refusals. A multi
// request is not an atomic request and the other way round; a read in a
// multi request, an empty one, and a multi result that is not a header
// and its results are malformed.
func TestMultiDecode(t *testing.T) {
	ops := []Op{{Kind: OpPut, Key: []byte("a"), Value: []byte("1")}, {Kind: OpDelete, Cmp: CmpVersion, Key: []byte("b"), CmpVersion: 9}}
	b := AppendMulti(nil, ops)
	if len(b) != RequestSize(ops) || b[0] != RequestFormat || b[1] != FlagMulti || !IsMulti(b) {
		t.Fatalf("multi request % x (RequestSize %d)", b, RequestSize(ops))
	}
	if got, err := DecodeMulti(b, nil); err != nil || len(got) != 2 || !bytes.Equal(got[1].Key, []byte("b")) || got[1].CmpVersion != 9 {
		t.Fatalf("DecodeMulti: %+v %v", got, err)
	}
	if _, err := DecodeRequest(b, nil); !errors.Is(err, ErrMalformedRequest) {
		t.Errorf("DecodeRequest of a multi request: %v", err)
	}
	if _, err := DecodeMulti(AppendRequest(nil, ops), nil); !errors.Is(err, ErrMalformedRequest) {
		t.Errorf("DecodeMulti of an atomic request: %v", err)
	}
	for name, bad := range map[string][]byte{
		"a read":      AppendMulti(nil, []Op{{Kind: OpGet, Key: []byte("a")}}),
		"a scan":      AppendMulti(nil, []Op{ops[0], {Kind: OpScan, Key: []byte("a")}}),
		"no ops":      {RequestFormat, FlagMulti, 0, 0},
		"flags 2":     append([]byte{RequestFormat, 2}, b[2:]...),
		"truncated":   b[:len(b)-1],
		"trailing":    append(bytes.Clone(b), 0),
		"stray value": AppendMulti(nil, []Op{{Kind: OpDelete, Key: []byte("a"), Value: []byte("x")}}),
	} {
		if _, err := DecodeMulti(bad, nil); !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("DecodeMulti of %s: %v, want ErrMalformedRequest", name, err)
		}
		s, _ := NewStore(StoreConfig{Tablets: []Tablet{All}}, nil)
		if r, err := DecodeResult(s.Apply(1, bad)); err != nil || r.Status != StatusMalformed || s.Tree().Len() != 0 {
			t.Errorf("Apply of %s: %+v %v (%d keys), want StatusMalformed and nothing applied", name, r, err, s.Tree().Len())
		}
	}
	for name, bad := range map[string][]byte{
		"short":          {StatusOK, 0, 1, 0},
		"no results":     appendMultiHeader(nil, 0),
		"count too high": append(appendMultiHeader(nil, 2), make([]byte, resSize)...),
		"not OK":         append([]byte{StatusCondFailed, 0, 1, 0, 0, 0, 0, 0}, make([]byte, resSize)...),
		"whole refusal":  AppendResult(nil, &Result{Status: StatusMalformed}),
	} {
		if _, err := DecodeMultiResult(bad, nil); !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("DecodeMultiResult of %s: %v, want ErrMalformedRequest", name, err)
		}
	}
}

// TestDescentMemoMutant: the writer's memo of its last descent (a lookup
// and the write of the same key descend once) must end at every node
// write; the planted keepDescentMemo keeps it across splits, and the run
// against the model catches it (a write into a leaf that no longer holds
// the key, or a lookup there).
func TestDescentMemoMutant(t *testing.T) {
	err := multiRun(testingKnobs{keepDescentMemo: true}, 256, 0, 300)
	if err == nil {
		t.Fatal("keepDescentMemo not caught")
	}
	t.Logf("caught: %v", err)
}
