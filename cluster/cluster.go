// Package cluster is the cluster map: what every replica and client of an
// rdmakv cluster agrees on before it starts. The groups and their replicas'
// node ids, the fabric that connects them, the overlay tree TRAM orders
// multi-group messages along, the assignment of the fixed hash slots to
// groups, the client slots, and the limits on keys, values and messages.
//
// A map is a JSON file (Load, Save); kvserver (its TOML or YAML config)
// writes one for the clients of the cluster it runs.
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// Map is a cluster map.
type Map struct {
	// Name names the cluster; on shm it names the cluster's files
	// ([A-Za-z0-9_-]{1,64}).
	Name string `json:"name"`
	// Fabric is "shm" (processes on one host), "tcp" (hosts) or "mem"
	// (one process: tests; the map is then used in memory only).
	Fabric string `json:"fabric"`
	// ShmDir is the shm fabric's directory; default /dev/shm.
	ShmDir string `json:"shm_dir,omitempty"`
	// Addrs maps node ids to host:port (tcp).
	Addrs map[rdma.NodeID]string `json:"addrs,omitempty"`
	// Groups lists each group's replicas (node ids), group 0 first.
	Groups [][]rdma.NodeID `json:"groups"`
	// Tree is the overlay in tree.Parse's text form; empty: a chain
	// (group g's parent is g-1), which a single group needs nothing of.
	Tree string `json:"tree,omitempty"`
	// Slots assigns each of kv.NumHashSlots hash slots a group; empty:
	// spread evenly (slot s to group s mod len(Groups)).
	Slots []uint32 `json:"slots,omitempty"`
	// ClientNodes are the node ids of the client slots (slot k is
	// ClientNodes[k]).
	ClientNodes []rdma.NodeID `json:"client_nodes"`
	// Limits bound keys, values and messages; zero fields take defaults.
	Limits Limits `json:"limits"`
	// Keyspaces are the named keyspaces (ordered ones: keyspace.go);
	// the default keyspace is hashed and not listed.
	Keyspaces []Keyspace `json:"keyspaces,omitempty"`
	// Durability is the replicas' durability mode (DurabilityMemory,
	// DurabilitySync or DurabilityAsync; empty: not said, as memory).
	// Clients choose defaults by it: a write on a sync cluster waits for
	// an fsync anyway, so the client holds writes for larger messages
	// (client.WithCombineHold).
	Durability string `json:"durability,omitempty"`
}

// Limits are the cluster's size limits.
type Limits struct {
	// MaxKey and MaxValue bound a key and a value in bytes (default
	// 1 KiB and 1 MiB).
	MaxKey   int `json:"max_key,omitempty" toml:"max_key"`
	MaxValue int `json:"max_value,omitempty" toml:"max_value"`
	// SlotSize is the byte size of a client's request slot; a request
	// (its keys and values, encoded) larger than one slot is sent in
	// parts. Default 4096.
	SlotSize int `json:"slot_size,omitempty" toml:"slot_size"`
	// ClientSlots is how many requests a client may have outstanding to
	// each group (default 8).
	ClientSlots int `json:"client_slots,omitempty" toml:"client_slots"`
	// MaxBatch bounds the operations of a batch (default 1024).
	MaxBatch int `json:"max_batch,omitempty" toml:"max_batch"`
	// ClientRate bounds the write requests per second a group's leader
	// takes from each client (0: no bound). A client over it is slowed
	// (its writes wait), not refused; combined writes count once.
	ClientRate float64 `json:"client_rate,omitempty" toml:"client_rate"`
}

// Defaults of Limits.
const (
	DefaultSlotSize = 4096
	DefaultMaxBatch = 1024
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("cluster: invalid map")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Fill sets defaults and validates the map.
func (m *Map) Fill() error {
	l := &m.Limits
	if l.MaxKey == 0 {
		l.MaxKey = kv.DefaultMaxKey
	}
	if l.MaxValue == 0 {
		l.MaxValue = kv.DefaultMaxValue
	}
	if l.SlotSize == 0 {
		l.SlotSize = DefaultSlotSize
	}
	if l.ClientSlots == 0 {
		l.ClientSlots = multicast.DefaultClientSlots
	}
	if l.MaxBatch == 0 {
		l.MaxBatch = DefaultMaxBatch
	}
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	switch {
	case !nameRE.MatchString(m.Name):
		return bad("name %q: want [A-Za-z0-9_-]{1,64}", m.Name)
	case m.Fabric != "shm" && m.Fabric != "tcp" && m.Fabric != "mem":
		return bad("fabric %q: want shm, tcp or mem", m.Fabric)
	case len(m.Groups) == 0 || len(m.Groups) > tree.MaxGroups:
		return bad("%d groups: want 1..%d", len(m.Groups), tree.MaxGroups)
	case len(m.ClientNodes) == 0:
		return bad("no client_nodes")
	case l.MaxKey < 1 || l.MaxValue < 0 || l.MaxBatch < 1 || l.ClientRate < 0:
		return bad("limits %+v", *l)
	case l.SlotSize < 256 || l.SlotSize%8 != 0:
		return bad("slot_size %d: want a multiple of 8, at least 256", l.SlotSize)
	case m.Durability != "" && m.Durability != DurabilityMemory && m.Durability != DurabilitySync && m.Durability != DurabilityAsync:
		return bad("durability %q: want memory, sync or async", m.Durability)
	}
	seen := map[rdma.NodeID]string{}
	for g, ms := range m.Groups {
		if len(ms) == 0 {
			return bad("group %d has no replicas", g)
		}
		for _, id := range ms {
			if w, ok := seen[id]; ok {
				return bad("node %d is in group %d and %s", id, g, w)
			}
			seen[id] = fmt.Sprintf("group %d", g)
		}
	}
	for k, id := range m.ClientNodes {
		if w, ok := seen[id]; ok && w[0] == 'g' {
			return bad("client slot %d's node %d is a replica of %s", k, id, w)
		}
		seen[id] = "client"
	}
	if m.Fabric == "tcp" {
		for id := range seen {
			if m.Addrs[id] == "" && seen[id] != "client" {
				return bad("node %d has no address", id)
			}
		}
	}
	if m.Slots == nil {
		m.Slots = EvenSlots(len(m.Groups))
	}
	if len(m.Slots) != kv.NumHashSlots {
		return bad("%d hash slots: want %d", len(m.Slots), kv.NumHashSlots)
	}
	for s, g := range m.Slots {
		if int(g) >= len(m.Groups) {
			return bad("hash slot %d assigned to group %d of %d", s, g, len(m.Groups))
		}
	}
	if _, err := m.Overlay(); err != nil {
		return bad("tree: %v", err)
	}
	if err := m.fillKeyspaces(); err != nil {
		return bad("%v", err)
	}
	return nil
}

// EvenSlots spreads the hash slots over n groups.
func EvenSlots(n int) []uint32 {
	s := make([]uint32, kv.NumHashSlots)
	for i := range s {
		s[i] = uint32(i % n)
	}
	return s
}

// Overlay is the map's tree.
func (m *Map) Overlay() (*tree.Tree, error) {
	if m.Tree == "" {
		parents := make([]int, len(m.Groups))
		for g := range parents {
			parents[g] = g - 1
		}
		return tree.FromParents(parents)
	}
	t, err := tree.Parse(m.Tree)
	if err != nil {
		return nil, err
	}
	if t.Len() != len(m.Groups) {
		return nil, fmt.Errorf("tree has %d groups, map %d", t.Len(), len(m.Groups))
	}
	return t, nil
}

// GroupOf is the group of a key.
func (m *Map) GroupOf(key []byte) uint32 { return m.Slots[kv.HashSlot(key)] }

// Load reads and validates a map file.
func Load(path string) (*Map, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Map
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, path, err)
	}
	if err := m.Fill(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &m, nil
}

// Save writes the map to path atomically (a temporary file renamed).
func (m *Map) Save(path string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".map-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// MaxResult is the result size every group's replies carry: a multi
// request's results (kv.MultiResultSize).
const MaxResult = kv.MultiResultSize

// ReplicaConfig is the configuration of a replica of group g (bc
// configures its Acuerdo instance: timeouts, ring sizes; Self and Start
// are the caller's).
func (m *Map) ReplicaConfig(g int, bc broadcast.Config) (kv.ReplicaConfig, error) {
	t, err := m.Overlay()
	if err != nil {
		return kv.ReplicaConfig{}, err
	}
	heap := kv.DefaultHeapRegionSize
	for heap < 2*(m.Limits.MaxKey+m.Limits.MaxValue+64) {
		heap *= 2
	}
	return kv.ReplicaConfig{
		Multicast: multicast.Config{Group: tree.Group(g), Tree: t, Members: m.Groups, ClientNodes: m.ClientNodes,
			ClientSlots: m.Limits.ClientSlots, SlotSize: m.Limits.SlotSize, MaxResult: MaxResult, ClientRate: m.Limits.ClientRate, Broadcast: bc},
		Table: kv.TableConfig{SlotMap: m.Slots, MaxKey: m.Limits.MaxKey, MaxValue: m.Limits.MaxValue, HeapRegionSize: heap},
	}, nil
}
