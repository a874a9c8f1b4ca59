package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
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
	// own the key's range (StatusMoved); nothing was written. Ranges do
	// not move yet (one group owns each ordered keyspace), so this means
	// the client's map and the cluster's disagree.
	ErrKeyMoved = errors.New("rdmakv: ordered key not owned by the group written to")
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
// keyspace, never collide. Writes go through the ordering of the group
// that owns the keyspace; reads walk its B-link tree one-sided.
//
// Ordered keys are at most Map().OrderedMaxKey() bytes (255 unless the
// cluster's max_key is smaller) and values at most Map().OrderedMaxValue()
// (they live in the tree's leaves). A Keyspace is safe for concurrent use.
type Keyspace struct {
	c   *Client
	ks  cluster.Keyspace
	g   uint32
	err error // the keyspace is unknown: every call fails with it
}

// Keyspace returns the handle of the ordered keyspace name. If the
// cluster map declares no such keyspace, every call on the handle fails
// with an error wrapping ErrUnknownKeyspace that names the declared ones.
func (c *Client) Keyspace(name string) *Keyspace {
	ks, err := c.m.FindKeyspace(name)
	if err != nil {
		return &Keyspace{c: c, err: fmt.Errorf("%w: %v", ErrUnknownKeyspace, err)}
	}
	return &Keyspace{c: c, ks: ks, g: c.m.OrderedGroup()}
}

// Name is the keyspace's name.
func (k *Keyspace) Name() string { return k.ks.Name }

// ordered is a client's state for ordered keyspaces: the cache of inner
// nodes its readers share, their delegation, and idle readers.
type ordered struct {
	once  sync.Once
	life  context.Context // ended when the client closes
	cache *btree.Cache
	deleg *kv.Delegation
	mu    sync.Mutex
	free  []*kv.OrderedReader
	// What the one-sided reads that answered did (Client.Stats): gets and
	// scan pages, their node reads and their lists of reads (round trips).
	gets, getReads, getLists    atomic.Uint64
	getHits                     atomic.Uint64 // gets that read at most one node
	pages, pageReads, pageLists atomic.Uint64
	ready                       atomic.Bool // cache is set (Stats reads it)
}

// orderedCacheBytes bounds a client's cache of inner nodes.
const orderedCacheBytes = 16 << 20

func (k *Keyspace) init() {
	c := k.c
	o := &c.ord
	o.once.Do(func() {
		o.cache = btree.NewCache(orderedCacheBytes)
		o.deleg = kv.NewDelegation()
		o.ready.Store(true)
		var cancel context.CancelFunc
		o.life, cancel = context.WithCancel(context.Background())
		go func() {
			<-c.done
			cancel()
		}()
	})
}

func (k *Keyspace) reader() *kv.OrderedReader {
	c := k.c
	o := &c.ord
	k.init()
	o.mu.Lock()
	if n := len(o.free); n > 0 {
		r := o.free[n-1]
		o.free = o.free[:n-1]
		o.mu.Unlock()
		return r
	}
	o.mu.Unlock()
	r := kv.NewOrderedReader(c.node, k.g, c.m.Groups[k.g], c.o.near, o.cache)
	r.SetDelegation(o.deleg)
	r.Reader().BackoffMin, r.Reader().BackoffMax = c.o.backoffMin, c.o.backoffMax
	return r
}

func (k *Keyspace) putReader(r *kv.OrderedReader) {
	o := &k.c.ord
	o.mu.Lock()
	if !k.c.isClosed() && len(o.free) < maxIdleReaders {
		o.free = append(o.free, r)
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	r.Close()
}

// closeOrdered closes the idle ordered readers (Close, every call over).
func (c *Client) closeOrdered() {
	o := &c.ord
	o.mu.Lock()
	for _, r := range o.free {
		r.Close()
	}
	o.free = nil
	o.mu.Unlock()
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

// readErr is the error of a failed one-sided read.
func (k *Keyspace) readErr(err error) error {
	if k.c.isClosed() {
		return ErrClosed
	}
	return &UnavailableError{Group: k.g, Err: err}
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
	ctx, end, err := k.readCtx(ctx)
	if err != nil {
		return Item{}, err
	}
	defer end()
	r := k.reader()
	defer k.putReader(r)
	res, err := r.LookupCtx(ctx, k.ks.InternalKey(nil, key), mode)
	if err != nil {
		return Item{}, k.readErr(err)
	}
	c := k.c
	c.ord.gets.Add(1)
	c.ord.getReads.Add(uint64(res.NodeReads))
	if res.NodeReads <= 1 {
		c.ord.getHits.Add(1)
	}
	c.ord.getLists.Add(uint64(res.Lists))
	it := Item{Version: res.Version, Replica: c.m.Groups[k.g][res.Member], Applied: res.Applied, AppliedAt: timeOf(res.AppliedAt)}
	known := c.known(k.g, 0)
	if mode == Linearizable {
		c.known(k.g, res.Applied)
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
		for {
			n := o.page
			if left > 0 && left < n {
				n = left
			}
			pairs, err := k.scanPage(ctx, lo, hi, n, o.mode, o.reverse)
			if err != nil {
				yield(KV{}, err)
				return
			}
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
				return // the range is done
			}
			last := k.ks.InternalKey(nil, pairs[len(pairs)-1].Key)
			if o.reverse {
				hi = last // exclusive: the rest is below it
			} else {
				lo = append(last, 0) // the next key after it
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
func (k *Keyspace) scanPage(ctx context.Context, lo, hi []byte, n int, mode Consistency, reverse bool) ([]KV, error) {
	if hi != nil && string(lo) >= string(hi) {
		return nil, nil
	}
	ctx, end, err := k.readCtx(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	r := k.reader()
	defer k.putReader(r)
	res, err := r.ScanCtx(ctx, lo, hi, n, mode, reverse)
	if err != nil {
		return nil, k.readErr(err)
	}
	k.c.ord.pages.Add(1)
	k.c.ord.pageReads.Add(uint64(res.NodeReads))
	k.c.ord.pageLists.Add(uint64(res.Lists))
	if mode == Linearizable {
		k.c.known(k.g, res.Applied)
	}
	out := make([]KV, 0, len(res.Pairs))
	for _, p := range res.Pairs {
		if len(p.Key) < cluster.KeyspacePrefix || p.Key[0] != k.ks.ID {
			return nil, fmt.Errorf("rdmakv: scan of keyspace %q returned key %q of another keyspace", k.ks.Name, p.Key)
		}
		out = append(out, KV{Key: append([]byte(nil), p.Key[cluster.KeyspacePrefix:]...), Value: append([]byte{}, p.Value...), Version: p.Version})
	}
	return out, nil
}

func timeOf(ns int64) time.Time { return time.Unix(0, ns) }
