package kv

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/rdma"
)

// One-sided reads of a group's ordered keyspace (issue 18 stage B2;
// docs/btree.md, "Reads"; docs/dev/btree-plan.md section 4). An
// OrderedReader looks a key up, or scans a range, in the B-link tree that
// group publishes (btree.Regions), as a polled state machine like
// GroupReader's gets: Begin, then Poll until it reports done. It reads
// through a GroupReader of its own (that reader's per-member I/O, leader
// search and round-1 leader check), and walks the tree with a btree.Cache
// shared by every OrderedReader of one client and group.
//
// The walk itself is btree's (Cache.Lookup, and a btree.ScanWalk for
// scans, over a ReadFunc): when it asks for a slot not read yet in this
// attempt, the run stops, the reader posts that read and runs the walk
// again once it lands. A lookup's walk runs again from its start over the
// nodes read so far (a local search over cached nodes and bytes already
// read: a lookup reads one or two nodes); a scan's walk resumes at the
// read that stopped it, so each leaf of a scan is decoded once, not once
// per round trip. A node the walk asks for twice in one run (it met a
// torn copy and descends again) is read again. Every node is validated by btree (check word, id, fences,
// level, stamps); a torn or stale node makes the walk read again, move
// right or drop one cached level, never answer; an attempt whose walk
// gives up (btree.ErrRetry, ErrChanged, a broken chain) starts over with
// a fresh tree header, and MaxAttempts of them end the call with the last
// cause.
//
// Every list of reads an attempt posts goes to one member m, in order,
// and the first one starts with a read of m's kv header (h1).
//
// Linearizable (m is the leader): every list also ends with a read of
// m's kv header, and the attempt's answer is accepted only when h1 and
// the header that ended the last list (h2) both say m serves epoch E and
// f+1 members, counted with m, promise exactly E (GroupReader.confirm, the
// same check as a linearizable get, with the promise words read after the
// call began). Serving an epoch, once given up, never comes back, so m
// served E during every read in between; no later leader was elected
// before the promise reads (quorum intersection), so every write
// acknowledged before the call began is applied in m's tree by then (in
// an epoch up to E: E's diff was applied before m served it, and m
// acknowledges its own writes after applying them).
//   - A lookup answers from one leaf read inside that bracket, whose
//     fences hold the key (a validated leaf whose fences hold the key is
//     the key's only leaf at the moment of the read: a split narrows the
//     old leaf in the same apply, a freed leaf fails its id): the answer is
//     m's state at that read, a point inside the call, as for a get's
//     bucket read.
//   - A scan reads m's btree header (applied index A) in the first list,
//     after the call began, and accepts leaves only when each is stamped
//     at most A and contiguous with the one before (btree.Cache.Scan):
//     the pairs are m's tree as of A. Every write acknowledged before the
//     call began was published (A) before that header read, and no write
//     after A was acknowledged before it, so the scan linearizes at the
//     header read, inside the call (plan section 4).
//
// Stale-ok (m is the near member, as for stale-ok gets): no bracket and no
// promises; a member whose kv header says it is catching up (restarted
// without its data) is skipped as stale-ok gets skip it, and ErrCatchingUp
// ends the call when every member in a row is. A lookup's answer is m's state at its leaf read, after entry
// Applied (h1's, read before the leaf) or a later one; a scan is m's tree
// as of Scanned, the btree applied index it read (at least Applied).

// OrderedResult is what a one-sided ordered read found.
type OrderedResult struct {
	// Lookup: whether the key is there, its value and version.
	Found   bool
	Value   []byte
	Version uint64
	// Scan: the pairs, in the scan's order (descending for a reverse
	// scan), and the btree applied index they are the tree's state at.
	// Their keys and values alias the node reads' buffers (the reader's
	// until its next call, as every slice of the result).
	Pairs   []btree.KV
	Scanned uint64
	// Directory read (BeginDir): the group's tablets and their version,
	// and the header's ownership version (btree.Store.OwnVersion).
	Tablets    []btree.Tablet
	DirVersion uint64
	OwnVersion uint64
	// Garbage is the group's garbage key count its load area published
	// (btree.DecodeGarbage), if GarbageOK (the area was whole).
	Garbage   uint64
	GarbageOK bool
	// Member is the replica read; Applied and AppliedAt its kv header's
	// last applied entry and when it was applied, read before the tree:
	// the answer is never older than the state after Applied.
	Member    int
	Applied   uint64
	AppliedAt int64
	// Epoch is the serving epoch a linearizable read confirmed.
	Epoch uint64
	// Retries counts the attempts started again; Reads the node reads of
	// the attempt that answered, and Lists the lists of reads it posted
	// (round trips: a scan reads the leaves a cached level-1 node lists
	// several to a list).
	Retries, Reads, Lists int
	// NodeReads counts the one-sided node reads the call posted, over
	// all its attempts (a read joined through delegation is not its
	// own). Reads can be fewer: a walk runs again over the nodes read so
	// far, from the inner nodes the cache took from them.
	NodeReads int
	// Decodes counts the node images the walk took (and validated) over
	// the call's attempts: a scan's walk resumes after each list of
	// reads, so each node it reads is decoded once (NodeReads plus the
	// nodes a descent or a retry takes again), not once per list.
	Decodes int
	// NodeBytes counts the bytes the call's node reads asked for.
	NodeBytes int
	// ShortReads counts the node reads that came back shorter than the
	// node (read by a size it had outgrown), over the call's attempts:
	// each is read again.
	ShortReads int
	// Leaves counts the leaves a scan's answer took pairs from (the
	// attempt that answered): NodeReads beyond them (and the inner
	// nodes a descent read) are leaves read ahead and not needed.
	Leaves int
}

// ErrOrderedRetries: a one-sided ordered read kept meeting nodes being
// written, or a tree that changed under it, for MaxAttempts attempts.
var ErrOrderedRetries = errors.New("kv: ordered read gave up")

// ErrNotOwner: the group's ownership version (btree header word 4)
// differs from the one the caller's directory was read at
// (SetOwnVersion): the group may no longer own the key's tablet, or own
// one it did not. The read gave no answer; the caller reads the
// directory again and reads the group it names.
var ErrNotOwner = errors.New("kv: the group's tablets changed since the directory was read")

// errNeed: the walk asked for a node not read yet in this attempt.
var errNeed = errors.New("kv: node not read yet")

type orderedKind uint8

const (
	okLookup orderedKind = iota
	okScan
	okReverse
	okDir // the group's tablets (the directory area after the tree header)
)

type ordState uint8

const (
	osIdle ordState = iota
	osStart
	osFind    // the GroupReader's header reads of every member, for the leader
	osList    // a list of reads posted to m
	osConfirm // the answer found; waiting for the promise reads
	osJoin    // waiting for another reader's read of the node (Delegation)
	osWait    // backing off until retryAt
	osDone
)

// OrderedReader reads one group's ordered keyspace one-sided, one call at
// a time (a client keeps a pool, like GroupReaders); its Cache may be
// shared.
type OrderedReader struct {
	gr    *GroupReader
	cache *btree.Cache

	// The tree header last read: the root a lookup starts from (any
	// older root works too, through right links) and the geometry that
	// places node slots.
	hdr   btree.Header
	hdrOK bool
	hbuf  []byte
	dbuf  []byte // the whole header region (directory reads)
	// The ownership check (SetOwnVersion): the version the caller's
	// directory says, the buffers of the tree-header reads before the
	// attempt's first node read and after each list's node reads, and
	// which of them the list in flight has.
	ownWant         uint64
	obuf            [2][]byte
	ownPre, ownPost bool
	ownOK           bool // every check of this attempt so far matched
	skipOwnCheck    bool // planted: the check is not made
	wrs             []rdma.WR
	readFn          btree.ReadFunc

	// The call under way.
	st                ordState
	kind              orderedKind
	mode              Consistency
	key, start, end   []byte
	limit             int
	res               OrderedResult
	err, lastErr      error
	attempt           int
	backoff, retryAt  time.Duration
	now               time.Duration
	m                 int
	first, wantHdr    bool
	h1, h2            Header   // the bracket the answer is confirmed with (linearizable)
	ownH1             Header   // the kv header this attempt's first list read
	posted            int      // lists posted in this attempt
	inList            []uint32 // the node slots the list in flight reads
	bufs              [][]byte // and their buffers
	hdrInList         bool
	memo              []memoEnt // node slots read (or asked for) this attempt
	memoN             int       // those read: with a copy
	need              uint32
	needK             int // the copy of need the walk asked for
	runReads          int
	pairs             []btree.KV
	walk              btree.ScanWalk // the attempt's scan, resumed after each list
	walking           bool           // walk began in this attempt
	lkEntry           btree.Entry
	hint              btree.Hint // the lookup's search of the cache, kept from run to run of an attempt
	lkFound           bool
	maxReadsPerAttmpt int
	// hints are the used sizes of nodes read (readLen).
	hints []usedHint
	// perLeaf16 is 16 times the entries per leaf of this reader's past
	// scans (a moving average; 0: none yet), which sizes their reads
	// ahead (ahead).
	perLeaf16 int

	// Read delegation (SetDelegation): the delegation's count when the
	// lookup began, the read this reader posted and shares (nil: none),
	// the one it waits for, and a slot it reads itself after a shared
	// read of it failed.
	deleg    *Delegation
	beginSeq uint64
	own      *sharedRead
	joining  *sharedRead
	noJoin   uint32
	took     []*sharedRead // the shared reads this call took: each once
	// The node buffers the call posted reads into (and the shared read
	// each was, for a lookup's): the next call reuses them once the call
	// ended with no read out (clean), except those another lookup joined.
	// free holds the buffers to reuse, spare a sharedRead.
	callBufs []callBuf
	free     [][]byte
	spare    *sharedRead
	clean    bool
	// catching has bit i set for each member i found catching up since
	// the last that was not (stale-ok; as GroupReader's).
	catching uint64
	// In this attempt: the reads landed or joined, whether a bracket (an
	// h1 and h2 serving one epoch, linearizable) or an h1 (stale-ok) was
	// taken yet.
	got       int
	bracketed bool
	// Joined counts the node reads this reader took from another's.
	Joined uint64
}

// Delegation lets one client's OrderedReaders of a group share node reads
// of lookups (read delegation, as SMART and CHIME do): a lookup that
// needs a node another lookup of the client has read, or is reading, from
// the same member takes that read instead of posting its own, but only a
// read posted after it began: one posted before may predate a write
// acknowledged before the lookup began, which the lookup must see. A
// linearizable lookup joins only reads bracketed by header reads that
// show the member serving the epoch it confirms (with its own promise
// reads, made after it began); its answer then rests on a node read made
// inside its call while the leader served that epoch, as if it had made
// the read itself. Scans neither share nor join (a scan's leaves must be
// read after its applied index). Safe for concurrent use.
type Delegation struct {
	mu    sync.Mutex
	seq   uint64
	reads map[uint32]*sharedRead // by slot: the last read of it posted
	// joinOlder plants a bug: lookups join reads posted before they
	// began.
	joinOlder bool
	// recycleJoined plants a bug: a reader reuses the buffer of a read
	// another lookup joined (whose answer aliases it).
	recycleJoined bool
	// joinAnyOwn plants a bug: a lookup that checks ownership joins a
	// read that was not checked against its ownership version.
	joinAnyOwn bool
	// registerAfterPost plants a bug: a lookup registers its node read
	// after posting it (a lookup that begins in between joins a read
	// made before it began).
	registerAfterPost bool
	// afterPost, if set, runs after a lookup posted a list with a shared
	// node read (tests: a lookup begins right after the read was made).
	afterPost func()
}

// NewDelegation returns a Delegation for one client's readers of a group.
func NewDelegation() *Delegation { return &Delegation{reads: map[uint32]*sharedRead{}} }

// sharedRead is one node read a lookup posted, as others may join it.
type sharedRead struct {
	seq    uint64 // the Delegation's count when it was posted
	member int
	done   bool
	failed bool
	joined bool // find returned it: another lookup may hold buf
	buf    []byte
	lin    bool   // h1 and h2 bracket it, serving one epoch
	h1, h2 Header // the poster's header before the read, and after (lin)
	// own is the ownership version the poster's tree-header reads showed
	// before and after the read (0: not checked, or they differed).
	own uint64
}

// callBuf is a node buffer a call posted a read into.
type callBuf struct {
	slot uint32
	buf  []byte
	sr   *sharedRead // the shared read it was, nil if none
}

// maxFreeBytes bounds the bytes of node buffers a reader keeps for reuse:
// enough for the leaves of a scan of a few hundred records (YCSB E's scans
// of up to 100 records of 1 KiB read about 20 leaves of 8 KiB; 16
// buffers made such a scan allocate some of its buffers every call).
const maxFreeBytes = 256 << 10

// recycle takes back the node buffers of the call that ended, at the
// start of the next (a result's slices alias them until then): all of
// them if the call ended with no read out, but those another lookup
// joined (Delegation.retire), which become the joiners'.
func (r *OrderedReader) recycle() {
	clean := r.st == osDone || r.st == osIdle && r.clean
	r.clean = false
	for i := range r.callBufs {
		cb := &r.callBufs[i]
		if clean {
			ok := true
			if cb.sr != nil {
				ok = r.deleg.retire(cb.slot, cb.sr)
				if ok {
					r.spare = cb.sr
				}
			}
			if ok && (len(r.free)+1)*cap(cb.buf) <= maxFreeBytes {
				r.free = append(r.free, cb.buf)
			}
		}
		*cb = callBuf{}
	}
	r.callBufs = r.callBufs[:0]
}

// Reading a node's used bytes only. A node uses `used` bytes of its
// NodeSize (leaves are 50 to 100% full), and a one-sided read copies
// every byte it asks for. So the reader remembers the used size of the
// nodes it read (a small table by slot, its own: no lock) and reads such
// a node's used bytes and some slack for its growth (usedSlack), rounded
// up to 64 bytes, instead of the whole slot. A read that comes back
// shorter than the node's used size (its header's used field, read with
// it, says more: the node grew) is not a node: the reader notes the new
// size and the walk asks for the node again (OrderedResult.ShortReads). A
// read whose used field is torn is only a wrong hint: the node is
// validated (check word over its used bytes) as any other.
const (
	hintSlots = 4096 // the size hints kept, by slot modulo hintSlots
	usedSlack = 512  // bytes read past a node's last known used size, at least
)

type usedHint struct {
	slot uint32
	used uint32 // 0: none
}

// readLen is how many bytes of slot a read asks for.
func (r *OrderedReader) readLen(slot uint32) int {
	size := int(r.hdr.NodeSize)
	if r.hints == nil {
		return size
	}
	h := r.hints[slot%hintSlots]
	if h.used == 0 || h.slot != slot {
		return size
	}
	n := int(h.used) + max(usedSlack, size/8)
	return min(size, (n+63)&^63)
}

// noteUsed records the used size of the node read into b from slot, and
// reports whether b holds all of it (false: read again).
func (r *OrderedReader) noteUsed(slot uint32, b []byte) bool {
	used := btree.UsedSize(b)
	if used <= 0 || used > int(r.hdr.NodeSize) {
		// Not a node's header (torn, or a freed slot): no hint, and the
		// walk's validation decides.
		if r.hints != nil {
			r.hints[slot%hintSlots] = usedHint{}
		}
		return true
	}
	if r.hints == nil {
		r.hints = make([]usedHint, hintSlots)
	}
	if h := &r.hints[slot%hintSlots]; r.gr.knobs.staleSizeHints && h.slot == slot && h.used != 0 {
		return true // keeps the size first learnt, and takes the read
	}
	r.hints[slot%hintSlots] = usedHint{slot: slot, used: uint32(used)}
	return used <= len(b)
}

// nodeBuf is a buffer for a read of a node: a reused one, or a fresh one.
func (r *OrderedReader) nodeBuf(slot uint32) []byte {
	size := int(r.hdr.NodeSize)
	var b []byte
	if n := len(r.free); n > 0 && cap(r.free[n-1]) >= size {
		b, r.free[n-1] = r.free[n-1][:size], nil
		r.free = r.free[:n-1]
	} else {
		b = make([]byte, size)
	}
	r.callBufs = append(r.callBufs, callBuf{slot: slot, buf: b})
	return b
}

// SetDelegation makes the reader's lookups share node reads through d
// (nil: none). Set it before the reader's first call.
func (r *OrderedReader) SetDelegation(d *Delegation) { r.deleg = d }

func (d *Delegation) begin() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq
}

// find returns a read of slot from member posted after seq, or nil.
func (d *Delegation) find(slot uint32, member int, after uint64, lin bool) *sharedRead {
	d.mu.Lock()
	defer d.mu.Unlock()
	sr := d.reads[slot]
	if sr == nil || sr.member != member || sr.seq <= after && !d.joinOlder || sr.failed || sr.done && lin && !sr.lin {
		return nil
	}
	sr.joined = true
	return sr
}

// posted registers a read of slot just posted (into spare, if not nil: a
// read retire gave back).
func (d *Delegation) posted(slot uint32, member int, buf []byte, spare *sharedRead) *sharedRead {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	sr := spare
	if sr == nil {
		sr = &sharedRead{}
	}
	*sr = sharedRead{seq: d.seq, member: member, buf: buf}
	d.reads[slot] = sr
	return sr
}

// retire ends the sharing of sr, which landed: no lookup can join it
// from now on. true if none did, so that its poster may reuse sr and its
// buffer; false if another lookup took it (its answer may alias buf).
func (d *Delegation) retire(slot uint32, sr *sharedRead) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reads[slot] == sr {
		delete(d.reads, slot)
	}
	return !sr.joined || d.recycleJoined
}

// land ends a shared read: failed (joiners read for themselves), or with
// its bytes in buf and the poster's headers.
func (d *Delegation) land(sr *sharedRead, failed, lin bool, h1, h2 Header, own uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if sr.done {
		return
	}
	sr.done, sr.failed, sr.lin, sr.h1, sr.h2, sr.own = true, failed, lin, h1, h2, own
}

// state reports whether sr is done and, if so, whether it failed.
func (d *Delegation) state(sr *sharedRead) (done, failed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return sr.done, sr.failed
}

// NewOrderedReader reads group g's ordered keyspace from node, walking
// the tree through cache (shared by a client's readers of g: btree.Cache
// locks its own state). near is the member stale-ok reads go to first.
func NewOrderedReader(node rdma.Node, g uint32, members []rdma.NodeID, near int, cache *btree.Cache) *OrderedReader {
	r := &OrderedReader{gr: NewGroupReader(node, g, members, near), cache: cache, hbuf: make([]byte, btree.HeaderSize),
		maxReadsPerAttmpt: 256}
	r.obuf[0], r.obuf[1] = make([]byte, btree.HeaderSize), make([]byte, btree.HeaderSize)
	r.readFn = r.memoRead
	return r
}

// SetOwnVersion makes the reader's lookups and scans check that the
// group serves the keys it served when the caller's directory was read:
// its tree header's ownership version must be v before the attempt's
// first node read and after each list of node reads (a version changes
// when a tablet leaves the group or is installed in it, btree/move.go).
// A mismatch ends the call with ErrNotOwner. 0: no check. It holds for
// the reader's later calls until set again.
//
// Why it suffices: the version a group publishes only grows, so the same
// v before and after the node reads means no tablet left or entered the
// group in between: the group owned the key's tablet (the directory said
// so at v) at every node read the answer rests on. A move drops the
// tablet at its source before the target serves it, so a source that
// still has v served every write of the tablet acknowledged so far.
func (r *OrderedReader) SetOwnVersion(v uint64) { r.ownWant = v }

// PlantSkipOwnCheck plants a bug in r: its reads do not check the
// ownership version (a client with a stale directory reads a group that
// no longer owns the key, tests of other packages).
func PlantSkipOwnCheck(r *OrderedReader) { r.skipOwnCheck = true }

// ownCheck reports whether the call checks ownership.
func (r *OrderedReader) ownCheck() bool {
	return r.ownWant != 0 && r.kind != okDir && !r.skipOwnCheck
}

// Reader is the GroupReader the reads go through (its Timeout and
// backoff settings apply).
func (r *OrderedReader) Reader() *GroupReader { return r.gr }

// Close closes the reader's Conns.
func (r *OrderedReader) Close() { r.gr.Close() }

// Busy reports whether a call is under way.
func (r *OrderedReader) Busy() bool { return r.st != osIdle && r.st != osDone }

// Result is the outcome of the call that finished. Its slices are the
// reader's until its next call.
func (r *OrderedReader) Result() (OrderedResult, error) { return r.res, r.err }

// NextDeadline is when the call wants its next Poll: the end of its
// backoff, or the read timeout of a member's Link with reads out.
func (r *OrderedReader) NextDeadline() time.Duration {
	if r.st == osWait {
		return r.retryAt
	}
	return r.gr.NextDeadline() // its own st is idle: its Links' deadlines
}

// BeginLookup starts a lookup of key (copied).
func (r *OrderedReader) BeginLookup(key []byte, mode Consistency) {
	r.begin(okLookup, mode)
	r.key = append(r.key[:0], key...)
}

// BeginScan starts a scan of the pairs with start <= key < end (end nil:
// no bound), at most limit of them (<= 0: all), in ascending key order,
// or descending with reverse (the last limit pairs of the range).
func (r *OrderedReader) BeginScan(start, end []byte, limit int, mode Consistency, reverse bool) {
	r.begin(okScan, mode)
	if reverse {
		r.kind = okReverse
	}
	r.start = append(r.start[:0], start...)
	r.end = nil
	if end != nil {
		r.end = append([]byte{}, end...)
	}
	r.limit = limit
}

// BeginDir starts a read of the group's tablets: its btree header region
// (the header and the directory area after it) from one member, read as
// a stale-ok read is (the near member; the tablets it has published).
func (r *OrderedReader) BeginDir() {
	r.begin(okDir, StaleOK)
}

// BeginDirMode is BeginDir in the given consistency: Linearizable reads
// the leader's tablets and confirms its epoch as a linearizable get
// does, so the answer includes every tablet change acknowledged before
// the call began (a move's last step, for one).
func (r *OrderedReader) BeginDirMode(mode Consistency) {
	r.begin(okDir, mode)
}

// DirCtx reads the group's tablets like BeginDir, giving up when ctx ends.
func (r *OrderedReader) DirCtx(ctx context.Context) (OrderedResult, error) {
	return r.DirCtxMode(ctx, StaleOK)
}

// DirCtxMode reads the group's tablets like BeginDirMode, giving up when
// ctx ends.
func (r *OrderedReader) DirCtxMode(ctx context.Context, mode Consistency) (OrderedResult, error) {
	r.BeginDirMode(mode)
	return r.drive(ctx)
}

func (r *OrderedReader) begin(k orderedKind, mode Consistency) {
	r.recycle()
	r.kind, r.mode = k, mode
	if r.deleg != nil {
		r.beginSeq = r.deleg.begin()
		clear(r.took)
		r.took = r.took[:0]
	}
	r.res, r.err, r.lastErr = OrderedResult{}, nil, nil
	r.attempt, r.backoff, r.catching = 0, 0, 0
	r.st = osStart
}

// Poll advances the call; when it returns true the call is over and
// Result has its outcome. now is the caller's clock.
func (r *OrderedReader) Poll(now time.Duration) bool {
	r.now, r.gr.now = now, now
	for {
		switch r.st {
		case osIdle, osDone:
			return true
		case osWait:
			if now < r.retryAt {
				return false
			}
			r.st = osStart
		case osStart:
			r.startAttempt()
		case osFind:
			done, err := r.gr.found()
			if !done {
				return false
			}
			if err != nil {
				r.fail(err)
			} else {
				r.st = osStart
			}
		case osList:
			if !r.gr.reap(r.m) {
				return false
			}
			r.landed()
		case osJoin:
			done, failed := r.deleg.state(r.joining)
			if !done {
				return false
			}
			sr := r.joining
			r.joining = nil
			if failed || !r.take(sr) {
				r.noJoin = r.need // read it for ourselves
			}
			r.step()
		case osConfirm:
			done, err := r.gr.confirm(r.m, &r.h1, &r.h2)
			if !done {
				return false
			}
			if err != nil {
				r.fail(err)
				continue
			}
			r.res.Epoch = r.h1.Serving
			r.st = osDone
		}
	}
}

// fail ends the attempt: start again (at once for a torn or changed tree,
// but for every 16th; after a backoff otherwise) or give up.
func (r *OrderedReader) fail(err error) {
	g := r.gr
	r.release()
	r.lastErr = err
	r.attempt++
	r.res.Retries = r.attempt
	r.hdrOK = false // read the tree header again
	if r.attempt >= MaxAttempts {
		r.err = fmt.Errorf("%w: group %d: %d attempts: %w", ErrOrderedRetries, g.group, r.attempt, err)
		r.st = osDone
		return
	}
	if errors.Is(err, errRetry) && r.attempt%16 != 0 {
		r.st = osStart
		return
	}
	if r.mode == Linearizable {
		g.leader = -1
	} else if !errors.Is(err, errRetry) {
		if g.near == g.home {
			g.homeFailed()
		}
		g.near = (g.near + 1) % len(g.members)
	}
	r.backoff = min(max(2*r.backoff, g.BackoffMin), g.BackoffMax)
	r.retryAt = r.now + r.backoff
	r.st = osWait
}

func (r *OrderedReader) startAttempt() {
	g := r.gr
	g.Rounds++
	if r.mode == Linearizable && g.leader < 0 {
		for i := range g.members {
			g.postHeader(i, g.m[i].hdr[hdrSize:])
		}
		r.st = osFind
		return
	}
	if r.mode == StaleOK && g.near != g.home && r.now >= g.homeAt && g.homeReady() {
		g.near = g.home
	}
	r.m = g.near
	if r.mode == Linearizable {
		r.m = g.leader
	}
	g.at = r.m
	r.resetMemo()
	r.hint.Reset()
	r.walking = false
	r.first, r.posted, r.runReads, r.got, r.bracketed, r.noJoin, r.joining = true, 0, 0, 0, false, 0, nil
	r.ownOK = true
	r.wantHdr = !r.hdrOK || r.kind != okLookup
	for i := range g.asked {
		g.asked[i] = false
	}
	g.asked[r.m] = true
	if r.mode == Linearizable {
		// f other members' promise words, read after the call began, in
		// parallel with the tree reads.
		g.askPromises(g.quorum - 1)
		g.r1At, g.hedged = r.now, false
	}
	r.step()
}

// memoRead is the walk's ReadFunc: the k-th read of a slot in one run
// returns the k-th copy read in this attempt, or stops the run (errNeed)
// to have it read.
func (r *OrderedReader) memoRead(slot uint32) ([]byte, error) {
	e := r.memoEnt(slot)
	k := e.uses
	e.uses++
	if k < len(e.bufs) {
		r.res.Decodes++
		return e.bufs[k], nil
	}
	r.need, r.needK = slot, k
	return nil, errNeed
}

// memoEnt is a node slot of the attempt's memo: the copies read of it, in
// read order, and how many of them the current run took. The memo is a
// list searched in order, not a map: a lookup reads one or two slots, and
// a map's clearing and hashing cost more than the search (a scan's
// attempt reads at most maxReadsPerAttmpt).
type memoEnt struct {
	slot uint32
	bufs [][]byte
	uses int
}

// memoEnt is slot's entry of the memo, added (with no copy) if none.
func (r *OrderedReader) memoEnt(slot uint32) *memoEnt {
	for i := range r.memo {
		if r.memo[i].slot == slot {
			return &r.memo[i]
		}
	}
	if len(r.memo) < cap(r.memo) {
		r.memo = r.memo[:len(r.memo)+1] // reuse the entry's list
	} else {
		r.memo = append(r.memo, memoEnt{})
	}
	e := &r.memo[len(r.memo)-1]
	e.slot, e.bufs, e.uses = slot, e.bufs[:0], 0
	return e
}

// memoAdd adds a copy of slot read in this attempt.
func (r *OrderedReader) memoAdd(slot uint32, b []byte) {
	e := r.memoEnt(slot)
	if len(e.bufs) == 0 {
		r.memoN++
	}
	e.bufs = append(e.bufs, b)
}

// copies is the number of copies of slot read in this attempt.
func (r *OrderedReader) copies(slot uint32) int {
	for i := range r.memo {
		if r.memo[i].slot == slot {
			return len(r.memo[i].bufs)
		}
	}
	return 0
}

// resetMemo empties the memo for a new attempt (its lists kept for reuse,
// without the buffers).
func (r *OrderedReader) resetMemo() {
	for i := range r.memo {
		clear(r.memo[i].bufs)
		r.memo[i].bufs = r.memo[i].bufs[:0]
	}
	r.memo, r.memoN = r.memo[:0], 0
}

// scanAhead bounds the leaves a scan reads ahead in one list, besides the
// one its walk asks for (a list, with its two header reads, stays within
// the member Link's window).
const scanAhead = 8

// ahead is how many leaves the scan under way reads ahead, besides the
// one its walk asks for: scanAhead without a limit; with one, enough
// leaves for the pairs still to find at the entries per leaf e of the
// reader's past scans, counting half a leaf for the one asked for (the
// scan's first leaf starts on average in its middle): ceil(left/e - 1/2);
// before the reader knows e, half the limit (a leaf holds several
// pairs). A leaf read and not needed costs a copy; one too few costs a
// round trip.
func (r *OrderedReader) ahead() int {
	if r.limit <= 0 {
		return scanAhead
	}
	if r.perLeaf16 == 0 {
		return min(scanAhead, r.limit/2)
	}
	left := r.limit - len(r.pairs)
	num, den := 32*left-r.perLeaf16, 2*r.perLeaf16
	if num <= 0 {
		return 0
	}
	return min(scanAhead, (num+den-1)/den)
}

// notePerLeaf adds the entries per leaf of the scan that answered to the
// reader's average.
func (r *OrderedReader) notePerLeaf() {
	w := &r.walk
	if w.Leaves == 0 {
		return
	}
	per := max(16*w.Entries/w.Leaves, 16)
	if r.perLeaf16 == 0 {
		r.perLeaf16 = per
	} else {
		r.perLeaf16 = (3*r.perLeaf16 + per) / 4
	}
}

// run runs the walk over the nodes read so far: nil when it answered,
// errNeed when it needs r.need read, else why the attempt failed.
func (r *OrderedReader) run() error {
	for i := range r.memo {
		r.memo[i].uses = 0
	}
	if r.walking {
		// A scan's walk resumes at the read that stopped it, which
		// takes the copy it asked for (a fresh one, if it had read that
		// slot before in this attempt); the reads before it in the
		// walk are not made again. A descent the stop interrupted does
		// start again, and takes the copies it took before.
		r.memoEnt(r.need).uses = r.needK
	}
	var err error
	var reads int
	switch r.kind {
	case okLookup:
		r.lkEntry, r.lkFound, reads, err = r.cache.LookupHinted(r.readFn, r.hdr.Root, r.key, &r.hint)
	case okScan, okReverse:
		// The scan's walk resumes where the last list stopped it: each
		// node read is decoded once per attempt (OrderedResult.Decodes).
		if !r.walking {
			r.cache.BeginScan(&r.walk, r.hdr.Root, r.hdr.Applied, r.start, r.end, r.limit, r.kind == okReverse, r.pairs[:0])
			r.walk.AliasReads() // each read lands in a fresh buffer the memo keeps
			r.walking = true
		}
		err = r.walk.Run(r.readFn)
		r.pairs, reads = r.walk.Pairs, r.walk.Reads
	}
	r.runReads = reads
	return err
}

// step posts the attempt's next list of reads, or takes the walk's
// answer.
func (r *OrderedReader) step() {
	g := r.gr
	var wrs []rdma.WR
	r.inList, r.bufs, r.hdrInList = r.inList[:0], r.bufs[:0], false
	r.ownPre, r.ownPost = false, false
	ms := g.m[r.m]
	if r.first {
		wrs = append(r.wrs[:0], rdma.WR{Kind: rdma.OpRead, Region: headerRegion(g.group), Buf: ms.hdr[:hdrSize]})
	} else {
		wrs = r.wrs[:0]
	}
	if r.wantHdr {
		buf := r.hbuf
		if r.kind == okDir {
			if r.dbuf == nil {
				r.dbuf = make([]byte, btree.RegionSize)
			}
			buf = r.dbuf
		}
		wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: btree.HeaderRegion(g.group), Buf: buf})
		r.hdrInList = true
	} else {
		err := r.run()
		switch {
		case err == nil && r.got > 0 && r.bracketed:
			r.answer()
			return
		case errors.Is(err, errNeed) && r.join():
			return // joined another lookup's read (state osJoin), or took it and ran again
		case err == nil || errors.Is(err, errNeed) && r.memoN >= r.maxReadsPerAttmpt:
			r.fail(errRetry) // answered with nothing read (cannot happen), or too many reads
			return
		case errors.Is(err, errNeed):
			r.inList = append(r.inList, r.need)
			if r.kind != okLookup {
				// The leaves the cached level-1 node lists next, read
				// together with this one (the walk takes them in turn).
				key, bound, rev := r.start, r.end, r.kind == okReverse
				if rev {
					key, bound = r.end, r.start
				} else if k := r.walk.ResumeKey(); k != nil {
					key = k // past the level-1 node the scan began in
				}
				for _, id := range r.cache.Listed(key, bound, r.need, rev, r.ahead()) {
					if sl := id.Slot(); r.copies(sl) == 0 && !slices.Contains(r.inList, sl) {
						r.inList = append(r.inList, sl)
					}
				}
			}
			if r.ownCheck() && r.first {
				// The tree header before the attempt's first node read:
				// the ownership version then.
				wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: btree.HeaderRegion(g.group), Buf: r.obuf[0]})
				r.ownPre = true
			}
			for _, sl := range r.inList {
				reg, off := r.hdr.SlotAddr(g.group, sl)
				b := r.nodeBuf(sl)[:r.readLen(sl)] // the memo keeps it until the call's end
				r.bufs = append(r.bufs, b)
				r.res.NodeBytes += len(b)
				wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: reg, Offset: off, Buf: b})
			}
			if r.ownCheck() {
				// And after them.
				wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: btree.HeaderRegion(g.group), Buf: r.obuf[1]})
				r.ownPost = true
			}
			if r.need == r.noJoin {
				r.noJoin = 0
			}
		case errors.Is(err, btree.ErrChanged), errors.Is(err, btree.ErrRetry), errors.Is(err, btree.ErrMalformed),
			errors.Is(err, btree.ErrStale), errors.Is(err, btree.ErrNotNode), errors.Is(err, btree.ErrTorn):
			r.fail(fmt.Errorf("%w: %w", errRetry, err))
			return
		default:
			r.fail(err)
			return
		}
	}
	if r.mode == Linearizable {
		wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(g.group), Buf: ms.hdr[hdrSize:]})
	}
	r.wrs = wrs
	if len(r.inList) == 1 && r.deleg != nil && r.kind == okLookup && !r.deleg.registerAfterPost {
		// Shared before it is posted: a fabric may read the node at the
		// post (mem does), and a lookup joins only reads registered
		// after it began, which must then be reads made after it began.
		// Registered after the post, a lookup that began in between
		// joined a read made before it began, and missed a write
		// acknowledged before it began (the client's
		// TestKeyspaceMoveLinearizable, once: a stale value).
		r.share()
	}
	if !g.post(r.m, wrs) {
		r.fail(errRetry) // a read of an abandoned attempt is still out
		return
	}
	if r.deleg != nil && r.deleg.afterPost != nil && len(r.inList) == 1 && r.kind == okLookup {
		r.deleg.afterPost()
	}
	r.posted++
	r.res.NodeReads += len(r.inList)
	r.st = osList
	if len(r.inList) == 1 && r.deleg != nil && r.kind == okLookup && r.deleg.registerAfterPost {
		r.share() // planted: after the post
	}
}

// share registers the attempt's one node read in the Delegation.
func (r *OrderedReader) share() {
	r.own = r.deleg.posted(r.inList[0], r.m, r.bufs[0], r.spare)
	r.spare = nil
	r.callBufs[len(r.callBufs)-1].sr = r.own
}

// join looks for another lookup's read of the node the walk needs (see
// Delegation): a finished one is taken and the walk runs again; one in
// flight is waited for (osJoin). false: none to join.
func (r *OrderedReader) join() bool {
	if r.deleg == nil || r.kind != okLookup || r.need == r.noJoin || r.wantHdr {
		return false
	}
	sr := r.deleg.find(r.need, r.m, r.beginSeq, r.mode == Linearizable)
	if sr == nil || sr == r.own || slices.Contains(r.took, sr) {
		return false // a node taken once and asked for again: read it afresh
	}
	if done, failed := r.deleg.state(sr); !done {
		r.joining = sr
		r.st = osJoin
		return true
	} else if failed || !r.take(sr) {
		return false
	}
	r.step()
	return true
}

// take adds a shared read that finished to the attempt: false if its
// bracket does not fit the attempt's (another epoch), so the reader reads
// the node itself.
func (r *OrderedReader) take(sr *sharedRead) bool {
	if r.ownCheck() && sr.own != r.ownWant && !r.deleg.joinAnyOwn {
		return false // not read under the ownership version this call checks
	}
	if r.mode == Linearizable {
		if !sr.lin || !r.bracket(sr.h1, sr.h2) {
			return false
		}
	} else {
		if sr.h1.CatchingUp {
			return false
		}
		r.noteH1(sr.h1)
	}
	r.memoAdd(r.need, sr.buf)
	r.took = append(r.took, sr)
	r.got++
	r.Joined++
	return true
}

// bracket adds the header reads h1 and h2 around a node read to the
// attempt's: they must serve the epoch the attempt's others do. The
// attempt confirms with its first h1 and last h2 (GroupReader.confirm).
func (r *OrderedReader) bracket(h1, h2 Header) bool {
	if r.bracketed && (h1.Serving != r.h1.Serving || h2.Serving != r.h1.Serving) || h1.Serving == 0 || h2.Serving != h1.Serving {
		return false
	}
	if !r.bracketed {
		r.h1, r.bracketed = h1, true
		r.res.Member, r.res.Applied, r.res.AppliedAt = r.m, h1.Applied, h1.AppliedAt
	}
	r.h2 = h2
	return true
}

// noteH1 takes a kv header read before some node read of the attempt: the
// answer is never older than the earliest such header's applied entry.
func (r *OrderedReader) noteH1(h1 Header) {
	if !r.bracketed || h1.Applied < r.res.Applied {
		r.res.Member, r.res.Applied, r.res.AppliedAt = r.m, h1.Applied, h1.AppliedAt
	}
	r.bracketed = true
}

// release ends the shared read this reader posted and has not landed, as
// failed (it abandons it).
func (r *OrderedReader) release() {
	if r.own != nil {
		r.deleg.land(r.own, true, false, Header{}, Header{}, 0)
		r.own = nil
	}
}

// landed takes the list that finished.
func (r *OrderedReader) landed() {
	g := r.gr
	ms := g.m[r.m]
	lin := r.mode == Linearizable
	if err := g.consume(r.m); err != nil {
		clear(ms.hdr[hdrSize:])
		r.fail(err)
		return
	}
	if r.first {
		h1, err := DecodeHeader(ms.hdr[:hdrSize])
		if err != nil {
			r.fail(errRetry)
			return
		}
		r.ownH1, r.first = h1, false
		if lin && h1.Serving == 0 {
			r.fail(ErrNoLeader)
			return
		}
		if !lin {
			if h1.CatchingUp && !g.knobs.readCatchingUp {
				// Restarted without its data (its tree is empty): read
				// another member, as a stale-ok get does.
				if r.catching |= 1 << r.m; bits.OnesCount64(r.catching) >= len(g.members) {
					r.release()
					r.err = fmt.Errorf("kv: group %d: every replica read restarted without its data and is catching up: %w", g.group, ErrCatchingUp)
					r.st = osDone
					return
				}
				r.fail(fmt.Errorf("kv: node %d: %w", g.members[r.m], ErrCatchingUp))
				return
			}
			r.catching = 0
			r.noteH1(h1)
		}
	}
	var h2 Header
	if lin {
		var err error
		if h2, err = DecodeHeader(ms.hdr[hdrSize:]); err != nil {
			r.fail(errRetry)
			return
		}
		ms.lastAt = r.now
		if !r.bracket(r.ownH1, h2) {
			r.fail(ErrNoLeader)
			return
		}
	}
	if r.hdrInList {
		buf := r.hbuf
		if r.kind == okDir {
			buf = r.dbuf[:btree.HeaderSize]
		}
		h, err := btree.DecodeHeader(buf)
		if err != nil {
			r.fail(fmt.Errorf("%w: tree header: %w", errRetry, err))
			return
		}
		r.wantHdr = false
		if r.ownCheck() && !r.ownMatch(h) {
			return
		}
		if r.kind != okDir {
			// A directory read's header is not kept as the root later
			// stale-ok lookups start from: a client reads the directory
			// at its first ordered call, often before a load, and a
			// lookup from that root (a leaf then) walked right through
			// every leaf of the loaded tree.
			r.hdr, r.hdrOK = h, true
		}
		if r.kind == okDir {
			v, tbs, err := btree.DecodeDir(r.dbuf[btree.HeaderSize:])
			if err != nil {
				r.fail(fmt.Errorf("%w: tablets: %w", errRetry, err))
				return
			}
			r.res.Tablets, r.res.DirVersion, r.res.OwnVersion = tbs, v, h.OwnVersion
			r.res.Garbage, r.res.GarbageOK = btree.DecodeGarbage(r.dbuf[btree.HeaderSize:])
			r.answer()
			return
		}
	}
	for i, b := range r.obuf {
		if i == 0 && !r.ownPre || i == 1 && !r.ownPost {
			continue
		}
		h, err := btree.DecodeHeader(b)
		if err != nil {
			r.fail(fmt.Errorf("%w: tree header: %w", errRetry, err))
			return
		}
		if !r.ownMatch(h) {
			return
		}
	}
	ownShort := false
	for i, sl := range r.inList {
		if !r.noteUsed(sl, r.bufs[i]) {
			// Read short: the node grew past the bytes read. The walk
			// asks for it again, and it is read at its new size.
			r.res.ShortReads++
			ownShort = ownShort || i == 0
			continue
		}
		r.memoAdd(sl, r.bufs[i])
		r.got++
	}
	if len(r.inList) > 0 {
		if r.own != nil {
			var own uint64
			if r.ownCheck() && r.ownOK && r.ownPost {
				own = r.ownWant
			}
			// A short read is no node: lookups that joined it read
			// for themselves.
			r.deleg.land(r.own, ownShort, lin, r.ownH1, h2, own)
			r.own = nil
		}
	}
	r.step()
}

// ownMatch checks a tree header read for the ownership check: false
// (the call ended with ErrNotOwner) if its version is not the one asked
// for.
func (r *OrderedReader) ownMatch(h btree.Header) bool {
	if h.OwnVersion == r.ownWant {
		return true
	}
	r.ownOK = false
	r.release()
	r.lastErr = fmt.Errorf("%w: group %d's ownership version is %d, the directory's %d", ErrNotOwner, r.gr.group, h.OwnVersion, r.ownWant)
	r.err = r.lastErr
	r.st = osDone
	return false
}

// answer takes the walk's answer: at once for stale-ok, after the promise
// check for a linearizable read.
func (r *OrderedReader) answer() {
	r.res.Reads, r.res.Lists = r.runReads, r.posted
	if r.kind == okLookup {
		r.res.Found = r.lkFound
		r.res.Value, r.res.Version = nil, 0
		if r.lkFound {
			r.res.Value, r.res.Version = r.lkEntry.Value, r.lkEntry.Version
		}
	} else if r.kind != okDir {
		r.res.Pairs, r.res.Scanned, r.res.Leaves = r.pairs, r.hdr.Applied, r.walk.Leaves
		r.notePerLeaf()
	}
	if r.m == r.gr.home {
		r.gr.homeWait = 0
	}
	if r.mode == Linearizable {
		r.st = osConfirm
		return
	}
	r.st = osDone
}

// Lookup runs a lookup to the end in real time (LookupCtx without a
// context).
func (r *OrderedReader) Lookup(key []byte, mode Consistency) (OrderedResult, error) {
	return r.LookupCtx(context.Background(), key, mode)
}

// LookupCtx looks key up, giving up when ctx ends (its error).
func (r *OrderedReader) LookupCtx(ctx context.Context, key []byte, mode Consistency) (OrderedResult, error) {
	r.BeginLookup(key, mode)
	return r.drive(ctx)
}

// LookupUntil looks key up like LookupCtx, also giving up when stop
// closes (ErrStopped; nil: never) or once deadline passed (an error
// wrapping context.DeadlineExceeded; zero: none), as GroupReader.GetCtx
// does: a caller bounds the call without deriving a context per call
// (the client's ordered get).
func (r *OrderedReader) LookupUntil(ctx context.Context, stop <-chan struct{}, deadline time.Time, key []byte, mode Consistency) (OrderedResult, error) {
	r.BeginLookup(key, mode)
	if err := runPolled(r, ctx, stop, deadline); err != nil {
		r.release()
		r.st = osIdle
		if errors.Is(err, errDeadline) {
			return OrderedResult{}, fmt.Errorf("%w (last cause: %v)", context.DeadlineExceeded, r.lastErr)
		}
		return OrderedResult{}, err
	}
	r.st, r.clean = osIdle, true // no read out: the next call reuses the buffers
	return r.res, r.err
}

// ScanCtx scans like BeginScan, giving up when ctx ends (its error).
func (r *OrderedReader) ScanCtx(ctx context.Context, start, end []byte, limit int, mode Consistency, reverse bool) (OrderedResult, error) {
	r.BeginScan(start, end, limit, mode, reverse)
	return r.drive(ctx)
}

// drive polls the call in real time, as GroupReader.GetCtx polls a get:
// spinning while reads complete at once (shm), then yielding, then
// sleeping briefly (tcp); a read it leaves behind lands in the reader's
// own buffers and is reaped by its next call.
func (r *OrderedReader) drive(ctx context.Context) (OrderedResult, error) {
	if err := runPolled(r, ctx, nil, time.Time{}); err != nil {
		r.release()
		r.st = osIdle
		return OrderedResult{}, err
	}
	r.st, r.clean = osIdle, true // no read out: the next call reuses the buffers
	return r.res, r.err
}

// backoffUntil reports whether the call waits between attempts, and until
// when (runPolled).
func (r *OrderedReader) backoffUntil() (time.Duration, bool) { return r.retryAt, r.st == osWait }
