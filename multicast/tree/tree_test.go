package tree

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustShape(t *testing.T, name string, n int) *Tree {
	t.Helper()
	tr, err := Shape(name, n)
	if err != nil {
		t.Fatalf("Shape(%q, %d): %v", name, n, err)
	}
	return tr
}

func TestSet(t *testing.T) {
	s := Of(5, 0, 3)
	if got := s.String(); got != "{0,3,5}" {
		t.Errorf("String = %q", got)
	}
	if got := Set(0).String(); got != "{}" {
		t.Errorf("empty String = %q", got)
	}
	if !s.Has(3) || s.Has(4) || s.Has(64) || s.Has(1<<31) {
		t.Errorf("Has wrong for %s", s)
	}
	if s.Len() != 3 || !Set(0).Empty() || s.Empty() {
		t.Errorf("Len/Empty wrong for %s", s)
	}
	if got := s.Groups(); !slices.Equal(got, []Group{0, 3, 5}) {
		t.Errorf("Groups = %v", got)
	}
	if Set(0).Groups() != nil {
		t.Errorf("empty Groups not nil")
	}
	if got := s.Remove(3).Remove(63).Remove(99); got != Of(0, 5) {
		t.Errorf("Remove = %s", got)
	}
	if g, ok := Of(63).Min(); !ok || g != 63 {
		t.Errorf("Min = %d, %v", g, ok)
	}
	if _, ok := Set(0).Min(); ok {
		t.Errorf("Min of empty set ok")
	}
	if got := Of(63, 0).String(); got != "{0,63}" {
		t.Errorf("String = %q", got)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("Add(64) did not panic")
		}
	}()
	Set(0).Add(MaxGroups)
}

// TestShapes8 pins the three shapes of Fig. 4 for 8 groups.
func TestShapes8(t *testing.T) {
	type lcaCase struct {
		dst Set
		lca Group
	}
	type nextCase struct {
		g    Group
		dst  Set
		next Set
	}
	tests := []struct {
		name    string
		text    string
		parents []int
		depths  []int
		reach   []Set
		lca     []lcaCase
		next    []nextCase
	}{
		{
			name:    "base",
			text:    "0:1,2;1:3,4;2:5,6;3:7",
			parents: []int{-1, 0, 0, 1, 1, 2, 2, 3},
			depths:  []int{0, 1, 1, 2, 2, 2, 2, 3},
			reach: []Set{
				Of(0, 1, 2, 3, 4, 5, 6, 7), Of(1, 3, 4, 7), Of(2, 5, 6),
				Of(3, 7), Of(4), Of(5), Of(6), Of(7),
			},
			lca: []lcaCase{
				{Of(7), 7}, {Of(0), 0}, {Of(3, 4), 1}, {Of(4, 7), 1},
				{Of(3, 7), 3}, {Of(5, 6), 2}, {Of(4, 5), 0}, {Of(1, 7), 1},
				{Of(2, 6), 2}, {Of(7, 6), 0}, {Of(0, 1, 2, 3, 4, 5, 6, 7), 0},
			},
			next: []nextCase{
				{0, Of(7), Of(1)}, {0, Of(4, 5), Of(1, 2)}, {0, Of(0), 0},
				{1, Of(3, 4), Of(3, 4)}, {1, Of(7, 5), Of(3)}, {3, Of(7), Of(7)},
				{7, Of(7), 0}, {2, Of(3), 0},
			},
		},
		{
			name:    "breadth",
			text:    "0:1,2,3,4,5,6,7",
			parents: []int{-1, 0, 0, 0, 0, 0, 0, 0},
			depths:  []int{0, 1, 1, 1, 1, 1, 1, 1},
			reach: []Set{
				Of(0, 1, 2, 3, 4, 5, 6, 7), Of(1), Of(2), Of(3), Of(4), Of(5), Of(6), Of(7),
			},
			lca: []lcaCase{
				{Of(7), 7}, {Of(0), 0}, {Of(3, 4), 0}, {Of(1, 2, 3), 0}, {Of(0, 5), 0}, {Of(5), 5},
			},
			next: []nextCase{
				{0, Of(7), Of(7)}, {0, Of(1, 4, 6), Of(1, 4, 6)}, {0, Of(0), 0},
				{0, Of(0, 2), Of(2)}, {3, Of(3), 0},
			},
		},
		{
			name:    "depth",
			text:    "0:1;1:2;2:3;3:4;4:5;5:6;6:7",
			parents: []int{-1, 0, 1, 2, 3, 4, 5, 6},
			depths:  []int{0, 1, 2, 3, 4, 5, 6, 7},
			reach: []Set{
				Of(0, 1, 2, 3, 4, 5, 6, 7), Of(1, 2, 3, 4, 5, 6, 7), Of(2, 3, 4, 5, 6, 7),
				Of(3, 4, 5, 6, 7), Of(4, 5, 6, 7), Of(5, 6, 7), Of(6, 7), Of(7),
			},
			lca: []lcaCase{
				{Of(7), 7}, {Of(0), 0}, {Of(3, 4), 3}, {Of(6, 2, 4), 2}, {Of(0, 7), 0}, {Of(5, 7), 5},
			},
			next: []nextCase{
				{0, Of(7), Of(1)}, {2, Of(3, 7), Of(3)}, {2, Of(2), 0}, {2, Of(1), 0}, {7, Of(7), 0},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := mustShape(t, tc.name, 8)
			if got := tr.String(); got != tc.text {
				t.Errorf("String = %q, want %q", got, tc.text)
			}
			if got := tr.Parents(); !slices.Equal(got, tc.parents) {
				t.Errorf("Parents = %v, want %v", got, tc.parents)
			}
			if tr.Len() != 8 || tr.Root() != 0 || tr.All() != Of(0, 1, 2, 3, 4, 5, 6, 7) {
				t.Errorf("Len %d Root %d All %s", tr.Len(), tr.Root(), tr.All())
			}
			for g := range Group(8) {
				p, ok := tr.Parent(g)
				if want := tc.parents[g]; ok != (want >= 0) || (ok && int(p) != want) {
					t.Errorf("Parent(%d) = %d, %v, want %d", g, p, ok, want)
				}
				if got := tr.Depth(g); got != tc.depths[g] {
					t.Errorf("Depth(%d) = %d, want %d", g, got, tc.depths[g])
				}
				if got := tr.Reach(g); got != tc.reach[g] {
					t.Errorf("Reach(%d) = %s, want %s", g, got, tc.reach[g])
				}
				var kids []Group
				for c, p := range tc.parents {
					if p == int(g) {
						kids = append(kids, Group(c))
					}
				}
				if got := tr.Children(g); !slices.Equal(got, kids) {
					t.Errorf("Children(%d) = %v, want %v", g, got, kids)
				}
				if got := tr.ChildSet(g); got != Of(kids...) {
					t.Errorf("ChildSet(%d) = %s, want %v", g, got, kids)
				}
				path := tr.Path(g)
				if len(path) != tc.depths[g]+1 || path[0] != 0 || path[len(path)-1] != g {
					t.Errorf("Path(%d) = %v", g, path)
				}
			}
			for _, c := range tc.lca {
				got, err := tr.LCA(c.dst)
				if err != nil || got != c.lca {
					t.Errorf("LCA(%s) = %d, %v, want %d", c.dst, got, err, c.lca)
				}
			}
			for _, c := range tc.next {
				if got := tr.Next(c.g, c.dst); got != c.next {
					t.Errorf("Next(%d, %s) = %s, want %s", c.g, c.dst, got, c.next)
				}
			}
		})
	}
	base := mustShape(t, "base", 8)
	if got := base.Path(7); !slices.Equal(got, []Group{0, 1, 3, 7}) {
		t.Errorf("base Path(7) = %v", got)
	}
}

func TestOutsideTree(t *testing.T) {
	tr := mustShape(t, "base", 8)
	if _, err := tr.LCA(0); !errors.Is(err, ErrEmptySet) {
		t.Errorf("LCA({}) err = %v", err)
	}
	_, err := tr.LCA(Of(2, 8, 40))
	if !errors.Is(err, ErrNotInTree) || !strings.Contains(err.Error(), "{8,40}") {
		t.Errorf("LCA({2,8,40}) err = %v", err)
	}
	for _, g := range []Group{8, 63, 64, 1 << 31} {
		if tr.Contains(g) || tr.Reach(g) != 0 || tr.Depth(g) != -1 || tr.Children(g) != nil ||
			tr.ChildSet(g) != 0 || tr.Next(g, tr.All()) != 0 || tr.Path(g) != nil {
			t.Errorf("group %d outside the tree answered", g)
		}
		if _, ok := tr.Parent(g); ok {
			t.Errorf("Parent(%d) ok", g)
		}
	}
}

func TestChildrenIsACopy(t *testing.T) {
	tr := mustShape(t, "breadth", 4)
	kids := tr.Children(0)
	kids[0] = 3
	if got := tr.Children(0); !slices.Equal(got, []Group{1, 2, 3}) {
		t.Errorf("Children changed through a returned slice: %v", got)
	}
}

// bruteLCA follows the paper's definition literally: among the groups
// from which every destination is reached going down (ancestors-or-self of
// all of dst), the one farthest from the root.
func bruteLCA(parents []int, dst Set) Group {
	isAncestor := func(a, g int) bool { // a is g or above g
		for ; g != -1; g = parents[g] {
			if g == a {
				return true
			}
		}
		return false
	}
	depth := func(g int) int {
		d := 0
		for ; parents[g] != -1; g = parents[g] {
			d++
		}
		return d
	}
	best, bestDepth := -1, -1
	for a := range parents {
		ok := true
		for _, d := range dst.Groups() {
			ok = ok && isAncestor(a, int(d))
		}
		if ok && depth(a) > bestDepth {
			best, bestDepth = a, depth(a)
		}
	}
	return Group(best)
}

// randomParents makes a random tree over n groups with a random root.
func randomParents(r *rand.Rand, n int) []int {
	perm := r.Perm(n)
	parents := make([]int, n)
	parents[perm[0]] = -1
	for i := 1; i < n; i++ {
		parents[perm[i]] = perm[r.IntN(i)]
	}
	return parents
}

func checkLCAAllSubsets(t *testing.T, tr *Tree) {
	t.Helper()
	parents := tr.Parents()
	for dst := Set(1); dst <= tr.All(); dst++ {
		got, err := tr.LCA(dst)
		if want := bruteLCA(parents, dst); err != nil || got != want {
			t.Fatalf("tree %s: LCA(%s) = %d, %v, want %d", tr, dst, got, err, want)
		}
	}
}

func TestLCABruteForce(t *testing.T) {
	for _, name := range []string{"base", "breadth", "depth"} {
		checkLCAAllSubsets(t, mustShape(t, name, 8))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := 1 + r.IntN(10)
		tr, err := FromParents(randomParents(r, n))
		if err != nil {
			t.Fatal(err)
		}
		checkLCAAllSubsets(t, tr)
	}
	// Bigger trees: random subsets only.
	for range 50 {
		n := 1 + r.IntN(MaxGroups)
		parents := randomParents(r, n)
		tr, err := FromParents(parents)
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			dst := Set(r.Uint64()) & tr.All()
			if dst == 0 {
				continue
			}
			got, err := tr.LCA(dst)
			if want := bruteLCA(parents, dst); err != nil || got != want {
				t.Fatalf("tree %s: LCA(%s) = %d, %v, want %d", tr, dst, got, err, want)
			}
		}
	}
}

func TestFromParentsErrors(t *testing.T) {
	tests := []struct {
		parents []int
		want    string
	}{
		{nil, "no groups"},
		{make([]int, 65), "65 groups"},
		{[]int{-1, 0, -1}, "two roots: groups 0 and 2"},
		{[]int{-1, 5}, "group 1: parent 5 out of range"},
		{[]int{-1, -3}, "group 1: parent -3 out of range"},
		{[]int{-1, 1}, "group 1 is its own parent"},
		{[]int{1, 0}, "no root"},
		{[]int{-1, 2, 3, 1}, "cycle: group 1 does not reach the root 0 (ancestors: 1 -> 2 -> 3 -> 1)"},
	}
	for _, tc := range tests {
		_, err := FromParents(tc.parents)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("FromParents(%v) err = %v, want it to mention %q", tc.parents, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec, want string
	}{
		{"", "empty spec"},
		{"  ;; ", "no groups"},
		{"0:1;2:3", "two roots: groups 0 and 2"},
		{"0:1;1:0", "no root"},
		{"0:1;1:2;2:1", "group 1 has two parents, 0 and 2"},
		{"0:1;1:2;2:3;3:1", "group 1 has two parents"},
		{"0:0", "group 0 is its own child"},
		{"1:2;2:1;0:", "cycle: group 1 does not reach the root 0 (ancestors: 1 -> 2 -> 1)"},
		{"0:1,1", "group 1 is listed twice as a child of 0"},
		{"0:1,2;1:2", "group 2 has two parents, 0 and 1"},
		{"0:1;0:2", "group 0 has two entries"},
		{"0:1,3", "group 2 is missing"},
		{"0:64", "group 64 out of range"},
		{"0:99999999999999999999999", "out of range"},
		{"70:1", "group 70 out of range"},
		{"0:1,,2", "empty group id"},
		{":1", "empty group id"},
		{"0:-1", `bad group id "-1"`},
		{"0:+1", `bad group id "+1"`},
		{"0:1 2", `bad group id "1 2"`},
		{"0-1", `entry "0-1": want parent:child`},
		{"0:1:2", `entry "0:1:2"`},
		{"%%", `entry "%%"`},
		{"hello", `unknown shape "hello"`},
		{"base/0", "want 1..64"},
		{"depth/65", "want 1..64"},
		{"breadth/", "missing group count"},
		{"base/x", `bad group count "x"`},
		{"base/8/2", `bad group count "8/2"`},
	}
	for _, tc := range tests {
		_, err := Parse(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) err = %v, want it to mention %q", tc.spec, err, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		spec    string
		parents []int
	}{
		{"0:1,2;1:3,4;2:5,6;3:7", []int{-1, 0, 0, 1, 1, 2, 2, 3}},
		{" 3 : 7 ; 0:2 ,1;\n2:6, 5 ;1:4,3 ; ", []int{-1, 0, 0, 1, 1, 2, 2, 3}},
		{"0:", []int{-1}},
		{"0:1;1:", []int{-1, 0}},
		{"1:0", []int{1, -1}},
		{"2:0,1", []int{2, 2, -1}},
		{"007:1,2,3,4,5,6,0", []int{7, 7, 7, 7, 7, 7, 7, -1}},
		{"base", []int{-1, 0, 0, 1, 1, 2, 2, 3}},
		{"base/8", []int{-1, 0, 0, 1, 1, 2, 2, 3}},
		{" Base / 3 ", []int{-1, 0, 0}},
		{"breadth/4", []int{-1, 0, 0, 0}},
		{"depth/1", []int{-1}},
		{"depth/4", []int{-1, 0, 1, 2}},
	}
	for _, tc := range tests {
		tr, err := Parse(tc.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.spec, err)
			continue
		}
		if got := tr.Parents(); !slices.Equal(got, tc.parents) {
			t.Errorf("Parse(%q) parents = %v, want %v", tc.spec, got, tc.parents)
		}
	}
}

func TestStringRoundTrip(t *testing.T) {
	var trees []*Tree
	for _, name := range []string{"base", "breadth", "depth"} {
		for _, n := range []int{1, 2, 3, 8, 13, MaxGroups} {
			trees = append(trees, mustShape(t, name, n))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		tr, err := FromParents(randomParents(r, 1+r.IntN(MaxGroups)))
		if err != nil {
			t.Fatal(err)
		}
		trees = append(trees, tr)
	}
	for _, tr := range trees {
		s := tr.String()
		back, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q): %v", s, err)
		}
		if !back.Equal(tr) || back.String() != s {
			t.Fatalf("round trip of %q gave %q", s, back)
		}
		if again, err := FromParents(tr.Parents()); err != nil || !again.Equal(tr) {
			t.Fatalf("FromParents(Parents()) of %q: %v", s, err)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	tr := mustShape(t, "base", MaxGroups)
	dst := Of(40, 41, 62)
	var sink int
	allocs := testing.AllocsPerRun(100, func() {
		g, err := tr.LCA(dst)
		if err != nil {
			panic(err)
		}
		p, _ := tr.Parent(g)
		sink += int(p) + int(tr.Root()) + tr.Depth(g) + tr.Len()
		sink += int(tr.Reach(g)&tr.ChildSet(g)&tr.Next(g, dst)&tr.All()) & 1
		if tr.Contains(g) {
			sink++
		}
		for s := tr.Next(g, dst); !s.Empty(); {
			c, _ := s.Min()
			s = s.Remove(c)
			sink += int(c)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run, want 0", allocs)
	}
	_ = sink
}
