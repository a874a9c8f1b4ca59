package kvproc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/rdma"
)

// kvLoad is the clients' load: goroutines, each with a client of its own,
// doing a random mix of operations one at a time, every one recorded.
type kvLoad struct {
	m           *cluster.Map
	rec         *kvcheck.Recorder
	keys        int
	callTimeout time.Duration
	think       time.Duration // a worker waits up to this between ops
	stop        chan struct{}
	stopOnce    sync.Once
	wg          sync.WaitGroup

	mu    sync.Mutex
	dones []opDone
	errs  []string
	nerrs int
	count map[string]int
	slow  []string // ops that took over a second
	// read is the node each get read, by recorder id (for failures).
	read map[int]rdma.NodeID
}

// opDone is a completed op: its client, when it was called and returned,
// and the group of a write acknowledged (-1 for other ops).
type opDone struct {
	client      int
	start, done time.Time
	wgroup      int
}

// newLoad records with a clock of the time since t0.
func newLoad(t0 time.Time, m *cluster.Map, keys int, callTimeout, think time.Duration) *kvLoad {
	return &kvLoad{m: m, rec: kvcheck.NewRecorder(func() int64 { return int64(time.Since(t0)) }), keys: keys, callTimeout: callTimeout, think: think,
		stop: make(chan struct{}), count: map[string]int{}, read: map[int]rdma.NodeID{}}
}

// fail records an unexpected error of a client call.
func (l *kvLoad) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nerrs++
	if len(l.errs) < 30 {
		l.errs = append(l.errs, time.Now().Format("15:04:05.000000 ")+fmt.Sprintf(format, args...))
	}
}

func (l *kvLoad) done(k int, start time.Time, wgroup int, what string) {
	now := time.Now()
	l.mu.Lock()
	l.dones = append(l.dones, opDone{client: k, start: start, done: now, wgroup: wgroup})
	l.count[what]++
	if d := now.Sub(start); d > time.Second && len(l.slow) < 20 {
		l.slow = append(l.slow, fmt.Sprintf("client %d: %s at %s took %v", k, what, start.Format("15:04:05.000"), d.Round(time.Millisecond)))
	}
	l.mu.Unlock()
}

// progress counts, per client, the ops called after t and returned, and
// per group the writes acknowledged among them.
func (l *kvLoad) progress(t time.Time, clients, groups int) (ops, writes []int) {
	ops, writes = make([]int, clients), make([]int, groups)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.dones {
		if d.start.After(t) {
			ops[d.client]++
			if d.wgroup >= 0 {
				writes[d.wgroup]++
			}
		}
	}
	return ops, writes
}

// stall describes the clients' view of an instant k: the longest gap
// between completions in the 3 s after it, and the slowest op done after
// it that started within a second of it.
func (l *kvLoad) stall(k time.Time) string {
	l.mu.Lock()
	var times []time.Time
	var slow time.Duration
	for _, d := range l.dones {
		if d.done.After(k.Add(-100*time.Millisecond)) && d.done.Before(k.Add(3*time.Second)) {
			times = append(times, d.done)
		}
		if d.done.After(k) && d.start.Before(k.Add(time.Second)) {
			slow = max(slow, d.done.Sub(d.start))
		}
	}
	l.mu.Unlock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		gap = max(gap, times[i].Sub(times[i-1]))
	}
	return fmt.Sprintf("longest gap between completions %v, slowest op done after it %v", gap.Round(100*time.Microsecond), slow.Round(100*time.Microsecond))
}

// start runs a worker for client c, which is client number k (its slot).
func (l *kvLoad) start(k int, c *client.Client, seed uint64) {
	l.wg.Go(func() { l.worker(k, c, seed) })
}

// end stops the workers (each finishes its op under way) and waits up to
// timeout for them; it reports whether they all ended.
func (l *kvLoad) end(timeout time.Duration) bool {
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

func (l *kvLoad) key(rng *rand.Rand) string { return fmt.Sprintf("k%d", rng.IntN(l.keys)) }

func (l *kvLoad) groupOf(key string) int { return int(l.m.GroupOf([]byte(key))) }

// writeOut is the recorded output of a single-key write that returned wr,
// err; ok reports an acknowledged write.
func (l *kvLoad) writeOut(k int, what, key string, wr client.WriteResult, err error) (out kvcheck.Output, ok bool) {
	g := l.groupOf(key)
	switch {
	case err == nil:
		if wr.Version == 0 {
			l.fail("client %d: %s(%q) acknowledged with version 0", k, what, key)
		}
		return kvcheck.Output{OK: true, Index: kvcheck.VersionIndex(wr.Version), Version: wr.Version, Group: g}, true
	case errors.Is(err, client.ErrOutcomeUnknown):
		// The calls are never cancelled and every group keeps a
		// majority: a write that timed out is a failure too.
		l.fail("client %d: %s(%q): outcome unknown: %v", k, what, key, err)
	default:
		l.fail("client %d: %s(%q): %v", k, what, key, err)
	}
	return kvcheck.Output{Unknown: true}, false
}

func (l *kvLoad) worker(k int, c *client.Client, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(k)))
	seen := map[string]string{} // a value of each key this client saw or wrote
	seq := 0
	value := func() string {
		seq++
		return fmt.Sprintf("c%d.%d", k, seq)
	}
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		if l.think > 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(l.think))))
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.callTimeout)
		start := time.Now()
		x := rng.IntN(100)
		switch {
		case x < 45: // gets: 25 linearizable, 20 stale-ok
			key := l.key(rng)
			stale := x >= 25
			mode, what := client.Linearizable, "get"
			if stale {
				mode, what = client.StaleOK, "stale-get"
			}
			id := l.rec.Begin(k, kvcheck.Op{Kind: kvcheck.Get, Key: key, Stale: stale})
			it, err := c.GetItem(ctx, []byte(key), mode)
			var out kvcheck.Output
			switch {
			case err == nil:
				out = kvcheck.Output{Found: true, Value: string(it.Value), Applied: it.Applied, Group: l.groupOf(key)}
				seen[key] = out.Value
			case errors.Is(err, client.ErrNotFound):
				out = kvcheck.Output{Applied: it.Applied, Group: l.groupOf(key)}
				delete(seen, key)
			default:
				out = kvcheck.Output{Unknown: true}
				l.fail("client %d: %s(%q): %v", k, what, key, err)
			}
			l.rec.End(id, out)
			if !out.Unknown {
				l.mu.Lock()
				l.read[id] = it.Replica
				l.mu.Unlock()
				l.done(k, start, -1, what)
			}
		case x < 70:
			key, v := l.key(rng), value()
			id := l.rec.Begin(k, kvcheck.Op{Kind: kvcheck.Put, Key: key, Value: v})
			wr, err := c.Put(ctx, []byte(key), []byte(v))
			out, ok := l.writeOut(k, "put", key, wr, err)
			l.rec.End(id, out)
			if ok {
				seen[key] = v
				l.done(k, start, out.Group, "put")
			}
		case x < 78:
			key := l.key(rng)
			id := l.rec.Begin(k, kvcheck.Op{Kind: kvcheck.Delete, Key: key})
			wr, err := c.Delete(ctx, []byte(key))
			out, ok := l.writeOut(k, "delete", key, wr, err)
			l.rec.End(id, out)
			if ok {
				delete(seen, key)
				l.done(k, start, out.Group, "delete")
			}
		case x < 90:
			key, v := l.key(rng), value()
			op := kvcheck.Op{Kind: kvcheck.CAS, Key: key, Value: v}
			var old []byte
			if o, ok := seen[key]; ok && rng.IntN(4) != 0 {
				op.Old, old = o, []byte(o)
			} else if rng.IntN(2) == 0 {
				op.OldAbsent = true
			} else {
				op.Old = fmt.Sprintf("c%d.%d", rng.IntN(3), max(1, seq-rng.IntN(5)))
				old = []byte(op.Old)
			}
			id := l.rec.Begin(k, op)
			wr, err := c.CompareAndSwap(ctx, []byte(key), old, []byte(v))
			if errors.Is(err, client.ErrCASMismatch) {
				l.rec.End(id, kvcheck.Output{OK: false, Group: l.groupOf(key)})
				l.done(k, start, -1, "cas-mismatch")
				break
			}
			out, ok := l.writeOut(k, "cas", key, wr, err)
			l.rec.End(id, out)
			if ok {
				seen[key] = v
				l.done(k, start, out.Group, "cas")
			}
		default:
			l.batch(ctx, k, c, rng, value, start)
		}
		cancel()
	}
}

// batch commits a batch of 2 or 3 puts and deletes over one family of 4
// keys (so that the linearizability check's partitions, keys linked by
// batches, stay small). A batch that spans groups is recorded as one
// batch op per group: each group applies its part atomically, but a
// reader may see one group's part before the other's (client.Batch).
func (l *kvLoad) batch(ctx context.Context, k int, c *client.Client, rng *rand.Rand, value func() string, start time.Time) {
	var b client.Batch
	var ops []kvcheck.BatchOp
	fam := rng.IntN(l.keys / 4)
	for range 2 + rng.IntN(2) {
		key := fmt.Sprintf("k%d", fam*4+rng.IntN(4))
		if rng.IntN(4) == 0 {
			b.Delete([]byte(key))
			ops = append(ops, kvcheck.BatchOp{Key: key, Delete: true})
		} else {
			v := value()
			b.Put([]byte(key), []byte(v))
			ops = append(ops, kvcheck.BatchOp{Key: key, Value: v})
		}
	}
	byGroup := map[int][]kvcheck.BatchOp{}
	first := map[int]int{} // each group's first op in the batch
	for i, o := range ops {
		g := l.groupOf(o.Key)
		if _, ok := first[g]; !ok {
			first[g] = i
		}
		byGroup[g] = append(byGroup[g], o)
	}
	ids := map[int]int{}
	for g, gops := range byGroup {
		ids[g] = l.rec.Begin(k, kvcheck.Op{Kind: kvcheck.Batch, Batch: gops})
	}
	res, err := c.Commit(ctx, &b)
	if err != nil {
		for _, id := range ids {
			l.rec.End(id, kvcheck.Output{Unknown: true})
		}
		if errors.Is(err, client.ErrOutcomeUnknown) {
			l.fail("client %d: batch %v: outcome unknown: %v", k, ops, err)
		} else {
			l.fail("client %d: batch %v: %v", k, ops, err)
		}
		return
	}
	for g, id := range ids {
		idx, ok := res.Groups[uint32(g)]
		v := res.Versions[first[g]]
		if !ok || idx == 0 || kvcheck.VersionIndex(v) != idx {
			l.fail("client %d: batch %v: group %d's index %d (%v), version %x", k, ops, g, idx, ok, v)
		}
		l.rec.End(id, kvcheck.Output{OK: true, Index: idx, Version: v, Group: g})
	}
	for g := range ids {
		l.done(k, start, g, "batch")
	}
}

// errors returns the unexpected errors recorded.
func (l *kvLoad) errors() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nerrs, append([]string(nil), l.errs...)
}

// counts describes the ops done by kind.
func (l *kvLoad) counts() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ks []string
	for k := range l.count {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, l.count[k])
	}
	return b.String()
}

// failedOps lists the ops of the failed partitions, by call time.
func failedOps(hist []kvcheck.Op, res kvcheck.Result) string {
	keys := map[string]bool{}
	for _, p := range res.Failed {
		for _, k := range p.Keys {
			keys[k] = true
		}
	}
	var b strings.Builder
	n := 0
	for i := range hist {
		o := &hist[i]
		in := keys[o.Key]
		for _, bo := range o.Batch {
			in = in || keys[bo.Key]
		}
		if !in {
			continue
		}
		if n++; n > 400 {
			b.WriteString("  ...\n")
			break
		}
		fmt.Fprintf(&b, "  c%d [%v, %v] %v\n", o.Client, time.Duration(o.Call), time.Duration(o.Return), o)
	}
	return b.String()
}

// keyOps lists the ops on key (and the batches touching it) whose call or
// return is within window of t (recorder time), with the node each get
// read.
func (l *kvLoad) keyOps(hist []kvcheck.Op, key string, t int64, window time.Duration) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i := range hist {
		o := &hist[i]
		in := o.Key == key
		for _, bo := range o.Batch {
			in = in || bo.Key == key
		}
		if !in || o.Return < t-int64(window) || o.Call > t+int64(window) {
			continue
		}
		fmt.Fprintf(&b, "  op %d c%d [%v, %v] %v", i, o.Client, time.Duration(o.Call), time.Duration(o.Return), o)
		if n, ok := l.read[i]; ok {
			fmt.Fprintf(&b, " (read node %d)", n)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// halfBatches names the gets among ops (positions in hist; all gets if
// nil) that returned a state only a batch shows between two of its
// operations: a value a batch wrote to a key and overwrote within itself,
// or absent from a batch that deletes the key and then puts it again.
// (The bug TestBatchAtomicForReaders aims at, fixed: a failure names them.)
func halfBatches(hist []kvcheck.Op, ops []int) []string {
	type mid struct {
		pos     int
		present bool
		value   string
	}
	inter := map[string][]mid{} // key -> intermediate states of batches
	final := map[string]map[string]bool{}
	for i := range hist {
		o := &hist[i]
		switch o.Kind {
		case kvcheck.Put, kvcheck.CAS:
			if final[o.Key] == nil {
				final[o.Key] = map[string]bool{}
			}
			final[o.Key][o.Value] = true
		case kvcheck.Batch:
			last := map[string]int{}
			for j, b := range o.Batch {
				last[b.Key] = j
			}
			for j, b := range o.Batch {
				if last[b.Key] != j {
					inter[b.Key] = append(inter[b.Key], mid{i, !b.Delete, b.Value})
				} else if !b.Delete {
					if final[b.Key] == nil {
						final[b.Key] = map[string]bool{}
					}
					final[b.Key][b.Value] = true
				}
			}
		}
	}
	if ops == nil {
		for i := range hist {
			ops = append(ops, i)
		}
	}
	var out []string
	for _, i := range ops {
		g := &hist[i]
		if g.Kind != kvcheck.Get || g.Out.Unknown || g.Out.Found && final[g.Key][g.Out.Value] {
			continue
		}
		for _, m := range inter[g.Key] {
			b := &hist[m.pos]
			if m.present == g.Out.Found && (!m.present || m.value == g.Out.Value) && b.Call <= g.Return && (b.Out.Unknown || b.Return >= g.Call) {
				out = append(out, fmt.Sprintf("op %d (c%d %v) returned the state between two ops of batch op %d (c%d %v)", i, g.Client, g, m.pos, b.Client, b))
				break
			}
		}
	}
	return out
}
