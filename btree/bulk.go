package btree

import "fmt"

// DefaultFill is the fraction of a node that a bulk load fills.
const DefaultFill = 0.7

// KVV is a key, its value and its version: what a bulk load takes.
type KVV struct {
	Key, Value []byte
	Version    uint64
}

// bulkPlan lays out a tree over sorted entries: the images of every level,
// leaves first, without ids. Each node is filled up to fill * NodeSize
// (at least one entry), counting room for a high fence of MaxKey bytes.
func (c Config) bulkPlan(ents []KVV, fill float64, stamp uint64) [][]*image {
	limit := int(fill * float64(c.NodeSize))
	// A node takes at least one entry (a leaf) or two (an inner node, so
	// that each level is smaller than the one below); entries are at most
	// maxEntry, so that many always fit NodeSize.
	room := func(m *image, add int) bool {
		if len(m.keys) == 0 || !m.leaf() && len(m.keys) < 2 {
			return true
		}
		return m.size()+add+2+c.MaxKey <= limit
	}
	var leaves []*image
	cur := &image{stamp: stamp}
	for _, e := range ents {
		if !room(cur, offSize+leafEnt+len(e.Key)+len(e.Value)) {
			leaves = append(leaves, cur)
			cur = &image{stamp: stamp, low: e.Key}
		}
		cur.keys = append(cur.keys, e.Key)
		cur.vals = append(cur.vals, e.Value)
		cur.vers = append(cur.vers, e.Version)
	}
	leaves = append(leaves, cur)
	levels := [][]*image{leaves}
	for lvl := 1; len(levels[lvl-1]) > 1; lvl++ {
		var up []*image
		p := &image{stamp: stamp, level: lvl}
		for _, ch := range levels[lvl-1] {
			if !room(p, offSize+innerEnt+len(ch.low)) {
				up = append(up, p)
				p = &image{stamp: stamp, level: lvl, low: ch.low}
			}
			p.keys = append(p.keys, ch.low)
			p.kids = append(p.kids, 0) // ids later
		}
		levels = append(levels, append(up, p))
	}
	return levels
}

// bulkSlots is the number of nodes a bulk load of ents makes.
func (c Config) bulkSlots(ents []KVV, fill float64) int {
	n := 0
	for _, l := range c.bulkPlan(ents, fill, 0) {
		n += len(l)
	}
	return n
}

// Load builds a tree of the sorted, distinct entries ents in arena a (whose
// free slots it takes, lowest first from a reset arena), every node
// written at stamp and filled to fill (0: DefaultFill) of NodeSize: what a
// replica restoring a snapshot does. The entries' bytes are copied into
// the nodes.
func Load(cfg Config, a *Arena, ents []KVV, fill float64, stamp uint64) (*Tree, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fill <= 0 || fill > 1 {
		fill = DefaultFill
	}
	t := &Tree{cfg: cfg, a: a, scratch: make([]byte, cfg.NodeSize)}
	for i, e := range ents {
		if err := t.checkSizes(e.Key, e.Value); err != nil {
			return nil, err
		}
		if i > 0 && string(e.Key) <= string(ents[i-1].Key) {
			return nil, fmt.Errorf("btree: load: key %q after %q", e.Key, ents[i-1].Key)
		}
	}
	levels := cfg.bulkPlan(ents, fill, stamp)
	// Ids level by level, left to right; then links, fences and
	// children; then write every node, leaves first (nothing reads the
	// tree before its header names the root).
	for _, l := range levels {
		for _, m := range l {
			m.id = a.alloc()
		}
	}
	for lvl, l := range levels {
		for i, m := range l {
			if i > 0 {
				m.prev = l[i-1].id
			}
			if i+1 < len(l) {
				m.next, m.high = l[i+1].id, l[i+1].low
			} else {
				m.highInf = true
			}
			if lvl > 0 {
				// Children: the next level down, in order.
				base := 0
				for _, q := range l[:i] {
					base += len(q.kids)
				}
				for k := range m.kids {
					m.kids[k] = levels[lvl-1][base+k].id
				}
			}
		}
	}
	for _, l := range levels {
		for _, m := range l {
			t.write(m)
		}
	}
	t.root = levels[len(levels)-1][0].id
	t.len = len(ents)
	for _, e := range ents {
		t.pairs += snapPairSize(len(e.Key), len(e.Value))
	}
	return t, nil
}
