package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
)

// TestKeyspaceBatch: Keyspace.Commit applies a Batch of ordered puts and
// deletes at once: its versions are the entry's, a key written twice
// keeps the last write, and a concurrent scan (one page, linearizable or
// stale-ok) sees every batch whole or not at all. A batch the replicas
// refuse (a value over their limit) or one sent to a group that does not
// own the keyspace applies nothing; an unknown keyspace fails.
func TestKeyspaceBatch(t *testing.T) {
	lc := startLocal(t, orderedMap("ksbatch", 2))
	loose := *lc.Map
	loose.Keyspaces = []cluster.Keyspace{{Name: "users", Kind: "ordered", ID: 1, NodeSize: 16384}, {Name: "events", Kind: "ordered", ID: 2, NodeSize: 16384}}
	c := open(t, lc, 0, client.WithMap(&loose))
	users := c.Keyspace("users")
	ctx := context.Background()
	if r, err := users.Commit(ctx, &client.Batch{}); err != nil || len(r.Versions) != 0 {
		t.Fatalf("empty batch: %+v %v", r, err)
	}
	if _, err := users.Put(ctx, []byte("gone"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	var b client.Batch
	b.Put([]byte("a"), []byte("1")).Put([]byte("b"), []byte("2")).Delete([]byte("gone")).Put([]byte("a"), []byte("3"))
	r, err := users.Commit(ctx, &b)
	if err != nil || len(r.Versions) != 4 || len(r.Groups) != 1 {
		t.Fatalf("commit: %+v %v", r, err)
	}
	idx := r.Groups[0]
	for i, v := range r.Versions {
		if v != idx<<16|uint64(i) {
			t.Fatalf("version %d: %#x, want entry %d's %#x", i, v, idx, idx<<16|uint64(i))
		}
	}
	if it, err := users.GetItem(ctx, []byte("a"), client.Linearizable); err != nil || string(it.Value) != "3" || it.Version != r.Versions[3] {
		t.Fatalf("a after the batch: %+v %v, want the batch's last write 3@%#x", it, err, r.Versions[3])
	}
	if it, err := users.GetItem(ctx, []byte("b"), client.Linearizable); err != nil || string(it.Value) != "2" || it.Version != r.Versions[1] {
		t.Fatalf("b after the batch: %+v %v", it, err)
	}
	if _, err := users.Get(ctx, []byte("gone")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a key the batch deleted: %v", err)
	}

	// Refused whole: nothing of it applied.
	var bad client.Batch
	bad.Put([]byte("r1"), []byte("v")).Put([]byte("r2"), make([]byte, lc.Map.OrderedMaxValue()+1))
	var le *client.LimitError
	if _, err := users.Commit(ctx, &bad); !errors.As(err, &le) || le.Limit != "max_value" || le.Op != 1 {
		t.Fatalf("a batch with a value the replicas refuse: %v", err)
	}
	if _, err := users.Get(ctx, []byte("r1")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a refused batch was applied in part: %v", err)
	}
	moved := c.Keyspace("users")
	client.SetKeyspaceGroup(moved, 1)
	var mb client.Batch
	mb.Put([]byte("m1"), []byte("v")).Put([]byte("m2"), []byte("v"))
	if _, err := moved.Commit(ctx, &mb); !errors.Is(err, client.ErrKeyMoved) {
		t.Fatalf("a batch to a group that does not own the keyspace: %v", err)
	}
	if _, err := users.Get(ctx, []byte("m1")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a moved batch was applied: %v", err)
	}
	if _, err := c.Keyspace("nope").Commit(ctx, &mb); !errors.Is(err, client.ErrUnknownKeyspace) {
		t.Fatalf("a batch on an unknown keyspace: %v", err)
	}

	// Atomic for scans: batches write k0..k9 with one value each; scans of
	// the range never see two values.
	const keys, batches = 10, 40
	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for s := range 2 {
		mode := client.Linearizable
		if s == 1 {
			mode = client.StaleOK
		}
		wg.Go(func() {
			for scans := 0; !done.Load() || scans < 5; scans++ {
				seen := map[string]bool{}
				n := 0
				for kv, err := range users.Scan(ctx, []byte("k0"), []byte("k:"), client.WithScanConsistency(mode)) {
					if err != nil {
						errc <- err
						return
					}
					seen[string(kv.Value)] = true
					n++
				}
				if len(seen) > 1 || n != 0 && n != keys {
					errc <- fmt.Errorf("a %v scan saw %d keys with values %v: a batch applied in part", mode, n, seen)
					return
				}
			}
		})
	}
	for i := range batches {
		var b client.Batch
		for k := range keys {
			b.Put([]byte(fmt.Sprintf("k%d", k)), []byte(fmt.Sprintf("round%d", i)))
		}
		if _, err := users.Commit(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	done.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

// TestKeyspaceLargeValue: with 16 KiB nodes an ordered value may be larger
// than a request slot: such a put, a compare-and-swap and a batch holding
// one go in parts (not through the combiner) and read back whole.
func TestKeyspaceLargeValue(t *testing.T) {
	m := orderedMap("kslarge", 1)
	m.Keyspaces[0].NodeSize, m.Keyspaces[1].NodeSize = 16384, 16384
	lc := startLocal(t, m)
	c := open(t, lc, 0)
	users := c.Keyspace("users")
	ctx := context.Background()
	big := make([]byte, 4900)
	for i := range big {
		big[i] = byte(i)
	}
	if len(big) > c.Map().OrderedMaxValue() || len(big) < lc.Map.Limits.SlotSize {
		t.Fatalf("a %d-byte value: ordered limit %d, slot %d", len(big), c.Map().OrderedMaxValue(), lc.Map.Limits.SlotSize)
	}
	w, err := users.Put(ctx, []byte("big"), big)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := users.CompareVersionAndSwap(ctx, []byte("big"), w.Version+1, big); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("a large compare-and-swap of a wrong version: %v", err)
	}
	big[0] = 'x'
	if _, err := users.CompareVersionAndSwap(ctx, []byte("big"), w.Version, big); err != nil {
		t.Fatal(err)
	}
	var b client.Batch
	b.Put([]byte("big2"), big).Put([]byte("small"), []byte("s"))
	if _, err := users.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"big", "big2"} {
		if v, err := users.Get(ctx, []byte(k)); err != nil || string(v) != string(big) {
			t.Fatalf("get %s: %d bytes, %v", k, len(v), err)
		}
	}
}
