package btree

import "fmt"

// Check verifies the whole tree as its writer sees it and returns the
// first violation: every node validates and is alive; levels count down
// to the leaves; each level, walked through next links from its leftmost
// node, is exactly its parents' children in order, with prev links that
// mirror next; fences are contiguous along each level (a node's high fence
// is the next node's low fence, the first low fence is empty, the last
// high fence is +inf) and agree with the parents' keys; the number of keys
// is Len. Simulators and tests call it after changes; it reads every node.
func (t *Tree) Check() error {
	read := func(id NodeID) (Node, error) {
		if id == 0 || id.Slot() >= t.a.n {
			return Node{}, fmt.Errorf("pointer %v outside the arena", id)
		}
		n, err := Decode(t.a.bytes(id.Slot()), id)
		if err != nil {
			return n, fmt.Errorf("node %v: %w", id, err)
		}
		if n.Dead {
			return n, fmt.Errorf("node %v is dead but reachable", id)
		}
		return n, nil
	}
	root, err := read(t.root)
	if err != nil {
		return err
	}
	if len(root.Low) != 0 || !root.HighInf || root.Next != 0 || root.Prev != 0 {
		return fmt.Errorf("root %v: fences [%q, inf=%v) links %v/%v", root.ID, root.Low, root.HighInf, root.Prev, root.Next)
	}
	level := []Node{root}
	keys, pairs := 0, 0
	for {
		// The expected next level: the children of this one, in order,
		// with the fences the parents give them.
		type want struct {
			id      NodeID
			low, hi []byte
			hiInf   bool
		}
		var next []want
		for _, p := range level {
			if p.Leaf {
				continue
			}
			it := p.Entries()
			var ents []Entry
			for e, ok := it.next(); ok; e, ok = it.next() {
				ents = append(ents, e)
			}
			for i, e := range ents {
				w := want{id: e.Child, low: e.Key, hi: p.High, hiInf: p.HighInf}
				if i+1 < len(ents) {
					w.hi, w.hiInf = ents[i+1].Key, false
				}
				next = append(next, w)
			}
		}
		if level[0].Leaf {
			for _, n := range level {
				keys += n.Count
				it := n.Entries()
				for e, ok := it.next(); ok; e, ok = it.next() {
					pairs += snapPairSize(len(e.Key), len(e.Value))
				}
			}
			break
		}
		// Walk the child level through next links and compare.
		var prev NodeID
		id := next[0].id
		var got []Node
		for id != 0 {
			n, err := read(id)
			if err != nil {
				return err
			}
			if n.Prev != prev {
				return fmt.Errorf("node %v: prev %v, want %v", n.ID, n.Prev, prev)
			}
			if n.Level != level[0].Level-1 {
				return fmt.Errorf("node %v: level %d under level %d", n.ID, n.Level, level[0].Level)
			}
			got = append(got, n)
			if len(got) > len(next) {
				return fmt.Errorf("level %d: more nodes through next links than children (%d)", n.Level, len(next))
			}
			prev, id = n.ID, n.Next
		}
		if len(got) != len(next) {
			return fmt.Errorf("level %d: %d nodes through next links, %d children", level[0].Level-1, len(got), len(next))
		}
		for i, n := range got {
			w := next[i]
			if n.ID != w.id {
				return fmt.Errorf("level %d position %d: node %v through links, child %v in parents", n.Level, i, n.ID, w.id)
			}
			if string(n.Low) != string(w.low) || n.HighInf != w.hiInf || (!w.hiInf && string(n.High) != string(w.hi)) {
				return fmt.Errorf("node %v: fences [%q, %q inf=%v), parent says [%q, %q inf=%v)", n.ID, n.Low, n.High, n.HighInf, w.low, w.hi, w.hiInf)
			}
		}
		level = got
	}
	if keys != t.len {
		return fmt.Errorf("%d keys in leaves, Len %d", keys, t.len)
	}
	if pairs != t.pairs {
		return fmt.Errorf("%d snapshot bytes of entries in leaves, counted %d", pairs, t.pairs)
	}
	return nil
}

// Stats describes the tree's shape.
type Stats struct {
	Height    int
	Leaves    int
	Inner     int
	EmptyLeaf int     // leaves with no key
	LeafFill  float64 // bytes used by leaves over their NodeSize total
	Keys      int
}

// Stats walks every level (through the leftmost path and next links).
func (t *Tree) Stats() Stats {
	var s Stats
	id := t.root
	used := 0
	for id != 0 {
		n, err := Decode(t.a.bytes(id.Slot()), id)
		if err != nil {
			panic(fmt.Sprintf("btree: writer's node %v: %v", id, err))
		}
		s.Height++
		var first NodeID
		if !n.Leaf {
			it := n.Entries()
			e, _ := it.next()
			first = e.Child
		}
		for cur := n; ; {
			if cur.Leaf {
				s.Leaves++
				s.Keys += cur.Count
				used += int(leU16(t.a.bytes(cur.ID.Slot())[offUsed:]))
				if cur.Count == 0 {
					s.EmptyLeaf++
				}
			} else {
				s.Inner++
			}
			if cur.Next == 0 {
				break
			}
			cur, _ = Decode(t.a.bytes(cur.Next.Slot()), cur.Next)
		}
		id = first
	}
	if s.Leaves > 0 {
		s.LeafFill = float64(used) / float64(s.Leaves*t.cfg.NodeSize)
	}
	return s
}
