package tree

import (
	"fmt"
	"math/bits"
	"strconv"
)

// Group is a group id, 0..MaxGroups-1.
type Group = uint32

// MaxGroups bounds the number of groups of a Tree: a Set holds them all in
// one uint64.
const MaxGroups = 64

// Set is a set of groups, bit g standing for group g. The zero Set is
// empty. Sets are values: Add and Remove return a new Set.
type Set uint64

// Of returns the set of the given groups. It panics on a group >= MaxGroups.
func Of(groups ...Group) Set {
	var s Set
	for _, g := range groups {
		s = s.Add(g)
	}
	return s
}

// Has reports whether g is in s; it is false for any g >= MaxGroups.
func (s Set) Has(g Group) bool {
	return g < MaxGroups && s&(1<<g) != 0
}

// Add returns s with g added. It panics on g >= MaxGroups, which no Set can
// hold.
func (s Set) Add(g Group) Set {
	if g >= MaxGroups {
		panic(fmt.Sprintf("tree: group %d out of range (MaxGroups is %d)", g, MaxGroups))
	}
	return s | 1<<g
}

// Remove returns s without g.
func (s Set) Remove(g Group) Set {
	if g >= MaxGroups {
		return s
	}
	return s &^ (1 << g)
}

// Len is the number of groups in s.
func (s Set) Len() int { return bits.OnesCount64(uint64(s)) }

// Empty reports whether s has no groups.
func (s Set) Empty() bool { return s == 0 }

// Min is the lowest group of s, and false if s is empty. With Remove it
// walks a set without allocating:
//
//	for g, ok := s.Min(); ok; g, ok = s.Min() { s = s.Remove(g); ... }
func (s Set) Min() (Group, bool) {
	if s == 0 {
		return 0, false
	}
	return Group(bits.TrailingZeros64(uint64(s))), true
}

// Groups lists the groups of s in ascending order (nil for an empty set).
func (s Set) Groups() []Group {
	if s == 0 {
		return nil
	}
	out := make([]Group, 0, s.Len())
	for r := uint64(s); r != 0; r &= r - 1 {
		out = append(out, Group(bits.TrailingZeros64(r)))
	}
	return out
}

// String writes s as "{0,3,5}", "{}" when empty.
func (s Set) String() string {
	b := make([]byte, 0, 2+3*s.Len())
	b = append(b, '{')
	for r := uint64(s); r != 0; r &= r - 1 {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(bits.TrailingZeros64(r)), 10)
	}
	return string(append(b, '}'))
}
