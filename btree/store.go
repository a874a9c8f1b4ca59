package btree

import (
	"bytes"
	"fmt"
	"slices"
	"sort"

	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/rdma"
)

// Store is the ordered part of one kv replica's state: the group's tree,
// the tablets (key ranges) the group owns, and the slots waiting out their
// grace. kv.Table routes the ordered requests it applies here (by their
// format byte, kv.OrderedFormat) and takes the Store's section into its
// snapshots; every replica of the group applies the same requests in the
// same order, so every replica's Store holds the same keys, values and
// versions (node ids may differ after a restore: a restored tree is
// bulk-loaded).
//
// All methods but Snapshot's Persist run on the replica's polling
// goroutine.
type Store struct {
	cfg     StoreConfig
	regs    *Regions // nil without a node (unit tests)
	a       *Arena
	t       *Tree
	tablets []Tablet
	// dirVer is the version of tablets, bumped at each change; dirPub
	// the version last written to the directory area. ownVer is the
	// version of the keys the group serves (move.go: OwnVersion). Both
	// are replicated state: every replica has the same at each entry,
	// and snapshots carry them.
	dirVer, dirPub, ownVer uint64
	// verOff is added to every version the store issues (index<<16 |
	// op): raised by an ingest so that no version issued later equals one
	// a moved key held in another group (whose log indexes are not ours),
	// which a compare-and-swap could otherwise match. Never lowered:
	// versions stay strictly increasing. Replicated state (snapshots).
	verOff uint64
	// counts are the keys each tablet holds (a tablet splits past
	// TabletMax).
	counts []int
	// garbage: the key ranges of dropped tablets whose keys are still
	// in the tree, garbageKeys of them (garbage.go); gcLeft is what this
	// batch may still delete of them (GarbageStep, renewed at Publish).
	// Replicated state (snapshots carry the ranges).
	garbage     []Tablet
	garbageKeys int
	gcLeft      int
	// loadSeq counts the writes counted in the tablets (Tablet.Writes);
	// loadPub and loadVer are it and dirVer at the last publication of
	// the load area (a drop publishes the directory area alone, in its
	// apply: the next Publish must write the load area of that version
	// even if no write was counted since); loadGC is the garbage key
	// count it published (load.go: republished when it changes).
	loadSeq, loadPub, loadVer uint64
	loadGC                    int
	// pending: unlinked nodes, oldest first, with the entry that
	// unlinked them; each slot is released FreeAfter entries later.
	pending []pendingFree
	index   uint64 // the entry being applied
	applied uint64 // the last entry applied
	knobs   testingKnobs

	// work counts what Apply did (Stats).
	work StoreStats

	ops  []Op
	mops []Op
	// preKeys are the keys of the batch's requests Prefetch kept for
	// TouchBatch (prefetch.go); touched:
	// TouchBatch kept paths for the batch being applied.
	preKeys [][]byte
	touched bool
	mbuf    []byte
	mfail   int
	res     []byte
}

type pendingFree struct {
	id NodeID
	at uint64
}

// Tablet is a key range [Low, High) a group owns; HighInf: no upper bound.
type Tablet struct {
	Low, High []byte
	HighInf   bool
	// State is TabletServing, TabletFrozen (a move under way: writes
	// refused with StatusMoving) or TabletInstalling (being moved in:
	// not served yet). To is the group a frozen tablet moves to. Gen
	// counts the tablet's moves (0 for the config's tablets; a move's
	// tablet has its source's Gen + 1; halves of a split keep it): of
	// two overlapping tablets in a directory, the higher Gen is the
	// newer (move.go).
	State uint8
	To    uint32
	Gen   uint64
	// Writes counts the write ops the group applied to the tablet's
	// keys (puts, and deletes of a key that was there) since the tablet
	// came to be in this group: a config tablet from the store's start,
	// a tablet moved in from its ingest (0), the upper half of a split
	// from the split (0; the lower half keeps the count). Every replica
	// counts the same at each entry, but the count is a hint, not
	// replicated state: snapshots do not carry it, so a restored
	// replica starts again from 0. The balancer's load (load.go).
	Writes uint64
	// Keys and HasLoad are set only by a directory read (DecodeDir):
	// Keys is the tablet's key count, and HasLoad says that Writes and
	// Keys were read with the tablets (the load area matched the
	// directory area; see load.go).
	Keys    uint64
	HasLoad bool
}

// Contains reports whether key lies in the tablet.
func (tb Tablet) Contains(key []byte) bool {
	return string(key) >= string(tb.Low) && (tb.HighInf || string(key) < string(tb.High))
}

// All is the tablet of the whole keyspace.
var All = Tablet{HighInf: true}

// StoreConfig configures a group's Store.
type StoreConfig struct {
	// Group is the group: its regions are regions.BTree(Group)+k.
	Group uint32
	// Tree is the node geometry.
	Tree Config
	// ChunkSlots is the number of node slots per arena chunk (a
	// registered region). Default DefaultChunkSlots. The arena holds at
	// most MaxChunks of them: with the defaults, 127 chunks of 4 MiB
	// (1024 nodes of 4 KiB), 508 MiB of nodes per group.
	ChunkSlots int
	// MaxChunks bounds the arena: at most this many chunks (default and
	// most: the 127 the group's region ids leave). Writes that might need
	// more slots than are left are refused (StatusRefused, LimitHeap).
	MaxChunks int
	// FreeAfter is the grace, in entries, between a node's unlinking and
	// the reuse of its slot. Default 1024.
	FreeAfter uint64
	// MaxResult bounds the bytes of a read's result (a scan stops there
	// and says so). Default 64 KiB; at least 24 + one pair.
	MaxResult int
	// Fill is the fill factor of restored (bulk-loaded) nodes. Default
	// DefaultFill.
	Fill float64
	// Tablets are the key ranges the group owns, sorted and disjoint, at
	// most MaxTablets (cluster.Map.OrderedStore places them: the
	// keyspace's split points cut the key order into tablets, placed
	// round-robin over the groups). All of them live in the group's one
	// tree.
	Tablets []Tablet
	// TabletMax is the most keys a tablet holds: the put that takes one
	// past it splits the tablet in two at its median key, in the same
	// apply (both halves stay in the group and are published). Default
	// DefaultTabletMax; negative: tablets never split. A split that
	// would give the group more than MaxTablets tablets, or overflow the
	// directory area, is not made (the tablet grows on).
	TabletMax int
	// EarlySplit and FirstTabletMax make a fresh load cut tablets early
	// (plan section 5, "Bootstrapping"): while the group owns fewer than
	// EarlySplit tablets, a tablet splits past FirstTabletMax keys
	// (default DefaultFirstTabletMax) rather than TabletMax. Moves then
	// spread those tablets over the groups (client.Balance), and each
	// group cuts its own early again. cluster.Map.OrderedStore sets
	// EarlySplit to the number of groups. 0: no early splits.
	EarlySplit     int
	FirstTabletMax int
	// GarbageStep is the most keys of dropped tablets a replica deletes
	// per log entry (garbage.go): a drop leaves its tablet's keys as
	// garbage that the group's later ordered applies delete, this many
	// per batch. Default DefaultGarbageStep; negative: no bound (a drop
	// deletes its keys in its own apply, as it used to).
	GarbageStep int
	// PrefaultNodes is how many bytes of new arena slots past the one a
	// split takes a goroutine of the store keeps mapped, off the polling
	// goroutine (Arena.SetPrefault; e.g. DefaultPrefaultNodes). 0 (what
	// kvserver uses): the writer populates windows of new slots itself
	// (populate.go). It needs the regions of a node (the Go heap arena
	// of a nil node ignores it).
	PrefaultNodes int
	// Readers are granted read access to the regions.
	Readers []rdma.NodeID
}

// DefaultChunkSlots is the default ChunkSlots. It was 256 (1 MiB chunks
// of 4 KiB nodes), which bounded a group's tree to 127 MiB of nodes: a
// million records of 16-byte keys and 100-byte values, loaded in key
// order, take 147 MiB, and the group refused the rest as a full heap.
const DefaultChunkSlots = 1024

// DefaultTabletMax is the default TabletMax.
const DefaultTabletMax = 64 << 10

// DefaultFirstTabletMax is the default FirstTabletMax.
const DefaultFirstTabletMax = 4 << 10

func (c *StoreConfig) fill() error {
	c.Tree = c.Tree.withDefaults()
	if c.ChunkSlots == 0 {
		c.ChunkSlots = DefaultChunkSlots
	}
	if c.MaxChunks == 0 {
		c.MaxChunks = maxChunks
	}
	if c.FreeAfter == 0 {
		c.FreeAfter = 1024
	}
	if c.MaxResult == 0 {
		c.MaxResult = 64 << 10
	}
	if c.Fill == 0 {
		c.Fill = DefaultFill
	}
	if c.TabletMax == 0 {
		c.TabletMax = DefaultTabletMax
	}
	if c.FirstTabletMax == 0 {
		c.FirstTabletMax = DefaultFirstTabletMax
	}
	if c.GarbageStep == 0 {
		c.GarbageStep = DefaultGarbageStep
	}
	switch {
	case c.ChunkSlots < 1:
		return fmt.Errorf("btree: %d slots per chunk", c.ChunkSlots)
	case c.MaxChunks < 1 || c.MaxChunks > maxChunks:
		return fmt.Errorf("btree: MaxChunks %d out of 1..%d", c.MaxChunks, maxChunks)
	case c.Fill <= 0 || c.Fill > 1:
		return fmt.Errorf("btree: fill %v out of (0, 1]", c.Fill)
	case c.MaxResult < resSize+16+2*c.Tree.MaxKey+c.Tree.MaxInline():
		return fmt.Errorf("btree: MaxResult %d cannot hold one pair", c.MaxResult)
	}
	if err := checkTablets(c.Tablets, c.Tree.MaxKey); err != nil {
		return err
	}
	return c.Tree.Validate()
}

// NewStore makes group cfg.Group's store with an empty tree, its regions
// registered on node (nil: the arena in the Go heap and no header, for
// tests), and publishes its header.
func NewStore(cfg StoreConfig, node rdma.Node) (*Store, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, tablets: slices.Clone(cfg.Tablets), dirVer: 1, ownVer: 1, counts: make([]int, len(cfg.Tablets)), gcLeft: cfg.GarbageStep}
	if node != nil {
		r, err := NewRegions(node, cfg.Group, cfg.Tree.NodeSize, cfg.ChunkSlots, cfg.Readers)
		if err != nil {
			return nil, err
		}
		s.regs, s.a = r, r.Arena
		s.a.SetPrefault(cfg.PrefaultNodes)
	} else {
		s.a = NewArena(cfg.Tree.NodeSize, cfg.ChunkSlots, nil)
	}
	s.a.limit = cfg.MaxChunks
	t, err := New(cfg.Tree, s.a, 0)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.setTree(t)
	s.Publish(0)
	return s, nil
}

func (s *Store) setTree(t *Tree) {
	s.t = t
	t.onFree = func(id NodeID) { s.pending = append(s.pending, pendingFree{id: id, at: s.index}) }
}

// Close stops the arena's pre-faulting and deregisters the regions.
func (s *Store) Close() error {
	s.a.closeFaulter()
	if s.regs != nil {
		return s.regs.Close()
	}
	return nil
}

// Tree is the group's tree (the writer's view: tests and checks only).
func (s *Store) Tree() *Tree { return s.t }

// Regions are the store's registered regions (nil without a node).
func (s *Store) Regions() *Regions { return s.regs }

// Tablets are the key ranges the group owns.
func (s *Store) Tablets() []Tablet { return s.tablets }

// Pending is the number of unlinked nodes whose slots wait out the grace.
func (s *Store) Pending() int { return len(s.pending) }

// StoreStats is a Store's size and work: what a replica reports of its
// ordered part (kv.Stats.Ordered). Keys, the tree's Usage (live nodes,
// the bytes its leaves use, splits since the tree was made) and the
// arena's Slots (ever handed out: live, dead in their grace, or free)
// and ArenaBytes (its chunks: the node memory the group registered) are
// read as they are; the counts of requests (messages: an ordered
// request, multi or not), writes (their write ops that changed the tree),
// inserts (puts of a new key) and tablet splits are since the Store was
// made. None of it walks the tree: a replica's stats read it often.
// GarbageKeys (of Keys) are keys of dropped tablets not deleted yet, in
// GarbageRanges ranges; GarbageDeleted counts the keys deleted since in
// bounded steps, GarbageCleared those deleted at once by an ingest of a
// tablet coming back over them (garbage.go).
type StoreStats struct {
	Keys       int
	Tablets    int
	NodeSize   int
	Slots      int
	ArenaBytes int
	Usage
	Requests, Writes, Inserts, TabletSplits uint64
	// Prefetched counts the keys whose paths a prefetch kept
	// (prefetch.go: a batch's, at TouchBatch, or a multi request's
	// own), PrefetchUsed the lookups of the applies that took a kept
	// leaf, PrefetchBatches the batches whose TouchBatch kept paths.
	Prefetched, PrefetchUsed, PrefetchBatches uint64
	GarbageKeys, GarbageRanges                int
	GarbageDeleted, GarbageCleared            uint64
	// PrefaultPages counts the pages of new slots the arena's faulter
	// touched (PrefaultNodes), PrefaultDrops its requests not made as
	// its queue was full, PrefaultCPU the CPU time it spent (ns).
	PrefaultPages, PrefaultDrops, PrefaultCPU int64
}

// Stats is the Store's size and work.
func (s *Store) Stats() StoreStats {
	st := s.work
	st.Keys, st.Tablets, st.NodeSize = s.t.Len(), len(s.tablets), s.cfg.Tree.NodeSize
	st.GarbageKeys, st.GarbageRanges = s.garbageKeys, len(s.garbage)
	st.Slots, st.ArenaBytes = s.a.Slots(), len(s.a.chunks)*s.a.per*s.a.size
	st.Usage = s.t.Usage()
	st.Prefetched, st.PrefetchUsed = s.t.prefetchedKeys, s.t.prefetchUsed
	st.PrefaultPages, st.PrefaultDrops, st.PrefaultCPU = s.a.Prefaults()
	return st
}

// Publish writes the header (root and applied index) after the node
// writes of every entry up to applied: kv.Table calls it once per batch
// (multicast's EndBatch) and after each ordered request outside a batch.
// It renews the garbage budget: the next batch may delete GarbageStep
// more keys of dropped tablets.
func (s *Store) Publish(applied uint64) {
	s.gcLeft = s.cfg.GarbageStep
	s.t.prefetchDone()
	s.touched = false
	if applied > s.applied {
		s.applied = applied
	}
	if s.regs != nil {
		var dir []Tablet
		if s.dirPub != s.dirVer {
			dir = s.tablets
			if dir == nil {
				dir = []Tablet{}
			}
			s.dirPub = s.dirVer
		}
		if s.loadVer != s.dirVer || s.loadPub != s.loadSeq || (s.loadGC != s.garbageKeys && !s.knobs.gcNotPublished) {
			// Before the header. A reader that reads one area
			// before and the other after a change finds that their
			// directory versions differ and takes no load (load.go).
			s.regs.publishLoad(s.dirVer, s.tablets, s.counts, s.garbageKeys)
			s.loadPub, s.loadVer, s.loadGC = s.loadSeq, s.dirVer, s.garbageKeys
		}
		s.regs.Publish(s.t, s.applied, s.dirVer, s.ownVer, dir)
	}
}

// DirVersion is the version of the group's tablets (bumped at each
// change; published with them).
func (s *Store) DirVersion() uint64 { return s.dirVer }

// reclaim releases the slots whose grace ended by entry index.
func (s *Store) reclaim(index uint64) {
	k := 0
	for k < len(s.pending) && (s.knobs.freeAtOnce || s.pending[k].at+s.cfg.FreeAfter <= index) {
		s.a.release(s.pending[k].id)
		k++
	}
	if k > 0 {
		s.pending = append(s.pending[:0], s.pending[k:]...)
	}
}

// owner is the tablet holding key that the group serves reads of
// (serving or frozen), or -1.
func (s *Store) owner(key []byte) int {
	if i := s.find(key); i >= 0 && s.tablets[i].State != TabletInstalling {
		return i
	}
	return -1
}

// searchTablets is the index of the last of tablets (sorted) whose low
// fence is at most key, or -1.
func searchTablets(tablets []Tablet, key []byte) int {
	return sort.Search(len(tablets), func(i int) bool { return string(tablets[i].Low) > string(key) }) - 1
}

// Apply applies the ordered request data delivered as entry index and
// returns its result (see request.go), then deletes what the batch's
// budget allows of the dropped tablets' keys (garbage.go).
func (s *Store) Apply(index uint64, data []byte) []byte {
	out := s.apply(index, data)
	if len(s.garbage) > 0 {
		s.collect(index)
		if s.knobs.freeAtOnce {
			s.reclaim(index)
		}
	}
	return out
}

func (s *Store) apply(index uint64, data []byte) []byte {
	s.index = index
	s.applied = max(s.applied, index)
	s.reclaim(index)
	s.work.Requests++
	if IsMulti(data) {
		return s.applyMulti(index, data)
	}
	if IsCtl(data) {
		return s.applyCtl(index, data)
	}
	ops, err := DecodeRequest(data, s.ops)
	s.ops = ops[:0]
	if err != nil {
		return s.result(&Result{Status: StatusMalformed})
	}
	if k := ops[0].Kind; k == OpGet || k == OpScan {
		if ops[0].Hashed {
			s.res = appendReadHeader(s.res[:0], StatusMixed, 0, false, 0, index)
			return s.res
		}
		return s.read(index, &ops[0])
	}
	res := s.applyOps(index, ops, 0)
	if s.knobs.freeAtOnce {
		s.reclaim(index)
	}
	return s.result(&res)
}

// applyMulti applies a multi request's independent writes, each as a
// request of that one op at version index<<16 | its position, and returns
// their results in order (request.go).
func (s *Store) applyMulti(index uint64, data []byte) []byte {
	ops, err := DecodeMulti(data, s.ops)
	s.ops = ops[:0]
	switch {
	case err != nil:
		return s.result(&Result{Status: StatusMalformed})
	case len(ops) > MaxMulti:
		r := refusedRes(LimitMulti, MaxMulti, MaxMulti, len(ops))
		return s.result(&r)
	}
	if !s.touched {
		// A multi request outside a batch, or alone in its batch,
		// touches its own ops' leaves (prefetch.go).
		s.preKeys = s.preKeys[:0]
		for i := range ops {
			s.preKeys = append(s.preKeys, ops[i].Key)
		}
		s.t.prefetch(s.preKeys)
		clear(s.preKeys)
		s.preKeys = s.preKeys[:0]
	}
	out := appendMultiHeader(s.res[:0], len(ops))
	for i := range ops {
		j := i
		if s.knobs.shiftMultiResults {
			j = (i + 1) % len(ops)
		}
		r := s.applyOps(index, ops[j:j+1], j)
		out = AppendResult(out, &r)
	}
	if s.knobs.freeAtOnce {
		s.reclaim(index)
	}
	s.res = out
	return out
}

func (s *Store) result(r *Result) []byte {
	s.res = AppendResult(s.res[:0], r)
	return s.res
}

func refusedRes(limit uint8, op, maxv, size int) Result {
	return Result{Status: StatusRefused, Limit: limit, FailedOp: op, Max: uint64(maxv), Size: uint64(size)}
}

// applyOps applies a write request atomically: every check (space,
// ownership, sizes, merges, conditions, room) before any change. Op i
// gets version index<<16 | (base+i); every node it writes is stamped
// index.
func (s *Store) applyOps(index uint64, ops []Op, base int) Result {
	for i := range ops {
		if ops[i].Hashed {
			return Result{Status: StatusMixed, FailedOp: i}
		}
	}
	if !s.knobs.skipOwnerCheck {
		for i := range ops {
			switch k := s.find(ops[i].Key); {
			case k < 0 || s.tablets[k].State == TabletInstalling:
				return Result{Status: StatusMoved, FailedOp: i}
			case s.tablets[k].State == TabletFrozen && !s.knobs.writeDuringMove:
				return Result{Status: StatusMoving, FailedOp: i}
			}
		}
	}
	for i := range ops {
		if op := &ops[i]; len(op.Key) > s.cfg.Tree.MaxKey {
			return refusedRes(LimitKey, i, s.cfg.Tree.MaxKey, len(op.Key))
		}
	}
	// As kv.Table.applyOps: merges resolved, then limits and room, then
	// the conditions, against the state before the request.
	// A blind put (one unconditional put: what the client's combining
	// sends for Put) needs no lookup before it: the put itself reports
	// the version it replaced, so the request descends and searches its
	// leaf once (docs/btree.md "Replicas: the Store").
	blind := len(ops) == 1 && ops[0].Kind == OpPut && ops[0].Cmp == CmpNone && !s.knobs.noBlindPut
	var prev uint64
	var first Entry
	var found0 bool
	if !blind {
		if first, found0 = s.t.Get(ops[0].Key); found0 {
			prev = first.Version
		}
	}
	ops, ok := s.resolveMerges(ops)
	if !ok {
		r := Result{Status: StatusCondFailed, FailedOp: s.mfail}
		if s.mfail == 0 {
			r.Prev = prev
		}
		return r
	}
	for i := range ops {
		if op := &ops[i]; op.Kind == OpPut && len(op.Value) > s.cfg.Tree.MaxInline() {
			return refusedRes(LimitValue, i, s.cfg.Tree.MaxInline(), len(op.Value))
		}
	}
	// Room: a put splits at most every node of its path and adds a root.
	if room := s.a.room(); room >= 0 {
		height := s.t.height()
		need := 0
		for i := range ops {
			if ops[i].Kind == OpPut {
				need += height + 1
				height++
			}
		}
		if need > room {
			return refusedRes(LimitHeap, 0, s.cfg.MaxChunks*s.cfg.ChunkSlots*s.cfg.Tree.NodeSize, s.a.Slots()*s.cfg.Tree.NodeSize)
		}
	}
	res := Result{Prev: prev}
	for i := range ops {
		var e *Entry // the key's state before, if known
		if bytes.Equal(ops[i].Key, ops[0].Key) {
			e = &first
		}
		if !s.holds(&ops[i], e, found0) {
			res.Status, res.FailedOp = StatusCondFailed, i
			return res
		}
	}
	for i := range ops {
		op := &ops[i]
		version := index<<16 | uint64(base+i) + s.verOff
		if res.Count == 0 {
			res.Version = version
		}
		res.Count++
		switch op.Kind {
		case OpPut:
			was, existed, err := s.t.put(op.Key, op.Value, version, index)
			if err != nil {
				panic(fmt.Sprintf("btree: put checked before: %v", err))
			}
			if blind && existed && !s.knobs.blindNoPrev {
				res.Prev = was
			}
			s.work.Writes++
			if !existed {
				s.work.Inserts++
			}
			if k := s.find(op.Key); k >= 0 {
				s.countWrite(k)
				if !existed {
					if s.counts[k]++; s.counts[k] > s.splitPast() && s.tablets[k].State == TabletServing {
						s.splitTablet(k)
					}
				}
			}
		case OpDelete:
			if s.t.Delete(op.Key, index) {
				s.work.Writes++
				if k := s.find(op.Key); k >= 0 {
					s.counts[k]--
					s.countWrite(k)
				}
			}
		}
	}
	return res
}

// splitPast is the count past which a tablet splits: TabletMax, or
// FirstTabletMax while the group owns fewer than EarlySplit tablets (a
// function of replicated state: every replica splits at the same put).
func (s *Store) splitPast() int {
	if s.cfg.TabletMax <= 0 {
		return int(^uint(0) >> 1)
	}
	if len(s.tablets) < s.cfg.EarlySplit && s.cfg.FirstTabletMax > 0 {
		return min(s.cfg.FirstTabletMax, s.cfg.TabletMax)
	}
	return s.cfg.TabletMax
}

// splitTablet cuts tablet k in two at its median key (the first key of
// its upper half), unless the group has MaxTablets tablets or the
// directory area could not hold the new fence. Every replica applies the
// same puts, so every replica splits at the same key in the same apply.
func (s *Store) splitTablet(k int) {
	if len(s.tablets) >= MaxTablets {
		return
	}
	tb := s.tablets[k]
	half := s.counts[k] / 2
	var mid []byte
	i := 0
	s.t.ascend(tb.Low, func(e Entry) bool {
		if i == half {
			mid = slices.Clone(e.Key)
			return false
		}
		i++
		return true
	})
	if mid == nil || string(mid) <= string(tb.Low) {
		return
	}
	// The lower half keeps the write count (load.go: a balancer that
	// knew the tablet by its low fence and generation goes on measuring
	// it), the upper half counts from 0.
	lo := Tablet{Low: tb.Low, High: mid, Gen: tb.Gen, Writes: tb.Writes}
	hi := Tablet{Low: mid, High: tb.High, HighInf: tb.HighInf, Gen: tb.Gen}
	if s.knobs.splitCopiesWrites {
		hi.Writes = tb.Writes // planted: the halves' writes add up to more than were made
	}
	if s.knobs.splitGap {
		hi.Low = append(slices.Clone(mid), 0) // planted: [mid, mid+0) left to no tablet
	}
	if dirSize(s.tablets)+dirEnt+2*len(mid) > DirBytes {
		return
	}
	s.tablets = slices.Insert(s.tablets, k+1, hi)
	s.tablets[k] = lo
	s.counts = slices.Insert(s.counts, k+1, s.counts[k]-half)
	s.counts[k] = half
	s.dirVer++
	s.work.TabletSplits++
}

// Counts are the keys each tablet holds (tests).
func (s *Store) Counts() []int { return s.counts }

// countWrite counts a write op applied to tablet k's keys.
func (s *Store) countWrite(k int) {
	s.tablets[k].Writes++
	s.loadSeq++
}

// holds checks op's condition against the key's state before the request
// (known: *known and found, when known is not nil).
func (s *Store) holds(op *Op, known *Entry, found bool) bool {
	if op.Cmp == CmpNone {
		return true
	}
	var e Entry
	if known != nil {
		e = *known
	} else {
		e, found = s.t.Get(op.Key)
	}
	switch op.Cmp {
	case CmpVersion:
		if op.CmpVersion == 0 {
			return !found
		}
		return found && e.Version == op.CmpVersion
	case CmpValue:
		if op.CmpVersion == 1 {
			return !found
		}
		return found && bytes.Equal(e.Value, op.CmpValue)
	case CmpExists:
		return found
	}
	return false
}

// resolveMerges turns each merge into the put of its merged value (the
// key's value as the request's earlier ops leave it, with the merge's
// fields set), as kv does; false (s.mfail the merge) if that value is
// not a fielded value.
func (s *Store) resolveMerges(ops []Op) ([]Op, bool) {
	has := false
	for i := range ops {
		has = has || ops[i].Kind == OpMerge
	}
	if !has {
		return ops, true
	}
	out := append(s.mops[:0], ops...)
	s.mops = out[:0]
	// Merged values are appended to buf (an append that moves it leaves
	// the values taken before where they were).
	buf := s.mbuf[:0]
	for i := range out {
		op := &out[i]
		if op.Kind != OpMerge {
			continue
		}
		var cur []byte
		found, earlier := false, false
		for j := i - 1; j >= 0; j-- {
			if bytes.Equal(out[j].Key, op.Key) {
				earlier, found, cur = true, out[j].Kind == OpPut, out[j].Value
				break
			}
		}
		if !earlier {
			var e Entry
			e, found = s.t.Get(op.Key)
			cur = e.Value
		}
		if !found {
			op.Kind = OpPut
			continue
		}
		start := len(buf)
		var err error
		buf, err = fielded.Merge(buf, cur, op.Value)
		if err != nil {
			s.mbuf, s.mfail = buf, i
			return ops, false
		}
		op.Kind, op.Value = OpPut, buf[start:len(buf):len(buf)]
	}
	s.mbuf = buf
	return out, true
}

// read answers a Get or a Scan at entry index.
func (s *Store) read(index uint64, op *Op) []byte {
	if op.Kind == OpGet {
		if s.owner(op.Key) < 0 {
			s.res = appendReadHeader(s.res[:0], StatusMoved, 0, false, 0, index)
			return s.res
		}
		e, ok := s.t.Get(op.Key)
		if !ok {
			s.res = appendReadHeader(s.res[:0], StatusOK, 0, false, 0, index)
			return s.res
		}
		s.res = appendReadHeader(s.res[:0], StatusOK, 0, false, 1, index)
		s.res = appendPair(s.res, e.Key, e.Value, e.Version)
		return s.res
	}
	start, end, limit := op.Key, op.Value, int(op.CmpVersion)
	// The range must lie in one run of contiguous tablets the group
	// owns (a tablet that split is still one range).
	i := s.owner(start)
	if i >= 0 {
		run := s.tablets[i]
		for j := i + 1; j < len(s.tablets) && !run.HighInf && string(s.tablets[j].Low) == string(run.High) && s.tablets[j].State != TabletInstalling; j++ {
			run.High, run.HighInf = s.tablets[j].High, s.tablets[j].HighInf
		}
		if len(end) == 0 && !run.HighInf || len(end) != 0 && !run.HighInf && string(end) > string(run.High) {
			i = -1
		}
	}
	if i < 0 {
		s.res = appendReadHeader(s.res[:0], StatusMoved, 0, false, 0, index)
		return s.res
	}
	out := appendReadHeader(s.res[:0], StatusOK, 0, false, 0, index)
	n, more := 0, false
	s.t.ascend(start, func(e Entry) bool {
		if len(end) != 0 && string(e.Key) >= string(end) || limit > 0 && n >= limit {
			return false
		}
		if len(out)+pairSize(e.Key, e.Value) > s.cfg.MaxResult {
			more = true
			return false
		}
		out = appendPair(out, e.Key, e.Value, e.Version)
		n++
		return true
	})
	s.res = appendReadHeader(out[:0], StatusOK, 0, more, n, index)[:len(out)]
	return s.res
}
