package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
)

// combinedResults runs 48 goroutines of single-key writes through one
// client, each on keys of its own, so that each call's outcome is known
// in advance whatever ran beside it: puts and compare-version-and-swaps
// that succeed (Prev the goroutine's last version), ones whose version is
// wrong (ErrCASMismatch, Prev the key's version), puts of a value the
// replicas refuse though the client's looser map lets it through
// (LimitError max_value), writes sent to a group that does not own the
// keyspace (ErrKeyMoved), and hashed puts in the same groups' queues. The
// ordered ones of a group are combined into multi requests, mixing those
// outcomes in one message. Each goroutine then reads its key back: the
// value and version its last write reported. It returns the first call
// whose outcome was not its own, and the client's stats.
func combinedResults(t *testing.T, plant bool) (client.Stats, error) {
	lc := startLocal(t, orderedMap("kscombined", 2))
	loose := *lc.Map
	loose.Keyspaces = []cluster.Keyspace{{Name: "users", Kind: "ordered", ID: 1, NodeSize: 16384}, {Name: "events", Kind: "ordered", ID: 2, NodeSize: 16384}}
	c := open(t, lc, 0, client.WithMap(&loose), client.WithTimeout(time.Minute))
	if plant {
		client.PlantShiftResults(c)
	}
	users := c.Keyspace("users")
	moved := c.Keyspace("users")
	client.SetKeyspaceGroup(moved, 1)
	big := make([]byte, lc.Map.OrderedMaxValue()+1)
	const workers = 48
	rounds := 12
	if raceEnabled {
		rounds = 6
	}
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := []byte(fmt.Sprintf("w%02d", w))
			var last uint64 // the version of key's last write (0: none)
			var lastVal string
			for i := range rounds {
				val := fmt.Sprintf("w%02d-%d", w, i)
				var r client.WriteResult
				var err error
				var what string
				switch (w + i) % 6 {
				case 0, 1:
					what = "put"
					r, err = users.Put(ctx, key, []byte(val))
					if err == nil && r.Prev == last && r.Version > last {
						last, lastVal = r.Version, val
						continue
					}
				case 2:
					what = "a compare-version-and-swap of the key's version"
					r, err = users.CompareVersionAndSwap(ctx, key, last, []byte(val))
					if err == nil && r.Prev == last && r.Version > last {
						last, lastVal = r.Version, val
						continue
					}
				case 3:
					what = "a compare-version-and-swap of a wrong version"
					r, err = users.CompareVersionAndSwap(ctx, key, last+1, []byte(val))
					if errors.Is(err, client.ErrCASMismatch) && r.Prev == last {
						continue
					}
				case 4:
					what = "a put of a value the replicas refuse"
					r, err = users.Put(ctx, append(key, "-big"...), big)
					var le *client.LimitError
					if errors.As(err, &le) && le.Limit == "max_value" && le.Op == 0 {
						continue
					}
				case 5:
					what = "a put to a group that does not own the keyspace"
					r, err = moved.Put(ctx, key, []byte(val))
					if errors.Is(err, client.ErrKeyMoved) && strings.Contains(err.Error(), fmt.Sprintf("%q", key)) {
						if _, herr := c.Put(ctx, key, []byte(val)); herr != nil { // a hashed put, same name
							fail(fmt.Errorf("worker %d round %d: a hashed put: %v", w, i, herr))
							return
						}
						continue
					}
				}
				fail(fmt.Errorf("worker %d round %d: %s (last version %#x) returned %+v, %v: not its own outcome", w, i, what, last, r, err))
				return
			}
			it, err := users.GetItem(ctx, key, client.Linearizable)
			if err != nil || string(it.Value) != lastVal || it.Version != last {
				fail(fmt.Errorf("worker %d: read back %q@%#x (%v), want %q@%#x, what its last write reported", w, it.Value, it.Version, err, lastVal, last))
			}
			if _, err := users.Get(ctx, append(key, "-big"...)); !errors.Is(err, client.ErrNotFound) {
				fail(fmt.Errorf("worker %d: a refused put was written: %v", w, err))
			}
		})
	}
	wg.Wait()
	return c.Stats(), first
}

// TestKeyspaceCombinedResults: under combining, each caller gets its own
// op's result (combinedResults), and ops were combined (fewer messages
// than writes).
func TestKeyspaceCombinedResults(t *testing.T) {
	st, err := combinedResults(t, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes in %d messages", st.WriteOps, st.WriteMessages)
	if st.WriteOps <= st.WriteMessages {
		t.Errorf("no write was combined: %d writes in %d messages", st.WriteOps, st.WriteMessages)
	}
}

// TestKeyspaceCombinedResultsMutant: the planted shiftResults (op i of a
// message gets op i+1's result) is caught by combinedResults.
func TestKeyspaceCombinedResultsMutant(t *testing.T) {
	_, err := combinedResults(t, true)
	if err == nil || !strings.Contains(err.Error(), "not its own outcome") && !strings.Contains(err.Error(), "what its last write reported") {
		t.Fatalf("results handed to the wrong op not caught: %v", err)
	}
	t.Logf("caught: %v", err)
}
