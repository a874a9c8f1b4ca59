package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

const multicastUsage = `usage: kvbench multicast [flags]

Measures TRAM atomic multicast (package multicast) across groups of
Acuerdo replicas. Every replica is a node of its own (mem, or shm nodes),
polled as kvserver polls its replicas (--placement runtime, every
figure's default): one poller group of min(GOMAXPROCS, groups) pollers,
a group's replicas on one poller (poller.Group.AddTo), so that their
messages to each other need no wake-up. Every client is a node of its
own with a goroutine of its own, a closed loop keeping --window messages outstanding
(its ClientSlots ring: bounded, and fair, since each leader scans its
clients' rings round robin). Latency is a message's time from the client's
write to its last reply landing in the client's memory; msgs/s counts
messages (not deliveries) completed in the measured part.

--fig selects the figures (comma-separated, or all):

  5       paper Fig. 5 analogue: trees base, breadth, depth of --groups
          groups (8) x --replicas (3) on mem; --clients closed-loop clients
          multicast to k random groups (a uniform k-subset per message),
          k in --dests; p50/p99 latency and msgs/s.
  6       Fig. 6 analogue: as 5, but the k destinations are adjacent in the
          tree: a random connected set of k groups (a random group, then
          k-1 times a random parent or child of the set so far; for k = 2
          a group and its parent or one of its children).
  7       Fig. 7 analogue: payload --size 64 B .. 16 KiB (ring slots sized
          to fit: SlotSize = max(1024, size+56)), base tree, k in --dests.
  8       Fig. 8 analogue: 3, 5 and 7 replicas per group on the 3-group
          tree 0:1,2.
  table1  paper section 8.7 Table 1 analogue: breadth tree, 8 groups x 3,
          --clients clients multicasting to all groups; after the normal
          part (--duration), every group's leader crashes at the same
          instant (its goroutine stops polling, then its replica and node
          close), --changes times: each time kvbench waits until every
          group has a new leader of a committed epoch (the change; a
          crashed replica is taken off its poller, poller.Handle.Remove,
          before its replica and node close), lets the load settle, restarts the crashed replicas (stable state
          kept, memory empty) and waits until they caught up. Per change:
          count, avg, stddev, min and max latency of the messages delayed
          by it (in flight during it: sent before the change completed,
          done after the crash), next to the normal p50. The replicas use
          --crash-election-timeout.
  client  the client path on shm: the replicas in one child process (kvbench
          re-executes itself), one client in this process, W=1, single-group
          messages (--groups 1 x --replicas 3); p50 beside the fabric's
          8-byte write one-way p50 measured in the same run (as 'kvbench
          broadcast': doorbell spin rdma.DefaultSpin then park, Notify writes);
          ratio = p50 / one-way p50 (issue target <= 12x).
  tax     single-group tax: W=1 single-group multicast (one client on a
          node of its own) against a plain Acuerdo group of the same size,
          fabric, ring and election timeout with a W=1 closed loop of
          proposals at its leader (as 'kvbench broadcast' commit rows), in
          the same run; ratio = multicast p50 / broadcast p50 (target
          <= 1.5x). The broadcast group's replicas are placed as the
          multicast ones: runtime, in this process on one poller (also on
          shm, where the multicast replicas share one child process);
          own, a poller group each (on shm a process each).
  scale   aggregate msgs/s of single-group messages (to a random group)
          with breadth trees of 1, 2, 4, 8 groups on mem, --clients clients
          per group; speedup = msgs/s / the same run's 1-group msgs/s of
          the same placement; scale measures runtime and shared by default.

--placement (comma-separated; each row's placement field names it):
  runtime  a node per replica, one poller group, a group's replicas on one
           poller (kvserver's server.Process); every figure's default
  own      a node per replica, a poller group of one poller per replica
           (the harness before 2026-11-27: on 2 cores every hop parks and
           wakes; kept to compare)
  shared   figures 5-8 and scale: replica i of every group on node i, one
           poller per node

Each figure's defaults (a flag given applies to every figure selected):

  fig     tree               groups   replicas  dests    size                    clients  W
  5       base,breadth,depth 8        3         1,2,4,8  64                      8        4
  6       base,breadth,depth 8        3         2,4      64                      8        4
  7       base               8        3         1,8      64,256,1024,4096,16384  8        4
  8       0:1,2              -        3,5,7     1,2,3    64                      8        4
  table1  breadth            8        3         8        64                      16       4
  client  base               1        3         1        64                      1        1
  tax     base               1        3         1        64                      1        1
  scale   breadth            1,2,4,8  3         1        64                      2/group  4  (placements runtime and shared)

--tree takes shape names (base, breadth, depth; comma-separated, each
built with every --groups count) or one tree in text form (parent:children
entries, e.g. 0:1,2;1:3,4;2:5,6;3:7). client and tax always run one
client with W=1 and single-group messages. Full figures:
--fig 5 --dests 1,2,3,4,5,6,7,8 (and --fig 6 --dests 2,3,4,5,6,7,8).

--soak D runs only the memory test: the base tree (8 x 3, 8 clients, W=4,
each message to a uniform random number of random groups, or k = --dests
if given) for D; this process's RSS (VmRSS: every replica and client is
in it) after a warm-up, and then every --soak-every with that period's
msgs/s and latency (progress rows; --json: one object each).

Each figure is the median over --runs runs (the cluster is started afresh
for every run); a ratio is the median of the per-run ratios to the same
run's baseline. Every outcome is checked (one reply per destination
group), and every replica's duplicate/gap/stale counters must stay zero.
other cpu is how many CPUs other processes used meanwhile. Progress on
stderr.

flags:
`

// mcFigs lists the figures in output order.
var mcFigs = []string{"5", "6", "7", "8", "table1", "client", "tax", "scale"}

// mcFigDefault is a figure's defaults (see multicastUsage).
type mcFigDefault struct {
	tree, groups, replicas, dests, sizes, fabric string
	clients, window                              int
	placements                                   string
}

var mcFigDefaults = map[string]mcFigDefault{
	"5":      {"base,breadth,depth", "8", "3", "1,2,4,8", "64", "mem", 8, 4, "runtime"},
	"6":      {"base,breadth,depth", "8", "3", "2,4", "64", "mem", 8, 4, "runtime"},
	"7":      {"base", "8", "3", "1,8", "64,256,1024,4096,16384", "mem", 8, 4, "runtime"},
	"8":      {"0:1,2", "3", "3,5,7", "1,2,3", "64", "mem", 8, 4, "runtime"},
	"table1": {"breadth", "8", "3", "8", "64", "mem", 16, 4, "runtime"},
	"client": {"base", "1", "3", "1", "64", "shm", 1, 1, "runtime"},
	"tax":    {"base", "1", "3", "1", "64", "mem", 1, 1, "runtime"},
	"scale":  {"breadth", "1,2,4,8", "3", "1", "64", "mem", 2, 4, "runtime,shared"},
	"soak":   {"base", "8", "3", "", "64", "mem", 8, 4, "runtime"},
}

// mcTree is one overlay to measure: its name in the rows and the tree.
type mcTree struct {
	name string
	t    *tree.Tree
}

// mcFig is one figure's resolved parameters.
type mcFig struct {
	name     string
	trees    []mcTree
	replicas []int
	dests    []int // empty: mixed (soak)
	sizes    []int
	fabric   string
	clients  int
	window   int
	// placements to measure: mcRuntime, mcOwn, mcShared
	placements []string
}

// mcFlags are the options of the multicast benchmark.
type mcFlags struct {
	commonFlags
	figs      []*mcFig
	et        time.Duration
	crashET   time.Duration
	changes   int
	soak      time.Duration
	soakEvery time.Duration
	soakFig   *mcFig
}

func parseMulticastFlags(args []string, stderr io.Writer) (*mcFlags, error) {
	o := &mcFlags{}
	fs := o.commonFlags.flagSet("multicast", multicastUsage, stderr,
		"how long each measurement runs (after a warm-up of a fifth of it, at most 200ms); table1: the normal part",
		"repeat a measurement while other processes use more than this many CPUs",
		"write a CPU profile of this process to `file`; KVBENCH_PEER_CPUPROFILE=path profiles the client path's replica process and the baseline's peer (path.<pid>)")
	figs := fs.String("fig", "5,client,tax", "comma-separated figures: 5, 6, 7, 8, table1, client, tax, scale, or all")
	trees := fs.String("tree", "", "overlay: shapes base, breadth, depth (comma-separated) or one tree in text form such as 0:1,2 (default: per figure)")
	groups := fs.String("groups", "", "comma-separated group counts of shape trees (default: per figure)")
	replicas := fs.String("replicas", "", "comma-separated replicas per group, odd (default: per figure)")
	dests := fs.String("dests", "", "comma-separated destination counts k (default: per figure)")
	sizes := fs.String("size", "", "comma-separated payload sizes in bytes (default: per figure)")
	fabric := fs.String("fabric", "", "mem or shm (default: per figure; mem and shm clusters other than the client path run every node in this process)")
	clients := fs.Int("clients", 0, "closed-loop clients (scale: per group; default: per figure)")
	placement := fs.String("placement", "", "comma-separated: runtime (a node per replica, one poller group, a group's replicas on one poller, as kvserver), own (a poller group per replica), shared (figures 5-8 and scale: replica i of every group on node i, one poller per node) (default: runtime; scale: runtime,shared)")
	window := fs.Int("window", 0, "messages each client keeps outstanding, its ClientSlots (default: per figure; client and tax: 1)")
	fs.DurationVar(&o.et, "election-timeout", 250*time.Millisecond, "the replicas' election timeout in every figure but table1 (long, so that a descheduled leader is not voted out mid-measurement)")
	fs.DurationVar(&o.crashET, "crash-election-timeout", broadcast.DefaultElectionTimeout, "table1: the replicas' election timeout")
	fs.IntVar(&o.changes, "changes", 3, "table1: leader changes per run")
	fs.DurationVar(&o.soak, "soak", 0, "run only the memory test, for this long (e.g. 10m)")
	fs.DurationVar(&o.soakEvery, "soak-every", time.Minute, "soak: sampling interval")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("multicast: unexpected argument %q", fs.Arg(0))
	}
	if err := o.commonFlags.check("multicast"); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case o.et < 0 || o.crashET < 0:
		return nil, errors.New("multicast: election timeouts must not be negative")
	case o.changes <= 0:
		return nil, errors.New("multicast: --changes must be positive")
	case o.soak < 0 || o.soakEvery <= 0:
		return nil, errors.New("multicast: --soak must not be negative and --soak-every must be positive")
	case set["clients"] && *clients <= 0, set["window"] && *window <= 0:
		return nil, errors.New("multicast: --clients and --window must be positive")
	}
	names := splitList(*figs)
	if slices.Contains(names, "all") {
		names = mcFigs
	}
	if len(names) == 0 {
		return nil, errors.New("multicast: --fig: no figure")
	}
	resolve := func(name string) (*mcFig, error) {
		d := mcFigDefaults[name]
		pick := func(flagName, val, def string) string {
			if set[flagName] {
				return val
			}
			return def
		}
		f := &mcFig{name: name, fabric: pick("fabric", *fabric, d.fabric), clients: d.clients, window: d.window}
		if set["clients"] {
			f.clients = *clients
		}
		if set["window"] {
			f.window = *window
		}
		if name == "client" || name == "tax" {
			f.clients, f.window = 1, 1
		}
		if f.fabric != "mem" && f.fabric != "shm" {
			return nil, fmt.Errorf("multicast: --fabric %q: want mem or shm", f.fabric)
		}
		gs, err := parseInts(pick("groups", *groups, d.groups), 1, tree.MaxGroups)
		if err != nil {
			return nil, fmt.Errorf("multicast: --groups: %w", err)
		}
		if f.trees, err = parseTrees(pick("tree", *trees, d.tree), gs); err != nil {
			return nil, fmt.Errorf("multicast: --tree: %w", err)
		}
		if f.replicas, err = parseInts(pick("replicas", *replicas, d.replicas), 1, 255); err != nil {
			return nil, fmt.Errorf("multicast: --replicas: %w", err)
		}
		for _, n := range f.replicas {
			if n%2 == 0 {
				return nil, fmt.Errorf("multicast: --replicas: %d is even (want 2f+1)", n)
			}
		}
		if name == "table1" && slices.Contains(f.replicas, 1) {
			return nil, errors.New("multicast: table1 crashes leaders: it needs at least 3 replicas per group")
		}
		if ds := pick("dests", *dests, d.dests); ds != "" {
			if f.dests, err = parseInts(ds, 1, tree.MaxGroups); err != nil {
				return nil, fmt.Errorf("multicast: --dests: %w", err)
			}
		}
		if name == "client" || name == "tax" || name == "scale" {
			f.dests = []int{1}
		}
		if f.sizes, err = parseInts(pick("size", *sizes, d.sizes), 8, 1<<20); err != nil {
			return nil, fmt.Errorf("multicast: --size: %w", err)
		}
		for _, pl := range splitList(pick("placement", *placement, d.placements)) {
			switch {
			case pl == mcShared && (name == "table1" || name == "client" || name == "tax" || name == "soak"):
				return nil, fmt.Errorf("multicast: --placement shared: %s runs each replica on a node of its own", name)
			case pl == mcRuntime || pl == mcOwn || pl == mcShared:
				if !slices.Contains(f.placements, pl) {
					f.placements = append(f.placements, pl)
				}
			default:
				return nil, fmt.Errorf("multicast: --placement %q: want runtime, own or shared", pl)
			}
		}
		if len(f.placements) == 0 {
			return nil, errors.New("multicast: --placement: empty")
		}
		return f, nil
	}
	for _, name := range names {
		if _, ok := mcFigDefaults[name]; !ok || name == "soak" {
			return nil, fmt.Errorf("multicast: unknown figure %q (want 5, 6, 7, 8, table1, client, tax, scale, all)", name)
		}
		f, err := resolve(name)
		if err != nil {
			return nil, err
		}
		o.figs = append(o.figs, f)
	}
	slices.SortStableFunc(o.figs, func(a, b *mcFig) int { return slices.Index(mcFigs, a.name) - slices.Index(mcFigs, b.name) })
	if o.soak > 0 {
		f, err := resolve("soak")
		if err != nil {
			return nil, err
		}
		o.soakFig = f
	}
	return o, nil
}

// parseInts parses a comma-separated list of integers in [lo, hi].
func parseInts(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("bad value %q (want an integer in [%d, %d])", f, lo, hi)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// parseTrees reads --tree: one tree in text form, or shape names each
// built with every group count (a shape may also name its count: base/4).
func parseTrees(s string, groups []int) ([]mcTree, error) {
	if strings.Contains(s, ":") {
		t, err := tree.Parse(s)
		if err != nil {
			return nil, err
		}
		return []mcTree{{name: strings.TrimSpace(s), t: t}}, nil
	}
	var out []mcTree
	for _, name := range splitList(s) {
		if strings.Contains(name, "/") {
			t, err := tree.Parse(name)
			if err != nil {
				return nil, err
			}
			out = append(out, mcTree{name: name, t: t})
			continue
		}
		for _, n := range groups {
			t, err := tree.Shape(name, n)
			if err != nil {
				return nil, err
			}
			out = append(out, mcTree{name: name, t: t})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no tree")
	}
	return out, nil
}

// mkey names one multicast result row.
type mkey struct {
	fig       string
	tree      string
	groups    int
	dests     int
	adjacent  bool
	replicas  int
	size      int
	fabric    string
	clients   int
	window    int
	change    int // table1
	placement string
}

// mstat is one measurement of a row.
type mstat struct {
	p50, p99      time.Duration
	opsPerS       float64
	n             uint64
	base          time.Duration // the same run's baseline p50 (0: none)
	baseOps       float64       // scale: the same run's 1-group msgs/s
	retried       uint64
	leaderChanges int
	// the replicas' counters over the measurement (in-process clusters)
	dropped, retransmits, blocked uint64
	// table1: the change's duration and its delayed messages' statistics.
	change          time.Duration
	count           int
	avg, sd, mn, mx time.Duration
	otherCPU        float64
	retries         int
	total           uint64 // completions of the whole load (warm-up and drain too)
	// parksPer: the replicas' pollers' parks per completed message over
	// the whole load (runtime placement in this process; 0: not
	// counted); baseParksPer the tax baseline's per commit
	parksPer, baseParksPer float64
	run                    int
	baseName               string
}

// mcRow is one output line.
type mcRow struct {
	Bench     string `json:"bench"` // "multicast"
	Fig       string `json:"fig"`   // "5", "6", "7", "8", "table1", "client", "tax", "scale", "soak"
	Tree      string `json:"tree"`
	Groups    int    `json:"groups"`
	Dests     int    `json:"dests"`     // destination groups per message (0: mixed)
	DestKind  string `json:"dest_kind"` // "random", "adjacent", "mixed"
	Replicas  int    `json:"replicas"`
	Size      int    `json:"size"`
	Fabric    string `json:"fabric"`
	Placement string `json:"placement"`
	Clients   int    `json:"clients"`
	Window    int    `json:"window"`
	P50NS     int64  `json:"p50_ns"`
	P99NS     int64  `json:"p99_ns"`
	// OpsPerS is messages completed per second; MBPerS their payload.
	OpsPerS float64 `json:"ops_per_s"`
	MBPerS  float64 `json:"mb_per_s"`
	// The baseline, where one applies: client: the fabric's one-way write;
	// tax: a plain broadcast group's W=1 commit; table1: the normal p50.
	Baseline      string  `json:"baseline,omitempty"`
	BaselineP50NS int64   `json:"baseline_p50_ns,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`  // p50 (table1: avg) / baseline p50, median of per-run ratios
	Target        float64 `json:"target,omitempty"` // the bound on ratio
	Speedup       float64 `json:"speedup,omitempty"`
	// table1: the change (1, 2, ...), how long it took (crash to every
	// group led again), and the delayed messages' latency statistics.
	Change   int   `json:"change,omitempty"`
	ChangeNS int64 `json:"change_ns,omitempty"`
	Count    int   `json:"count,omitempty"`
	AvgNS    int64 `json:"avg_ns,omitempty"`
	StddevNS int64 `json:"stddev_ns,omitempty"`
	MinNS    int64 `json:"min_ns,omitempty"`
	MaxNS    int64 `json:"max_ns,omitempty"`
	// Retried: messages the clients wrote again (RetryAfter passed without
	// every reply); LeaderChanges: groups whose leader changed during a
	// measurement (other than table1's crashes).
	Retried       uint64 `json:"retried"`
	LeaderChanges int    `json:"leader_changes"`
	// The replicas' counters over the measurement (sums over runs; in-process
	// replicas only): writes dropped (Conn down or staging full, repeated
	// later), retransmissions to a child, scans stopped by a full child ring.
	Dropped     uint64  `json:"dropped"`
	Retransmits uint64  `json:"retransmits"`
	Blocked     uint64  `json:"blocked"`
	Retries     int     `json:"retries"` // measurements repeated because of background load
	Runs        int     `json:"runs"`
	N           uint64  `json:"n"`
	OtherCPU    float64 `json:"other_cpu"`
	// ParksPerMsg: the replicas' pollers' parks (poller.PollerStats.Parks)
	// per message completed in the whole load, warm-up included (runtime
	// placement with the replicas in this process only); tax rows:
	// BaselineParksPerOp, the broadcast baseline's poller's parks per
	// commit (its ops/s times the load's wall time).
	ParksPerMsg        float64 `json:"parks_per_msg,omitempty"`
	BaselineParksPerOp float64 `json:"baseline_parks_per_op,omitempty"`
	// soak rows: this process's VmRSS in KiB after the warm-up and now,
	// and the elapsed load time.
	RSSStartKB int64 `json:"rss_start_kb,omitempty"`
	RSSKB      int64 `json:"rss_kb,omitempty"`
	ElapsedNS  int64 `json:"elapsed_ns,omitempty"`
}

// runMulticast is the multicast subcommand.
func runMulticast(args []string, stdout, stderr io.Writer) error {
	o, err := parseMulticastFlags(args, stderr)
	if err != nil {
		return err
	}
	sweepShmDir(o.shmDir, stderr)
	if o.cpuProf != "" {
		stop, err := startProfile(o.cpuProf)
		if err != nil {
			return fmt.Errorf("multicast: %w", err)
		}
		defer stop()
	}
	if o.soak > 0 {
		return runMcSoak(o, stdout, stderr)
	}
	tm := timing{dur: o.duration, warm: min(o.duration/5, 200*time.Millisecond)}
	res := map[mkey][]mstat{}
	var order []mkey
	add := func(k mkey, st mstat) {
		if _, ok := res[k]; !ok {
			order = append(order, k)
		}
		res[k] = append(res[k], st)
	}
	var failed []string
	fail := func(what string, err error) {
		failed = append(failed, what)
		fmt.Fprintf(stderr, "kvbench multicast: %s: %v\n", what, err)
	}
	fmt.Fprintf(stderr, "kvbench multicast: %d run(s); load average %s\n", o.runs, loadAvg())
	ctx := runCtx
	h := &hist.Hist{}
	for run := 1; run <= o.runs; run++ {
		for _, f := range o.figs {
			var err error
			switch f.name {
			case "table1":
				err = mcTable1Run(ctx, o, f, run, tm, add, stderr)
			case "client":
				err = mcClientRun(ctx, o, f, run, tm, h, add, stderr)
			case "tax":
				err = mcTaxRun(ctx, o, f, run, tm, add, stderr)
			default:
				err = mcFigRun(ctx, o, f, run, tm, add, stderr)
			}
			if err != nil {
				fail("fig "+f.name, err)
			}
		}
	}
	out := summarizeMulticast(order, res)
	return emitRows("multicast", stdout, stderr, out, o.json, func() { printMulticastTable(stdout, out, o) }, failed)
}

func (s *mstat) load() float64    { return s.otherCPU }
func (s *mstat) setRetries(n int) { s.retries = n }

// payload is a message of size bytes.
func payload(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// measureLoad runs ls with sp for tm (warm-up, then the measured part)
// and merges their results; pids are other processes of ours (the
// replicas' process), counted as ours in other cpu.
func measureLoad(ls []*mcLoader, sp *mcLoadSpec, tm timing, pids []int) (mstat, error) {
	a := cpuOf(pids)
	sp.from = time.Now().Add(tm.warm)
	sp.to = sp.from.Add(tm.dur)
	var stop atomic.Bool
	rs := runLoaders(ls, sp, &stop, true)
	b := cpuOf(pids)
	m := merge(sp, rs, tm.dur)
	if m.err != nil {
		return mstat{}, m.err
	}
	if m.n == 0 {
		return mstat{}, fmt.Errorf("no message completed in %v (%d in all)", tm.dur, m.total)
	}
	return mstat{p50: m.p50, p99: m.p99, opsPerS: m.opsPerS, n: m.n, total: m.total, retried: m.retried, otherCPU: otherCPUs(a, b, runtime.NumCPU())}, nil
}

// measure is measureLoad on c's clients, with the leader changes and the
// replicas' counters meanwhile.
func (c *mcCluster) measure(sp *mcLoadSpec, tm timing) (mstat, error) {
	e0, k0, p0 := c.leaderEpochs(), c.counters(), c.parks()
	st, err := measureLoad(c.loaders, sp, tm, nil)
	e1, k1, p1 := c.leaderEpochs(), c.counters(), c.parks()
	if p0 >= 0 && st.total > 0 {
		st.parksPer = float64(p1-p0) / float64(st.total)
	}
	st.leaderChanges = epochChanges(e0, e1)
	st.dropped, st.retransmits, st.blocked = k1.Dropped-k0.Dropped, k1.Retransmits-k0.Retransmits, k1.Blocked-k0.Blocked
	return st, err
}

// epochChanges counts groups whose leading epoch differs between a and b.
func epochChanges(a, b []broadcast.Epoch) int {
	n := 0
	for g := range a {
		if a[g] != b[g] {
			n++
		}
	}
	return n
}

// destKind names how a figure picks destinations.
func destKind(f *mcFig) string {
	switch {
	case len(f.dests) == 0:
		return "mixed"
	case f.name == "6":
		return "adjacent"
	}
	return "random"
}

// mcFigRun measures one run of figures 5, 6, 7, 8 and scale: a cluster
// per tree, replica count and size, every k in it.
func mcFigRun(ctx context.Context, o *mcFlags, f *mcFig, run int, tm timing, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, pl := range f.placements {
		for _, tr := range f.trees {
			for _, nrep := range f.replicas {
				for _, size := range f.sizes {
					clients := f.clients
					if f.name == "scale" {
						clients *= tr.t.Len()
					}
					spec := mcSpec{fabric: f.fabric, tree: tr.t, replicas: nrep, clients: clients, window: f.window,
						slotSize: mcSlotSize(size), et: o.et, shmDir: o.shmDir, placement: pl}
					c, err := openMcCluster(ctx, spec)
					if err != nil {
						errs = append(errs, fmt.Errorf("%s %dx%d: %w", tr.name, tr.t.Len(), nrep, err))
						continue
					}
					p := payload(size)
					for _, k := range f.dests {
						if k > tr.t.Len() {
							continue
						}
						if f.name == "6" && k < 2 {
							continue
						}
						sp := &mcLoadSpec{dests: k, adjacent: f.name == "6", window: f.window, payload: p}
						st, err := retryDisturbed("multicast", o.commonFlags, stderr, func() (mstat, error) { return c.measure(sp, tm) })
						if err != nil {
							errs = append(errs, fmt.Errorf("%s %dx%d k=%d %dB: %w", tr.name, tr.t.Len(), nrep, k, size, err))
							continue
						}
						st.run = run
						add(mkey{fig: f.name, tree: tr.name, groups: tr.t.Len(), dests: k, adjacent: sp.adjacent, replicas: nrep, size: size,
							fabric: f.fabric, clients: clients, window: f.window, placement: pl}, st)
						note := ""
						if st.leaderChanges > 0 {
							note = fmt.Sprintf("  (%d leader change(s))", st.leaderChanges)
						}
						fmt.Fprintf(stderr, "[run %d/%d] fig %-5s %-7s %dx%d k=%d %s %5dB %d clients W=%d  p50 %-8s p99 %-8s %8s msgs/s  other %.2f CPUs%s\n",
							run, o.runs, f.name, tr.name, tr.t.Len(), nrep, k, destKind(f), size, clients, f.window,
							fmtDur(st.p50), fmtDur(st.p99), fmtOps(st.opsPerS), st.otherCPU, note)
					}
					if err := c.check(); err != nil {
						errs = append(errs, err)
					}
					if err := c.close(); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// mcClientRun measures one run of the client path: the one-way baseline,
// then W=1 single-group messages from a client in this process to replicas
// in a child process (shm) or in this one (mem).
func mcClientRun(ctx context.Context, o *mcFlags, f *mcFig, run int, tm timing, h *hist.Hist, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, pl := range f.placements {
		errs = append(errs, mcClientRunOn(ctx, o, f, pl, run, tm, h, add, stderr))
	}
	return errors.Join(errs...)
}

// mcClientRunOn is mcClientRun with the replicas placed as pl says.
func mcClientRunOn(ctx context.Context, o *mcFlags, f *mcFig, pl string, run int, tm timing, h *hist.Hist, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, tr := range f.trees {
		for _, nrep := range f.replicas {
			for _, size := range f.sizes {
				base, err := retryDisturbed("multicast", o.commonFlags, stderr, func() (mstat, error) {
					b, err := onewayBaseline(f.fabric, o.shmDir, 0, false, tm, h)
					return mstat{p50: b.p50, p99: b.p99, otherCPU: b.otherCPU}, err
				})
				if err != nil {
					errs = append(errs, fmt.Errorf("%s one-way: %w", f.fabric, err))
					continue
				}
				fmt.Fprintf(stderr, "[run %d/%d] client %-4s one-way write  p50 %-8s p99 %-8s other %.2f CPUs\n",
					run, o.runs, f.fabric, fmtDur(base.p50), fmtDur(base.p99), base.otherCPU)
				st, err := mcW1(ctx, o, f, pl, tr.t, nrep, size, tm, stderr)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s %s %dx%d %dB: %w", pl, tr.name, tr.t.Len(), nrep, size, err))
					continue
				}
				st.run, st.base, st.baseName = run, base.p50, "one-way write"
				add(mkey{fig: f.name, tree: tr.name, groups: tr.t.Len(), dests: 1, replicas: nrep, size: size, fabric: f.fabric, clients: 1, window: 1, placement: pl}, st)
				fmt.Fprintf(stderr, "[run %d/%d] client %-4s %-7s %dx%d %5dB W=1  p50 %-8s p99 %-8s = %.1fx one-way  other %.2f CPUs\n",
					run, o.runs, f.fabric, pl, tr.t.Len(), nrep, size, fmtDur(st.p50), fmtDur(st.p99), float64(st.p50)/float64(base.p50), st.otherCPU)
			}
		}
	}
	return errors.Join(errs...)
}

// mcW1 measures W=1 single-group multicast from one client: replicas in a
// child process on shm, in this process on mem.
func mcW1(ctx context.Context, o *mcFlags, f *mcFig, pl string, t *tree.Tree, nrep, size int, tm timing, stderr io.Writer) (mstat, error) {
	spec := mcSpec{fabric: f.fabric, tree: t, replicas: nrep, clients: 1, window: 1, slotSize: mcSlotSize(size), et: o.et, shmDir: o.shmDir, placement: pl}
	sp := &mcLoadSpec{dests: 1, window: 1, payload: payload(size)}
	if f.fabric == "shm" {
		m, err := openMcRemote(ctx, spec)
		if err != nil {
			return mstat{}, err
		}
		st, err := retryDisturbed("multicast", o.commonFlags, stderr, func() (mstat, error) { return measureLoad(m.loaders, sp, tm, []int{m.proc.pid()}) })
		if err == nil {
			err = m.proc.check()
		}
		return st, errors.Join(err, m.close())
	}
	c, err := openMcCluster(ctx, spec)
	if err != nil {
		return mstat{}, err
	}
	st, err := retryDisturbed("multicast", o.commonFlags, stderr, func() (mstat, error) { return c.measure(sp, tm) })
	if err == nil {
		err = c.check()
	}
	return st, errors.Join(err, c.close())
}

// mcTaxRun measures one run of the single-group tax: W=1 multicast and a
// plain broadcast group's W=1 commit latency, alternating which goes
// first from run to run.
func mcTaxRun(ctx context.Context, o *mcFlags, f *mcFig, run int, tm timing, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, pl := range f.placements {
		errs = append(errs, mcTaxRunOn(ctx, o, f, pl, run, tm, add, stderr))
	}
	return errors.Join(errs...)
}

// mcTaxRunOn is mcTaxRun with both groups' replicas placed as pl says.
func mcTaxRunOn(ctx context.Context, o *mcFlags, f *mcFig, pl string, run int, tm timing, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, tr := range f.trees {
		for _, nrep := range f.replicas {
			for _, size := range f.sizes {
				var mc, bc mstat
				var merr, berr error
				bcast := func() {
					bc, berr = retryDisturbed("multicast", o.commonFlags, stderr, func() (mstat, error) { return mcBroadcastW1(ctx, o, f.fabric, pl, nrep, size, tm) })
				}
				mcast := func() { mc, merr = mcW1(ctx, o, f, pl, tr.t, nrep, size, tm, stderr) }
				if run%2 == 1 {
					bcast()
					mcast()
				} else {
					mcast()
					bcast()
				}
				if err := errors.Join(merr, berr); err != nil {
					errs = append(errs, fmt.Errorf("%s %s %dx%d %dB: %w", pl, tr.name, tr.t.Len(), nrep, size, err))
					continue
				}
				mc.run, mc.base, mc.baseName, mc.baseParksPer = run, bc.p50, "broadcast W=1", bc.baseParksPer
				add(mkey{fig: f.name, tree: tr.name, groups: tr.t.Len(), dests: 1, replicas: nrep, size: size, fabric: f.fabric, clients: 1, window: 1, placement: pl}, mc)
				fmt.Fprintf(stderr, "[run %d/%d] tax %-4s %-7s %dx%d %5dB W=1  multicast p50 %-8s p99 %-8s  broadcast p50 %-8s p99 %-8s = %.2fx  other %.2f CPUs\n",
					run, o.runs, f.fabric, pl, tr.t.Len(), nrep, size, fmtDur(mc.p50), fmtDur(mc.p99), fmtDur(bc.p50), fmtDur(bc.p99),
					float64(mc.p50)/float64(bc.p50), mc.otherCPU)
			}
		}
	}
	return errors.Join(errs...)
}

// mcBroadcastW1 is the tax's baseline: a fresh Acuerdo group of nrep
// replicas (the multicast replicas' broadcast configuration: default
// ring, the same election timeout) with a W=1 closed loop at its leader,
// placed as pl places the multicast replicas: runtime, in this process on
// one poller (openGroupRuntime); own, a poller group each (on shm a
// process each).
func mcBroadcastW1(ctx context.Context, o *mcFlags, fabric, pl string, nrep, size int, tm timing) (mstat, error) {
	open := openGroup
	if pl == mcRuntime {
		open = openGroupRuntime
	}
	g, err := open(ctx, groupSpec{fabric, nrep}, groupproc.Tuning{ElectionTimeout: o.et}, 0, o.shmDir)
	if err != nil {
		return mstat{}, err
	}
	defer g.close()
	ldr, err := g.leader(ctx, -1)
	if err != nil {
		return mstat{}, err
	}
	pids := g.pids()
	a := cpuOf(pids)
	p0, t0 := g.parks(), time.Now()
	r, err := g.load(ctx, ldr, groupproc.LoadSpec{Window: 1, Size: size, Warmup: tm.warm, Duration: tm.dur})
	p1, wall := g.parks(), time.Since(t0)
	b := cpuOf(pids)
	if err != nil {
		return mstat{}, err
	}
	if r.N == 0 {
		return mstat{}, fmt.Errorf("broadcast: nothing committed (%d failed: %s)", r.Failed, r.FirstErr)
	}
	st := mstat{p50: r.P50, p99: r.P99, opsPerS: r.OpsPerS, n: r.N, otherCPU: otherCPUs(a, b, runtime.NumCPU())}
	if ops := r.OpsPerS * wall.Seconds(); p0 >= 0 && ops > 0 {
		st.baseParksPer = float64(p1-p0) / ops
	}
	return st, nil
}

// mcTable1Run measures one run of table1: a normal part, then o.changes
// simultaneous crashes of every group's leader under load.
func mcTable1Run(ctx context.Context, o *mcFlags, f *mcFig, run int, tm timing, add func(mkey, mstat), stderr io.Writer) error {
	var errs []error
	for _, pl := range f.placements {
		errs = append(errs, mcTable1RunOn(ctx, o, f, pl, run, tm, add, stderr))
	}
	return errors.Join(errs...)
}

// mcTable1RunOn is mcTable1Run with the replicas placed as pl says.
func mcTable1RunOn(ctx context.Context, o *mcFlags, f *mcFig, pl string, run int, tm timing, add func(mkey, mstat), stderr io.Writer) error {
	tr, nrep, size := f.trees[0], f.replicas[0], f.sizes[0]
	k := min(f.dests[0], tr.t.Len())
	spec := mcSpec{fabric: f.fabric, tree: tr.t, replicas: nrep, clients: f.clients, window: f.window,
		slotSize: mcSlotSize(size), et: o.crashET, shmDir: o.shmDir, placement: pl}
	c, err := openMcCluster(ctx, spec)
	if err != nil {
		return err
	}
	defer c.close()
	sp := &mcLoadSpec{dests: k, window: f.window, payload: payload(size), record: true}
	sp.from = time.Now().Add(tm.warm)
	sp.to = sp.from.Add(tm.dur)
	var stop atomic.Bool
	done := make(chan []mcLoadResult, 1)
	go func() { done <- runLoaders(c.loaders, sp, &stop, false) }()
	abort := func(err error) error {
		stop.Store(true)
		<-done
		return err
	}
	time.Sleep(time.Until(sp.to))
	settle := max(300*time.Millisecond, tm.dur/2)
	type change struct{ crash, end time.Time }
	var changes []change
	var down []*mcReplica
	for i := range o.changes {
		if i > 0 {
			if err := restart(ctx, c, down); err != nil {
				return abort(fmt.Errorf("change %d: restart: %w", i, err))
			}
			time.Sleep(settle)
		}
		if _, err := c.leaders(ctx, nil); err != nil {
			return abort(fmt.Errorf("change %d: %w", i+1, err))
		}
		eps := c.leaderEpochs()
		down = down[:0]
		for _, rs := range c.reps {
			for _, x := range rs {
				if !x.alive() {
					continue
				}
				if e, ok := x.r.Broadcast().Leading(); ok && e == eps[x.g] {
					down = append(down, x)
				}
			}
		}
		crash := time.Now()
		for _, x := range down {
			x.cancel()
		}
		for _, x := range down {
			<-x.done
		}
		var herr error
		for _, x := range down {
			herr = errors.Join(herr, x.halt())
		}
		if herr != nil {
			return abort(fmt.Errorf("change %d: crash: %w", i+1, herr))
		}
		if _, err := c.leaders(ctx, eps); err != nil {
			return abort(fmt.Errorf("change %d: no new leaders: %w", i+1, err))
		}
		end := time.Now()
		changes = append(changes, change{crash, end})
		fmt.Fprintf(stderr, "[run %d/%d] table1 change %d: crashed %d leaders; every group led again after %s\n",
			run, o.runs, i+1, len(down), fmtDur(end.Sub(crash)))
		time.Sleep(settle)
	}
	stop.Store(true)
	rs := <-done
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
		}
		if r.bad > 0 {
			errs = append(errs, fmt.Errorf("%d outcome(s) without one reply per destination, e.g. %s", r.bad, r.badWhat))
		}
	}
	if err := c.check(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	m := merge(sp, rs, tm.dur)
	key := mkey{fig: f.name, tree: tr.name, groups: tr.t.Len(), dests: k, replicas: nrep, size: size, fabric: f.fabric, clients: f.clients, window: f.window, placement: pl}
	for i, ch := range changes {
		var lat []time.Duration
		for _, r := range rs {
			for _, s := range r.samples {
				if s.sent < ch.end.UnixNano() && s.done > ch.crash.UnixNano() {
					lat = append(lat, time.Duration(s.done-s.sent))
				}
			}
		}
		st := mstat{opsPerS: m.opsPerS, n: m.n, retried: m.retried, base: m.p50, baseName: "normal p50", change: ch.end.Sub(ch.crash), count: len(lat), run: run, otherCPU: -1}
		st.avg, st.sd, st.mn, st.mx = moments(lat)
		st.p50, st.p99 = quantiles(lat)
		kk := key
		kk.change = i + 1
		add(kk, st)
		fmt.Fprintf(stderr, "[run %d/%d] table1 change %d: %d delayed messages: avg %s stddev %s min %s max %s (normal p50 %s)\n",
			run, o.runs, i+1, st.count, fmtDur(st.avg), fmtDur(st.sd), fmtDur(st.mn), fmtDur(st.mx), fmtDur(m.p50))
	}
	normal := mstat{p50: m.p50, p99: m.p99, opsPerS: m.opsPerS, n: m.n, retried: m.retried, run: run, otherCPU: -1}
	add(key, normal)
	return nil
}

// restart starts the crashed replicas again (stable state kept, memory
// empty) and waits until each follows (or leads) its group and delivered
// what the leader had when it restarted.
func restart(ctx context.Context, c *mcCluster, down []*mcReplica) error {
	ldrs, err := c.leaders(ctx, nil)
	if err != nil {
		return err
	}
	target := make([]uint64, len(c.reps))
	for g, i := range ldrs {
		target[g] = c.reps[g][i].r.Broadcast().Status().Index
	}
	for _, x := range down {
		if err := c.start(x); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(stallTimeout)
	for _, x := range down {
		for {
			s := x.r.Broadcast().Status()
			if (s.Role == broadcast.Follower || s.Role == broadcast.Leader) && s.Index >= target[x.g] && !s.CatchingUp {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("group %d replica %d restarted but did not catch up in %v (role %v, index %d of %d)", x.g, x.i, stallTimeout, s.Role, s.Index, target[x.g])
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// moments returns the mean, standard deviation, min and max of lat.
func moments(lat []time.Duration) (avg, sd, mn, mx time.Duration) {
	if len(lat) == 0 {
		return
	}
	var sum float64
	mn, mx = lat[0], lat[0]
	for _, d := range lat {
		sum += float64(d)
		mn, mx = min(mn, d), max(mx, d)
	}
	mean := sum / float64(len(lat))
	var ss float64
	for _, d := range lat {
		ss += (float64(d) - mean) * (float64(d) - mean)
	}
	return time.Duration(mean), time.Duration(math.Sqrt(ss / float64(len(lat)))), mn, mx
}

// summarizeMulticast turns per-run stats into rows: medians over runs,
// ratios the median of per-run ratios.
func summarizeMulticast(order []mkey, res map[mkey][]mstat) []mcRow {
	med := func(sts []mstat, f func(mstat) float64) float64 {
		v := make([]stat, len(sts))
		for i, s := range sts {
			v[i] = stat{opsPerS: f(s)}
		}
		return median(v, func(s stat) float64 { return s.opsPerS })
	}
	// scale: each run's 1-group msgs/s
	one := map[mkey][]mstat{}
	for _, k := range order {
		if k.fig == "scale" && k.groups == 1 {
			kk := k
			kk.groups, kk.clients, kk.tree = 0, 0, ""
			one[kk] = res[k]
		}
	}
	var out []mcRow
	for _, k := range order {
		sts := res[k]
		kind := "random"
		if k.adjacent {
			kind = "adjacent"
		}
		r := mcRow{Bench: "multicast", Fig: k.fig, Tree: k.tree, Groups: k.groups, Dests: k.dests, DestKind: kind, Replicas: k.replicas,
			Size: k.size, Fabric: k.fabric, Placement: mcPlacement(k.fig, k.fabric, k.placement), Clients: k.clients, Window: k.window, Runs: len(sts), Change: k.change}
		r.P50NS = int64(med(sts, func(s mstat) float64 { return float64(s.p50) }))
		r.P99NS = int64(med(sts, func(s mstat) float64 { return float64(s.p99) }))
		r.OpsPerS = med(sts, func(s mstat) float64 { return s.opsPerS })
		r.MBPerS = r.OpsPerS * float64(k.size) / 1e6
		r.N = uint64(med(sts, func(s mstat) float64 { return float64(s.n) }))
		r.OtherCPU = med(sts, func(s mstat) float64 { return s.otherCPU })
		r.ParksPerMsg = med(sts, func(s mstat) float64 { return s.parksPer })
		r.BaselineParksPerOp = med(sts, func(s mstat) float64 { return s.baseParksPer })
		for _, s := range sts {
			r.Retried += s.retried
			r.LeaderChanges += s.leaderChanges
			r.Dropped += s.dropped
			r.Retransmits += s.retransmits
			r.Blocked += s.blocked
			r.Retries += s.retries
		}
		if sts[0].base > 0 {
			r.Baseline = sts[0].baseName
			r.BaselineP50NS = int64(med(sts, func(s mstat) float64 { return float64(s.base) }))
			r.Ratio = med(sts, func(s mstat) float64 {
				if k.change > 0 {
					return float64(s.avg) / float64(s.base)
				}
				return float64(s.p50) / float64(s.base)
			})
			switch k.fig {
			case "client":
				r.Target = 12
			case "tax":
				r.Target = 1.5
			}
		}
		if k.change > 0 {
			r.ChangeNS = int64(med(sts, func(s mstat) float64 { return float64(s.change) }))
			r.Count = int(med(sts, func(s mstat) float64 { return float64(s.count) }))
			r.AvgNS = int64(med(sts, func(s mstat) float64 { return float64(s.avg) }))
			r.StddevNS = int64(med(sts, func(s mstat) float64 { return float64(s.sd) }))
			r.MinNS = int64(med(sts, func(s mstat) float64 { return float64(s.mn) }))
			r.MaxNS = int64(med(sts, func(s mstat) float64 { return float64(s.mx) }))
		}
		if k.fig == "scale" {
			kk := k
			kk.groups, kk.clients, kk.tree = 0, 0, ""
			if base := one[kk]; len(base) > 0 {
				var sp []mstat
				for _, s := range sts {
					if i := slices.IndexFunc(base, func(b mstat) bool { return b.run == s.run }); i >= 0 && base[i].opsPerS > 0 {
						sp = append(sp, mstat{opsPerS: s.opsPerS / base[i].opsPerS})
					}
				}
				r.Speedup = med(sp, func(s mstat) float64 { return s.opsPerS })
			}
		}
		out = append(out, r)
	}
	return out
}

// The placements of the replicas (--placement; mcSpec.placement).
const (
	// mcRuntime: a node per replica, one poller group of min(GOMAXPROCS,
	// groups) pollers, a group's replicas on one poller, as kvserver's
	// server.Process.
	mcRuntime = "runtime"
	// mcOwn: a node per replica, each polled by a poller group of its own.
	mcOwn = "own"
	// mcShared: replica i of every group on node i, one poller per node.
	mcShared = "shared"
)

// mcPlacement says where a row's replicas and clients ran (pl: mcRuntime,
// mcOwn or mcShared).
func mcPlacement(fig, fabric, pl string) string {
	var s string
	switch pl {
	case mcShared:
		s = "shared: replica i of every group on node i, one poller per node"
	case mcOwn:
		s = "own: a node per replica, a poller group per replica"
	default:
		s = "runtime: a node per replica, one poller group, a group's replicas on one poller (as kvserver)"
	}
	switch {
	case fabric == "shm" && (fig == "client" || fig == "tax"):
		s += "; the replicas in one child process, the client in this one"
	case fabric == "shm":
		s += "; shm nodes, replicas and clients in this process"
	default:
		s += "; clients on goroutines of their own"
	}
	if fig == "tax" {
		switch {
		case pl == mcRuntime:
			s += "; the broadcast baseline's replicas in this process on one poller, proposing at the leader"
		case fabric == "shm":
			s += "; the broadcast baseline's replicas a process each, proposing at the leader"
		default:
			s += "; the broadcast baseline's replicas a poller group each, proposing at the leader"
		}
	}
	return s
}

func printMulticastTable(w io.Writer, out []mcRow, o *mcFlags) {
	fmt.Fprintf(w, "kvbench multicast  %s  %s, %d CPUs, %s  medians of %d run(s) x %v\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.runs, o.duration)
	fmt.Fprintf(w, "every replica and client a node of its own; replicas placed as each row's placement says (runtime: as kvserver), clients on goroutines of their own; latency: client's write to its last reply in its memory\n")
	fmt.Fprintf(w, "election timeout %v (table1: %v); doorbells spin %v, then park\n\n", o.et, o.crashET, rdma.DefaultSpin)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	section := ""
	for _, r := range out {
		sec := r.Fig
		if sec == "5" || sec == "6" || sec == "7" || sec == "8" {
			sec = "fig"
		}
		if sec != section {
			if section != "" {
				tw.Flush()
				fmt.Fprintln(w)
			}
			section = sec
			switch sec {
			case "fig":
				fmt.Fprintln(w, "latency and throughput (TRAM Fig. 5-8 analogues): closed-loop clients, W outstanding each")
				fmt.Fprintln(tw, "fig\tplacement\ttree\tgroups\treplicas\tdests\tsize\tfabric\tclients\tW\tp50\tp99\tmsgs/s\tMB/s\tretried\tdropped\tretrans\tldr chg\tother cpu\t")
			case "table1":
				fmt.Fprintln(w, "leader changes under load (TRAM Table 1 analogue): every group's leader crashed at once; latency of the messages in flight during the change")
				fmt.Fprintln(tw, "change\tplacement\tgroups\treplicas\tdests\tclients\tW\tchange took\tdelayed\tavg\tstddev\tmin\tmax\tnormal p50\tavg/normal\t")
			case "client":
				fmt.Fprintln(w, "client path (W=1, single-group messages): client write to reply in its memory, against the fabric's one-way write")
				fmt.Fprintln(tw, "fabric\tplacement\tgroups\treplicas\tsize\tp50\tp99\tone-way p50\tratio\ttarget\t")
			case "tax":
				fmt.Fprintln(w, "single-group tax: W=1 single-group multicast against a plain Acuerdo group's W=1 commit, same size and run")
				fmt.Fprintln(tw, "fabric\tplacement\treplicas\tsize\tmulticast p50\tp99\tbroadcast p50\tratio\ttarget\tparks/msg\tbroadcast parks/op\t")
			case "scale":
				fmt.Fprintln(w, "throughput scaling: single-group messages to random groups, breadth trees, clients per group as given")
				fmt.Fprintln(tw, "placement\tgroups\treplicas\tclients\tW\tsize\tmsgs/s\tspeedup\tp50\tp99\tother cpu\t")
			}
		}
		d := func(ns int64) string { return fmtDur(time.Duration(ns)) }
		pl, _, _ := strings.Cut(r.Placement, ":") // the JSON field says the rest
		switch sec {
		case "fig":
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d %s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%.1f\t%d\t%d\t%d\t%d\t%.2f\t\n", r.Fig, pl, r.Tree, r.Groups, r.Replicas, r.Dests, r.DestKind,
				r.Size, r.Fabric, r.Clients, r.Window, d(r.P50NS), d(r.P99NS), fmtOps(r.OpsPerS), r.MBPerS, r.Retried, r.Dropped, r.Retransmits, r.LeaderChanges, r.OtherCPU)
		case "table1":
			if r.Change == 0 {
				fmt.Fprintf(tw, "normal\t%s\t%d\t%d\t%d\t%d\t%d\t\t%s msgs/s\tp50 %s\tp99 %s\t\t\t\t%s\t\t\n", pl, r.Groups, r.Replicas, r.Dests, r.Clients, r.Window,
					fmtOps(r.OpsPerS), d(r.P50NS), d(r.P99NS), d(r.P50NS))
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.1fx\t\n", r.Change, pl, r.Groups, r.Replicas, r.Dests, r.Clients, r.Window,
				d(r.ChangeNS), r.Count, d(r.AvgNS), d(r.StddevNS), d(r.MinNS), d(r.MaxNS), d(r.BaselineP50NS), r.Ratio)
		case "client":
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%.1fx\t<= %.0fx\t\n", r.Fabric, pl, r.Groups, r.Replicas, r.Size,
				d(r.P50NS), d(r.P99NS), d(r.BaselineP50NS), r.Ratio, r.Target)
		case "tax":
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%.2fx\t<= %.1fx\t%.3f\t%.3f\t\n", r.Fabric, pl, r.Replicas, r.Size, d(r.P50NS), d(r.P99NS), d(r.BaselineP50NS), r.Ratio, r.Target,
				r.ParksPerMsg, r.BaselineParksPerOp)
		case "scale":
			sp := "-"
			if r.Speedup > 0 {
				sp = fmt.Sprintf("%.2fx", r.Speedup)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.2f\t\n", pl, r.Groups, r.Replicas, r.Clients, r.Window, r.Size, fmtOps(r.OpsPerS), sp,
				d(r.P50NS), d(r.P99NS), r.OtherCPU)
		}
	}
	tw.Flush()
}

// runMcSoak runs a multicast load for o.soak and samples this process's
// RSS after a warm-up and then every o.soakEvery.
func runMcSoak(o *mcFlags, stdout, stderr io.Writer) error {
	f := o.soakFig
	tr, nrep, size := f.trees[0], f.replicas[0], f.sizes[0]
	spec := mcSpec{fabric: f.fabric, tree: tr.t, replicas: nrep, clients: f.clients, window: f.window, slotSize: mcSlotSize(size), et: o.et, shmDir: o.shmDir,
		placement: f.placements[0]}
	c, err := openMcCluster(runCtx, spec)
	if err != nil {
		return fmt.Errorf("multicast: soak: %w", err)
	}
	defer c.close()
	sp := &mcLoadSpec{window: f.window, payload: payload(size), mixed: len(f.dests) == 0}
	if !sp.mixed {
		sp.dests = f.dests[0]
	}
	warm := min(10*time.Second, max(o.soak/10, time.Second))
	fmt.Fprintf(stderr, "kvbench multicast --soak %v: %s tree %dx%d on %s, %d clients W=%d, %d B, dests %s; warm-up %v; load average %s\n",
		o.soak, tr.name, tr.t.Len(), nrep, f.fabric, f.clients, f.window, size, destKind(f), warm, loadAvg())
	if _, err := measureLoad(c.loaders, sp, timing{dur: warm}, nil); err != nil {
		return fmt.Errorf("multicast: soak warm-up: %w", err)
	}
	start, err := rssKB(os.Getpid())
	if err != nil {
		return err
	}
	base := mcRow{Bench: "multicast", Fig: "soak", Tree: tr.name, Groups: tr.t.Len(), Dests: sp.dests, DestKind: destKind(f), Replicas: nrep, Size: size,
		Fabric: f.fabric, Placement: mcPlacement("soak", f.fabric, spec.placement), Clients: f.clients, Window: f.window, Runs: 1, RSSStartKB: start, RSSKB: start}
	emit := func(r mcRow) error {
		if o.json {
			return json.NewEncoder(stdout).Encode(r)
		}
		fmt.Fprintf(stdout, "%8s  %8s msgs/s  p50 %-8s p99 %-8s  retried %d  dropped %d  retransmits %d  leader changes %d  RSS %d KiB (start %d KiB)\n",
			time.Duration(r.ElapsedNS).Round(time.Second), fmtOps(r.OpsPerS), fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)),
			r.Retried, r.Dropped, r.Retransmits, r.LeaderChanges, r.RSSKB, r.RSSStartKB)
		return nil
	}
	if !o.json {
		fmt.Fprintf(stdout, "kvbench multicast --soak %v  %s  %s, %d CPUs, %s\n%s tree %dx%d on %s (replicas and clients in this process), %d clients W=%d, %d B, dests %s\n",
			o.soak, time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(),
			tr.name, tr.t.Len(), nrep, f.fabric, f.clients, f.window, size, destKind(f))
	}
	if err := emit(base); err != nil {
		return err
	}
	var elapsed time.Duration
	for elapsed < o.soak {
		d := min(o.soakEvery, o.soak-elapsed)
		st, err := c.measure(sp, timing{dur: d})
		if err != nil {
			return fmt.Errorf("multicast: soak: %w", err)
		}
		elapsed += d
		now, err := rssKB(os.Getpid())
		if err != nil {
			return err
		}
		row := base
		row.RSSKB, row.ElapsedNS = now, int64(elapsed)
		row.P50NS, row.P99NS, row.OpsPerS, row.N, row.Retried = int64(st.p50), int64(st.p99), st.opsPerS, st.n, st.retried
		row.MBPerS = st.opsPerS * float64(size) / 1e6
		row.LeaderChanges, row.Dropped, row.Retransmits, row.Blocked = st.leaderChanges, st.dropped, st.retransmits, st.blocked
		row.OtherCPU = st.otherCPU
		if err := emit(row); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "kvbench multicast --soak: %v of %v: %s msgs/s, RSS %d KiB (start %d KiB)\n",
			elapsed.Round(time.Second), o.soak, fmtOps(st.opsPerS), now, start)
	}
	if err := c.check(); err != nil {
		return fmt.Errorf("multicast: soak: %w", err)
	}
	return nil
}
