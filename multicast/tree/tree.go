package tree

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
)

// ErrEmptySet is returned by LCA for an empty destination set.
var ErrEmptySet = errors.New("tree: empty destination set")

// ErrNotInTree is wrapped by LCA's error for destinations outside the tree.
var ErrNotInTree = errors.New("tree: group not in tree")

// Tree is a rooted tree over groups 0..Len()-1. It is immutable once built
// (by FromParents, Shape or Parse) and safe for concurrent use. Everything
// is derived from the parent of each group, so two Trees over the same
// parents are Equal, and the children of a group are in ascending order.
type Tree struct {
	n      int
	root   Group
	all    Set
	parent [MaxGroups]int8  // -1 for the root
	depth  [MaxGroups]uint8 // edges from the root
	kids   [MaxGroups]Set
	reach  [MaxGroups]Set
}

// FromParents builds the tree over groups 0..len(parents)-1 in which
// parents[g] is the parent of g and -1 marks the root. It checks that there
// are between 1 and MaxGroups groups, that every parent is -1 or a group,
// that there is exactly one root and that every group reaches it (no
// cycles); its errors name the offending groups.
func FromParents(parents []int) (*Tree, error) {
	t, err := build(parents)
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	return t, nil
}

// build is FromParents with errors that do not say "tree:", for Parse to
// wrap its own way.
func build(parents []int) (*Tree, error) {
	n := len(parents)
	if n == 0 {
		return nil, errors.New("no groups")
	}
	if n > MaxGroups {
		return nil, fmt.Errorf("%d groups, more than MaxGroups (%d)", n, MaxGroups)
	}
	t := &Tree{n: n}
	roots := 0
	for g, p := range parents {
		switch {
		case p == -1:
			if roots > 0 {
				return nil, fmt.Errorf("two roots: groups %d and %d have no parent", t.root, g)
			}
			roots++
			t.root = Group(g)
		case p < -1 || p >= n:
			return nil, fmt.Errorf("group %d: parent %d out of range (groups are 0..%d, -1 for the root)", g, p, n-1)
		case p == g:
			return nil, fmt.Errorf("cycle: group %d is its own parent", g)
		}
		t.parent[g] = int8(p)
		t.all = t.all.Add(Group(g))
	}
	if roots == 0 {
		return nil, fmt.Errorf("no root: every group has a parent, so they form a cycle (group 0's ancestors: %s)", cycleFrom(parents, 0))
	}
	// Every group must reach the root within n-1 steps; otherwise its
	// ancestors loop.
	for g := range n {
		d, a := 0, g
		for parents[a] != -1 {
			a = parents[a]
			d++
			if d >= n {
				return nil, fmt.Errorf("cycle: group %d does not reach the root %d (ancestors: %s)", g, t.root, cycleFrom(parents, g))
			}
		}
		t.depth[g] = uint8(d)
	}
	for g := range n {
		if p := parents[g]; p >= 0 {
			t.kids[p] = t.kids[p].Add(Group(g))
		}
		for a := g; a != -1; a = parents[a] {
			t.reach[a] = t.reach[a].Add(Group(g))
		}
	}
	return t, nil
}

// cycleFrom writes g's ancestors up to the first repeated one, "1 -> 2 -> 1".
func cycleFrom(parents []int, g int) string {
	var seen Set
	b := strconv.AppendInt(nil, int64(g), 10)
	for a := g; !seen.Has(Group(a)); {
		seen = seen.Add(Group(a))
		a = parents[a]
		if a < 0 {
			break
		}
		b = append(b, " -> "...)
		b = strconv.AppendInt(b, int64(a), 10)
	}
	return string(b)
}

// Shape builds one of the overlays of the paper's evaluation over n groups
// (1 <= n <= MaxGroups): "base", a balanced binary tree in heap order (the
// children of g are 2g+1 and 2g+2); "breadth", root 0 with every other
// group as its child; "depth", the chain 0 -> 1 -> ... -> n-1. The package
// documentation draws them for 8 groups.
func Shape(name string, n int) (*Tree, error) {
	switch name {
	case "base", "breadth", "depth":
	default:
		return nil, fmt.Errorf("tree: unknown shape %q (want base, breadth or depth)", name)
	}
	if n < 1 || n > MaxGroups {
		return nil, fmt.Errorf("tree: shape %q of %d groups: want 1..%d groups", name, n, MaxGroups)
	}
	parents := make([]int, n)
	parents[0] = -1
	for g := 1; g < n; g++ {
		switch name {
		case "base":
			parents[g] = (g - 1) / 2
		case "breadth":
			parents[g] = 0
		case "depth":
			parents[g] = g - 1
		}
	}
	return FromParents(parents)
}

// Len is the number of groups, which are 0..Len()-1.
func (t *Tree) Len() int { return t.n }

// Root is the group without a parent.
func (t *Tree) Root() Group { return t.root }

// All is the set of the tree's groups, 0..Len()-1.
func (t *Tree) All() Set { return t.all }

// Contains reports whether g is a group of t.
func (t *Tree) Contains(g Group) bool { return g < Group(t.n) }

// Parent is g's parent, and false for the root or a group not in t.
func (t *Tree) Parent(g Group) (Group, bool) {
	if !t.Contains(g) || t.parent[g] < 0 {
		return 0, false
	}
	return Group(t.parent[g]), true
}

// ChildSet is the set of g's children (empty for a leaf or a group not in
// t). Unlike Children it does not allocate.
func (t *Tree) ChildSet(g Group) Set {
	if !t.Contains(g) {
		return 0
	}
	return t.kids[g]
}

// Children lists g's children in ascending order (nil for a leaf or a
// group not in t). The slice is the caller's own: it is a fresh copy, so
// that no caller can change the tree through it; ChildSet is the
// allocation-free form.
func (t *Tree) Children(g Group) []Group { return t.ChildSet(g).Groups() }

// Depth is the number of edges between g and the root (0 for the root),
// -1 for a group not in t.
func (t *Tree) Depth(g Group) int {
	if !t.Contains(g) {
		return -1
	}
	return int(t.depth[g])
}

// Reach is g and every group below it: the groups a message can get to
// from g travelling down the tree. It is empty for a group not in t.
func (t *Tree) Reach(g Group) Set {
	if !t.Contains(g) {
		return 0
	}
	return t.reach[g]
}

// LCA is the lowest group whose reach contains every group of dst: where a
// message to dst is ordered first. It fails with ErrEmptySet for an empty
// dst and with an error wrapping ErrNotInTree if dst has groups outside
// the tree. It takes O(depth) time and allocates only for an error.
func (t *Tree) LCA(dst Set) (Group, error) {
	if dst == 0 {
		return 0, ErrEmptySet
	}
	if out := dst &^ t.all; out != 0 {
		return 0, fmt.Errorf("%w: groups %s of destinations %s are not in the tree of groups 0..%d", ErrNotInTree, out, dst, t.n-1)
	}
	// The lca is an ancestor of every destination (or the destination
	// itself), so the first group up from any destination whose reach
	// covers dst is the lowest such group.
	a := int(bits.TrailingZeros64(uint64(dst)))
	for t.reach[a]&dst != dst {
		a = int(t.parent[a])
	}
	return Group(a), nil
}

// Next is the set of g's children whose reach meets dst: the children to
// which g forwards a message to dst once it has ordered it. It is empty
// for a leaf, for a group not in t and for a g with no destination below
// it.
func (t *Tree) Next(g Group, dst Set) Set {
	if !t.Contains(g) {
		return 0
	}
	var out Set
	for r := uint64(t.kids[g]); r != 0; r &= r - 1 {
		c := bits.TrailingZeros64(r)
		if t.reach[c]&dst != 0 {
			out |= 1 << c
		}
	}
	return out
}

// Path lists the groups from the root down to g, both included (nil for a
// group not in t).
func (t *Tree) Path(g Group) []Group {
	if !t.Contains(g) {
		return nil
	}
	p := make([]Group, t.depth[g]+1)
	for i, a := len(p)-1, int(g); i >= 0; i, a = i-1, int(t.parent[a]) {
		p[i] = Group(a)
	}
	return p
}

// Parents is the inverse of FromParents: out[g] is g's parent, -1 for the
// root.
func (t *Tree) Parents() []int {
	out := make([]int, t.n)
	for g := range out {
		out[g] = int(t.parent[g])
	}
	return out
}

// Equal reports whether t and u have the same groups with the same parents.
func (t *Tree) Equal(u *Tree) bool {
	return t.n == u.n && t.parent == u.parent
}

// String writes t in Parse's text form: "p:c1,c2" entries in ascending
// order of p for every group with children, joined by ';'
// ("0:1,2;1:3,4;2:5,6;3:7"); a one-group tree is "0:".
func (t *Tree) String() string {
	if t.n == 1 {
		return "0:"
	}
	var b []byte
	for p := range t.n {
		if t.kids[p] == 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ';')
		}
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, ':')
		for i, c := range t.kids[p].Groups() {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(c), 10)
		}
	}
	return string(b)
}
