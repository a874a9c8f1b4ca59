package tree

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// DefaultShapeGroups is the group count of a shape named without one in
// Parse ("base" is "base/8"), the 8 groups of the paper's evaluation.
const DefaultShapeGroups = 8

// Parse reads a tree in its text form, parent:children entries such as
// "0:1,2;1:3,4;2:5,6;3:7", or a shape name with an optional group count,
// "base", "breadth/4" (see the package documentation). Its errors name the
// offending group or entry.
func Parse(spec string) (*Tree, error) {
	t, err := parse(spec)
	if err != nil {
		return nil, fmt.Errorf("tree: parse %q: %w", spec, err)
	}
	return t, nil
}

func parse(spec string) (*Tree, error) {
	s := strings.TrimSpace(spec)
	if s == "" {
		return nil, errors.New("empty spec")
	}
	if c := s[0] | 0x20; 'a' <= c && c <= 'z' {
		return parseShape(s)
	}
	const none = -2
	var parents [MaxGroups]int
	for i := range parents {
		parents[i] = none
	}
	var seen, listed Set // every group written; groups with an entry
	for e := range strings.SplitSeq(s, ";") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		ps, cs, ok := strings.Cut(e, ":")
		if !ok || strings.Contains(cs, ":") {
			return nil, fmt.Errorf("entry %q: want parent:child,child,...", e)
		}
		p, err := parseGroup(ps)
		if err != nil {
			return nil, fmt.Errorf("entry %q: %w", e, err)
		}
		if listed.Has(p) {
			return nil, fmt.Errorf("group %d has two entries: write all its children in one", p)
		}
		listed, seen = listed.Add(p), seen.Add(p)
		if strings.TrimSpace(cs) == "" {
			continue
		}
		for cs := range strings.SplitSeq(cs, ",") {
			c, err := parseGroup(cs)
			if err != nil {
				return nil, fmt.Errorf("entry %q: %w", e, err)
			}
			switch q := parents[c]; {
			case c == p:
				return nil, fmt.Errorf("cycle: group %d is its own child", c)
			case q == int(p):
				return nil, fmt.Errorf("group %d is listed twice as a child of %d", c, p)
			case q != none:
				return nil, fmt.Errorf("group %d has two parents, %d and %d", c, q, p)
			}
			parents[c] = int(p)
			seen = seen.Add(c)
		}
	}
	if seen == 0 {
		return nil, errors.New("no groups")
	}
	n := 64 - bits.LeadingZeros64(uint64(seen)) // highest group + 1
	if missing := ^seen & (1<<n - 1); missing != 0 {
		g, _ := missing.Min()
		return nil, fmt.Errorf("group %d is missing: groups are 0..%d (the highest written) and each must appear", g, n-1)
	}
	ps := parents[:n]
	for g, p := range ps {
		if p == none {
			ps[g] = -1
		}
	}
	return build(ps)
}

// parseGroup reads a decimal group id, whitespace around it allowed.
func parseGroup(tok string) (Group, error) {
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return 0, errors.New("empty group id")
	}
	v, err := parseCount(tok)
	if err != nil {
		return 0, fmt.Errorf("bad group id %q: want a decimal number", tok)
	}
	if v >= MaxGroups {
		return 0, fmt.Errorf("group %s out of range: groups are 0..%d", tok, MaxGroups-1)
	}
	return Group(v), nil
}

// parseCount reads a decimal number of digits only (no sign), saturating
// instead of overflowing.
func parseCount(tok string) (uint64, error) {
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, strconv.ErrSyntax
		}
	}
	v, err := strconv.ParseUint(tok, 10, 64)
	if err != nil { // only a range error is left: too many digits
		return 1<<64 - 1, nil
	}
	return v, nil
}

// parseShape reads "name" or "name/count".
func parseShape(s string) (*Tree, error) {
	name, count, hasCount := strings.Cut(s, "/")
	name = strings.TrimSpace(name)
	n := DefaultShapeGroups
	if hasCount {
		count = strings.TrimSpace(count)
		if count == "" {
			return nil, fmt.Errorf("shape %q: missing group count after '/'", name)
		}
		v, err := parseCount(count)
		if err != nil {
			return nil, fmt.Errorf("shape %q: bad group count %q: want a decimal number", name, count)
		}
		if v < 1 || v > MaxGroups {
			return nil, fmt.Errorf("shape %q: %s groups: want 1..%d", name, count, MaxGroups)
		}
		n = int(v)
	}
	lower := strings.ToLower(name)
	switch lower {
	case "base", "breadth", "depth":
	default:
		return nil, fmt.Errorf("unknown shape %q: want base, breadth or depth, or the parent:children form", name)
	}
	return Shape(lower, n)
}
