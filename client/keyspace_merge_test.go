package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// TestKeyspaceMergeLinearizable: concurrent field merges (UpdateFields),
// puts of fielded and of plain values, deletes, gets and scans of a few
// ordered keys, checked by porcupine with kvcheck's ordered-map model,
// whose Merge is the hashed keyspace's (fields set, the others kept; an
// absent key takes the fields; a plain value refuses the merge).
func TestKeyspaceMergeLinearizable(t *testing.T) {
	lc := startLocal(t, orderedMap("ksmerge", 1))
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	ks := c.Keyspace("users")
	keys := []string{"a", "b", "c"}
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var hist []kvcheck.Op
	const workers = 5
	ops := 40
	if raceEnabled {
		ops = 15
	}
	merges, refused := 0, 0
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 17))
			ctx := context.Background()
			for i := range ops {
				key := keys[rng.IntN(len(keys))]
				op := kvcheck.Op{Client: w, Key: key, Call: clock()}
				var err error
				switch r := rng.IntN(10); {
				case r < 4:
					op.Kind = kvcheck.Merge
					op.Fields = map[string]string{fmt.Sprintf("f%d", rng.IntN(3)): fmt.Sprintf("w%d-%d", w, i)}
					f := map[string][]byte{}
					for k, v := range op.Fields {
						f[k] = []byte(v)
					}
					_, err = ks.UpdateFields(ctx, []byte(key), f)
					op.Out.OK = err == nil
					if errors.Is(err, client.ErrNotFielded) {
						err = nil
					}
				case r < 6:
					op.Kind, op.Value = kvcheck.Put, kvcheck.EncodeFields(map[string]string{"f0": fmt.Sprintf("p%d-%d", w, i)})
					if rng.IntN(4) == 0 {
						op.Value = fmt.Sprintf("plain%d-%d", w, i) // not fielded: merges fail on it
					}
					_, err = ks.Put(ctx, []byte(key), []byte(op.Value))
					op.Out.OK = err == nil
				case r < 7:
					op.Kind = kvcheck.Delete
					_, err = ks.Delete(ctx, []byte(key))
					op.Out.OK = err == nil
				case r < 9:
					op.Kind = kvcheck.Get
					var v []byte
					v, err = ks.Get(ctx, []byte(key))
					if err == nil {
						op.Out = kvcheck.Output{Found: true, Value: string(v)}
					} else if errors.Is(err, client.ErrNotFound) {
						err = nil
					}
				default:
					op.Kind, op.Key, op.End = kvcheck.Scan, "a", "d"
					for kv, e := range ks.Scan(ctx, []byte(op.Key), []byte(op.End)) {
						if e != nil {
							err = e
							break
						}
						op.Out.Pairs = append(op.Out.Pairs, kvcheck.KV{Key: string(kv.Key), Value: string(kv.Value)})
					}
				}
				op.Return = clock()
				if err != nil {
					errc <- fmt.Errorf("worker %d: %v: %w", w, op.Kind, err)
					return
				}
				mu.Lock()
				hist = append(hist, op)
				if op.Kind == kvcheck.Merge {
					merges++
					if !op.Out.OK {
						refused++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if merges-refused == 0 {
		t.Fatalf("no merge applied (%d merges)", merges)
	}
	res, err := kvcheck.CheckLinearizable(hist, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("%d ops: %v", len(hist), err)
	}
	t.Logf("%d ops, %d merges (%d refused: a plain value)", len(hist), merges, refused)
}
