package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/btree"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// orderedMap is testMap with two ordered keyspaces, "users" and "events".
func orderedMap(name string, groups int) *cluster.Map {
	m := testMap(name, "mem", groups, 2)
	m.Keyspaces = []cluster.Keyspace{{Name: "users", Kind: "ordered", ID: 1}, {Name: "events", Kind: "ordered", ID: 2}}
	return m
}

func scanAll(t *testing.T, ks *client.Keyspace, start, end []byte, opts ...client.ScanOption) []client.KV {
	t.Helper()
	var out []client.KV
	for kv, err := range ks.Scan(context.Background(), start, end, opts...) {
		if err != nil {
			t.Fatalf("scan [%q, %q): %v", start, end, err)
		}
		out = append(out, kv)
	}
	return out
}

// TestKeyspaceOperations: the ordered keyspace's calls over a real local
// cluster (a server.Process building a btree.Store per replica from the
// map): put, get in both modes, CAS, delete, scans both ways; keyspaces
// and the hashed keyspace never see each other's keys; the errors.
func TestKeyspaceOperations(t *testing.T) {
	lc := startLocal(t, orderedMap("ksops", 2))
	c := open(t, lc, 0)
	ctx := context.Background()
	users, events := c.Keyspace("users"), c.Keyspace("events")
	k := []byte("alice")
	if _, err := users.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
	w1, err := users.Put(ctx, k, []byte("one"))
	if err != nil || w1.Version == 0 || w1.Prev != 0 {
		t.Fatalf("put: %+v %v", w1, err)
	}
	it, err := users.GetItem(ctx, k, client.Linearizable)
	if err != nil || string(it.Value) != "one" || it.Version != w1.Version || it.Applied == 0 {
		t.Fatalf("linearizable get: %+v %v", it, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		it, err := users.GetItem(ctx, k, client.StaleOK)
		if err == nil && string(it.Value) == "one" {
			break
		}
		if err != nil && !errors.Is(err, client.ErrNotFound) || time.Now().After(deadline) {
			t.Fatalf("stale-ok get: %+v %v", it, err)
		}
		time.Sleep(time.Millisecond)
	}
	// The same key in the other keyspace and in the hashed one is
	// another key.
	if _, err := events.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("events sees users' key: %v", err)
	}
	if _, err := c.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the hashed keyspace sees users' key: %v", err)
	}
	if _, err := c.Put(ctx, k, []byte("hashed")); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Put(ctx, k, []byte("event")); err != nil {
		t.Fatal(err)
	}
	if v, err := users.Get(ctx, k); err != nil || string(v) != "one" {
		t.Fatalf("users' value %q %v after writes of the same key elsewhere", v, err)
	}
	// CAS.
	if _, err := users.CompareAndSwap(ctx, k, []byte("two"), []byte("x")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("CAS with the wrong old value: %v", err)
	}
	if _, err := users.CompareAndSwap(ctx, k, nil, []byte("x")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("CAS expecting absent: %v", err)
	}
	w2, err := users.CompareAndSwap(ctx, k, []byte("one"), []byte("two"))
	if err != nil || w2.Prev != w1.Version || w2.Version <= w1.Version {
		t.Fatalf("CAS: %+v %v", w2, err)
	}
	if _, err := users.CompareVersionAndSwap(ctx, k, w1.Version, []byte("y")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("version CAS with an old version: %v", err)
	}
	if _, err := users.CompareAndSwap(ctx, []byte("bob"), nil, []byte("b")); err != nil {
		t.Fatalf("CAS of an absent key: %v", err)
	}
	// Scans, both ways, with limits and bounds.
	for _, s := range []string{"carol", "dave", "erin"} {
		if _, err := users.Put(ctx, []byte(s), []byte(s+"!")); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(kvs []client.KV) string {
		var s []string
		for _, kv := range kvs {
			s = append(s, string(kv.Key))
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		start, end string
		opts       []client.ScanOption
		want       string
	}{
		{"", "", nil, "alice,bob,carol,dave,erin"},
		{"b", "dave", nil, "bob,carol"},
		{"", "", []client.ScanOption{client.WithLimit(2)}, "alice,bob"},
		{"", "", []client.ScanOption{client.Reverse()}, "erin,dave,carol,bob,alice"},
		{"", "", []client.ScanOption{client.Reverse(), client.WithLimit(2)}, "erin,dave"},
		{"bob", "erin", []client.ScanOption{client.Reverse()}, "dave,carol,bob"},
		{"", "", []client.ScanOption{client.WithScanConsistency(client.StaleOK)}, ""},
		{"zzz", "", nil, ""},
	} {
		var start, end []byte
		if tc.start != "" {
			start = []byte(tc.start)
		}
		if tc.end != "" {
			end = []byte(tc.end)
		}
		got := keys(scanAll(t, users, start, end, tc.opts...))
		if tc.want == "" && tc.start == "" {
			continue // stale-ok: any prefix of the history; checked below
		}
		if got != tc.want {
			t.Errorf("scan [%q, %q) %d opts: %s, want %s", tc.start, tc.end, len(tc.opts), got, tc.want)
		}
	}
	if kvs := scanAll(t, events, nil, nil); keys(kvs) != "alice" || string(kvs[0].Value) != "event" {
		t.Errorf("events holds %v", kvs)
	}
	// Delete.
	if d, err := users.Delete(ctx, k); err != nil || d.Prev != w2.Version {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if _, err := users.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if d, err := users.Delete(ctx, k); err != nil || d.Prev != 0 {
		t.Fatalf("delete of a missing key: %+v %v", d, err)
	}

	// Errors: unknown keyspace (naming the configured ones), limits, a
	// done context (nothing sent).
	nope := c.Keyspace("nope")
	_, err = nope.Put(ctx, k, []byte("v"))
	if !errors.Is(err, client.ErrUnknownKeyspace) || !strings.Contains(err.Error(), `"events", "users"`) {
		t.Errorf("put to an unknown keyspace: %v", err)
	}
	if _, err := nope.Get(ctx, k); !errors.Is(err, client.ErrUnknownKeyspace) {
		t.Errorf("get of an unknown keyspace: %v", err)
	}
	for _, err := range nope.Scan(ctx, nil, nil) {
		if !errors.Is(err, client.ErrUnknownKeyspace) {
			t.Errorf("scan of an unknown keyspace: %v", err)
		}
	}
	big := bytes.Repeat([]byte("k"), c.Map().OrderedMaxKey()+1)
	if _, err := users.Put(ctx, big, []byte("v")); !errors.Is(err, client.ErrKeyTooLarge) {
		t.Errorf("put of a key too large: %v", err)
	}
	if _, err := users.Get(ctx, big); !errors.Is(err, client.ErrKeyTooLarge) {
		t.Errorf("get of a key too large: %v", err)
	}
	if _, err := users.Put(ctx, []byte("v"), make([]byte, c.Map().OrderedMaxValue()+1)); !errors.Is(err, client.ErrValueTooLarge) {
		t.Errorf("put of a value too large: %v", err)
	}
	if _, err := users.Put(ctx, nil, []byte("v")); !errors.Is(err, client.ErrEmptyKey) {
		t.Errorf("put of an empty key: %v", err)
	}
	// The longest key and value that fit are taken.
	maxKey := bytes.Repeat([]byte("m"), c.Map().OrderedMaxKey())
	if _, err := users.Put(ctx, maxKey, make([]byte, c.Map().OrderedMaxValue())); err != nil {
		t.Errorf("put of the largest key and value: %v", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := users.Put(done, []byte("late"), []byte("v")); !errors.Is(err, context.Canceled) {
		t.Errorf("put with a done context: %v", err)
	}
	if _, err := users.Get(ctx, []byte("late")); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("a put with a done context was applied: %v", err)
	}
	for _, err := range users.Scan(done, nil, nil) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("scan with a done context: %v", err)
		}
	}
}

// TestKeyspaceModel: random puts, deletes, CASes, gets and scans (both
// ways, limits, bounds, longer than a page) agree op by op with
// tidwall/btree (linearizable reads); then stale-ok scans converge to
// the model's final state.
func TestKeyspaceModel(t *testing.T) {
	keyspaceModel(t, orderedMap("ksmodel", 1))
}

func keyspaceModel(t *testing.T, m *cluster.Map) {
	lc := startLocal(t, m)
	c := open(t, lc, 0)
	ks := c.Keyspace("users")
	ctx := context.Background()
	var model btree.Map[string, string]
	rng := rand.New(rand.NewPCG(5, 18))
	const nkeys = 600 // more than ScanPage pairs in one scan
	key := func() string { return fmt.Sprintf("key%04d", rng.IntN(nkeys)) }
	ops := 1500
	if raceEnabled {
		ops = 500
	}
	for i := range ops {
		k := key()
		switch r := rng.IntN(20); {
		case r < 9:
			v := fmt.Sprintf("v%d", i)
			if _, err := ks.Put(ctx, []byte(k), []byte(v)); err != nil {
				t.Fatalf("op %d put: %v", i, err)
			}
			model.Set(k, v)
		case r < 11:
			if _, err := ks.Delete(ctx, []byte(k)); err != nil {
				t.Fatalf("op %d delete: %v", i, err)
			}
			model.Delete(k)
		case r < 13:
			old, had := model.Get(k)
			var prev []byte
			if had {
				prev = []byte(old)
			}
			if rng.IntN(3) == 0 {
				prev = []byte("wrong") // never a value the test writes
			}
			v := fmt.Sprintf("c%d", i)
			_, err := ks.CompareAndSwap(ctx, []byte(k), prev, []byte(v))
			wantOK := had && string(prev) == old || !had && prev == nil
			if (err == nil) != wantOK || err != nil && !errors.Is(err, client.ErrCASMismatch) {
				t.Fatalf("op %d CAS of %q (had %v %q, old %q): %v", i, k, had, old, prev, err)
			}
			if wantOK {
				model.Set(k, v)
			}
		case r < 17:
			v, err := ks.Get(ctx, []byte(k))
			want, had := model.Get(k)
			if had && (err != nil || string(v) != want) || !had && !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("op %d get %q: %q %v, want %q (present %v)", i, k, v, err, want, had)
			}
		default:
			a, b := key(), key()
			if a > b {
				a, b = b, a
			}
			var start, end []byte
			if rng.IntN(4) > 0 {
				start = []byte(a)
			}
			if rng.IntN(4) > 0 {
				end = []byte(b)
			}
			limit := 0
			if rng.IntN(2) == 0 {
				limit = 1 + rng.IntN(3*client.ScanPage)
			}
			rev := rng.IntN(2) == 0
			var want []string
			collect := func(k, v string) bool {
				if end != nil && k >= string(end) || k < string(start) {
					return true
				}
				want = append(want, k+"="+v)
				return limit == 0 || len(want) < limit
			}
			if rev {
				if end != nil {
					model.Descend(string(end), func(k, v string) bool {
						if k == string(end) {
							return true
						}
						return collect(k, v)
					})
				} else {
					model.Reverse(collect)
				}
			} else {
				model.Ascend(string(start), collect)
			}
			opts := []client.ScanOption{client.WithLimit(limit)}
			if rev {
				opts = append(opts, client.Reverse())
			}
			var got []string
			for _, kv := range scanAll(t, ks, start, end, opts...) {
				got = append(got, string(kv.Key)+"="+string(kv.Value))
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("op %d scan [%q, %q) limit %d reverse %v: %d pairs\n got %.300v\nwant %.300v", i, start, end, limit, rev, len(got), got, want)
			}
		}
	}
	// Stale-ok scans see a state the model had: once the writes stop,
	// every replica converges to the model's final state.
	var want []string
	model.Scan(func(k, v string) bool { want = append(want, k+"="+v); return true })
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got []string
		for _, kv := range scanAll(t, ks, nil, nil, client.WithScanConsistency(client.StaleOK)) {
			got = append(got, string(kv.Key)+"="+string(kv.Value))
		}
		if strings.Join(got, " ") == strings.Join(want, " ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stale-ok scan never converged: %d pairs, want %d", len(got), len(want))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeyspaceLinearizable: concurrent puts, CASes, gets and scans of a
// few ordered keys from several goroutines, checked by porcupine with
// kvcheck's ordered-map model (scans at their linearization point).
func TestKeyspaceLinearizable(t *testing.T) {
	keyspaceLinearizable(t, orderedMap("kslin", 1), "")
}

// keyspaceLinearizable runs TestKeyspaceLinearizable's history over m;
// with split, a split point of "users" between groups: each scan then
// reads [a, split) and [split, d) from two groups, each part
// linearizable on its own (the whole is not one atomic read), so the
// history the checker gets has each scan as its two parts, each with the
// whole scan's call and return (plus the limit the client gave the
// second part).
func keyspaceLinearizable(t *testing.T, m *cluster.Map, split string) {
	lc := startLocal(t, m)
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	h := runKsHistory(t, c.Keyspace("users"), 6, 18, []string{"a", "b", "c", "d"}, func(rng *rand.Rand, op *kvcheck.Op, w, i int) {
		switch r := rng.IntN(10); {
		case r < 4:
			op.Kind, op.Value = kvcheck.Put, fmt.Sprintf("w%d-%d", w, i)
		case r < 5:
			op.Kind = kvcheck.Delete
		case r < 7:
			op.Kind = kvcheck.Get
		default:
			op.Kind, op.Key, op.End = kvcheck.Scan, "a", "d"
			if rng.IntN(2) == 0 {
				op.Limit = 2
			}
			op.Reverse = rng.IntN(2) == 0
		}
	}, func(op kvcheck.Op) []kvcheck.Op { return scanParts(op, split) })
	if err := h.check(t); err != nil {
		t.Fatalf("%d ops: %v", len(h.ops), err)
	}
}

// runKsHistory runs workers goroutines of 40 ops each (15 under -race)
// on ks and returns their history. Worker w's ops come from a generator
// seeded (w, seed): each on a random key of keys, pick sets the rest; the
// history records what record makes of each op done (nil: the op). A
// worker's error fails the test.
func runKsHistory(t *testing.T, ks *client.Keyspace, workers int, seed uint64, keys []string,
	pick func(rng *rand.Rand, op *kvcheck.Op, w, i int), record func(kvcheck.Op) []kvcheck.Op) *ksHistory {
	t.Helper()
	h := newKsHistory()
	ops := 40
	if raceEnabled {
		ops = 15
	}
	err := goWorkers(workers, func(w int) error {
		rng := rand.New(rand.NewPCG(uint64(w), seed))
		for i := range ops {
			op := kvcheck.Op{Client: w, Key: keys[rng.IntN(len(keys))]}
			pick(rng, &op, w, i)
			op, err := h.do(context.Background(), ks, op)
			if err != nil {
				return err
			}
			if record != nil {
				h.add(record(op)...)
			} else {
				h.add(op)
			}
		}
		return nil
	})()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// ksHistory is a concurrent history of ordered-keyspace calls for
// kvcheck's ordered-map model: workers run their ops through do, which
// times them on one clock, and record them with add.
type ksHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []kvcheck.Op
}

func newKsHistory() *ksHistory { return &ksHistory{start: time.Now()} }

func (h *ksHistory) clock() int64 { return int64(time.Since(h.start)) }

// do runs op on ks (its Kind, Key, and Value, Fields or End, Limit and
// Reverse say what) between its Call and Return on h's clock, and
// returns it with what the client saw in Out. A get of an absent key
// and a merge into a plain value (Out.OK false) are outcomes, not
// errors; an error names op's client (the worker) and kind.
func (h *ksHistory) do(ctx context.Context, ks *client.Keyspace, op kvcheck.Op) (kvcheck.Op, error) {
	op.Call = h.clock()
	var err error
	switch op.Kind {
	case kvcheck.Put:
		_, err = ks.Put(ctx, []byte(op.Key), []byte(op.Value))
		op.Out.OK = err == nil
	case kvcheck.Delete:
		_, err = ks.Delete(ctx, []byte(op.Key))
		op.Out.OK = err == nil
	case kvcheck.Merge:
		f := map[string][]byte{}
		for k, v := range op.Fields {
			f[k] = []byte(v)
		}
		_, err = ks.UpdateFields(ctx, []byte(op.Key), f)
		op.Out.OK = err == nil
		if errors.Is(err, client.ErrNotFielded) {
			err = nil
		}
	case kvcheck.Get:
		var v []byte
		v, err = ks.Get(ctx, []byte(op.Key))
		if err == nil {
			op.Out = kvcheck.Output{Found: true, Value: string(v)}
		} else if errors.Is(err, client.ErrNotFound) {
			err = nil
		}
	case kvcheck.Scan:
		opts := []client.ScanOption{client.WithLimit(op.Limit)}
		if op.Reverse {
			opts = append(opts, client.Reverse())
		}
		for kv, e := range ks.Scan(ctx, []byte(op.Key), []byte(op.End), opts...) {
			if e != nil {
				err = e
				break
			}
			op.Out.Pairs = append(op.Out.Pairs, kvcheck.KV{Key: string(kv.Key), Value: string(kv.Value)})
		}
	default:
		panic(fmt.Sprintf("ksHistory.do: op kind %v", op.Kind))
	}
	op.Return = h.clock()
	if err != nil {
		return op, fmt.Errorf("worker %d: %v: %w", op.Client, op.Kind, err)
	}
	return op, nil
}

// add records ops.
func (h *ksHistory) add(ops ...kvcheck.Op) {
	h.mu.Lock()
	h.ops = append(h.ops, ops...)
	h.mu.Unlock()
}

// check is porcupine's verdict on the history (nil: linearizable); a
// checker that cannot decide fails the test.
func (h *ksHistory) check(t *testing.T) error {
	t.Helper()
	res, err := kvcheck.CheckLinearizable(h.ops, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return res.Err()
}

// goWorkers runs f(0) to f(n-1) each in its goroutine; the function it
// returns waits for them all and returns their errors, joined.
func goWorkers(n int, f func(w int) error) (wait func() error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range n {
		wg.Go(func() { errs[w] = f(w) })
	}
	return func() error {
		wg.Wait()
		return errors.Join(errs...)
	}
}

// scanParts cuts a scan op at split (a tablet boundary between groups)
// into the reads the client made: the part on the scan's side first,
// then, unless its limit was reached there, the other part with what is
// left of the limit.
func scanParts(op kvcheck.Op, split string) []kvcheck.Op {
	if op.Kind != kvcheck.Scan || split == "" || split <= op.Key || split >= op.End {
		return []kvcheck.Op{op}
	}
	lo, hi := op, op
	lo.End, hi.Key = split, split
	lo.Out.Pairs, hi.Out.Pairs = nil, nil
	for _, p := range op.Out.Pairs {
		if p.Key < split {
			lo.Out.Pairs = append(lo.Out.Pairs, p)
		} else {
			hi.Out.Pairs = append(hi.Out.Pairs, p)
		}
	}
	first, second := lo, hi
	if op.Reverse {
		first, second = hi, lo
	}
	if op.Limit > 0 && len(first.Out.Pairs) >= op.Limit {
		return []kvcheck.Op{first}
	}
	if op.Limit > 0 {
		second.Limit = op.Limit - len(first.Out.Pairs)
	}
	return []kvcheck.Op{first, second}
}

// TestKeyspaceClose: Close ends ordered reads under way (they return
// ErrClosed, not the timeout's UnavailableError), and calls after Close
// fail with ErrClosed.
func TestKeyspaceClose(t *testing.T) {
	lc := startLocal(t, orderedMap("ksclose", 1))
	c := open(t, lc, 0, client.WithTimeout(5*time.Minute))
	ks := c.Keyspace("users")
	ctx := context.Background()
	if _, err := ks.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		lc.Stop(0, i) // the group's memory is gone: reads retry until their deadline
	}
	errc := make(chan error, 2)
	go func() {
		_, err := ks.Get(ctx, []byte("k"))
		errc <- err
	}()
	go func() {
		var err error
		for _, e := range ks.Scan(ctx, nil, nil) {
			err = e
		}
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let them start (the outcome is the same if not)
	c.Close()
	for range 2 {
		if err := <-errc; !errors.Is(err, client.ErrClosed) {
			t.Errorf("a read under way at Close: %v, want ErrClosed", err)
		}
	}
	if _, err := ks.Put(ctx, []byte("k"), []byte("v")); !errors.Is(err, client.ErrClosed) {
		t.Errorf("put after Close: %v", err)
	}
	if _, err := ks.Get(ctx, []byte("k")); !errors.Is(err, client.ErrClosed) {
		t.Errorf("get after Close: %v", err)
	}
}

// TestKeyspaceReplicaErrors: what the replicas refuse reaches the caller
// as the client's error types. A client whose map promises larger nodes
// (so larger values) than the replicas' gets a *LimitError (max_value)
// from the group, with nothing written; a write sent to a group that does
// not own the keyspace fails with ErrKeyMoved naming the key.
func TestKeyspaceReplicaErrors(t *testing.T) {
	lc := startLocal(t, orderedMap("ksrefused", 2))
	loose := *lc.Map
	loose.Keyspaces = []cluster.Keyspace{{Name: "users", Kind: "ordered", ID: 1, NodeSize: 16384}, {Name: "events", Kind: "ordered", ID: 2, NodeSize: 16384}}
	c := open(t, lc, 0, client.WithMap(&loose))
	ks := c.Keyspace("users")
	ctx := context.Background()
	big := make([]byte, lc.Map.OrderedMaxValue()+1)
	if len(big) > c.Map().OrderedMaxValue() {
		t.Fatalf("the loose map's value limit %d is not looser", c.Map().OrderedMaxValue())
	}
	_, err := ks.Put(ctx, []byte("big"), big)
	var le *client.LimitError
	if !errors.As(err, &le) || le.Limit != "max_value" || !errors.Is(err, client.ErrValueTooLarge) || le.Group != 0 {
		t.Fatalf("put of a value the replicas refuse: %v", err)
	}
	if _, err := ks.Get(ctx, []byte("big")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a refused put was written: %v", err)
	}

	c2 := open(t, lc, 1)
	moved := c2.Keyspace("users")
	client.SetKeyspaceGroup(moved, 1)
	if _, err := moved.Put(ctx, []byte("elsewhere"), []byte("v")); !errors.Is(err, client.ErrKeyMoved) || !strings.Contains(err.Error(), `"elsewhere"`) {
		t.Fatalf("put to a group that does not own the keyspace: %v", err)
	}
}

// TestKeyspaceStats: Client.Stats counts the ordered keyspaces' one-sided
// reads (kvbench btree's reads per lookup and hit rate come from it): a
// client that read nothing ordered reports zeros; every get answered
// counts once with at least one node read, a scan counts its pages and
// their reads, and the cache counts the walks it answered.
//
// A get from a fresh client (an empty cache) counts every node it read:
// the root and a leaf of a two-level tree. (Counting the walk's steps,
// as OrderedResult.Reads does, it once reported 1: the walk runs again
// from the root it had cached.)
func TestKeyspaceStats(t *testing.T) {
	m := orderedMap("ksstats", 1)
	m.Limits.MaxKey = 32
	m.Keyspaces[0].NodeSize, m.Keyspaces[1].NodeSize = 512, 512 // 100 keys take several leaves under a root
	lc := startLocal(t, m)
	c := open(t, lc, 0)
	ctx := context.Background()
	if s := c.Stats(); s.OrderedGets != 0 || s.OrderedScanPages != 0 || s.OrderedCache.Lookups != 0 {
		t.Fatalf("stats before any ordered read: %+v", s)
	}
	users := c.Keyspace("users")
	const n = 100
	for i := range n {
		if _, err := users.Put(ctx, []byte(fmt.Sprintf("k%03d", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if _, err := users.GetItem(ctx, []byte(fmt.Sprintf("k%03d", i)), client.Linearizable); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Stats()
	if s.OrderedGets != n || s.OrderedGetReads < n || s.OrderedGetLists < n || s.OrderedCache.Lookups < n ||
		s.OrderedCache.Reads < n || s.OrderedCache.Warm > s.OrderedCache.Lookups || s.OrderedGetHits < 1 || s.OrderedGetHits >= n {
		t.Fatalf("stats after %d gets: %+v; want %d gets, at least one node read and one list each, the cache's walks counted, hits but not the first get", n, s, n)
	}
	if got := scanAll(t, users, nil, nil); len(got) != n {
		t.Fatalf("scan: %d pairs, want %d", len(got), n)
	}
	s2 := c.Stats()
	if s2.OrderedScanPages < 1 || s2.OrderedScanReads < 1 || s2.OrderedScanLists < 1 || s2.OrderedGets != n {
		t.Fatalf("stats after a scan: %+v; want its page and reads counted, gets unchanged", s2)
	}
	cold := open(t, lc, 1)
	if _, err := cold.Keyspace("users").GetItem(ctx, []byte("k050"), client.Linearizable); err != nil {
		t.Fatal(err)
	}
	if s := cold.Stats(); s.OrderedGets != 1 || s.OrderedGetReads < 2 || s.OrderedGetHits != 0 || s.OrderedCache.Nodes < 1 {
		t.Fatalf("stats of a fresh client's first get: %+v; want 1 get of at least 2 node reads (root and leaf), not a hit, the root cached", s)
	}
}

// TestKeyspaceScanPairsOwned: a scan's pairs are the caller's: later scans
// (which reuse the reader's buffers) do not change them, and appending
// to one pair's key or value does not overwrite the next pair's bytes
// (the pairs of a page share one allocation).
func TestKeyspaceScanPairsOwned(t *testing.T) {
	lc := startLocal(t, orderedMap("ksowned", 1))
	c := open(t, lc, 0)
	ctx := context.Background()
	users := c.Keyspace("users")
	for i := range 50 {
		if _, err := users.Put(ctx, fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "v%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	first := scanAll(t, users, []byte("k000"), nil, client.WithScanConsistency(client.Linearizable))
	if len(first) != 50 {
		t.Fatalf("scan: %d pairs, want 50", len(first))
	}
	for i := range first {
		_ = append(first[i].Key, 'X')
		_ = append(first[i].Value, 'Y')
	}
	for range 3 {
		scanAll(t, users, []byte("k010"), nil, client.WithScanConsistency(client.Linearizable))
	}
	for i, p := range first {
		if string(p.Key) != fmt.Sprintf("k%03d", i) || string(p.Value) != fmt.Sprintf("v%03d", i) {
			t.Fatalf("pair %d after appends and later scans: %q=%q", i, p.Key, p.Value)
		}
	}
}
