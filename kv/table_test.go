package kv

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// soloTable is a table on node 1 served as the leader of epoch 5 of a
// one-member group, read by node 2.
func soloTable(t testing.TB, cfg TableConfig) (*Table, *GroupReader) {
	t.Helper()
	f := mem.New(mem.Options{})
	n1, _ := f.NewNode(1)
	n2, _ := f.NewNode(2)
	cfg.Readers = []rdma.NodeID{2}
	tb, err := NewTable(cfg, n1)
	if err != nil {
		t.Fatal(err)
	}
	tb.Promise(5)
	tb.SetServing(5)
	r := NewGroupReader(n2, cfg.Group, []rdma.NodeID{1}, 0)
	t.Cleanup(func() { r.Close(); tb.Close(); n1.Close(); n2.Close() })
	return tb, r
}

func put(tb *Table, idx uint64, ops ...Op) Result {
	res, err := DecodeResult(tb.Apply(broadcast.Entry{Index: idx, Data: AppendRequest(nil, ops)}))
	if err != nil {
		panic(err)
	}
	return res
}

func TestTableAgainstMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  TableConfig
		vmax int
	}{
		{"small-grows", TableConfig{LogBuckets: 2, MigrateStep: 1, HeapRegionSize: 1 << 16, MaxValue: 1 << 10}, 40},
		{"default", TableConfig{}, 200},
		{"large-values", TableConfig{LogBuckets: 3, MaxValue: 1 << 20}, 300 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, r := soloTable(t, tc.cfg)
			rng := rand.New(rand.NewPCG(1, 2))
			model := map[string]string{}
			n := 3000
			if tc.vmax > 1000 {
				n = 200
			}
			for i := 1; i <= n; i++ {
				k := fmt.Sprintf("key-%d", rng.IntN(n/2))
				if rng.IntN(4) == 0 {
					put(tb, uint64(i), Op{Kind: OpDelete, Key: []byte(k)})
					delete(model, k)
				} else {
					v := make([]byte, rng.IntN(tc.vmax))
					for j := range v {
						v[j] = byte(rng.Uint32())
					}
					put(tb, uint64(i), Op{Kind: OpPut, Key: []byte(k), Value: v})
					model[k] = string(v)
				}
				if i%7 == 0 || i == n {
					for q := 0; q < 3; q++ {
						k := fmt.Sprintf("key-%d", rng.IntN(n/2))
						for _, mode := range []Consistency{Linearizable, StaleOK} {
							g, err := r.Get([]byte(k), mode)
							if err != nil {
								t.Fatalf("get %s: %v", k, err)
							}
							want, ok := model[k]
							if g.Found != ok || string(g.Value) != want {
								t.Fatalf("op %d get %s (%v): found %v (%d bytes), want %v (%d bytes)", i, k, mode, g.Found, len(g.Value), ok, len(want))
							}
						}
					}
				}
			}
			if tb.Len() != len(model) {
				t.Fatalf("table has %d records, model %d", tb.Len(), len(model))
			}
			t.Logf("stats %+v", tb.Stats())
		})
	}
}
