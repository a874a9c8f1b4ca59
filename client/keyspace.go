package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
)

// Errors of ordered keyspaces.
var (
	// ErrUnknownKeyspace: the cluster map declares no keyspace of that
	// name (the error names the ones it declares).
	ErrUnknownKeyspace = errors.New("rdmakv: unknown keyspace")
	// ErrKeyMoved: the group the client sent an ordered write to does not
	// own the key's range (StatusMoved), also after the client read the
	// groups' tablets again; nothing was written.
	ErrKeyMoved = errors.New("rdmakv: ordered key not owned by the group written to")
	// ErrTabletMoving: the key's tablet was being moved between groups
	// until the call's deadline (a write to a frozen tablet, or a range
	// no group served yet); nothing was written. The client waits and
	// retries until then: a move takes about the time of reading and
	// writing the tablet's entries once.
	ErrTabletMoving = errors.New("rdmakv: the key's tablet is moving between groups")
	// ErrBatchSpansGroups: a Commit's keys lie in tablets of several
	// groups (an ordered batch is applied by one group; nothing was
	// written).
	ErrBatchSpansGroups = errors.New("rdmakv: ordered batch spans the tablets of several groups")
)

// KV is one pair of a scan.
type KV struct {
	Key, Value []byte
	// Version identifies the write that stored Value (as Item.Version).
	Version uint64
}

// Keyspace is a handle on a named ordered keyspace of the cluster (a
// [[keyspace]] of kind "ordered" in the kvserver config): its keys are
// kept sorted, so besides Get, Put, Delete and the compare-and-swaps it
// has Scan. Keys of different keyspaces, and of the default (hashed)
// keyspace, never collide. The keyspace is cut into tablets (key ranges,
// its split points in the config) that the groups own; the client's
// directory of them, read one-sided from the groups' headers, says which
// group a key's writes go to (through that group's ordering) and whose
// B-link tree its reads walk one-sided.
//
// Ordered keys are at most Map().OrderedMaxKey() bytes (255 unless the
// cluster's max_key is smaller) and values at most Map().OrderedMaxValue()
// (they live in the tree's leaves). A Keyspace is safe for concurrent use.
type Keyspace struct {
	c   *Client
	ks  cluster.Keyspace
	err error // the keyspace is unknown: every call fails with it
	// force, if set, is the group every key routes to (tests: a group
	// that does not own the key answers StatusMoved).
	force *uint32
}

// Keyspace returns the handle of the ordered keyspace name. If the
// cluster map declares no such keyspace, every call on the handle fails
// with an error wrapping ErrUnknownKeyspace that names the declared ones.
func (c *Client) Keyspace(name string) *Keyspace {
	ks, err := c.m.FindKeyspace(name)
	if err != nil {
		return &Keyspace{c: c, err: fmt.Errorf("%w: %v", ErrUnknownKeyspace, err)}
	}
	return &Keyspace{c: c, ks: ks}
}

// Name is the keyspace's name.
func (k *Keyspace) Name() string { return k.ks.Name }

// ordered is a client's state for ordered keyspaces: the directory of
// tablets, and per group the cache of inner nodes its readers share,
// their delegation, and idle readers.
type ordered struct {
	once   sync.Once
	life   context.Context // ended when the client closes
	groups []*ordGroup     // by group id
	dir    atomic.Pointer[btree.Directory]
	dirMu  sync.Mutex // one refresh at a time
	dirGen atomic.Uint64
	// plantDir, if set, changes every directory the client builds
	// (tests: a gap, a planted bug).
	plantDir func(*btree.Directory) *btree.Directory
	// plantReader, if set, is called on the reader of each get and scan
	// page before its call (tests: a planted bug).
	plantReader func(*kv.OrderedReader)
	// moveHook, if set, is called before each step of a tablet move
	// (tests: writes and reads between the steps).
	moveHook func(step string)
	// activateFirst plants a bug in the client's tablet moves: the
	// target serves the tablet before the source drops it.
	activateFirst bool
	// undoUnchecked plants a bug in the balancer's undoing of a move
	// (undoMove): the target forgets the tablet even if the source's
	// ownership changed (it dropped the tablet).
	undoUnchecked bool
	// What the one-sided reads that answered did (Client.Stats): gets and
	// scan pages, their node reads and their lists of reads (round trips).
	gets, getReads, getLists    atomic.Uint64
	getHits                     atomic.Uint64 // gets that read at most one node
	pages, pageReads, pageLists atomic.Uint64
	ready                       atomic.Bool // groups are set (Stats reads them)
}

// ordGroup is a client's state for one group's tree.
type ordGroup struct {
	cache *btree.Cache
	deleg *kv.Delegation
	mu    sync.Mutex
	free  []*kv.OrderedReader
}

// orderedCacheBytes bounds a client's cache of inner nodes.
const orderedCacheBytes = 16 << 20

func (k *Keyspace) init() {
	c := k.c
	o := &c.ord
	o.once.Do(func() {
		o.groups = make([]*ordGroup, len(c.m.Groups))
		for g := range o.groups {
			o.groups[g] = &ordGroup{cache: btree.NewCache(orderedCacheBytes / len(o.groups)), deleg: kv.NewDelegation()}
		}
		o.ready.Store(true)
		var cancel context.CancelFunc
		o.life, cancel = context.WithCancel(context.Background())
		go func() {
			<-c.done
			cancel()
		}()
	})
}

func (k *Keyspace) reader(g uint32) *kv.OrderedReader {
	c := k.c
	k.init()
	og := c.ord.groups[g]
	og.mu.Lock()
	if n := len(og.free); n > 0 {
		r := og.free[n-1]
		og.free = og.free[:n-1]
		og.mu.Unlock()
		return r
	}
	og.mu.Unlock()
	r := kv.NewOrderedReader(c.node, g, c.m.Groups[g], c.o.near, og.cache)
	r.SetDelegation(og.deleg)
	r.Reader().BackoffMin, r.Reader().BackoffMax = c.o.backoffMin, c.o.backoffMax
	return r
}

func (k *Keyspace) putReader(g uint32, r *kv.OrderedReader) {
	og := k.c.ord.groups[g]
	og.mu.Lock()
	if !k.c.isClosed() && len(og.free) < maxIdleReaders {
		og.free = append(og.free, r)
		og.mu.Unlock()
		return
	}
	og.mu.Unlock()
	r.Close()
}

// closeOrdered closes the idle ordered readers (Close, every call over).
func (c *Client) closeOrdered() {
	o := &c.ord
	if !o.ready.Load() {
		return
	}
	for _, og := range o.groups {
		og.mu.Lock()
		for _, r := range og.free {
			r.Close()
		}
		og.free = nil
		og.mu.Unlock()
	}
}

// directory is the client's directory of tablets, read from the groups'
// headers at first use.
func (k *Keyspace) directory(ctx context.Context) (*btree.Directory, error) {
	k.init()
	if d := k.c.ord.dir.Load(); d != nil {
		return d, nil
	}
	return k.refreshDir(ctx, nil)
}

// dirReadTimeout bounds the read of one group's tablets in a refresh.
const dirReadTimeout = 2 * time.Second

// refreshDir reads every group's tablets again (one-sided, from the
// header region of one member each, the groups in parallel) and installs
// their union, unless another call replaced seen (the directory the
// caller found wrong) meanwhile. A group whose read fails keeps the
// tablets the old directory had for it, or, at the first read, those the
// map places on it (after moves that placement is old, and the
// generations of the other groups' tablets win over it), so that a
// group that is down fails only the calls on its own keys.
func (k *Keyspace) refreshDir(ctx context.Context, seen *btree.Directory) (*btree.Directory, error) {
	return k.refreshDirMode(ctx, seen, kv.StaleOK)
}

// refreshDirMode is refreshDir reading each group's tablets in mode:
// routing reads them stale-ok (a hint: every node read checks the
// group's ownership version), Tablets and the move steps linearizably
// (they must see every tablet change acknowledged before they began).
func (k *Keyspace) refreshDirMode(ctx context.Context, seen *btree.Directory, mode kv.Consistency) (*btree.Directory, error) {
	c := k.c
	o := &c.ord
	o.dirMu.Lock()
	defer o.dirMu.Unlock()
	if d := o.dir.Load(); d != nil && d != seen && mode != kv.Linearizable {
		return d, nil // another caller refreshed it meanwhile
	}
	old := o.dir.Load()
	n := len(c.m.Groups)
	res := make([]kv.OrderedResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			gctx, cancel := context.WithTimeout(ctx, dirReadTimeout)
			defer cancel()
			r := k.reader(uint32(g))
			res[g], errs[g] = r.DirCtxMode(gctx, mode)
			if errs[g] == nil {
				res[g].Tablets = slices.Clone(res[g].Tablets)
			}
			k.putReader(uint32(g), r)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	groups, versions, owns := map[uint32][]btree.Tablet{}, map[uint32]uint64{}, map[uint32]uint64{}
	for g := range n {
		gid := uint32(g)
		if errs[g] == nil {
			groups[gid], versions[gid], owns[gid] = res[g].Tablets, res[g].DirVersion, res[g].OwnVersion
			continue
		}
		if old != nil {
			for _, p := range old.Tablets() {
				if p.Group == gid {
					tb := p.Tablet
					tb.HasLoad = false // counts of an older read: not this one's
					groups[gid] = append(groups[gid], tb)
				}
			}
			versions[gid], owns[gid] = old.Version(gid), old.OwnVersion(gid)
			continue
		}
		for _, p := range c.m.OrderedTablets() {
			if p.Group == gid {
				groups[gid] = append(groups[gid], p.Tablet)
			}
		}
	}
	d, err := btree.NewDirectoryOwned(groups, versions, owns)
	if err != nil {
		return nil, fmt.Errorf("rdmakv: the groups' tablets: %w", err)
	}
	if o.plantDir != nil {
		d = o.plantDir(d)
	}
	o.dir.Store(d)
	o.dirGen.Add(1)
	return d, nil
}

// route is the group owning internal key ik: the directory's, read again
// if the key lies in a gap of it: stale-ok first (cheap, and usually
// enough), then linearizably (a near replica that has not applied a
// move's last step shows the moved tablet in neither group).
func (k *Keyspace) route(ctx context.Context, ik []byte) (uint32, *btree.Directory, error) {
	d, err := k.directory(ctx)
	if err != nil {
		return 0, nil, err
	}
	if k.force != nil {
		return *k.force, d, nil
	}
	g, err := d.Route(ik)
	// A gap is read again at once (stale-ok, as routing reads), then
	// linearizably after waits: the groups' tablets are read from
	// replicas that may be at different points of a tablet move (the
	// source's past its drop, the target's before the step its leader
	// acknowledged), a gap that closes as they catch up or that the
	// leaders' tablets do not have. One that stays (gapWaits) is the
	// error.
	for waits := 0; errors.Is(err, btree.ErrDirGap) && waits <= gapWaits; waits++ {
		if waits > 0 {
			if werr := k.moveWait(ctx, time.Time{}, waits-1, err); werr != nil {
				return 0, nil, werr
			}
		}
		if d, err = k.refreshDirMode(ctx, d, gapMode(waits)); err != nil {
			return 0, nil, err
		}
		g, err = d.Route(ik)
	}
	return g, d, err
}

// gapWaits bounds the waits (moveWait's, about a second in all) for a
// gap in the directory to close.
const gapWaits = 50

// gapMode is the consistency of the n-th re-read of the directory for a
// gap: the first stale-ok, as routing reads; later ones linearizable (a
// near replica that has not applied a move's last step shows the moved
// tablet in neither group, and may stay behind while paused).
func gapMode(n int) kv.Consistency {
	if n == 0 {
		return kv.StaleOK
	}
	return kv.Linearizable
}

func (k *Keyspace) checkKey(key []byte) error {
	switch {
	case k.err != nil:
		return k.err
	case len(key) == 0:
		return ErrEmptyKey
	case len(key) > k.c.m.OrderedMaxKey():
		return fmt.Errorf("%w: %d bytes, limit %d (ordered keyspace %q)", ErrKeyTooLarge, len(key), k.c.m.OrderedMaxKey(), k.ks.Name)
	}
	return nil
}

func (k *Keyspace) checkValue(v []byte) error {
	if max := k.c.m.OrderedMaxValue(); len(v) > max {
		return fmt.Errorf("%w: %d bytes, limit %d (ordered keyspace %q: values live in the tree's nodes)", ErrValueTooLarge, len(v), max, k.ks.Name)
	}
	return nil
}

// routeRead is route for a read that holds the client open (enter): the
// directory the client has, or, if it has none yet or ik lies in a gap
// of it, route's reading of the groups' tablets under the read's context
// (readCtx). With stale, the directory is read again first unless
// another call replaced stale meanwhile (a read found it wrong).
func (k *Keyspace) routeRead(ctx context.Context, ik []byte, stale *btree.Directory) (uint32, *btree.Directory, error) {
	k.init()
	if d := k.c.ord.dir.Load(); d != nil && k.force == nil && (stale == nil || d != stale) {
		if g, err := d.Route(ik); err == nil {
			return g, d, nil
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(k.c.ord.life, cancel)
	defer stop()
	if _, ok := ctx.Deadline(); !ok {
		var c2 context.CancelFunc
		rctx, c2 = context.WithTimeout(rctx, k.c.o.timeout)
		defer c2()
	}
	if stale != nil {
		if _, err := k.refreshDir(rctx, stale); err != nil {
			return 0, nil, err
		}
	}
	return k.route(rctx, ik)
}

// moveWait waits before the try-th retry of a call that met a tablet
// being moved (or a group that no longer owns the key): an error if
// ctx ends, the client closes, or the wait would end past deadline
// (zero: none).
func (k *Keyspace) moveWait(ctx context.Context, deadline time.Time, try int, cause error) error {
	d := min(100*time.Microsecond<<min(try, 9), 20*time.Millisecond)
	if !deadline.IsZero() && time.Now().Add(d).After(deadline) {
		return fmt.Errorf("%w (until the deadline): %w", ErrTabletMoving, cause)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-k.c.done:
		return ErrClosed
	case <-t.C:
		return nil
	}
}

// retryMove reports whether a read's error means the directory was
// stale or the key's tablet is moving: the caller reads the directory
// again and retries.
func retryMove(err error) bool {
	return errors.Is(err, kv.ErrNotOwner) || errors.Is(err, btree.ErrTabletMoving)
}

// readCtx is the context of a read: ctx with the client's default
// deadline if it has none, ended when the client closes.
func (k *Keyspace) readCtx(ctx context.Context) (context.Context, func(), error) {
	c := k.c
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	k.init()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ord.life, cancel)
	return ctx, func() { stop(); cancel(); end() }, nil
}

// readErr is the error of a failed one-sided read of group g.
func (k *Keyspace) readErr(g uint32, err error) error {
	if k.c.isClosed() {
		return ErrClosed
	}
	return &UnavailableError{Group: g, Err: err}
}

// Get returns key's value with the client's default consistency.
// ErrNotFound if it has none; a found empty value is []byte{}.
func (k *Keyspace) Get(ctx context.Context, key []byte) ([]byte, error) {
	it, err := k.GetItem(ctx, key, k.c.o.consistency)
	return it.Value, err
}

// GetItem returns key's value, version and the replica's position, read
// one-sided with the given consistency (as Client.GetItem: a linearizable
// get sees every write acknowledged before it began; a stale-ok get reads
// the near replica, and Item.Behind and Item.Age say how far it may lag).
func (k *Keyspace) GetItem(ctx context.Context, key []byte, mode Consistency) (Item, error) {
	if err := k.checkKey(key); err != nil {
		return Item{}, err
	}
	if err := ctx.Err(); err != nil {
		return Item{}, err // a done context: nothing is read
	}
	// The call is bounded as a hashed get is: the client's deadline
	// (unless ctx has one) and its close are handed to the reader, not
	// wrapped in contexts made per call (they were a fifth of a warm
	// lookup's cost).
	c := k.c
	d, err := c.enter(ctx)
	if err != nil {
		return Item{}, err
	}
	defer c.exit()
	var deadline time.Time
	if _, ok := ctx.Deadline(); !ok {
		deadline = d
	}
	var kb [128]byte // the internal key of a usual key, without an allocation
	ik := k.ks.InternalKey(kb[:0], key)
	var g uint32
	var res kv.OrderedResult
	var stale *btree.Directory
	for try := 0; ; try++ {
		var dir *btree.Directory
		g, dir, err = k.routeRead(ctx, ik, stale)
		if err == nil {
			// The group's reads check that it still owns what dir says
			// it owns (a tablet that moved away fails the check).
			r := k.reader(g)
			r.SetOwnVersion(dir.OwnVersion(g))
			if k.c.ord.plantReader != nil {
				k.c.ord.plantReader(r)
			}
			res, err = r.LookupUntil(ctx, c.done, deadline, ik, mode)
			if err == nil {
				// res aliases r's buffers until its next call: r goes
				// back to the pool once the value is copied.
				defer k.putReader(g, r)
				break
			}
			k.putReader(g, r)
			if !retryMove(err) {
				return Item{}, k.readErr(g, err)
			}
		} else if !errors.Is(err, btree.ErrTabletMoving) {
			return Item{}, err
		}
		if werr := k.moveWait(ctx, d, try, err); werr != nil {
			return Item{}, werr
		}
		stale = dir
		if stale == nil {
			stale = k.c.ord.dir.Load()
		}
	}
	c.ord.gets.Add(1)
	c.ord.getReads.Add(uint64(res.NodeReads))
	if res.NodeReads <= 1 {
		c.ord.getHits.Add(1)
	}
	c.ord.getLists.Add(uint64(res.Lists))
	it := Item{Version: res.Version, Replica: c.m.Groups[g][res.Member], Applied: res.Applied, AppliedAt: timeOf(res.AppliedAt)}
	known := c.known(g, 0)
	if mode == Linearizable {
		c.known(g, res.Applied)
	} else if known > res.Applied {
		it.Behind = known - res.Applied
	}
	if !res.Found {
		return it, ErrNotFound
	}
	it.Value = append(make([]byte, 0, len(res.Value)), res.Value...)
	return it, nil
}

// Put stores value under key. Single-key writes (Put, Delete and the
// compare-and-swaps) of ordered and hashed keys go through the client's
// write combiner: under load one message to the group carries many of
// them, each with its own condition and result.
func (k *Keyspace) Put(ctx context.Context, key, value []byte) (WriteResult, error) {
	if err := k.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	return k.c.single(ctx, kv.Op{Kind: kv.OpPut, Key: key, Value: value}, k)
}

// Delete removes key (a key without a value is not an error: Prev is 0).
func (k *Keyspace) Delete(ctx context.Context, key []byte) (WriteResult, error) {
	return k.c.single(ctx, kv.Op{Kind: kv.OpDelete, Key: key}, k)
}

// CompareAndSwap stores value under key if the key's current value is old
// (old == nil: if the key has no value). ErrCASMismatch otherwise.
func (k *Keyspace) CompareAndSwap(ctx context.Context, key, old, value []byte) (WriteResult, error) {
	if err := k.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	op := kv.Op{Kind: kv.OpPut, Cmp: kv.CmpValue, Key: key, Value: value, CmpValue: old}
	if old == nil {
		op.CmpVersion = 1
	}
	return k.c.single(ctx, op, k)
}

// CompareVersionAndSwap stores value under key if the key's current
// version is version (0: if the key has no value).
func (k *Keyspace) CompareVersionAndSwap(ctx context.Context, key []byte, version uint64, value []byte) (WriteResult, error) {
	if err := k.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	return k.c.single(ctx, kv.Op{Kind: kv.OpPut, Cmp: kv.CmpVersion, Key: key, Value: value, CmpVersion: version}, k)
}

// CompareAndDelete removes key if its current version is version.
func (k *Keyspace) CompareAndDelete(ctx context.Context, key []byte, version uint64) (WriteResult, error) {
	return k.c.single(ctx, kv.Op{Kind: kv.OpDelete, Cmp: kv.CmpVersion, Key: key, CmpVersion: version}, k)
}

// ScanOption configures Scan.
type ScanOption func(*scanOptions)

type scanOptions struct {
	limit   int
	reverse bool
	mode    Consistency
	page    int
}

// WithLimit returns at most n pairs (n <= 0: all).
func WithLimit(n int) ScanOption { return func(o *scanOptions) { o.limit = n } }

// Reverse scans in descending key order, from just below end down to
// start (with WithLimit: the last n pairs of the range).
func Reverse() ScanOption { return func(o *scanOptions) { o.reverse = true } }

// WithScanConsistency reads with mode instead of the client's default.
func WithScanConsistency(mode Consistency) ScanOption {
	return func(o *scanOptions) { o.mode = mode }
}

// ScanPage is how many pairs one read of a scan returns at most: a scan
// of more is a sequence of reads, each of the rest of the range.
const ScanPage = 128

// Scan returns the pairs with start <= key < end in ascending key order
// (start nil: from the keyspace's first key; end nil: to its last), or
// descending with Reverse. Pairs are read one-sided in pages of at most
// ScanPage; each page is one read of the group's tree, linearizable (it
// reflects every write acknowledged before the page's read began and the
// tree at one point) or stale-ok (one replica's tree at one point, which
// may lag). A scan of more than one page is not one atomic snapshot: a
// later page reads a later state. An error ends the iteration: it is
// yielded once, with a zero KV.
func (k *Keyspace) Scan(ctx context.Context, start, end []byte, opts ...ScanOption) iter.Seq2[KV, error] {
	o := scanOptions{mode: k.c.o.consistency, page: ScanPage}
	for _, f := range opts {
		f(&o)
	}
	return func(yield func(KV, error) bool) {
		if err := k.checkScan(start, end); err != nil {
			yield(KV{}, err)
			return
		}
		if err := ctx.Err(); err != nil {
			yield(KV{}, err) // a done context: nothing is read
			return
		}
		lo, hi := k.ks.Range(start, end)
		left := o.limit
		gaps := 0  // the directory was read again for a gap at this piece
		moves := 0 // retries of this piece for a move (moveWait)
		var moveDeadline time.Time
		for {
			d, err := k.directory(ctx)
			if err != nil {
				yield(KV{}, err)
				return
			}
			// The piece of the range one group answers next: a scan
			// crossing tablets continues at the next one's fence, and a
			// range no tablet holds is read again (stale-ok, then
			// linearizably, as route does), then an error (never
			// skipped).
			g, plo, phi, last, err := d.Piece(lo, hi, o.reverse)
			if errors.Is(err, btree.ErrDirGap) && gaps <= gapWaits {
				// Read again at once, then after waits (route).
				if gaps > 0 {
					if werr := k.moveWait(ctx, time.Time{}, gaps-1, err); werr != nil {
						yield(KV{}, werr)
						return
					}
				}
				mode := gapMode(gaps)
				gaps++
				if _, err := k.refreshDirMode(ctx, d, mode); err != nil {
					yield(KV{}, err)
					return
				}
				continue
			}
			n := o.page
			if left > 0 && left < n {
				n = left
			}
			var pairs []KV
			if err == nil {
				pairs, err = k.scanPage(ctx, d, g, plo, phi, n, o.mode, o.reverse)
			}
			if retryMove(err) {
				// The piece's tablet moved (the group read no longer
				// owns what d says), or is moving: wait, read the
				// directory again, and read the piece where it is now.
				if moveDeadline.IsZero() {
					moveDeadline = time.Now().Add(k.c.o.timeout)
					if dl, ok := ctx.Deadline(); ok {
						moveDeadline = dl
					}
				}
				if werr := k.moveWait(ctx, moveDeadline, moves, err); werr != nil {
					yield(KV{}, werr)
					return
				}
				moves++
				if _, err := k.refreshDir(ctx, d); err != nil {
					yield(KV{}, err)
					return
				}
				continue
			}
			if errors.Is(err, btree.ErrDirGap) {
				yield(KV{}, fmt.Errorf("rdmakv: scan of keyspace %q: %w", k.ks.Name, err))
				return
			}
			if err != nil {
				yield(KV{}, err)
				return
			}
			gaps, moves, moveDeadline = 0, 0, time.Time{}
			for _, p := range pairs {
				if !yield(p, nil) {
					return
				}
			}
			if left > 0 {
				if left -= len(pairs); left == 0 {
					return
				}
			}
			if len(pairs) < n {
				// The piece is done: the scan goes on at its fence.
				if last {
					return
				}
				if o.reverse {
					hi = plo
				} else {
					lo = phi
				}
				continue
			}
			lastKey := k.ks.InternalKey(nil, pairs[len(pairs)-1].Key)
			if o.reverse {
				hi = lastKey // exclusive: the rest is below it
			} else {
				lo = append(lastKey, 0) // the next key after it
			}
			if hi != nil && string(lo) >= string(hi) {
				return
			}
		}
	}
}

func (k *Keyspace) checkScan(start, end []byte) error {
	switch {
	case k.err != nil:
		return k.err
	case len(start) > k.c.m.OrderedMaxKey():
		return fmt.Errorf("%w: scan start of %d bytes, limit %d", ErrKeyTooLarge, len(start), k.c.m.OrderedMaxKey())
	case len(end) > k.c.m.OrderedMaxKey():
		return fmt.Errorf("%w: scan end of %d bytes, limit %d", ErrKeyTooLarge, len(end), k.c.m.OrderedMaxKey())
	}
	return nil
}

// scanPage reads at most n pairs of [lo, hi) (internal keys), copied and
// without the keyspace prefix.
func (k *Keyspace) scanPage(ctx context.Context, d *btree.Directory, g uint32, lo, hi []byte, n int, mode Consistency, reverse bool) ([]KV, error) {
	if hi != nil && string(lo) >= string(hi) {
		return nil, nil
	}
	ctx, end, err := k.readCtx(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	r := k.reader(g)
	defer k.putReader(g, r)
	r.SetOwnVersion(d.OwnVersion(g))
	if k.c.ord.plantReader != nil {
		k.c.ord.plantReader(r)
	}
	res, err := r.ScanCtx(ctx, lo, hi, n, mode, reverse)
	if errors.Is(err, kv.ErrNotOwner) {
		return nil, err
	}
	if err != nil {
		return nil, k.readErr(g, err)
	}
	k.c.ord.pages.Add(1)
	k.c.ord.pageReads.Add(uint64(res.NodeReads))
	k.c.ord.pageLists.Add(uint64(res.Lists))
	if mode == Linearizable {
		k.c.known(g, res.Applied)
	}
	// The pairs alias the reader's buffers, which go back to the pool:
	// copy them, every key and value into one allocation.
	size := 0
	for _, p := range res.Pairs {
		if len(p.Key) < cluster.KeyspacePrefix || p.Key[0] != k.ks.ID {
			return nil, fmt.Errorf("rdmakv: scan of keyspace %q returned key %q of another keyspace", k.ks.Name, p.Key)
		}
		size += len(p.Key) - cluster.KeyspacePrefix + len(p.Value)
	}
	out := make([]KV, 0, len(res.Pairs))
	buf := make([]byte, 0, size)
	for _, p := range res.Pairs {
		n := len(buf)
		buf = append(buf, p.Key[cluster.KeyspacePrefix:]...)
		key := buf[n:len(buf):len(buf)]
		n = len(buf)
		buf = append(buf, p.Value...)
		out = append(out, KV{Key: key, Value: buf[n:len(buf):len(buf)], Version: p.Version})
	}
	return out, nil
}

func timeOf(ns int64) time.Time { return time.Unix(0, ns) }
