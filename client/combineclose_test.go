package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/internal/localcluster"
)

// TestCombiningClose: 64 goroutines put to 2 groups' keys through one
// client (every caller waits on its own op, one of them the reaper, and
// the reaper's message hooks hand out the results), some with a context
// cancelled at a random moment, and the client is closed while many
// writes are queued or in flight. Every call returns (none waits for its
// deadline, a minute away); a write reported not sent (ctx's error or
// ErrClosed alone) is never applied, the others have a result or
// ErrOutcomeUnknown: every write that went out in a message (Stats) was
// reported ok or unknown, and porcupine (kvcheck) checks the history with
// each key's final value read through a second client; the combiner holds
// nothing afterwards. The planted closedAsUnsent (the hook of a message
// that Close ended reports ErrClosed alone to its writes) is caught by
// the count.
func TestCombiningClose(t *testing.T) {
	m := testMap("combclose", "mem", 2, 2)
	lc := startLocal(t, m)
	reader := open(t, lc, 1)
	t.Run("correct", func(t *testing.T) {
		if err := combiningClose(t, lc, reader, false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("closedAsUnsent", func(t *testing.T) {
		// A planted run is caught when a write that went out in a
		// message was reported not sent (or porcupine finds one
		// applied); Close may find no sent write without its result,
		// so it gets a few tries.
		for try := range 5 {
			err := combiningClose(t, lc, reader, true)
			if errors.Is(err, errSentAsUnsent) || errors.Is(err, errNotLinearizable) {
				t.Logf("caught: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("try %d: the planted bug went unseen", try)
		}
		t.Fatal("planted closedAsUnsent: no write sent was reported not sent")
	})
}

var (
	errNotLinearizable = errors.New("history not linearizable")
	errSentAsUnsent    = errors.New("a write sent was reported not sent")
)

var closeRuns atomic.Int32

func combiningClose(t *testing.T, lc *localcluster.Cluster, reader *client.Client, plant bool) error {
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	if plant {
		client.PlantClosedAsUnsent(c)
	}
	run := closeRuns.Add(1)
	var keys []string
	for i := range 32 {
		keys = append(keys, fmt.Sprintf("close%d-k%d", run, i))
	}
	const workers = 64
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var hist []kvcheck.Op
	var bad []string
	counts := map[string]int{}
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(run)))
			for i := 0; ; i++ {
				key := keys[rng.IntN(len(keys))]
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if rng.IntN(4) == 0 {
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(time.Duration(rng.IntN(400))*time.Microsecond, cancel)
				}
				op := kvcheck.Op{Client: w, Key: key, Kind: kvcheck.Put, Value: fmt.Sprintf("w%d-%d", w, i), Call: clock()}
				_, err := c.Put(ctx, []byte(key), []byte(op.Value))
				op.Return = clock()
				cancel()
				outcome, record, last := "ok", true, false
				switch {
				case err == nil:
					op.Out.OK = true
				case errors.Is(err, client.ErrOutcomeUnknown):
					outcome, op.Out = "unknown", kvcheck.Output{Unknown: true}
					last = errors.Is(err, client.ErrClosed)
				case errors.Is(err, client.ErrClosed):
					outcome, record, last = "closed, not sent", false, true
				case (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && ctx.Err() != nil:
					outcome, record = "not sent", false
				default:
					outcome, record = "bad", false
					mu.Lock()
					bad = append(bad, fmt.Sprintf("worker %d: put %q: %v", w, key, err))
					mu.Unlock()
				}
				mu.Lock()
				counts[outcome]++
				if record {
					hist = append(hist, op)
				}
				mu.Unlock()
				done.Add(1)
				if last || outcome == "bad" {
					return
				}
			}
		})
	}
	// Close once the writers are well under way.
	for done.Load() < 400 {
		time.Sleep(100 * time.Microsecond)
	}
	c.Close()
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatalf("30 s after Close some writers still wait (their deadline is a minute away)")
	}
	if len(bad) > 0 {
		t.Fatalf("%d calls failed; first: %s", len(bad), bad[0])
	}
	t.Logf("outcomes: %v", counts)
	if inflight, queued := client.CombinerLoad(c); inflight != 0 || queued != 0 {
		t.Fatalf("after Close the combiner has %d messages under way and %d writes queued, want none", inflight, queued)
	}
	// Every write the combiner put in a message has a result or an
	// unknown outcome (more such: a message whose post failed at Close
	// is not counted sent).
	if st := c.Stats(); uint64(counts["ok"]+counts["unknown"]) < st.WriteOps {
		return fmt.Errorf("%w: %d writes went out in messages, only %d were reported ok or unknown", errSentAsUnsent, st.WriteOps, counts["ok"]+counts["unknown"])
	}
	// Each key's final value, once the writes under way settled.
	time.Sleep(100 * time.Millisecond)
	hist = appendFinalReads(t, hist, keys, workers, clock, reader.Get)
	res, err := kvcheck.CheckLinearizable(hist, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		return fmt.Errorf("%w: %d ops: %v", errNotLinearizable, len(hist), err)
	}
	return nil
}
