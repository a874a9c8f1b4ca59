package kv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/internal/reuse"
)

// TestRestoreScratchReused: tables that restore through one scratch pool
// (as a process's replicas built one after another do) each hold exactly
// their own snapshot's records: a large snapshot, then a smaller one of
// other keys and values into the same (dirty) buffers, then the large one
// again, every key read back by stale-ok and linearizable gets, the keys
// of the other snapshot absent, and the later Restores lent the buffers
// of the earlier ones.
func TestRestoreScratchReused(t *testing.T) {
	build := func(prefix string, n int) []byte {
		src, _ := soloTable(t, TableConfig{})
		for i := range n {
			put(src, uint64(i+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "%s-%06d", prefix, i), Value: fmt.Appendf(nil, "%s-value-%d", prefix, i)})
		}
		return snapshotOf(t, src)
	}
	const big, small = 12000, 3000
	snaps := []struct {
		prefix, other string
		n             int
		snap          []byte
	}{{"a", "b", big, build("a", big)}, {"b", "a", small, build("b", small)}, {"a", "b", big, nil}}
	snaps[2].snap = snaps[0].snap
	pool := reuse.New(3)
	for k, s := range snaps {
		tb, r := soloTable(t, TableConfig{Scratch: pool})
		if err := tb.Restore(s.snap); err != nil {
			t.Fatalf("restore %d: %v", k, err)
		}
		if tb.Len() != s.n {
			t.Fatalf("restore %d: %d records, want %d", k, tb.Len(), s.n)
		}
		for i := 0; i < s.n; i += 7 {
			key := fmt.Appendf(nil, "%s-%06d", s.prefix, i)
			for _, mode := range []Consistency{StaleOK, Linearizable} {
				g, err := r.Get(key, mode)
				if err != nil || !g.Found || !bytes.Equal(g.Value, fmt.Appendf(nil, "%s-value-%d", s.prefix, i)) {
					t.Fatalf("restore %d: get %s (%v): found %v value %q err %v", k, key, mode, g.Found, g.Value, err)
				}
			}
		}
		if g, err := r.Get(fmt.Appendf(nil, "%s-%06d", s.other, 5), StaleOK); err != nil || g.Found {
			t.Fatalf("restore %d: a key of the other snapshot: found %v err %v", k, g.Found, err)
		}
	}
	if reused, fresh := pool.Stats(); fresh != 3 || reused != 6 {
		t.Fatalf("scratch: %d Gets reused a buffer and %d allocated, want 6 and 3 (the first Restore's three buffers lent to the next two)", reused, fresh)
	}
}
