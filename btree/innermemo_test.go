package btree

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestInnerMemo: the writer's memos of its inner nodes (innermemo.go)
// give the child the node itself gives (Node.ChildFor) for every key
// probed, after every put of a load that splits inner nodes: ascending
// keys (each separator added after the parent's last key, where a new
// key need not share the node's prefix) and random ones, with keys alike
// for more than 8 bytes past their common prefix (the memo's ties). The
// planted memoKeepOnWrite (a memo kept across its node's write) and
// memoAddAnyKey (a separator without the prefix added to the memo) and
// memoLowIgnored (a key between a first key without the prefix and the
// prefix taken as below every key) must each be caught as a memo that
// disagrees with its node.
func TestInnerMemo(t *testing.T) {
	run := func(t *testing.T, knobs testingKnobs) (bad string) {
		cfg := Config{NodeSize: 512, MaxKey: 24}
		tr, err := New(cfg, NewArena(cfg.NodeSize, 64, nil), 1)
		if err != nil {
			t.Fatal(err)
		}
		tr.knobs = knobs
		rng := rand.New(rand.NewPCG(3, 4))
		var keys [][]byte
		mk := func(i int) []byte {
			switch {
			case i < 1500: // ascending first (then a separator goes after its parent's last key)
				return fmt.Appendf(nil, "a%06d", i)
			case i%2 == 0: // alike for 12 bytes past "b"
				return fmt.Appendf(nil, "b%s%04d", strings.Repeat("x", 12), rng.IntN(10000))
			}
			return fmt.Appendf(nil, "c%08d", rng.IntN(1e8))
		}
		for i := range 3000 {
			k := mk(i)
			keys = append(keys, k)
			if _, err := tr.Put(k, []byte("v"), uint64(i+2), uint64(i+2)); err != nil {
				t.Fatal(err)
			}
			// Every memo against its node, for the node's keys, the
			// keys just past them, and keys of the load.
			for slot, m := range tr.memos {
				n, err := decodeOwn(tr.a.bytes(slot), m.id)
				if err != nil || n.Leaf {
					continue // (a memo of a node since freed: never asked for)
				}
				var probes [][]byte
				it := n.Entries()
				for e, ok := it.next(); ok; e, ok = it.next() {
					probes = append(probes, e.Key, append(append([]byte(nil), e.Key...), 0))
				}
				for range 8 {
					probes = append(probes, keys[rng.IntN(len(keys))])
				}
				for _, probe := range probes {
					if !n.Covers(probe) {
						continue
					}
					if got, want := m.childFor(probe, tr.a.bytes(slot), tr.knobs.memoLowIgnored), n.ChildFor(probe); got != want {
						return fmt.Sprintf("after put %d: memo of node %v gives child %v for %q, the node %v", i, m.id, got, probe, want)
					}
				}
			}
		}
		if err := tr.Check(); err != nil {
			return "tree check: " + err.Error()
		}
		for _, k := range keys {
			if _, ok := tr.Get(k); !ok {
				return fmt.Sprintf("key %q lost", k)
			}
		}
		if len(tr.memos) == 0 {
			t.Fatal("no memo made: the test checked nothing")
		}
		return ""
	}
	if bad := run(t, testingKnobs{}); bad != "" {
		t.Fatal(bad)
	}
	for _, c := range []struct {
		name  string
		knobs testingKnobs
	}{
		{"memoKeepOnWrite", testingKnobs{memoKeepOnWrite: true}},
		{"memoAddAnyKey", testingKnobs{memoAddAnyKey: true}},
		{"memoLowIgnored", testingKnobs{memoLowIgnored: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := func() (bad string) {
				defer func() {
					if r := recover(); r != nil {
						bad = fmt.Sprint("panic: ", r)
					}
				}()
				return run(t, c.knobs)
			}()
			if !strings.Contains(bad, "memo of node") {
				t.Fatalf("planted %s not caught as a memo disagreeing with its node: %q", c.name, bad)
			}
			t.Logf("planted %s caught: %s", c.name, bad)
		})
	}
}

// TestInnerMemoWords: with kvbench's keys ("\x01k" and 15 digits, all
// alike in their first 12 bytes), every inner node's search of a key
// that is none of its keys ends in the memo's words, never in the node's
// bisection: the root's first key is empty, and the memo's prefix is the
// one the keys after it share (branch bt3). Each search is checked
// against the node's own (Node.ChildFor). The planted memoPrefixFromFirst
// (the prefix of all keys, the empty one included: no prefix) must be
// caught as searches that ended in the node's bisection.
func TestInnerMemoWords(t *testing.T) {
	run := func(knobs testingKnobs) (slow, searches int, bad string) {
		cfg := Config{NodeSize: 512, MaxKey: 24}
		tr, err := New(cfg, NewArena(cfg.NodeSize, 64, nil), 1)
		if err != nil {
			t.Fatal(err)
		}
		tr.knobs = knobs
		const n = 20_000
		for i := range n {
			k := fmt.Appendf(nil, "\x01k%015d", (i*7919)%n)
			if _, err := tr.Put(k, []byte("v"), uint64(i+2), uint64(i+2)); err != nil {
				t.Fatal(err)
			}
		}
		if tr.height() < 3 {
			t.Fatalf("tree of %d levels: the test needs inner nodes under the root", tr.height())
		}
		slowSum := func() (sum int) {
			for _, m := range tr.memos {
				sum += m.slow
			}
			return sum
		}
		slow = -slowSum() // (the load's own descents not counted)
		rng := rand.New(rand.NewPCG(5, 6))
		for range 2000 {
			// A key that is not in the tree (its last digit a letter).
			k := fmt.Appendf(nil, "\x01k%015d", rng.IntN(n))
			k[len(k)-1] = byte('a' + rng.IntN(26))
			id := tr.root
			for {
				node, err := decodeOwn(tr.a.bytes(id.Slot()), id)
				if err != nil {
					t.Fatal(err)
				}
				if node.Leaf {
					break
				}
				got := tr.childFor(id, k)
				if want := node.ChildFor(k); got != want {
					return 0, 0, fmt.Sprintf("node %v: memo gives child %v for %q, the node %v", id, got, k, want)
				}
				searches++
				id = got
			}
		}
		return slow + slowSum(), searches, ""
	}
	slow, searches, bad := run(testingKnobs{})
	if bad != "" {
		t.Fatal(bad)
	}
	if slow != 0 {
		t.Fatalf("%d of %d inner searches ended in the node's bisection", slow, searches)
	}
	slow, searches, bad = run(testingKnobs{memoPrefixFromFirst: true})
	if bad != "" {
		t.Fatalf("planted memoPrefixFromFirst: %s (want right children, slow searches)", bad)
	}
	if slow < searches/4 {
		t.Fatalf("planted memoPrefixFromFirst not caught: %d of %d inner searches in the node's bisection", slow, searches)
	}
	t.Logf("planted memoPrefixFromFirst caught: %d of %d inner searches in the node's bisection", slow, searches)
}
