package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/rdma"
)

const broadcastUsage = `usage: kvbench broadcast [flags]

Measures Acuerdo atomic broadcast (package broadcast) in groups of replicas,
each replica its own OS process on shm and tcp (kvbench re-executes itself),
or goroutines of this process on mem:

  commit    paper Fig. 8 analogue: a client at the leader keeps W proposals
            outstanding, W = 1, 2, 4, ... until throughput stops growing
            (from W=64, two windows in a row less than 10% over the best
            smaller window; run 1 decides) or --max-window;
            commit latency (Propose to delivered at the leader) p50/p99,
            msgs/s and MB/s, for every --groups group and --sizes size.
  election  paper Table 1 analogue: kill -9 the leader (mem: crash it) of a
            fresh group, --elections times per group; election = from the
            new leader's detection of the failure (it became ELECTING) to
            its epoch's first commit, both times read in the new leader's
            process (broadcast.Config.OnEvent); failover = from the kill to
            that commit (includes the election timeout).
  oneway    the baseline, measured in the same run: the fabric's 8-byte
            write-oneway ping-pong in the mode the replicas run in (doorbell
            spin --spin, default rdma.DefaultSpin = 100us, then park; writes
            with Notify), as 'kvbench fabric --modes park --park-spin 100us'.
            Commit and
            election rows show ratio = p50 / one-way p50.

--soak D runs only the memory test: a 3-replica group (--soak-group) under
sustained load for D; it prints every replica's RSS (VmRSS) at the start
(after a warm-up) and every --soak-every.

--kill-follower runs only the follower-outage test: the --soak-group group
under the same load at the leader (--soak-window, --soak-size, after
--soak-warmup); one follower is killed (kill -9) and left down for --down
(default 10m) while the leader's process RSS (VmRSS), its Status (delivered
index, LogLen) and its commits/s are sampled at the kill, every
--outage-every (progress on stderr) and at the end; then the follower is
restarted with the same stable file (a restarted member, higher
incarnation), and the row says how long it took until its delivered index
reached the leader's index at the restart (--catchup-timeout bounds it).
It fails if the follower does not catch up or does not come back as a
restart. One summary (--json: one object, with every sample).

--snapshot-catchup runs only the large-snapshot catch-up test (issue 7):
the --soak-group group, every replica's state machine carrying a --state
ballast (e.g. 256MiB; replicated state, captured copy on write), the
leader's Log bounded by --snap-log (MaxLogEntries) and --snap-catchup-log
(MaxCatchUpLogEntries), election timeout --commit-election-timeout. A
closed-loop client at the leader (--snap-window proposals of --snap-size
bytes) runs throughout: 500 ms warm-up, then the baseline for
--snap-baseline; a follower is killed (kill -9) and stays down until the
leader's Log is pruned past it, the leader sees it unreachable (an
election timeout) and at least --snap-down; it is restarted
with its stable file (empty memory), so it catches up by snapshot while
the client proposes; then --snap-after more load. Reported: the state
size, the catch-up time (restart until the follower's index reaches the
leader's at the restart; --catchup-timeout bounds it) and its timeline
(capture, persist, restore), the client's commit latency p50/p90/p99/
p99.9/max and longest gap between commits during the transfer against the
same run's baseline (and while the follower was down, and after),
snapshots taken/sent/restored, elections started after the initial one,
the leader's RSS (VmRSS: baseline, at the restart, peak during the
transfer, after), and whether every member ends with the same state
(digest and ballast hash). It fails if an election starts, the follower
does not catch up or not by a snapshot, a proposal fails, or the states
differ. Progress on stderr; one summary (--json: one object).

Each figure is the median over --runs runs; other cpu is how many CPUs
processes other than kvbench and its replicas used meanwhile.

flags:
`

// bcastFlags are the options of the broadcast benchmark.
type bcastFlags struct {
	commonFlags
	groups     []groupSpec
	elecGroups []groupSpec
	sizes      []int
	maxWindow  int
	elections  int
	tables     []string
	commitET   time.Duration
	spin       time.Duration
	pin        bool

	soak       time.Duration
	soakEvery  time.Duration
	soakWarm   time.Duration
	soakWindow int
	soakSize   int
	soakGroup  groupSpec

	killFollower   bool
	down           time.Duration
	outageEvery    time.Duration
	catchupTimeout time.Duration

	snapCatchup    bool
	state          int64
	snapWindow     int
	snapSize       int
	snapBaseline   time.Duration
	snapDown       time.Duration
	snapAfter      time.Duration
	snapLog        int
	snapCatchupLog int
}

func parseBroadcastFlags(args []string, stderr io.Writer) (*bcastFlags, error) {
	o := &bcastFlags{}
	fs := o.commonFlags.flagSet("broadcast", broadcastUsage, stderr,
		"how long each commit measurement and each one-way baseline runs (after a warm-up)",
		"repeat a one-way or commit measurement while other processes use more than this many CPUs",
		"write a CPU profile of this process to `file`; KVBENCH_PEER_CPUPROFILE=path profiles every replica process (path.<pid>)")
	groups := fs.String("groups", "shm:3,mem:3,mem:7", "commit table: comma-separated fabric:replicas groups")
	elec := fs.String("election-groups", "shm:3,shm:5,mem:7,mem:9", "election table: comma-separated fabric:replicas groups")
	sizes := fs.String("sizes", "10,1000", "commit table: comma-separated message sizes in bytes (>= 8)")
	fs.IntVar(&o.maxWindow, "max-window", 4096, "largest window W")
	fs.IntVar(&o.elections, "elections", 5, "elections measured per group and run")
	tables := fs.String("tables", "commit,election", "comma-separated tables to measure: commit, election")
	fs.DurationVar(&o.commitET, "commit-election-timeout", time.Second, "election timeout of the commit table's groups and of --soak, --kill-follower and --snapshot-catchup (long, so that a descheduled leader is not voted out mid-measurement); the election table uses broadcast's default")
	fs.BoolVar(&o.pin, "pin", false, "commit table and its one-way baseline, process fabrics: pin the leader's process to CPU 0 and the other replicas to the other CPUs, and the baseline's two processes to CPUs 0 and 1 (needs 2 CPUs)")
	fs.DurationVar(&o.spin, "spin", 0, "doorbell spin budget of the replicas' nodes and of the one-way baseline (0: rdma.DefaultSpin; negative: park at once)")
	fs.DurationVar(&o.soak, "soak", 0, "run only the memory test, for this long (e.g. 10m)")
	fs.DurationVar(&o.soakEvery, "soak-every", time.Minute, "soak: RSS sampling interval")
	fs.DurationVar(&o.soakWarm, "soak-warmup", 10*time.Second, "soak and --kill-follower: load before the first RSS sample (the kill)")
	fs.IntVar(&o.soakWindow, "soak-window", 64, "soak and --kill-follower: client window")
	fs.IntVar(&o.soakSize, "soak-size", 1000, "soak and --kill-follower: message size in bytes")
	soakGroup := fs.String("soak-group", "shm:3", "soak and --kill-follower: the group (a process fabric)")
	fs.BoolVar(&o.killFollower, "kill-follower", false, "run only the follower-outage test: kill -9 a follower for --down under load, then restart it and time its catch-up")
	fs.DurationVar(&o.down, "down", 10*time.Minute, "--kill-follower: how long the follower stays down")
	fs.DurationVar(&o.outageEvery, "outage-every", 10*time.Second, "--kill-follower: interval of the leader's RSS and Status samples (progress on stderr)")
	fs.DurationVar(&o.catchupTimeout, "catchup-timeout", 5*time.Minute, "--kill-follower and --snapshot-catchup: longest wait for the restarted follower to catch up")
	fs.BoolVar(&o.snapCatchup, "snapshot-catchup", false, "run only the large-snapshot catch-up test: a follower behind the pruned Log catches up by a --state snapshot while a client proposes at the leader")
	state := fs.String("state", "256MiB", "--snapshot-catchup: every replica's ballast state (bytes, or with a unit: KiB, MiB, GiB)")
	fs.IntVar(&o.snapWindow, "snap-window", 1, "--snapshot-catchup: client window at the leader")
	fs.IntVar(&o.snapSize, "snap-size", 100, "--snapshot-catchup: message size in bytes (>= 8)")
	fs.DurationVar(&o.snapBaseline, "snap-baseline", 5*time.Second, "--snapshot-catchup: load measured before the kill (the baseline segment)")
	fs.DurationVar(&o.snapDown, "snap-down", time.Second, "--snapshot-catchup: least time the follower stays down (it stays until the leader's Log is pruned past it and the leader sees it unreachable)")
	fs.DurationVar(&o.snapAfter, "snap-after", 2*time.Second, "--snapshot-catchup: load measured after the catch-up")
	fs.IntVar(&o.snapLog, "snap-log", 1024, "--snapshot-catchup: the replicas' MaxLogEntries")
	fs.IntVar(&o.snapCatchupLog, "snap-catchup-log", 1<<20, "--snapshot-catchup: the replicas' MaxCatchUpLogEntries (entries the Log keeps for a member catching up; the transfer must end before the leader commits this many)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("broadcast: unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.groups, err = parseGroups(*groups); err != nil {
		return nil, fmt.Errorf("broadcast: --groups: %w", err)
	}
	if o.elecGroups, err = parseGroups(*elec); err != nil {
		return nil, fmt.Errorf("broadcast: --election-groups: %w", err)
	}
	for _, f := range o.elecGroups {
		if f.n < 3 {
			return nil, fmt.Errorf("broadcast: --election-groups: %v: an election needs at least 3 replicas", f)
		}
	}
	sg, err := parseGroups(*soakGroup)
	if err != nil || len(sg) != 1 || sg[0].fabric == "mem" {
		return nil, fmt.Errorf("broadcast: --soak-group %q: want one shm or tcp group", *soakGroup)
	}
	o.soakGroup = sg[0]
	if o.state, err = parseBytes(*state); err != nil {
		return nil, fmt.Errorf("broadcast: --state: %w", err)
	}
	for _, s := range splitList(*sizes) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 8 {
			return nil, fmt.Errorf("broadcast: bad message size %q (want >= 8)", s)
		}
		o.sizes = append(o.sizes, n)
	}
	o.tables = splitList(*tables)
	for _, t := range o.tables {
		if t != "commit" && t != "election" {
			return nil, fmt.Errorf("broadcast: unknown table %q (want commit, election)", t)
		}
	}
	if err := o.commonFlags.check("broadcast"); err != nil {
		return nil, err
	}
	switch {
	case o.maxWindow <= 0:
		return nil, errors.New("broadcast: --max-window must be positive")
	case o.elections <= 0:
		return nil, errors.New("broadcast: --elections must be positive")
	case o.soak < 0 || o.soakEvery <= 0 || o.soakWindow <= 0 || o.soakSize < 8:
		return nil, errors.New("broadcast: --soak, --soak-every, --soak-window and --soak-size must be positive (size >= 8)")
	case o.down <= 0 || o.outageEvery <= 0 || o.catchupTimeout <= 0:
		return nil, errors.New("broadcast: --down, --outage-every and --catchup-timeout must be positive")
	case o.snapWindow <= 0 || o.snapSize < 8 || o.snapBaseline <= 0 || o.snapDown < 0 || o.snapAfter < 0:
		return nil, errors.New("broadcast: --snap-window, --snap-size (>= 8) and --snap-baseline must be positive, --snap-down and --snap-after not negative")
	case o.snapLog <= 0 || o.snapCatchupLog < o.snapLog:
		return nil, errors.New("broadcast: --snap-log must be positive and --snap-catchup-log at least --snap-log")
	case o.snapCatchup && o.state <= 0:
		return nil, errors.New("broadcast: --snapshot-catchup needs a positive --state")
	case btoi(o.killFollower)+btoi(o.soak > 0)+btoi(o.snapCatchup) > 1:
		return nil, errors.New("broadcast: --kill-follower, --soak and --snapshot-catchup are separate tests; choose one")
	}
	return o, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// bkey names one broadcast result row.
type bkey struct {
	table  string // "oneway", "commit", "election"
	fabric string
	n      int
	window int
	size   int
}

// bstat is one measurement of a row.
type bstat struct {
	p50, p99 time.Duration
	opsPerS  float64
	n        uint64
	failed   uint64
	failover time.Duration // election rows: median kill-to-commit
	otherCPU float64       // -1: unknown
	retries  int
	run      int
}

// bcastRow is one output line.
type bcastRow struct {
	Bench         string  `json:"bench"` // "broadcast"
	Table         string  `json:"table"` // "oneway", "commit", "election", "soak"
	Fabric        string  `json:"fabric"`
	Placement     string  `json:"placement"`
	Replicas      int     `json:"replicas"`
	Window        int     `json:"window"`
	Size          int     `json:"size"`
	P50NS         int64   `json:"p50_ns"`
	P99NS         int64   `json:"p99_ns"`
	OpsPerS       float64 `json:"ops_per_s"`
	MBPerS        float64 `json:"mb_per_s"`
	BaselineP50NS int64   `json:"baseline_p50_ns"`
	Ratio         float64 `json:"ratio"` // p50 / baseline p50 (per-run ratios' median)
	ElectionNS    int64   `json:"election_ns,omitempty"`
	FailoverNS    int64   `json:"failover_ns,omitempty"`
	Failed        uint64  `json:"failed,omitempty"` // proposals that failed (commit rows)
	Retries       int     `json:"retries"`          // measurements repeated because of background load
	Runs          int     `json:"runs"`
	N             uint64  `json:"n"`
	OtherCPU      float64 `json:"other_cpu"`
	// Soak rows: every replica's VmRSS in KiB at the first sample and now,
	// and the elapsed load time.
	RSSStartKB []int64 `json:"rss_start_kb,omitempty"`
	RSSKB      []int64 `json:"rss_kb,omitempty"`
	ElapsedNS  int64   `json:"elapsed_ns,omitempty"`
}

// runBroadcast is the broadcast subcommand.
func runBroadcast(args []string, stdout, stderr io.Writer) error {
	o, err := parseBroadcastFlags(args, stderr)
	if err != nil {
		return err
	}
	sweepShmDir(o.shmDir, stderr)
	if o.cpuProf != "" {
		stop, err := startProfile(o.cpuProf)
		if err != nil {
			return fmt.Errorf("broadcast: %w", err)
		}
		defer stop()
	}
	if o.soak > 0 {
		return runSoak(o, stdout, stderr)
	}
	if o.killFollower {
		return runOutage(o, stdout, stderr)
	}
	if o.snapCatchup {
		return runSnapCatchup(o, stdout, stderr)
	}
	tm := timing{dur: o.duration, warm: min(o.duration/5, 200*time.Millisecond)}
	res := map[bkey][]bstat{}
	var order []bkey
	add := func(k bkey, st bstat) {
		if _, ok := res[k]; !ok {
			order = append(order, k)
		}
		res[k] = append(res[k], st)
	}
	var failed []string
	fail := func(what string, err error) {
		failed = append(failed, what)
		fmt.Fprintf(stderr, "kvbench broadcast: %s: %v\n", what, err)
	}
	// The fabrics whose one-way latency the rows compare to.
	var fabrics []string
	if slices.Contains(o.tables, "commit") {
		for _, g := range o.groups {
			if !slices.Contains(fabrics, g.fabric) {
				fabrics = append(fabrics, g.fabric)
			}
		}
	}
	if slices.Contains(o.tables, "election") {
		for _, g := range o.elecGroups {
			if !slices.Contains(fabrics, g.fabric) {
				fabrics = append(fabrics, g.fabric)
			}
		}
	}
	windows := map[bkey][]int{} // from run 1: the sweep up to saturation
	fmt.Fprintf(stderr, "kvbench broadcast: %d run(s); load average %s\n", o.runs, loadAvg())
	ctx := runCtx
	h := &hist.Hist{}
	for run := 1; run <= o.runs; run++ {
		for _, f := range fabrics {
			st, err := retryDisturbed("broadcast", o.commonFlags, stderr, func() (bstat, error) { return onewayBaseline(f, o.shmDir, o.spin, o.pin, tm, h) })
			if err != nil {
				fail(f+" one-way", err)
				continue
			}
			st.run = run
			add(bkey{table: "oneway", fabric: f, n: 2, size: 8}, st)
			fmt.Fprintf(stderr, "[run %d/%d] %-4s one-way write  p50 %-8s p99 %-8s other %.2f CPUs\n", run, o.runs, f, fmtDur(st.p50), fmtDur(st.p99), st.otherCPU)
		}
		if slices.Contains(o.tables, "commit") {
			for _, spec := range o.groups {
				if err := commitRun(ctx, o, spec, run, tm, windows, add, stderr); err != nil {
					fail(fmt.Sprintf("commit %v", spec), err)
				}
			}
		}
		if slices.Contains(o.tables, "election") {
			for _, spec := range o.elecGroups {
				st, err := electionRun(ctx, o, spec, stderr)
				if err != nil {
					fail(fmt.Sprintf("election %v", spec), err)
					continue
				}
				st.run = run
				add(bkey{table: "election", fabric: spec.fabric, n: spec.n}, st)
				fmt.Fprintf(stderr, "[run %d/%d] %-4s %d replicas  election p50 %-8s max %-8s failover p50 %-8s\n",
					run, o.runs, spec.fabric, spec.n, fmtDur(st.p50), fmtDur(st.p99), fmtDur(st.failover))
			}
		}
	}
	out := summarizeBroadcast(order, res, o)
	return emitRows("broadcast", stdout, stderr, out, o.json, func() { printBroadcastTable(stdout, out, o) }, failed)
}

// onewayBaseline measures the fabric's 8-byte write-oneway ping-pong in
// the replicas' mode: doorbell waits with the same spin budget, Notify
// writes.
func onewayBaseline(fabric, shmDir string, spin time.Duration, pin bool, tm timing, h *hist.Hist) (bstat, error) {
	switch {
	case spin == 0:
		spin = rdma.DefaultSpin
	case spin < 0:
		spin = 0 // fabricSpin: park at once
	}
	s, err := openSession(fabric, "park", &fabricFlags{parkSpin: spin, commonFlags: commonFlags{shmDir: shmDir}})
	if err != nil {
		return bstat{}, err
	}
	if pin && s.peer.pid() > 0 {
		all := make([]int, runtime.NumCPU())
		for c := range all {
			all[c] = c
		}
		defer pinProcess(os.Getpid(), all...)
		if err := errors.Join(pinProcess(os.Getpid(), 0), pinProcess(s.peer.pid(), 1)); err != nil {
			s.shutdown()
			return bstat{}, err
		}
	}
	a := takeCPU(s.peer.pid())
	st, err := s.writeLatency(1, tm, h)
	b := takeCPU(s.peer.pid())
	err = errors.Join(err, s.shutdown())
	if err != nil {
		return bstat{}, err
	}
	return bstat{p50: st.p50 / 2, p99: st.p99 / 2, n: st.n, opsPerS: st.opsPerS, otherCPU: otherCPUs(a, b, runtime.NumCPU())}, nil
}

// commitRun measures one group's commit rows for one run: every size,
// windows 1, 2, 4, ... (run 1 finds where throughput saturates; later runs
// measure the same windows).
func commitRun(ctx context.Context, o *bcastFlags, spec groupSpec, run int, tm timing, windows map[bkey][]int, add func(bkey, bstat), stderr io.Writer) error {
	g, err := openGroup(ctx, spec, groupproc.Tuning{ElectionTimeout: o.commitET}, o.spin, o.shmDir)
	if err != nil {
		return err
	}
	defer g.close()
	for _, size := range o.sizes {
		wk := bkey{table: "commit", fabric: spec.fabric, n: spec.n, size: size}
		ws, known := windows[wk]
		best, flat := 0.0, 0
		for i, w := 0, 1; w <= o.maxWindow; i, w = i+1, w*2 {
			if known && i >= len(ws) {
				break
			}
			ldr, err := g.leader(ctx, -1)
			if err != nil {
				return err
			}
			if o.pin {
				if err := g.pin(ldr); err != nil {
					return err
				}
			}
			st, err := retryDisturbed("broadcast", o.commonFlags, stderr, func() (bstat, error) {
				pids := g.pids()
				a := cpuOf(pids)
				r, err := g.load(ctx, ldr, groupproc.LoadSpec{Window: w, Size: size, Warmup: tm.warm, Duration: tm.dur})
				b := cpuOf(pids)
				if err != nil {
					return bstat{}, fmt.Errorf("W=%d %dB: %w", w, size, err)
				}
				if r.N == 0 {
					return bstat{}, fmt.Errorf("W=%d %dB: nothing committed (%d failed: %s)", w, size, r.Failed, r.FirstErr)
				}
				return bstat{p50: r.P50, p99: r.P99, opsPerS: r.OpsPerS, n: r.N, failed: r.Failed, otherCPU: otherCPUs(a, b, runtime.NumCPU())}, nil
			})
			if err != nil {
				return err
			}
			st.run = run
			r := st
			k := wk
			k.window = w
			add(k, st)
			fmt.Fprintf(stderr, "[run %d/%d] %-4s %d replicas %5dB W=%-5d p50 %-8s p99 %-8s %8s msgs/s %7.1f MB/s  other %.2f CPUs\n",
				run, o.runs, spec.fabric, spec.n, size, w, fmtDur(r.p50), fmtDur(r.p99), fmtOps(r.opsPerS), r.opsPerS*float64(size)/1e6, st.otherCPU)
			if !known {
				windows[wk] = append(windows[wk], w)
				// Saturated: two windows in a row from W=64 on did not
				// beat the best smaller window by 10% (one could be
				// noise; background load makes small windows flat at
				// times).
				if w >= 64 && r.opsPerS < 1.1*best {
					flat++
				} else {
					flat = 0
				}
				if w >= 64 && flat >= 2 {
					break
				}
			}
			best = max(best, r.opsPerS)
		}
	}
	return nil
}

// electionRun times o.elections elections of fresh groups of spec and
// returns the p50 and p99 of the election durations and the median
// failover.
func electionRun(ctx context.Context, o *bcastFlags, spec groupSpec, stderr io.Writer) (bstat, error) {
	var el, fo []time.Duration
	var other []float64
	for range o.elections {
		var e, f time.Duration
		var oc float64
		var err error
		for try := 0; ; try++ {
			e, f, oc, err = oneElection(ctx, spec, o.spin, o.shmDir)
			if !errors.Is(err, errNoElection) || try == 2 {
				break
			}
			fmt.Fprintf(stderr, "kvbench broadcast: %v: %v; repeating\n", spec, err)
		}
		if err != nil {
			return bstat{}, err
		}
		el, fo, other = append(el, e), append(fo, f), append(other, oc)
	}
	slices.Sort(el)
	slices.Sort(fo)
	slices.Sort(other)
	return bstat{p50: el[len(el)/2], p99: el[len(el)-1], failover: fo[len(fo)/2], n: uint64(len(el)), otherCPU: other[len(other)/2]}, nil
}

// oneElection starts a group, commits a little, kills the leader and
// times the election that follows, from the new leader's events.
func oneElection(ctx context.Context, spec groupSpec, spin time.Duration, shmDir string) (election, failover time.Duration, other float64, err error) {
	other = -1
	g, err := openGroup(ctx, spec, groupproc.Tuning{}, spin, shmDir)
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { err = errors.Join(err, g.close()) }()
	ldr, err := g.leader(ctx, -1)
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := g.load(ctx, ldr, groupproc.LoadSpec{Window: 4, Size: 10, Duration: 50 * time.Millisecond}); err != nil {
		return 0, 0, 0, err
	}
	// The leader may have changed meanwhile (a descheduled leader is voted
	// out after the election timeout): kill the current one.
	if ldr, err = g.leader(ctx, -1); err != nil {
		return 0, 0, 0, err
	}
	st, err := g.status(ctx, ldr)
	if err != nil {
		return 0, 0, 0, err
	}
	old := st.ECur
	killAt := time.Now()
	if err := g.kill(ldr); err != nil {
		return 0, 0, 0, err
	}
	nl, err := g.leader(ctx, ldr)
	if err != nil {
		return 0, 0, 0, err
	}
	evs, err := g.events(ctx, nl)
	if err != nil {
		return 0, 0, 0, err
	}
	elect, commit, ok := electionSpan(evs, old)
	if !ok {
		return 0, 0, 0, fmt.Errorf("new leader %d's events show no election after epoch %v (the leader changed before the kill?): %v: %w", nl+1, old, evs, errNoElection)
	}
	// An election lasts less than /proc/stat's 10 ms tick: other
	// processes' CPU use during it is unknown.
	return time.Duration(commit - elect), time.Duration(commit - killAt.UnixNano()), -1, nil
}

// electionSpan finds, in a new leader's events, the first epoch after old
// that it won and committed, and returns when it last became ELECTING
// before winning it and when that epoch first committed (Unix ns).
func electionSpan(evs []groupproc.TimedEvent, old broadcast.Epoch) (elect, commit int64, ok bool) {
	for i, e := range evs {
		if e.Kind != broadcast.EventLeader || e.Epoch <= old {
			continue
		}
		elect = -1
		for j := i - 1; j >= 0; j-- {
			if evs[j].Kind == broadcast.EventElecting {
				elect = evs[j].UnixNS
				break
			}
		}
		for _, c := range evs[i+1:] {
			if c.Kind == broadcast.EventEpochCommitted && c.Epoch == e.Epoch && elect >= 0 {
				return elect, c.UnixNS, true
			}
		}
	}
	return 0, 0, false
}

// errNoElection: the new leader's events show no election after the
// killed leader's epoch (the leader changed just before the kill).
var errNoElection = errors.New("no election seen")

func (s *bstat) load() float64    { return s.otherCPU }
func (s *bstat) setRetries(n int) { s.retries = n }

// summarizeBroadcast turns per-run stats into rows: medians over runs, and
// ratios to the same run's one-way baseline.
func summarizeBroadcast(order []bkey, res map[bkey][]bstat, o *bcastFlags) []bcastRow {
	med := func(sts []bstat, f func(bstat) float64) float64 {
		v := make([]stat, len(sts))
		for i, s := range sts {
			v[i] = stat{opsPerS: f(s)}
		}
		return median(v, func(s stat) float64 { return s.opsPerS })
	}
	var out []bcastRow
	for _, k := range order {
		sts := res[k]
		pl := placement(k.fabric)
		if o.pin && pl == "processes" && k.table != "election" {
			pl = "processes, pinned"
		}
		r := bcastRow{Bench: "broadcast", Table: k.table, Fabric: k.fabric, Placement: pl, Replicas: k.n,
			Window: k.window, Size: k.size, Runs: len(sts)}
		r.P50NS = int64(med(sts, func(s bstat) float64 { return float64(s.p50) }))
		r.P99NS = int64(med(sts, func(s bstat) float64 { return float64(s.p99) }))
		r.OpsPerS = med(sts, func(s bstat) float64 { return s.opsPerS })
		r.MBPerS = r.OpsPerS * float64(k.size) / 1e6
		r.N = uint64(med(sts, func(s bstat) float64 { return float64(s.n) }))
		r.OtherCPU = med(sts, func(s bstat) float64 { return s.otherCPU })
		for _, s := range sts {
			r.Failed += s.failed
			r.Retries += s.retries
		}
		if k.table == "election" {
			r.ElectionNS = r.P50NS
			r.FailoverNS = int64(med(sts, func(s bstat) float64 { return float64(s.failover) }))
			r.MBPerS, r.OpsPerS = 0, 0
		}
		if k.table != "oneway" {
			base := res[bkey{table: "oneway", fabric: k.fabric, n: 2, size: 8}]
			var ratios []bstat
			for _, s := range sts {
				if i := slices.IndexFunc(base, func(b bstat) bool { return b.run == s.run }); i >= 0 && base[i].p50 > 0 {
					ratios = append(ratios, bstat{opsPerS: float64(s.p50) / float64(base[i].p50)})
				}
			}
			r.BaselineP50NS = int64(med(base, func(s bstat) float64 { return float64(s.p50) }))
			r.Ratio = med(ratios, func(s bstat) float64 { return s.opsPerS })
		} else {
			r.BaselineP50NS = r.P50NS
			r.Ratio = 1
		}
		out = append(out, r)
	}
	return out
}

func printBroadcastTable(w io.Writer, out []bcastRow, o *bcastFlags) {
	fmt.Fprintf(w, "kvbench broadcast  %s  %s, %d CPUs, %s  medians of %d run(s) x %v\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.runs, o.duration)
	fmt.Fprintf(w, "shm, tcp: every replica its own OS process; mem: replicas are goroutines of one process\n")
	spin := fmt.Sprint(o.spin)
	switch {
	case o.spin == 0:
		spin = fmt.Sprint(rdma.DefaultSpin)
	case o.spin < 0:
		spin = "0"
	}
	fmt.Fprintf(w, "replicas and one-way baseline wait in Doorbell.Wait: spin %s, then park; ratio = p50 / one-way p50\n", spin)
	if o.pin {
		fmt.Fprintf(w, "pinned (--pin): commit table leader on CPU 0, other replicas on CPUs 1..%d; one-way baseline on CPUs 0 and 1\n", runtime.NumCPU()-1)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	section := ""
	for _, r := range out {
		if r.Table != section {
			if section != "" {
				tw.Flush()
				fmt.Fprintln(w)
			}
			section = r.Table
			switch section {
			case "oneway":
				fmt.Fprintln(w, "one-way write latency (baseline)")
				fmt.Fprintln(tw, "fabric\tplacement\tp50\tp99\tother cpu\t")
			case "commit":
				fmt.Fprintln(w, "commit latency and throughput (Acuerdo Fig. 8 analogue): client at the leader, W outstanding")
				fmt.Fprintln(tw, "fabric\treplicas\tsize\tW\tp50\tp99\tmsgs/s\tMB/s\tone-way\tratio\tfailed\tother cpu\t")
			case "election":
				fmt.Fprintln(w, "election duration (Acuerdo Table 1 analogue): new leader's detection to its first commit")
				fmt.Fprintln(tw, "fabric\treplicas\telections\tp50\tmax\tfailover p50\tone-way\tratio\t")
			}
		}
		switch r.Table {
		case "oneway":
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t\n", r.Fabric, r.Placement, fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), r.OtherCPU)
		case "commit":
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%.1f\t%s\t%.1fx\t%d\t%.2f\t\n", r.Fabric, r.Replicas, r.Size, r.Window,
				fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), fmtOps(r.OpsPerS), r.MBPerS,
				fmtDur(time.Duration(r.BaselineP50NS)), r.Ratio, r.Failed, r.OtherCPU)
		case "election":
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%.0fx\t\n", r.Fabric, r.Replicas, r.N,
				fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), fmtDur(time.Duration(r.FailoverNS)),
				fmtDur(time.Duration(r.BaselineP50NS)), r.Ratio)
		}
	}
	tw.Flush()
}

// runSoak runs sustained load on one group and samples every replica's RSS.
func runSoak(o *bcastFlags, stdout, stderr io.Writer) error {
	ctx := runCtx
	g, err := openGroup(ctx, o.soakGroup, groupproc.Tuning{ElectionTimeout: o.commitET}, o.spin, o.shmDir)
	if err != nil {
		return fmt.Errorf("broadcast: soak: %w", err)
	}
	defer g.close()
	ldr, err := g.leader(ctx, -1)
	if err != nil {
		return err
	}
	spec := groupproc.LoadSpec{Window: o.soakWindow, Size: o.soakSize, Duration: o.soakWarm, Samples: 1 << 16}
	fmt.Fprintf(stderr, "kvbench broadcast --soak %v: %v group, client at the leader, W=%d, %d B; warm-up %v; load average %s\n",
		o.soak, o.soakGroup, o.soakWindow, o.soakSize, o.soakWarm, loadAvg())
	if _, err := g.load(ctx, ldr, spec); err != nil {
		return fmt.Errorf("broadcast: soak warm-up: %w", err)
	}
	rss := func() ([]int64, error) {
		var out []int64
		for _, p := range g.pids() {
			kb, err := rssKB(p)
			if err != nil {
				return nil, err
			}
			out = append(out, kb)
		}
		return out, nil
	}
	start, err := rss()
	if err != nil {
		return err
	}
	var rows []bcastRow
	emit := func(r bcastRow) error {
		rows = append(rows, r)
		if o.json {
			return json.NewEncoder(stdout).Encode(r)
		}
		fmt.Fprintf(stdout, "%8s  %8s msgs/s  %7.1f MB/s  p50 %-8s p99 %-8s  failed %d  RSS KiB %v (start %v)\n",
			time.Duration(r.ElapsedNS).Round(time.Second), fmtOps(r.OpsPerS), r.MBPerS, fmtDur(time.Duration(r.P50NS)),
			fmtDur(time.Duration(r.P99NS)), r.Failed, r.RSSKB, r.RSSStartKB)
		return nil
	}
	if !o.json {
		fmt.Fprintf(stdout, "kvbench broadcast --soak %v  %s  %s, %d CPUs, %s\n%v group (one OS process per replica), client at the leader, W=%d, %d B messages\n",
			o.soak, time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.soakGroup, o.soakWindow, o.soakSize)
	}
	base := bcastRow{Bench: "broadcast", Table: "soak", Fabric: o.soakGroup.fabric, Placement: placement(o.soakGroup.fabric),
		Replicas: o.soakGroup.n, Window: o.soakWindow, Size: o.soakSize, Runs: 1, RSSStartKB: start, RSSKB: start}
	if err := emit(base); err != nil {
		return err
	}
	var elapsed time.Duration
	for elapsed < o.soak {
		spec.Duration = min(o.soakEvery, o.soak-elapsed)
		pids := g.pids()
		a := cpuOf(pids)
		r, err := g.load(ctx, ldr, spec)
		b := cpuOf(pids)
		if err != nil {
			return fmt.Errorf("broadcast: soak: %w", err)
		}
		elapsed += spec.Duration
		now, err := rss()
		if err != nil {
			return err
		}
		row := base
		row.RSSKB, row.ElapsedNS = now, int64(elapsed)
		row.P50NS, row.P99NS, row.OpsPerS, row.N, row.Failed = int64(r.P50), int64(r.P99), r.OpsPerS, r.N, r.Failed
		row.MBPerS = r.OpsPerS * float64(o.soakSize) / 1e6
		row.OtherCPU = otherCPUs(a, b, runtime.NumCPU())
		if err := emit(row); err != nil {
			return err
		}
		if s, err := g.status(ctx, ldr); err != nil || s.Role != broadcast.Leader {
			fmt.Fprintf(stderr, "kvbench broadcast: soak: member %d no longer leads (%v); the client's proposals are forwarded\n", ldr+1, err)
		}
	}
	return nil
}
