package kvproc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestBatchAtomicForReaders checks, on real processes, the promise of
// client.Batch that no reader sees part of one group's share: one client
// commits batches (one group) that put one key twice, "a<i>" first and
// "b<i>" 40 puts later, and then a second key to "b<i>", while other
// clients get both
// keys linearizably and stale-ok from every replica. No get may return an
// "a" value (never the state after any entry), and a get of the second key
// that follows a get of the first seeing "b<i>" must see i or later.
//
// It caught a bug the simulator cannot show (a replica's Poll and a
// client's reads never overlap there): the table applied a request's
// operations one by one into memory readers read concurrently, so a get
// overlapping the apply of a batch saw the state between two of its
// operations. The table now keeps its layout counter odd while it applies
// a request of several ops, and readers accept only two header reads of
// one even layout; without that, this test fails within a few batches.
func TestBatchAtomicForReaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 1, 3, testTuning)
	cls := make([]*client.Client, 3)
	defer func() {
		for _, cl := range cls {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	for k := range cls {
		cl, err := c.openClient(ctx, k, client.WithNearReplica(k+2))
		if err != nil {
			t.Fatalf("open client %d: %v", k, err)
		}
		cls[k] = cl
	}
	x, y := []byte("x"), []byte("y")
	var done atomic.Bool
	var wg sync.WaitGroup
	report, failures := collect(&done)
	var batches atomic.Int64
	wg.Go(func() {
		for i := 1; !done.Load(); i++ {
			// x's two puts are far apart in the batch, so that its
			// apply takes a while between them.
			var b client.Batch
			b.Put(x, fmt.Appendf(nil, "a%d", i))
			for f := range 40 {
				b.Put(fmt.Appendf(nil, "f%d", f), fmt.Appendf(nil, "%d", i))
			}
			b.Put(x, fmt.Appendf(nil, "b%d", i)).Put(y, fmt.Appendf(nil, "b%d", i))
			if _, err := cls[0].Commit(ctx, &b); err != nil {
				report("batch %d: %v", i, err)
				return
			}
			batches.Add(1)
		}
	})
	var gets atomic.Int64
	num := func(v []byte) int { // 0 for absent
		if len(v) < 2 {
			return 0
		}
		var n int
		fmt.Sscanf(string(v[1:]), "%d", &n)
		return n
	}
	for k := 1; k < len(cls); k++ {
		wg.Go(func() {
			for !done.Load() {
				mode := client.Linearizable
				if k == 2 {
					mode = client.StaleOK
				}
				ix, err := cls[k].GetItem(ctx, x, mode)
				if errors.Is(err, client.ErrNotFound) {
					continue
				}
				if err != nil {
					report("get x: %v", err)
					return
				}
				iy, err := cls[k].GetItem(ctx, y, mode)
				if err != nil && !errors.Is(err, client.ErrNotFound) {
					report("get y: %v", err)
					return
				}
				gets.Add(2)
				if strings.HasPrefix(string(ix.Value), "a") {
					report("client %d: %v get of x returned %q (version %x), the state between two ops of one batch", k, mode, ix.Value, ix.Version)
				}
				if mode == client.Linearizable && num(iy.Value) < num(ix.Value) {
					report("client %d: linearizable get of x returned %q, and then y %q: the batch that wrote x was half applied", k, ix.Value, iy.Value)
				}
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for !done.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	t.Logf("%d batches, %d gets", batches.Load(), gets.Load())
	for _, b := range failures() {
		t.Error(b)
	}
	for k, cl := range cls {
		cl.Close()
		cls[k] = nil
	}
	c.closeAll()
	c.checkNoFiles()
}
