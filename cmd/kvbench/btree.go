package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unsafe"

	tbtree "github.com/tidwall/btree"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

const btreeUsage = `usage: kvbench btree [flags]

Measures the ordered keyspace (a B-link tree read one-sided, package
btree; issue 18) through the path a user takes: client.Keyspace's
GetItem, Put and Scan on the cluster's ordered keyspace "ordered". The
cluster is started as 'kvbench kv' starts it: --groups groups (default 1)
of 3 replicas on shm in a child process of kvbench, the client in this one
on a node of its own, the ordered keyspace cut into one tablet per group
at the loaded keys' quantiles (split points k(records*j/groups)); or with
--embedded kvserver's embedded cluster (--groups x 3 replicas; its ordered
keyspace has no split points: one tablet, in group 0), the client opening
its map file.

Every run starts a fresh cluster and loads --records records (16-byte
keys, 100-byte values) into the ordered keyspace (single puts on
--put-threads goroutines, progress on stderr) and the same keys into the
hashed keyspace (batches, as kvbench kv loads). Then, in this order:

  lookup   random loaded keys, stale-ok and linearizable, at each --threads
           goroutine count, after a warm-up (the client's cache of inner
           nodes is warm). baseline: hashed gets of the same keys at the
           same count and consistency (ratio_ops = ordered ops/s / hashed
           ops/s, ratio_p50 = ordered p50 / hashed p50); floor: a
           tidwall/btree Map of the same records in this process, Get at
           the same count (ratio_floor_ops = ordered / floor ops/s).
           reads_per_op: one-sided node reads per lookup, lists_per_op
           their round trips (client.Stats(): OrderedGetReads,
           OrderedGetLists), hit_rate: the lookups that read the leaf
           alone, its parent cached (OrderedGetHits / OrderedGets),
           cache_bytes: the client's cache of inner nodes afterwards
           (raw_bytes: the records' key and value bytes). From several
           goroutines reads_per_op may be below 1: read delegation lets
           concurrent lookups of one leaf share its read.
  scan     --scan-length keys (YCSB E's maxscanlength) from random starts,
           Scan with WithLimit, both consistencies, at each --threads
           count: p50, keys/s, node reads per scan. baseline: the lookup
           row of the same count and consistency (ratio_p50 = scan p50 /
           lookup p50: a scan's cost in warm lookups).
  put      overwrites of random loaded keys at 1 and --put-threads
           goroutines. baseline: hashed puts of the same keys at the same
           count.
  insert   puts of new keys (a loaded key with its last digit made a
           letter: they fall between the loaded keys, so over every
           tablet) at 1 and --put-threads goroutines. baseline: hashed
           puts of the same new keys at the same count. Run it at
           --groups 1, 2, 4 and 8 to see inserts scale with groups
           (the row's groups column).
  cold     a second client opened after the load (an empty cache) makes
           --cold linearizable lookups of random keys from 1 goroutine;
           curve: the mean node reads per lookup over each --cold/20
           consecutive lookups (curve_step of them), first_reads: the
           first lookup's (the tree's height, or more).

Cost per op (allocations, wake-ups, CPU of the client's and the replicas'
processes) and latency are measured as by 'kvbench kv' (see its --help).
Every figure is the median over --runs runs; ratios are per run, then
the median.

Example:
  kvbench btree --json --runs 3

flags:
`

// btreeFlags are the options of the btree benchmark.
type btreeFlags struct {
	commonFlags
	records    int
	threads    []int
	putThreads int
	scanLen    int
	cold       int
	et         time.Duration
	quick      bool
	embedded   bool
	groups     int
	kvserver   string
	rows       []string // of btreeRowNames
	insertPct  int
	nodeSize   int
}

var btreeRowNames = []string{"memory", "lookup", "mixed", "scan", "put", "insert", "cold"}

func (o *btreeFlags) row(name string) bool { return slices.Contains(o.rows, name) }

func parseBTreeFlags(args []string, stderr io.Writer) (*btreeFlags, error) {
	o := &btreeFlags{}
	fs := o.commonFlags.flagSet("btree", btreeUsage, stderr,
		"how long each lookup, scan and put measurement runs (after its warm-up)",
		"repeat a measurement while other processes use more than this many CPUs",
		"write a CPU profile of this process (the client side) to `file`")
	o.duration = 2 * time.Second
	fs.Lookup("duration").DefValue = "2s"
	fs.IntVar(&o.records, "records", 100000, "records loaded into the ordered keyspace (and the same keys into the hashed one)")
	threads := fs.String("threads", "1,8", "comma-separated goroutine counts of the lookup and scan rows")
	fs.IntVar(&o.putThreads, "put-threads", 64, "goroutines of the load and of the saturated put row (the other put row has 1)")
	fs.IntVar(&o.scanLen, "scan-length", 100, "keys per scan (YCSB E's maxscanlength)")
	fs.IntVar(&o.cold, "cold", 1000, "lookups of the cold row (from an empty cache)")
	fs.DurationVar(&o.et, "election-timeout", time.Second, "the replicas' election timeout")
	fs.BoolVar(&o.quick, "quick", false, "smoke test: --records 20000, --duration 200ms, --runs 1 and --retries 0 unless given")
	fs.BoolVar(&o.embedded, "embedded", false, "the replicas are kvserver's embedded cluster (what make run starts), the client opens its map file")
	fs.IntVar(&o.groups, "groups", 1, "groups of 3 replicas (with --embedded: kvserver --groups, default 2); the ordered keyspace has a tablet per group unless --embedded")
	fs.StringVar(&o.kvserver, "kvserver", "", "--embedded: the kvserver `binary` to run (default: go build it from this module)")
	rows := fs.String("rows", "", "comma-separated measurements: memory, lookup, mixed, scan, put, insert, cold (default all)")
	fs.IntVar(&o.insertPct, "insert-pct", 5, "percent of inserts among the mixed row's lookups")
	nodeSize := fs.String("node-size", "", "the ordered keyspace's node `size` (e.g. 2KiB; default the cluster's, 4 KiB); below what keys of 255 bytes need, the cluster's max_key is 64")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("btree: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range splitList(*rows) {
		if !slices.Contains(btreeRowNames, s) {
			return nil, fmt.Errorf("btree: --rows: unknown measurement %q (want %s)", s, strings.Join(btreeRowNames, ", "))
		}
		if !slices.Contains(o.rows, s) {
			o.rows = append(o.rows, s)
		}
	}
	if len(o.rows) == 0 {
		o.rows = slices.Clone(btreeRowNames)
	}
	if !o.embedded && set["kvserver"] {
		return nil, errors.New("btree: --kvserver goes with --embedded")
	}
	if *nodeSize != "" {
		if o.embedded {
			return nil, errors.New("btree: --node-size goes without --embedded")
		}
		n, err := cluster.ParseByteSize(*nodeSize)
		if err == nil {
			err = (btree.Config{NodeSize: n, MaxKey: 64 + cluster.KeyspacePrefix}).Validate()
		}
		if err != nil {
			return nil, fmt.Errorf("btree: --node-size: %w", err)
		}
		o.nodeSize = n
	}
	if o.embedded && !set["groups"] {
		o.groups = 2
	}
	if o.quick {
		o.commonFlags.quickDefaults(set, &o.records)
	}
	var err error
	if o.threads, err = parseThreads("btree", *threads, o.threads); err != nil {
		return nil, err
	}
	if err := o.commonFlags.check("btree"); err != nil {
		return nil, err
	}
	switch {
	case len(o.threads) == 0:
		return nil, errors.New("btree: --threads lists no goroutine count")
	case o.groups < 1 || o.putThreads <= 0 || o.et <= 0:
		return nil, errors.New("btree: --groups, --put-threads and --election-timeout must be positive")
	case o.scanLen <= 0 || o.cold <= 0:
		return nil, errors.New("btree: --scan-length and --cold must be positive")
	case o.insertPct < 0 || o.insertPct > 100:
		return nil, fmt.Errorf("btree: --insert-pct %d out of 0..100", o.insertPct)
	case o.records <= o.scanLen:
		return nil, fmt.Errorf("btree: --records must be more than --scan-length (%d)", o.scanLen)
	}
	return o, nil
}

// kvFlags is the cluster setup of kvbench kv that btree shares: its
// cluster, its client and its hashed baseline, with no Redis.
func (o *btreeFlags) kvFlags() *kvFlags {
	f := &kvFlags{commonFlags: o.commonFlags, records: o.records, threads: o.threads, putThreads: o.putThreads, putRows: []int{1, o.putThreads},
		et: o.et, embedded: o.embedded, groups: o.groups, kvserver: o.kvserver, ordered: true}
	if !o.embedded {
		f.childGroups, f.orderedSplits, f.orderedNodeSize = o.groups, btreeSplits(o.records, o.groups), o.nodeSize
	}
	return f
}

// btreeSplits are the split points of groups tablets over the keys of
// records loaded records: their quantiles.
func btreeSplits(records, groups int) []string {
	var out []string
	key := make([]byte, kvKeySize)
	for j := 1; j < groups; j++ {
		fillKey(key, records*j/groups)
		out = append(out, string(key))
	}
	return out
}

// btreeStat is one measurement of an ordered row: the closed loop's
// figures and what the client's ordered reads did meanwhile, per op.
type btreeStat struct {
	kvstat
	reads, lists float64 // node reads and their round trips per op
	hitRate      float64 // lookups: those that read only the leaf / all; -1: none
	cacheBytes   int     // lookups: the client's cache of inner nodes after it
	// writes: the replicas' ordered work meanwhile (child mode)
	srv srvWork
	// keys: the ordered keys the groups held after it (child mode; 0:
	// unknown)
	keys int
}

// srvWork is what the groups' ordered parts applied during a
// measurement: per group (its first replica's counts) the requests
// (messages) and writes, and over all groups the inserts, leaf splits and
// tablet splits.
type srvWork struct {
	ok                         bool
	messages, writes           []uint64
	inserts, leafSplits, tabSp uint64
	// prefetched and prefetchUsed: the first replicas' keys whose
	// leaves a batch's prefetch touched, and applies that took one.
	prefetched, prefetchUsed uint64
}

// btreeKey names a row.
type btreeKey struct {
	op, cons string
	threads  int
}

// btreeMeas is one run's measurement of a row, with its baseline and
// floor.
type btreeMeas struct {
	ours              btreeStat
	base, floor       kvstat
	hasBase, hasFloor bool
	curve             []float64 // cold: mean reads per lookup per step
	first             float64   // cold: the first lookup's reads
	mem               memFig    // memory
}

// memFig is the memory row's figures: the ordered part's nodes over the
// groups (one replica each).
type memFig struct {
	keys, leaves, inner, nodeSize, leafBytes, arenaBytes int
}

type btreeResults struct {
	order  []btreeKey
	rows   map[btreeKey][]btreeMeas
	failed []string
}

func (r *btreeResults) add(k btreeKey, m btreeMeas) {
	if _, ok := r.rows[k]; !ok {
		r.order = append(r.order, k)
	}
	r.rows[k] = append(r.rows[k], m)
}

// runBTree is the btree subcommand.
func runBTree(args []string, stdout, stderr io.Writer) error {
	o, err := parseBTreeFlags(args, stderr)
	if err != nil {
		return err
	}
	sweepShmDir(o.shmDir, stderr)
	if o.cpuProf != "" {
		stop, err := startProfile(o.cpuProf)
		if err != nil {
			return fmt.Errorf("btree: %w", err)
		}
		defer stop()
	}
	bin, cleanup, err := kvserverBinary("btree", o.embedded, o.kvserver, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	res := &btreeResults{rows: map[btreeKey][]btreeMeas{}}
	fmt.Fprintf(stderr, "kvbench btree: %d run(s) of %d records; load average %s\n", o.runs, o.records, loadAvg())
	for run := 1; run <= o.runs; run++ {
		if err := btreeRunOnce(o, run, bin, res, stderr); err != nil {
			res.failed = append(res.failed, fmt.Sprintf("run %d", run))
			fmt.Fprintf(stderr, "kvbench btree: run %d: %v\n", run, err)
		}
	}
	out := summarizeBTree(res, o)
	return emitRows("btree", stdout, stderr, out, o.json, func() { printBTreeTable(stdout, out, o) }, res.failed)
}

// btreeRun is one run's state.
type btreeRun struct {
	o     *btreeFlags
	e     *kvEnv
	ks    *client.Keyspace
	run   int
	tm    timing
	res   *btreeResults
	errw  io.Writer
	floor *tbtree.Map[string, []byte]
	// lookup is this run's lookup measurements (the scans' baseline).
	lookup map[btreeKey]kvstat
}

func btreeRunOnce(o *btreeFlags, run int, bin string, res *btreeResults, stderr io.Writer) (err error) {
	note := func(f string, a ...any) {
		fmt.Fprintf(stderr, "[run %d/%d] "+f+"\n", append([]any{run, o.runs}, a...)...)
	}
	e, err := openKVEnv(o.kvFlags(), bin, "", note)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.close()) }()
	b := &btreeRun{o: o, e: e, ks: e.c.Keyspace(cluster.DefaultOrderedKeyspace), run: run, res: res, errw: stderr, lookup: map[btreeKey]kvstat{},
		tm: timing{dur: o.duration, warm: min(o.duration/5, 200*time.Millisecond)}}
	if err := b.load(); err != nil {
		return err
	}
	if err := e.plainLoad(); err != nil {
		return err
	}
	if o.row("memory") {
		if err := b.memoryRow(); err != nil {
			res.failed = append(res.failed, fmt.Sprintf("run %d: memory", run))
			note("memory: %v", err)
		}
	}
	if o.row("lookup") {
		b.floor = floorTree(o.records)
		b.lookups()
	}
	if o.row("mixed") {
		b.mixed()
	}
	if o.row("scan") {
		b.scans()
	}
	if o.row("put") {
		b.puts()
	}
	if o.row("insert") {
		b.inserts()
	}
	if o.row("cold") {
		if err := b.coldRow(); err != nil {
			res.failed = append(res.failed, fmt.Sprintf("run %d: cold", run))
			note("cold: %v", err)
		}
	}
	return nil
}

// load puts every record into the ordered keyspace with --put-threads
// goroutines (an ordered keyspace has no batches yet).
func (b *btreeRun) load() error {
	o, e := b.o, b.e
	start := time.Now()
	var next, done atomic.Int64
	errs := make([]error, o.putThreads)
	var wg sync.WaitGroup
	for j := range o.putThreads {
		wg.Go(func() {
			key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
			for i := int(next.Add(1) - 1); i < o.records; i = int(next.Add(1) - 1) {
				fillKey(key, i)
				fillValue(val, key, 'a')
				if _, err := b.ks.Put(e.ctx, key, val); err != nil {
					errs[j] = fmt.Errorf("ordered put of key %d: %w", i, err)
					next.Store(int64(o.records))
					return
				}
				if d := done.Add(1); d%int64(max(o.records/10, 1)) == 0 {
					el := time.Since(start)
					e.note("ordered: loaded %d/%d keys in %.1fs (%s keys/s)", d, o.records, el.Seconds(), fmtOps(float64(d)/el.Seconds()))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.note("ordered: loaded %d keys (single puts on %d goroutines) in %.1fs", o.records, o.putThreads, time.Since(start).Seconds())
	return nil
}

// floorTree is the in-process floor: a tidwall/btree Map of the records.
func floorTree(records int) *tbtree.Map[string, []byte] {
	var m tbtree.Map[string, []byte]
	key := make([]byte, kvKeySize)
	for i := range records {
		fillKey(key, i)
		v := make([]byte, kvValueSize)
		fillValue(v, key, 'a')
		m.Load(string(key), v) // ascending keys: Load appends
	}
	return &m
}

// measure is one ordered measurement (retried while disturbed, as kv's
// are) with the client's ordered-read counters around it.
func (b *btreeRun) measure(threads int, mk func(g int) kvOp) (btreeStat, error) {
	return retryDisturbed("btree", b.o.commonFlags, b.errw, func() (btreeStat, error) {
		w0, werr := b.orderedStats()
		s0 := b.e.c.Stats()
		st, err := b.e.sample(b.tm, threads, mk, true)
		s1 := b.e.c.Stats()
		bs := btreeStat{kvstat: st, hitRate: -1}
		if w1, err := b.orderedStats(); werr == nil && err == nil && w0 != nil {
			bs.srv = workBetween(w0, w1)
			for _, st := range w1 {
				bs.keys += st.Keys
			}
		}
		if err != nil || st.total == 0 {
			return bs, err
		}
		n := float64(st.total)
		gets, pages := s1.OrderedGets-s0.OrderedGets, s1.OrderedScanPages-s0.OrderedScanPages
		switch {
		case gets > 0: // per lookup (the mixed row's inserts read nothing)
			bs.reads = float64(s1.OrderedGetReads-s0.OrderedGetReads) / float64(gets)
			bs.lists = float64(s1.OrderedGetLists-s0.OrderedGetLists) / float64(gets)
			bs.hitRate = float64(s1.OrderedGetHits-s0.OrderedGetHits) / float64(gets)
			bs.cacheBytes = s1.OrderedCache.Bytes
		case pages > 0:
			bs.reads = float64(s1.OrderedScanReads-s0.OrderedScanReads) / n
			bs.lists = float64(s1.OrderedScanLists-s0.OrderedScanLists) / n
		}
		return bs, nil
	})
}

// measureBase is a baseline's measurement (no cost columns).
func (b *btreeRun) measureBase(threads int, mk func(g int) kvOp) (kvstat, error) {
	return retryDisturbed("btree", b.o.commonFlags, b.errw, func() (kvstat, error) { return b.e.sample(b.tm, threads, mk, false) })
}

// measureBaseCost is a write baseline's measurement with its cost per op
// (the put and insert rows compare CPU per write and writes per message
// with it).
func (b *btreeRun) measureBaseCost(threads int, mk func(g int) kvOp) (kvstat, error) {
	return retryDisturbed("btree", b.o.commonFlags, b.errw, func() (kvstat, error) { return b.e.sample(b.tm, threads, mk, true) })
}

// orderedStats is each group's ordered stats, read from its first
// replica (nil with --embedded: kvserver's replicas are not the child's).
func (b *btreeRun) orderedStats() ([]btree.StoreStats, error) {
	if b.e.proc == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(b.e.ctx, stallTimeout)
	defer cancel()
	reps, err := b.e.proc.ch.Stats(ctx) // in map order
	if err != nil {
		return nil, err
	}
	var out []btree.StoreStats
	i := 0
	for _, members := range b.e.m.Groups {
		if i >= len(reps) || reps[i].Ordered == nil {
			return nil, errors.New("a replica reports no ordered part")
		}
		out = append(out, *reps[i].Ordered)
		i += len(members)
	}
	return out, nil
}

func workBetween(a, b []btree.StoreStats) srvWork {
	w := srvWork{ok: len(a) == len(b)}
	if !w.ok {
		return w
	}
	for g := range a {
		w.messages = append(w.messages, b[g].Requests-a[g].Requests)
		w.writes = append(w.writes, b[g].Writes-a[g].Writes)
		w.inserts += b[g].Inserts - a[g].Inserts
		w.leafSplits += b[g].LeafSplits - a[g].LeafSplits
		w.tabSp += b[g].TabletSplits - a[g].TabletSplits
		w.prefetched += b[g].Prefetched - a[g].Prefetched
		w.prefetchUsed += b[g].PrefetchUsed - a[g].PrefetchUsed
	}
	return w
}

// srvLine says what the groups applied.
func (w srvWork) String() string {
	if !w.ok {
		return "replicas' counts unknown"
	}
	var per []string
	for g := range w.messages {
		wpm := 0.0
		if w.messages[g] > 0 {
			wpm = float64(w.writes[g]) / float64(w.messages[g])
		}
		per = append(per, fmt.Sprintf("g%d %d msgs %.2f writes/msg", g, w.messages[g], wpm))
	}
	return fmt.Sprintf("%s; %d inserts, %.1f leaf splits per k inserts, %d tablet splits; %d keys prefetched, %d applies took a prefetched leaf", strings.Join(per, ", "), w.inserts, w.splitsPerK(), w.tabSp, w.prefetched, w.prefetchUsed)
}

func (w srvWork) splitsPerK() float64 {
	if w.inserts == 0 {
		return 0
	}
	return 1000 * float64(w.leafSplits) / float64(w.inserts)
}

// writeCost says what a write row cost per op: CPU of the client's and
// the replicas' processes and the writes per message the client sent.
func writeCost(st kvstat) string {
	c := st.cost
	if !c.ok {
		return "cost unknown"
	}
	return fmt.Sprintf("cpu %.1f µs client + %.1f µs replicas, %.2f writes/message", c.clientCPU, c.serverCPU, c.writesPerMsg)
}

// randomKeys returns an op maker: each goroutine fills key with a random
// loaded key and calls op.
func (b *btreeRun) randomKeys(op func(key []byte, val []byte) error) func(g int) kvOp {
	return func(g int) kvOp {
		rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
		key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
		return func() error {
			fillKey(key, rng.IntN(b.o.records))
			return op(key, val)
		}
	}
}

func (b *btreeRun) fail(what string, err error) {
	b.res.failed = append(b.res.failed, fmt.Sprintf("run %d: %s", b.run, what))
	b.e.note("%s: %v", what, err)
}

// lookups measures the lookup rows, each with its hashed baseline and the
// in-process floor (measured once per goroutine count).
func (b *btreeRun) lookups() {
	ctx := b.e.ctx
	for _, t := range b.o.threads {
		var floor kvstat
		var hasFloor bool
		for _, cons := range []client.Consistency{client.StaleOK, client.Linearizable} {
			k := btreeKey{"lookup", cons.String(), t}
			what := fmt.Sprintf("lookup %s x%d", k.cons, t)
			st, err := b.measure(t, b.randomKeys(func(key, _ []byte) error {
				it, err := b.ks.GetItem(ctx, key, cons)
				if err != nil {
					return fmt.Errorf("ordered get of %s: %w", key, err)
				}
				return checkValue(it.Value, key)
			}))
			if err != nil {
				b.fail(what, err)
				continue
			}
			m := btreeMeas{ours: st}
			get := b.e.ours.getter(cons)
			if m.base, err = b.measureBase(t, b.randomKeys(func(key, _ []byte) error {
				v, found, err := get(key)
				if err == nil && !found {
					err = fmt.Errorf("hashed key %s not found", key)
				}
				if err != nil {
					return err
				}
				return checkValue(v, key)
			})); err != nil {
				b.fail("hashed get "+what, err)
			} else {
				m.hasBase = true
			}
			if !hasFloor {
				if floor, err = b.measureBase(t, b.randomKeys(func(key, _ []byte) error {
					v, ok := b.floor.Get(unsafe.String(unsafe.SliceData(key), len(key)))
					if !ok {
						return fmt.Errorf("tidwall/btree: key %s not found", key)
					}
					return checkValue(v, key)
				})); err != nil {
					b.fail("tidwall/btree get x"+strconv.Itoa(t), err)
				} else {
					hasFloor = true
				}
			}
			m.floor, m.hasFloor = floor, hasFloor
			b.e.note("%-26s p50 %-8s %8s ops/s, %.3f reads/lookup, hit rate %.4f; hashed get p50 %-8s %8s ops/s; tidwall/btree %8s ops/s",
				what, fmtDur(st.p50), fmtOps(st.opsPerS), st.reads, st.hitRate, fmtDur(m.base.p50), fmtOps(m.base.opsPerS), fmtOps(m.floor.opsPerS))
			b.res.add(k, m)
			b.lookup[k] = st.kvstat
		}
	}
}

// memoryRow reads what the ordered part takes on the replicas after the
// load: nodes and leaf bytes over the groups (one replica each; the
// group's others hold the same tree), against the records' raw bytes.
func (b *btreeRun) memoryRow() error {
	if b.e.proc == nil {
		b.e.note("memory: not measured with --embedded (kvserver's replicas report no ordered stats to kvbench)")
		return nil
	}
	// Every replica has applied the load once its keys are all there.
	var sts []btree.StoreStats
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		if sts, err = b.orderedStats(); err != nil {
			return err
		}
		keys := 0
		for _, st := range sts {
			keys += st.Keys
		}
		if keys == b.o.records {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the groups hold %d ordered keys, want %d", keys, b.o.records)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var f memFig
	for _, st := range sts {
		f.keys += st.Keys
		f.leaves += st.Leaves
		f.inner += st.Inner
		f.leafBytes += st.LeafBytes
		f.arenaBytes += st.ArenaBytes
		f.nodeSize = st.NodeSize
	}
	m := btreeMeas{mem: f, ours: btreeStat{hitRate: -1, kvstat: kvstat{otherCPU: -1}}}
	b.e.note("memory: %d keys in %d leaves and %d inner nodes of %d B: %.0f B of nodes per record (raw %d B, %.2fx), leaf fill %.3f, arena %.0f B per record",
		f.keys, f.leaves, f.inner, f.nodeSize, f.nodePerRecord(), kvKeySize+kvValueSize, f.nodePerRecord()/float64(kvKeySize+kvValueSize), f.fill(), f.arenaPerRecord())
	b.res.add(btreeKey{"memory", "", 0}, m)
	return nil
}

func (f memFig) nodePerRecord() float64 {
	return float64((f.leaves+f.inner)*f.nodeSize) / float64(max(f.keys, 1))
}

func (f memFig) arenaPerRecord() float64 { return float64(f.arenaBytes) / float64(max(f.keys, 1)) }

func (f memFig) fill() float64 {
	if f.leaves == 0 {
		return 0
	}
	return float64(f.leafBytes) / float64(f.leaves*f.nodeSize)
}

// mixed measures the mixed rows: stale-ok lookups of random loaded keys
// with --insert-pct percent inserts of new keys among them (the cache's
// hit rate while leaves split), against hashed gets and puts in the same
// mix.
func (b *btreeRun) mixed() {
	ctx, pct := b.e.ctx, b.o.insertPct
	mix := func(get func(key []byte) error, put func(key, val []byte) error) func(g int) kvOp {
		return func(g int) kvOp {
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
			key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
			i := 0
			return func() error {
				fillKey(key, rng.IntN(b.o.records))
				// Inserts spread evenly, pct of every 100 ops, the first
				// op a lookup: a short run (a goroutine may complete
				// one op) still measures lookups, and each run has the
				// mix it names.
				i++
				if i*pct/100 > (i-1)*pct/100 {
					key[kvKeySize-1] = byte('a' + rng.IntN(26))
					fillValue(val, key, 'm')
					return put(key, val)
				}
				return get(key)
			}
		}
	}
	for _, t := range b.o.threads {
		k := btreeKey{"mixed", client.StaleOK.String(), t}
		what := fmt.Sprintf("mixed %d%% inserts x%d", pct, t)
		st, err := b.measure(t, mix(func(key []byte) error {
			it, err := b.ks.GetItem(ctx, key, client.StaleOK)
			if err != nil {
				return fmt.Errorf("ordered get of %s: %w", key, err)
			}
			return checkValue(it.Value, key)
		}, func(key, val []byte) error {
			_, err := b.ks.Put(ctx, key, val)
			return err
		}))
		if err != nil {
			b.fail(what, err)
			continue
		}
		m := btreeMeas{ours: st}
		get, put := b.e.ours.getter(client.StaleOK), b.e.ours.putter()
		if m.base, err = b.measureBase(t, mix(func(key []byte) error {
			v, found, err := get(key)
			if err == nil && !found {
				err = fmt.Errorf("hashed key %s not found", key)
			}
			if err != nil {
				return err
			}
			return checkValue(v, key)
		}, put)); err != nil {
			b.fail("hashed "+what, err)
		} else {
			m.hasBase = true
		}
		b.e.note("%-26s p50 %-8s %8s ops/s, %.3f reads/lookup, hit rate %.4f, cache %d B; hashed p50 %-8s %8s ops/s",
			what, fmtDur(st.p50), fmtOps(st.opsPerS), st.reads, st.hitRate, st.cacheBytes, fmtDur(m.base.p50), fmtOps(m.base.opsPerS))
		b.res.add(k, m)
	}
}

// scans measures the scan rows; their baseline is this run's lookup row
// of the same count and consistency.
func (b *btreeRun) scans() {
	ctx, n := b.e.ctx, b.o.scanLen
	for _, t := range b.o.threads {
		for _, cons := range []client.Consistency{client.StaleOK, client.Linearizable} {
			k := btreeKey{"scan", cons.String(), t}
			what := fmt.Sprintf("scan %d %s x%d", n, k.cons, t)
			st, err := b.measure(t, func(g int) kvOp {
				rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
				start := make([]byte, kvKeySize)
				return func() error {
					first := rng.IntN(b.o.records - n + 1)
					fillKey(start, first)
					got := 0
					for kv, err := range b.ks.Scan(ctx, start, nil, client.WithLimit(n), client.WithScanConsistency(cons)) {
						if err != nil {
							return fmt.Errorf("scan from %s: %w", start, err)
						}
						if err := checkValue(kv.Value, kv.Key); err != nil {
							return err
						}
						got++
					}
					if got != n {
						return fmt.Errorf("scan from %s: %d keys, want %d", start, got, n)
					}
					return nil
				}
			})
			if err != nil {
				b.fail(what, err)
				continue
			}
			m := btreeMeas{ours: st}
			m.base, m.hasBase = b.lookup[btreeKey{"lookup", k.cons, t}]
			b.e.note("%-26s p50 %-8s %8s keys/s, %.2f reads/scan in %.2f round trips", what, fmtDur(st.p50), fmtOps(st.opsPerS*float64(n)), st.reads, st.lists)
			b.res.add(k, m)
		}
	}
}

// puts measures the put rows (overwrites of loaded keys) against hashed
// puts of the same keys.
func (b *btreeRun) puts() {
	b.writeRows("put", b.randomKeys, func(i int) byte { return byte('b' + i) }, "")
}

// inserts measures the insert rows (puts of new keys between the loaded
// ones) against hashed puts of the same keys.
func (b *btreeRun) inserts() {
	b.writeRows("insert", b.newKeys, func(int) byte { return 'i' }, fmt.Sprintf(" (%d groups)", b.o.groups))
}

// writeRows measures op's rows, x1 and x--put-threads: ordered puts of
// the keys that keys picks, values tagged tag(row), against hashed puts
// of the same keys; note is added to the hashed figures' log line.
func (b *btreeRun) writeRows(op string, keys func(func(key, val []byte) error) func(g int) kvOp, tag func(row int) byte, note string) {
	ctx := b.e.ctx
	for i, t := range []int{1, b.o.putThreads} {
		if i > 0 && t == 1 {
			break
		}
		tag := tag(i)
		what := fmt.Sprintf("%s x%d", op, t)
		st, err := b.measure(t, keys(func(key, val []byte) error {
			fillValue(val, key, tag)
			_, err := b.ks.Put(ctx, key, val)
			return err
		}))
		if err != nil {
			b.fail(what, err)
			continue
		}
		m := btreeMeas{ours: st}
		put := b.e.ours.putter()
		if m.base, err = b.measureBaseCost(t, keys(func(key, val []byte) error {
			fillValue(val, key, tag)
			return put(key, val)
		})); err != nil {
			b.fail("hashed "+what, err)
		} else {
			m.hasBase = true
		}
		b.e.note("%-26s p50 %-8s %8s ops/s; hashed put p50 %-8s %8s ops/s%s", what, fmtDur(st.p50), fmtOps(st.opsPerS), fmtDur(m.base.p50), fmtOps(m.base.opsPerS), note)
		b.e.note("%-26s per op: ordered %s; hashed %s", what, writeCost(st.kvstat), writeCost(m.base))
		b.e.note("%-26s replicas: %s", what, st.srv)
		b.res.add(btreeKey{op, "", t}, m)
	}
}

// newKeys returns an op maker: each goroutine fills key with a random
// new key (a loaded key whose last digit is a random letter: between two
// loaded keys, so new keys spread over the tablets as loaded ones do)
// and calls op.
func (b *btreeRun) newKeys(op func(key []byte, val []byte) error) func(g int) kvOp {
	return func(g int) kvOp {
		rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
		key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
		return func() error {
			fillKey(key, rng.IntN(b.o.records))
			key[kvKeySize-1] = byte('a' + rng.IntN(26))
			return op(key, val)
		}
	}
}

// coldRow opens a second client (an empty cache) and makes --cold
// linearizable lookups of random keys, recording each one's node reads.
func (b *btreeRun) coldRow() error {
	c, closeC, err := b.e.secondClient()
	if err != nil {
		return err
	}
	defer closeC()
	ks := c.Keyspace(cluster.DefaultOrderedKeyspace)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	key := make([]byte, kvKeySize)
	reads := make([]float64, b.o.cold)
	start := time.Now()
	for i := range reads {
		fillKey(key, rng.IntN(b.o.records))
		s0 := c.Stats().OrderedGetReads
		it, err := ks.GetItem(b.e.ctx, key, client.Linearizable)
		if err != nil {
			return fmt.Errorf("cold lookup %d of %s: %w", i, key, err)
		}
		if err := checkValue(it.Value, key); err != nil {
			return err
		}
		reads[i] = float64(c.Stats().OrderedGetReads - s0)
	}
	el := time.Since(start)
	step := coldStep(b.o.cold)
	m := btreeMeas{first: reads[0], ours: btreeStat{hitRate: -1, kvstat: kvstat{n: uint64(len(reads)), total: uint64(len(reads)), otherCPU: -1}}}
	var sum float64
	for i := 0; i < len(reads); i += step {
		part := reads[i:min(i+step, len(reads))]
		var s float64
		for _, r := range part {
			s += r
		}
		sum += s
		m.curve = append(m.curve, s/float64(len(part)))
	}
	m.ours.reads = sum / float64(len(reads))
	m.ours.opsPerS = float64(len(reads)) / el.Seconds()
	cs := c.Stats().OrderedCache
	b.e.note("cold: %d lookups from an empty cache: first %.0f reads, mean %.3f; per %d: %v; cache now %d nodes, %d B",
		len(reads), m.first, m.ours.reads, step, fmtCurve(m.curve), cs.Nodes, cs.Bytes)
	b.res.add(btreeKey{"cold", client.Linearizable.String(), 1}, m)
	return nil
}

// coldStep is how many consecutive cold lookups one curve point averages.
func coldStep(n int) int { return max(1, (n+19)/20) }

func fmtCurve(c []float64) string {
	s := make([]string, len(c))
	for i, v := range c {
		s[i] = strconv.FormatFloat(v, 'f', 2, 64)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// secondClient opens another client of the run's cluster (on the map's
// second client node, or a slot of kvserver's through its map file).
func (e *kvEnv) secondClient() (*client.Client, func(), error) {
	octx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if e.srv != nil {
		c, err := client.Open(octx, client.WithMapFile(e.srv.mapFile))
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.Close() }, nil
	}
	node, err := fabric.Open(fabric.ForMap(e.m), kvClientID+1)
	if err != nil {
		return nil, nil, fmt.Errorf("the second client's node: %w", err)
	}
	c, err := client.Open(octx, client.WithMap(e.m), client.WithNode(node), client.WithSlot(1))
	if err != nil {
		node.Close()
		return nil, nil, err
	}
	return c, func() { c.Close(); node.Close() }, nil
}

// btreeRow is one output line.
type btreeRow struct {
	Bench       string `json:"bench"`       // "btree"
	Op          string `json:"op"`          // lookup, scan, put, cold
	Consistency string `json:"consistency"` // linearizable, stale-ok; "" for puts
	Threads     int    `json:"threads"`
	Records     int    `json:"records"`
	P50NS       int64  `json:"p50_ns"`
	P99NS       int64  `json:"p99_ns"`
	// ops/s; scan: scans/s (keys_per_s = scans/s x scan_length); cold:
	// lookups/s over the whole curve.
	OpsPerS float64 `json:"ops_per_s"`
	// Baseline is what ratio_ops and ratio_p50 compare with, measured in
	// the same run: "hash-get" (lookup), "hash-put" (put), "lookup"
	// (scan: the ordered lookup row of the same count and consistency),
	// "" (cold).
	Baseline        string  `json:"baseline"`
	BaselineOpsPerS float64 `json:"baseline_ops_per_s"`
	BaselineP50NS   int64   `json:"baseline_p50_ns"`
	BaselineP99NS   int64   `json:"baseline_p99_ns"`
	RatioOps        float64 `json:"ratio_ops"` // ops/s / baseline ops/s
	RatioP50        float64 `json:"ratio_p50"` // p50 / baseline p50
	// lookup: the in-process floor, a tidwall/btree Map Get.
	Floor         string  `json:"floor,omitempty"` // "tidwall-btree"
	FloorOpsPerS  float64 `json:"floor_ops_per_s,omitempty"`
	FloorP50NS    int64   `json:"floor_p50_ns,omitempty"`
	RatioFloorOps float64 `json:"ratio_floor_ops,omitempty"` // ops/s / floor ops/s
	// One-sided node reads per op (lookup, scan, cold) and their lists
	// (round trips); hit_rate: lookups whose walk began at a cached
	// level-1 node.
	ReadsPerOp *float64 `json:"reads_per_op,omitempty"`
	// lookup: the client's cache of inner nodes, and the records' raw
	// key and value bytes.
	CacheBytes int `json:"cache_bytes,omitempty"`
	RawBytes   int `json:"raw_bytes,omitempty"`
	// cache_ratio = cache_bytes / raw_bytes (issue 18: <= 0.02).
	CacheRatio float64  `json:"cache_ratio,omitempty"`
	ListsPerOp *float64 `json:"lists_per_op,omitempty"`
	HitRate    *float64 `json:"hit_rate,omitempty"`
	// mixed: the percent of inserts among the lookups (hit_rate,
	// reads_per_op and lists_per_op are the lookups').
	InsertPct int `json:"insert_pct,omitempty"`
	// memory: the ordered part's nodes after the load, over the groups
	// (one replica each: every replica of a group holds the same tree):
	// node_bytes_per_record = (leaves + inner_nodes) x node_size / keys,
	// ratio_raw = that / raw_bytes_per_record (key and value bytes),
	// leaf_fill = the bytes the leaves use / their node bytes,
	// arena_bytes_per_record = the node memory registered (chunks, free
	// slots included) / keys.
	Keys                int     `json:"keys,omitempty"`
	Leaves              int     `json:"leaves,omitempty"`
	InnerNodes          int     `json:"inner_nodes,omitempty"`
	NodeSize            int     `json:"node_size,omitempty"`
	NodeBytesPerRecord  float64 `json:"node_bytes_per_record,omitempty"`
	RawBytesPerRecord   int     `json:"raw_bytes_per_record,omitempty"`
	RatioRaw            float64 `json:"ratio_raw,omitempty"`
	LeafFill            float64 `json:"leaf_fill,omitempty"`
	ArenaBytesPerRecord float64 `json:"arena_bytes_per_record,omitempty"`
	// put, insert: the client's writes per message (ordered and the
	// baseline's) and the baseline's CPU per op (client + replicas);
	// what the groups applied meanwhile (child mode): ordered requests
	// (messages) and writes per group, leaf splits per 1000 inserts and
	// tablet splits over all groups.
	WritesPerMessage         *float64 `json:"writes_per_message,omitempty"`
	BaselineWritesPerMessage *float64 `json:"baseline_writes_per_message,omitempty"`
	BaselineCPUUSPerOp       *float64 `json:"baseline_cpu_us_per_op,omitempty"`
	GroupMessages            []uint64 `json:"group_messages,omitempty"`
	GroupWrites              []uint64 `json:"group_writes,omitempty"`
	LeafSplitsPerKInserts    *float64 `json:"leaf_splits_per_k_inserts,omitempty"`
	TabletSplits             *uint64  `json:"tablet_splits,omitempty"`
	// scan
	ScanLength int     `json:"scan_length,omitempty"`
	KeysPerS   float64 `json:"keys_per_s,omitempty"`
	// cold: mean reads per lookup over each curve_step lookups in turn,
	// of cold_lookups; first_reads: the first lookup's.
	Curve       []float64       `json:"curve,omitempty"`
	CurveStep   int             `json:"curve_step,omitempty"`
	ColdLookups int             `json:"cold_lookups,omitempty"`
	FirstReads  float64         `json:"first_reads,omitempty"`
	Runs        int             `json:"runs"`
	N           uint64          `json:"n,omitempty"`
	Retries     int             `json:"retries"`
	OtherCPU    float64         `json:"other_cpu"`
	Replicas    string          `json:"replicas"` // "embedded-kvserver" or "kvbench-child"
	Groups      int             `json:"groups"`
	HugePages   *rdma.HugePages `json:"huge_pages,omitempty"`
	costCols
}

// baselineName is the baseline each op compares with.
var baselineName = map[string]string{"lookup": "hash-get", "mixed": "hash-get-put", "put": "hash-put", "insert": "hash-put", "scan": "lookup"}

func summarizeBTree(res *btreeResults, o *btreeFlags) []btreeRow {
	placement, groups := "kvbench-child", o.groups
	if o.embedded {
		placement = "embedded-kvserver"
	}
	hp := shm.ProbeHugePages("", o.shmDir)
	var out []btreeRow
	for _, k := range res.order {
		ms := res.rows[k]
		med := func(f func(m btreeMeas) float64) float64 { return medianOf(ms, f) }
		ptr := func(v float64) *float64 { return &v }
		r := btreeRow{Bench: "btree", Op: k.op, Consistency: k.cons, Threads: k.threads, Records: o.records, Runs: len(ms),
			Replicas: placement, Groups: groups, HugePages: &hp}
		r.P50NS = int64(med(func(m btreeMeas) float64 { return float64(m.ours.p50) }))
		r.P99NS = int64(med(func(m btreeMeas) float64 { return float64(m.ours.p99) }))
		r.OpsPerS = med(func(m btreeMeas) float64 { return m.ours.opsPerS })
		r.N = uint64(med(func(m btreeMeas) float64 { return float64(m.ours.n) }))
		r.OtherCPU = med(func(m btreeMeas) float64 { return m.ours.otherCPU })
		r.costCols = medianCost(ms, func(m btreeMeas) opCost { return m.ours.cost })
		for _, m := range ms {
			r.Retries += m.ours.retries
		}
		if k.op != "put" && k.op != "insert" && k.op != "memory" {
			r.ReadsPerOp = ptr(med(func(m btreeMeas) float64 { return m.ours.reads }))
		}
		if k.op == "lookup" || k.op == "scan" || k.op == "mixed" {
			r.ListsPerOp = ptr(med(func(m btreeMeas) float64 { return m.ours.lists }))
		}
		if k.op == "lookup" || k.op == "mixed" {
			r.HitRate = ptr(med(func(m btreeMeas) float64 { return m.ours.hitRate }))
			r.CacheBytes = int(med(func(m btreeMeas) float64 { return float64(m.ours.cacheBytes) }))
			// The records in the tree: the loaded ones, and those the
			// inserts of earlier rows added (child mode: the replicas'
			// count).
			keys := int(med(func(m btreeMeas) float64 { return float64(max(m.ours.keys, o.records)) }))
			r.RawBytes = keys * (kvKeySize + kvValueSize)
			r.CacheRatio = float64(r.CacheBytes) / float64(r.RawBytes)
		}
		if k.op == "mixed" {
			r.InsertPct = o.insertPct
		}
		if k.op == "memory" {
			f := ms[len(ms)/2].mem
			r.Keys, r.Leaves, r.InnerNodes, r.NodeSize = f.keys, f.leaves, f.inner, f.nodeSize
			r.RawBytesPerRecord = kvKeySize + kvValueSize
			r.NodeBytesPerRecord = med(func(m btreeMeas) float64 { return m.mem.nodePerRecord() })
			r.RatioRaw = r.NodeBytesPerRecord / float64(r.RawBytesPerRecord)
			r.LeafFill = med(func(m btreeMeas) float64 { return m.mem.fill() })
			r.ArenaBytesPerRecord = med(func(m btreeMeas) float64 { return m.mem.arenaPerRecord() })
		}
		if k.op == "put" || k.op == "insert" {
			costed := func(f func(c opCost) float64, base bool) *float64 {
				var vs []float64
				for _, m := range ms {
					c := m.ours.cost
					if base {
						c = m.base.cost
					}
					if c.ok {
						vs = append(vs, f(c))
					}
				}
				if len(vs) == 0 {
					return nil
				}
				return ptr(medianOf(vs, func(v float64) float64 { return v }))
			}
			r.WritesPerMessage = costed(func(c opCost) float64 { return c.writesPerMsg }, false)
			r.BaselineWritesPerMessage = costed(func(c opCost) float64 { return c.writesPerMsg }, true)
			r.BaselineCPUUSPerOp = costed(func(c opCost) float64 { return c.clientCPU + c.serverCPU }, true)
			if w := ms[len(ms)/2].ours.srv; w.ok {
				r.GroupMessages, r.GroupWrites = w.messages, w.writes
				r.TabletSplits = &w.tabSp
			}
			var sp []float64
			for _, m := range ms {
				if m.ours.srv.ok && m.ours.srv.inserts > 0 {
					sp = append(sp, m.ours.srv.splitsPerK())
				}
			}
			if len(sp) > 0 {
				r.LeafSplitsPerKInserts = ptr(medianOf(sp, func(v float64) float64 { return v }))
			}
		}
		if k.op == "scan" {
			r.ScanLength, r.KeysPerS = o.scanLen, r.OpsPerS*float64(o.scanLen)
		}
		if k.op == "cold" {
			r.ColdLookups, r.CurveStep = o.cold, coldStep(o.cold)
			r.FirstReads = med(func(m btreeMeas) float64 { return m.first })
			for i := range ms[0].curve {
				r.Curve = append(r.Curve, med(func(m btreeMeas) float64 { return m.curve[min(i, len(m.curve)-1)] }))
			}
		}
		var based, floored []btreeMeas
		for _, m := range ms {
			if m.hasBase {
				based = append(based, m)
			}
			if m.hasFloor {
				floored = append(floored, m)
			}
		}
		if len(based) > 0 {
			r.Baseline = baselineName[k.op]
			r.BaselineOpsPerS = medianOf(based, func(m btreeMeas) float64 { return m.base.opsPerS })
			r.BaselineP50NS = int64(medianOf(based, func(m btreeMeas) float64 { return float64(m.base.p50) }))
			r.BaselineP99NS = int64(medianOf(based, func(m btreeMeas) float64 { return float64(m.base.p99) }))
			r.RatioOps = medianOf(based, func(m btreeMeas) float64 { return ratio(m.ours.opsPerS, m.base.opsPerS) })
			r.RatioP50 = medianOf(based, func(m btreeMeas) float64 { return ratio(float64(m.ours.p50), float64(m.base.p50)) })
		}
		if len(floored) > 0 {
			r.Floor = "tidwall-btree"
			r.FloorOpsPerS = medianOf(floored, func(m btreeMeas) float64 { return m.floor.opsPerS })
			r.FloorP50NS = int64(medianOf(floored, func(m btreeMeas) float64 { return float64(m.floor.p50) }))
			r.RatioFloorOps = medianOf(floored, func(m btreeMeas) float64 { return ratio(m.ours.opsPerS, m.floor.opsPerS) })
		}
		out = append(out, r)
	}
	return out
}

func printBTreeTable(w io.Writer, out []btreeRow, o *btreeFlags) {
	fmt.Fprintf(w, "kvbench btree  %s  %s, %d CPUs, %s  medians of %d run(s) x %v\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.runs, o.duration)
	where := fmt.Sprintf("%d x 3 replicas on shm in a child process, a tablet per group", o.groups)
	if o.embedded {
		where = fmt.Sprintf("kvserver's embedded cluster (%d x 3 replicas on shm) in a child process", o.groups)
	}
	fmt.Fprintf(w, "%d records, %d B keys, %d B values in the ordered keyspace; %s, the client in this one\n\n", o.records, kvKeySize, kvValueSize, where)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tconsistency\tthreads\tp50\tp99\tops/s\treads/op\thit rate\tbaseline\tbase ops/s\tratio ops\tratio p50\ttidwall ops/s\tratio\t")
	for _, r := range out {
		if r.Op == "memory" {
			continue
		}
		opt := func(p *float64, f string) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprintf(f, *p)
		}
		fl, flr := "-", "-"
		if r.Floor != "" {
			fl, flr = fmtOps(r.FloorOpsPerS), fmt.Sprintf("%.3f", r.RatioFloorOps)
		}
		base := r.Baseline
		if base == "" {
			base = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t\n", r.Op, r.Consistency, r.Threads,
			fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), fmtOps(r.OpsPerS), opt(r.ReadsPerOp, "%.3f"), opt(r.HitRate, "%.4f"),
			base, fmtOps(r.BaselineOpsPerS), r.RatioOps, r.RatioP50, fl, flr)
	}
	tw.Flush()
	for _, r := range out {
		switch r.Op {
		case "scan":
			fmt.Fprintf(w, "scan %s x%d: %s keys/s, %.2f node reads per scan of %d keys\n", r.Consistency, r.Threads, fmtOps(r.KeysPerS), *r.ReadsPerOp, r.ScanLength)
		case "cold":
			fmt.Fprintf(w, "cold: first lookup %.0f reads; mean reads per lookup per %d lookups: %s\n", r.FirstReads, r.CurveStep, fmtCurve(r.Curve))
		case "lookup", "mixed":
			fmt.Fprintf(w, "%s %s x%d: client cache %d B = %.4f of the raw %d B\n", r.Op, r.Consistency, r.Threads, r.CacheBytes, r.CacheRatio, r.RawBytes)
		case "memory":
			fmt.Fprintf(w, "memory per replica: %.0f B of nodes per record = %.2fx raw (%d B), leaf fill %.3f, %d leaves + %d inner nodes of %d B, arena %.0f B per record\n",
				r.NodeBytesPerRecord, r.RatioRaw, r.RawBytesPerRecord, r.LeafFill, r.Leaves, r.InnerNodes, r.NodeSize, r.ArenaBytesPerRecord)
		case "insert", "put":
			if r.LeafSplitsPerKInserts != nil {
				fmt.Fprintf(w, "%s x%d: %.1f leaf splits per k inserts, %d tablet splits, messages per group %v\n", r.Op, r.Threads, *r.LeafSplitsPerKInserts, *r.TabletSplits, r.GroupMessages)
			}
		}
	}
}
