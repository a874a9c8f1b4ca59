package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rdmakv/rdmakv/btree"
)

// Keyspace is a named keyspace of the cluster map. The default keyspace
// (the client's Put, Get, ...) is hashed and has no entry; a config
// declares ordered ones ([[keyspace]] in kvserver's TOML), which clients
// reach through Client.Keyspace(name).
//
// Every ordered keyspace lives in the groups' B-link trees (one per
// group, btree.Store); keys of different keyspaces never collide because
// the internal key is the keyspace's ID byte followed by the user's key,
// so each keyspace is one contiguous range of the key order ([ID],
// [ID+1]). The keyspaces' split points cut that order into tablets,
// placed round-robin over the groups (OrderedTablets); without split
// points group 0 owns the one tablet (-inf, +inf).
type Keyspace struct {
	// Name is how clients name it ([A-Za-z0-9_-]{1,64}, unique).
	Name string `json:"name"`
	// Kind is "ordered" (the only kind a keyspace may declare today).
	Kind string `json:"kind"`
	// ID prefixes the keyspace's internal keys (1..MaxKeyspaces, unique;
	// a config numbers its keyspaces 1, 2, ... in the order they are
	// declared, so append new ones at the end).
	ID uint8 `json:"id"`
	// NodeSize is the tree's node size in bytes (0: 4 KiB). Every
	// ordered keyspace shares the group's tree, so all give the same.
	NodeSize int `json:"node_size,omitempty"`
	// Splits are the keyspace's split points (user keys, strictly
	// increasing): each starts a tablet, so a keyspace with n of them
	// spreads over n+1 tablets (OrderedTablets places them).
	Splits []string `json:"splits,omitempty"`
	// FirstTabletMax is the keys past which a tablet splits while its
	// group owns fewer tablets than there are groups (0:
	// btree.DefaultFirstTabletMax; the first keyspace's applies to all,
	// like NodeSize). Maps only (tests): the config does not set it.
	FirstTabletMax int `json:"first_tablet_max,omitempty"`
}

// UniformSplits are the split points of count tablets over the keys
// prefix followed by decimal digits whose first two digits are about
// uniform (YCSB's "user" keys, for example): prefix followed by the
// two digits i*100/count for i = 1..count-1 (count 1..100).
func UniformSplits(prefix string, count int) []string {
	var out []string
	for i := 1; i < count; i++ {
		p := fmt.Sprintf("%s%02d", prefix, i*100/count)
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return out
}

// Keyspace kinds.
const (
	KindOrdered = "ordered"
	KindHashed  = "hashed"
)

// MaxKeyspaces bounds a map's keyspaces (one ID byte each).
const MaxKeyspaces = 255

// KeyspacePrefix is the length of the internal key's keyspace prefix.
const KeyspacePrefix = 1

// DefaultOrderedMaxKey bounds an ordered key (the user's bytes) when the
// cluster's max_key is larger: a node holds at least three entries of the
// longest key, so long keys leave little room for values.
const DefaultOrderedMaxKey = 255

// DefaultOrderedKeyspace is the ordered keyspace the embedded cluster
// (kvserver without --config) declares.
const DefaultOrderedKeyspace = "ordered"

// fillKeyspaces validates the map's keyspaces.
func (m *Map) fillKeyspaces() error {
	if len(m.Keyspaces) > MaxKeyspaces {
		return fmt.Errorf("%d keyspaces: want at most %d", len(m.Keyspaces), MaxKeyspaces)
	}
	names := map[string]bool{}
	ids := map[uint8]bool{}
	size := 0
	for i, ks := range m.Keyspaces {
		n := ks.NodeSize
		if n == 0 {
			n = btree.DefaultConfig.NodeSize
		}
		switch {
		case !nameRE.MatchString(ks.Name):
			return fmt.Errorf("keyspace %d: name %q: want [A-Za-z0-9_-]{1,64}", i, ks.Name)
		case names[ks.Name]:
			return fmt.Errorf("keyspace %q declared twice", ks.Name)
		case ks.Kind != KindOrdered:
			return fmt.Errorf("keyspace %q: kind %q: want %q", ks.Name, ks.Kind, KindOrdered)
		case ks.ID == 0 || ids[ks.ID]:
			return fmt.Errorf("keyspace %q: id %d: want a unique id 1..%d", ks.Name, ks.ID, MaxKeyspaces)
		case size != 0 && n != size:
			return fmt.Errorf("keyspace %q: node_size %d: every ordered keyspace shares the tree, whose node size is %d", ks.Name, n, size)
		}
		for j, sp := range ks.Splits {
			switch {
			case len(sp) == 0 || len(sp) > m.OrderedMaxKey():
				return fmt.Errorf("keyspace %q: split %d: %d bytes, want 1 to %d", ks.Name, j, len(sp), m.OrderedMaxKey())
			case j > 0 && sp <= ks.Splits[j-1]:
				return fmt.Errorf("keyspace %q: splits %q and %q: want strictly increasing split points", ks.Name, ks.Splits[j-1], sp)
			}
		}
		names[ks.Name], ids[ks.ID], size = true, true, n
	}
	if len(m.Groups) > 0 {
		per := map[uint32]int{}
		for _, p := range m.OrderedTablets() {
			if per[p.Group]++; per[p.Group] > btree.MaxTablets {
				return fmt.Errorf("keyspaces: the split points give group %d more than %d tablets", p.Group, btree.MaxTablets)
			}
		}
	}
	if cfg, ok := m.OrderedTree(); ok {
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("keyspaces: %v", err)
		}
	}
	return nil
}

// FindKeyspace returns the keyspace named name, or an error naming the
// configured ones.
func (m *Map) FindKeyspace(name string) (Keyspace, error) {
	for _, ks := range m.Keyspaces {
		if ks.Name == name {
			return ks, nil
		}
	}
	return Keyspace{}, fmt.Errorf("no keyspace %q in cluster %q (%s)", name, m.Name, m.keyspaceNames())
}

func (m *Map) keyspaceNames() string {
	if len(m.Keyspaces) == 0 {
		return "it declares none: add a [[keyspace]] to the kvserver config"
	}
	var ns []string
	for _, ks := range m.Keyspaces {
		ns = append(ns, strconv.Quote(ks.Name))
	}
	slices.Sort(ns)
	return "its keyspaces: " + strings.Join(ns, ", ")
}

// OrderedTree is the geometry of the groups' ordered tree, and whether
// the map has an ordered keyspace at all. Its MaxKey counts the keyspace
// prefix (OrderedMaxKey + KeyspacePrefix).
func (m *Map) OrderedTree() (btree.Config, bool) {
	if len(m.Keyspaces) == 0 {
		return btree.Config{}, false
	}
	cfg := btree.Config{NodeSize: m.Keyspaces[0].NodeSize, MaxKey: m.OrderedMaxKey() + KeyspacePrefix}
	if cfg.NodeSize == 0 {
		cfg.NodeSize = btree.DefaultConfig.NodeSize
	}
	return cfg, true
}

// OrderedMaxKey is the longest key of an ordered keyspace (the user's
// bytes): the cluster's max_key, at most DefaultOrderedMaxKey.
func (m *Map) OrderedMaxKey() int {
	k := m.Limits.MaxKey
	if k == 0 {
		k = DefaultOrderedMaxKey
	}
	return min(k, DefaultOrderedMaxKey)
}

// OrderedMaxValue is the longest value of an ordered keyspace: values are
// stored in the tree's leaves, so a node bounds them (about a fifth of
// the node size with keys of DefaultOrderedMaxKey bytes); the cluster's
// max_value bounds them too.
func (m *Map) OrderedMaxValue() int {
	cfg, ok := m.OrderedTree()
	if !ok {
		return 0
	}
	v := cfg.MaxInline()
	if m.Limits.MaxValue > 0 {
		v = min(v, m.Limits.MaxValue)
	}
	return v
}

// OrderedTablets are the ordered key order's initial tablets, in key
// order, and their groups: every keyspace's split points (as internal
// keys) cut (-inf, +inf), and tablet i goes to group i mod the number of
// groups. Without split points, group 0 owns the one tablet.
func (m *Map) OrderedTablets() []btree.Placed {
	var points []string
	for _, ks := range m.Keyspaces {
		for _, sp := range ks.Splits {
			points = append(points, string(ks.InternalKey(nil, []byte(sp))))
		}
	}
	slices.Sort(points)
	points = slices.Compact(points)
	ng := max(len(m.Groups), 1)
	out := make([]btree.Placed, 0, len(points)+1)
	var low []byte
	for i := 0; i <= len(points); i++ {
		p := btree.Placed{Tablet: btree.Tablet{Low: low, HighInf: i == len(points)}, Group: uint32(i % ng)}
		if i < len(points) {
			p.High = []byte(points[i])
			low = p.High
		}
		out = append(out, p)
	}
	return out
}

// OrderedGroups are the groups that own an initial tablet.
func (m *Map) OrderedGroups() []uint32 {
	var out []uint32
	for _, p := range m.OrderedTablets() {
		if !slices.Contains(out, p.Group) {
			out = append(out, p.Group)
		}
	}
	slices.Sort(out)
	return out
}

// OrderedStore is group g's btree.Store config for a replica of the map
// (ok false: the map has no ordered keyspace and replicas build none):
// the tablets OrderedTablets gives g (a group with none answers every
// ordered request StatusMoved).
func (m *Map) OrderedStore(g int) (cfg btree.StoreConfig, ok bool) {
	tc, ok := m.OrderedTree()
	if !ok {
		return cfg, false
	}
	cfg = btree.StoreConfig{Group: uint32(g), Tree: tc}
	for _, p := range m.OrderedTablets() {
		if p.Group == uint32(g) {
			cfg.Tablets = append(cfg.Tablets, p.Tablet)
		}
	}
	if len(m.Groups) > 1 {
		// A fresh load cuts tablets early, which client.Balance
		// spreads over the groups (docs/btree.md, "Moving a tablet").
		cfg.EarlySplit = len(m.Groups)
		cfg.FirstTabletMax = m.Keyspaces[0].FirstTabletMax
	}
	cfg.Readers = append(append(cfg.Readers, m.ClientNodes...), m.Groups[g]...)
	return cfg, true
}

// InternalKey is ks's internal key of key: ID then key, appended to dst.
func (ks Keyspace) InternalKey(dst, key []byte) []byte {
	return append(append(dst, ks.ID), key...)
}

// Range is the internal key range [start, end) of the keyspace's keys in
// [from, to) (from empty: the keyspace's first key; to empty: past its last;
// end nil: no upper bound, for the last possible ID).
func (ks Keyspace) Range(from, to []byte) (start, end []byte) {
	start = ks.InternalKey(nil, from)
	switch {
	case len(to) > 0:
		end = ks.InternalKey(nil, to)
	case ks.ID < MaxKeyspaces:
		end = []byte{ks.ID + 1}
	}
	return start, end
}

// ParseByteSize parses a size such as "4KiB", "512B", "4096" (K, KB and
// KiB all mean 1024 bytes; M, MB and MiB 1024*1024).
func ParseByteSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"K", 1 << 10}, {"M", 1 << 20}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (1<<30)/mult {
		return 0, fmt.Errorf("%q: want a size such as \"4KiB\" or \"4096\"", s)
	}
	return n * mult, nil
}
