package e2e

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
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// load is a recorded load of linearizable gets, puts, deletes and
// compare-and-swaps on a small key set, run by worker goroutines that
// share clients. Every call is recorded (kvcheck.Recorder) with its
// invoke and return times; a write that returns ErrOutcomeUnknown or
// *UnavailableError is recorded as of unknown outcome, as is a get that
// returns *UnavailableError (kvcheck drops those).
type load struct {
	rec     *kvcheck.Recorder
	m       *cluster.Map
	keys    []string
	timeout time.Duration // each call's
	think   time.Duration // a worker waits up to this between calls

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	workers  atomic.Int32

	ops     atomic.Int64   // calls returned
	acked   []atomic.Int64 // per group: acknowledged writes
	unknown atomic.Int64   // writes of unknown outcome, unavailable gets

	mu       sync.Mutex
	nerrs    int
	errs     []string // unexpected errors (the first few)
	unknowns []string // the first few unknown outcomes
	slow     []string
}

func newLoad(m *cluster.Map, nkeys int, timeout, think time.Duration) *load {
	l := &load{rec: kvcheck.NewRecorder(nil), m: m, timeout: timeout, think: think, stop: make(chan struct{}),
		acked: make([]atomic.Int64, len(m.Groups))}
	for k := range nkeys {
		l.keys = append(l.keys, fmt.Sprintf("k%d", k))
	}
	return l
}

func (l *load) groupOf(key string) int { return int(l.m.GroupOf([]byte(key))) }

// start runs n workers on client c.
func (l *load) start(c *client.Client, n int, seed uint64) {
	for range n {
		cid := int(l.workers.Add(1)) - 1
		l.wg.Go(func() { l.worker(cid, c, rand.New(rand.NewPCG(seed, uint64(cid)))) })
	}
}

// end stops the workers and waits up to timeout for their calls under
// way; it reports whether they all returned.
func (l *load) end(timeout time.Duration) bool {
	l.stopOnce.Do(func() { close(l.stop) })
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (l *load) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nerrs++
	if len(l.errs) < 20 {
		l.errs = append(l.errs, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

func (l *load) noteUnknown(format string, args ...any) {
	l.unknown.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.unknowns) < 10 {
		l.unknowns = append(l.unknowns, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

// errors returns the number of unexpected errors and the first few.
func (l *load) errors() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nerrs, append([]string(nil), l.errs...)
}

// ackedNow is the acknowledged writes per group so far.
func (l *load) ackedNow() []int64 {
	a := make([]int64, len(l.acked))
	for g := range l.acked {
		a[g] = l.acked[g].Load()
	}
	return a
}

// waitProgress waits up to timeout until every group acknowledged n
// writes more than in since; describe explains a failure.
func (l *load) waitProgress(t *testing.T, since []int64, n int64, timeout time.Duration, what string, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		now := l.ackedNow()
		ok := true
		for g := range now {
			ok = ok && now[g]-since[g] >= n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			nerr, errs := l.errors()
			t.Fatalf("%s: no progress within %v: acknowledged writes per group %v, before %v (want %d more); %d unexpected errors %q; %d unknown outcomes%s",
				what, timeout, now, since, n, nerr, errs, l.unknown.Load(), describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// write records the outcome of a write; cas: a compare-and-swap, for
// which ErrCASMismatch is a definite outcome.
func (l *load) write(cid, id int, what, key string, cas bool, start time.Time, err error) bool {
	var out kvcheck.Output
	ok := false
	switch {
	case err == nil:
		out, ok = kvcheck.Output{OK: true, Group: l.groupOf(key)}, true
		l.acked[l.groupOf(key)].Add(1)
	case cas && errors.Is(err, client.ErrCASMismatch):
		out = kvcheck.Output{OK: false, Group: l.groupOf(key)}
	case errors.Is(err, client.ErrOutcomeUnknown), errors.Is(err, client.ErrUnavailable):
		out = kvcheck.Output{Unknown: true}
		l.noteUnknown("worker %d: %s(%q): %v", cid, what, key, err)
	default:
		out = kvcheck.Output{Unknown: true}
		l.fail("worker %d: %s(%q): %v", cid, what, key, err)
	}
	l.rec.End(id, out)
	l.returned(cid, what, start)
	return ok
}

func (l *load) returned(cid int, what string, start time.Time) {
	l.ops.Add(1)
	if d := time.Since(start); d > 2*time.Second {
		l.mu.Lock()
		if len(l.slow) < 10 {
			l.slow = append(l.slow, fmt.Sprintf("worker %d: %s at %s took %v", cid, what, start.Format("15:04:05.000"), d.Round(time.Millisecond)))
		}
		l.mu.Unlock()
	}
}

// get records a linearizable get of key by worker cid (the final reads
// too); it returns the value and whether the key was found, or ok false.
func (l *load) get(ctx context.Context, cid int, c *client.Client, key string) (value string, found, ok bool) {
	start := time.Now()
	id := l.rec.Begin(cid, kvcheck.Op{Kind: kvcheck.Get, Key: key})
	it, err := c.GetItem(ctx, []byte(key), client.Linearizable)
	var out kvcheck.Output
	switch {
	case err == nil:
		out, ok = kvcheck.Output{Found: true, Value: string(it.Value), Group: l.groupOf(key)}, true
	case errors.Is(err, client.ErrNotFound):
		out, ok = kvcheck.Output{Group: l.groupOf(key)}, true
	case errors.Is(err, client.ErrUnavailable):
		out = kvcheck.Output{Unknown: true}
		l.noteUnknown("worker %d: get(%q): %v", cid, key, err)
	default:
		out = kvcheck.Output{Unknown: true}
		l.fail("worker %d: get(%q): %v", cid, key, err)
	}
	l.rec.End(id, out)
	l.returned(cid, "get", start)
	return out.Value, out.Found, ok
}

func (l *load) worker(cid int, c *client.Client, rng *rand.Rand) {
	seen := map[string]string{} // the value of each key this worker last saw or wrote
	seq := 0
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		if l.think > 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(l.think))))
		}
		key := l.keys[rng.IntN(len(l.keys))]
		seq++
		v := fmt.Sprintf("w%d.%d", cid, seq)
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		start := time.Now()
		switch x := rng.IntN(100); {
		case x < 40:
			if val, found, ok := l.get(ctx, cid, c, key); ok && found {
				seen[key] = val
			} else if ok {
				delete(seen, key)
			}
		case x < 70:
			id := l.rec.Begin(cid, kvcheck.Op{Kind: kvcheck.Put, Key: key, Value: v})
			_, err := c.Put(ctx, []byte(key), []byte(v))
			if l.write(cid, id, "put", key, false, start, err) {
				seen[key] = v
			}
		case x < 80:
			id := l.rec.Begin(cid, kvcheck.Op{Kind: kvcheck.Delete, Key: key})
			_, err := c.Delete(ctx, []byte(key))
			if l.write(cid, id, "delete", key, false, start, err) {
				delete(seen, key)
			}
		default:
			op := kvcheck.Op{Kind: kvcheck.CAS, Key: key, Value: v}
			var old []byte
			if o, ok := seen[key]; ok && rng.IntN(4) != 0 {
				op.Old, old = o, []byte(o)
			} else {
				op.OldAbsent = true
			}
			id := l.rec.Begin(cid, op)
			_, err := c.CompareAndSwap(ctx, []byte(key), old, []byte(v))
			if l.write(cid, id, "cas", key, true, start, err) {
				seen[key] = v
			}
		}
		cancel()
	}
}

// finalReads reads every key with a linearizable get through c, as a
// worker of its own, recorded in the history: the check then proves that
// the final state holds every acknowledged write (none was lost).
func (l *load) finalReads(c *client.Client) (map[string]string, error) {
	cid := int(l.workers.Add(1)) - 1
	final := map[string]string{}
	for _, key := range l.keys {
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		v, found, ok := l.get(ctx, cid, c, key)
		cancel()
		if !ok {
			_, errs := l.errors()
			l.mu.Lock()
			us := append([]string(nil), l.unknowns...)
			l.mu.Unlock()
			return nil, fmt.Errorf("final get %q failed: errors %q, unknown outcomes %q", key, errs, us)
		}
		if found {
			final[key] = v
		}
	}
	return final, nil
}

// summary describes the history.
func summary(h []kvcheck.Op) string {
	n := map[string]int{}
	unknown := 0
	for i := range h {
		o := &h[i]
		what := o.Kind.String()
		if o.Kind == kvcheck.CAS && !o.Out.Unknown {
			what += map[bool]string{true: "-ok", false: "-mismatch"}[o.Out.OK]
		}
		if o.Out.Unknown {
			unknown++
		} else {
			n[what]++
		}
	}
	return fmt.Sprintf("%d ops: %d get, %d put, %d delete, %d cas-ok, %d cas-mismatch, %d of unknown outcome",
		len(h), n["get"], n["put"], n["delete"], n["cas-ok"], n["cas-mismatch"], unknown)
}

// checkHistory checks h with porcupine (internal/kvcheck) and, on
// failure, lists the ops of the failed partitions.
func checkHistory(t *testing.T, h []kvcheck.Op) {
	t.Helper()
	at := time.Now()
	res, err := kvcheck.CheckLinearizable(h, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history: %s; %d partitions checked in %v: %v", summary(h), len(res.Partitions), time.Since(at).Round(time.Millisecond), res.Outcome)
	if res.Outcome == kvcheck.Ok {
		return
	}
	t.Errorf("linearizability: %v", res.Err())
	dumpPartitions(t, h, res.Failed)
}

// checkFinal checks directly what porcupine's check implies for the end
// of the history: for each key whose last acknowledged write overlaps no
// other write of the key and no write of unknown outcome (which may take
// effect at any time), the final read returned that write's result: no
// acknowledged write was lost. It names a lost write plainly.
func checkFinal(t *testing.T, h []kvcheck.Op, keys []string, final map[string]string) (checked int) {
	t.Helper()
	for _, key := range keys {
		var last *kvcheck.Op // the acknowledged write of key that returned last
		unknown := false
		for i := range h {
			o := &h[i]
			if o.Key != key || o.Kind == kvcheck.Get {
				continue
			}
			if o.Out.Unknown {
				unknown = true
				break
			}
			if o.Kind == kvcheck.CAS && !o.Out.OK {
				continue
			}
			if last == nil || o.Return > last.Return {
				last = o
			}
		}
		if unknown || last == nil {
			continue
		}
		overlap := false
		for i := range h {
			o := &h[i]
			if o != last && o.Key == key && o.Kind != kvcheck.Get && !(o.Kind == kvcheck.CAS && !o.Out.OK) && o.Return > last.Call {
				overlap = true
			}
		}
		if overlap {
			continue
		}
		checked++
		v, found := final[key]
		switch last.Kind {
		case kvcheck.Put, kvcheck.CAS:
			if !found || v != last.Value {
				t.Errorf("key %q: the last write, %v, acknowledged and overlapping no other write of the key, is lost: the final read found %q (present %v)", key, last, v, found)
			}
		case kvcheck.Delete:
			if found {
				t.Errorf("key %q: the last write, %v, acknowledged and overlapping no other write of the key, is lost: the final read found %q", key, last, v)
			}
		}
	}
	return checked
}
