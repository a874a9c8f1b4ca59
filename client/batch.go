package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv"
)

// Batch is a list of puts and deletes applied atomically: the batch is
// multicast to every group that owns one of its keys, as one message, and
// each group applies its part at once, in the order TRAM delivered it.
// Two batches that share a group are applied in the same order by every
// group they share (and so by every reader of those groups).
//
// What a reader may see between the groups' applications: each group
// applies its part when the message reaches it, so for a short while one
// group may show the batch and another not yet. A linearizable get of a
// key in a group that applied it sees the batch; a get of a key in a group
// that has not applied it yet sees the state before it. Once Commit
// returned, every group applied it and every linearizable get sees it. No
// reader ever sees part of one group's share.
//
// The same Batch commits on an ordered keyspace's keys with
// Keyspace.Commit: one group holds the keyspace, so that batch is applied
// at once, as one entry of that group's log.
type Batch struct {
	ops []kv.Op
	err error
}

// Put adds a put to the batch (the value is not copied: leave it alone
// until Commit returns).
func (b *Batch) Put(key, value []byte) *Batch {
	b.ops = append(b.ops, kv.Op{Kind: kv.OpPut, Key: key, Value: value})
	return b
}

// Delete adds a delete to the batch.
func (b *Batch) Delete(key []byte) *Batch {
	b.ops = append(b.ops, kv.Op{Kind: kv.OpDelete, Key: key})
	return b
}

// Len is the number of operations.
func (b *Batch) Len() int { return len(b.ops) }

// BatchResult says where each group applied the batch.
type BatchResult struct {
	// Versions[i] is the version operation i gave its key.
	Versions []uint64
	// Groups is each involved group's entry index.
	Groups map[uint32]uint64
}

// Commit applies the batch atomically (see Batch). An empty batch is a
// no-op.
func (c *Client) Commit(ctx context.Context, b *Batch) (BatchResult, error) {
	if len(b.ops) == 0 {
		return BatchResult{}, nil
	}
	if len(b.ops) > c.m.Limits.MaxBatch {
		return BatchResult{}, fmt.Errorf("%w: %d operations, limit %d", ErrBatchTooLarge, len(b.ops), c.m.Limits.MaxBatch)
	}
	for i := range b.ops {
		if err := c.checkKey(b.ops[i].Key); err != nil {
			return BatchResult{}, fmt.Errorf("batch op %d: %w", i, err)
		}
		if err := c.checkValue(b.ops[i].Value); err != nil {
			return BatchResult{}, fmt.Errorf("batch op %d: %w", i, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return BatchResult{}, err // a done context: nothing is sent
	}
	rs, err := c.write(ctx, b.ops, nil)
	if err != nil {
		return BatchResult{}, err
	}
	out := BatchResult{Versions: make([]uint64, len(b.ops)), Groups: map[uint32]uint64{}}
	for _, r := range rs {
		out.Groups[r.group] = r.index
	}
	for i := range b.ops {
		out.Versions[i] = out.Groups[c.m.GroupOf(b.ops[i].Key)]<<16 | uint64(i)
	}
	return out, nil
}

// batchGroup is the group owning every key of ops (user keys of k), by
// the directory (read again first when it is seen, the one a group
// refused).
func (k *Keyspace) batchGroup(ctx context.Context, ops []kv.Op, seen *btree.Directory) (uint32, *btree.Directory, error) {
	d, err := k.directory(ctx)
	if err == nil && seen != nil {
		d, err = k.refreshDir(ctx, seen)
	}
	if err != nil {
		return 0, nil, err
	}
	var g uint32
	for i := range ops {
		og, _, err := k.route(ctx, k.ks.InternalKey(nil, ops[i].Key))
		if err != nil {
			return 0, nil, err
		}
		if i > 0 && og != g {
			return 0, nil, fmt.Errorf("%w: key %q in group %d, key %q in group %d (nothing written)", ErrBatchSpansGroups, ops[0].Key, g, ops[i].Key, og)
		}
		g = og
	}
	return g, d, nil
}

// Commit applies the batch's puts and deletes of keys of keyspace k (the
// user's keys, as for k.Put) atomically: the group holding the keys'
// tablets applies them as one entry of its log (keys in the tablets of
// several groups: ErrBatchSpansGroups, nothing written), in order, so a reader (a get or a
// scan, linearizable or stale-ok) sees all of them or none, and a later op
// on a key the batch wrote twice sees the last one. An empty batch is a
// no-op. If the group refuses the batch (a limit) or does not own one of
// its keys (ErrKeyMoved), nothing of it is applied.
func (k *Keyspace) Commit(ctx context.Context, b *Batch) (BatchResult, error) {
	if k.err != nil {
		return BatchResult{}, k.err
	}
	if len(b.ops) == 0 {
		return BatchResult{}, nil
	}
	c := k.c
	if len(b.ops) > c.m.Limits.MaxBatch {
		return BatchResult{}, fmt.Errorf("%w: %d operations, limit %d", ErrBatchTooLarge, len(b.ops), c.m.Limits.MaxBatch)
	}
	for i := range b.ops {
		if err := k.checkKey(b.ops[i].Key); err != nil {
			return BatchResult{}, fmt.Errorf("batch op %d: %w", i, err)
		}
		if err := k.checkValue(b.ops[i].Value); err != nil {
			return BatchResult{}, fmt.Errorf("batch op %d: %w", i, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return BatchResult{}, err // a done context: nothing is sent
	}
	// One group applies the batch: the one whose tablets hold every key
	// (the directory read again once if a group answers StatusMoved).
	var rs []groupResult
	var seen *btree.Directory
	deadline := time.Now().Add(c.o.timeout)
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl
	}
	waits := 0
	for tries := 0; ; tries++ {
		g, d, err := k.batchGroup(ctx, b.ops, seen)
		if err == nil {
			rs, err = c.writeTo(ctx, b.ops, k, g)
		}
		if errors.Is(err, ErrKeyMoved) && tries == 0 && k.force == nil {
			seen = d
			continue
		}
		if errors.Is(err, ErrTabletMoving) || errors.Is(err, btree.ErrTabletMoving) {
			// A tablet of the batch is being moved: nothing applied.
			if werr := k.moveWait(ctx, deadline, waits, err); werr != nil {
				return BatchResult{}, werr
			}
			waits++
			if seen = d; seen == nil {
				seen = c.ord.dir.Load()
			}
			continue
		}
		if err != nil {
			return BatchResult{}, err
		}
		break
	}
	r := rs[0]
	if r.res.Status != kv.StatusOK {
		// (a batch has no conditions)
		return BatchResult{}, c.statusErr(r.group, r.res, k, nil)
	}
	out := BatchResult{Versions: make([]uint64, len(b.ops)), Groups: map[uint32]uint64{r.group: r.index}}
	for i := range b.ops {
		out.Versions[i] = r.index<<16 | uint64(i)
	}
	return out, nil
}
