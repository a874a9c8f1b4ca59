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

// TestCombiningContention: 64 goroutines write (puts, compare-and-swaps)
// and read 2 groups' keys through one client, a third of their calls with
// a context cancelled or expiring at a random moment: while queued behind
// the window, while their message is posted, or while it is in flight
// (its caller the reaper or waiting). Each call returns exactly
// once, with one of the outcomes the client promises: a result; ctx's
// error alone only if nothing was sent (then it is never applied); or
// ErrOutcomeUnknown (applied at most once, at any time after the call).
// Porcupine (kvcheck) checks the history, every put's value unique, so a
// write applied although reported unsent, or applied twice, fails it.
// Afterwards the combiner holds nothing, and the multicast client lets go
// of every abandoned message.
func TestCombiningContention(t *testing.T) { combiningContention(t, false) }

// TestKeyspaceCombiningContention is TestCombiningContention on an
// ordered keyspace's keys: its single-key writes go through the same
// combiner (btree's multi requests), and porcupine checks the history the
// same way.
func TestKeyspaceCombiningContention(t *testing.T) { combiningContention(t, true) }

func combiningContention(t *testing.T, ordered bool) {
	m := testMap("contention", "mem", 2, 1)
	if ordered {
		m = orderedMap("kscontention", 2)
	}
	lc := startLocal(t, m)
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	put, cas, get := c.Put, c.CompareAndSwap, c.Get
	if ordered {
		ks := c.Keyspace("users")
		put, cas, get = ks.Put, ks.CompareAndSwap, ks.Get
	}
	const workers = 64
	ops := 25
	if raceEnabled {
		ops = 12
	}
	var keys []string // 32: both groups, few enough unknown writes per key for porcupine
	for i := range 32 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var hist []kvcheck.Op
	var bad []string
	counts := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 17))
			last := map[string]string{} // a value this worker saw, for CAS
			for i := range ops {
				key := keys[rng.IntN(len(keys))]
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch rng.IntN(6) {
				case 0:
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(time.Duration(rng.IntN(400))*time.Microsecond, cancel)
				case 1:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(600))*time.Microsecond)
				}
				op := kvcheck.Op{Client: w, Key: key, Call: clock()}
				var err error
				switch r := rng.IntN(10); {
				case r < 5:
					op.Kind, op.Value = kvcheck.Put, fmt.Sprintf("w%d-%d", w, i)
					_, err = put(ctx, []byte(key), []byte(op.Value))
				case r < 7:
					op.Kind, op.Value = kvcheck.CAS, fmt.Sprintf("w%d-%d", w, i)
					old, ok := last[key]
					op.Old, op.OldAbsent = old, !ok
					var prev []byte
					if ok {
						prev = []byte(old)
					}
					_, err = cas(ctx, []byte(key), prev, []byte(op.Value))
				default:
					op.Kind = kvcheck.Get
					var v []byte
					v, err = get(ctx, []byte(key))
					if err == nil {
						op.Out = kvcheck.Output{Found: true, Value: string(v)}
						last[key] = string(v)
					} else if errors.Is(err, client.ErrNotFound) {
						err = nil
					}
				}
				op.Return = clock()
				cancel()
				outcome := ""
				record := true
				switch {
				case err == nil:
					outcome = "ok"
					if op.Kind != kvcheck.Get {
						op.Out.OK = true
					}
					if op.Kind == kvcheck.Put || op.Kind == kvcheck.CAS {
						last[key] = op.Value
					}
				case op.Kind == kvcheck.CAS && errors.Is(err, client.ErrCASMismatch):
					outcome = "cas-mismatch"
				case errors.Is(err, client.ErrOutcomeUnknown):
					outcome = "unknown"
					op.Out = kvcheck.Output{Unknown: true}
					if op.Kind == kvcheck.Get {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("a get returned %v", err))
						mu.Unlock()
					}
				case (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && ctx.Err() != nil:
					// not sent: never applied (a put applied anyway makes
					// the history fail)
					outcome, record = "not sent", false
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("worker %d: %v of %q: %v", w, op.Kind, key, err))
					mu.Unlock()
					record = false
				}
				mu.Lock()
				counts[op.Kind.String()+" "+outcome]++
				if record {
					hist = append(hist, op)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d calls failed; first: %s", len(bad), bad[0])
	}
	t.Logf("outcomes: %v; %+v", counts, c.Stats())
	if inflight, queued := client.CombinerLoad(c); inflight != 0 || queued != 0 {
		t.Errorf("after every call returned the combiner has %d messages under way and %d writes queued, want none", inflight, queued)
	}
	for deadline := time.Now().Add(time.Minute); client.MulticastOutstanding(c) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("a minute after every call returned the multicast client still holds %d messages", client.MulticastOutstanding(c))
		}
		time.Sleep(time.Millisecond)
	}
	// The writes whose outcome was unknown settle: read every key once
	// more, so that porcupine sees where each ended.
	hist = appendFinalReads(t, hist, keys, workers, clock, get)
	res, err := kvcheck.CheckLinearizable(hist, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("history of %d ops: %v", len(hist), err)
	}
	st := c.Stats()
	if st.WriteOps <= st.WriteMessages {
		t.Errorf("no write was combined: %d writes in %d messages", st.WriteOps, st.WriteMessages)
	}
}

// appendFinalReads reads every key once more, as the history's client
// id, and appends the reads: porcupine then sees where each write whose
// outcome was unknown ended.
func appendFinalReads(t *testing.T, hist []kvcheck.Op, keys []string, id int, clock func() int64, get func(context.Context, []byte) ([]byte, error)) []kvcheck.Op {
	t.Helper()
	for _, k := range keys {
		op := kvcheck.Op{Client: id, Kind: kvcheck.Get, Key: k, Call: clock()}
		v, err := get(context.Background(), []byte(k))
		op.Return = clock()
		switch {
		case err == nil:
			op.Out = kvcheck.Output{Found: true, Value: string(v)}
		case !errors.Is(err, client.ErrNotFound):
			t.Fatal(err)
		}
		hist = append(hist, op)
	}
	return hist
}
