package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
)

// Replica limits of TestReplicaLimits' cluster, and the looser ones of its
// client's map.
const (
	repMaxKey, repMaxValue = 1024, 8 << 10
	cliMaxKey, cliMaxValue = 4096, 64 << 10
)

// looser is a copy of m whose key and value limits are those of a client
// configured apart from the replicas (cliMaxKey, cliMaxValue).
func looser(m *cluster.Map) *cluster.Map {
	l := *m
	l.Limits.MaxKey, l.Limits.MaxValue = cliMaxKey, cliMaxValue
	return &l
}

// checkRefused fails unless err is a *client.LimitError naming limit with
// the replicas' value max, matching ErrRefused and sentinel.
func checkRefused(t *testing.T, what string, err error, sentinel error, limit string, max uint64, op int) {
	t.Helper()
	var le *client.LimitError
	if !errors.As(err, &le) {
		t.Errorf("%s: error %v, want a *client.LimitError (%s)", what, err, limit)
		return
	}
	if !errors.Is(err, client.ErrRefused) || !errors.Is(err, sentinel) {
		t.Errorf("%s: %v does not match ErrRefused and %v", what, err, sentinel)
	}
	if le.Limit != limit || le.Max != max || le.Op != op {
		t.Errorf("%s: refused on %s=%d (op %d), want %s=%d (op %d)", what, le.Limit, le.Max, le.Op, limit, max, op)
	}
}

// TestReplicaLimits: a client whose map allows larger keys and values than
// the replicas enforce gets, for every limit the replicas enforce on what
// it sends (max_key, max_value, max_request: a request's bytes, whole or
// in parts), a typed error naming the limit and the replica's value of
// it, for every kind of write, and nothing of the write is applied.
// Before the fix, the replicas skipped the over-limit ops and answered OK:
// the puts returned a nil error and version 0.
func TestReplicaLimits(t *testing.T) {
	m := testMap("replimits", "mem", 2, 1)
	m.Limits.MaxKey, m.Limits.MaxValue = repMaxKey, repMaxValue
	lc := startLocal(t, m)
	c := open(t, lc, 0, client.WithMap(looser(lc.Map)))
	ctx := context.Background()
	maxRequest := uint64(repMaxKey + repMaxValue + 4096)

	bigKey := bytes.Repeat([]byte("k"), repMaxKey+100) // 1124 bytes, as in the issue
	bigValue := bytes.Repeat([]byte("v"), repMaxValue+1)
	hugeValue := bytes.Repeat([]byte("h"), repMaxValue+repMaxKey+4096+1) // the request is over max_request
	absent := func(what string, key []byte) {
		t.Helper()
		if v, err := c.Get(ctx, key); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("%s: a get afterwards found %d bytes, %v: want ErrNotFound", what, len(v), err)
		}
	}
	single := []struct {
		what     string
		key      []byte
		write    func(key []byte) (client.WriteResult, error)
		sentinel error
		limit    string
		max      uint64
	}{
		{"put of a long key (one slot, alone or combined)", bigKey, func(k []byte) (client.WriteResult, error) { return c.Put(ctx, k, []byte("v")) },
			client.ErrKeyTooLarge, "max_key", repMaxKey},
		{"put of a long value (in parts)", []byte("bigvalue"), func(k []byte) (client.WriteResult, error) { return c.Put(ctx, k, bigValue) },
			client.ErrValueTooLarge, "max_value", repMaxValue},
		{"put of a value over max_request (its parts refused)", []byte("hugevalue"), func(k []byte) (client.WriteResult, error) { return c.Put(ctx, k, hugeValue) },
			client.ErrBatchTooLarge, "max_request", maxRequest},
		{"compare-and-swap of a long value", []byte("cas"), func(k []byte) (client.WriteResult, error) { return c.CompareAndSwap(ctx, k, nil, bigValue) },
			client.ErrValueTooLarge, "max_value", repMaxValue},
		{"compare-version-and-swap of a long key", bigKey, func(k []byte) (client.WriteResult, error) {
			return c.CompareVersionAndSwap(ctx, k, 0, []byte("v"))
		}, client.ErrKeyTooLarge, "max_key", repMaxKey},
		{"delete of a long key", bigKey, func(k []byte) (client.WriteResult, error) { return c.Delete(ctx, k) },
			client.ErrKeyTooLarge, "max_key", repMaxKey},
		{"compare-and-delete of a long key", bigKey, func(k []byte) (client.WriteResult, error) { return c.CompareAndDelete(ctx, k, 1) },
			client.ErrKeyTooLarge, "max_key", repMaxKey},
	}
	for _, s := range single {
		wr, err := s.write(s.key)
		if err == nil {
			t.Errorf("%s: acknowledged (%+v), want refused on %s", s.what, wr, s.limit)
			continue
		}
		op := 0
		if s.limit == "max_request" {
			op = -1
		}
		checkRefused(t, s.what, err, s.sentinel, s.limit, s.max, op)
		absent(s.what, s.key)
	}

	// Batches: refused whole, in every group (keys of both groups).
	var keys [2][]byte
	for i := 0; keys[0] == nil || keys[1] == nil; i++ {
		k := fmt.Appendf(nil, "b%d", i)
		if g := lc.Map.GroupOf(k); keys[g] == nil {
			keys[g] = k
		}
	}
	batches := []struct {
		what     string
		b        func() *client.Batch
		sentinel error
		limit    string
		max      uint64
		op       int
	}{
		{"batch with a long key", func() *client.Batch {
			return new(client.Batch).Put(keys[0], []byte("1")).Put(bigKey, []byte("2")).Put(keys[1], []byte("3"))
		}, client.ErrKeyTooLarge, "max_key", repMaxKey, 1},
		{"batch deleting a long key", func() *client.Batch {
			return new(client.Batch).Put(keys[0], []byte("1")).Put(keys[1], []byte("3")).Delete(bigKey)
		}, client.ErrKeyTooLarge, "max_key", repMaxKey, 2},
		{"batch with a long value", func() *client.Batch {
			return new(client.Batch).Put(keys[0], []byte("1")).Put(keys[1], bigValue)
		}, client.ErrValueTooLarge, "max_value", repMaxValue, 1},
		{"batch of values within max_value over max_request", func() *client.Batch {
			v := bytes.Repeat([]byte("x"), repMaxValue)
			return new(client.Batch).Put(keys[0], v).Put(keys[1], v)
		}, client.ErrBatchTooLarge, "max_request", maxRequest, -1},
	}
	for _, s := range batches {
		br, err := c.Commit(ctx, s.b())
		if err == nil {
			t.Errorf("%s: committed (%+v), want refused on %s", s.what, br, s.limit)
			continue
		}
		checkRefused(t, s.what, err, s.sentinel, s.limit, s.max, s.op)
		absent(s.what, keys[0])
		absent(s.what, keys[1])
	}

	// Within the limits, the same client's writes go through.
	if _, err := c.Put(ctx, bytes.Repeat([]byte("k"), repMaxKey), bytes.Repeat([]byte("v"), repMaxValue)); err != nil {
		t.Errorf("put at the replicas' limits: %v", err)
	}
}

// TestReplicaLimitsCombined: single-key writes that the client combines
// into one message get one result each: an over-limit one fails only its
// own caller, with the typed error, and the others are applied. Rounds of
// concurrent writes repeat until a round was combined (Stats).
func TestReplicaLimitsCombined(t *testing.T) {
	m := testMap("replimitscomb", "mem", 1, 1)
	m.Limits.MaxKey, m.Limits.MaxValue = repMaxKey, repMaxValue
	lc := startLocal(t, m)
	c := open(t, lc, 0, client.WithMap(looser(lc.Map)))
	ctx := context.Background()
	const writers = 48
	for round := 0; ; round++ {
		before := c.Stats()
		var wg sync.WaitGroup
		errs := make([]error, writers)
		keys := make([][]byte, writers)
		for i := range writers {
			keys[i] = fmt.Appendf(nil, "r%d-w%d", round, i)
			if i%5 == 3 {
				keys[i] = append(keys[i], bytes.Repeat([]byte("x"), repMaxKey)...)
			}
			wg.Go(func() { _, errs[i] = c.Put(ctx, keys[i], []byte("v")) })
		}
		wg.Wait()
		for i := range writers {
			if i%5 == 3 {
				checkRefused(t, fmt.Sprintf("round %d writer %d (long key)", round, i), errs[i], client.ErrKeyTooLarge, "max_key", repMaxKey, 0)
				if _, err := c.Get(ctx, keys[i]); !errors.Is(err, client.ErrNotFound) {
					t.Errorf("round %d writer %d: the refused key: %v, want ErrNotFound", round, i, err)
				}
				continue
			}
			if errs[i] != nil {
				t.Errorf("round %d writer %d: %v (only the long keys' writes may fail)", round, i, errs[i])
			} else if v, err := c.Get(ctx, keys[i]); err != nil || string(v) != "v" {
				t.Errorf("round %d writer %d: get %q, %v", round, i, v, err)
			}
		}
		if t.Failed() {
			return
		}
		after := c.Stats()
		if msgs, ops := after.WriteMessages-before.WriteMessages, after.WriteOps-before.WriteOps; ops > msgs {
			t.Logf("round %d: %d writes in %d messages", round, ops, msgs)
			return
		}
		if round == 200 {
			t.Fatalf("no round of %d concurrent writers was combined", writers)
		}
	}
}

// TestConcurrentLargePuts: more concurrent puts of values sent in parts
// than a group keeps staged requests per client slot (kv.MaxStages) all
// succeed and are read back. Before the fix, newer staged requests
// evicted older ones before their commits, which the groups then refused
// ("refused the request as malformed").
func TestConcurrentLargePuts(t *testing.T) {
	lc := startLocal(t, testMap("bigputs", "mem", 1, 1))
	c := open(t, lc, 0)
	ctx := context.Background()
	const writers = 3 * kv.MaxStages
	var wg sync.WaitGroup
	errs := make([]error, writers)
	value := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 40<<10) }
	for i := range writers {
		wg.Go(func() { _, errs[i] = c.Put(ctx, fmt.Appendf(nil, "big%d", i), value(i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("put %d: %v", i, err)
		} else if v, err := c.Get(ctx, fmt.Appendf(nil, "big%d", i)); err != nil || !bytes.Equal(v, value(i)) {
			t.Errorf("get %d: %d bytes, %v", i, len(v), err)
		}
	}
}
