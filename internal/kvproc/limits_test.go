package kvproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestReplicaLimitsRealProc: on replica processes whose limits (max_key 64,
// max_value 1024, so max_request 5184) are stricter than those of the map
// the client was given (4096 and 64 KiB), every write over a replica limit
// -- a put of a long key or value, a compare-and-swap, a put whose request
// is over max_request (sent in parts), a batch over two groups -- returns
// a *client.LimitError naming the limit and the replicas' value of it,
// and a linearizable get afterwards finds nothing of it applied. Before
// the fix the puts returned a nil error and version 0, and the batch
// applied its other ops.
func TestReplicaLimitsRealProc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 2, 1, testTuning)
	repKey, repValue := c.m.Limits.MaxKey, c.m.Limits.MaxValue
	loose := *c.m
	loose.Limits.MaxKey, loose.Limits.MaxValue = 4096, 64<<10
	cl, err := c.openClient(ctx, 0, client.WithMap(&loose))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cl.Close()
		c.closeAll()
		c.checkNoFiles()
	}()
	maxRequest := uint64(repKey + repValue + 4096)

	check := func(what string, err error, sentinel error, limit string, max uint64, keys ...[]byte) {
		t.Helper()
		var le *client.LimitError
		switch {
		case err == nil:
			t.Errorf("%s: acknowledged, want refused on %s", what, limit)
		case !errors.As(err, &le) || !errors.Is(err, client.ErrRefused) || !errors.Is(err, sentinel):
			t.Errorf("%s: error %v, want a *client.LimitError matching %v", what, err, sentinel)
		case le.Limit != limit || le.Max != max:
			t.Errorf("%s: refused on %s=%d, want %s=%d", what, le.Limit, le.Max, limit, max)
		default:
			t.Logf("%s: %v", what, err)
		}
		for _, k := range keys {
			if v, err := cl.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
				t.Errorf("%s: a get of %.20q afterwards: %d bytes, %v; want ErrNotFound", what, k, len(v), err)
			}
		}
	}
	longKey := bytes.Repeat([]byte("k"), repKey+60)
	_, err = cl.Put(ctx, longKey, []byte("v"))
	check("put of a long key", err, client.ErrKeyTooLarge, "max_key", uint64(repKey), longKey)
	_, err = cl.Put(ctx, []byte("longvalue"), bytes.Repeat([]byte("v"), repValue+100))
	check("put of a long value", err, client.ErrValueTooLarge, "max_value", uint64(repValue), []byte("longvalue"))
	_, err = cl.CompareAndSwap(ctx, []byte("cas"), nil, bytes.Repeat([]byte("v"), repValue+1))
	check("compare-and-swap of a long value", err, client.ErrValueTooLarge, "max_value", uint64(repValue), []byte("cas"))
	_, err = cl.Put(ctx, []byte("hugevalue"), bytes.Repeat([]byte("v"), int(maxRequest)))
	check("put over max_request (in parts)", err, client.ErrBatchTooLarge, "max_request", maxRequest, []byte("hugevalue"))

	var keys [2][]byte
	for i := 0; keys[0] == nil || keys[1] == nil; i++ {
		k := fmt.Appendf(nil, "b%d", i)
		if g := c.m.GroupOf(k); keys[g] == nil {
			keys[g] = k
		}
	}
	_, err = cl.Commit(ctx, new(client.Batch).Put(keys[0], []byte("1")).Put(longKey, []byte("2")).Put(keys[1], []byte("3")))
	check("batch over two groups with a long key", err, client.ErrKeyTooLarge, "max_key", uint64(repKey), keys[0], keys[1])
	v := bytes.Repeat([]byte("v"), repValue)
	b := new(client.Batch)
	for i := range 6 {
		b.Put(fmt.Appendf(nil, "%s-%d", keys[i%2], i), v)
	}
	_, err = cl.Commit(ctx, b)
	check("batch of values within max_value over max_request", err, client.ErrBatchTooLarge, "max_request", maxRequest,
		fmt.Appendf(nil, "%s-0", keys[0]), fmt.Appendf(nil, "%s-1", keys[1]))

	// Within the replicas' limits the same client writes.
	if _, err := cl.Put(ctx, keys[0], v); err != nil {
		t.Errorf("put within the limits: %v", err)
	} else if got, err := cl.Get(ctx, keys[0]); err != nil || !bytes.Equal(got, v) {
		t.Errorf("get of the put within the limits: %d bytes, %v", len(got), err)
	}
}
