package kv

// A metamorphic test of the table (in the spirit of pebble's): one seeded
// sequence of steps (puts of small and large values, deletes, conditional
// puts and deletes by value and by version, multi-key requests over the
// keys of several groups, requests delivered whole or in parts with their
// commit deferred past other entries, gets of present and absent keys in
// both consistencies, a snapshot captured and restored into a new table
// while entries go on) is applied to tables of many geometries (initial
// buckets, migrate step, max load, heap region size, 1 or 3 groups,
// with or without snapshot and restore), each checked step by step
// against a plain Go map. Every configuration must give the same
// observable outcome at every step (found and value of each get; applied,
// condition failed or malformed of each request): the model's outcome for
// one group (the reference) is what every run's outcomes are compared to.
// Versions, which are entry indexes and so differ with the number of
// groups, are compared exactly against each run's own model (which numbers
// each group's entries as the run does).
//
// Replay one seed: go test ./kv -run Metamorphic -metaseed=N (or the
// METASEED environment variable); -metaseeds=N runs seeds 1..N,
// -metasteps=N makes N steps a seed, -metabugs runs the configurations
// skipped for a known bug.

import (
	"bytes"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/kv/opwire"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

var (
	metaSeedFlag  = flag.Uint64("metaseed", 0, "metamorphic tests: replay this one seed")
	metaSeedsFlag = flag.Int("metaseeds", 0, "metamorphic tests: run seeds 1..n (default a few, fewer under -race)")
	metaStepsFlag = flag.Int("metasteps", 0, "metamorphic tests: steps per seed (default 3000, fewer under -race)")
	metaBugsFlag  = flag.Bool("metabugs", false, "metamorphic tests: run the configurations that hit a known bug too")
)

// metaSeedList is the seeds to run: -metaseed (or $METASEED) alone, else
// 1..-metaseeds, else 1..def.
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

// Limits every configuration shares (outcomes depend on them).
const (
	metaMaxKey     = DefaultMaxKey
	metaMaxValue   = 384 << 10
	metaMaxRequest = metaMaxKey + metaMaxValue + 4096
	metaSmallHeap  = 512 << 10 // a few records of the largest class: records spill over many regions
	// metaSlot: requests larger than this travel in parts, as from a
	// client with 4 KiB slots.
	metaSlot   = 4000
	metaKeys   = 400 // k0..k399
	metaLong   = 12  // long keys, up to MaxKey bytes
	metaBig    = 6   // keys that mostly hold large values
	metaAbsent = 40  // keys never written
)

// metaTableConfig is one geometry.
type metaTableConfig struct {
	name    string
	cfg     TableConfig // LogBuckets, MigrateStep, MaxLoad, HeapRegionSize
	groups  int
	restore bool // act on the snapshot and restore steps
	// bug names a known bug this configuration hits: skipped unless
	// -metabugs.
	bug string
	// knobs plant bugs in the tables (TestMetamorphicCatchesMutants).
	knobs testingKnobs
}

var metaTableConfigs = []metaTableConfig{
	{name: "default", groups: 1},
	{name: "default-3groups", groups: 3},
	{name: "lb2-ms1", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1}, groups: 1},
	{name: "lb2-ms1-load0.05-smallheap-3groups", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1, MaxLoad: 0.05, HeapRegionSize: metaSmallHeap}, groups: 3},
	{name: "lb2-ms1-load0.95", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1, MaxLoad: 0.95}, groups: 1},
	{name: "lb2-ms1-load0.95-smallheap-3groups", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1, MaxLoad: 0.95, HeapRegionSize: metaSmallHeap}, groups: 3},
	{name: "lb3-ms2-load0.5-smallheap", cfg: TableConfig{LogBuckets: 3, MigrateStep: 2, MaxLoad: 0.5, HeapRegionSize: metaSmallHeap}, groups: 1},
	{name: "lb2-ms1000-3groups", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1000}, groups: 3},
	{name: "lb2-ms1000-load0.9-3groups", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1000, MaxLoad: 0.9}, groups: 3},
	{name: "lb10-load0.95-smallheap", cfg: TableConfig{LogBuckets: 10, MaxLoad: 0.95, HeapRegionSize: metaSmallHeap}, groups: 1},
	{name: "lb5-ms3-load0.3-restore", cfg: TableConfig{LogBuckets: 5, MigrateStep: 3, MaxLoad: 0.3}, groups: 1, restore: true},
	{name: "lb2-ms1-load0.95-smallheap-3groups-restore", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1, MaxLoad: 0.95, HeapRegionSize: metaSmallHeap}, groups: 3, restore: true},
	{name: "default-3groups-restore", groups: 3, restore: true},
}

// Steps.
type metaStepKind uint8

const (
	metaReq         metaStepKind = iota // a request, whole or in parts (then committed now or later)
	metaCommit                          // the commit of a request staged earlier
	metaBogusCommit                     // a commit naming a request never staged
	metaGet
	metaSnapshot // capture every group's table
	metaRestore  // persist the capture into new tables, replay the entries since, read those
)

// Version sources of a CmpVersion op (resolved when the request is made).
const (
	metaVerLiteral = iota // CmpVersion as generated (0: must be absent)
	metaVerLast           // the version the last linearizable get of the key read
	metaVerBefore         // the one the get before it read
)

type metaStep struct {
	kind   metaStepKind
	ops    []Op
	verSrc []uint8 // per op, for Cmp == CmpVersion
	// Staged requests: the id, the parts ([off, end) in delivery order)
	// and whether the commit follows at once.
	staged    bool
	id        StageID
	parts     [][2]int
	commitNow bool
	key       []byte
	mode      Consistency
}

func (s *metaStep) String() string {
	opStr := func(ops []Op) string {
		var b strings.Builder
		for i, op := range ops {
			if i > 0 {
				b.WriteString(", ")
			}
			k := string(op.Key)
			if len(k) > 24 {
				k = fmt.Sprintf("%s...(%d bytes)", k[:16], len(op.Key))
			}
			if op.Kind == OpDelete {
				fmt.Fprintf(&b, "del %q", k)
			} else {
				fmt.Fprintf(&b, "put %q (%d bytes)", k, len(op.Value))
			}
			switch op.Cmp {
			case CmpValue:
				if op.CmpVersion == 1 {
					b.WriteString(" if absent")
				} else {
					fmt.Fprintf(&b, " if value = %d bytes %08x", len(op.CmpValue), crc32.ChecksumIEEE(op.CmpValue))
				}
			case CmpVersion:
				fmt.Fprintf(&b, " if version (src %d, literal %d)", s.verSrc[i], op.CmpVersion)
			}
		}
		return b.String()
	}
	switch s.kind {
	case metaReq:
		if s.staged {
			return fmt.Sprintf("request %v in %d parts (commit now %v) [%s]", s.id, len(s.parts), s.commitNow, opStr(s.ops))
		}
		return fmt.Sprintf("request [%s]", opStr(s.ops))
	case metaCommit:
		return fmt.Sprintf("commit %v", s.id)
	case metaBogusCommit:
		return fmt.Sprintf("commit of unstaged %v", s.id)
	case metaGet:
		return fmt.Sprintf("%v get %q", s.mode, s.key)
	case metaSnapshot:
		return "snapshot"
	case metaRestore:
		return "restore"
	}
	return "?"
}

// metaGen generates a sequence; cur approximates the state (conditions
// assumed to hold, staged requests applied at once) to pick conditions
// that often hold.
type metaGen struct {
	rng      *rand.Rand
	steps    []metaStep
	cur      map[string][]byte
	hist     map[string][][]byte
	pool     [][]byte
	inc      [4]uint64
	stageSeq uint64
	pending  []StageID
	snapAt   int // the step the capture was taken, -1 if none
}

func metaLongKey(i int) []byte {
	n := 100 + i*(metaMaxKey-100)/(metaLong-1)
	b := []byte(fmt.Sprintf("long%02d-", i))
	for len(b) < n {
		b = append(b, byte('a'+len(b)%26))
	}
	return b[:n]
}

func (g *metaGen) key() []byte {
	switch r := g.rng.IntN(1000); {
	case r < 800:
		return []byte(fmt.Sprintf("k%d", g.rng.IntN(metaKeys)))
	case r < 900:
		return metaLongKey(g.rng.IntN(metaLong))
	case r < 970:
		return []byte(fmt.Sprintf("big%d", g.rng.IntN(metaBig)))
	default:
		// Keys have at least one byte (the client refuses empty ones;
		// the table stores them but Restore refuses them).
		return []byte{0, byte(g.rng.IntN(4)), 0xff}
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

func (g *metaGen) value(big bool) []byte {
	if big {
		switch r := g.rng.IntN(100); {
		case r < 20:
			return g.bytes(3900 + g.rng.IntN(300)) // about one slot
		case r < 75:
			return g.bytes(5000 + g.rng.IntN(60<<10))
		case r < 95:
			return g.bytes(64<<10 + g.rng.IntN(236<<10)) // up to 300 KiB
		default:
			return g.bytes(metaMaxValue)
		}
	}
	switch r := g.rng.IntN(100); {
	case r < 8:
		return []byte{}
	case r < 40:
		return g.pool[g.rng.IntN(len(g.pool))] // values repeat: versions must change anyway
	case r < 92:
		return g.bytes(1 + g.rng.IntN(100))
	default:
		return g.bytes(100 + g.rng.IntN(3000))
	}
}

func (g *metaGen) bigKey(k []byte) bool { return bytes.HasPrefix(k, []byte("big")) }

// put is a put of key with a value, large for the big keys mostly and
// rarely for others.
func (g *metaGen) put(k []byte) Op {
	big := g.bigKey(k) && g.rng.IntN(3) > 0 || g.rng.IntN(150) == 0
	return Op{Kind: OpPut, Key: k, Value: g.value(big)}
}

// condition adds a condition to op (which the caller appends to ops at
// index len(verSrc)).
func (g *metaGen) condition(op *Op) uint8 {
	k := string(op.Key)
	if g.rng.IntN(2) == 0 {
		op.Cmp = CmpValue
		switch r := g.rng.IntN(100); {
		case r < 40 && g.cur[k] != nil:
			op.CmpValue = g.cur[k]
		case r < 55 && len(g.hist[k]) > 0:
			op.CmpValue = g.hist[k][g.rng.IntN(len(g.hist[k]))]
		case r < 70:
			op.CmpVersion = 1 // must be absent
		case r < 80:
			op.CmpValue = []byte{}
		default:
			op.CmpValue = g.value(false)
		}
		if op.CmpValue != nil && len(op.CmpValue) == 0 {
			op.CmpValue = []byte{} // empty, not nil: "the value is empty"
		}
		return metaVerLiteral
	}
	op.Cmp = CmpVersion
	switch r := g.rng.IntN(100); {
	case r < 60:
		return metaVerLast
	case r < 80:
		return metaVerBefore
	case r < 95:
		return metaVerLiteral // 0: must be absent
	default:
		op.CmpVersion = 1<<40 | 7 // a version no write has
		return metaVerLiteral
	}
}

// note updates the approximate state as if ops applied.
func (g *metaGen) note(ops []Op) {
	for _, op := range ops {
		k := string(op.Key)
		if op.Kind == OpDelete {
			delete(g.cur, k)
		} else {
			g.cur[k] = op.Value
			if len(g.hist[k]) < 8 {
				g.hist[k] = append(g.hist[k], op.Value)
			}
		}
	}
}

func (g *metaGen) get(k []byte, mode Consistency) {
	g.steps = append(g.steps, metaStep{kind: metaGet, key: k, mode: mode})
}

// request appends a request step, staged when large (or at random).
func (g *metaGen) request(ops []Op, verSrc []uint8) {
	s := metaStep{kind: metaReq, ops: ops, verSrc: verSrc}
	n := RequestSize(ops)
	if n > metaSlot || g.rng.IntN(12) == 0 {
		s.staged = true
		c := uint32(g.rng.IntN(len(g.inc)))
		if g.rng.IntN(60) == 0 {
			// The client restarts: its requests staged and not
			// committed are abandoned (never committed).
			g.inc[c]++
			g.pending = slices.DeleteFunc(g.pending, func(id StageID) bool { return id.Client == c })
		}
		g.stageSeq++
		s.id = StageID{Client: c, Inc: g.inc[c], Stage: g.stageSeq}
		chunk := metaSlot - PartOverhead
		if n <= metaSlot {
			k := 1 + g.rng.IntN(8) // a small request in up to 8 parts
			chunk = (n + k - 1) / k
		}
		for off := 0; off < n; off += chunk {
			s.parts = append(s.parts, [2]int{off, min(off+chunk, n)})
		}
		g.rng.Shuffle(len(s.parts), func(i, j int) { s.parts[i], s.parts[j] = s.parts[j], s.parts[i] })
		s.commitNow = n > metaMaxRequest || len(g.pending) >= 4 || g.rng.IntN(3) > 0
		if !s.commitNow {
			g.pending = append(g.pending, s.id)
		}
	}
	g.steps = append(g.steps, s)
	g.note(ops)
}

// metaGenerate makes a sequence of about n steps (then commits what is
// pending and gets every key).
func metaGenerate(seed uint64, n int) []metaStep {
	g := &metaGen{rng: rand.New(rand.NewPCG(seed, 0x6d657461)), cur: map[string][]byte{}, hist: map[string][][]byte{}, snapAt: -1}
	for range 8 {
		g.pool = append(g.pool, g.bytes(g.rng.IntN(24)))
	}
	for i := range g.inc {
		g.inc[i] = 1
	}
	for len(g.steps) < n {
		if len(g.pending) > 0 && g.rng.IntN(8) == 0 {
			i := g.rng.IntN(len(g.pending))
			g.steps = append(g.steps, metaStep{kind: metaCommit, id: g.pending[i]})
			g.pending = slices.Delete(g.pending, i, i+1)
			continue
		}
		if g.snapAt < 0 && g.rng.IntN(250) == 0 {
			g.snapAt = len(g.steps)
			g.steps = append(g.steps, metaStep{kind: metaSnapshot})
			continue
		}
		if g.snapAt >= 0 && len(g.steps)-g.snapAt > 10 && g.rng.IntN(40) == 0 {
			g.snapAt = -1
			g.steps = append(g.steps, metaStep{kind: metaRestore})
			continue
		}
		k := g.key()
		switch r := g.rng.IntN(1000); {
		case r < 300: // put
			g.request([]Op{g.put(k)}, []uint8{0})
		case r < 380: // delete
			g.request([]Op{{Kind: OpDelete, Key: k}}, []uint8{0})
		case r < 470: // conditional put or delete (by value or by version)
			if g.rng.IntN(2) == 0 {
				g.get(k, Linearizable) // the version just read
			}
			op := g.put(k)
			if g.rng.IntN(5) == 0 {
				op = Op{Kind: OpDelete, Key: k}
			}
			src := g.condition(&op)
			g.request([]Op{op}, []uint8{src})
		case r < 490: // conditional ops on one key (one group in every configuration)
			n := 2 + g.rng.IntN(2)
			ops, src := make([]Op, n), make([]uint8, n)
			for i := range ops {
				ops[i] = g.put(k)
				if g.rng.IntN(3) == 0 {
					ops[i] = Op{Kind: OpDelete, Key: k}
				}
				if g.rng.IntN(4) > 0 {
					src[i] = g.condition(&ops[i])
				}
			}
			g.request(ops, src)
		case r < 640: // a batch over several keys (and groups), unconditional
			n := 2 + g.rng.IntN(11)
			ops := make([]Op, 0, n)
			size := opwire.ReqHdr
			for len(ops) < n {
				k := g.key()
				if len(ops) > 0 && g.rng.IntN(8) == 0 {
					k = ops[g.rng.IntN(len(ops))].Key // the same key twice
				}
				op := Op{Kind: OpDelete, Key: k}
				if g.rng.IntN(3) > 0 {
					op = g.put(k)
				}
				if size+opwire.Size(op.Key, op.Value, op.CmpValue) > metaMaxRequest {
					break
				}
				size += opwire.Size(op.Key, op.Value, op.CmpValue)
				ops = append(ops, op)
			}
			if len(ops) > 0 {
				g.request(ops, make([]uint8, len(ops)))
			}
		case r < 645: // larger than MaxRequest, in parts: refused
			ops := []Op{{Kind: OpPut, Key: []byte("big0"), Value: g.bytes(metaMaxValue)}, {Kind: OpPut, Key: []byte("big1"), Value: g.bytes(8000)}}
			s := metaStep{kind: metaReq, ops: ops, verSrc: make([]uint8, 2), staged: true, commitNow: true}
			g.stageSeq++
			s.id = StageID{Client: 0, Inc: g.inc[0], Stage: g.stageSeq}
			n := RequestSize(ops)
			for off := 0; off < n; off += metaSlot - PartOverhead {
				s.parts = append(s.parts, [2]int{off, min(off+metaSlot-PartOverhead, n)})
			}
			g.steps = append(g.steps, s)
		case r < 650:
			g.stageSeq++
			g.steps = append(g.steps, metaStep{kind: metaBogusCommit, id: StageID{Client: 1, Inc: g.inc[1], Stage: g.stageSeq}})
		case r < 660: // refused: a key or a value over the limits
			op := Op{Kind: OpPut, Key: bytes.Repeat([]byte("x"), metaMaxKey+1), Value: []byte("v")}
			if g.rng.IntN(2) == 0 {
				op = Op{Kind: OpPut, Key: k, Value: g.bytes(metaMaxValue + 1)}
			}
			g.request([]Op{op, g.put([]byte(fmt.Sprintf("k%d", g.rng.IntN(metaKeys))))}, make([]uint8, 2))
		default: // gets
			mode := Linearizable
			if g.rng.IntN(3) == 0 {
				mode = StaleOK
			}
			switch r := g.rng.IntN(10); {
			case r == 0:
				k = []byte(fmt.Sprintf("absent%d", g.rng.IntN(metaAbsent)))
			case r == 1 && g.rng.IntN(10) == 0:
				k = bytes.Repeat([]byte("x"), metaMaxKey+1)
			}
			g.get(k, mode)
		}
	}
	for _, id := range g.pending {
		g.steps = append(g.steps, metaStep{kind: metaCommit, id: id})
	}
	if g.snapAt >= 0 {
		g.steps = append(g.steps, metaStep{kind: metaRestore})
	}
	keys := [][]byte{{}}
	for i := range metaKeys {
		keys = append(keys, []byte(fmt.Sprintf("k%d", i)))
	}
	for i := range metaLong {
		keys = append(keys, metaLongKey(i))
	}
	for i := range metaBig {
		keys = append(keys, []byte(fmt.Sprintf("big%d", i)))
	}
	for i := range 4 {
		keys = append(keys, []byte{0, byte(i), 0xff})
	}
	for i := range metaAbsent {
		keys = append(keys, []byte(fmt.Sprintf("absent%d", i)))
	}
	for _, k := range keys {
		g.get(k, Linearizable)
	}
	return g.steps
}

// metaModel is the plain map a run is checked against, with the run's
// group count and entry numbering (so it predicts versions and results
// exactly).
type metaModel struct {
	groups int
	recs   map[string]metaRec
	index  []uint64
	stages []map[uint32][]metaStage // per group, per client: staged requests
	reqs   map[StageID][]Op
	regs   map[string][2]uint64 // versions read by linearizable gets: last, before
}

type metaRec struct {
	value   []byte
	version uint64
}

type metaStage struct {
	id    StageID
	total int
}

func newMetaModel(groups int) *metaModel {
	m := &metaModel{groups: groups, recs: map[string]metaRec{}, index: make([]uint64, groups),
		stages: make([]map[uint32][]metaStage, groups), reqs: map[StageID][]Op{}, regs: map[string][2]uint64{}}
	for g := range m.stages {
		m.stages[g] = map[uint32][]metaStage{}
	}
	return m
}

func (m *metaModel) groupOf(key []byte) int { return HashSlot(key) % m.groups }

// dests are the groups of ops' keys, ascending.
func (m *metaModel) dests(ops []Op) []int {
	var gs []int
	for i := range ops {
		if g := m.groupOf(ops[i].Key); !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	slices.Sort(gs)
	return gs
}

func (m *metaModel) next(g int) uint64 { m.index[g]++; return m.index[g] }

func (m *metaModel) owned(g int, op *Op) bool {
	return m.groupOf(op.Key) == g
}

func (m *metaModel) holds(op *Op) bool {
	r, found := m.recs[string(op.Key)]
	switch op.Cmp {
	case CmpVersion:
		if op.CmpVersion == 0 {
			return !found
		}
		return found && r.version == op.CmpVersion
	case CmpValue:
		if op.CmpVersion == 1 {
			return !found
		}
		return found && bytes.Equal(r.value, op.CmpValue)
	}
	return true
}

// request applies group g's share of ops as entry idx (docs of ops.go:
// every condition of the group's ops checked first, against the state
// before the request).
func (m *metaModel) request(g int, idx uint64, ops []Op) Result {
	// A request breaking a limit is refused whole by every group, its
	// own ops or not (ops.go, StatusRefused).
	if n := RequestSize(ops); n > metaMaxRequest {
		return refused(LimitRequest, 0, metaMaxRequest, n)
	}
	for i := range ops {
		if len(ops[i].Key) > metaMaxKey {
			return refused(LimitKey, i, metaMaxKey, len(ops[i].Key))
		}
		if len(ops[i].Value) > metaMaxValue {
			return refused(LimitValue, i, metaMaxValue, len(ops[i].Value))
		}
	}
	var res Result
	first := true
	for i := range ops {
		op := &ops[i]
		if !m.owned(g, op) {
			continue
		}
		if first {
			first = false
			if r, ok := m.recs[string(op.Key)]; ok {
				res.Prev = r.version
			}
		}
		if !m.holds(op) {
			return Result{Status: StatusCondFailed, FailedOp: i, Prev: res.Prev}
		}
	}
	for i := range ops {
		op := &ops[i]
		if !m.owned(g, op) {
			continue
		}
		v := idx<<16 | uint64(i)
		if res.Count == 0 {
			res.Version = v
		}
		res.Count++
		if op.Kind == OpDelete {
			delete(m.recs, string(op.Key))
		} else {
			m.recs[string(op.Key)] = metaRec{value: bytes.Clone(op.Value), version: v}
		}
	}
	return res
}

// staged is group g's staged list of id's client, without the requests
// of older incarnations (which a newer one abandons).
func (m *metaModel) staged(g int, id StageID) []metaStage {
	return slices.DeleteFunc(slices.Clone(m.stages[g][id.Client]), func(s metaStage) bool { return s.id.Inc < id.Inc })
}

func (m *metaModel) setStaged(g int, c uint32, l []metaStage) {
	if len(l) == 0 {
		delete(m.stages[g], c)
		return
	}
	m.stages[g][c] = l
}

// part is the result of a part of request id (total bytes) at group g;
// every part of a request is delivered together.
func (m *metaModel) part(g int, id StageID, total int) Result {
	if total > metaMaxRequest {
		return refused(LimitRequest, 0, metaMaxRequest, total)
	}
	l := m.staged(g, id)
	if !slices.ContainsFunc(l, func(s metaStage) bool { return s.id == id }) {
		if len(l) == MaxStages {
			oldest := 0
			for i, s := range l {
				if s.id.Inc < l[oldest].id.Inc || s.id.Inc == l[oldest].id.Inc && s.id.Stage < l[oldest].id.Stage {
					oldest = i
				}
			}
			l = slices.Delete(l, oldest, oldest+1)
		}
		l = append(l, metaStage{id: id, total: total})
	}
	m.setStaged(g, id.Client, l)
	return Result{}
}

func (m *metaModel) commit(g int, idx uint64, id StageID, total int) Result {
	l := m.staged(g, id)
	at := slices.IndexFunc(l, func(s metaStage) bool { return s.id == id })
	if at < 0 {
		m.setStaged(g, id.Client, l)
		return refused(LimitStages, 0, MaxStages, total)
	}
	m.setStaged(g, id.Client, slices.Delete(l, at, at+1))
	return m.request(g, idx, m.reqs[id])
}

// metaOutcome is what every configuration must agree on: a request's
// statuses (the same in every group that got it, as conditions are on
// one key), a get's value.
func metaOutcome(rs []Result) string {
	out := "ok"
	for _, r := range rs {
		switch r.Status {
		case StatusMalformed:
			return "malformed"
		case StatusRefused:
			return fmt.Sprintf("refused %s@%d", LimitName(r.Limit), r.FailedOp)
		case StatusCondFailed:
			out = fmt.Sprintf("cond-failed@%d", r.FailedOp)
		}
	}
	return out
}

func metaGetOutcome(found bool, v []byte) string {
	if !found {
		return "not found"
	}
	return fmt.Sprintf("found %d bytes %08x", len(v), crc32.ChecksumIEEE(v))
}

// metaRun runs seq on one configuration's tables (tables false: the model
// alone) and returns each step's outcome.
type metaRun struct {
	t      *testing.T
	caught *string // set: fatalf records its message here and stops the run (a planted bug's test)
	seed   uint64
	c      metaTableConfig
	tables bool
	m      *metaModel
	f      *mem.Fabric
	rnode  rdma.Node
	nodeID rdma.NodeID
	tabs   []*Table
	tnodes []rdma.Node
	rds    []*GroupReader
	caps   []broadcast.FSMSnapshot
	since  [][]metaEntry // per group, the entries applied since the capture
	step   int
	what   *metaStep
}

var metaScribble = [512]byte{0: 0xa5, 511: 0x5a}

type metaEntry struct {
	index uint64
	data  []byte
	res   []byte
}

// metaStop stops a run whose failure a test expects (metaRun.caught).
type metaStop struct{}

func (r *metaRun) fatalf(format string, a ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, a...)
	if r.caught != nil {
		*r.caught = msg
		panic(metaStop{})
	}
	for g, tb := range r.tabs {
		if tb == nil {
			continue
		}
		var dups []string
		for k, n := range metaIndexKeys(tb) {
			if n > 1 {
				dups = append(dups, fmt.Sprintf("%q x%d", k, n))
			}
		}
		if len(dups) > 0 {
			slices.Sort(dups)
			msg += fmt.Sprintf("\ngroup %d's index holds keys more than once: %v", g, dups)
		}
	}
	r.t.Fatalf("seed %d, config %s, step %d (%v): %s\n(replay: go test ./kv -run Metamorphic -metaseed=%d)",
		r.seed, r.c.name, r.step, r.what, msg, r.seed)
}

// metaIndexKeys counts the records the index points to, by key: those in
// the current generation and in the old one's buckets not yet moved.
func metaIndexKeys(t *Table) map[string]int {
	keys := map[string]int{}
	t.eachSlot(func(s Slot) { keys[string(t.recordKey(s))]++ })
	return keys
}

func (r *metaRun) tableConfig(g int) TableConfig {
	tc := r.c.cfg
	tc.Group = uint32(g)
	tc.MaxKey, tc.MaxValue = metaMaxKey, metaMaxValue
	tc.Readers = []rdma.NodeID{2}
	if r.c.groups > 1 {
		tc.SlotMap = make([]uint32, NumHashSlots)
		for s := range tc.SlotMap {
			tc.SlotMap[s] = uint32(s % r.c.groups)
		}
	}
	return tc
}

// newTable opens a table of group g on a new node, serving epoch 5.
func (r *metaRun) newTable(g int) (*Table, rdma.Node) {
	r.nodeID++
	n, err := r.f.NewNode(r.nodeID)
	if err != nil {
		r.fatalf("node: %v", err)
	}
	tb, err := NewTable(r.tableConfig(g), n)
	if err != nil {
		r.fatalf("table: %v", err)
	}
	tb.knobs = r.c.knobs
	return tb, n
}

func (r *metaRun) serve(g int, tb *Table, n rdma.Node) {
	tb.Promise(5)
	tb.SetServing(5)
	r.tabs[g], r.tnodes[g] = tb, n
	r.rds[g] = NewGroupReader(r.rnode, uint32(g), []rdma.NodeID{n.ID()}, 0)
}

func (r *metaRun) open() {
	r.f = mem.New(mem.Options{})
	var err error
	if r.rnode, err = r.f.NewNode(2); err != nil {
		r.fatalf("reader node: %v", err)
	}
	r.nodeID = 10
	r.tabs, r.tnodes, r.rds = make([]*Table, r.c.groups), make([]rdma.Node, r.c.groups), make([]*GroupReader, r.c.groups)
	for g := range r.tabs {
		tb, n := r.newTable(g)
		r.serve(g, tb, n)
	}
}

func (r *metaRun) close() {
	for g := range r.tabs {
		if r.caps != nil && r.caps[g] != nil {
			r.caps[g].Release()
		}
		if r.rds[g] != nil {
			r.rds[g].Close()
		}
		if r.tabs[g] != nil {
			r.tabs[g].Close()
			r.tnodes[g].Close()
		}
	}
	if r.rnode != nil {
		r.rnode.Close()
	}
}

// deliver applies data as group g's next entry, checks the result
// against want and returns it.
func (r *metaRun) deliver(g int, data []byte, want Result) Result {
	idx := r.m.next(g)
	if !r.tables {
		return want
	}
	// The entry's bytes are valid only during Apply: scribble on them
	// after, so a table keeping a reference shows it.
	e := bytes.Clone(data)
	out := bytes.Clone(r.tabs[g].Apply(broadcast.Entry{Index: idx, Data: e}))
	for i := 0; i < len(e); i += len(metaScribble) {
		copy(e[i:], metaScribble[:])
	}
	if r.caps != nil {
		r.since[g] = append(r.since[g], metaEntry{index: idx, data: data, res: out})
	}
	got, err := DecodeResult(out)
	if err != nil {
		r.fatalf("group %d entry %d: result: %v", g, idx, err)
	}
	if got != want {
		r.fatalf("group %d entry %d: result %+v, the model's %+v", g, idx, got, want)
	}
	return got
}

func (r *metaRun) resolve(s *metaStep) []Op {
	ops := slices.Clone(s.ops)
	for i := range ops {
		if ops[i].Cmp == CmpVersion && s.verSrc[i] != metaVerLiteral {
			ops[i].CmpVersion = r.m.regs[string(ops[i].Key)][s.verSrc[i]-metaVerLast]
		}
	}
	return ops
}

func (r *metaRun) commit(id StageID, dests []int) string {
	var rs []Result
	for _, g := range dests {
		idx := r.m.index[g] + 1
		rs = append(rs, r.deliver(g, AppendCommit(nil, id, r.reqLen(id)), r.m.commit(g, idx, id, r.reqLen(id))))
	}
	return metaOutcome(rs)
}

func (r *metaRun) reqLen(id StageID) int {
	if ops, ok := r.m.reqs[id]; ok {
		return RequestSize(ops)
	}
	return 64
}

func (r *metaRun) get(s *metaStep) string {
	g := r.m.groupOf(s.key)
	want, found := r.m.recs[string(s.key)]
	if s.mode == Linearizable {
		reg := r.m.regs[string(s.key)]
		r.m.regs[string(s.key)] = [2]uint64{want.version, reg[0]}
	}
	if r.tables {
		res, err := r.rds[g].Get(s.key, s.mode)
		if err != nil {
			r.fatalf("get: %v", err)
		}
		// One replica, every entry applied: stale-ok gets are exact too.
		if res.Found != found || !bytes.Equal(res.Value, want.value) || res.Version != want.version {
			r.fatalf("get: found %v, %d bytes %08x, version %#x; the model: found %v, %d bytes %08x, version %#x",
				res.Found, len(res.Value), crc32.ChecksumIEEE(res.Value), res.Version, found, len(want.value), crc32.ChecksumIEEE(want.value), want.version)
		}
		// Applied is a lower bound (the header the reader last saw).
		if res.Applied > r.m.index[g] {
			r.fatalf("get: applied %d, the group applied %d", res.Applied, r.m.index[g])
		}
	}
	return metaGetOutcome(found, want.value)
}

func (r *metaRun) snapshot() {
	if !r.tables || !r.c.restore {
		return
	}
	r.caps, r.since = make([]broadcast.FSMSnapshot, r.c.groups), make([][]metaEntry, r.c.groups)
	for g, tb := range r.tabs {
		c, err := tb.Snapshot()
		if err != nil {
			r.fatalf("group %d: snapshot: %v", g, err)
		}
		r.caps[g] = c
	}
}

// restore persists each group's capture (taken entries ago: the table's
// frees were deferred since), restores it into a new table on a new
// node, replays the entries applied since (each must give the same
// result) and reads that table from then on.
func (r *metaRun) restore() {
	if r.caps == nil {
		return
	}
	caps, since := r.caps, r.since
	r.caps, r.since = nil, nil
	for g := range r.tabs {
		buf := make([]byte, caps[g].Size())
		if err := caps[g].Persist(buf); err != nil {
			r.fatalf("group %d: persist: %v", g, err)
		}
		caps[g].Release()
		tb, n := r.newTable(g)
		if err := tb.Restore(buf); err != nil {
			r.fatalf("group %d: restore: %v", g, err)
		}
		for _, e := range since[g] {
			out := tb.Apply(broadcast.Entry{Index: e.index, Data: bytes.Clone(e.data)})
			if !bytes.Equal(out, e.res) {
				r.fatalf("group %d: the restored table's entry %d gave result %x, the table captured %x", g, e.index, out, e.res)
			}
		}
		if a, b := tb.Stats(), r.tabs[g].Stats(); a.Records != b.Records || a.HeapBytes != b.HeapBytes {
			r.fatalf("group %d: the restored table has %d records (%d heap bytes), the captured one %d (%d)", g, a.Records, a.HeapBytes, b.Records, b.HeapBytes)
		}
		r.rds[g].Close()
		r.tabs[g].Close()
		r.tnodes[g].Close()
		r.serve(g, tb, n)
	}
}

func (r *metaRun) run(seq []metaStep) []string {
	r.m = newMetaModel(r.c.groups)
	if r.tables {
		r.open()
		defer r.close()
	}
	out := make([]string, len(seq))
	for i := range seq {
		s := &seq[i]
		r.step, r.what = i, s
		out[i] = r.runStep(s)
	}
	r.step, r.what = len(seq), nil
	if r.tables {
		r.final()
	}
	return out
}

// runStep runs one step and returns its outcome.
func (r *metaRun) runStep(s *metaStep) (out string) {
	switch s.kind {
	case metaReq:
		ops := r.resolve(s)
		req := AppendRequest(nil, ops)
		dests := r.m.dests(ops)
		if !s.staged {
			var rs []Result
			for _, g := range dests {
				idx := r.m.index[g] + 1
				rs = append(rs, r.deliver(g, req, r.m.request(g, idx, ops)))
			}
			out = metaOutcome(rs)
			return out
		}
		if len(req) <= metaMaxRequest {
			r.m.reqs[s.id] = ops
		}
		var rs []Result
		for _, g := range dests {
			for _, p := range s.parts {
				rs = append(rs, r.deliver(g, AppendPart(nil, s.id, len(req), p[0], req[p[0]:p[1]]), r.m.part(g, s.id, len(req))))
			}
		}
		out = "staged " + metaOutcome(rs)
		if s.commitNow {
			out += ", " + r.commit(s.id, dests)
		}
	case metaCommit:
		out = r.commit(s.id, r.m.dests(r.m.reqs[s.id]))
	case metaBogusCommit:
		all := make([]int, r.c.groups)
		for g := range all {
			all[g] = g
		}
		out = r.commit(s.id, all)
	case metaGet:
		out = r.get(s)
	case metaSnapshot:
		r.snapshot()
	case metaRestore:
		r.restore()
	}
	return out
}

// final checks each table's counts against the model.
func (r *metaRun) final() {
	records, heapBytes := make([]int, r.c.groups), make([]int, r.c.groups)
	for k, rec := range r.m.recs {
		g := r.m.groupOf([]byte(k))
		records[g]++
		heapBytes[g] += classOf(recordSize(len(k), len(rec.value)))
	}
	for g, tb := range r.tabs {
		keys := metaIndexKeys(tb)
		for k, n := range keys {
			if _, ok := r.m.recs[k]; !ok || n != 1 {
				r.fatalf("group %d's index holds key %q %d times, the model %v", g, k, n, ok)
			}
		}
		if len(keys) != records[g] {
			r.fatalf("group %d's index holds %d keys, the model %d", g, len(keys), records[g])
		}
		st := tb.Stats()
		if st.Records != records[g] || st.HeapBytes != heapBytes[g] {
			r.fatalf("group %d: %d records in %d heap bytes, the model %d in %d", g, st.Records, st.HeapBytes, records[g], heapBytes[g])
		}
		n, b := tb.Staged()
		wn, wb := 0, 0
		for _, l := range r.m.stages[g] {
			for _, s := range l {
				wn++
				wb += s.total
			}
		}
		if n != wn || b != wb {
			r.fatalf("group %d: %d staged requests (%d bytes), the model %d (%d)", g, n, b, wn, wb)
		}
		r.t.Logf("group %d: %+v", g, st)
	}
}

func TestMetamorphicTable(t *testing.T) {
	steps, seeds := 3000, 4
	if raceEnabled {
		steps, seeds = 1000, 1
	}
	if *metaStepsFlag > 0 {
		steps = *metaStepsFlag
	}
	for _, seed := range metaSeedList(t, seeds) {
		seq := metaGenerate(seed, steps)
		// The reference: the model alone, one group.
		ref := (&metaRun{t: t, seed: seed, c: metaTableConfig{name: "model", groups: 1}}).run(seq)
		kinds := map[string]int{}
		for _, o := range ref {
			kinds[strings.Fields(o + " -")[0]]++
		}
		t.Logf("seed %d: %d steps, outcomes %v", seed, len(seq), kinds)
		for _, c := range metaTableConfigs {
			t.Run(fmt.Sprintf("seed=%d/%s", seed, c.name), func(t *testing.T) {
				if c.bug != "" && !*metaBugsFlag {
					t.Skipf("known bug (run with -metabugs): %s", c.bug)
				}
				r := &metaRun{t: t, seed: seed, c: c, tables: true}
				got := r.run(seq)
				for i := range seq {
					if got[i] != ref[i] {
						r.step, r.what = i, &seq[i]
						r.fatalf("outcome %q, the reference %q", got[i], ref[i])
					}
				}
			})
		}
	}
}

// TestMetamorphicCatchesMutants plants bugs in the tables and checks that
// the comparison with the model catches each within a few seeds.
func TestMetamorphicCatchesMutants(t *testing.T) {
	for _, m := range []struct {
		name string
		c    metaTableConfig
	}{
		// The bug these tests found: an op of a request that does not
		// migrate its key's buckets again after an earlier op grew the
		// index.
		{"no-remigrate", metaTableConfig{name: "lb2-ms1-load0.95", cfg: TableConfig{LogBuckets: 2, MigrateStep: 1, MaxLoad: 0.95}, groups: 1, knobs: testingKnobs{noRemigrate: true}}},
		{"no-condition", metaTableConfig{name: "default", groups: 1, knobs: testingKnobs{noCondition: true}}},
	} {
		t.Run(m.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 8; seed++ {
				seq := metaGenerate(seed, 3000)
				ref := (&metaRun{t: t, seed: seed, c: metaTableConfig{name: "model", groups: 1}}).run(seq)
				var msg string
				func() {
					defer func() {
						if p := recover(); p != nil {
							if _, ok := p.(metaStop); !ok {
								panic(p)
							}
						}
					}()
					r := &metaRun{t: t, seed: seed, c: m.c, tables: true, caught: &msg}
					got := r.run(seq)
					for i := range seq {
						if got[i] != ref[i] {
							r.step, r.what = i, &seq[i]
							r.fatalf("outcome %q, the reference %q", got[i], ref[i])
						}
					}
				}()
				if msg != "" {
					t.Logf("seed %d caught it: %s", seed, strings.SplitN(msg, "\n", 2)[0])
					return
				}
			}
			t.Fatalf("the planted bug was not caught in 8 seeds")
		})
	}
}
