package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// Item is what a get returns.
type Item struct {
	Value []byte
	// Version identifies the write that stored Value: it grows with
	// every write of the key (and of the key's group). Use it with
	// CompareVersionAndSwap.
	Version uint64
	// Replica is the node read.
	Replica rdma.NodeID
	// Applied is the last entry of the group the replica had applied:
	// Value is the key's value after that entry. AppliedAt is when the
	// replica applied it (its wall clock).
	Applied   uint64
	AppliedAt time.Time
	// Behind (stale-ok gets) is how many entries of the group this
	// client knows of (from its writes' replies and its linearizable
	// gets) that the replica had not applied: a lower bound of its lag.
	Behind uint64
}

// Age is how long before now the replica read had applied its last entry
// (for a stale-ok get, a bound of how old the value may be as long as
// writes keep arriving).
func (it Item) Age() time.Duration { return time.Since(it.AppliedAt) }

// WriteResult is what a write returns.
type WriteResult struct {
	// Version is the version the write gave the key (for a batch, the
	// version of its first write in each group: see Batch).
	Version uint64
	// Prev is the version the key had before (0: it had none).
	Prev uint64
}

// Get returns key's value with the client's default consistency
// (linearizable unless WithConsistency). ErrNotFound if it has none; a
// found empty value is []byte{}, never nil (nil means "absent" to CompareAndSwap).
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	it, err := c.GetItem(ctx, key, c.o.consistency)
	return it.Value, err
}

// GetItem returns key's value, version and the replica's position, read
// with the given consistency.
func (c *Client) GetItem(ctx context.Context, key []byte, mode Consistency) (Item, error) {
	if err := c.checkKey(key); err != nil {
		return Item{}, err
	}
	if err := ctx.Err(); err != nil {
		return Item{}, err // a done context: nothing is read
	}
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return Item{}, ErrClosed
	}
	var deadline time.Time
	if _, ok := ctx.Deadline(); !ok {
		deadline = time.Now().Add(c.o.timeout)
	}
	g := c.m.GroupOf(key)
	r := c.reader(g)
	defer c.putReader(g, r)
	res, err := r.GetCtx(ctx, c.done, deadline, key, mode)
	if err != nil {
		if c.isClosed() {
			return Item{}, ErrClosed
		}
		return Item{}, &UnavailableError{Group: g, Err: err}
	}
	it := Item{Version: res.Version, Replica: c.m.Groups[g][res.Member], Applied: res.Applied, AppliedAt: time.Unix(0, res.AppliedAt)}
	known := c.known(g, 0)
	if mode == Linearizable {
		c.known(g, res.Applied)
	} else if known > res.Applied {
		it.Behind = known - res.Applied
	}
	if !res.Found {
		return it, ErrNotFound
	}
	// A found value is never nil, even when empty: nil means "absent" to
	// CompareAndSwap, so what Get returned must round-trip as its old value.
	it.Value = append(make([]byte, 0, len(res.Value)), res.Value...)
	return it, nil
}

func (c *Client) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// known raises group g's highest known entry index to at least idx and
// returns it.
func (c *Client) known(g uint32, idx uint64) uint64 {
	k := &c.knownTab[g]
	for {
		cur := k.Load()
		if idx <= cur || k.CompareAndSwap(cur, idx) {
			return max(cur, idx)
		}
	}
}

// readerPool keeps a group's idle readers (each with its own Conns): a
// get takes one, and gives it back unless maxIdleReaders are idle.
type readerPool struct {
	mu   sync.Mutex
	free []*kv.GroupReader
}

const maxIdleReaders = 64

func (c *Client) reader(g uint32) *kv.GroupReader {
	p := &c.pools[g]
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		r := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	r := kv.NewGroupReader(c.node, g, c.m.Groups[g], c.o.near)
	r.BackoffMin, r.BackoffMax = c.o.backoffMin, c.o.backoffMax
	return r
}

func (c *Client) putReader(g uint32, r *kv.GroupReader) {
	p := &c.pools[g]
	p.mu.Lock()
	if !c.isClosed() && len(p.free) < maxIdleReaders {
		p.free = append(p.free, r)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	r.Close()
}

// Put stores value under key.
func (c *Client) Put(ctx context.Context, key, value []byte) (WriteResult, error) {
	if err := c.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	return c.single(ctx, kv.Op{Kind: kv.OpPut, Key: key, Value: value}, nil)
}

// Delete removes key (a key without a value is not an error: Prev is 0).
func (c *Client) Delete(ctx context.Context, key []byte) (WriteResult, error) {
	return c.single(ctx, kv.Op{Kind: kv.OpDelete, Key: key}, nil)
}

// CompareAndSwap stores value under key if the key's current value is old
// (old == nil: if the key has no value). ErrCASMismatch otherwise.
func (c *Client) CompareAndSwap(ctx context.Context, key, old, value []byte) (WriteResult, error) {
	if err := c.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	op := kv.Op{Kind: kv.OpPut, Cmp: kv.CmpValue, Key: key, Value: value, CmpValue: old}
	if old == nil {
		op.CmpVersion = 1
	}
	return c.single(ctx, op, nil)
}

// CompareVersionAndSwap stores value under key if the key's current
// version is version (0: if the key has no value).
func (c *Client) CompareVersionAndSwap(ctx context.Context, key []byte, version uint64, value []byte) (WriteResult, error) {
	if err := c.checkValue(value); err != nil {
		return WriteResult{}, err
	}
	return c.single(ctx, kv.Op{Kind: kv.OpPut, Cmp: kv.CmpVersion, Key: key, Value: value, CmpVersion: version}, nil)
}

// CompareAndDelete removes key if its current version is version.
func (c *Client) CompareAndDelete(ctx context.Context, key []byte, version uint64) (WriteResult, error) {
	return c.single(ctx, kv.Op{Kind: kv.OpDelete, Cmp: kv.CmpVersion, Key: key, CmpVersion: version}, nil)
}

// single makes one single-key write: of a hashed key (ks nil) or of
// ordered keyspace ks's key (op.Key the user's key). A write that fits one
// request slot goes through the write combiner (combine.go), a larger one
// as a request of its own in parts (write).
func (c *Client) single(ctx context.Context, op kv.Op, ks *Keyspace) (WriteResult, error) {
	if ks == nil {
		if err := c.checkKey(op.Key); err != nil {
			return WriteResult{}, err
		}
		return c.singleTo(ctx, c.m.GroupOf(op.Key), op, nil)
	}
	if err := ks.checkKey(op.Key); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err // a done context: nothing is sent
	}
	// The group of the key's tablet, by the client's directory; a group
	// that answers StatusMoved applied nothing: read the directory again
	// and send the write to the group it names. A tablet being moved
	// (StatusMoving, or a range no group serves for a moment) applied
	// nothing either: wait, read the directory again and send again,
	// until the call's deadline (ErrTabletMoving then).
	var kb [128]byte // the internal key of a usual key, without an allocation
	ik := ks.ks.InternalKey(kb[:0], op.Key)
	deadline := time.Now().Add(c.o.timeout)
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl
	}
	g, d, err := ks.route(ctx, ik)
	waits := 0
	for tries := 0; ; tries++ {
		var wr WriteResult
		if err == nil {
			wr, err = c.singleTo(ctx, g, op, ks)
		}
		moving := errors.Is(err, ErrTabletMoving) || errors.Is(err, btree.ErrTabletMoving)
		moved := errors.Is(err, ErrKeyMoved) && ks.force == nil
		if !moving && !moved {
			return wr, err
		}
		if moving || tries >= 2 {
			// Same group named again after StatusMoved: the directory
			// was read from a replica behind the one written to.
			if moved && tries >= 200 {
				return wr, err
			}
			if werr := ks.moveWait(ctx, deadline, waits, err); werr != nil {
				return WriteResult{}, werr
			}
			waits++
		}
		if d == nil {
			d = ks.c.ord.dir.Load()
		}
		if _, rerr := ks.refreshDir(ctx, d); rerr != nil {
			return WriteResult{}, rerr
		}
		ng, nd, rerr := ks.route(ctx, ik)
		if moved && rerr == nil && ng == g && tries < 2 {
			tries = 2 // wait from now on
		}
		g, d, err = ng, nd, rerr
	}
}

// singleTo sends one single-key write to group g.
func (c *Client) singleTo(ctx context.Context, g uint32, op kv.Op, ks *Keyspace) (WriteResult, error) {
	extra := 0 // the key's bytes on the wire beyond the user's
	if ks != nil {
		extra = cluster.KeyspacePrefix
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err // a done context: nothing is sent
	}
	var r kv.Result
	if 4+24+pad8(len(op.Key)+extra)+pad8(len(op.Value))+pad8(len(op.CmpValue)) <= multicast.MaxPayload(c.m.Limits.SlotSize) {
		deadline, err := c.enter(ctx)
		if err != nil {
			return WriteResult{}, err
		}
		r, _, err = c.combine(ctx, deadline, g, op, ks)
		c.exit()
		if err != nil {
			return WriteResult{}, err
		}
	} else {
		rs, err := c.writeTo(ctx, []kv.Op{op}, ks, g)
		if err != nil {
			return WriteResult{}, err
		}
		r = rs[0].res
	}
	switch r.Status {
	case kv.StatusOK:
		return WriteResult{Version: r.Version, Prev: r.Prev}, nil
	case kv.StatusCondFailed:
		return WriteResult{Prev: r.Prev}, ErrCASMismatch
	}
	return WriteResult{}, c.statusErr(g, r, ks, op.Key)
}

func pad8(n int) int { return (n + 7) &^ 7 }

// statusErr is the error of group g's result r of a write (not OK, not a
// failed condition) whose failed op's key is key (the user's), of ordered
// keyspace ks (nil: hashed).
func (c *Client) statusErr(g uint32, r kv.Result, ks *Keyspace, key []byte) error {
	switch r.Status {
	case kv.StatusRefused:
		if ks != nil && r.Limit == kv.LimitKey && r.Max >= cluster.KeyspacePrefix && r.Size >= cluster.KeyspacePrefix {
			r.Max, r.Size = r.Max-cluster.KeyspacePrefix, r.Size-cluster.KeyspacePrefix // the user's bytes
		}
		return refusedError(g, r)
	case kv.StatusMalformed:
		if ks != nil {
			return fmt.Errorf("rdmakv: group %d refused the ordered request as malformed (nothing applied; does it run an ordered keyspace?)", g)
		}
		return fmt.Errorf("rdmakv: group %d refused the request as malformed (nothing applied there)", g)
	case kv.StatusMoved:
		if ks != nil {
			return fmt.Errorf("%w: group %d does not own key %q of keyspace %q (StatusMoved; nothing written)", ErrKeyMoved, g, key, ks.ks.Name)
		}
	case kv.StatusMoving:
		if ks != nil {
			return fmt.Errorf("%w: group %d: key %q of keyspace %q is in a tablet frozen for a move (StatusMoving; nothing written)", ErrTabletMoving, g, key, ks.ks.Name)
		}
	}
	return fmt.Errorf("rdmakv: group %d answered status %d", g, r.Status)
}

type groupResult struct {
	group uint32
	index uint64
	res   kv.Result
}

// write multicasts a request of ops, applied atomically, to the groups of
// their keys and decodes every group's result: a request of hashed keys
// (ks nil), or of ordered keyspace ks's keys (the user's) to its group.
// A refused or malformed request, or an op on a key the group does not
// own, is an error; a failed condition is a result.
func (c *Client) write(ctx context.Context, ops []kv.Op, ks *Keyspace) ([]groupResult, error) {
	return c.writeTo(ctx, ops, ks, 0)
}

// writeTo is write, of ordered keys to group og (ks not nil).
func (c *Client) writeTo(ctx context.Context, ops []kv.Op, ks *Keyspace, og uint32) ([]groupResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // a done context: nothing is sent
	}
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	var dst tree.Set
	var payload []byte
	if ks == nil {
		for i := range ops {
			dst |= tree.Of(c.m.GroupOf(ops[i].Key))
		}
		payload = kv.AppendRequest(make([]byte, 0, kv.RequestSize(ops)), ops)
	} else {
		dst = tree.Of(og)
		bops := make([]btree.Op, len(ops))
		for i := range ops {
			o := &ops[i]
			bops[i] = btree.Op{Kind: o.Kind, Cmp: o.Cmp, Key: ks.ks.InternalKey(nil, o.Key), Value: o.Value, CmpVersion: o.CmpVersion, CmpValue: o.CmpValue}
		}
		payload = btree.AppendRequest(make([]byte, 0, btree.RequestSize(bops)), bops)
	}
	if lim := kv.DefaultMaxRequest(c.m.Limits.MaxKey, c.m.Limits.MaxValue); len(payload) > lim {
		return nil, fmt.Errorf("%w: the request takes %d bytes, the limit is %d (max_key + max_value + 4 KiB)", ErrBatchTooLarge, len(payload), lim)
	}
	if len(payload) > multicast.MaxPayload(c.m.Limits.SlotSize) {
		// Held until the commit is answered: a group keeps at most
		// kv.MaxStages staged requests of a client slot, and more at
		// once would evict some before their commits.
		if err := c.stages.acquire(ctx, c.done); err != nil {
			return nil, err
		}
		defer c.stages.release()
		var err error
		if payload, err = c.stage(ctx, dst, payload); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err // the parts are sent, not the commit: nothing is applied
		}
	}
	o, err := c.multicast(ctx, dst, payload)
	if err != nil {
		switch {
		case errors.Is(err, multicast.ErrClosed) || c.isClosed():
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrClosed)
		case errors.Is(err, multicast.ErrRestarted):
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		case errors.Is(err, multicast.ErrDiskFull):
			return nil, diskFullErr(err)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
		}
		return nil, err
	}
	out := make([]groupResult, 0, len(o.Replies))
	for _, rp := range o.Replies {
		if !dst.Has(rp.Group) {
			continue
		}
		// (an ordered request's result is laid out as kv's)
		res, err := kv.DecodeResult(rp.Result)
		if err != nil {
			return nil, fmt.Errorf("rdmakv: group %d's reply: %w", rp.Group, err)
		}
		if res.Status != kv.StatusMalformed {
			c.known(rp.Group, rp.Index)
		}
		switch res.Status {
		case kv.StatusOK, kv.StatusCondFailed:
			out = append(out, groupResult{group: rp.Group, index: rp.Index, res: res})
			continue
		}
		// Refused: every group checks every op against the key, value
		// and request limits, so none applied its share.
		var key []byte
		if res.FailedOp < len(ops) {
			key = ops[res.FailedOp].Key
		}
		return nil, c.statusErr(rp.Group, res, ks, key)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("rdmakv: no reply from the request's groups")
	}
	// The first op's group first (single-key calls read rs[0]).
	first := c.m.GroupOf(ops[0].Key)
	if ks != nil {
		first = og
	}
	for i := range out {
		if out[i].group == first {
			out[0], out[i] = out[i], out[0]
		}
	}
	return out, nil
}

// stageLimiter bounds a client's requests staged at once to kv.MaxStages
// (its zero value is ready).
type stageLimiter struct {
	once sync.Once
	ch   chan struct{}
}

// acquire waits for room for one more staged request; nothing was sent
// if it fails.
func (l *stageLimiter) acquire(ctx context.Context, done <-chan struct{}) error {
	l.once.Do(func() { l.ch = make(chan struct{}, kv.MaxStages) })
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *stageLimiter) release() { <-l.ch }

// stagedInFlight bounds the parts of one request in flight at once.
const stagedInFlight = 4

// stage sends a request too large for one slot in parts to every group of
// dst and returns the commit message that applies it. If it fails, no
// commit was sent and nothing is applied (the groups drop the parts when
// this slot's later requests evict them).
func (c *Client) stage(ctx context.Context, dst tree.Set, req []byte) ([]byte, error) {
	id := kv.StageID{Client: uint32(c.o.slot), Inc: c.inc, Stage: c.stageSeq.Add(1)}
	chunk := multicast.MaxPayload(c.m.Limits.SlotSize) - kv.PartOverhead
	sem := make(chan struct{}, stagedInFlight)
	errc := make(chan error, (len(req)+chunk-1)/chunk)
	n := 0
	for off := 0; off < len(req); off += chunk {
		part := kv.AppendPart(nil, id, len(req), off, req[off:min(off+chunk, len(req))])
		n++
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			o, err := c.multicast(ctx, dst, part)
			if err == nil {
				for _, rp := range o.Replies {
					if r, derr := kv.DecodeResult(rp.Result); derr == nil && r.Status == kv.StatusRefused {
						err = refusedError(rp.Group, r)
					} else if derr != nil || r.Status != kv.StatusOK {
						err = fmt.Errorf("rdmakv: group %d refused a part of a %d-byte request (status %d, %v)", rp.Group, len(req), r.Status, derr)
					}
				}
			}
			errc <- err
		}()
	}
	var first error
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		if c.isClosed() {
			return nil, ErrClosed
		}
		return nil, first
	}
	return kv.AppendCommit(nil, id, len(req)), nil
}
