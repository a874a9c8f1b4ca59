package tree

import (
	"errors"
	"testing"
)

// FuzzParse feeds Parse arbitrary text and a destination set and checks
// every tree it accepts: each group has exactly one path to the root,
// Reach(root) is All(), LCA(dst) reaches dst while none of its children
// does, Next agrees with Reach, and String parses back to an equal tree.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"0:1,2;1:3,4;2:5,6;3:7", "0:1,2,3,4,5,6,7", "0:1;1:2;2:3", "0:", "1:0",
		"base", "breadth/4", "depth/64", " 2 : 0 , 1 ; ", "0:1;1:0", "0:1,1",
		"0:1;2:3", "0:64", "garbage", "0:1,,2", "",
	} {
		f.Add(s, uint64(0b1011_0000))
	}
	f.Fuzz(func(t *testing.T, spec string, mask uint64) {
		tr, err := Parse(spec)
		if err != nil {
			if tr != nil {
				t.Fatalf("Parse(%q) returned a tree and %v", spec, err)
			}
			return
		}
		n := tr.Len()
		if n < 1 || n > MaxGroups || tr.All() != Set(1<<n-1) {
			t.Fatalf("Parse(%q): Len %d All %s", spec, n, tr.All())
		}
		root := tr.Root()
		if _, ok := tr.Parent(root); ok || tr.Depth(root) != 0 {
			t.Fatalf("Parse(%q): root %d has a parent or depth %d", spec, root, tr.Depth(root))
		}
		if tr.Reach(root) != tr.All() {
			t.Fatalf("Parse(%q): Reach(root) = %s, All = %s", spec, tr.Reach(root), tr.All())
		}
		// Walking down from the root meets every group exactly once.
		var met Set
		stack := []Group{root}
		for len(stack) > 0 {
			g := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if met.Has(g) {
				t.Fatalf("Parse(%q): group %d met twice walking down", spec, g)
			}
			met = met.Add(g)
			stack = append(stack, tr.Children(g)...)
		}
		if met != tr.All() {
			t.Fatalf("Parse(%q): walking down met %s of %s", spec, met, tr.All())
		}
		// Walking up from each group follows its unique path to the root.
		for g := range Group(n) {
			path := tr.Path(g)
			if len(path) != tr.Depth(g)+1 || path[0] != root || path[len(path)-1] != g {
				t.Fatalf("Parse(%q): Path(%d) = %v, depth %d", spec, g, path, tr.Depth(g))
			}
			for i := 1; i < len(path); i++ {
				if p, ok := tr.Parent(path[i]); !ok || p != path[i-1] || !tr.ChildSet(p).Has(path[i]) {
					t.Fatalf("Parse(%q): Path(%d) = %v breaks at %d", spec, g, path, i)
				}
			}
			want := Set(0).Add(g)
			for _, c := range tr.Children(g) {
				want |= tr.Reach(c)
			}
			if tr.Reach(g) != want {
				t.Fatalf("Parse(%q): Reach(%d) = %s, want %s", spec, g, tr.Reach(g), want)
			}
		}
		dst := Set(mask)
		lca, err := tr.LCA(dst)
		switch {
		case dst == 0:
			if !errors.Is(err, ErrEmptySet) {
				t.Fatalf("LCA({}) err = %v", err)
			}
		case dst&^tr.All() != 0:
			if !errors.Is(err, ErrNotInTree) {
				t.Fatalf("LCA(%s) outside %s: err = %v", dst, tr.All(), err)
			}
		default:
			if err != nil {
				t.Fatalf("Parse(%q): LCA(%s): %v", spec, dst, err)
			}
			if tr.Reach(lca)&dst != dst {
				t.Fatalf("Parse(%q): LCA(%s) = %d reaches only %s", spec, dst, lca, tr.Reach(lca))
			}
			for _, c := range tr.Children(lca) {
				if tr.Reach(c)&dst == dst {
					t.Fatalf("Parse(%q): LCA(%s) = %d but child %d reaches it all", spec, dst, lca, c)
				}
			}
		}
		in := dst & tr.All()
		for g := range Group(n) {
			var want Set
			for _, c := range tr.Children(g) {
				if tr.Reach(c)&in != 0 {
					want = want.Add(c)
				}
			}
			if got := tr.Next(g, dst); got != want {
				t.Fatalf("Parse(%q): Next(%d, %s) = %s, want %s", spec, g, dst, got, want)
			}
		}
		s := tr.String()
		back, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", spec, s, err)
		}
		if !back.Equal(tr) || back.String() != s {
			t.Fatalf("Parse(%q): %q parsed back to %q", spec, s, back)
		}
	})
}
