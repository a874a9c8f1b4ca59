package client_test

// Metamorphic tests of the client and a whole in-process cluster (in the
// spirit of pebble's): one seeded sequence of operations (puts of small
// values and of large ones, up to 300 KiB, which the client sends in
// parts; deletes; compare-and-swaps by value and by version;
// compare-and-deletes; batches over the keys of several groups;
// linearizable and stale-ok gets, of absent keys too; calls the client
// refuses) runs against several cluster configurations (table geometry,
// max load, heap region size, 1 or 3 groups, mem or shm fabric) and
// against a plain Go map. Every operation's outcome (found and value of a
// get, success or mismatch of a compare-and-swap, the error of a call)
// must be the model's, exactly, in every configuration.
//
// Versions are entry indexes, so they differ from one configuration to
// another: they are checked only within a run, against the versions the
// run's own writes returned (a write's Prev is the version the key had, a
// linearizable get returns the version of the last write, so the version
// changes whenever the value is written, even with the same bytes), and a
// CompareVersionAndSwap with the version just read must succeed as the
// model says.
//
// Stale-ok gets are compared loosely, but exactly so: the value must be
// one the model held for the key at some point, and more precisely the
// state the key had after some entry at or after the get's Applied index
// (the replica's position when the get began, a lower bound) and no later
// than the last acknowledged write (every write before the get was
// acknowledged: the calls are sequential). The run knows the entry index
// of each of its writes (from the versions they return), so it knows the
// key's states by entry index; the version read must be that state's.
// Their outcome is then left out of the comparison across configurations.
//
// The table geometry is no knob of cluster.Map, so the replicas are
// started here (metaStart), as internal/localcluster starts them, with the
// TableConfig from Map.ReplicaConfig changed; one configuration runs on
// internal/localcluster itself, with the map's defaults.
//
// Replay one seed: go test ./client -run Metamorphic -metaseed=N (or
// METASEED=N); -metaseeds=N runs seeds 1..N, -metaops=N makes N operations
// a seed, -metabugs runs the configurations skipped for a known bug.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

var (
	metaSeedFlag  = flag.Uint64("metaseed", 0, "metamorphic tests: replay this one seed")
	metaSeedsFlag = flag.Int("metaseeds", 0, "metamorphic tests: run seeds 1..n (default a few, fewer under -race)")
	metaBugsFlag  = flag.Bool("metabugs", false, "metamorphic tests: run the configurations that hit a known bug too")
	metaOpsFlag   = flag.Int("metaops", 0, "metamorphic tests: operations per seed (default 800, fewer under -race)")
)

func metaSeedList(t *testing.T, def int) []uint64 {
	if *metaSeedFlag != 0 {
		return []uint64{*metaSeedFlag}
	}
	if s := os.Getenv("METASEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v == 0 {
			t.Fatalf("METASEED=%q: want a positive integer", s)
		}
		return []uint64{v}
	}
	if *metaSeedsFlag > 0 {
		def = *metaSeedsFlag
	}
	seeds := make([]uint64, def)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// Limits every configuration shares.
const (
	metaMaxKey     = kv.DefaultMaxKey
	metaMaxValue   = 384 << 10
	metaMaxRequest = metaMaxKey + metaMaxValue + 4096 // the client's and the tables' bound on a request
	// metaSmallHeap holds one record of the largest class and a few
	// more: records spill over many heap regions.
	metaSmallHeap = 512 << 10
	metaKeys      = 400
	metaLong      = 6
	metaBig       = 4
	metaAbsent    = 20
)

// metaClusterConfig is one cluster configuration.
type metaClusterConfig struct {
	name        string
	fabric      string // mem or shm
	groups      int
	logBuckets  int     // 0: kv's default
	migrateStep int     // 0: kv's default
	maxLoad     float64 // 0: kv's default
	heapRegion  int     // 0: Map.ReplicaConfig's
	// localcluster: start it with internal/localcluster (every table
	// knob at its default).
	localcluster bool
	// bug names a known bug the configuration hits: skipped unless
	// -metabugs.
	bug string
}

// The first six configurations cover every pair of the choices geometry
// (4 buckets growing one migrated bucket per entry, or kv's 1024 and 8),
// max load (0.95 or 0.1), heap regions (512 KiB or the map's 64 MiB),
// groups (1 or 3) and fabric (mem or shm). The next two run two of them at
// the default max load (they found a bug, fixed since: a put growing the
// index mid-request lost the request's later keys); the last runs on
// internal/localcluster with every default.
var metaClusterConfigs = []metaClusterConfig{
	{name: "mem-1g-default-load0.95", fabric: "mem", groups: 1, maxLoad: 0.95},
	{name: "shm-1g-lb2ms1-load0.1", fabric: "shm", groups: 1, logBuckets: 2, migrateStep: 1, maxLoad: 0.1},
	{name: "shm-1g-lb2ms1-load0.95-smallheap", fabric: "shm", groups: 1, logBuckets: 2, migrateStep: 1, maxLoad: 0.95, heapRegion: metaSmallHeap},
	{name: "mem-3g-lb2ms1-load0.95", fabric: "mem", groups: 3, logBuckets: 2, migrateStep: 1, maxLoad: 0.95},
	{name: "shm-3g-default-load0.1-smallheap", fabric: "shm", groups: 3, maxLoad: 0.1, heapRegion: metaSmallHeap},
	{name: "mem-3g-lb2ms1-load0.1-smallheap", fabric: "mem", groups: 3, logBuckets: 2, migrateStep: 1, maxLoad: 0.1, heapRegion: metaSmallHeap},
	// Two of the above at the default max load.
	{name: "shm-1g-lb2ms1-load0.75-smallheap", fabric: "shm", groups: 1, logBuckets: 2, migrateStep: 1, heapRegion: metaSmallHeap},
	{name: "mem-3g-lb2ms1-load0.75", fabric: "mem", groups: 3, logBuckets: 2, migrateStep: 1},
	{name: "mem-3g-localcluster", fabric: "mem", groups: 3, localcluster: true},
}

// Operations.
type metaOpKind uint8

const (
	moPut metaOpKind = iota
	moDelete
	moCAS // CompareAndSwap (by value)
	moCVS // CompareVersionAndSwap
	moCAD // CompareAndDelete (by version)
	moBatch
	moGet      // linearizable
	moGetStale // stale-ok
	moGetDefault
	moBadPut // refused by the client: an empty or oversized key, an oversized value
	moBadGet
	moBatchTooMany
	moMerge // UpdateFields
)

// Version sources of moCVS and moCAD.
const (
	metaVerLast   = iota // the version the last linearizable get of the key read
	metaVerBefore        // the one the get before it read
	metaVerZero          // 0: the key must be absent
)

type metaOp struct {
	kind   metaOpKind
	client int
	key    []byte
	value  []byte
	old    []byte // moCAS; nil: the key must be absent
	verSrc uint8
	batch  []metaBatchOp
	fields map[string][]byte // moMerge (value: the merged value the model expects)
	exists bool              // moMerge: UpdateExistingFields
	want   string
}

type metaBatchOp struct {
	del        bool
	key, value []byte
}

func metaShortKey(k []byte) string {
	if len(k) > 24 {
		return fmt.Sprintf("%q...(%d bytes)", k[:16], len(k))
	}
	return fmt.Sprintf("%q", k)
}

func (o *metaOp) String() string {
	var s string
	switch o.kind {
	case moPut, moBadPut:
		s = fmt.Sprintf("put %s (%d bytes)", metaShortKey(o.key), len(o.value))
	case moDelete:
		s = fmt.Sprintf("delete %s", metaShortKey(o.key))
	case moCAS:
		if o.old == nil {
			s = fmt.Sprintf("compare-and-swap %s if absent, to %d bytes", metaShortKey(o.key), len(o.value))
		} else {
			s = fmt.Sprintf("compare-and-swap %s if %d bytes %08x, to %d bytes", metaShortKey(o.key), len(o.old), crc32.ChecksumIEEE(o.old), len(o.value))
		}
	case moCVS:
		s = fmt.Sprintf("compare-version-and-swap %s (version source %d) to %d bytes", metaShortKey(o.key), o.verSrc, len(o.value))
	case moCAD:
		s = fmt.Sprintf("compare-and-delete %s (version source %d)", metaShortKey(o.key), o.verSrc)
	case moBatch, moBatchTooMany:
		var b strings.Builder
		for i, bo := range o.batch {
			if i == 8 {
				fmt.Fprintf(&b, " ... (%d ops)", len(o.batch))
				break
			}
			if bo.del {
				fmt.Fprintf(&b, " del %s", metaShortKey(bo.key))
			} else {
				fmt.Fprintf(&b, " put %s (%d bytes)", metaShortKey(bo.key), len(bo.value))
			}
		}
		s = "batch [" + b.String() + " ]"
	case moMerge:
		s = fmt.Sprintf("update fields %s %q (if it exists: %v; %d bytes after)", metaShortKey(o.key), slices.Sorted(maps.Keys(o.fields)), o.exists, len(o.value))
	case moGet, moBadGet:
		s = fmt.Sprintf("linearizable get %s", metaShortKey(o.key))
	case moGetStale:
		s = fmt.Sprintf("stale-ok get %s", metaShortKey(o.key))
	case moGetDefault:
		s = fmt.Sprintf("get %s", metaShortKey(o.key))
	}
	return fmt.Sprintf("client %d: %s", o.client, s)
}

// metaModel is the plain map: values, and a token per write standing for
// the version (0: absent), as versions differ across configurations.
type metaModel struct {
	recs  map[string]metaRec
	token uint64
	regs  map[string][2]uint64 // tokens the last two linearizable gets read
}

type metaRec struct {
	value []byte
	token uint64
}

func (m *metaModel) put(k, v []byte) {
	m.token++
	m.recs[string(k)] = metaRec{value: v, token: m.token}
}

func metaPad8(n int) int { return (n + 7) &^ 7 }

func metaGetOutcome(found bool, v []byte) string {
	if !found {
		return "not found"
	}
	return fmt.Sprintf("found %d bytes %08x", len(v), crc32.ChecksumIEEE(v))
}

// metaGen generates the sequence and, applying it to the model as it
// goes, each operation's expected outcome.
type metaGen struct {
	rng  *rand.Rand
	m    *metaModel
	ops  []metaOp
	pool [][]byte
	hist map[string][][]byte
	bigs int // large values so far
}

func metaLongKey(i int) []byte {
	n := 200 + i*(metaMaxKey-200)/(metaLong-1)
	b := []byte(fmt.Sprintf("long%d-", i))
	for len(b) < n {
		b = append(b, byte('a'+len(b)%26))
	}
	return b[:n]
}

func (g *metaGen) key() []byte {
	switch r := g.rng.IntN(100); {
	case r < 80:
		return []byte(fmt.Sprintf("k%d", g.rng.IntN(metaKeys)))
	case r < 87:
		return metaLongKey(g.rng.IntN(metaLong))
	default:
		return []byte(fmt.Sprintf("big%d", g.rng.IntN(metaBig)))
	}
}

func (g *metaGen) bytes(n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		v := g.rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b[:n:n]
}

// value is a small value, or for the big keys often a large one (sent in
// parts: the slot is 4 KiB).
func (g *metaGen) value(k []byte, bigBudget int) []byte {
	if bytes.HasPrefix(k, []byte("big")) && g.bigs < bigBudget && g.rng.IntN(3) > 0 {
		g.bigs++
		switch r := g.rng.IntN(10); {
		case r < 3:
			return g.bytes(3900 + g.rng.IntN(300)) // about one slot
		case r < 7:
			return g.bytes(5000 + g.rng.IntN(60<<10))
		default:
			return g.bytes(64<<10 + g.rng.IntN(236<<10)) // up to 300 KiB
		}
	}
	switch r := g.rng.IntN(100); {
	case r < 8:
		return []byte{}
	case r < 40:
		return g.pool[g.rng.IntN(len(g.pool))] // values repeat: versions change anyway
	case r < 93:
		return g.bytes(1 + g.rng.IntN(100))
	default:
		return g.bytes(100 + g.rng.IntN(3000))
	}
}

func (g *metaGen) note(k, v []byte) {
	if h := g.hist[string(k)]; len(h) < 6 {
		g.hist[string(k)] = append(h, v)
	}
}

func (g *metaGen) add(o metaOp) { g.ops = append(g.ops, o) }

// get appends a get (and applies it to the model's registers).
func (g *metaGen) get(client int, k []byte, kind metaOpKind) {
	r, found := g.m.recs[string(k)]
	want := metaGetOutcome(found, r.value)
	switch kind {
	case moGetStale:
		want = "stale"
	case moGet: // Get (moGetDefault) returns no version
		reg := g.m.regs[string(k)]
		g.m.regs[string(k)] = [2]uint64{r.token, reg[0]}
	}
	g.add(metaOp{kind: kind, client: client, key: k, want: want})
}

// metaGenerate makes n operations, then a linearizable get of every key.
func metaGenerate(seed uint64, n, bigBudget int) []metaOp {
	g := &metaGen{rng: rand.New(rand.NewPCG(seed, 0x636c6965)), m: &metaModel{recs: map[string]metaRec{}, regs: map[string][2]uint64{}}, hist: map[string][][]byte{}}
	for range 6 {
		g.pool = append(g.pool, g.bytes(g.rng.IntN(20)))
	}
	m := g.m
	for len(g.ops) < n {
		c := g.rng.IntN(2)
		k := g.key()
		cur, found := m.recs[string(k)]
		switch r := g.rng.IntN(1000); {
		case r < 280:
			v := g.value(k, bigBudget)
			m.put(k, v)
			g.note(k, v)
			g.add(metaOp{kind: moPut, client: c, key: k, value: v, want: "ok"})
		case r < 360:
			delete(m.recs, string(k))
			g.add(metaOp{kind: moDelete, client: c, key: k, want: "ok"})
		case r < 460: // compare-and-swap by value
			o := metaOp{kind: moCAS, client: c, key: k, value: g.value(k, bigBudget)}
			h := g.hist[string(k)]
			switch r := g.rng.IntN(10); {
			case r < 4 && found:
				o.old = cur.value
			case r < 6 && len(h) > 0:
				o.old = h[g.rng.IntN(len(h))]
			case r < 8:
				o.old = nil // must be absent
			case r < 9:
				o.old = []byte{} // an empty value, not absence
			default:
				o.old = g.value([]byte("k"), 0)
			}
			ok := o.old == nil && !found || o.old != nil && found && bytes.Equal(cur.value, o.old)
			o.want = "mismatch"
			if 4+24+metaPad8(len(k))+metaPad8(len(o.value))+metaPad8(len(o.old)) > metaMaxRequest {
				// Two large values: the request is over the limit
				// (docs/client.md, "Limits": the encoded request).
				o.want, ok = "err ErrBatchTooLarge", false
			}
			if ok {
				o.want = "ok"
				m.put(k, o.value)
				g.note(k, o.value)
			}
			g.add(o)
		case r < 560: // compare-version-and-swap or compare-and-delete
			if g.rng.IntN(2) == 0 {
				g.get(c, k, moGet) // the version just read
			}
			o := metaOp{kind: moCVS, client: c, key: k, value: g.value(k, bigBudget)}
			if g.rng.IntN(4) == 0 {
				o.kind, o.value = moCAD, nil
			}
			var tok uint64
			switch r := g.rng.IntN(10); {
			case r < 6:
				o.verSrc, tok = metaVerLast, m.regs[string(k)][0]
			case r < 8:
				o.verSrc, tok = metaVerBefore, m.regs[string(k)][1]
			default:
				o.verSrc = metaVerZero
			}
			o.want = "mismatch"
			if found && cur.token == tok || !found && tok == 0 {
				o.want = "ok"
				if o.kind == moCAD {
					delete(m.recs, string(k))
				} else {
					m.put(k, o.value)
					g.note(k, o.value)
				}
			}
			g.add(o)
		case r < 660: // a batch over keys of several groups
			o := metaOp{kind: moBatch, client: c, want: "ok"}
			size := 4
			for range 2 + g.rng.IntN(14) {
				bo := metaBatchOp{key: g.key()}
				if len(o.batch) > 0 && g.rng.IntN(8) == 0 {
					bo.key = o.batch[g.rng.IntN(len(o.batch))].key // the same key twice
				}
				if g.rng.IntN(3) == 0 {
					bo.del = true
				} else {
					bo.value = g.value(bo.key, bigBudget)
				}
				if size += 24 + len(bo.key) + len(bo.value) + 16; size > metaMaxRequest-(4<<10) {
					break
				}
				o.batch = append(o.batch, bo)
			}
			for _, bo := range o.batch {
				if bo.del {
					delete(m.recs, string(bo.key))
				} else {
					m.put(bo.key, bo.value)
					g.note(bo.key, bo.value)
				}
			}
			g.add(o)
		case r < 672: // calls the client refuses
			switch g.rng.IntN(6) {
			case 0:
				g.add(metaOp{kind: moBadPut, client: c, key: []byte{}, value: []byte("v"), want: "err ErrEmptyKey"})
			case 1:
				g.add(metaOp{kind: moBadPut, client: c, key: bytes.Repeat([]byte("x"), metaMaxKey+1), value: []byte("v"), want: "err ErrKeyTooLarge"})
			case 2:
				g.add(metaOp{kind: moBadPut, client: c, key: k, value: make([]byte, metaMaxValue+1), want: "err ErrValueTooLarge"})
			case 3:
				g.add(metaOp{kind: moBadGet, client: c, key: bytes.Repeat([]byte("y"), metaMaxKey+1), want: "err ErrKeyTooLarge"})
			case 4: // too many ops, or too many bytes, or an empty key in a batch
				o := metaOp{kind: moBatchTooMany, client: c, want: "err ErrBatchTooLarge"}
				switch g.rng.IntN(3) {
				case 0:
					for i := range cluster.DefaultMaxBatch + 1 {
						o.batch = append(o.batch, metaBatchOp{del: true, key: []byte(fmt.Sprintf("k%d", i%metaKeys))})
					}
				case 1:
					big := make([]byte, metaMaxValue/2+4096) // two are over the request limit
					o.batch = []metaBatchOp{{key: []byte("big0"), value: big}, {key: []byte("big1"), value: big}}
				default:
					o.batch = []metaBatchOp{{key: []byte("k1"), value: []byte("v")}, {key: []byte{}, value: []byte("v")}}
					o.want = "err ErrEmptyKey"
				}
				g.add(o)
			default:
				g.add(metaOp{kind: moBatch, client: c, want: "ok"}) // empty: a no-op
			}
		case r < 720: // a merge of fields
			o := metaOp{kind: moMerge, client: c, key: k, fields: map[string][]byte{}, exists: g.rng.IntN(3) == 0}
			for range 1 + g.rng.IntN(2) {
				o.fields[fmt.Sprintf("f%d", g.rng.IntN(4))] = g.bytes(g.rng.IntN(30))
			}
			upd := fielded.Encode(o.fields)
			merged, err := upd, error(nil)
			if found {
				merged, err = fielded.Merge(nil, cur.value, upd)
			}
			switch {
			case o.exists && !found:
				o.want = "not found"
			case err != nil:
				o.want = "err ErrNotFielded"
			case len(merged) > metaMaxValue:
				o.want = "err ErrValueTooLarge"
			default:
				o.value, o.want = merged, "ok"
				m.put(k, merged)
				g.note(k, merged)
			}
			g.add(o)
		default: // gets
			switch r := g.rng.IntN(10); {
			case r < 1:
				k = []byte(fmt.Sprintf("absent%d", g.rng.IntN(metaAbsent)))
			}
			switch r := g.rng.IntN(10); {
			case r < 6:
				g.get(c, k, moGet)
			case r < 9:
				g.get(c, k, moGetStale)
			default:
				g.get(c, k, moGetDefault)
			}
		}
	}
	for i := range metaKeys {
		g.get(i%2, []byte(fmt.Sprintf("k%d", i)), moGet)
	}
	for i := range metaLong {
		g.get(0, metaLongKey(i), moGet)
	}
	for i := range metaBig {
		g.get(1, []byte(fmt.Sprintf("big%d", i)), moGet)
	}
	for i := range metaAbsent {
		g.get(0, []byte(fmt.Sprintf("absent%d", i)), moGet)
	}
	return g.ops
}

// metaCluster is a running cluster and its two clients.
type metaCluster struct {
	m       *cluster.Map
	fab     fabric.Spec // the map's, with a mem.Fabric on mem
	lc      *localcluster.Cluster
	reps    []*metaReplica
	cnodes  []rdma.Node
	clients []*client.Client
	stats   []kv.Stats // each replica's table when it stopped
}

type metaReplica struct {
	node   rdma.Node
	r      *kv.Replica
	cancel context.CancelFunc
	done   chan struct{}
}

// metaStart starts groups x 3 replicas, with the table knobs of c, and
// two clients (client 0 reads stale-ok from member 1 of each group,
// client 1 from member 2).
func metaStart(ctx context.Context, name string, c metaClusterConfig) (*metaCluster, error) {
	m := &cluster.Map{Name: name, Fabric: c.fabric, Limits: cluster.Limits{MaxValue: metaMaxValue}}
	id := rdma.NodeID(1)
	for range c.groups {
		m.Groups = append(m.Groups, []rdma.NodeID{id, id + 1, id + 2})
		id += 3
	}
	m.ClientNodes = []rdma.NodeID{100, 101}
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	mc := &metaCluster{m: m}
	if c.localcluster {
		lc, err := localcluster.Start(ctx, m, bc)
		if err != nil {
			return nil, err
		}
		mc.lc = lc
		for k := range m.ClientNodes {
			n, err := lc.ClientNode(k)
			if err != nil {
				mc.close()
				return nil, err
			}
			mc.cnodes = append(mc.cnodes, n)
		}
	} else {
		if err := m.Fill(); err != nil {
			return nil, err
		}
		mc.fab = fabric.ForMap(m)
		if c.fabric == "mem" {
			mc.fab.Mem = mem.New(mem.Options{})
		}
		for g, ms := range m.Groups {
			for _, id := range ms {
				if err := mc.startReplica(g, id, c, bc); err != nil {
					mc.close()
					return nil, err
				}
			}
		}
		for _, id := range m.ClientNodes {
			n, err := fabric.Open(mc.fab, id)
			if err != nil {
				mc.close()
				return nil, err
			}
			mc.cnodes = append(mc.cnodes, n)
		}
		if err := mc.waitLeaders(ctx); err != nil {
			mc.close()
			return nil, err
		}
	}
	for k, n := range mc.cnodes {
		cl, err := client.Open(ctx, client.WithMap(m), client.WithNode(n), client.WithSlot(k), client.WithNearReplica(1+k))
		if err != nil {
			mc.close()
			return nil, err
		}
		mc.clients = append(mc.clients, cl)
	}
	return mc, nil
}

func (mc *metaCluster) startReplica(g int, id rdma.NodeID, c metaClusterConfig, bc broadcast.Config) error {
	node, err := fabric.Open(mc.fab, id)
	if err != nil {
		return fmt.Errorf("node %d: %w", id, err)
	}
	bc.Self, bc.Start = id, broadcast.StartNew
	rc, err := mc.m.ReplicaConfig(g, bc)
	if err != nil {
		node.Close()
		return err
	}
	rc.Table.LogBuckets, rc.Table.MigrateStep, rc.Table.MaxLoad = c.logBuckets, c.migrateStep, c.maxLoad
	if c.heapRegion != 0 {
		rc.Table.HeapRegionSize = c.heapRegion
	}
	r, err := kv.NewReplica(rc, node, &broadcast.MemStable{})
	if err != nil {
		node.Close()
		return fmt.Errorf("replica %d of group %d: %w", id, g, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &metaReplica{node: node, r: r, cancel: cancel, done: make(chan struct{})}
	pg := poller.NewGroup(poller.GroupConfig{Pollers: 1})
	pg.Add(r, node)
	go func() {
		defer close(rp.done)
		pg.Run(ctx)
	}()
	mc.reps = append(mc.reps, rp)
	return nil
}

// waitLeaders waits until every group has a leader of a committed epoch.
func (mc *metaCluster) waitLeaders(ctx context.Context) error {
	for g := range mc.m.Groups {
		for {
			led := false
			for _, rp := range mc.reps[3*g : 3*g+3] {
				if _, ok := rp.r.Multicast().Broadcast().Leading(); ok {
					led = true
				}
			}
			if led {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("group %d has no leader: %w", g, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}

func (mc *metaCluster) close() {
	for _, cl := range mc.clients {
		cl.Close()
	}
	if mc.lc != nil {
		mc.lc.Close() // and the client nodes it opened
		return
	}
	for _, rp := range mc.reps {
		rp.cancel()
	}
	for _, rp := range mc.reps {
		<-rp.done
		mc.stats = append(mc.stats, rp.r.Table().Stats()) // its polling goroutine is done
		rp.r.Close()
		rp.node.Close()
	}
	for _, n := range mc.cnodes {
		n.Close()
	}
}

// metaRunner runs a sequence on one cluster and checks it.
type metaRunner struct {
	t     *testing.T
	seed  uint64
	cfg   metaClusterConfig
	mc    *metaCluster
	ver   map[string]uint64      // the key's version, from the writes' results
	regs  map[string][2]uint64   // versions the last two linearizable gets read
	hist  map[string][]metaState // the key's states by entry index
	at    int
	op    *metaOp
	stats map[string]int
}

// metaState is a key's state from entry idx of its group on.
type metaState struct {
	idx     uint64
	version uint64 // 0: absent
	value   []byte
}

func (r *metaRunner) fatalf(format string, a ...any) {
	r.t.Helper()
	r.t.Fatalf("seed %d, config %s, op %d (%v): %s\n(replay: go test ./client -run Metamorphic -metaseed=%d)",
		r.seed, r.cfg.name, r.at, r.op, fmt.Sprintf(format, a...), r.seed)
}

var metaErrs = []struct {
	name string
	err  error
}{
	{"not found", client.ErrNotFound},
	{"mismatch", client.ErrCASMismatch},
	{"err ErrNotFielded", client.ErrNotFielded},
	{"err ErrEmptyKey", client.ErrEmptyKey},
	{"err ErrKeyTooLarge", client.ErrKeyTooLarge},
	{"err ErrValueTooLarge", client.ErrValueTooLarge},
	{"err ErrBatchTooLarge", client.ErrBatchTooLarge},
}

func metaErrOutcome(err error) string {
	if err == nil {
		return "ok"
	}
	for _, e := range metaErrs {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "error: " + err.Error()
}

// written records a write of key acknowledged with version (0: deleted)
// at entry idx, checking its Prev.
func (r *metaRunner) written(key []byte, prev, version, idx uint64, value []byte, checkPrev bool) {
	k := string(key)
	if checkPrev && prev != r.ver[k] {
		r.fatalf("the write's Prev is %#x, the key's version was %#x", prev, r.ver[k])
	}
	if version != 0 && version>>16 != idx {
		r.fatalf("version %#x is not of entry %d", version, idx)
	}
	r.ver[k] = version
	h := r.hist[k]
	st := metaState{idx: idx, version: version, value: value}
	if n := len(h); n > 0 && h[n-1].idx == idx {
		h[n-1] = st // a batch writing the key twice: the entry's last write
	} else {
		h = append(h, st)
	}
	r.hist[k] = h
}

func (r *metaRunner) groupOf(key []byte) uint32 { return r.mc.m.GroupOf(key) }

func (r *metaRunner) runOp(ctx context.Context, o *metaOp) string {
	c := r.mc.clients[o.client]
	for _, v := range append([][]byte{o.value}, metaBatchValues(o.batch)...) {
		if len(v) > 4096 {
			r.stats["large values"]++ // sent in parts
		}
	}
	k := string(o.key)
	switch o.kind {
	case moPut, moBadPut:
		w, err := c.Put(ctx, o.key, o.value)
		if err == nil {
			r.written(o.key, w.Prev, w.Version, w.Version>>16, o.value, true)
		}
		return metaErrOutcome(err)
	case moDelete:
		w, err := c.Delete(ctx, o.key)
		if err == nil && r.ver[k] != 0 {
			r.written(o.key, w.Prev, 0, w.Version>>16, nil, true)
		} else if err == nil && w.Prev != 0 {
			r.fatalf("delete of an absent key: Prev %#x", w.Prev)
		}
		return metaErrOutcome(err)
	case moCAS, moCVS:
		var w client.WriteResult
		var err error
		if o.kind == moCAS {
			w, err = c.CompareAndSwap(ctx, o.key, o.old, o.value)
		} else {
			w, err = c.CompareVersionAndSwap(ctx, o.key, r.version(o), o.value)
		}
		switch {
		case err == nil:
			r.written(o.key, w.Prev, w.Version, w.Version>>16, o.value, true)
		case errors.Is(err, client.ErrCASMismatch) && w.Prev != r.ver[k]:
			r.fatalf("mismatch with Prev %#x, the key's version is %#x", w.Prev, r.ver[k])
		}
		return metaErrOutcome(err)
	case moMerge:
		update := c.UpdateFields
		if o.exists {
			update = c.UpdateExistingFields
		}
		w, err := update(ctx, o.key, o.fields)
		switch {
		case err == nil:
			r.written(o.key, w.Prev, w.Version, w.Version>>16, o.value, true)
		case errors.Is(err, client.ErrNotFielded) && w.Prev != r.ver[k]:
			r.fatalf("not fielded with Prev %#x, the key's version is %#x", w.Prev, r.ver[k])
		}
		return metaErrOutcome(err)
	case moCAD:
		w, err := c.CompareAndDelete(ctx, o.key, r.version(o))
		switch {
		case err == nil && r.ver[k] != 0:
			r.written(o.key, w.Prev, 0, w.Version>>16, nil, true)
		case errors.Is(err, client.ErrCASMismatch) && w.Prev != r.ver[k]:
			r.fatalf("mismatch with Prev %#x, the key's version is %#x", w.Prev, r.ver[k])
		}
		return metaErrOutcome(err)
	case moBatch, moBatchTooMany:
		var b client.Batch
		for _, bo := range o.batch {
			if bo.del {
				b.Delete(bo.key)
			} else {
				b.Put(bo.key, bo.value)
			}
		}
		br, err := c.Commit(ctx, &b)
		if err != nil {
			return metaErrOutcome(err)
		}
		if len(o.batch) > 0 {
			r.stats["batch groups"] += len(br.Groups)
		}
		for i, bo := range o.batch {
			idx, ok := br.Groups[r.groupOf(bo.key)]
			if !ok || br.Versions[i] != idx<<16|uint64(i) {
				r.fatalf("batch op %d: version %#x, groups %v", i, br.Versions[i], br.Groups)
			}
			if bo.del {
				r.written(bo.key, 0, 0, idx, nil, false)
			} else {
				r.written(bo.key, 0, br.Versions[i], idx, bo.value, false)
			}
		}
		return "ok"
	case moGet, moBadGet, moGetDefault:
		var it client.Item
		var err error
		if o.kind == moGetDefault {
			var v []byte
			v, err = c.Get(ctx, o.key) // the client's default: linearizable
			it = client.Item{Value: v, Version: r.ver[k]}
		} else {
			it, err = c.GetItem(ctx, o.key, client.Linearizable)
		}
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			return metaErrOutcome(err)
		}
		found := err == nil
		if found != (r.ver[k] != 0) || it.Version != r.ver[k] {
			r.fatalf("linearizable get: found %v, version %#x; the last write left version %#x", found, it.Version, r.ver[k])
		}
		if o.kind == moGet {
			reg := r.regs[k]
			r.regs[k] = [2]uint64{it.Version, reg[0]}
		}
		return metaGetOutcome(found, it.Value)
	case moGetStale:
		it, err := c.GetItem(ctx, o.key, client.StaleOK)
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			return metaErrOutcome(err)
		}
		found := err == nil
		h := append([]metaState{{}}, r.hist[k]...) // absent before the first write
		for i, st := range h {
			if i+1 < len(h) && h[i+1].idx <= it.Applied {
				continue // replaced at or before the entry the replica had applied
			}
			if st.version == it.Version && (st.version != 0) == found && bytes.Equal(st.value, it.Value) {
				if i+1 < len(h) {
					r.stats["stale-ok gets behind"]++
				}
				return "stale"
			}
		}
		var states []string
		for _, st := range h {
			states = append(states, fmt.Sprintf("from entry %d: version %#x, %d bytes", st.idx, st.version, len(st.value)))
		}
		r.fatalf("stale-ok get: found %v, version %#x, %d bytes, replica %d applied %d; the key's states: %s",
			found, it.Version, len(it.Value), it.Replica, it.Applied, strings.Join(states, "; "))
	}
	return "?"
}

func metaBatchValues(b []metaBatchOp) [][]byte {
	var vs [][]byte
	for _, bo := range b {
		vs = append(vs, bo.value)
	}
	return vs
}

func (r *metaRunner) version(o *metaOp) uint64 {
	if o.verSrc == metaVerZero {
		return 0
	}
	return r.regs[string(o.key)][o.verSrc-metaVerLast]
}

func metaRun(t *testing.T, seed uint64, idx int, c metaClusterConfig, seq []metaOp) {
	name := fmt.Sprintf("meta-%d-%d-%d", os.Getpid(), seed, idx)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	mc, err := metaStart(ctx, name, c)
	if err != nil {
		t.Fatalf("seed %d, config %s: start: %v", seed, c.name, err)
	}
	startup := time.Since(start)
	shmLeft := func() []string {
		l, _ := filepath.Glob(filepath.Join("/dev/shm", "rdmakv."+name+".*"))
		return l
	}
	defer func() {
		mc.close()
		for i, st := range mc.stats {
			if i%3 == 0 {
				t.Logf("group %d's first replica: %d records, index generation %d of 2^%d buckets, %d heap regions", i/3, st.Records, st.Gen, st.LogBuckets, st.HeapRegions)
			}
		}
		if c.fabric == "shm" {
			if l := shmLeft(); len(l) > 0 {
				t.Errorf("seed %d, config %s: files left in /dev/shm: %v", seed, c.name, l)
			}
		}
	}()
	if c.fabric == "shm" && len(shmLeft()) == 0 {
		t.Fatalf("seed %d, config %s: the shm cluster has no files in /dev/shm", seed, c.name)
	}
	r := &metaRunner{t: t, seed: seed, cfg: c, mc: mc, ver: map[string]uint64{}, regs: map[string][2]uint64{},
		hist: map[string][]metaState{}, stats: map[string]int{}}
	for i := range seq {
		o := &seq[i]
		r.at, r.op = i, o
		got := r.runOp(ctx, o)
		if got != o.want {
			r.fatalf("outcome %q, the model's %q", got, o.want)
		}
		r.stats[strings.Fields(got)[0]]++
	}
	t.Logf("seed %d, config %s: %d ops in %v (start %v): %v", seed, c.name, len(seq), time.Since(start)-startup, startup, r.stats)
}

func TestMetamorphicClient(t *testing.T) {
	n, bigs, seeds := 800, 64, 2
	if raceEnabled {
		n, bigs, seeds = 250, 8, 1
	}
	if *metaOpsFlag > 0 {
		n, bigs = *metaOpsFlag, *metaOpsFlag/30
	}
	for _, seed := range metaSeedList(t, seeds) {
		seq := metaGenerate(seed, n, bigs)
		for i, c := range metaClusterConfigs {
			t.Run(fmt.Sprintf("seed=%d/%s", seed, c.name), func(t *testing.T) {
				if c.bug != "" && !*metaBugsFlag {
					t.Skipf("known bug (run with -metabugs): %s", c.bug)
				}
				metaRun(t, seed, i, c, seq)
			})
		}
	}
}
