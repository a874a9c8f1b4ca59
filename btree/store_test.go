package btree

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	tb "github.com/tidwall/btree"

	"github.com/rdmakv/rdmakv/kv/fielded"
)

// model is the sequential ordered map a Store must agree with.
type model struct {
	m tb.Map[string, mval]
}

type mval struct {
	v   string
	ver uint64
}

// apply is the model's answer to a write request at index.
func (md *model) apply(index uint64, ops []Op) Result { return md.applyAt(index, 0, ops) }

// applyAt is apply with op i at version index<<16 | (base+i) (an op of a
// multi request is a request of its own at its position).
func (md *model) applyAt(index uint64, base int, ops []Op) Result {
	var res Result
	if v, ok := md.m.Get(string(ops[0].Key)); ok {
		res.Prev = v.ver
	}
	// Merges against the state as the earlier ops leave it (first, as
	// kv does), then the conditions against the state before.
	vals := make([]*string, len(ops))
	for i := range ops {
		op := &ops[i]
		if op.Kind != OpMerge {
			continue
		}
		var cur string
		found := false
		earlier := false
		for j := i - 1; j >= 0; j-- {
			if bytes.Equal(ops[j].Key, op.Key) {
				earlier = true
				if ops[j].Kind != OpDelete {
					found = true
					if vals[j] != nil {
						cur = *vals[j]
					} else {
						cur = string(ops[j].Value)
					}
				}
				break
			}
		}
		if !earlier {
			v, ok := md.m.Get(string(op.Key))
			found, cur = ok, v.v
		}
		nv := string(op.Value)
		if found {
			b, err := fielded.Merge(nil, []byte(cur), op.Value)
			if err != nil {
				r := Result{Status: StatusCondFailed, FailedOp: i}
				if i == 0 {
					r.Prev = res.Prev
				}
				return r
			}
			nv = string(b)
		}
		vals[i] = &nv
	}
	for i := range ops {
		op := &ops[i]
		v, found := md.m.Get(string(op.Key))
		ok := true
		switch op.Cmp {
		case CmpVersion:
			ok = op.CmpVersion == 0 && !found || op.CmpVersion != 0 && found && v.ver == op.CmpVersion
		case CmpValue:
			ok = op.CmpVersion == 1 && !found || op.CmpVersion != 1 && found && v.v == string(op.CmpValue)
		case CmpExists:
			ok = found
		}
		if !ok {
			res.Status, res.FailedOp = StatusCondFailed, i
			return res
		}
	}
	for i := range ops {
		op := &ops[i]
		ver := index<<16 | uint64(base+i)
		if res.Count == 0 {
			res.Version = ver
		}
		res.Count++
		switch op.Kind {
		case OpPut:
			md.m.Set(string(op.Key), mval{string(op.Value), ver})
		case OpMerge:
			md.m.Set(string(op.Key), mval{*vals[i], ver})
		case OpDelete:
			md.m.Delete(string(op.Key))
		}
	}
	return res
}

func (md *model) scan(start, end string, limit int) []Pair {
	var out []Pair
	md.m.Ascend(start, func(k string, v mval) bool {
		if end != "" && k >= end || limit > 0 && len(out) >= limit {
			return false
		}
		out = append(out, Pair{Key: []byte(k), Value: []byte(v.v), Version: v.ver})
		return true
	})
	return out
}

func samePairs(a, b []Pair) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d pairs, want %d", len(a), len(b))
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Version != b[i].Version {
			return fmt.Errorf("pair %d: %q=%q@%x, want %q=%q@%x", i, a[i].Key, a[i].Value, a[i].Version, b[i].Key, b[i].Value, b[i].Version)
		}
	}
	return nil
}

// randOps is a random write request over nkeys keys.
func randOps(rng *rand.Rand, nkeys int, md *model, valMax int) []Op {
	key := func() []byte { return fmt.Appendf(nil, "k%03d", rng.IntN(nkeys)) }
	val := func() []byte { return bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, 1+rng.IntN(valMax)) }
	n := 1
	if rng.IntN(4) == 0 {
		n = 2 + rng.IntN(3)
	}
	var ops []Op
	for range n {
		k := key()
		switch r := rng.IntN(20); {
		case r < 9:
			ops = append(ops, Op{Kind: OpPut, Key: k, Value: val()})
		case r < 14:
			ops = append(ops, Op{Kind: OpDelete, Key: k})
		case r < 16:
			op := Op{Kind: OpPut, Cmp: CmpValue, Key: k, Value: val()}
			if v, ok := md.m.Get(string(k)); ok && rng.IntN(2) == 0 {
				op.CmpValue = []byte(v.v)
			} else if rng.IntN(2) == 0 {
				op.CmpVersion = 1
			} else {
				op.CmpValue = []byte("nope")
			}
			ops = append(ops, op)
		case r < 18:
			op := Op{Kind: OpPut, Cmp: CmpVersion, Key: k, Value: val()}
			if v, ok := md.m.Get(string(k)); ok && rng.IntN(2) == 0 {
				op.CmpVersion = v.ver
			}
			ops = append(ops, op)
		default:
			v := val()
			f := map[string][]byte{fmt.Sprintf("f%d", rng.IntN(3)): v[:min(len(v), 1+rng.IntN(4))]}
			op := Op{Kind: OpMerge, Key: k, Value: fielded.Encode(f)}
			if rng.IntN(3) == 0 {
				op.Cmp = CmpExists
			}
			ops = append(ops, op)
		}
	}
	return ops
}

// TestStoreMetamorphic applies random requests (through their encoding)
// to a Store and to a sorted map, over several node sizes, and requires
// the same results, reads and scans, with Check holding throughout.
func TestStoreMetamorphic(t *testing.T) {
	for _, ns := range []int{256, 512, 1024, 4096} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("node%d/seed%d", ns, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(ns)))
				cfg := StoreConfig{Tree: Config{NodeSize: ns, MaxKey: 16}, ChunkSlots: 16, FreeAfter: 8, MaxResult: 1 << 20, Tablets: []Tablet{All}}
				s, err := NewStore(cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				md := &model{}
				nkeys := 50 + rng.IntN(400)
				valMax := min(40, s.cfg.Tree.MaxInline()/2)
				for i := range 1500 {
					index := uint64(i + 1)
					if rng.IntN(10) == 0 {
						start := fmt.Sprintf("k%03d", rng.IntN(nkeys))
						end := ""
						if rng.IntN(2) == 0 {
							end = start + "5"
						}
						limit := rng.IntN(3) * rng.IntN(30)
						out := s.Apply(index, AppendRequest(nil, []Op{{Kind: OpScan, Key: []byte(start), Value: []byte(end), CmpVersion: uint64(limit)}}))
						r, err := DecodeReadResult(out)
						if err != nil || r.Status != StatusOK || r.More || r.Index != index {
							t.Fatalf("op %d: scan: %+v %v", i, r, err)
						}
						if err := samePairs(r.Pairs, md.scan(start, end, limit)); err != nil {
							t.Fatalf("op %d: scan [%q, %q) limit %d: %v", i, start, end, limit, err)
						}
						continue
					}
					ops := randOps(rng, nkeys, md, valMax)
					want := md.apply(index, ops)
					got, err := DecodeResult(s.Apply(index, AppendRequest(nil, ops)))
					if err != nil || got != want {
						t.Fatalf("op %d (%d ops): result %+v (%v), model %+v", i, len(ops), got, err, want)
					}
					if i%50 == 0 {
						if err := s.Tree().Check(); err != nil {
							t.Fatalf("op %d: %v", i, err)
						}
					}
				}
				if err := s.Tree().Check(); err != nil {
					t.Fatal(err)
				}
				if err := samePairs(storePairs(s), md.scan("", "", 0)); err != nil {
					t.Fatal(err)
				}
				// Restore of its snapshot into another store: the same
				// entries, a tree that checks.
				s2, _ := NewStore(cfg, nil)
				commit, err := s2.Restore(s.Snapshot())
				if err != nil {
					t.Fatal(err)
				}
				commit(1500)
				if err := s2.Tree().Check(); err != nil {
					t.Fatalf("restored: %v", err)
				}
				if err := samePairs(storePairs(s2), md.scan("", "", 0)); err != nil {
					t.Fatalf("restored: %v", err)
				}
				// Restore over the store itself (its slots reused).
				commit, err = s.Restore(s2.Snapshot())
				if err != nil {
					t.Fatal(err)
				}
				commit(1500)
				if err := s.Tree().Check(); err != nil {
					t.Fatalf("restored over itself: %v", err)
				}
				if err := samePairs(storePairs(s), md.scan("", "", 0)); err != nil {
					t.Fatalf("restored over itself: %v", err)
				}
			})
		}
	}
}

func storePairs(s *Store) []Pair {
	var out []Pair
	s.Tree().ascend(nil, func(e Entry) bool {
		out = append(out, Pair{Key: bytes.Clone(e.Key), Value: bytes.Clone(e.Value), Version: e.Version})
		return true
	})
	return out
}

// TestStoreOwnership: a group owning no tablet refuses every ordered write
// and read with StatusMoved and applies nothing; the planted
// skipOwnerCheck applies them.
func TestStoreOwnership(t *testing.T) {
	for _, plant := range []bool{false, true} {
		s, err := NewStore(StoreConfig{Tablets: []Tablet{{Low: []byte("m"), High: []byte("t")}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if plant {
			s.knobs.skipOwnerCheck = true
		}
		r, _ := DecodeResult(s.Apply(1, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("n"), Value: []byte("1")}, {Kind: OpPut, Key: []byte("a"), Value: []byte("2")}})))
		if !plant && (r.Status != StatusMoved || r.FailedOp != 1 || s.Tree().Len() != 0) {
			t.Fatalf("a request with an unowned key: %+v, %d keys applied", r, s.Tree().Len())
		}
		if plant && (r.Status != StatusOK || s.Tree().Len() != 2) {
			t.Fatalf("planted skipOwnerCheck: %+v, %d keys", r, s.Tree().Len())
		}
		rr, _ := DecodeReadResult(s.Apply(2, AppendRequest(nil, []Op{{Kind: OpScan, Key: []byte("n")}})))
		if rr.Status != StatusMoved {
			t.Fatalf("a scan past the tablet's end: %+v", rr)
		}
		rr, _ = DecodeReadResult(s.Apply(3, AppendRequest(nil, []Op{{Kind: OpScan, Key: []byte("n"), Value: []byte("p")}})))
		if rr.Status != StatusOK {
			t.Fatalf("a scan inside the tablet: %+v", rr)
		}
		r, _ = DecodeResult(s.Apply(4, AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("o"), Value: []byte("1")}, {Kind: OpDelete, Key: []byte("p"), Hashed: true}})))
		if r.Status != StatusMixed || r.FailedOp != 1 {
			t.Fatalf("a mixed request: %+v", r)
		}
		rr, _ = DecodeReadResult(s.Apply(5, AppendRequest(nil, []Op{{Kind: OpGet, Key: []byte("o"), Hashed: true}})))
		if rr.Status != StatusMixed {
			t.Fatalf("a read of a hashed key: %+v", rr)
		}
	}
}

// TestStoreGrace: an unlinked leaf's slot is released only FreeAfter
// entries after its unlinking, and until then holds the dead node; the
// planted freeAtOnce releases it at once and fails the check.
func TestStoreGrace(t *testing.T) {
	for _, plant := range []bool{false, true} {
		const grace = 20
		s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, FreeAfter: grace, Tablets: []Tablet{All}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.knobs.freeAtOnce = plant
		idx := uint64(0)
		apply := func(ops ...Op) {
			idx++
			if r, _ := DecodeResult(s.Apply(idx, AppendRequest(nil, ops))); r.Status != StatusOK {
				t.Fatalf("entry %d: %+v", idx, r)
			}
		}
		for i := range 60 {
			apply(Op{Kind: OpPut, Key: fmt.Appendf(nil, "k%03d", i), Value: []byte("vvvvvvvvvvvvvvvv")})
		}
		if s.Tree().Stats().Leaves < 3 {
			t.Fatal("too few leaves")
		}
		// Empty the last leaf: it is merged into its left sibling.
		var last []byte
		s.Tree().Ascend(nil, func(k, _ []byte) bool { last = bytes.Clone(k); return true })
		leaves := s.Tree().Stats().Leaves
		freed := uint64(0)
		var dead NodeID
		for i := 59; i >= 0 && s.Tree().Stats().Leaves == leaves; i-- {
			path := s.Tree().descend(fmt.Appendf(nil, "k%03d", i))
			dead = path[len(path)-1]
			apply(Op{Kind: OpDelete, Key: fmt.Appendf(nil, "k%03d", i)})
			freed = idx
		}
		_ = last
		err = func() error {
			if s.Pending() != 1 || s.a.Free() != 0 {
				return fmt.Errorf("after the merge at entry %d: %d pending, %d free", freed, s.Pending(), s.a.Free())
			}
			for idx < freed+grace-1 {
				apply(Op{Kind: OpPut, Key: []byte("a"), Value: []byte("x")})
				if s.a.Free() != 0 {
					return fmt.Errorf("slot released at entry %d, %d entries after its unlinking (grace %d)", idx, idx-freed, grace)
				}
				n, err := Decode(s.a.Bytes(dead.Slot()), dead)
				if err != nil || !n.Dead {
					return fmt.Errorf("entry %d: the unlinked node reads %+v, %v (want it dead)", idx, n.ID, err)
				}
			}
			apply(Op{Kind: OpPut, Key: []byte("a"), Value: []byte("y")})
			if s.a.Free() != 1 || s.Pending() != 0 {
				return fmt.Errorf("entry %d: %d free, %d pending after the grace", idx, s.a.Free(), s.Pending())
			}
			return nil
		}()
		if plant {
			if err == nil || !strings.Contains(err.Error(), "pending") {
				t.Fatalf("planted freeAtOnce not caught: %v", err)
			}
			t.Logf("planted freeAtOnce caught: %v", err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Tree().Check(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStoreFull: with a bounded arena, puts are refused (LimitHeap) once
// the arena might not hold their splits, with nothing applied, and the
// tree stays whole; deletes still apply.
func TestStoreFull(t *testing.T) {
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 4, MaxChunks: 3, Tablets: []Tablet{All}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := &model{}
	refused := 0
	for i := range 400 {
		ops := []Op{{Kind: OpPut, Key: fmt.Appendf(nil, "k%03d", i), Value: []byte("0123456789abcdef")}, {Kind: OpPut, Key: fmt.Appendf(nil, "j%03d", i), Value: []byte("x")}}
		r, _ := DecodeResult(s.Apply(uint64(i+1), AppendRequest(nil, ops)))
		switch r.Status {
		case StatusOK:
			md.apply(uint64(i+1), ops)
		case StatusRefused:
			if r.Limit != LimitHeap {
				t.Fatalf("refused %+v", r)
			}
			refused++
		default:
			t.Fatalf("put %d: %+v", i, r)
		}
	}
	if refused == 0 {
		t.Fatal("an arena of 11 slots never filled")
	}
	if s.a.Slots() > 11 {
		t.Fatalf("%d slots, bound 11", s.a.Slots())
	}
	if err := s.Tree().Check(); err != nil {
		t.Fatal(err)
	}
	if err := samePairs(storePairs(s), md.scan("", "", 0)); err != nil {
		t.Fatalf("after refusals: %v", err)
	}
	r, _ := DecodeResult(s.Apply(1000, AppendRequest(nil, []Op{{Kind: OpDelete, Key: []byte("k000")}})))
	if r.Status != StatusOK {
		t.Fatalf("a delete in a full arena: %+v", r)
	}
}

// TestStoreScanBound: a scan whose pairs exceed MaxResult stops there and
// says so; the rest is reached by scanning on.
func TestStoreScanBound(t *testing.T) {
	s, err := NewStore(StoreConfig{Tree: Config{NodeSize: 512, MaxKey: 8}, MaxResult: 512, Tablets: []Tablet{All}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		s.Apply(uint64(i+1), AppendRequest(nil, []Op{{Kind: OpPut, Key: fmt.Appendf(nil, "k%03d", i), Value: []byte("0123456789")}}))
	}
	var got []string
	start := []byte{}
	for range 100 {
		out := s.Apply(200, AppendRequest(nil, []Op{{Kind: OpScan, Key: start}}))
		if len(out) > 512 {
			t.Fatalf("a result of %d bytes", len(out))
		}
		r, err := DecodeReadResult(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Pairs {
			got = append(got, string(p.Key))
		}
		if !r.More {
			break
		}
		start = append(bytes.Clone(r.Pairs[len(r.Pairs)-1].Key), 0)
	}
	if len(got) != 100 || got[0] != "k000" || got[99] != "k099" {
		t.Fatalf("scanned %d keys", len(got))
	}
}
