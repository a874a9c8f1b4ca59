package kvcheck

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Property is a promise of stale-ok gets.
type Property uint8

// The promises CheckStale checks.
const (
	// NeverWritten (a): a stale-ok get returns absent or a value that a
	// write of the key (a put, an acknowledged or unknown CAS, a batch)
	// called before the get returned wrote.
	NeverWritten Property = iota + 1
	// WrongPrefix (b): a stale-ok get reporting applied index A returns
	// the key's state after the writes of its group with entry index <= A,
	// or after a later entry (A is the replica's applied index when the
	// get began: the value is never older than that). When writes of the key have no known index (outcome
	// unknown, index not recorded, or recorded for another group), it may
	// also return one of their values, but nothing older than the latest
	// write with a known index <= A.
	WrongPrefix
)

func (p Property) String() string {
	return enumString(p, "property", "", "(a) never-written value", "(b) not the state at the reported applied index")
}

// StaleError is a stale-ok get that broke a promise.
type StaleError struct {
	Property Property
	Pos      int // the get's position in the history
	Op       Op  // the get
	Msg      string
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("kvcheck: %s: %v: %s", describe(e.Pos, &e.Op), e.Property, e.Msg)
}

// effect is a write's effect on one key.
type effect struct {
	present bool
	value   string
}

func (e effect) String() string {
	if !e.present {
		return "absent"
	}
	return fmt.Sprintf("%q", e.value)
}

// kwrite is a write's effect on one key.
type kwrite struct {
	pos   int
	op    *Op
	eff   effect
	group int
	idx   uint64 // 0: unknown
	ver   uint64 // 0: unknown
}

// keyWrites are the writes of one key.
type keyWrites struct {
	known   []*kwrite        // with an index, by group, index, version
	unknown []*kwrite        // without, by call time
	first   map[string]int64 // value -> the earliest call of a write that wrote it
}

// maxReported caps the violations CheckStale reports.
const maxReported = 20

// CheckStale checks h's stale-ok gets against properties (a) NeverWritten
// and (b) WrongPrefix, using the writes of h and any further writes (of
// the same clock; for example the ones that loaded the store). Gets of
// unknown outcome are skipped. Stale gets need Out.Applied and Out.Group,
// writes Out.Index (or Out.Version) and Out.Group: a write without an
// index only takes part in (a) and in (b)'s relaxed form. Stale gets of a
// key that a Merge wrote are not checked (a merge's value depends on the
// state it applied to; CheckLinearizable checks merges).
//
// The error is nil if every stale get kept its promises; else it joins
// a *StaleError per violation (up to 20); its Pos indexes h, or the
// further writes after h.
func CheckStale(h []Op, writes ...Op) error {
	all := h
	if len(writes) > 0 {
		all = append(slices.Clip(h), writes...)
	}
	if err := validate(all); err != nil {
		return err
	}
	for i := len(h); i < len(all); i++ {
		if !all[i].isWrite() {
			return fmt.Errorf("kvcheck: further write %d is a %s", i-len(h), all[i].Kind)
		}
	}
	byKey := map[string]*keyWrites{}
	merged := map[string]bool{}
	for i := range all {
		o := &all[i]
		if o.Kind == Merge {
			merged[o.Key] = true
			continue
		}
		if !o.isWrite() || o.Kind == CAS && !o.Out.Unknown && !o.Out.OK {
			continue
		}
		idx := o.index()
		ver := uint64(0)
		if !o.Out.Unknown {
			ver = o.Out.Version
		}
		add := func(key string, e effect) {
			if !e.present {
				e.value = ""
			}
			kw := byKey[key]
			if kw == nil {
				kw = &keyWrites{first: map[string]int64{}}
				byKey[key] = kw
			}
			w := &kwrite{pos: i, op: o, eff: e, group: o.Out.Group, idx: idx, ver: ver}
			if idx == 0 {
				kw.unknown = append(kw.unknown, w)
			} else {
				kw.known = append(kw.known, w)
			}
			if e.present {
				if t, ok := kw.first[e.value]; !ok || o.Call < t {
					kw.first[e.value] = o.Call
				}
			}
		}
		switch o.Kind {
		case Put, CAS:
			add(o.Key, effect{true, o.Value})
		case Delete:
			add(o.Key, effect{})
		case Batch:
			// The batch's effect on each key is its last op there.
			last := map[string]int{}
			for j, b := range o.Batch {
				last[b.Key] = j
			}
			for j, b := range o.Batch {
				if last[b.Key] == j {
					add(b.Key, effect{!b.Delete, b.Value})
				}
			}
		}
	}
	for _, kw := range byKey {
		slices.SortFunc(kw.known, func(a, b *kwrite) int {
			return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.idx, b.idx), cmp.Compare(a.ver, b.ver))
		})
		slices.SortFunc(kw.unknown, func(a, b *kwrite) int { return cmp.Compare(a.op.Call, b.op.Call) })
	}

	var errs []error
	n := 0
	for i := range h {
		g := &h[i]
		if g.Kind != Get || !g.Stale || g.Out.Unknown || merged[g.Key] {
			continue
		}
		var err *StaleError
		if msg := checkWritten(g, byKey[g.Key]); msg != "" {
			err = &StaleError{Property: NeverWritten, Pos: i, Op: *g, Msg: msg}
		} else if msg := checkPrefix(g, byKey[g.Key]); msg != "" {
			err = &StaleError{Property: WrongPrefix, Pos: i, Op: *g, Msg: msg}
		}
		if err != nil {
			if n < maxReported {
				errs = append(errs, err)
			}
			n++
		}
	}
	if n > maxReported {
		errs = append(errs, fmt.Errorf("kvcheck: and %d more stale-ok gets broke their promises", n-maxReported))
	}
	return errors.Join(errs...)
}

// checkWritten checks (a) for g, returning what is wrong.
func checkWritten(g *Op, kw *keyWrites) string {
	if !g.Out.Found {
		return ""
	}
	if kw == nil {
		return fmt.Sprintf("returned %q, but no write of %q was recorded", g.Out.Value, g.Key)
	}
	t, ok := kw.first[g.Out.Value]
	if !ok {
		return fmt.Sprintf("returned %q, which no write of %q wrote", g.Out.Value, g.Key)
	}
	if t > g.Return {
		return fmt.Sprintf("returned %q, which only writes called after the get returned (first at %d) wrote", g.Out.Value, t)
	}
	return ""
}

// checkPrefix checks (b) for g, returning what is wrong.
func checkPrefix(g *Op, kw *keyWrites) string {
	if kw == nil {
		kw = &keyWrites{}
	}
	got := effect{g.Out.Found, ""}
	if g.Out.Found {
		got.value = g.Out.Value
	}
	a, grp := g.Out.Applied, g.Out.Group
	// The latest writes of g's group with index <= a: those of one index,
	// narrowed to the latest version if every one has a version.
	end, _ := slices.BinarySearchFunc(kw.known, a, func(w *kwrite, a uint64) int {
		if w.group != grp {
			return cmp.Compare(w.group, grp)
		}
		if w.idx <= a {
			return -1
		}
		return 1
	})
	var tie []*kwrite
	if end > 0 && kw.known[end-1].group == grp {
		last := kw.known[end-1]
		start := end - 1
		for start > 0 && kw.known[start-1].group == grp && kw.known[start-1].idx == last.idx {
			start--
		}
		tie = kw.known[start:end]
		if !slices.ContainsFunc(tie, func(w *kwrite) bool { return w.ver == 0 }) {
			// Sorted by version: keep the latest (several only if
			// two writes claim one version).
			s := len(tie) - 1
			for s > 0 && tie[s-1].ver == tie[len(tie)-1].ver {
				s--
			}
			tie = tie[s:]
		}
	}
	for _, w := range tie {
		if w.eff == got {
			return ""
		}
	}
	if len(tie) == 0 && !got.present {
		return ""
	}
	// The writes of no known index (in g's group) called before g
	// returned may have been applied at any index.
	var loose []*kwrite
	for _, w := range kw.known {
		// Writes of other groups have no index comparable to a; writes
		// of g's group after a, called before g returned, may have been
		// applied before the replica read the key (a is a lower bound:
		// the state read is the one after entry a or a later one).
		if (w.group != grp || w.idx > a) && w.op.Call <= g.Return {
			loose = append(loose, w)
		}
	}
	for _, w := range kw.unknown {
		if w.op.Call > g.Return {
			break
		}
		loose = append(loose, w)
	}
	for _, w := range loose {
		if w.eff == got {
			return ""
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "reported applied index %d and returned %v, but ", a, got)
	if len(tie) == 0 {
		fmt.Fprintf(&b, "no write of %q with index <= %d was recorded (the key was absent)", g.Key, a)
	} else {
		fmt.Fprintf(&b, "the latest write of %q with index <= %d is ", g.Key, a)
		for i, w := range tie {
			if i > 0 {
				b.WriteString(" or ")
			}
			fmt.Fprintf(&b, "%s, which left %v", describe(w.pos, w.op), w.eff)
		}
	}
	if len(loose) > 0 {
		fmt.Fprintf(&b, "; %d writes of unknown index could have left", len(loose))
		for i, w := range loose {
			if i == 5 {
				b.WriteString(" ...")
				break
			}
			fmt.Fprintf(&b, " %v", w.eff)
		}
	}
	// Say whether the value is older or newer than reported.
	hint := ""
	for _, w := range kw.known {
		if w.group != grp || w.eff != got {
			continue
		}
		if w.idx > a {
			hint = fmt.Sprintf("newer than reported: %v was written by %s", got, describe(w.pos, w.op))
			break
		}
		if len(tie) > 0 && w.idx < tie[0].idx {
			hint = fmt.Sprintf("older than reported: %v was written by %s and overwritten at index %d <= %d",
				got, describe(w.pos, w.op), tie[0].idx, a)
		}
	}
	if hint == "" && !got.present && len(tie) > 0 {
		hint = fmt.Sprintf("older than reported: the key was written at index %d <= %d", tie[0].idx, a)
	}
	if hint != "" {
		b.WriteString("; ")
		b.WriteString(hint)
	}
	return b.String()
}
