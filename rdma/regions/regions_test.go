package regions

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestDisjoint checks that the layers' ranges of neighbouring groups, the
// client range and the reserved range never overlap.
func TestDisjoint(t *testing.T) {
	type span struct {
		name   string
		lo, hi uint64 // [lo, hi)
	}
	var spans []span
	spans = append(spans, span{"reserved", 0, uint64(Client(0))}, span{"clients", uint64(Client(0)), uint64(Client(MaxClient)) + 1})
	for _, g := range []uint32{0, 1, 2, 1000, uint32(MaxGroup)} {
		spans = append(spans,
			span{"broadcast", uint64(Broadcast(g)), uint64(Broadcast(g)) + BroadcastIDs},
			span{"btree", uint64(BTree(g)), uint64(BTree(g)) + BTreeIDs},
			span{"multicast", uint64(Multicast(g)), uint64(Multicast(g)) + MulticastIDs},
			span{"kv", uint64(KV(g)), uint64(KV(g)) + KVIDs})
	}
	for i, a := range spans {
		if a.hi > 1<<32 {
			t.Fatalf("%s range [%#x,%#x) leaves the 32-bit id space", a.name, a.lo, a.hi)
		}
		for _, b := range spans[i+1:] {
			if a.lo < b.hi && b.lo < a.hi {
				t.Errorf("%s [%#x,%#x) overlaps %s [%#x,%#x)", a.name, a.lo, a.hi, b.name, b.lo, b.hi)
			}
		}
	}
	if BroadcastIDs < 255+5 {
		t.Errorf("broadcast has %d ids, a group of 255 members needs 260", BroadcastIDs)
	}
	if Broadcast(0) <= rdma.RegionID(0x1000+260) {
		t.Errorf("group 0 overlaps broadcast's single-group default")
	}
}

func TestOutOfRangePanics(t *testing.T) {
	for name, f := range map[string]func(){
		"group":  func() { Group(uint32(MaxGroup) + 1) },
		"client": func() { Client(MaxClient + 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s beyond its range did not panic", name)
				}
			}()
			f()
		}()
	}
}
