package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/kv/fielded"
)

// ErrNotFielded is wrapped by UpdateFields' error when the key holds a
// value that is not a fielded value (one Put stored, say): the replicas
// wrote nothing.
var ErrNotFielded = errors.New("rdmakv: the key's value is not a fielded value")

// UpdateFields sets fields in key's value, a fielded value (package
// kv/fielded, docs/kv.md "Fielded values": a value of named fields, such
// as a YCSB record), and leaves the value's other fields as they are. A
// key without a value gets the fields (as fielded.Encode(fields)).
//
// It is one blind write (kv.OpMerge): the replicas of the key's group
// merge the fields into the value they hold when they apply it, in the
// order of the group's log, so concurrent updates of one key never lose
// each other's fields, without a read or a compare-and-swap retry. Like a
// put, it gives the key a new version (WriteResult.Version; Prev is the
// version it replaced) and is combined with the client's other single-key
// writes.
//
// If the key holds a value that is not a fielded value, nothing is
// written and the error wraps ErrNotFielded (WriteResult.Prev is that
// value's version). If the merged value is larger than the replicas'
// max_value, nothing is written and the error is a *LimitError (max_value,
// with the merged size); fields whose encoding alone exceeds the map's
// max_value give ErrValueTooLarge before anything is sent.
func (c *Client) UpdateFields(ctx context.Context, key []byte, fields map[string][]byte) (WriteResult, error) {
	return c.merge(ctx, key, fields, kv.CmpNone, nil)
}

// UpdateExistingFields is UpdateFields, but only of a key that has a
// value: for a key without one, nothing is written and the error is
// ErrNotFound (checked by the replicas when they apply it, still one
// write).
func (c *Client) UpdateExistingFields(ctx context.Context, key []byte, fields map[string][]byte) (WriteResult, error) {
	return c.merge(ctx, key, fields, kv.CmpExists, nil)
}

// UpdateFields is Client.UpdateFields on the ordered keyspace: one blind
// write that the replicas of the keyspace's group merge into the key's
// fielded value when they apply it (the same merge as hashed keys', so
// concurrent updates keep each other's fields), combined with the
// client's other single-key writes. A merged value larger than
// Map().OrderedMaxValue() writes nothing (a *LimitError).
func (k *Keyspace) UpdateFields(ctx context.Context, key []byte, fields map[string][]byte) (WriteResult, error) {
	return k.c.merge(ctx, key, fields, kv.CmpNone, k)
}

// UpdateExistingFields is UpdateFields, but only of a key that has a
// value: for a key without one, nothing is written and the error is
// ErrNotFound. YCSB's updates of an ordered keyspace are this call.
func (k *Keyspace) UpdateExistingFields(ctx context.Context, key []byte, fields map[string][]byte) (WriteResult, error) {
	return k.c.merge(ctx, key, fields, kv.CmpExists, k)
}

// merge sends the merge of fields into key, of ordered keyspace ks (nil:
// the hashed keyspace).
func (c *Client) merge(ctx context.Context, key []byte, fields map[string][]byte, cmp uint8, ks *Keyspace) (WriteResult, error) {
	v := fielded.Encode(fields)
	check := c.checkValue
	if ks != nil {
		check = ks.checkValue
	}
	if err := check(v); err != nil {
		return WriteResult{}, err
	}
	r, err := c.single(ctx, kv.Op{Kind: kv.OpMerge, Cmp: cmp, Key: key, Value: v}, ks)
	if errors.Is(err, ErrCASMismatch) {
		// StatusCondFailed: the value was not a fielded value (Prev is
		// its version), or with CmpExists the key had none (Prev 0).
		if cmp == kv.CmpExists && r.Prev == 0 {
			return r, ErrNotFound
		}
		return r, fmt.Errorf("%w: key %.40q (version %#x)", ErrNotFielded, key, r.Prev)
	}
	return r, err
}
