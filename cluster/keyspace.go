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
// Every ordered keyspace lives in one B-link tree per group (btree.Store);
// keys of different keyspaces never collide because the internal key is
// the keyspace's ID byte followed by the user's key, so each keyspace is
// one contiguous range of the tree ([ID], [ID+1]). In this stage group 0
// owns the whole tree (one tablet, (-inf, +inf)); tablets move in B4.
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
		names[ks.Name], ids[ks.ID], size = true, true, n
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

// OrderedGroup is the group that owns the ordered tree's one tablet (in
// this stage, group 0: tablets that move come in B4).
func (m *Map) OrderedGroup() uint32 { return 0 }

// OrderedStore is group g's btree.Store config for a replica of the map
// (ok false: the map has no ordered keyspace and replicas build none).
// Group OrderedGroup owns the one tablet (-inf, +inf); other groups own
// none and answer StatusMoved.
func (m *Map) OrderedStore(g int) (cfg btree.StoreConfig, ok bool) {
	tc, ok := m.OrderedTree()
	if !ok {
		return cfg, false
	}
	cfg = btree.StoreConfig{Group: uint32(g), Tree: tc}
	if uint32(g) == m.OrderedGroup() {
		cfg.Tablets = []btree.Tablet{btree.All}
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
