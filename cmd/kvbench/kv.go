package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/internal/kvproc"
	"github.com/rdmakv/rdmakv/internal/redisproc"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/regions"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

const kvUsage = `usage: kvbench kv [flags]

Measures the replicated key-value store (packages kv and client) against
Redis, in the same run: 16-byte keys, 100-byte values (--value-size),
one group of 3 replicas on the shm fabric.

Placement: the 3 replicas run in one child process (kvbench re-executes
itself as a replica child, server.ServeChild: every replica an shm node
of its own, a group's replicas on one poller); the client
(package client, one client slot) runs in this process on an shm node of
its own, so a get is one-sided reads of the child's memory and a put goes
through TRAM and Acuerdo. The baseline is Debian's redis-server, started by
kvbench on a free loopback port with persistence off (--save ""
--appendonly no) in a temporary directory and killed at the end, driven
by go-redis v9 from the same number of goroutines. Without redis-server
(apt-get install -y redis-server) the rdmakv rows are printed alone.

Every run starts a fresh cluster (a new shm cluster name) and a fresh
redis-server, then measures, rdmakv first and Redis right after it.
Redis's part of every row runs with the replicas' process stopped
(SIGSTOP), so that the idle replicas take no CPU from it: the get and put
measurements, and the load (its seed keys, gets and puts) that the
get-during-growth and memory rows measure; the process is resumed
(SIGCONT), and serves a linearizable read again, before anything of
rdmakv's runs next. Each row says so: baseline_replicas "stopped" (else
the states seen) and baseline_replicas_cpu_s. An error while it is
stopped resumes it; a Ctrl-C kills it with kvbench's other children.

  get-during-growth
           the load: --records keys written from empty, in batches of as
           many puts as fit one request slot (client.Batch; 8 goroutines,
           the client's window), and into Redis as pipelines of the same
           batches on 8 connections (progress on stderr). Meanwhile one
           goroutine reads random already-written keys (stale-ok)
           and counts gets per --interval. before = the median interval
           over the first 1000 keys, written before the load; ops_per_s =
           the slowest interval during the load; dip = slowest / before;
           median = the median interval during the load. The rdmakv index
           starts at 2^10 buckets and grows through several generations
           (generations = how many); migrating min and steady min split
           the intervals by whether a new generation appeared or a
           migration was under way (read one-sided from the replica's
           table header at each interval's end), so the growth's own cost
           shows apart from the puts'.
  memory   after the load, once every replica applied it: per replica,
           bytes_per_record = (index bytes + heap bytes) / records from
           kv.Table.Stats; rss = the replicas' process VmRSS growth over
           the load / 3 / records; shm = the tmpfs space the replicas'
           files hold / 3 / records (every region is reserved whole: 64
           MiB heap regions, the Acuerdo and TRAM rings, so fixed costs
           dominate it below about a million records). Raw key+value:
           116 B (the target is bytes_per_record <= 2x raw). Redis:
           used_memory (and RSS) growth over the load / records.
  get      random loaded keys at each --threads goroutine count (closed
           loops), stale-ok and linearizable, against Redis GET at the
           same count.
  put      overwrites of random loaded keys at 1 and --put-threads
           goroutines (one client: at most 8 requests outstanding, the
           rest queue in the client), against Redis SET. --put-threads
           1,2,4,8,16,64 (a list) measures a put row at each count given
           instead: the curve of writers.

--embedded measures the path a user's program takes to the cluster that
'make run' starts: kvbench builds kvserver (go build; or --kvserver FILE)
and runs it with no --config, an embedded cluster of --groups groups x 3
replicas on shm in one process (its map and shm files in kvbench's work
directory, --control on a free loopback port, --election-timeout as below, the other flags
kvserver's defaults); the client opens the map file kvserver wrote
(client.Open with WithMapFile). --rows is then get and/or put (default
put), --records defaults to 100000, and the keys are loaded without the
growth figure. --durability memory|async|sync is kvserver's --durability
(default memory, as in earlier figures; make run's own default is async);
a durable mode keeps its data in a fresh directory under $TMPDIR, removed
at the end: put $TMPDIR on the disk you mean to measure.

Cost per op (every get and put row, both placements): from counters of
the client's process (this one) and the replicas' process, read right
before and after the measurement and divided by every op it completed
(warm-up included):
  allocs    runtime.MemStats.Mallocs of this process (the client package's
            and the benchmark goroutines': a closed loop allocates nothing
            per op of its own)
  wake-ups  voluntary + nonvoluntary context switches summed over every
            thread (/proc/PID/task/*/status), client and replicas apart;
            the nonvoluntary ones (preemptions, which a busy machine adds)
            also alone in --json
  cpu       utime + stime (/proc/PID/stat; 10 ms ticks, so coarse for a
            short --duration), client and replicas apart, and their sum
  waits     how the waits ended: the client's doorbell waits
            (rdma.DoorbellWaits: spins, spins a ring ended = hits, parks)
            and, with --embedded, kvserver's pollers' (its /status: spins,
            spin_hits, parks); a put whose waits park pays a futex wake
            and a thread wake-up per hop (--json: client_spins_per_op ...
            server_parks_per_op)
Example (issue 17's single-writer and saturation puts; issue 19's
durability targets with --durability async and sync):
  kvbench kv --embedded --put-threads 64 --runs 3 --json
  kvbench kv --embedded --durability async --put-threads 64 --runs 3

Latency: every op is timed, with one monotonic clock read per op (an op's
end is the next op's start; about 30 ns). ops/s and the latencies count
the ops completed in --duration after a warm-up of a fifth of it (at
most 200 ms); a goroutine that completed none by then measures on until
it completes one (ops/s is over that longer time). Ratios are
per run and then the median over runs: ops ratio = ops/s / Redis ops/s,
p50 ratio = p50 / Redis p50. other cpu: CPUs used meanwhile by processes
other than kvbench, the replicas' process and redis-server.

flags:
`

// The workload's shape.
const (
	kvKeySize  = 16
	kvReplicas = 3
	kvSeedKeys = 1000 // written before the load: the growth figure's baseline
	kvLoaders  = 8    // goroutines (connections) of the load
	kvClientID = rdma.NodeID(100)
)

// kvValueSize is the values' length: 100 bytes, or --value-size.
var kvValueSize = 100

// kvCombineHold is the client's write-combining hold (--combine-hold,
// client.WithCombineHold); -1: the client's default for the cluster's
// durability (client.DefaultSyncCombineHold on a sync cluster, else
// client.DefaultCombineHold with the busy hold, client.DefaultCombineBusyHold).
var kvCombineHold = -1

// kvCombineRounds is the client's rounds (--combine-rounds,
// client.WithCombineRounds): auto (the client's default for the cluster's
// durability, client.DefaultSyncCombineRounds: off), on or
// off.
var kvCombineRounds = "auto"

// kvHoldOpts is the client's options for kvCombineHold and
// kvCombineRounds: none when they are -1 and auto (the client chooses by
// the map's durability).
func kvHoldOpts() []client.Option {
	var opts []client.Option
	if kvCombineHold >= 0 {
		opts = append(opts, client.WithCombineHold(kvCombineHold))
	}
	if kvCombineRounds != "auto" {
		opts = append(opts, client.WithCombineRounds(kvCombineRounds == "on"))
	}
	return opts
}

// kvFlags are the options of the kv benchmark.
type kvFlags struct {
	commonFlags
	records    int
	threads    []int
	putThreads int   // the largest of putRows
	putRows    []int // the put rows' goroutine counts: 1 and --put-threads N, or --put-threads' list
	interval   time.Duration
	et         time.Duration
	redis      string
	quick      bool
	embedded   bool
	groups     int
	kvserver   string
	durability string // --embedded: kvserver --durability
	// walLayout and spareP are kvserver's --wal-layout and --spare-p
	// ("": not passed, kvserver's default), spareP also the replica
	// child's (ChildConfig.SpareP)
	walLayout, spareP string
	// opLog: a file that gets every measured op of rdmakv's one-goroutine
	// rows (--op-log)
	opLog   string
	rows    []string // of kvRowNames
	ordered bool     // not a flag: kvbench btree's cluster, with an ordered keyspace
	// Not flags (kvbench btree --groups without --embedded): the child's
	// groups of 3 replicas (0: 1) and the ordered keyspace's split points.
	childGroups   int
	orderedSplits []string
	// orderedNodeSize: the ordered keyspace's node size in bytes (0: the
	// default; kvbench btree --node-size)
	orderedNodeSize int
}

// kvRowNames are --rows' names, in the order they are measured.
var kvRowNames = []string{"growth", "memory", "get", "put"}

func (o *kvFlags) row(name string) bool { return slices.Contains(o.rows, name) }

func parseKVFlags(args []string, stderr io.Writer) (*kvFlags, error) {
	o := &kvFlags{}
	fs := o.commonFlags.flagSet("kv", kvUsage, stderr,
		"how long each get and put measurement runs (after its warm-up)",
		"repeat a get or put measurement while other processes use more than this many CPUs",
		"write a CPU profile of this process (the client side) to `file`; KVBENCH_PEER_CPUPROFILE=path profiles the replicas' process (path.<pid>)")
	o.duration = 2 * time.Second
	fs.Lookup("duration").DefValue = "2s"
	fs.IntVar(&o.records, "records", 1000000, "keys loaded (from an empty table) before the get and put rows")
	threads := fs.String("threads", "1,8", "comma-separated goroutine counts of the get rows")
	putThreads := fs.String("put-threads", "64", "goroutines of the saturated put row (the other put row has 1); a comma-separated list (1,2,4,8,16,64): a put row at each count")
	fs.StringVar(&kvCombineRounds, "combine-rounds", "auto", "the client's rounds: auto (the client's default: off, client.DefaultSyncCombineRounds), on or off (client.WithCombineRounds: a group's writes also wait for another group's message posted less than a few ms ago, so that the groups' messages go out together)")
	fs.IntVar(&kvCombineHold, "combine-hold", -1, "the client's write-combining hold: messages a group may have in flight before a new write waits for a completion (client.WithCombineHold; 0: the whole window; -1: the client's default, 1 on a sync cluster, else the busy hold; any other value turns the busy hold off)")
	fs.IntVar(&kvValueSize, "value-size", 100, "bytes per value (at least the 16-byte key, which each value starts with), of rdmakv's and Redis's rows")
	fs.DurationVar(&o.interval, "interval", 100*time.Millisecond, "get-during-growth: the interval gets are counted in")
	fs.DurationVar(&o.et, "election-timeout", time.Second, "the replicas' election timeout (long, so that a descheduled leader is not voted out mid-measurement)")
	fs.StringVar(&o.redis, "redis-server", "redis-server", "the baseline's redis-server binary (looked up in PATH); empty: no baseline")
	fs.BoolVar(&o.quick, "quick", false, "smoke test: --records 20000, --duration 200ms, --runs 1 and --retries 0 unless given")
	fs.BoolVar(&o.embedded, "embedded", false, "the replicas are kvserver's embedded cluster (what make run starts), the client opens its map file (see above)")
	fs.IntVar(&o.groups, "groups", 2, "--embedded: the embedded cluster's groups of 3 replicas (kvserver --groups)")
	fs.StringVar(&o.kvserver, "kvserver", "", "--embedded: the kvserver `binary` to run (default: go build it from this module)")
	fs.StringVar(&o.durability, "durability", "memory", "--embedded: what the replicas keep on disk (kvserver --durability): memory, async or sync; a durable mode's data dir is a fresh directory under $TMPDIR (put it on the disk to measure), removed at the end")
	fs.StringVar(&o.walLayout, "wal-layout", "", "--embedded with --durability async or sync: kvserver --wal-layout, per-replica or shared (default: not passed, so kvserver's default: shared)")
	fs.StringVar(&o.spareP, "spare-p", "", "the replicas' pollers' spare P, auto or off: kvserver --spare-p with --embedded, else the replicas' process's (default: not passed, auto)")
	fs.StringVar(&o.opLog, "op-log", "", "append every measured op of rdmakv's one-goroutine get and put rows to `file`, a line each: the row, the run, the op's end (ns since the Unix epoch, wall clock) and its latency (ns), to line slow ops up with the replicas' events")
	rows := fs.String("rows", "", "comma-separated measurements: growth, memory, get, put (default all; with --embedded: put)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("kv: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.embedded && !set["records"] {
		o.records = 100000
	}
	for _, s := range splitList(*rows) {
		if !slices.Contains(kvRowNames, s) {
			return nil, fmt.Errorf("kv: --rows: unknown measurement %q (want %s)", s, strings.Join(kvRowNames, ", "))
		}
		if !slices.Contains(o.rows, s) {
			o.rows = append(o.rows, s)
		}
	}
	switch {
	case len(o.rows) > 0:
	case o.embedded:
		o.rows = []string{"put"}
	default:
		o.rows = slices.Clone(kvRowNames)
	}
	if o.embedded && (o.row("growth") || o.row("memory")) {
		return nil, errors.New("kv: --embedded measures get and put rows only (growth and memory need kvbench's own replicas' process)")
	}
	if !o.embedded && (set["groups"] || set["kvserver"] || set["durability"]) {
		return nil, errors.New("kv: --groups, --kvserver and --durability go with --embedded")
	}
	if !slices.Contains([]string{"memory", "async", "sync"}, o.durability) {
		return nil, fmt.Errorf("kv: --durability %q: want memory, async or sync", o.durability)
	}
	if !slices.Contains([]string{"auto", "on", "off"}, kvCombineRounds) {
		return nil, fmt.Errorf("kv: --combine-rounds %q: want auto, on or off", kvCombineRounds)
	}
	if set["wal-layout"] {
		if err := cluster.CheckWALLayout(o.walLayout); err != nil {
			return nil, fmt.Errorf("kv: --wal-layout %v", err)
		}
		if !o.embedded || o.durability == "memory" {
			return nil, errors.New("kv: --wal-layout goes with --embedded and --durability async or sync")
		}
	}
	if set["spare-p"] {
		if err := cluster.CheckSpareP(o.spareP); err != nil {
			return nil, fmt.Errorf("kv: --spare-p %v", err)
		}
	}
	if o.groups < 1 {
		return nil, errors.New("kv: --groups must be positive")
	}
	if o.quick {
		o.commonFlags.quickDefaults(set, &o.records)
	}
	var err error
	if o.threads, err = parseThreads("kv", *threads, o.threads); err != nil {
		return nil, err
	}
	if o.putRows, err = parsePutThreads(*putThreads); err != nil {
		return nil, err
	}
	o.putThreads = slices.Max(o.putRows)
	if err := o.commonFlags.check("kv"); err != nil {
		return nil, err
	}
	switch {
	case len(o.threads) == 0:
		return nil, errors.New("kv: --threads lists no goroutine count")
	case o.records < 2*kvSeedKeys:
		return nil, fmt.Errorf("kv: --records must be at least %d", 2*kvSeedKeys)
	case kvValueSize < kvKeySize || kvValueSize > 1<<20:
		return nil, fmt.Errorf("kv: --value-size %d: want %d to %d bytes", kvValueSize, kvKeySize, 1<<20)
	case o.interval <= 0 || o.et <= 0:
		return nil, errors.New("kv: --interval and --election-timeout must be positive")
	}
	return o, nil
}

// fillKey writes key i: "k" and 15 decimal digits.
func fillKey(b []byte, i int) {
	b[0] = 'k'
	for j := kvKeySize - 1; j >= 1; j-- {
		b[j] = byte('0' + i%10)
		i /= 10
	}
}

// fillValue writes the value of key (kvValueSize bytes: the key, then
// tag).
func fillValue(v, key []byte, tag byte) {
	copy(v, key)
	for j := kvKeySize; j < kvValueSize; j++ {
		v[j] = tag
	}
}

// checkValue checks that v is a value fillValue made for key.
func checkValue(v, key []byte) error {
	if len(v) != kvValueSize || !bytes.Equal(v[:kvKeySize], key) {
		return fmt.Errorf("key %s: got a %d-byte value %.20q, want %d bytes starting with the key", key, len(v), v, kvValueSize)
	}
	return nil
}

// The replicas' process: kvbench re-executed as a replica child
// (server.SpawnChild; the hidden argument kvServeCmd names it in ps). Its
// init (child.go) hands it to server.ServeChild, the child of every harness that runs
// kv replicas in a process of their own: it starts the map's replicas
// (a server.Process on shm), answers its ready line once the group has a
// leader, then "stats" requests (every replica's kv.Table.Stats, read on
// its poller); EOF on stdin closes the replicas (their shm files go) and
// ends it. The process's memory is read from /proc here.

// kvServeCmd is the hidden argument of the replicas' process.
const kvServeCmd = "_kv-serve"

// kvServeReply is the replicas' table stats and the process's memory.
type kvServeReply struct {
	Replicas []kv.Stats
	Mem      procMem
}

// procMem is a process's resident memory, in bytes (/proc/<pid>/status).
type procMem struct {
	VmRSS    int64 `json:"vm_rss"`
	RssAnon  int64 `json:"rss_anon"`
	RssFile  int64 `json:"rss_file"`
	RssShmem int64 `json:"rss_shmem"`
}

// readProcMem reads pid's resident memory.
func readProcMem(pid int) (procMem, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procMem{}, err
	}
	var m procMem
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			m.VmRSS = kb << 10
		case "RssAnon":
			m.RssAnon = kb << 10
		case "RssFile":
			m.RssFile = kb << 10
		case "RssShmem":
			m.RssShmem = kb << 10
		}
	}
	if m.VmRSS == 0 {
		return m, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}

// kvProc is the parent's handle on the replicas' process.
type kvProc struct {
	ch    *server.Child
	ready kvServeReply // at the ready line: the memory of the empty cluster
}

// startKVProc starts the replicas' process of map m and waits until its
// group has a leader.
func startKVProc(m *cluster.Map, et time.Duration, spareP string) (*kvProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("kvbench: find own executable: %w", err)
	}
	cmd := exec.Command(exe, kvServeCmd)
	if err := childCmd(cmd); err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	ch, err := server.SpawnChild(cmd, server.ChildConfig{Map: m, ElectionTimeout: et, SpareP: spareP}, 40*time.Second)
	if err != nil {
		return nil, fmt.Errorf("kv replicas' process: %w", err)
	}
	p := &kvProc{ch: ch}
	if p.ready.Mem, err = readProcMem(ch.Pid()); err != nil {
		ch.Kill()
		return nil, fmt.Errorf("kv replicas' process: %w", err)
	}
	return p, nil
}

func (p *kvProc) pid() int { return p.ch.Pid() }

// close ends the process (EOF on its stdin), killing it if it does not
// exit in 10 s.
func (p *kvProc) close() error { return p.ch.Close(10 * time.Second) }

// stats asks for every replica's table stats and reads the process's
// memory.
func (p *kvProc) stats() (kvServeReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stallTimeout)
	defer cancel()
	var r kvServeReply
	var err error
	if r.Replicas, err = p.ch.Stats(ctx); err != nil {
		return r, err
	}
	if len(r.Replicas) != kvReplicas {
		return r, fmt.Errorf("stats of %d replicas, want %d", len(r.Replicas), kvReplicas)
	}
	r.Mem, err = readProcMem(p.pid())
	return r, err
}

// headerReader reads a replica's table header one-sided (the growth
// figure's generation and migration state).
type headerReader struct {
	conn rdma.Conn
	buf  [64]byte
	cs   [4]rdma.Completion
	id   uint64
}

func (h *headerReader) read() (kv.Header, error) {
	for try := 0; try < 1000; try++ {
		h.id++
		wr := rdma.WR{ID: h.id, Kind: rdma.OpRead, Flags: rdma.Signaled, Region: regions.KV(0), Buf: h.buf[:]}
		if err := h.conn.Post(wr); err != nil {
			return kv.Header{}, err
		}
		deadline := time.Now().Add(stallTimeout)
		for done := false; !done; {
			n := h.conn.Poll(h.cs[:])
			for _, c := range h.cs[:n] {
				if c.Err != nil {
					return kv.Header{}, c.Err
				}
				done = done || c.ID == h.id
			}
			if n == 0 {
				if time.Now().After(deadline) {
					return kv.Header{}, fmt.Errorf("header read: %w", errStalled)
				}
				runtime.Gosched()
			}
		}
		if hd, err := kv.DecodeHeader(h.buf[:]); err == nil {
			return hd, nil
		}
	}
	return kv.Header{}, errors.New("header read torn 1000 times")
}

// kvstat is one measurement of a get or put row.
type kvstat struct {
	p50, p99 time.Duration
	// the rest of the distribution: mean (= 1 / the ops/s of one
	// goroutine: an op's time runs from the end of the one before), p90,
	// p99.9 and the slowest op
	mean, p90, p999, max time.Duration
	n                    uint64
	// ends and lats: every measured op's end (wall clock, ns since the
	// Unix epoch) and latency (ns), when asked for (--op-log)
	ends, lats []int64
	opsPerS    float64
	otherCPU   float64 // -1: unknown
	retries    int
	total      uint64 // ops completed, warm-up included
	cost       opCost // per op of total
	// replicas and replicasCPU (a Redis row): the replicas' processes'
	// state letters at its start and end (T: stopped, basefreeze.go) and
	// the CPU seconds they used meanwhile
	replicas    string
	replicasCPU float64
}

func (s *kvstat) load() float64    { return s.otherCPU }
func (s *kvstat) setRetries(n int) { s.retries = n }

// kvOp is one goroutine's operation, called in a closed loop.
type kvOp func() error

// closedLoop runs threads goroutines, each calling its op (mk(g)) in a
// closed loop for tm.warm and then tm.dur, and times every op with one
// monotonic clock read per op. ops/s and the latencies count the ops
// completed in the measured part. A goroutine that has completed no op
// in it by its end (a machine so busy that one op outlasts tm.dur) goes
// on until it completes one, and ops/s is over the measured part so
// lengthened: a slow machine gives slow figures, never no figure.
func closedLoop(threads int, tm timing, mk func(g int) kvOp) (kvstat, error) {
	return closedLoopLog(threads, tm, false, mk)
}

// closedLoopLog is closedLoop; with keep, it also returns every measured
// op's end (wall clock) and latency (kvstat.ends, lats), for --op-log.
func closedLoopLog(threads int, tm timing, keep bool, mk func(g int) kvOp) (kvstat, error) {
	ops := make([]kvOp, threads)
	for g := range ops {
		ops[g] = mk(g)
	}
	type result struct {
		samples []uint32 // ns
		ends    []time.Duration
		last    time.Duration
		total   uint64
		err     error
	}
	rs := make([]result, threads)
	var failed atomic.Bool
	var wg sync.WaitGroup
	warmEnd, end := tm.warm, tm.warm+tm.dur
	base := time.Now()
	for g, op := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &rs[g]
			r.samples = make([]uint32, 0, 1<<14)
			t0 := time.Since(base)
			for {
				if err := op(); err != nil {
					r.err = err
					failed.Store(true)
					return
				}
				t1 := time.Since(base)
				r.total++
				if t1 >= warmEnd && (t1 < end || len(r.samples) == 0) {
					r.samples = append(r.samples, uint32(min(t1-t0, math.MaxUint32)))
					if keep {
						r.ends = append(r.ends, t1)
					}
					r.last = t1
				}
				if t1 >= end || failed.Load() {
					return
				}
				t0 = t1
			}
		}()
	}
	wg.Wait()
	var h hist.Hist
	var total uint64
	var ends, lats []int64
	measured := tm.dur
	for _, r := range rs {
		if r.err != nil {
			return kvstat{}, r.err
		}
		total += r.total
		for i, s := range r.samples {
			h.Record(time.Duration(s))
			if keep {
				ends = append(ends, base.Add(r.ends[i]).UnixNano())
				lats = append(lats, int64(s))
			}
		}
		measured = max(measured, r.last-warmEnd)
	}
	if h.N() == 0 {
		return kvstat{}, fmt.Errorf("no op completed in the measured %v", measured)
	}
	return kvstat{p50: h.Quantile(0.50), p99: h.Quantile(0.99), mean: h.Mean(), p90: h.Quantile(0.90), p999: h.Quantile(0.999), max: h.Max(),
		n: h.N(), total: total, opsPerS: float64(h.N()) / measured.Seconds(), ends: ends, lats: lats}, nil
}

// appendOpLog appends one row's measured ops to the file path (--op-log):
// a line an op, "row run end_unix_ns latency_ns" (row with '_' for
// spaces).
func appendOpLog(path, row string, run int, ends, lats []int64) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	row = strings.ReplaceAll(row, " ", "_")
	for i := range ends {
		fmt.Fprintf(w, "%s %d %d %d\n", row, run, ends[i], lats[i])
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ratio is a / b, or 0 if either is not positive (JSON has no Inf).
func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// takeCPUs is takeCPU with every process of pids counted as ours.
func takeCPUs(pids ...int) cpuSnap {
	s := takeCPU(0)
	for _, p := range pids {
		t, ok := procTicks(p)
		s.ok = s.ok && ok
		s.ours += t
	}
	return s
}

// store is one side of the comparison, as the load, the growth figure and
// the rows use it.
type store interface {
	// writeBatch writes keys [first, first+n) with their values; loader j
	// of kvLoaders calls it, concurrently with the others.
	writeBatch(j, first, n int) error
	// getter returns an op that gets key i for one goroutine.
	getter(cons client.Consistency) func(key []byte) ([]byte, bool, error)
	// putter returns an op that puts (key, value) for one goroutine.
	putter() func(key, value []byte) error
	// geometry is the index generation and whether it migrates (ok false:
	// unknown, as for Redis).
	geometry() (gen int, migrating, ok bool)
}

// growthStat is one run's get-during-growth figure.
type growthStat struct {
	before, min, median float64 // gets/s
	migMin, steadyMin   float64 // min over intervals with / without growth; 0: none
	p50, p99            time.Duration
	generations         int // -1: unknown (Redis)
	intervals           int
	loadOpsPerS         float64
	notFound            uint64
	// replicas and replicasCPU (Redis's side): what the replicas'
	// processes did during Redis's seed keys, gets and load (basefreeze.go)
	replicas    string
	replicasCPU float64
}

// interval is one --interval of the growth figure's getter.
type interval struct {
	ops    int
	dur    time.Duration
	growth bool
}

func rate(iv interval) float64 { return float64(iv.ops) / iv.dur.Seconds() }

// pickWritten picks a random already-written key: one of the seed keys or
// of the batches the loaders finished (loader j writes batches j, j+L, ...
// of batch keys each, from key seed on, and counts them in progress[j]).
func pickWritten(rng *rand.Rand, seed, batch, records int, progress []atomic.Int64) int {
	var done int64
	for j := range progress {
		done += progress[j].Load()
	}
	if r := rng.IntN(seed + int(done)*batch); r < seed {
		return r
	}
	for {
		j := rng.IntN(len(progress))
		c := progress[j].Load()
		if c == 0 {
			continue
		}
		first := seed + (j+len(progress)*rng.IntN(int(c)))*batch
		return first + rng.IntN(min(batch, records-first))
	}
}

// growth loads keys [seed, records) into s with kvLoaders goroutines while
// one goroutine gets already-written keys and counts them per interval;
// before that, it counts gets of the seed keys for before.
func growth(s store, seed, records, batch int, ivLen, before time.Duration, progress func(done, all int, el time.Duration)) (growthStat, error) {
	get := s.getter(client.StaleOK)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	key := make([]byte, kvKeySize)
	var h hist.Hist
	var notFound uint64
	base := time.Now()
	// run gets keys pick() until stop() and returns the full intervals
	// (or the partial one, if none was full).
	run := func(pick func() int, stop func() bool, geom bool) ([]interval, error) {
		var ivs []interval
		gen0, mig0, _ := s.geometry()
		t0 := time.Since(base)
		ivStart, n := t0, 0
		// closeIv ends the interval at t (reading the geometry outside
		// any op's time).
		closeIv := func(t time.Duration) {
			iv := interval{ops: n, dur: t - ivStart}
			if geom {
				gen, mig, _ := s.geometry()
				iv.growth = gen != gen0 || mig || mig0
				gen0, mig0 = gen, mig
				t0 = time.Since(base)
			}
			ivs = append(ivs, iv)
			ivStart, n = t, 0
		}
		// At least one get, even if stop() holds already (a busy machine
		// may not have run this goroutine before the load ended): a
		// phase without a get would have no rate.
		for first := true; first || !stop(); first = false {
			fillKey(key, pick())
			v, found, err := get(key)
			if err != nil {
				return nil, err
			}
			if !found {
				notFound++
			} else if err := checkValue(v, key); err != nil {
				return nil, err
			}
			t1 := time.Since(base)
			h.Record(t1 - t0)
			t0 = t1
			n++
			if t1-ivStart >= ivLen {
				closeIv(t1)
			}
		}
		if len(ivs) == 0 && n > 0 {
			closeIv(t0)
		}
		return ivs, nil
	}
	// Before: the seed keys alone.
	end := time.Since(base) + before
	ivs, err := run(func() int { return rng.IntN(seed) }, func() bool { return time.Since(base) >= end }, false)
	if err != nil {
		return growthStat{}, fmt.Errorf("gets before the load: %w", err)
	}
	var st growthStat
	st.before = medianOf(ivs, rate)
	h.Reset()
	notFound = 0
	// The load.
	genStart, _, _ := s.geometry()
	prog := make([]atomic.Int64, kvLoaders)
	nb := (records - seed + batch - 1) / batch
	var done atomic.Bool
	var lerr error
	var emu sync.Mutex
	var wg sync.WaitGroup
	loadStart := time.Now()
	for j := range kvLoaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := j; b < nb; b += kvLoaders {
				first := seed + b*batch
				if err := s.writeBatch(j, first, min(batch, records-first)); err != nil {
					emu.Lock()
					lerr = errors.Join(lerr, fmt.Errorf("load keys %d..: %w", first, err))
					emu.Unlock()
					done.Store(true)
					return
				}
				prog[j].Add(1)
				if done.Load() {
					return
				}
			}
		}()
	}
	loaded := make(chan struct{})
	go func() {
		wg.Wait()
		done.Store(true)
		close(loaded)
	}()
	tick := time.NewTicker(time.Second)
	tickDone := make(chan struct{})
	go func() {
		defer close(tickDone)
		for {
			select {
			case <-loaded:
				return
			case <-tick.C:
				var d int64
				for j := range prog {
					d += prog[j].Load()
				}
				progress(seed+min(int(d)*batch, records-seed), records, time.Since(loadStart))
			}
		}
	}()
	ivs, gerr := run(func() int { return pickWritten(rng, seed, batch, records, prog) }, done.Load, true)
	if gerr != nil {
		done.Store(true)
	}
	<-loaded
	loadTime := time.Since(loadStart)
	tick.Stop()
	<-tickDone
	if err := errors.Join(lerr, gerr); err != nil {
		return growthStat{}, err
	}
	progress(records, records, loadTime)
	st.loadOpsPerS = float64(records-seed) / loadTime.Seconds()
	st.intervals = len(ivs)
	st.median = medianOf(ivs, rate)
	st.min = math.Inf(1)
	st.migMin, st.steadyMin = math.Inf(1), math.Inf(1)
	for _, iv := range ivs {
		r := rate(iv)
		st.min = min(st.min, r)
		if iv.growth {
			st.migMin = min(st.migMin, r)
		} else {
			st.steadyMin = min(st.steadyMin, r)
		}
	}
	for _, p := range []*float64{&st.min, &st.migMin, &st.steadyMin} {
		if math.IsInf(*p, 1) {
			*p = 0
		}
	}
	st.p50, st.p99 = h.Quantile(0.50), h.Quantile(0.99)
	st.notFound = notFound
	st.generations = -1
	if genEnd, _, ok := s.geometry(); ok {
		st.generations = genEnd - genStart
	}
	return st, nil
}

// medianOf is the median of f over xs (0 if empty).
func medianOf[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// rdmakvStore is the cluster through the client.
type rdmakvStore struct {
	c      *client.Client
	hdr    *headerReader
	ctx    context.Context
	arenas [kvLoaders][]byte // per loader: a batch's keys and values
}

func (s *rdmakvStore) writeBatch(j, first, n int) error {
	a := s.arenas[j]
	if len(a) < n*(kvKeySize+kvValueSize) {
		a = make([]byte, n*(kvKeySize+kvValueSize))
		s.arenas[j] = a
	}
	var b client.Batch
	for i := range n {
		k := a[i*(kvKeySize+kvValueSize):][:kvKeySize]
		v := a[i*(kvKeySize+kvValueSize)+kvKeySize:][:kvValueSize]
		fillKey(k, first+i)
		fillValue(v, k, 'a')
		b.Put(k, v)
	}
	_, err := s.c.Commit(s.ctx, &b)
	return err
}

func (s *rdmakvStore) getter(cons client.Consistency) func([]byte) ([]byte, bool, error) {
	return func(key []byte) ([]byte, bool, error) {
		it, err := s.c.GetItem(s.ctx, key, cons)
		if errors.Is(err, client.ErrNotFound) {
			return nil, false, nil
		}
		return it.Value, err == nil, err
	}
}

func (s *rdmakvStore) putter() func(key, value []byte) error {
	return func(key, value []byte) error {
		_, err := s.c.Put(s.ctx, key, value)
		return err
	}
}

func (s *rdmakvStore) geometry() (int, bool, bool) {
	if s.hdr == nil {
		return 0, false, false
	}
	h, err := s.hdr.read()
	if err != nil {
		return 0, false, false
	}
	return h.Geometry.Gen, h.Geometry.Migrating, true
}

// loadBatch is how many puts of the workload's size fit one request slot.
func loadBatch(slotSize, maxBatch int) int {
	max := multicast.MaxPayload(slotSize)
	key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
	ops := []kv.Op{{Kind: kv.OpPut, Key: key, Value: val}}
	for len(ops) < maxBatch {
		ops = append(ops, ops[0])
		if kv.RequestSize(ops) > max {
			return len(ops) - 1
		}
	}
	return maxBatch
}

// memStat is one run's memory figure.
type memStat struct {
	bytes, index, heap, rss, shm float64 // per record per replica
	base, baseRSS                float64 // Redis, per record
	hasBase                      bool
	// replicas and replicasCPU: what the replicas' processes did during
	// Redis's load, which base measures (basefreeze.go)
	replicas        string
	replicasCPU     float64
	gen, logBuckets int
	migrating       bool
}

// kvKey names a get or put row.
type kvKey struct {
	op, cons string
	threads  int
}

// kvPair is one run's measurement of a row and of its Redis baseline.
type kvPair struct {
	ours, base kvstat
	hasBase    bool
}

// kvResults collects every run's measurements.
type kvResults struct {
	order  []kvKey
	rows   map[kvKey][]kvPair
	growth []growthPair
	mem    []memStat
	failed []string
}

type growthPair struct {
	ours, base growthStat
	hasBase    bool
}

func (r *kvResults) add(k kvKey, p kvPair) {
	if _, ok := r.rows[k]; !ok {
		r.order = append(r.order, k)
	}
	r.rows[k] = append(r.rows[k], p)
}

// runKV is the kv subcommand.
func runKV(args []string, stdout, stderr io.Writer) error {
	o, err := parseKVFlags(args, stderr)
	if err != nil {
		return err
	}
	sweepShmDir(o.shmDir, stderr)
	if o.cpuProf != "" {
		stop, err := startProfile(o.cpuProf)
		if err != nil {
			return fmt.Errorf("kv: %w", err)
		}
		defer stop()
	}
	redisBin := ""
	if o.redis != "" {
		if redisBin, err = redisproc.Find(o.redis); err != nil {
			fmt.Fprintf(stderr, "kvbench kv: no Redis baseline: %v; install it with: apt-get install -y redis-server (Debian); the rdmakv rows follow alone\n", err)
		}
	}
	kvserverBin, cleanup, err := kvserverBinary("kv", o.embedded, o.kvserver, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	res := &kvResults{rows: map[kvKey][]kvPair{}}
	fmt.Fprintf(stderr, "kvbench kv: %d run(s) of %d records; load average %s\n", o.runs, o.records, loadAvg())
	for run := 1; run <= o.runs; run++ {
		if err := kvRunOnce(o, run, kvserverBin, redisBin, res, stderr); err != nil {
			res.failed = append(res.failed, fmt.Sprintf("run %d", run))
			fmt.Fprintf(stderr, "kvbench kv: run %d: %v\n", run, err)
		}
	}
	out := summarizeKV(res, o)
	return emitRows("kv", stdout, stderr, out, o.json, func() { printKVTable(stdout, out, o, redisBin != "") }, res.failed)
}

// kvserverBinary is the kvserver binary of --embedded: bin if given,
// else one built into a temporary directory that cleanup removes ("" if
// not embedded).
func kvserverBinary(cmd string, embedded bool, bin string, stderr io.Writer) (string, func(), error) {
	if !embedded || bin != "" {
		return bin, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "kvbench-kvserver-")
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", cmd, err)
	}
	fmt.Fprintf(stderr, "kvbench %s: building kvserver (go build %s)\n", cmd, kvserverPkg)
	if bin, err = buildKVServer(dir); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// kvEnv is one run's setup: the replicas' process, the client, and Redis.
type kvEnv struct {
	o     *kvFlags
	ctx   context.Context
	note  func(f string, a ...any)
	wd    string // the shm directory (kvbench's work directory)
	name  string // the shm cluster's name
	m     *cluster.Map
	proc  *kvProc       // the replicas' process (nil with --embedded)
	srv   *kvserverProc // --embedded: kvserver
	bin   string        // --embedded: kvserver's binary
	node  rdma.Node
	c     *client.Client
	hconn rdma.Conn
	rd    *redisServer // nil: no baseline
	ours  *rdmakvStore
	redis *redisStore // nil: no baseline
	pids  []int       // the replicas' process and redis-server
	reps  []int       // the replicas' process
	// baseLoad: what the replicas' processes did during Redis's load
	// (load or plainLoad), for the memory row
	baseLoad kvproc.During
}

// openKVEnv starts a fresh cluster under a new name, opens the client, and
// starts redis-server (redisBin "": none). On error, what was started is
// closed.
func openKVEnv(o *kvFlags, kvserverBin, redisBin string, note func(string, ...any)) (e *kvEnv, err error) {
	e = &kvEnv{o: o, ctx: runCtx, note: note, bin: kvserverBin}
	if e.wd, err = workDir(o.shmDir); err != nil {
		return nil, err
	}
	e.name = fmt.Sprintf("kvbench-kv-%d-%x", os.Getpid(), time.Now().UnixNano()&0xffffffff)
	if o.embedded {
		if err := e.openEmbedded(); err != nil {
			return nil, err
		}
	} else if err := e.openChild(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	e.pids = slices.Clone(e.reps)
	if redisBin != "" {
		if e.rd, err = startRedis(e.ctx, redisBin, e.wd, max(o.putThreads, slices.Max(o.threads))+kvLoaders+4); err != nil {
			return e, err
		}
		e.redis = &redisStore{s: e.rd, ctx: e.ctx}
		e.pids = append(e.pids, e.rd.Pid())
		note("redis: %s in process %d on %s", redisBin, e.rd.Pid(), e.rd.Addr)
	}
	return e, nil
}

// openEmbedded starts kvserver's embedded cluster and opens the client on
// the map file it wrote. On error, what was started is closed.
func (e *kvEnv) openEmbedded() (err error) {
	if e.srv, err = startKVServer(e.bin, e.wd, e.name, e.o.groups, e.o.et, e.o.durability, settingArgs(e.o.walLayout, e.o.spareP)...); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	octx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	e.c, err = client.Open(octx, append([]client.Option{client.WithMapFile(e.srv.mapFile)}, kvHoldOpts()...)...)
	cancel()
	if err != nil {
		return err
	}
	if e.m, err = cluster.Load(e.srv.mapFile); err != nil {
		return err
	}
	e.ours = &rdmakvStore{c: e.c, ctx: e.ctx}
	e.reps = []int{e.srv.pid()}
	e.note("rdmakv: kvserver's embedded cluster (%s, %d x 3 replicas, durability %s%s) in process %d, cluster %s in %s (the client opened %s)",
		e.bin, len(e.m.Groups), e.o.durability, strings.Join(append([]string{""}, settingArgs(e.o.walLayout, e.o.spareP)...), " "), e.srv.pid(), e.name, e.wd, e.srv.mapFile)
	return nil
}

// openChild starts kvbench's own replicas' process (one group) and opens
// the client on a node of its own. On error, what was started is closed.
func (e *kvEnv) openChild() (err error) {
	o, note := e.o, e.note
	e.m = &cluster.Map{Name: e.name, Fabric: "shm", ShmDir: e.wd, Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{kvClientID}}
	for g := 1; g < o.childGroups; g++ {
		id := rdma.NodeID(3*g + 1)
		e.m.Groups = append(e.m.Groups, []rdma.NodeID{id, id + 1, id + 2})
	}
	if o.ordered {
		// kvbench btree: the ordered keyspace kvserver's embedded cluster
		// declares, and a node for a second client (its cold rows).
		e.m.Keyspaces = []cluster.Keyspace{{Name: cluster.DefaultOrderedKeyspace, Kind: cluster.KindOrdered, ID: 1, Splits: o.orderedSplits, NodeSize: o.orderedNodeSize}}
		if o.orderedNodeSize > 0 && (btree.Config{NodeSize: o.orderedNodeSize, MaxKey: cluster.DefaultOrderedMaxKey + cluster.KeyspacePrefix}).Validate() != nil {
			// Nodes too small for keys of 255 bytes: the cluster's keys
			// are bounded at 64 bytes (kvbench's are 16).
			e.m.Limits.MaxKey = 64
		}
		e.m.ClientNodes = append(e.m.ClientNodes, kvClientID+1)
	}
	if e.proc, err = startKVProc(e.m, o.et, o.spareP); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	if err := e.m.Fill(); err != nil {
		return err
	}
	if e.node, err = fabric.Open(fabric.ForMap(e.m), kvClientID); err != nil {
		return fmt.Errorf("the client's node: %w", err)
	}
	octx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	e.c, err = client.Open(octx, append([]client.Option{client.WithMap(e.m), client.WithNode(e.node)}, kvHoldOpts()...)...)
	cancel()
	if err != nil {
		return err
	}
	if e.hconn, err = e.node.Connect(e.m.Groups[0][0]); err != nil {
		return err
	}
	e.ours = &rdmakvStore{c: e.c, hdr: &headerReader{conn: e.hconn}, ctx: e.ctx}
	e.reps = []int{e.proc.pid()}
	note("rdmakv: %d x 3 replicas in process %d, cluster %s in %s", len(e.m.Groups), e.proc.pid(), e.name, e.wd)
	return nil
}

// close ends the client, the replicas' process and redis-server, and
// checks that no file of the cluster is left.
func (e *kvEnv) close() error {
	var err error
	if e.c != nil {
		err = errors.Join(err, e.c.Close())
		e.c = nil
	}
	if e.hconn != nil {
		e.hconn.Close()
		e.hconn = nil
	}
	if e.node != nil {
		err = errors.Join(err, e.node.Close())
		e.node = nil
	}
	if e.proc != nil {
		if perr := e.proc.close(); perr != nil {
			err = errors.Join(err, fmt.Errorf("kv replicas' process: %w", perr))
		}
		e.proc = nil
	}
	if e.srv != nil {
		err = errors.Join(err, e.srv.close())
		e.srv = nil
	}
	if left := shmLeftovers(e.wd, e.name); len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("left in %s: %s", e.wd, strings.Join(left, ", ")))
	}
	if e.rd != nil {
		err = errors.Join(err, e.rd.Close())
		e.rd = nil
	}
	return err
}

// kvRunOnce is one run: a fresh cluster and Redis, every figure.
func kvRunOnce(o *kvFlags, run int, kvserverBin, redisBin string, res *kvResults, stderr io.Writer) (err error) {
	note := func(f string, a ...any) {
		fmt.Fprintf(stderr, "[run %d/%d] "+f+"\n", append([]any{run, o.runs}, a...)...)
	}
	e, err := openKVEnv(o, kvserverBin, redisBin, note)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.close()) }()
	var redisMem0 redisMem
	if e.rd != nil {
		if redisMem0, err = e.rd.memory(e.ctx); err != nil {
			return err
		}
	}
	if !o.row("growth") {
		if err := e.plainLoad(); err != nil {
			return err
		}
	} else {
		gp, err := e.load()
		if err != nil {
			return err
		}
		res.growth = append(res.growth, gp)
	}
	if !o.row("memory") {
		e.rows(run, stderr, res)
		return nil
	}
	// Memory, once every replica applied the load.
	ms, err := kvMemory(e.proc, o.records, e.wd, e.name, e.m.Groups[0])
	if err != nil {
		return err
	}
	if e.rd != nil {
		rm, err := e.rd.memory(e.ctx)
		if err != nil {
			return err
		}
		ms.hasBase = true
		ms.replicas, ms.replicasCPU = e.baseLoad.State, e.baseLoad.CPUSeconds
		ms.base = float64(rm.used-redisMem0.used) / float64(o.records)
		ms.baseRSS = float64(rm.rss-redisMem0.rss) / float64(o.records)
	}
	res.mem = append(res.mem, ms)
	note("memory per record per replica: index+heap %.1f B (index %.1f, heap %.1f), rss %.1f B, shm %.1f B; redis used_memory %.1f B",
		ms.bytes, ms.index, ms.heap, ms.rss, ms.shm, ms.base)
	e.rows(run, stderr, res)
	return nil
}

// load writes the seed keys, then loads the rest with the growth figure:
// rdmakv, then Redis.
func (e *kvEnv) load() (growthPair, error) {
	o := e.o
	batch := loadBatch(e.m.Limits.SlotSize, e.m.Limits.MaxBatch)
	before := max(o.duration, 5*o.interval)
	gp := growthPair{hasBase: e.redis != nil}
	type side struct {
		name string
		s    store
		st   *growthStat
	}
	sides := []side{{"rdmakv", e.ours, &gp.ours}}
	if e.redis != nil {
		sides = append(sides, side{"redis", e.redis, &gp.base})
	}
	for _, side := range sides {
		var st growthStat
		do := func() error {
			for first := 0; first < kvSeedKeys; first += batch {
				if err := side.s.writeBatch(0, first, min(batch, kvSeedKeys-first)); err != nil {
					return fmt.Errorf("%s: seed keys: %w", side.name, err)
				}
			}
			e.note("%s: load of %d keys (batches of %d on %d goroutines) with stale-ok gets alongside", side.name, o.records, batch, kvLoaders)
			var err error
			st, err = growth(side.s, kvSeedKeys, o.records, batch, o.interval, before, func(done, all int, el time.Duration) {
				e.note("%s: loaded %d/%d keys in %.1fs (%s keys/s)", side.name, done, all, el.Seconds(), fmtOps(float64(done-kvSeedKeys)/el.Seconds()))
			})
			if err != nil {
				return fmt.Errorf("%s load: %w", side.name, err)
			}
			return nil
		}
		if side.name == "redis" {
			// Redis's side with the replicas' process stopped.
			d, err := e.frozenDo(do)
			st.replicas, st.replicasCPU = d.State, d.CPUSeconds
			e.baseLoad = d
			if err != nil {
				return gp, err
			}
		} else if err := do(); err != nil {
			return gp, err
		}
		*side.st = st
		gens := ""
		if st.generations >= 0 {
			gens = fmt.Sprintf("; index generations: %d", st.generations)
		}
		e.note("%s: gets before the load %s/s; during it min %s/s (dip %.2fx), median %s/s%s; %s puts/s",
			side.name, fmtOps(st.before), fmtOps(st.min), ratio(st.min, st.before), fmtOps(st.median), gens, fmtOps(st.loadOpsPerS))
	}
	return gp, nil
}

// plainLoad writes --records keys from empty, as load does but without
// the growth figure's gets: rdmakv, then Redis.
func (e *kvEnv) plainLoad() error {
	o := e.o
	batch := loadBatch(e.m.Limits.SlotSize, e.m.Limits.MaxBatch)
	stores := []store{e.ours}
	names := []string{"rdmakv"}
	if e.redis != nil {
		stores, names = append(stores, e.redis), append(names, "redis")
	}
	for i, s := range stores {
		do := func() error {
			start := time.Now()
			nb := (o.records + batch - 1) / batch
			var next atomic.Int64
			errs := make([]error, kvLoaders)
			var wg sync.WaitGroup
			for j := range kvLoaders {
				wg.Go(func() {
					for b := int(next.Add(1) - 1); b < nb; b = int(next.Add(1) - 1) {
						first := b * batch
						if err := s.writeBatch(j, first, min(batch, o.records-first)); err != nil {
							errs[j] = fmt.Errorf("load keys %d..: %w", first, err)
							next.Store(int64(nb))
							return
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("%s load: %w", names[i], err)
			}
			e.note("%s: loaded %d keys (batches of %d on %d goroutines) in %.1fs", names[i], o.records, batch, kvLoaders, time.Since(start).Seconds())
			return nil
		}
		if names[i] != "redis" {
			if err := do(); err != nil {
				return err
			}
			continue
		}
		// Redis's load (the memory row's baseline) with the replicas'
		// process stopped.
		var err error
		if e.baseLoad, err = e.frozenDo(do); err != nil {
			return err
		}
	}
	return nil
}

// rows measures the get and put rows, each rdmakv row followed by its
// Redis row; a failed measurement is noted and skipped.
func (e *kvEnv) rows(run int, stderr io.Writer, res *kvResults) {
	o := e.o
	tm := timing{dur: o.duration, warm: min(o.duration/5, 200*time.Millisecond)}
	measure := func(threads int, mk func(g int) kvOp) (kvstat, error) {
		return retryDisturbed("kv", o.commonFlags, stderr, func() (kvstat, error) { return e.sample(tm, threads, mk, true) })
	}
	// Redis's rows: the cost fields are ours only.
	measureBase := func(threads int, mk func(g int) kvOp) (kvstat, error) {
		return e.frozen(func() (kvstat, error) {
			return retryDisturbed("kv", o.commonFlags, stderr, func() (kvstat, error) { return e.sample(tm, threads, mk, false) })
		})
	}
	getOp := func(s store, cons client.Consistency) func(int) kvOp {
		return func(g int) kvOp {
			get := s.getter(cons)
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
			key := make([]byte, kvKeySize)
			return func() error {
				fillKey(key, rng.IntN(o.records))
				v, found, err := get(key)
				if err != nil {
					return err
				}
				if !found {
					return fmt.Errorf("key %s not found", key)
				}
				return checkValue(v, key)
			}
		}
	}
	putOp := func(s store, tag byte) func(int) kvOp {
		return func(g int) kvOp {
			put := s.putter()
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
			key, val := make([]byte, kvKeySize), make([]byte, kvValueSize)
			return func() error {
				fillKey(key, rng.IntN(o.records))
				fillValue(val, key, tag)
				return put(key, val)
			}
		}
	}
	type rowSpec struct {
		k      kvKey
		ours   func(int) kvOp
		base   func(int) kvOp // nil: none
		baseOf *kvKey         // reuse the Redis measurement of this row
	}
	var specs []rowSpec
	for _, t := range o.threads {
		if !o.row("get") {
			break
		}
		for i, cons := range []client.Consistency{client.StaleOK, client.Linearizable} {
			sp := rowSpec{k: kvKey{"get", cons.String(), t}, ours: getOp(e.ours, cons)}
			if e.redis != nil && i == 0 {
				sp.base = getOp(e.redis, client.StaleOK)
			} else if e.redis != nil {
				sp.baseOf = &kvKey{"get", client.StaleOK.String(), t}
			}
			specs = append(specs, sp)
		}
	}
	for i, t := range o.putRows {
		if !o.row("put") {
			break
		}
		sp := rowSpec{k: kvKey{"put", "", t}, ours: putOp(e.ours, byte('b'+i))}
		if e.redis != nil {
			sp.base = putOp(e.redis, byte('b'+i))
		}
		specs = append(specs, sp)
	}
	bases := map[kvKey]kvstat{}
	for _, sp := range specs {
		what := strings.Join(strings.Fields(fmt.Sprintf("%s %s x%d", sp.k.op, sp.k.cons, sp.k.threads)), " ")
		st, err := measure(sp.k.threads, sp.ours)
		if err != nil {
			res.failed = append(res.failed, fmt.Sprintf("run %d: %s", run, what))
			e.note("%s: %v", what, err)
			continue
		}
		p := kvPair{ours: st}
		if len(st.ends) > 0 {
			if err := appendOpLog(o.opLog, what, run, st.ends, st.lats); err != nil {
				e.note("--op-log: %v", err)
			}
			p.ours.ends, p.ours.lats = nil, nil
		}
		line := fmt.Sprintf("%-24s p50 %-8s p99 %-8s %8s ops/s (mean %s, p90 %s, p99.9 %s, max %s)", what, fmtDur(st.p50), fmtDur(st.p99), fmtOps(st.opsPerS),
			fmtDur(st.mean), fmtDur(st.p90), fmtDur(st.p999), fmtDur(st.max))
		if c := st.cost; c.ok {
			line += fmt.Sprintf("; per op: %.1f allocs, wake-ups %.2f client (%.2f preempted) %.2f replicas (%.2f preempted), cpu %.1f µs client %.1f µs replicas",
				c.allocs, c.clientWakeups, c.clientPreempts, c.serverWakeups, c.serverPreempts, c.clientCPU, c.serverCPU)
			if c.writesPerMsg > 0 {
				line += fmt.Sprintf(", %.2f writes per message", c.writesPerMsg)
			}
			line += fmt.Sprintf(", waits: client spins %.2f (hits %.2f) parks %.2f wake calls %.2f (woke none %.2f)", c.clientSpins, c.clientSpinHits, c.clientParks, c.clientWakes, c.clientWakesNone)
			if c.pollersOK {
				line += fmt.Sprintf(", pollers spins %.2f (hits %.2f; probes %.3f, hits %.3f) parks %.2f", c.serverSpins, c.serverSpinHits, c.serverProbes, c.serverProbeHits, c.serverParks)
			}
		}
		switch {
		case sp.base != nil:
			bs, err := measureBase(sp.k.threads, sp.base)
			if err != nil {
				res.failed = append(res.failed, fmt.Sprintf("run %d: redis %s", run, what))
				e.note("redis %s: %v", what, err)
				break
			}
			bases[sp.k] = bs
			p.base, p.hasBase = bs, true
		case sp.baseOf != nil:
			p.base, p.hasBase = bases[*sp.baseOf]
		}
		if p.hasBase {
			line += fmt.Sprintf("; redis p50 %-8s %8s ops/s", fmtDur(p.base.p50), fmtOps(p.base.opsPerS))
		}
		e.note("%s; other %.2f CPUs", line, st.otherCPU)
		res.add(sp.k, p)
	}
}

// parsePutThreads reads --put-threads: one count N gives the put rows 1
// and N (one row if N is 1); a list (a comma in it) gives a row at each
// count listed, in its order, each once.
func parsePutThreads(s string) ([]int, error) {
	var rows []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("kv: --put-threads: bad goroutine count %q (want a positive count or a comma-separated list of them)", f)
		}
		if !slices.Contains(rows, n) {
			rows = append(rows, n)
		}
	}
	switch {
	case len(rows) == 0:
		return nil, errors.New("kv: --put-threads lists no goroutine count")
	case strings.Contains(s, ","):
		return rows, nil
	case rows[0] == 1:
		return []int{1}, nil
	}
	return []int{1, rows[0]}, nil
}

// sample is one closed-loop measurement of threads goroutines with the
// CPUs other processes used meanwhile and, if costed, the cost per op of
// the client's and the replicas' processes.
func (e *kvEnv) sample(tm timing, threads int, mk func(g int) kvOp, costed bool) (kvstat, error) {
	a := takeCPUs(e.pids...)
	var c0 costSnap
	var w0 client.Stats
	rs := e.ours
	var ctl string // the replicas' control port (--embedded)
	if e.srv != nil {
		ctl = e.srv.control
	}
	if costed {
		c0 = takeCost(e.reps)
		c0.pollers = readPollerCounts(ctl)
		if rs != nil {
			w0 = rs.c.Stats()
		}
	}
	st, err := closedLoopLog(threads, tm, costed && threads == 1 && e.o.opLog != "", mk)
	if costed {
		c1 := takeCostAfter(e.reps)
		c1.pollers = readPollerCounts(ctl)
		st.cost = costPerOp(c0, c1, st.total)
		if rs != nil {
			if w := rs.c.Stats(); w.WriteMessages > w0.WriteMessages {
				st.cost.writesPerMsg = float64(w.WriteOps-w0.WriteOps) / float64(w.WriteMessages-w0.WriteMessages)
			}
		}
	}
	st.otherCPU = otherCPUs(a, takeCPUs(e.pids...), runtime.NumCPU())
	return st, err
}

// kvMemory waits until every replica applied the load and reads the
// memory figure.
func kvMemory(proc *kvProc, records int, dir, name string, members []rdma.NodeID) (memStat, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := proc.stats()
		if err != nil {
			return memStat{}, fmt.Errorf("replica stats: %w", err)
		}
		all := true
		for _, s := range r.Replicas {
			all = all && s.Records == records
		}
		if !all {
			if time.Now().After(deadline) {
				return memStat{}, fmt.Errorf("replicas hold %+v records a minute after the load, want %d each", r.Replicas, records)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		var ms memStat
		n := float64(records) * float64(len(r.Replicas))
		for _, s := range r.Replicas {
			ms.index += float64(s.IndexBytes) / n
			ms.heap += float64(s.HeapBytes) / n
			ms.migrating = ms.migrating || s.Migrating
		}
		ms.bytes = ms.index + ms.heap
		ms.gen, ms.logBuckets = r.Replicas[0].Gen, r.Replicas[0].LogBuckets
		ms.rss = float64(r.Mem.VmRSS-proc.ready.Mem.VmRSS) / n
		ms.shm = float64(shmBytes(dir, name, members)) / n
		return ms, nil
	}
}

// shmBytes is the tmpfs space (allocated blocks) of the given nodes' files
// of cluster name in dir.
func shmBytes(dir, name string, nodes []rdma.NodeID) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total int64
	for _, e := range ents {
		for _, id := range nodes {
			if !strings.HasPrefix(e.Name(), fmt.Sprintf("rdmakv.%s.%d.", name, id)) {
				continue
			}
			if fi, err := e.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					total += st.Blocks * 512
				}
			}
		}
	}
	return total
}

// shmLeftovers lists the files of cluster name still in dir.
func shmLeftovers(dir, name string) []string {
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "rdmakv."+name+".") {
			left = append(left, e.Name())
		}
	}
	return left
}

// kvRow is one output line.
type kvRow struct {
	Bench       string `json:"bench"`       // "kv"
	Op          string `json:"op"`          // get, put, get-during-growth, memory
	Consistency string `json:"consistency"` // linearizable, stale-ok; "" for puts and memory
	Threads     int    `json:"threads"`
	Records     int    `json:"records"`
	P50NS       int64  `json:"p50_ns"`
	P99NS       int64  `json:"p99_ns"`
	// get and put rows: the rest of the distribution (medians over runs);
	// mean_ns is an op's mean time, its goroutine's 1 / ops/s
	MeanNS          int64   `json:"mean_ns,omitempty"`
	P90NS           int64   `json:"p90_ns,omitempty"`
	P999NS          int64   `json:"p999_ns,omitempty"`
	MaxNS           int64   `json:"max_ns,omitempty"`
	OpsPerS         float64 `json:"ops_per_s"`
	Baseline        string  `json:"baseline"` // "redis", or "" without redis-server
	BaselineOpsPerS float64 `json:"baseline_ops_per_s"`
	BaselineP50NS   int64   `json:"baseline_p50_ns"`
	BaselineP99NS   int64   `json:"baseline_p99_ns"`
	RatioOps        float64 `json:"ratio_ops"` // ops/s / Redis ops/s (median of per-run ratios)
	RatioP50        float64 `json:"ratio_p50"` // p50 / Redis p50 (median of per-run ratios)
	// BaselineReplicas: "stopped" when the replicas' processes were
	// stopped through every Redis measurement of the row (basefreeze.go),
	// and the CPU seconds they used during one (median over runs).
	BaselineReplicas     string  `json:"baseline_replicas,omitempty"`
	BaselineReplicasCPUS float64 `json:"baseline_replicas_cpu_s,omitempty"`
	Runs                 int     `json:"runs"`
	N                    uint64  `json:"n,omitempty"`
	Retries              int     `json:"retries"`
	OtherCPU             float64 `json:"other_cpu"`
	// Where the replicas ran: "embedded-kvserver" (--embedded) or
	// "kvbench-child" (kvbench's own replicas' process); groups of 3.
	Replicas string `json:"replicas"`
	Groups   int    `json:"groups"`
	// HugePages is how the replicas' regions in --shm-dir are backed
	// (shm.ProbeHugePages: huge pages need a tmpfs mounted huge=...).
	HugePages *rdma.HugePages `json:"huge_pages,omitempty"`
	// get and put rows: the cost per op.
	costCols
	// put rows: the client's single-key writes per message it sent (its
	// combining; medians over the runs that sent any).
	WritesPerMessage float64 `json:"writes_per_message,omitempty"`
	// get-during-growth (ops_per_s is the slowest interval of the load)
	IntervalNS            int64   `json:"interval_ns,omitempty"`
	BeforeOpsPerS         float64 `json:"before_ops_per_s,omitempty"`
	MedianOpsPerS         float64 `json:"median_ops_per_s,omitempty"`
	Dip                   float64 `json:"dip,omitempty"` // ops_per_s / before_ops_per_s
	MigratingMinOpsPerS   float64 `json:"migrating_min_ops_per_s,omitempty"`
	SteadyMinOpsPerS      float64 `json:"steady_min_ops_per_s,omitempty"`
	Generations           int     `json:"generations,omitempty"`
	Intervals             int     `json:"intervals,omitempty"`
	LoadOpsPerS           float64 `json:"load_ops_per_s,omitempty"`
	NotFound              uint64  `json:"not_found,omitempty"`
	BaselineBeforeOpsPerS float64 `json:"baseline_before_ops_per_s,omitempty"`
	BaselineMedianOpsPerS float64 `json:"baseline_median_ops_per_s,omitempty"`
	BaselineDip           float64 `json:"baseline_dip,omitempty"`
	BaselineLoadOpsPerS   float64 `json:"baseline_load_ops_per_s,omitempty"`
	// memory (per record per replica; Redis per record)
	BytesPerRecord            float64 `json:"bytes_per_record,omitempty"`
	RawBytesPerRecord         int     `json:"raw_bytes_per_record,omitempty"`
	RatioRaw                  float64 `json:"ratio_raw,omitempty"` // bytes_per_record / raw
	IndexBytesPerRecord       float64 `json:"index_bytes_per_record,omitempty"`
	HeapBytesPerRecord        float64 `json:"heap_bytes_per_record,omitempty"`
	RSSBytesPerRecord         float64 `json:"rss_bytes_per_record,omitempty"`
	ShmBytesPerRecord         float64 `json:"shm_bytes_per_record,omitempty"`
	BaselineBytesPerRecord    float64 `json:"baseline_bytes_per_record,omitempty"`
	BaselineRSSBytesPerRecord float64 `json:"baseline_rss_bytes_per_record,omitempty"`
	Generation                int     `json:"generation,omitempty"`
	LogBuckets                int     `json:"log_buckets,omitempty"`
	Migrating                 bool    `json:"migrating,omitempty"`
}

// costCols are a row's cost per op (medians over runs), from the
// client's process (this one) and the replicas' process, over every op
// of the measurement, warm-up included (cost_ops of them).
type costCols struct {
	CostOps             uint64   `json:"cost_ops,omitempty"`
	ClientAllocsPerOp   *float64 `json:"client_allocs_per_op,omitempty"`
	ClientWakeupsPerOp  *float64 `json:"client_wakeups_per_op,omitempty"`
	ServerWakeupsPerOp  *float64 `json:"server_wakeups_per_op,omitempty"`
	ClientPreemptsPerOp *float64 `json:"client_nonvoluntary_per_op,omitempty"` // of the wake-ups: preemptions
	ServerPreemptsPerOp *float64 `json:"server_nonvoluntary_per_op,omitempty"`
	ClientCPUUSPerOp    *float64 `json:"client_cpu_us_per_op,omitempty"`
	ServerCPUUSPerOp    *float64 `json:"server_cpu_us_per_op,omitempty"`
	CPUUSPerOp          *float64 `json:"cpu_us_per_op,omitempty"` // client + server
	// How the waits of an op ended (rdma.WaitStats in the client, the
	// pollers' /status counters of an --embedded kvserver): spin phases,
	// those a ring ended (no park), and parks. A put whose waits all
	// park pays a futex wake and a thread wake-up per hop.
	ClientSpinsPerOp    *float64 `json:"client_spins_per_op,omitempty"`
	ClientSpinHitsPerOp *float64 `json:"client_spin_hits_per_op,omitempty"`
	ClientParksPerOp    *float64 `json:"client_parks_per_op,omitempty"`
	// the client's rings that made a wake system call, and those that
	// woke no thread (the waiter was already woken)
	ClientWakeCallsPerOp     *float64 `json:"client_wake_calls_per_op,omitempty"`
	ClientWakeCallsNonePerOp *float64 `json:"client_wake_calls_none_per_op,omitempty"`
	ServerSpinsPerOp         *float64 `json:"server_spins_per_op,omitempty"`
	ServerSpinHitsPerOp      *float64 `json:"server_spin_hits_per_op,omitempty"`
	ServerParksPerOp         *float64 `json:"server_parks_per_op,omitempty"`
	ServerProbesPerOp        *float64 `json:"server_probes_per_op,omitempty"` // the pollers' probe spins (poller.PollerStats)
	ServerProbeHitsPerOp     *float64 `json:"server_probe_hits_per_op,omitempty"`
}

// medianCost is the cost columns over runs: the medians of the runs
// whose cost was read (none: empty columns).
func medianCost[T any](runs []T, cost func(T) opCost) costCols {
	var costed []opCost
	for _, r := range runs {
		if c := cost(r); c.ok {
			costed = append(costed, c)
		}
	}
	var r costCols
	if len(costed) == 0 {
		return r
	}
	med := func(f func(c opCost) float64) *float64 {
		v := medianOf(costed, f)
		return &v
	}
	r.CostOps = uint64(*med(func(c opCost) float64 { return float64(c.ops) }))
	r.ClientAllocsPerOp = med(func(c opCost) float64 { return c.allocs })
	r.ClientWakeupsPerOp = med(func(c opCost) float64 { return c.clientWakeups })
	r.ServerWakeupsPerOp = med(func(c opCost) float64 { return c.serverWakeups })
	r.ClientPreemptsPerOp = med(func(c opCost) float64 { return c.clientPreempts })
	r.ServerPreemptsPerOp = med(func(c opCost) float64 { return c.serverPreempts })
	r.ClientCPUUSPerOp = med(func(c opCost) float64 { return c.clientCPU })
	r.ServerCPUUSPerOp = med(func(c opCost) float64 { return c.serverCPU })
	r.CPUUSPerOp = med(func(c opCost) float64 { return c.clientCPU + c.serverCPU })
	r.ClientSpinsPerOp = med(func(c opCost) float64 { return c.clientSpins })
	r.ClientSpinHitsPerOp = med(func(c opCost) float64 { return c.clientSpinHits })
	r.ClientParksPerOp = med(func(c opCost) float64 { return c.clientParks })
	r.ClientWakeCallsPerOp = med(func(c opCost) float64 { return c.clientWakes })
	r.ClientWakeCallsNonePerOp = med(func(c opCost) float64 { return c.clientWakesNone })
	if costed[0].pollersOK {
		r.ServerSpinsPerOp = med(func(c opCost) float64 { return c.serverSpins })
		r.ServerSpinHitsPerOp = med(func(c opCost) float64 { return c.serverSpinHits })
		r.ServerParksPerOp = med(func(c opCost) float64 { return c.serverParks })
		r.ServerProbesPerOp = med(func(c opCost) float64 { return c.serverProbes })
		r.ServerProbeHitsPerOp = med(func(c opCost) float64 { return c.serverProbeHits })
	}
	return r
}

// summarizeKV turns per-run results into rows: medians over runs, ratios
// per run.
func summarizeKV(res *kvResults, o *kvFlags) []kvRow {
	var out []kvRow
	placement, groups := "kvbench-child", 1
	if o.embedded {
		placement, groups = "embedded-kvserver", o.groups
	}
	for _, k := range res.order {
		ps := res.rows[k]
		r := kvRow{Bench: "kv", Op: k.op, Consistency: k.cons, Threads: k.threads, Records: o.records, Runs: len(ps)}
		r.costCols = medianCost(ps, func(p kvPair) opCost { return p.ours.cost })
		r.P50NS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.p50) }))
		r.P99NS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.p99) }))
		r.MeanNS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.mean) }))
		r.P90NS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.p90) }))
		r.P999NS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.p999) }))
		r.MaxNS = int64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.max) }))
		r.OpsPerS = medianOf(ps, func(p kvPair) float64 { return p.ours.opsPerS })
		r.N = uint64(medianOf(ps, func(p kvPair) float64 { return float64(p.ours.n) }))
		r.OtherCPU = medianOf(ps, func(p kvPair) float64 { return p.ours.otherCPU })
		var sent []kvPair
		for _, p := range ps {
			if p.ours.cost.writesPerMsg > 0 {
				sent = append(sent, p)
			}
		}
		if len(sent) > 0 {
			r.WritesPerMessage = medianOf(sent, func(p kvPair) float64 { return p.ours.cost.writesPerMsg })
		}
		var based []kvPair
		for _, p := range ps {
			r.Retries += p.ours.retries
			if p.hasBase {
				based = append(based, p)
			}
		}
		if len(based) > 0 {
			r.Baseline = "redis"
			r.BaselineOpsPerS = medianOf(based, func(p kvPair) float64 { return p.base.opsPerS })
			r.BaselineP50NS = int64(medianOf(based, func(p kvPair) float64 { return float64(p.base.p50) }))
			r.BaselineP99NS = int64(medianOf(based, func(p kvPair) float64 { return float64(p.base.p99) }))
			r.RatioOps = medianOf(based, func(p kvPair) float64 { return ratio(p.ours.opsPerS, p.base.opsPerS) })
			r.RatioP50 = medianOf(based, func(p kvPair) float64 { return ratio(float64(p.ours.p50), float64(p.base.p50)) })
			r.BaselineReplicas = baselineReplicas(mapOf(based, func(p kvPair) string { return p.base.replicas }))
			r.BaselineReplicasCPUS = medianOf(based, func(p kvPair) float64 { return p.base.replicasCPU })
		}
		out = append(out, r)
	}
	if gs := res.growth; len(gs) > 0 {
		r := kvRow{Bench: "kv", Op: "get-during-growth", Consistency: client.StaleOK.String(), Threads: 1, Records: o.records,
			Runs: len(gs), OtherCPU: -1, IntervalNS: o.interval.Nanoseconds()}
		med := func(f func(growthStat) float64) float64 {
			return medianOf(gs, func(g growthPair) float64 { return f(g.ours) })
		}
		r.OpsPerS = med(func(g growthStat) float64 { return g.min })
		r.P50NS = int64(med(func(g growthStat) float64 { return float64(g.p50) }))
		r.P99NS = int64(med(func(g growthStat) float64 { return float64(g.p99) }))
		r.BeforeOpsPerS = med(func(g growthStat) float64 { return g.before })
		r.MedianOpsPerS = med(func(g growthStat) float64 { return g.median })
		r.Dip = med(func(g growthStat) float64 { return ratio(g.min, g.before) })
		r.MigratingMinOpsPerS = med(func(g growthStat) float64 { return g.migMin })
		r.SteadyMinOpsPerS = med(func(g growthStat) float64 { return g.steadyMin })
		r.Generations = int(med(func(g growthStat) float64 { return float64(g.generations) }))
		r.Intervals = int(med(func(g growthStat) float64 { return float64(g.intervals) }))
		r.LoadOpsPerS = med(func(g growthStat) float64 { return g.loadOpsPerS })
		for _, g := range gs {
			r.NotFound += g.ours.notFound
		}
		var based []growthPair
		for _, g := range gs {
			if g.hasBase {
				based = append(based, g)
			}
		}
		if len(based) > 0 {
			bmed := func(f func(growthStat) float64) float64 {
				return medianOf(based, func(g growthPair) float64 { return f(g.base) })
			}
			r.Baseline = "redis"
			r.BaselineOpsPerS = bmed(func(g growthStat) float64 { return g.min })
			r.BaselineP50NS = int64(bmed(func(g growthStat) float64 { return float64(g.p50) }))
			r.BaselineP99NS = int64(bmed(func(g growthStat) float64 { return float64(g.p99) }))
			r.BaselineBeforeOpsPerS = bmed(func(g growthStat) float64 { return g.before })
			r.BaselineMedianOpsPerS = bmed(func(g growthStat) float64 { return g.median })
			r.BaselineDip = bmed(func(g growthStat) float64 { return ratio(g.min, g.before) })
			r.BaselineLoadOpsPerS = bmed(func(g growthStat) float64 { return g.loadOpsPerS })
			r.RatioOps = medianOf(based, func(g growthPair) float64 { return ratio(g.ours.min, g.base.min) })
			r.RatioP50 = medianOf(based, func(g growthPair) float64 { return ratio(float64(g.ours.p50), float64(g.base.p50)) })
			r.BaselineReplicas = baselineReplicas(mapOf(based, func(g growthPair) string { return g.base.replicas }))
			r.BaselineReplicasCPUS = bmed(func(g growthStat) float64 { return g.replicasCPU })
		}
		out = append(out, r)
	}
	if ms := res.mem; len(ms) > 0 {
		med := func(f func(memStat) float64) float64 { return medianOf(ms, f) }
		r := kvRow{Bench: "kv", Op: "memory", Records: o.records, Runs: len(ms), OtherCPU: -1, RawBytesPerRecord: kvKeySize + kvValueSize}
		r.BytesPerRecord = med(func(m memStat) float64 { return m.bytes })
		r.RatioRaw = r.BytesPerRecord / float64(r.RawBytesPerRecord)
		r.IndexBytesPerRecord = med(func(m memStat) float64 { return m.index })
		r.HeapBytesPerRecord = med(func(m memStat) float64 { return m.heap })
		r.RSSBytesPerRecord = med(func(m memStat) float64 { return m.rss })
		r.ShmBytesPerRecord = med(func(m memStat) float64 { return m.shm })
		r.Generation = ms[len(ms)-1].gen
		r.LogBuckets = ms[len(ms)-1].logBuckets
		for _, m := range ms {
			r.Migrating = r.Migrating || m.migrating
		}
		var based []memStat
		for _, m := range ms {
			if m.hasBase {
				based = append(based, m)
			}
		}
		if len(based) > 0 {
			r.Baseline = "redis"
			r.BaselineBytesPerRecord = medianOf(based, func(m memStat) float64 { return m.base })
			r.BaselineRSSBytesPerRecord = medianOf(based, func(m memStat) float64 { return m.baseRSS })
			r.BaselineReplicas = baselineReplicas(mapOf(based, func(m memStat) string { return m.replicas }))
			r.BaselineReplicasCPUS = medianOf(based, func(m memStat) float64 { return m.replicasCPU })
		}
		out = append(out, r)
	}
	hp := shm.ProbeHugePages("", o.shmDir)
	for i := range out {
		out[i].Replicas, out[i].Groups, out[i].HugePages = placement, groups, &hp
	}
	return out
}

func printKVTable(w io.Writer, out []kvRow, o *kvFlags, haveRedis bool) {
	fmt.Fprintf(w, "kvbench kv  %s  %s, %d CPUs, %s  medians of %d run(s) x %v\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.runs, o.duration)
	if o.embedded {
		fmt.Fprintf(w, "%d records, %d B keys, %d B values; kvserver's embedded cluster (%d x 3 replicas on shm) in a child process, the client in this one through its map file\n",
			o.records, kvKeySize, kvValueSize, o.groups)
	} else {
		fmt.Fprintf(w, "%d records, %d B keys, %d B values; 3 replicas (1 group) on shm in a child process, the client in this one\n",
			o.records, kvKeySize, kvValueSize)
	}
	if haveRedis {
		fmt.Fprintf(w, "baseline: redis-server (persistence off) on loopback, go-redis v9; ops ratio = ops/s / redis ops/s, p50 ratio = p50 / redis p50\n")
	} else {
		fmt.Fprintf(w, "baseline: none (no redis-server: apt-get install -y redis-server)\n")
	}
	fmt.Fprintf(w, "huge pages: %v\n", shm.ProbeHugePages("", o.shmDir))
	fmt.Fprintf(w, "latency: every op timed; other cpu: CPUs used by other processes meanwhile (median over runs)\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tconsistency\tthreads\tp50\tp99\tops/s\tredis p50\tredis p99\tredis ops/s\tops ratio\tp50 ratio\tother cpu\t")
	var growth, mem *kvRow
	for i := range out {
		r := &out[i]
		switch r.Op {
		case "get-during-growth":
			growth = r
			continue
		case "memory":
			mem = r
			continue
		}
		bp50, bp99, bops, rops, rp50 := "-", "-", "-", "-", "-"
		if r.Baseline != "" {
			bp50, bp99, bops = fmtDur(time.Duration(r.BaselineP50NS)), fmtDur(time.Duration(r.BaselineP99NS)), fmtOps(r.BaselineOpsPerS)
			rops, rp50 = fmt.Sprintf("%.2fx", r.RatioOps), fmt.Sprintf("%.2fx", r.RatioP50)
		}
		cons := r.Consistency
		if cons == "" {
			cons = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t\n", r.Op, cons, r.Threads,
			fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), fmtOps(r.OpsPerS), bp50, bp99, bops, rops, rp50, r.OtherCPU)
	}
	tw.Flush()
	printKVCost(w, out)
	if g := growth; g != nil {
		fmt.Fprintf(w, "\ngets during the load (stale-ok, 1 goroutine, per %v; the index grows from empty):\n", time.Duration(g.IntervalNS))
		fmt.Fprintf(w, "  rdmakv: before %s/s; during: slowest %s/s (dip %.2fx), median %s/s; slowest with a migration %s/s, without %s/s; generations: %d, intervals: %d; load %s puts/s; p50 %s p99 %s\n",
			fmtOps(g.BeforeOpsPerS), fmtOps(g.OpsPerS), g.Dip, fmtOps(g.MedianOpsPerS), fmtOps(g.MigratingMinOpsPerS), fmtOps(g.SteadyMinOpsPerS),
			g.Generations, g.Intervals, fmtOps(g.LoadOpsPerS), fmtDur(time.Duration(g.P50NS)), fmtDur(time.Duration(g.P99NS)))
		if g.Baseline != "" {
			fmt.Fprintf(w, "  redis:  before %s/s; during: slowest %s/s (dip %.2fx), median %s/s; load %s sets/s; p50 %s p99 %s; slowest ratio %.2fx\n",
				fmtOps(g.BaselineBeforeOpsPerS), fmtOps(g.BaselineOpsPerS), g.BaselineDip, fmtOps(g.BaselineMedianOpsPerS), fmtOps(g.BaselineLoadOpsPerS),
				fmtDur(time.Duration(g.BaselineP50NS)), fmtDur(time.Duration(g.BaselineP99NS)), g.RatioOps)
		}
	}
	if m := mem; m != nil {
		mig := ""
		if m.Migrating {
			mig = ", migrating"
		}
		fmt.Fprintf(w, "\nmemory per record per replica after the load (index 2^%d buckets, generation %d%s):\n", m.LogBuckets, m.Generation, mig)
		fmt.Fprintf(w, "  index+heap %.1f B (index %.1f, heap %.1f) = %.2fx the raw %d B key+value (target <= 2x); process RSS growth %.1f B; shm files %.1f B\n",
			m.BytesPerRecord, m.IndexBytesPerRecord, m.HeapBytesPerRecord, m.RatioRaw, m.RawBytesPerRecord, m.RSSBytesPerRecord, m.ShmBytesPerRecord)
		if m.Baseline != "" {
			fmt.Fprintf(w, "  redis: used_memory growth %.1f B, RSS growth %.1f B per record\n", m.BaselineBytesPerRecord, m.BaselineRSSBytesPerRecord)
		}
	}
}

// printKVCost prints the get and put rows' cost per op.
func printKVCost(w io.Writer, out []kvRow) {
	var rows []*kvRow
	for i := range out {
		if out[i].ClientAllocsPerOp != nil {
			rows = append(rows, &out[i])
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\ncost per op (client = this process, replicas = their process; over every op of the measurement, warm-up included):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tconsistency\tthreads\tops\tclient allocs\tclient wake-ups\treplicas wake-ups\tclient cpu µs\treplicas cpu µs\tcpu µs\t")
	for _, r := range rows {
		cons := r.Consistency
		if cons == "" {
			cons = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.1f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t\n", r.Op, cons, r.Threads, r.CostOps,
			*r.ClientAllocsPerOp, *r.ClientWakeupsPerOp, *r.ServerWakeupsPerOp, *r.ClientCPUUSPerOp, *r.ServerCPUUSPerOp, *r.CPUUSPerOp)
	}
	tw.Flush()
}
