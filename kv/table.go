package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/internal/prefault"
	"github.com/rdmakv/rdmakv/internal/reuse"
	"github.com/rdmakv/rdmakv/kv/fielded"
	"github.com/rdmakv/rdmakv/rdma"
)

// Defaults of TableConfig.
const (
	DefaultMaxKey         = 1 << 10
	DefaultMaxValue       = 1 << 20
	DefaultLogBuckets     = 10
	DefaultHeapRegionSize = 64 << 20
	DefaultMigrateStep    = 8
	// DefaultQuadGrowthLog: the index grows into four times its buckets
	// while the new generation has at most 2^16 buckets (an 8 MiB index,
	// 459 k slots), then into twice (TableConfig.QuadGrowthLog): from 2^16
	// buckets on, a table's generations are those doubling gives, so its
	// index's memory per record is doubling's too.
	DefaultQuadGrowthLog = 16
	// DefaultMaxLoad is the fill (of all slots) at which the index grows.
	DefaultMaxLoad = 0.75
)

// TableConfig configures one replica's table.
type TableConfig struct {
	// Group is the table's group: its regions are regions.KV(Group)+k.
	Group uint32
	// SlotMap assigns each of the NumHashSlots hash slots a group; the
	// table applies the operations on keys of its group's slots and skips
	// the others (parts of a batch that other groups apply). nil: every
	// key is this group's.
	SlotMap []uint32
	// Readers are the nodes granted read access to the table's regions
	// (clients, and the group's members for stale-ok reads among them).
	Readers []rdma.NodeID
	// MaxKey and MaxValue bound keys and values (bytes). Default 1 KiB
	// and 1 MiB.
	MaxKey, MaxValue int
	// LogBuckets is the initial index size: 2^LogBuckets buckets of 7
	// slots. Default 10. At least 2.
	LogBuckets int
	// HeapRegionSize is the size of each heap region records live in
	// (at most 192 regions). Default 64 MiB; it must hold a record of
	// MaxKey+MaxValue bytes.
	HeapRegionSize int
	// MaxLoad is the fraction of index slots in use at which the index
	// grows into a generation of more buckets (QuadGrowthLog). Default
	// 0.75.
	MaxLoad float64
	// QuadGrowthLog bounds the growths that take four times the buckets:
	// a growth whose new generation has at most 2^QuadGrowthLog buckets
	// makes four times the current buckets, a larger one twice. Each
	// growth rehashes every key of the old generation (migrateBucket,
	// which reads the key from the heap), so four times moves each key a
	// third as often as twice over a table's growth (N/3 moves against
	// N), for an index that is up to twice as large right after a growth
	// (a fill of MaxLoad/4 against MaxLoad/2); the bound keeps that extra
	// index memory under 2^QuadGrowthLog buckets x 128 bytes. Default
	// DefaultQuadGrowthLog; -1: always twice.
	QuadGrowthLog int
	// MaxRequest bounds a request's encoded bytes (a large put, a batch),
	// and so what a group stages for one request sent in parts. Default
	// MaxKey + MaxValue + 4 KiB.
	MaxRequest int
	// MigrateStep is how many buckets of the old generation each applied
	// operation migrates while the index grows. Default 8.
	MigrateStep int
	// Inc is this table's incarnation, shown in the header (a restarted
	// replica's readers see the change). Default the Unix time in ns.
	Inc uint64
	// Clock gives the wall-clock time (Unix ns) recorded with each
	// applied entry; default time.Now. The simulator passes its own.
	Clock func() int64
	// Ordered is the replica's ordered keyspace (a btree.Store; nil:
	// none, and ordered requests are refused as malformed): it applies
	// the requests of format OrderedFormat (ordered.go).
	Ordered Ordered
	// OnBackup, if set, is called on the polling goroutine when the
	// table applies a backup marker (backup.go), with the table as it
	// stands after the entries up to the marker: it may capture it
	// (Snapshot) and write the capture off the polling goroutine.
	OnBackup func(t *Table, m BackupMarker)
	// PrefaultSpare keeps a spare buffer for a capture's copy of the
	// index (Snapshot), allocated and its pages touched by a goroutine of
	// the table's, off the polling goroutine, when the table is made,
	// when its index grows and when a snapshot is restored into it: the
	// capture's copy then lands in mapped memory, and the poller pays no
	// page faults for it (a first capture's fresh buffer cost a 1 M-record
	// table's poller 38-217 ms here: issue 19). The cost is one buffer the size
	// of the largest index copy since the table was made: the index's
	// size, 1.5 times it after a growth (a capture while the index grows
	// copies both generations). Without it the first capture, and the
	// first after each growth, pay the faults on the poller (the spare is
	// then only a released capture's buffer). Off in the simulator (no
	// goroutines there); a kvserver with a durable mode sets it.
	PrefaultSpare bool
	// SpareAfter, if set, holds PrefaultSpare's goroutine until it is
	// closed (or the table closes): no spare is made before, and then
	// one of the size last asked. A process that builds its replicas at
	// its start closes it once every replica is built, so that the
	// spares' fresh pages (an index's size each) do not take processors
	// from the builds (issue 19). nil: spares are made at once.
	SpareAfter <-chan struct{}
	// PrefaultHeap is how many bytes past the heap's bump pointer (where
	// inserts of new keys take their records) a goroutine of the table
	// keeps faulted in, off the polling goroutine (heapfault.go): a
	// fresh page's first store there cost the poller 15-30 µs on this
	// project's VM, once per few records. 0: off (the simulator: no
	// goroutines there); a kvserver replica sets DefaultPrefaultHeap.
	// The cost is at most this much memory mapped before it is used.
	PrefaultHeap int
	// Scratch, if set, lends Restore its buffers (the snapshot's
	// records and their placement order) and takes them back after:
	// a process that builds its replicas one after another restores
	// each into the buffers of the ones before (package reuse: first
	// accesses to fresh buffers cost ~12 µs of CPU a page on this
	// project's VMs). nil: fresh buffers each Restore.
	Scratch *reuse.Pool
}

// DefaultPrefaultHeap is the PrefaultHeap a kvserver replica uses.
const DefaultPrefaultHeap = 4 << 20

// DefaultMaxRequest is TableConfig.MaxRequest's default for the given key
// and value limits: one key and one value, and 4 KiB of encoding and other
// operations.
func DefaultMaxRequest(maxKey, maxValue int) int { return maxKey + maxValue + 4096 }

func (c *TableConfig) fill() error {
	if c.MaxKey == 0 {
		c.MaxKey = DefaultMaxKey
	}
	if c.MaxValue == 0 {
		c.MaxValue = DefaultMaxValue
	}
	if c.LogBuckets == 0 {
		c.LogBuckets = DefaultLogBuckets
	}
	if c.HeapRegionSize == 0 {
		c.HeapRegionSize = DefaultHeapRegionSize
	}
	if c.MaxLoad == 0 {
		c.MaxLoad = DefaultMaxLoad
	}
	if c.MaxRequest == 0 {
		c.MaxRequest = DefaultMaxRequest(c.MaxKey, c.MaxValue)
	}
	if c.QuadGrowthLog == 0 {
		c.QuadGrowthLog = DefaultQuadGrowthLog
	}
	if c.MigrateStep == 0 {
		c.MigrateStep = DefaultMigrateStep
	}
	if c.Inc == 0 {
		c.Inc = uint64(time.Now().UnixNano())
	}
	if c.Clock == nil {
		c.Clock = func() int64 { return time.Now().UnixNano() }
	}
	switch {
	case c.SlotMap != nil && len(c.SlotMap) != NumHashSlots:
		return fmt.Errorf("kv: slot map has %d slots, want %d", len(c.SlotMap), NumHashSlots)
	case c.MaxKey < 1 || c.MaxValue < 0:
		return fmt.Errorf("kv: MaxKey %d, MaxValue %d", c.MaxKey, c.MaxValue)
	case c.LogBuckets < 2 || c.LogBuckets > 30:
		return fmt.Errorf("kv: LogBuckets %d out of 2..30", c.LogBuckets)
	case c.HeapRegionSize > 1<<36:
		return fmt.Errorf("kv: HeapRegionSize %d above 64 GiB (a slot addresses 2^32 16-byte units)", c.HeapRegionSize)
	case c.HeapRegionSize%recAlign != 0 || classOf(recordSize(c.MaxKey, c.MaxValue)) > c.HeapRegionSize:
		return fmt.Errorf("kv: HeapRegionSize %d cannot hold a record of MaxKey %d + MaxValue %d bytes", c.HeapRegionSize, c.MaxKey, c.MaxValue)
	case c.MaxLoad <= 0 || c.MaxLoad > 0.95:
		return fmt.Errorf("kv: MaxLoad %v out of (0, 0.95]", c.MaxLoad)
	}
	return nil
}

// gen is one generation of the index.
type gen struct {
	n      int // generation number
	log    int
	region rdma.Region
	mem    []byte
}

func (g *gen) buckets() int { return 1 << g.log }

// index is the generation's buckets.
func (g *gen) index() []byte { return g.mem[:g.buckets()*bucketSize] }

// Table is one replica's hash table in registered memory: the state
// machine (broadcast.FSM) a group's replicas apply delivered requests to,
// and the memory clients read one-sided.
type Table struct {
	cfg    TableConfig
	node   rdma.Node
	hdr    rdma.Region
	hmem   []byte
	cur    gen
	old    *gen // while migrating
	cursor int  // old buckets migrated so far
	retire *gen // the generation before old, closed at the next growth
	heap   heap
	count  int // live records
	// liveBytes is the size of the live records (recordSize each): a
	// capture's size without a walk of the index (Snapshot).
	liveBytes int
	layout    uint64

	applied   uint64
	appliedAt int64
	serving   uint64
	// catchingUp: the member cannot vote until a leader's diff catches it
	// up (SetCatchingUp); published in the header's geometry word.
	catchingUp bool
	// batching: between BeginBatch and EndBatch (a batch entry of
	// multicast); pubGeo: the geometry last published.
	batching bool
	pubGeo   Geometry

	// replaying: NewReplica's broadcast.New replays the log into the
	// table (nothing polls the replica yet). A growth then migrates the
	// whole old generation at once (startGrowth) instead of bucket by
	// bucket beside the applies, and asks for no pre-faulted spare until
	// the replay ends (endReplay): issue 19, a 1 M-record log's replay
	// spent a third of its CPU time in the incremental migration (the
	// per-key checks of old buckets, migrateKey, among it) and made a
	// spare of every intermediate size.
	replaying bool

	knobs    testingKnobs // planted bugs, tests only (knobs.go)
	mres     []byte
	restores int
	// snapMaxNs: the longest Snapshot call (Stats.SnapshotMaxNs);
	// snapWork: every call's time (SnapshotWork).
	snapMaxNs int64
	snapWork  SnapshotWork
	// slotWalks counts eachSlot's walks of the index (tests: a capture
	// walks none on the polling goroutine).
	slotWalks int
	// yield, if set, is called between the stores readers rely on the
	// order of (the simulator's Env.Yield, which may land one-sided reads
	// there); nil in production.
	yield func()

	snaps atomic.Int32 // captures not yet released
	// spare is the index copy of a released capture, or a buffer
	// pre-faulted off the polling goroutine (PrefaultSpare), which the
	// next capture reuses if it is large enough: its pages are mapped
	// already (a fresh buffer's page faults were most of a first
	// capture's time: issue 19). Of two offered, the larger stays
	// (offerSpare): one index-sized buffer per table besides those of
	// captures alive.
	spare atomic.Pointer[[]byte]
	// spareWant is the size of the spare last asked of the pre-fault
	// goroutine (only the polling goroutine raises it, ensureSpare);
	// prefaulting says the goroutine runs, prefaultWG lets Close wait
	// for it, spareFaults counts the spares it made.
	spareWant   atomic.Int64
	prefaulting atomic.Bool
	// spareMaking: the goroutine is making a spare now (past
	// SpareAfter), of spareMaking bytes (0: none).
	spareMaking atomic.Int64
	prefaultWG  sync.WaitGroup
	spareFaults atomic.Int64
	// closing is closed by Close, before it waits for the pre-fault
	// goroutine (one held by SpareAfter then makes no spare).
	closing   chan struct{}
	closeOnce sync.Once
	// walks counts the captures' Persist walks under way (any
	// goroutine); Close waits for them and refuses later ones
	// (beginWalk), as they read the memory it unmaps.
	walks struct {
		mu      sync.Mutex
		idle    sync.Cond // signalled when n drops to 0 (L: mu)
		n       int
		closed  bool
		waiting bool // Close waits: the last walk to end signals idle
	}
	// freshCopies counts the captures that copied the index into a fresh
	// buffer, faulting its pages in on the polling goroutine.
	freshCopies int

	heapEpoch atomic.Uint64 // counts restores: a capture that saw it change is void
	stages    map[uint32][]*stage
	ops       []Op
	mops      []Op   // resolveMerges' scratch ops
	mbuf      []byte // and merged values
	res       [resSize]byte
	keyb      []byte
	finds     uint64 // index lookups (find), for tests
	// Prefetching a batch (prefetch.go): prePay, the payloads Prefetch
	// kept for BeginBatch; batchTouched, BeginBatch touched them; pre,
	// the hashes of the keys to touch; preOff, touch's addresses; sink,
	// the sum of the bytes touch loaded, kept so that the loads are not
	// dropped; touched and batchTouches, the keys and the batches
	// touched (tests).
	prePay       [][]byte
	batchTouched bool
	pre          []uint64
	preOff       []int
	sink         uint64
	touched      uint64
	batchTouches uint64
}

// Node is the node the table's regions are registered on.
func (t *Table) Node() rdma.Node { return t.node }

// NewTable registers the table's regions on node.
func NewTable(cfg TableConfig, node rdma.Node) (*Table, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	t := &Table{cfg: cfg, node: node, stages: map[uint32][]*stage{}, closing: make(chan struct{})}
	t.heap = heap{node: node, group: cfg.Group, size: cfg.HeapRegionSize, grant: t.grant,
		lookahead: cfg.PrefaultHeap, knobs: &t.knobs}
	var err error
	if t.hdr, err = node.Register(headerRegion(cfg.Group), hdrSize); err != nil {
		return nil, fmt.Errorf("kv: register header: %w", err)
	}
	t.hmem = t.hdr.Bytes()
	if err := t.grant(t.hdr); err != nil {
		t.Close()
		return nil, err
	}
	if t.cur, err = t.newGen(0, cfg.LogBuckets); err != nil {
		t.Close()
		return nil, err
	}
	t.publish()
	t.ensureSpare()
	return t, nil
}

func (t *Table) grant(r rdma.Region) error {
	for _, p := range t.cfg.Readers {
		if p == t.node.ID() {
			continue
		}
		if err := r.Grant(p, rdma.PermRead); err != nil {
			return fmt.Errorf("kv: grant node %d: %w", p, err)
		}
	}
	return nil
}

func (t *Table) newGen(n, log int) (gen, error) {
	r, err := t.node.Register(indexRegion(t.cfg.Group, n), bucketSize<<log)
	if err != nil {
		return gen{}, fmt.Errorf("kv: register index generation %d: %w", n, err)
	}
	if err := t.grant(r); err != nil {
		r.Close()
		return gen{}, err
	}
	return gen{n: n, log: log, region: r, mem: r.Bytes()}, nil
}

// Close releases every region.
func (t *Table) Close() error {
	t.closeOnce.Do(func() { close(t.closing) })
	t.prefaultWG.Wait()
	t.heap.stopFaulter() // before the regions it touches are unmapped
	t.closeWalks()
	if t.hdr != nil {
		t.hdr.Close()
	}
	for _, g := range []*gen{&t.cur, t.old, t.retire} {
		if g != nil && g.region != nil {
			g.region.Close()
		}
	}
	t.heap.close()
	return nil
}

// closeWalks waits for the captures' Persist walks under way (they run
// off the polling goroutine, and read the heap and index regions Close
// unmaps) and makes later ones refuse: a capture outlives the replica's
// Close if broadcast left its writer running, or if the writer waited
// for a PersistGate token (the SIGSEGV in capture.Persist of d54cd8d).
func (t *Table) closeWalks() {
	w := &t.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if t.knobs.closeNoWait {
		return // planted: the walks under way read unmapped memory
	}
	if h := t.knobs.onCloseWait; h != nil {
		h(w.n)
	}
	if w.idle.L == nil {
		w.idle.L = &w.mu
	}
	for w.n > 0 {
		w.waiting = true
		w.idle.Wait()
	}
}

// beginWalk counts a Persist walk about to read the table's memory, or
// reports that the table is closed (its memory unmapped).
func (t *Table) beginWalk() error {
	w := &t.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed && !t.knobs.walkAfterClose {
		return ErrTableClosed
	}
	w.n++
	return nil
}

// endWalk ends a walk beginWalk counted.
func (t *Table) endWalk() {
	w := &t.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n--; w.n == 0 && w.waiting {
		w.idle.Broadcast()
	}
}

// Promise records this member's E_new in the header (wire it to
// broadcast.Config.OnPromise): a single word, stored before the member
// publishes its vote.
func (t *Table) Promise(e broadcast.Epoch) {
	if t.knobs.latePromise {
		t.knobs.promise, t.knobs.promiseAt = uint64(e), t.cfg.Clock() // published 6 ms later: too late
		return
	}
	rdma.Store64(t.hmem, hPromise, uint64(e))
}

// SetServing says which epoch this replica leads with its diff applied (0:
// none); linearizable gets are served only by a replica whose header says
// so. Called from the polling goroutine after each Poll.
func (t *Table) SetServing(e uint64) {
	if t.knobs.latePromise && t.knobs.promise != 0 && t.cfg.Clock()-t.knobs.promiseAt > int64(6*time.Millisecond) {
		rdma.Store64(t.hmem, hPromise, t.knobs.promise)
	}
	if t.knobs.noQuorum && e != 0 {
		t.knobs.lastServed = e
	}
	if e != t.serving {
		t.serving = e
		t.publish()
	}
}

// SetCatchingUp says whether the member is catching up (restarted
// without its data: it cannot vote until a leader's diff catches it up,
// broadcast Status.CatchingUp). The header is published at once when that
// changes, not only with the next applied entry: a catching-up member may
// apply nothing for a long time, and clients read the flag to tell a group
// that cannot elect a leader from one whose election is under way.
// Polling goroutine.
func (t *Table) SetCatchingUp(c bool) {
	if c != t.catchingUp {
		t.catchingUp = c
		if !t.knobs.lateCatchUp {
			t.publish()
		}
	}
}

// Header returns the header as this replica last published it.
func (t *Table) Header() Header {
	h, _ := DecodeHeader(t.hmem)
	h.Promise = rdma.Load64(t.hmem, hPromise)
	return h
}

// Len is the number of live records.
func (t *Table) Len() int { return t.count }

// Stats is what the table uses.
type Stats struct {
	Records      int
	HeapBytes    int // bytes of live records (allocation classes)
	HeapRegions  int
	IndexBytes   int // every registered index generation
	Gen          int
	LogBuckets   int
	Migrating    bool
	FreeListRefs int
	Restores     int // snapshots restored into this table
	// SnapshotMaxNs is the longest Snapshot call (a capture, on the
	// polling goroutine), by TableConfig.Clock, since the table was made.
	SnapshotMaxNs int64
	// FreshIndexCopies counts the captures that copied the index into
	// a fresh buffer (its page faults on the polling goroutine);
	// SparePrefaults the spares pre-faulted off it (PrefaultSpare).
	FreshIndexCopies int
	SparePrefaults   int
	// HeapPrefaults: the heap's pages faulted in off the polling
	// goroutine (PrefaultHeap).
	HeapPrefaults HeapPrefaults
	// Ordered is the ordered part's size and work (nil: none).
	Ordered *btree.StoreStats `json:",omitempty"`
}

// Stats reports the table's size (polling goroutine).
func (t *Table) Stats() Stats {
	s := Stats{Records: t.count, HeapBytes: t.heap.used, HeapRegions: len(t.heap.regions),
		IndexBytes: len(t.cur.mem), Gen: t.cur.n, LogBuckets: t.cur.log, Migrating: t.old != nil, Restores: t.restores,
		SnapshotMaxNs: t.snapMaxNs, FreshIndexCopies: t.freshCopies, SparePrefaults: int(t.spareFaults.Load()),
		HeapPrefaults: t.heap.prefaults(), Ordered: t.orderedStats()}
	if t.old != nil {
		s.IndexBytes += len(t.old.mem)
	}
	t.heap.free.each(func(_ int, l []uint64) { s.FreeListRefs += len(l) })
	return s
}

func (t *Table) geometry() Geometry {
	g := Geometry{Gen: t.cur.n, LogBuckets: t.cur.log}
	if t.old != nil {
		g.Migrating, g.OldGen, g.OldLog = true, t.old.n, t.old.log
	}
	return g
}

// publish writes the header's sealed words in one store sequence; readers
// validate the check word.
func (t *Table) publish() {
	var b [hdrSize]byte
	h := Header{Serving: t.serving, Applied: t.applied, AppliedAt: t.appliedAt, Geometry: t.geometry(), Inc: t.cfg.Inc, Layout: t.layout, CatchingUp: t.catchingUp}
	encodeHeader(b[:], &h)
	t.pubGeo = h.Geometry
	// The check word last: a reader that sees it sees the words it
	// covers (stores are ordered), or a mismatch.
	rdma.Store64(t.hmem, hCheck, 0)
	t.yieldPoint()
	for off := hServing; off < hCheck; off += 8 {
		rdma.Store64(t.hmem, off, binary.LittleEndian.Uint64(b[off:]))
	}
	t.yieldPoint()
	rdma.Store64(t.hmem, hCheck, binary.LittleEndian.Uint64(b[hCheck:]))
	t.yieldPoint()
}

// requestDone publishes the header at the end of a request. Inside a
// batch (BeginBatch) it leaves that to EndBatch when the request changed
// nothing a reader acts on: the layout is even and the geometry is the
// one published, so only Applied and AppliedAt moved, and a header that
// says less is applied is still true (a stale-ok get reports an older
// index than the state it read: docs/kv.md, "Batched apply"). A request of
// several ops publishes both ends itself (applyRequest), a growth or a
// finished migration is published at the end of the request that made
// it, as outside a batch.
func (t *Table) requestDone() {
	if t.batching && t.layout&1 == 0 && t.geometry() == t.pubGeo {
		return
	}
	t.publish()
}

// BeginBatch implements multicast.BatchFSM: the requests applied until
// EndBatch come from one log entry, and their header publication is
// merged into one at EndBatch where that is safe (requestDone).
// The records of the keys Prefetch found are touched here, in one pass
// (prefetch.go).
func (t *Table) BeginBatch() {
	t.batching = true
	// One clock read for the batch's messages (the entry's AppliedAt is
	// then its start: an Item's Age errs on the old side), not one a
	// message (time.Now was ~2% of the replicas' CPU at 64 writers).
	t.appliedAt = t.cfg.Clock()
	t.batchTouched = t.touchBatch()
}

// EndBatch implements multicast.BatchFSM: it publishes the header once
// for the batch. multicast sends the batch's replies only after it, so a
// client that got a reply reads a header that includes its write.
func (t *Table) EndBatch() {
	t.batching, t.batchTouched = false, false
	if t.cfg.Ordered != nil && !t.knobs.skipOrderedPublish {
		t.cfg.Ordered.Publish(t.applied)
	}
	t.publish()
}

// yieldPoint lets a reader see the stores made so far (tests only).
func (t *Table) yieldPoint() {
	if t.yield != nil {
		t.yield()
	}
}

// owns reports whether the key with hash h is this group's.
func (t *Table) owns(h uint64) bool {
	return t.cfg.SlotMap == nil || t.cfg.SlotMap[hashSlotOf(h)] == t.cfg.Group
}

// where is a key's place in the current generation.
type where struct {
	bucket int // byte offset of the bucket in cur.mem
	slot   int
	s      Slot
}

// find looks key up in the current generation (its old buckets migrated
// already). The polling goroutine is the only writer of the index, so it
// reads its own words without atomics; a slot's fingerprint byte is
// compared first.
func (t *Table) find(key []byte, h uint64) (where, bool) {
	t.finds++
	fp := fpOf(h)
	mem := t.cur.mem
	for _, b := range places(h, t.cur.log) {
		off := b * bucketSize
		for i := range slotsPer {
			so := off + bucketHdr + i*slotSize
			if mem[so+8] != fp {
				continue
			}
			s := slotOf(binary.LittleEndian.Uint64(mem[so:]), binary.LittleEndian.Uint64(mem[so+8:]))
			if s.Version != 0 && bytes.Equal(t.recordKey(s), key) {
				return where{bucket: off, slot: i, s: s}, true
			}
		}
	}
	return where{}, false
}

func (t *Table) slotAt(mem []byte, bucketOff, i int) Slot {
	off := bucketOff + bucketHdr + i*slotSize
	return slotOf(rdma.Load64(mem, off), rdma.Load64(mem, off+8))
}

// record returns the record a slot of this table points to (local memory).
func (t *Table) record(s Slot) []byte {
	b := t.heap.mems[s.Heap][s.Off:]
	ri := recordInfo(b)
	return b[:ri.Size()]
}

func (t *Table) recordKey(s Slot) []byte {
	b := t.heap.mems[s.Heap][s.Off:]
	ri := recordInfo(b)
	return b[recHdr : recHdr+ri.KLen]
}

func (t *Table) recordValue(s Slot) []byte {
	b := t.heap.mems[s.Heap][s.Off:]
	ri := recordInfo(b)
	return b[recHdr+ri.KLen : recHdr+ri.KLen+ri.VLen]
}

// freeSlot places a new slot in the less loaded of the key's candidate
// buckets of g, or if both are full in the less loaded of their
// neighbours; ok is false when all four are full.
func freeSlot(g *gen, h uint64) (bucket, slot int, ok bool) {
	p := places(h, g.log)
	for k := 0; k < 4; k += 2 {
		b := p[k]
		if bucketLoad(g, p[k+1]) < bucketLoad(g, b) {
			b = p[k+1]
		}
		off := b * bucketSize
		for i := range slotsPer {
			if binary.LittleEndian.Uint64(g.mem[off+bucketHdr+i*slotSize:]) == 0 {
				return off, i, true
			}
		}
	}
	return 0, 0, false
}

func bucketLoad(g *gen, b int) int {
	n := 0
	off := b*bucketSize + bucketHdr
	for i := range slotsPer {
		if binary.LittleEndian.Uint64(g.mem[off+i*slotSize:]) != 0 {
			n++
		}
	}
	return n
}

// ErrTableFull is returned (as a failed apply, which stops the replica's
// group from making progress on that request) only if the heap regions are
// exhausted.
var ErrTableFull = errors.New("kv: table full")

// ErrTableClosed: a capture's Persist started after its table's Close
// (the memory it would read is unmapped).
var ErrTableClosed = errors.New("kv: the table was closed before the snapshot was written")

// Apply applies a delivered request (broadcast.FSM): the operations on
// this group's keys, atomically (every condition is checked first).
func (t *Table) Apply(e broadcast.Entry) []byte {
	t.applied = e.Index
	if !t.batching {
		t.appliedAt = t.cfg.Clock()
	} // in a batch BeginBatch read the clock once for its messages
	if t.snaps.Load() == 0 && len(t.heap.deferred) > 0 {
		t.heap.undefer()
	}
	if len(e.Data) > 0 {
		switch e.Data[0] {
		case partFormat, commitFormat:
			return t.applyStaged(e.Index, e.Data)
		case multiFormat:
			return t.applyMulti(e.Index, e.Data)
		case OrderedFormat:
			return t.applyOrdered(e.Index, e.Data)
		case backupFormat:
			return t.applyBackup(e.Index, e.Data)
		}
	}
	return t.applyRequest(e.Index, e.Data)
}

// applyMulti applies a multi request's independent ops, each as a request
// of one op at version index<<16 | its position.
func (t *Table) applyMulti(index uint64, data []byte) []byte {
	ops, err := decodeOps(data, multiFormat, t.ops)
	t.ops = ops[:0]
	if err != nil || len(ops) > MaxMulti {
		res := Result{Status: StatusMalformed}
		if err == nil {
			res = refused(LimitMulti, MaxMulti, MaxMulti, len(ops))
		}
		t.requestDone()
		return encodeResult(t.res[:], &res)
	}
	if !t.batchTouched && len(ops) > 1 {
		// A batch of several messages touched them all at BeginBatch
		// (prefetch.go).
		t.prefetchOps(ops)
	}
	out := append(t.mres[:0], StatusOK, 0, byte(len(ops)), byte(len(ops)>>8), 0, 0, 0, 0)
	for i := range ops {
		r := t.applyOps(index, ops[i:i+1], i)
		out = append(out, encodeResult(t.res[:], &r)...)
	}
	t.mres = out
	t.step()
	t.maybeGrow()
	t.requestDone()
	return out
}

// applyRequest applies a whole request delivered as entry index.
func (t *Table) applyRequest(index uint64, data []byte) []byte {
	if len(data) > t.cfg.MaxRequest {
		// Every replica of every group the request went to refuses it
		// (a client with looser limits than the replicas gets here).
		res := refused(LimitRequest, 0, t.cfg.MaxRequest, len(data))
		t.requestDone()
		return encodeResult(t.res[:], &res)
	}
	ops, err := DecodeRequest(data, t.ops)
	t.ops = ops[:0]
	var res Result
	multi := false
	if err != nil {
		// A malformed request changes nothing; clients encode with
		// AppendRequest, so only a foreign writer gets here.
		res.Status = StatusMalformed
	} else {
		// A request of several ops is atomic for readers too: the layout
		// counter is odd while its slots are written, and a reader whose
		// two header reads do not show one even layout reads again
		// (docs/kv.md, "Batches within a group").
		multi = len(ops) > 1
		if multi {
			t.layout |= 1
			t.publish()
		}
		res = t.applyOps(index, ops, 0)
		if multi {
			t.layout++
		}
		t.step()
		t.maybeGrow()
	}
	if multi {
		t.publish() // its even layout, at once also in a batch
	} else {
		t.requestDone()
	}
	return encodeResult(t.res[:], &res)
}

// applyOps applies ops (those on this group's keys) atomically: every
// condition is checked first. Op i gets version index<<16 | (base+i).
//
// A request breaking a limit (a key or value longer than this replica's
// MaxKey or MaxValue) is refused whole, nothing applied, with a result
// naming the limit: the check covers every op of the request, not only
// this group's, so every group of a batch refuses it alike and none
// applies its share. So is a request whose records the heap cannot hold.
func (t *Table) applyOps(index uint64, ops []Op, base int) Result {
	if hasMerge(ops) {
		var r Result
		var ok bool
		if ops, r, ok = t.resolveMerges(ops); !ok {
			return r
		}
	}
	if r, ok := t.checkLimits(ops); !ok {
		return r
	}
	if !t.heapFits(ops) {
		return refused(LimitHeap, 0, maxHeaps*t.heap.size, t.heap.used)
	}
	res := Result{}
	// Migrate every owned key's old buckets, then check the conditions.
	// A request of one op (every op of a multi request is one) keeps its
	// key's hash and place for the write below: nothing between the two
	// loops changes the index then, so it hashes and looks up once.
	first := true
	var oneH uint64
	var oneW where
	oneFound, oneKept := false, false
	for i := range ops {
		op := &ops[i]
		h := hashKey(op.Key)
		if !t.owns(h) {
			continue
		}
		t.migrateKey(h)
		w, found := t.find(op.Key, h)
		if len(ops) == 1 {
			oneH, oneW, oneFound, oneKept = h, w, found, true
		}
		if first {
			first = false
			if found {
				res.Prev = w.s.Version
			}
		}
		if !t.holds(op, w, found) {
			res.Status = StatusCondFailed
			res.FailedOp = i
			return res
		}
	}
	deferring := t.snaps.Load() > 0
	for i := range ops {
		op := &ops[i]
		var h uint64
		var w where
		var found bool
		if oneKept {
			h, w, found = oneH, oneW, oneFound
		} else {
			h = hashKey(op.Key)
			if !t.owns(h) {
				continue
			}
		}
		version := index<<16 | uint64(base+i)
		if res.Count == 0 {
			res.Version = version
		}
		res.Count++
		if !oneKept {
			// An earlier op of this request may have started a new
			// generation (a put that found its key's buckets full):
			// migrate this key's buckets again before looking it up.
			if !t.knobs.noRemigrate {
				t.migrateKey(h)
			}
			w, found = t.find(op.Key, h)
		}
		switch op.Kind {
		case OpDelete:
			if found {
				clearSlot(t.cur.mem, w.bucket, w.slot)
				t.yieldPoint()
				size := w.s.sizeHint(t)
				t.heap.release(t.sref(w.s), size, deferring)
				t.count--
				t.liveBytes -= size
			}
		case OpPut:
			if err := t.put(op.Key, op.Value, h, version, w, found, deferring); err != nil {
				// heapFits placed the records and registered their
				// regions, so only registering a new index generation
				// failed (the node's memory). A request of one op is
				// refused; in a larger one the ops before stay applied
				// and this one is not counted.
				res.Count--
				if len(ops) == 1 {
					return refused(LimitHeap, 0, maxHeaps*t.heap.size, t.heap.used)
				}
			}
		}
	}
	return res
}

func hasMerge(ops []Op) bool {
	for i := range ops {
		if ops[i].Kind == OpMerge {
			return true
		}
	}
	return false
}

// resolveMerges returns ops with each merge on this group's keys turned
// into the put of its merged value (the key's value as the request's
// earlier ops leave it, with the merge's fields set; the merge's fields
// alone if the key is absent then), in a scratch copy: the rest of the
// apply (limits, heap, conditions, versions) treats it as a put. Merges
// on other groups' keys stay as they are (checkLimits checks their
// fields' size). ok is false, with the result, if a merge's key holds a
// value that is not a fielded value (StatusCondFailed naming the merge;
// nothing is applied). Deterministic: every replica has the same values
// and merges in name order (fielded.Merge).
func (t *Table) resolveMerges(ops []Op) ([]Op, Result, bool) {
	out := append(t.mops[:0], ops...)
	t.mops = out[:0]
	buf := t.mbuf[:0]
	for i := range out {
		op := &out[i]
		if op.Kind != OpMerge {
			continue
		}
		h := hashKey(op.Key)
		if !t.owns(h) {
			continue
		}
		// The key's value before this op: the last earlier op on the
		// key (merges before are puts by now), else the table's.
		var cur []byte
		found, prev := false, uint64(0)
		earlier := false
		for j := i - 1; j >= 0; j-- {
			if bytes.Equal(out[j].Key, op.Key) {
				earlier = true
				found = out[j].Kind == OpPut
				cur = out[j].Value
				break
			}
		}
		if !earlier {
			t.migrateKey(h)
			var w where
			if w, found = t.find(op.Key, h); found {
				cur, prev = t.recordValue(w.s), w.s.Version
			}
		}
		var merged []byte
		if !found {
			merged = op.Value
		} else {
			start := len(buf)
			var err error
			if t.knobs.mergeReplaces {
				buf, err = append(buf, op.Value...), fielded.Valid(cur)
			} else {
				buf, err = fielded.Merge(buf, cur, op.Value)
			}
			if err != nil {
				t.mbuf = buf
				r := Result{Status: StatusCondFailed, FailedOp: i}
				if i == 0 {
					r.Prev = prev
				}
				return ops, r, false
			}
			merged = buf[start:len(buf):len(buf)]
		}
		op.Kind, op.Value = OpPut, merged
	}
	t.mbuf = buf
	return out, Result{}, true
}

// checkLimits checks every op of a request (this group's and the others')
// against the key and value limits: ok, or the refusal naming the first op
// breaking one.
func (t *Table) checkLimits(ops []Op) (Result, bool) {
	for i := range ops {
		switch op := &ops[i]; {
		case len(op.Key) > t.cfg.MaxKey:
			return refused(LimitKey, i, t.cfg.MaxKey, len(op.Key)), false
		case len(op.Value) > t.cfg.MaxValue:
			return refused(LimitValue, i, t.cfg.MaxValue, len(op.Value)), false
		}
	}
	return Result{}, true
}

// heapFits reports whether the heap can hold the records of the request's
// puts on this group's keys (counting none of the frees the request
// would make), and registers the heap regions they need: a region that
// cannot be registered refuses the request before anything is applied.
func (t *Table) heapFits(ops []Op) bool {
	hp := &t.heap
	need := 0 // every put's, this group's or not: no hashing here
	for i := range ops {
		if op := &ops[i]; op.Kind == OpPut {
			need += classOf(recordSize(len(op.Key), len(op.Value)))
		}
	}
	if need == 0 || len(hp.regions) > 0 && hp.bump+need <= hp.size {
		return true // the bump pointer's region holds them all
	}
	// Allocate as heap.alloc would, on paper.
	taken := map[int]int{}
	cur, bump, n := hp.cur, hp.bump, len(hp.regions)
	for i := range ops {
		op := &ops[i]
		if op.Kind != OpPut || !t.owns(hashKey(op.Key)) {
			continue
		}
		c := classOf(recordSize(len(op.Key), len(op.Value)))
		if taken[c] < len(hp.free.list(c)) {
			taken[c]++
			continue
		}
		if n == 0 || bump+c > hp.size {
			switch {
			case n > 0 && cur+1 < n:
				cur++
			case n == maxHeaps:
				return false
			default:
				n++
				cur = n - 1
			}
			bump = 0
		}
		bump += c
	}
	return hp.ensure(n) == nil
}

func (s Slot) sizeHint(t *Table) int { return recordInfo(t.heap.mems[s.Heap][s.Off:]).Size() }

func (t *Table) sref(s Slot) uint64 { return refOf(int(s.Heap), int(s.Off)) }

// holds checks op's condition against the key's current state.
func (t *Table) holds(op *Op, w where, found bool) bool {
	if t.knobs.noCondition {
		return true
	}
	switch op.Cmp {
	case CmpVersion:
		if op.CmpVersion == 0 {
			return !found
		}
		return found && w.s.Version == op.CmpVersion
	case CmpValue:
		if op.CmpVersion == 1 {
			return !found
		}
		return found && bytes.Equal(t.recordValue(w.s), op.CmpValue)
	case CmpExists:
		return found
	}
	return true
}

func (t *Table) put(key, value []byte, h, version uint64, w where, found, deferring bool) error {
	size := recordSize(len(key), len(value))
	ref, err := t.heap.alloc(size)
	if err != nil {
		return err
	}
	encodeRecord(t.heap.bytes(ref, size), version, key, value)
	t.yieldPoint() // the record, before a slot points to it
	s := Slot{Version: version, FP: fpOf(h), Units: unitsOf(size), Heap: uint8(refHeap(ref)), Off: uint64(refOff(ref))}
	if found {
		old := w.s
		storeSlot(t.cur.mem, w.bucket, w.slot, s)
		t.yieldPoint()
		osize := old.sizeHint(t)
		t.heap.release(t.sref(old), osize, deferring)
		if !t.knobs.staleLiveBytes {
			t.liveBytes -= osize
		}
		t.liveBytes += size
		return nil
	}
	b, i, ok := freeSlot(&t.cur, h)
	for !ok {
		// Both candidates are full: grow now (finishing any migration
		// first) and place the key in the new generation.
		t.finishMigration()
		if err := t.startGrowth(); err != nil {
			t.heap.release(ref, size, false)
			return err
		}
		t.migrateKey(h)
		b, i, ok = freeSlot(&t.cur, h)
	}
	storeSlot(t.cur.mem, b, i, s)
	t.yieldPoint()
	t.count++
	t.liveBytes += size
	return nil
}

// maybeGrow starts a new generation once the load passes MaxLoad.
func (t *Table) maybeGrow() {
	if t.old != nil || float64(t.count) < t.cfg.MaxLoad*float64(t.cur.buckets()*slotsPer) {
		return
	}
	t.startGrowth()
}

// startGrowth makes a generation of four or two times the buckets
// current (growthLog); the old one is migrated bucket by bucket (step,
// migrateKey).
func (t *Table) startGrowth() error {
	if t.old != nil {
		t.finishMigration()
	}
	if t.cur.log >= 30 {
		return ErrTableFull
	}
	ng, err := t.newGen(t.cur.n+1, t.growthLog())
	if err != nil {
		return err
	}
	if t.retire != nil {
		t.heap.prefaultsDone() // it may still touch that generation
		t.retire.region.Close()
		t.retire = nil
	}
	// The migration and the inserts store into the new generation's
	// buckets at their keys' hashes, all over it from the start: its
	// pages are faulted in off the poller too (PrefaultHeap).
	if !t.knobs.genNotPrefaulted {
		t.heap.prefaultRange(ng.mem)
	}
	old := t.cur
	t.old = &old
	t.cur = ng
	t.cursor = 0
	t.layout += 2 // even: no request in progress (applyRequest)
	if t.replaying {
		// A replay: no reader waits for this generation's buckets, so
		// migrate them all now, in bucket order; the applies then find
		// no old generation to check (migrateKey, step).
		if t.knobs.replayDropsOld {
			t.endMigration() // planted: the old generation's keys left behind
		} else {
			t.finishMigration()
		}
		return nil
	}
	t.ensureSpare()
	return nil
}

// growthLog is the log of the buckets of the next generation: four times
// the current ones while that stays within QuadGrowthLog (and 2^30), else
// twice.
func (t *Table) growthLog() int {
	if l := t.cur.log + 2; l <= t.cfg.QuadGrowthLog && l <= 30 {
		return l
	}
	return t.cur.log + 1
}

// endReplay ends the log's replay (NewReplica, once broadcast.New
// returned): growth migrates bucket by bucket again, and the pre-fault
// goroutine makes a spare of the replayed index's size.
func (t *Table) endReplay() {
	t.replaying = false
	t.ensureSpare()
}

// step migrates the next MigrateStep old buckets.
func (t *Table) step() {
	if t.old == nil {
		return
	}
	for k := 0; k < t.cfg.MigrateStep && t.cursor < t.old.buckets(); k++ {
		t.migrateBucket(t.cursor)
		t.cursor++
	}
	if t.cursor == t.old.buckets() {
		t.endMigration()
	}
}

func (t *Table) finishMigration() {
	if t.old == nil {
		return
	}
	for ; t.cursor < t.old.buckets(); t.cursor++ {
		t.migrateBucket(t.cursor)
	}
	t.endMigration()
}

func (t *Table) endMigration() {
	// The old generation stays registered (readers with an older header
	// may still read it) until the next growth begins.
	t.retire = t.old
	t.old = nil
	t.layout += 2 // even: no request in progress (applyRequest)
}

// migrateKey migrates the old generation's candidate buckets of a key.
func (t *Table) migrateKey(h uint64) {
	if t.old == nil {
		return
	}
	for _, b := range places(h, t.old.log) {
		t.migrateBucket(b)
	}
}

// migrateBucket copies old bucket b's slots into the current generation
// and then marks it moved: its slots stay as they were, so a reader that
// read it before the mark saw the key's state as of then, and one that
// sees the mark finds the key in the new generation (read after it).
func (t *Table) migrateBucket(b int) {
	off := b * bucketSize
	if rdma.Load64(t.old.mem, off)&bMoved != 0 {
		return
	}
	if t.knobs.movedFirst {
		rdma.Store64(t.old.mem, off, bMoved) // too early: readers skip the bucket
		t.yieldPoint()
	}
	for i := range slotsPer {
		s := t.slotAt(t.old.mem, off, i)
		if s.Version == 0 {
			continue
		}
		h := hashKey(t.recordKey(s))
		nb, ni, ok := freeSlot(&t.cur, h)
		if !ok {
			// All four places full in a generation of at least twice
			// the buckets (growthLog), filled to at most MaxLoad/2: with
			// 28 slots per key this does not happen in practice;
			// stopping is better than losing the key.
			panic(fmt.Sprintf("kv: migration found both candidates of a key full in a generation of %d buckets", t.cur.buckets()))
		}
		storeSlot(t.cur.mem, nb, ni, s)
		t.yieldPoint()
	}
	rdma.Store64(t.old.mem, off, bMoved)
	t.yieldPoint()
}

// Snapshots (broadcast.FSM): Snapshot, on the polling goroutine, copies
// the index (its generations' memory: one memcpy, 128 bytes per 7 slots)
// and defers the reuse of record memory until the capture is released;
// Persist, off the polling goroutine, walks the copy and copies the
// records its slots point to, which stay untouched, into the snapshot
// region broadcast serves to members behind its log. The records are not
// copied in the leader's heap. The capture's size comes from liveBytes,
// kept by the applies: walking the index on the poller (and reading each
// record's header for its size) stalled it for tens to hundreds of
// milliseconds per capture (issue 19).
//
//	snapshot: [magic u64][count u64][log2 buckets u64][applied u64][records, each as in the heap]
//	          [staged u64] then per staged request:
//	          [client u32][0 u32][inc u64][stage u64][total u64][have u64][bytes, padded to 8]
//	          [ordered u64][the ordered part's section (btree/snapshot.go), padded to 8]
//
// ordered is the section's length (0: no ordered part). Its capture
// copies only the part's metadata on the polling goroutine; Persist walks
// the part's tree, whose writer keeps the nodes' images at capture for
// it (Ordered.CaptureSection, btree/capture.go). Version 2 added it; a version 1 snapshot
// (no ordered length: what a replica of the previous release serves during
// a rolling upgrade) restores as one with no ordered part.
const (
	snapMagic   = 0x6b7673_6e617032 // "kvsnap2"
	snapMagicV1 = 0x6b7673_6e617031 // "kvsnap1"
)

type capture struct {
	t *Table
	// cur and old: copies of the index generations' memory (old: nil, or
	// the generation being migrated from, with its moved bits), both in
	// buf (Table.spare's when it was large enough).
	cur, old []byte
	buf      []byte
	count    int // live records
	size     int
	applied  uint64
	log      int
	mems     [][]byte
	stages   []stage        // copies
	ordered  OrderedCapture // the ordered part's (nil: none)
	epoch    uint64         // Table.heapEpoch at capture
	done     atomic.Bool
	// persisted: Persist ran (once only: it hands buf on once it has
	// walked it).
	persisted atomic.Bool
}

// eachSlot calls f with the slot of every live record: those of the
// current generation and, while the index grows, those of the old
// generation's buckets not moved yet (polling goroutine).
func (t *Table) eachSlot(f func(Slot)) {
	var old []byte
	if t.old != nil {
		old = t.old.index()
	}
	t.slotWalks++
	walkSlots(t.cur.index(), old, f)
}

// walkSlots calls f with the slot of every live record of an index whose
// current generation's memory is cur and whose old generation's is old
// (nil when it does not grow): the table's, or a capture's copy of it.
func walkSlots(cur, old []byte, f func(Slot)) {
	walk := func(mem []byte, skipMoved bool) {
		for off := 0; off+bucketSize <= len(mem); off += bucketSize {
			if skipMoved && rdma.Load64(mem, off)&bMoved != 0 {
				continue
			}
			for i := range slotsPer {
				o := off + bucketHdr + i*slotSize
				if s := slotOf(rdma.Load64(mem, o), rdma.Load64(mem, o+8)); s.Version != 0 {
					f(s)
				}
			}
		}
	}
	if old != nil {
		walk(old, true)
	}
	walk(cur, false)
}

// SnapshotWork is the time Snapshot spent on the polling goroutine since
// the table was made (TableConfig.Clock, ns), in all and in its two parts
// that grow with the state: the copy of the index and the ordered part's
// capture.
type SnapshotWork struct {
	Total, Index, Ordered int64
}

// SnapshotWork returns the captures' time (polling goroutine).
func (t *Table) SnapshotWork() SnapshotWork { return t.snapWork }

// Snapshot captures the table's records (broadcast.FSM).
func (t *Table) Snapshot() (broadcast.FSMSnapshot, error) {
	start := t.cfg.Clock()
	defer func() {
		d := t.cfg.Clock() - start
		t.snapMaxNs = max(t.snapMaxNs, d)
		t.snapWork.Total += d
	}()
	c := &capture{t: t, count: t.count, size: 32 + t.liveBytes, applied: t.applied, log: t.cur.log,
		mems: append([][]byte(nil), t.heap.mems...), epoch: t.heapEpoch.Load()}
	cur, old := t.cur.index(), []byte(nil)
	if t.old != nil {
		old = t.old.index()
	}
	n := len(cur) + len(old)
	p := t.spare.Swap(nil)
	if t.knobs.shareSpare && p != nil {
		t.spare.Store(p) // planted: left for the next capture too
	}
	if p != nil && cap(*p) >= n {
		c.buf = (*p)[:n]
	} else {
		c.buf = make([]byte, n)
		t.freshCopies++
	}
	c.cur = c.buf[:copy(c.buf, cur)]
	if old != nil {
		c.old = c.buf[len(cur) : len(cur)+copy(c.buf[len(cur):], old)]
	}
	mid := t.cfg.Clock()
	t.snapWork.Index += mid - start
	clients := make([]uint32, 0, len(t.stages))
	for k := range t.stages {
		clients = append(clients, k)
	}
	slices.Sort(clients)
	c.size += 8
	for _, k := range clients {
		for _, st := range t.stages[k] {
			c.stages = append(c.stages, stage{id: st.id, buf: bytes.Clone(st.buf), have: st.have})
			c.size += 40 + pad8(len(st.buf))
		}
	}
	c.size += 8
	if t.cfg.Ordered != nil {
		o := t.cfg.Clock()
		c.ordered = t.cfg.Ordered.CaptureSection()
		t.snapWork.Ordered += t.cfg.Clock() - o
		c.size += pad8(c.ordered.Size())
	}
	t.snaps.Add(1)
	return c, nil
}

func (c *capture) Size() int { return c.size }

// Persist's walk runs beside the pollers on as few processors, and a
// poller made runnable while every processor runs a walk waits in Go's
// run queue until a walk yields, behind every walk queued before it
// (issue 19: no leader Poll over ET/20, 7.5 ms, while a snapshot is
// written). So the walk yields its processor once it has held it for
// persistSlice, reading the clock every persistCheck records. It used to
// yield every 4096 records: at 1 M records under load a record cost the
// walk 1.2-2.4 us of CPU (a cache miss or two on the heap, page faults of
// the fresh image it copies into), 5-10 ms between yields, and a poller
// queued behind three such walks waited longer than the bound.
const (
	persistSlice = 200 * time.Microsecond
	persistCheck = 32
)

// walkNow is the monotonic clock of Persist's yields (knobs.walkClock in
// tests).
func (t *Table) walkNow() time.Duration {
	if c := t.knobs.walkClock; c != nil {
		return c()
	}
	return rdma.Mono()
}

// walkYield yields the processor when the walk held it for persistSlice
// since last (every persistCheck records of recs) and returns the new
// start of its slice.
func (t *Table) walkYield(recs int, last time.Duration) time.Duration {
	if t.knobs.persistYieldCount {
		if recs%4096 == 4095 {
			t.yieldWalk(recs)
		}
		return last
	}
	if recs%persistCheck != persistCheck-1 {
		return last
	}
	if now := t.walkNow(); now-last < persistSlice {
		return last
	}
	t.yieldWalk(recs)
	return t.walkNow()
}

// yieldWalk lets runnable pollers go first (recs: the records walked
// before this one).
func (t *Table) yieldWalk(recs int) {
	if h := t.knobs.onWalkYield; h != nil {
		h(recs)
	}
	runtime.Gosched()
}

// orderedSize is the ordered section's length (0: none).
func (c *capture) orderedSize() int {
	if c.ordered == nil {
		return 0
	}
	return c.ordered.Size()
}

// tail is the size of what follows the records: the staged requests and
// the ordered section.
func (c *capture) tail() int {
	n := 8 + 8 + pad8(c.orderedSize())
	for _, st := range c.stages {
		n += 40 + pad8(len(st.buf))
	}
	return n
}

// Persist writes the snapshot at capture (any goroutine, once). Once it
// has walked the index copy it hands the buffer on to the next capture
// (Table.spare): a network snapshot's capture is released only when a
// newer one replaces it, and disk captures meanwhile would copy into
// fresh buffers, their page faults on the polling goroutine.
func (c *capture) Persist(dst []byte) error {
	if c.persisted.Swap(true) {
		return errors.New("kv: a capture persisted twice")
	}
	if len(dst) != c.size {
		return fmt.Errorf("kv: snapshot of %d bytes into %d", c.size, len(dst))
	}
	// The walk reads the table's heap (and the ordered part's
	// memory): Close waits for it, or it refuses after Close.
	if err := c.t.beginWalk(); err != nil {
		return err
	}
	defer c.t.endWalk()
	if h := c.t.knobs.onPersistWalk; h != nil {
		defer h()()
	}
	binary.LittleEndian.PutUint64(dst, snapMagic)
	binary.LittleEndian.PutUint64(dst[8:], uint64(c.count))
	binary.LittleEndian.PutUint64(dst[16:], uint64(c.log))
	binary.LittleEndian.PutUint64(dst[24:], c.applied)
	p, recs, end := 32, 0, c.size-c.tail()
	cur, old := c.cur, c.old
	if c.t.knobs.persistLive {
		cur, old = c.t.cur.index(), nil
		if c.t.old != nil {
			old = c.t.old.index()
		}
	}
	last := c.t.walkNow()
	walkSlots(cur, old, func(s Slot) {
		b := c.mems[s.Heap][s.Off:]
		size := recordInfo(b).Size()
		last = c.t.walkYield(recs, last)
		if recs++; p+size <= end {
			copy(dst[p:], b[:size])
		}
		p += size
	})
	c.handOn()
	if recs != c.count || p != end {
		// liveBytes or count disagrees with the index: never in a
		// correct table, and no snapshot rather than a wrong one.
		return fmt.Errorf("kv: the captured index holds %d records in %d bytes, the table counted %d in %d", recs, p-32, c.count, end-32)
	}
	binary.LittleEndian.PutUint64(dst[p:], uint64(len(c.stages)))
	p += 8
	for _, st := range c.stages {
		binary.LittleEndian.PutUint64(dst[p:], uint64(st.id.Client))
		binary.LittleEndian.PutUint64(dst[p+8:], st.id.Inc)
		binary.LittleEndian.PutUint64(dst[p+16:], st.id.Stage)
		binary.LittleEndian.PutUint64(dst[p+24:], uint64(len(st.buf)))
		binary.LittleEndian.PutUint64(dst[p+32:], uint64(st.have))
		p += 40
		n := copy(dst[p:], st.buf)
		clear(dst[p+n : p+pad8(n)])
		p += pad8(n)
	}
	n := c.orderedSize()
	binary.LittleEndian.PutUint64(dst[p:], uint64(n))
	p += 8
	if c.ordered != nil {
		if err := c.ordered.Persist(dst[p : p+n]); err != nil {
			return err
		}
	}
	clear(dst[p+n : p+pad8(n)])
	if c.t.heapEpoch.Load() != c.epoch {
		return errors.New("kv: the table was restored while the snapshot was being copied")
	}
	return nil
}

func (c *capture) Release() {
	if c.done.CompareAndSwap(false, true) {
		if c.ordered != nil {
			c.ordered.Release()
		}
		// The index copy is the next capture's, if Persist did not
		// hand it on (a capture is released after its Persist).
		c.handOn()
		c.t.snaps.Add(-1)
	}
}

// handOn offers the capture's index copy to the next capture (Persist
// walked it, or the capture is released), once.
func (c *capture) handOn() {
	if c.buf == nil {
		return
	}
	buf := c.buf
	c.cur, c.old = nil, nil
	if !c.t.knobs.handOnTwice {
		c.buf = nil
	}
	c.t.offerSpare(&buf)
}

// indexCopySize is the size of a capture's copy of the index now: the
// current generation's buckets and, while the index grows, the old one's.
func (t *Table) indexCopySize() int {
	n := len(t.cur.index())
	if t.old != nil {
		n += len(t.old.index())
	}
	return n
}

// offerSpare makes b the spare unless the spare is at least as large (any
// goroutine): a released capture's buffer and a pre-faulted one may be
// offered at once, and the larger serves more captures.
func (t *Table) offerSpare(b *[]byte) {
	for {
		old := t.spare.Load()
		if old != nil && cap(*old) >= cap(*b) && !t.knobs.spareKeepsLast {
			return
		}
		if t.spare.CompareAndSwap(old, b) {
			return
		}
	}
}

// SnapshotReady reports whether a capture now would not copy the index
// into a fresh buffer (polling goroutine; broadcast.Config.CaptureReady):
// false only while the pre-fault goroutine makes a spare that the copy
// needs (PrefaultSpare: the spare is smaller than the copy, and the one
// being made is large enough). A capture held back meanwhile costs the
// poller no page faults (a fresh copy took 32-35 ms of the polling
// thread's CPU at 500 k records: issue 19); the spare is made in
// bounded work (its size's page touches), so the hold ends. A spare
// waiting for SpareAfter is not being made: no hold then.
func (t *Table) SnapshotReady() bool {
	if !t.cfg.PrefaultSpare || t.knobs.readyIgnoresSpare {
		return true
	}
	n := int64(t.indexCopySize())
	if p := t.spare.Load(); p != nil && int64(cap(*p)) >= n {
		return true
	}
	return t.spareMaking.Load() < n
}

// ensureSpare asks the pre-fault goroutine for a spare as large as a
// capture's index copy now, unless one that large was asked for already
// (PrefaultSpare; polling goroutine: at NewTable, growth and Restore). It
// starts the goroutine if it does not run; a running one sees the new size
// before it ends (prefaultSpares).
func (t *Table) ensureSpare() {
	if !t.cfg.PrefaultSpare {
		return
	}
	n := int64(t.indexCopySize())
	if n <= t.spareWant.Load() {
		return
	}
	t.spareWant.Store(n)
	if t.prefaulting.CompareAndSwap(false, true) {
		after := t.cfg.SpareAfter
		if t.knobs.spareIgnoresAfter {
			after = nil
		}
		t.prefaultWG.Add(1)
		// The test hook is read here, on the caller's goroutine, not
		// in the pre-fault goroutine: tests set t.knobs after NewTable
		// (whose ensureSpare may have started one).
		go t.prefaultSpares(after, t.knobs.onSpareMaking)
	}
}

// prefaultSpares makes spares of spareWant's size, their pages touched,
// until it has made one of the last size asked; one goroutine at a time
// (prefaulting).
func (t *Table) prefaultSpares(after <-chan struct{}, onMaking func()) {
	defer t.prefaultWG.Done()
	if after != nil {
		select {
		case <-after:
		case <-t.closing:
			// Made none: a later ensureSpare does not start the
			// goroutine again (the table is closed).
			return
		}
	}
	made := int64(0)
	for {
		if n := t.spareWant.Load(); n > made {
			t.spareMaking.Store(n)
			if onMaking != nil {
				onMaking()
			}
			b := prefaulted(int(n), t.closing)
			if b == nil {
				t.spareMaking.Store(0)
				return // the table closes: Close waits for this goroutine
			}
			// Offered before the mark is cleared, so that SnapshotReady
			// sees either the spare or its making, never a gap between.
			t.offerSpare(&b)
			t.spareMaking.Store(0)
			t.spareFaults.Add(1)
			made = n
			continue
		}
		t.prefaulting.Store(false)
		// A size asked for between the check above and the store was
		// not seen by ensureSpare's start: take it on, unless a new
		// goroutine did.
		if t.spareWant.Load() <= made || !t.prefaulting.CompareAndSwap(false, true) {
			return
		}
	}
}

// prefaultYield is how many bytes prefaulted touches between two yields
// of its processor (as Persist's, it runs beside the pollers): 16 pages,
// 0.2-0.3 ms at 15-19 us a first touch (1 MiB held it for 4-5 ms).
const prefaultYield = 64 << 10

// prefaulted is a buffer of n bytes whose pages are all mapped: a store to
// each page faults it in here, not in a capture's copy on the polling
// goroutine. It gives up (nil) at a yield once stop is closed: a spare
// made late (SpareAfter) must not hold up the table's Close for the
// seconds it may take on a loaded machine.
func prefaulted(n int, stop <-chan struct{}) []byte {
	b := make([]byte, n)
	page := os.Getpagesize()
	for i := 0; i < n; i += page {
		b[i] = 0
		if i%prefaultYield == 0 && i > 0 {
			select {
			case <-stop:
				return nil
			default:
			}
			runtime.Gosched()
		}
	}
	return b
}

// ErrSnapshot is returned by Restore for bytes that are not a table
// snapshot.
var ErrSnapshot = errors.New("kv: corrupt snapshot")

// Restore replaces the table with a snapshot's records (broadcast.FSM).
// It validates the whole snapshot, places every record in a new index
// generation and registers the heap regions it needs before it changes
// anything: a Restore that fails leaves the table as it was.
func (t *Table) Restore(b []byte) error {
	if t.knobs.restoreKeeps {
		b = t.keepOld(b)
	}
	if len(b) < 32 || binary.LittleEndian.Uint64(b) != snapMagic && binary.LittleEndian.Uint64(b) != snapMagicV1 {
		return fmt.Errorf("%w: bad header", ErrSnapshot)
	}
	v1 := binary.LittleEndian.Uint64(b) == snapMagicV1
	count := binary.LittleEndian.Uint64(b[8:])
	applied := binary.LittleEndian.Uint64(b[24:])
	if lg := binary.LittleEndian.Uint64(b[16:]); lg < 2 || lg > 30 {
		// The writer's index size: checked, but the index is sized for
		// the records below.
		return fmt.Errorf("%w: 2^%d buckets", ErrSnapshot, lg)
	}
	if count > uint64(len(b))/(recHdr+8) {
		return fmt.Errorf("%w: %d records in %d bytes", ErrSnapshot, count, len(b))
	}
	recBuf := t.cfg.Scratch.Get(int(count) * int(unsafe.Sizeof(restoreRec{})))
	defer t.cfg.Scratch.Put(recBuf)
	recs := reuse.Slice[restoreRec](recBuf, int(count))[:0]
	// The heap the records will take, allocated as heap.alloc does from
	// a reset heap: bump allocation from region 0.
	hcur, hbump := 0, 0
	p := 32
	for range count {
		ri, key, val, err := DecodeRecord(b[p:])
		if err != nil {
			return fmt.Errorf("%w: record at byte %d: %v", ErrSnapshot, p, err)
		}
		n := ri.Size()
		switch {
		case n > len(b)-p:
			return fmt.Errorf("%w: record at byte %d overruns", ErrSnapshot, p)
		case ri.Version == 0:
			return fmt.Errorf("%w: record at byte %d has version 0", ErrSnapshot, p)
		case len(key) == 0 || len(key) > t.cfg.MaxKey || len(val) > t.cfg.MaxValue:
			return fmt.Errorf("%w: record at byte %d: a %d-byte key and a %d-byte value (limits %d and %d)", ErrSnapshot, p, len(key), len(val), t.cfg.MaxKey, t.cfg.MaxValue)
		}
		c := classOf(n)
		if hbump+c > t.heap.size {
			hcur, hbump = hcur+1, 0
		}
		if hcur >= maxHeaps {
			return fmt.Errorf("%w: the records do not fit %d heap regions of %d bytes", ErrSnapshot, maxHeaps, t.heap.size)
		}
		recs = append(recs, restoreRec{off: p, size: n, klen: ri.KLen, version: ri.Version, h: hashKey(key), ref: refOf(hcur, hbump)})
		hbump += c
		p += n
	}
	if len(b)-p < 8 {
		return fmt.Errorf("%w: no staged requests count", ErrSnapshot)
	}
	nst := binary.LittleEndian.Uint64(b[p:])
	p += 8
	if nst > uint64(len(b)-p)/40 {
		return fmt.Errorf("%w: %d staged requests", ErrSnapshot, nst)
	}
	stages := map[uint32][]*stage{}
	for range nst {
		if len(b)-p < 40 {
			return fmt.Errorf("%w: staged request at byte %d truncated", ErrSnapshot, p)
		}
		w := func(k int) uint64 { return binary.LittleEndian.Uint64(b[p+8*k:]) }
		client, total, have := w(0), w(3), w(4)
		if client > math.MaxUint32 || total > uint64(t.cfg.MaxRequest) || have > total || uint64(pad8(int(total))) > uint64(len(b)-p-40) {
			return fmt.Errorf("%w: staged request at byte %d", ErrSnapshot, p)
		}
		for _, x := range b[p+40+int(total) : p+40+pad8(int(total))] {
			if x != 0 {
				return fmt.Errorf("%w: staged request at byte %d: padding not zero", ErrSnapshot, p)
			}
		}
		st := &stage{id: StageID{Client: uint32(client), Inc: w(1), Stage: w(2)}, buf: bytes.Clone(b[p+40 : p+40+int(total)]), have: int(have)}
		l := stages[st.id.Client]
		if len(l) == MaxStages {
			return fmt.Errorf("%w: more than %d staged requests of client %d", ErrSnapshot, MaxStages, client)
		}
		for _, o := range l {
			if o.id == st.id {
				return fmt.Errorf("%w: staged request %+v twice", ErrSnapshot, st.id)
			}
		}
		stages[st.id.Client] = append(l, st)
		p += 40 + pad8(int(total))
	}
	if v1 && p != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", ErrSnapshot, len(b)-p)
	}
	if !v1 && len(b)-p < 8 {
		return fmt.Errorf("%w: no ordered section length", ErrSnapshot)
	}
	var olen uint64
	if !v1 {
		olen = binary.LittleEndian.Uint64(b[p:])
		p += 8
	}
	if olen > uint64(len(b)-p) || uint64(pad8(int(olen))) != uint64(len(b)-p) {
		return fmt.Errorf("%w: an ordered section of %d bytes in %d", ErrSnapshot, olen, len(b)-p)
	}
	var osec []byte
	if olen > 0 {
		osec = b[p : p+int(olen)]
		for _, x := range b[p+int(olen):] {
			if x != 0 {
				return fmt.Errorf("%w: ordered section padding not zero", ErrSnapshot)
			}
		}
	}
	p += pad8(int(olen))
	var commitOrdered func(uint64)
	switch {
	case t.cfg.Ordered != nil:
		var err error
		if commitOrdered, err = t.cfg.Ordered.Restore(osec); err != nil {
			return fmt.Errorf("%w: %w", ErrSnapshot, err)
		}
	case olen > 0:
		return fmt.Errorf("%w: an ordered section, and this table has no ordered part", ErrSnapshot)
	}
	// The index: sized for the records (the snapshot's own size is not
	// trusted), built in a generation readers do not see yet. A
	// placement that finds a key's four buckets full starts over with
	// twice the buckets.
	log := 2
	for log < 30 && float64(count) > t.cfg.MaxLoad/2*float64(int(slotsPer)<<log) {
		log++
	}
	var ng gen
	for {
		var err error
		if ng, err = t.newGen(t.cur.n+1, log); err != nil {
			return err
		}
		// Every bucket may take a slot: mapped at once (prefault).
		prefault.Populate(ng.mem)
		placed, err := placeRecords(&ng, b, recs, t.knobs.restoreDupUnchecked, t.cfg.Scratch)
		if err != nil {
			ng.region.Close()
			return err
		}
		if placed {
			break
		}
		ng.region.Close()
		if log++; log > 30 {
			return fmt.Errorf("%w: the keys do not fit an index of 2^30 buckets", ErrSnapshot)
		}
	}
	if err := t.heap.ensure(hcur + 1); err != nil {
		ng.region.Close()
		return err
	}
	// The heap the copy below writes, mapped at once (prefault: issue
	// 19, a page's first write was ~18 µs of CPU each on this project's
	// VMs). It changes no byte of the live records.
	for h := 0; h <= hcur; h++ {
		n := t.heap.size
		if h == hcur {
			n = hbump
		}
		prefault.Populate(t.heap.mems[h][:n])
	}
	// Nothing fails from here on. Captures still persisting would read
	// records the copy below overwrites: they fail (heapEpoch).
	t.heapEpoch.Add(1)
	t.heap.prefaultsDone() // before the generations it touches go
	for _, g := range []*gen{&t.cur, t.old, t.retire} {
		if g != nil && g.region != nil {
			g.region.Close()
		}
	}
	t.cur, t.old, t.retire = ng, nil, nil
	t.heap.reset()
	for _, r := range recs {
		ref, err := t.heap.alloc(r.size)
		if err != nil || ref != r.ref {
			panic(fmt.Sprintf("kv: restore: heap allocation %x (%v), planned %x", ref, err, r.ref))
		}
		copy(t.heap.bytes(ref, r.size), b[r.off:r.off+r.size])
		t.yieldPoint()
	}
	t.count = len(recs)
	t.liveBytes = 0
	for _, r := range recs {
		t.liveBytes += r.size
	}
	t.stages = stages
	t.restores++
	// The snapshot does not say when its last entry was applied: the
	// replica's state reached it now (without this the header kept the
	// time of this table's last Apply, 0 for a fresh one).
	t.applied, t.appliedAt = applied, t.cfg.Clock()
	t.layout += 2 // even: no request in progress (applyRequest)
	if commitOrdered != nil {
		commitOrdered(applied)
	}
	t.publish()
	t.ensureSpare()
	return nil
}

// restoreRec is a snapshot record Restore validated: where it lies in the
// snapshot, its key's hash and the heap place it will take.
type restoreRec struct {
	off, size, klen int
	version         uint64
	h               uint64
	ref             uint64 // ascending: bump allocation in snapshot order
}

func (r *restoreRec) key(b []byte) []byte { return b[r.off+recHdr : r.off+recHdr+r.klen] }

// stage is a request arriving in parts (ops.go, "Requests larger than one
// client slot"), part of the replicated state.
type stage struct {
	id   StageID
	buf  []byte
	have int
}

// MaxStages is how many staged requests a client slot may have at once; a
// new one evicts the one with the smallest stage number (a client never
// has more in flight than its window, so only an abandoned one goes).
const MaxStages = 8

func (t *Table) applyStaged(index uint64, data []byte) []byte {
	res := Result{}
	format, id, total, off, part, err := decodeStaged(data)
	if err != nil {
		res.Status = StatusMalformed
		t.requestDone()
		return encodeResult(t.res[:], &res)
	}
	if total > t.cfg.MaxRequest {
		// Nothing staged: the client learns from this part's result
		// and sends no commit (one would find no stage: refused too).
		res = refused(LimitRequest, 0, t.cfg.MaxRequest, total)
		t.requestDone()
		return encodeResult(t.res[:], &res)
	}
	l := t.stages[id.Client]
	// A newer incarnation of the slot abandons the older one's stages.
	k := 0
	for _, s := range l {
		if s.id.Inc >= id.Inc {
			l[k] = s
			k++
		}
	}
	l = l[:k]
	var st *stage
	at := -1
	for i, s := range l {
		if s.id == id {
			st, at = s, i
		}
	}
	switch format {
	case partFormat:
		if st == nil {
			if len(l) == MaxStages {
				oldest := 0
				for i, s := range l {
					if s.id.Inc < l[oldest].id.Inc || s.id.Inc == l[oldest].id.Inc && s.id.Stage < l[oldest].id.Stage {
						oldest = i
					}
				}
				l = append(l[:oldest], l[oldest+1:]...)
			}
			st = &stage{id: id, buf: make([]byte, total)}
			l = append(l, st)
		}
		if len(st.buf) != total || st.have+len(part) > total {
			res.Status = StatusMalformed
		} else {
			copy(st.buf[off:], part)
			st.have += len(part)
		}
		t.setStages(id.Client, l)
		t.requestDone()
		return encodeResult(t.res[:], &res)
	default: // commit
		if st == nil {
			// Evicted by newer stages of the client (or never
			// staged): refused, so that the caller learns the limit.
			res = refused(LimitStages, 0, MaxStages, total)
			t.setStages(id.Client, l)
			t.requestDone()
			return encodeResult(t.res[:], &res)
		}
		if st.have != total || len(st.buf) != total {
			res.Status = StatusMalformed
			t.setStages(id.Client, l)
			t.requestDone()
			return encodeResult(t.res[:], &res)
		}
		l = append(l[:at], l[at+1:]...)
		t.setStages(id.Client, l)
		if len(st.buf) > 0 && st.buf[0] == OrderedFormat {
			return t.applyOrdered(index, st.buf)
		}
		return t.applyRequest(index, st.buf)
	}
}

func (t *Table) setStages(c uint32, l []*stage) {
	if len(l) == 0 {
		delete(t.stages, c)
		return
	}
	t.stages[c] = l
}

// Staged is the number of staged requests and their bytes.
func (t *Table) Staged() (n, bytes int) {
	for _, l := range t.stages {
		for _, s := range l {
			n++
			bytes += len(s.buf)
		}
	}
	return n, bytes
}

// keepOld is the restoreKeeps planted bug (testingKnobs): the snapshot b
// with the table's records of keys b lacks added, so that Restore keeps
// them (a restore that merges into the table instead of replacing it).
// b is returned as it is if it does not parse.
func (t *Table) keepOld(b []byte) []byte {
	if len(b) < 32 || binary.LittleEndian.Uint64(b) != snapMagic {
		return b
	}
	count := binary.LittleEndian.Uint64(b[8:])
	in := map[string]bool{}
	p := 32
	for range count {
		ri, key, _, err := DecodeRecord(b[p:])
		if err != nil || ri.Size() > len(b)-p {
			return b
		}
		in[string(key)] = true
		p += ri.Size()
	}
	out := append([]byte(nil), b[:p]...)
	t.eachSlot(func(s Slot) {
		if !in[string(t.recordKey(s))] {
			out = append(out, t.record(s)...)
			count++
		}
	})
	binary.LittleEndian.PutUint64(out[8:], count)
	return append(out, b[p:]...)
}
