package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/prop"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/redisproc"
	rdycsb "github.com/rdmakv/rdmakv/ycsb"
)

const benchUsage = `usage: kvycsb bench [flags]

Runs YCSB workloads (A, B, C, D and F by default; E with --workloads)
through go-ycsb's core workload at each thread count, against rdmakv and
against Redis in the same run, and prints a table of ops/s and the
rdmakv/Redis ratio.

  rdmakv   an embedded cluster (--groups x --replicas on the shm fabric, in
           a child process of kvycsb) through the binding in package ycsb,
           one client in kvycsb shared by the threads, linearizable reads
           (rdmakv.consistency); E on the cluster's ordered keyspace
           (rdmakv.keyspace=ordered), the others on the hashed one
  Redis    redis-server (--redis-server), started by kvycsb on a free
           loopback port with persistence off (--save "" --appendonly no)
           in a temporary directory and killed at the end, with a
           connection per thread; A-D and F through go-ycsb's redis
           binding (hashes: HSET, HMGET), E through redis-sorted (the
           same hashes plus a sorted-set index: insert = MULTI HSET ZADD
           EXEC, scan = ZRANGEBYLEX then the HGETALLs in one pipeline)

Each database is loaded once with --records records (--load-threads
threads), then every workload runs at every thread count, --ops
operations each, rdmakv first and Redis right after (so that both see the
same machine), D after the others (its inserts add records). During
each of Redis's phases the embedded cluster's process is stopped
(SIGSTOP; SIGCONT after it, and the next rdmakv phase waits until every
group serves again), so that the idle replicas take no CPU from the
baseline; the output says so, with the cluster's CPU during them. E comes last
of all, with a load of its own (the ordered keyspace; the hashes again
and the index on Redis). ops/s = operations / wall time of the run, as
YCSB's [OVERALL] throughput; a read-modify-write of F is one operation.
Progress goes to stderr.

Flags:
`

func runBench(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvycsb bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage)
		fs.PrintDefaults()
	}
	records := fs.Int64("records", 100000, "records loaded (recordcount)")
	ops := fs.Int64("ops", 0, "operations per run (operationcount; 0: as many as --records)")
	threadsArg := fs.String("threads", "1,8,32", "comma-separated thread counts")
	workloadsArg := fs.String("workloads", "a,b,c,d,f", "comma-separated workloads (of a, b, c, d, e, f)")
	loadThreads := fs.Int("load-threads", 8, "threads of the load phases")
	redisBin := fs.String("redis-server", "redis-server", "the redis-server binary (empty: rdmakv alone)")
	groups := fs.Int("groups", 2, "embedded cluster: groups (shards)")
	replicas := fs.Int("replicas", 3, "embedded cluster: replicas per group (odd)")
	election := fs.Duration("election-timeout", time.Second, "embedded cluster: the replicas' election timeout")
	heartbeat := fs.Duration("heartbeat", 10*time.Millisecond, "embedded cluster: the replicas' heartbeat interval (kvserver's default, the cluster a user starts)")
	spareP := fs.String("spare-p", cluster.SparePAuto, "embedded cluster: the pollers' spare P, as kvserver --spare-p: auto or off")
	shmDir := fs.String("shm-dir", "/dev/shm", "embedded cluster: the directory of its shared-memory files (a tmpfs; one mounted with huge pages: docs/operations.md, Huge pages)")
	progress := fs.Duration("progress", 5*time.Second, "interval of progress lines on stderr during a phase (0: none)")
	jsonOut := fs.Bool("json", false, "print the results as one JSON document instead of the table")
	var extra multiFlag
	fs.Var(&extra, "p", "a property `key=value` for every phase (repeatable)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("bench: unexpected arguments %q", fs.Args())
	}
	threads, err := parseInts(*threadsArg)
	if err != nil {
		return usagef("bench: --threads %s: %v", *threadsArg, err)
	}
	var workloads []string
	for _, w := range strings.Split(*workloadsArg, ",") {
		w = strings.ToLower(strings.TrimSpace(w))
		switch w {
		case "a", "b", "c", "d", "e", "f":
			if !slices.Contains(workloads, w) {
				workloads = append(workloads, w)
			}
		default:
			return usagef("bench: unknown workload %q (want a, b, c, d, e, f)", w)
		}
	}
	if len(workloads) == 0 {
		return usagef("bench: no workloads")
	}
	if err := cluster.CheckSpareP(*spareP); err != nil {
		return usagef("bench: --spare-p %v", err)
	}
	if *ops == 0 {
		*ops = *records
	}
	maxThreads := slices.Max(threads)
	switch {
	case *records < int64(*loadThreads) || *loadThreads < 1:
		return usagef("bench: --records %d --load-threads %d: want at least one record per load thread", *records, *loadThreads)
	case *ops < int64(maxThreads):
		return usagef("bench: --ops %d: want at least one operation per thread (%d)", *ops, maxThreads)
	case *groups < 1 || *replicas < 1 || *replicas%2 == 0:
		return usagef("bench: --groups %d --replicas %d: want at least one group and an odd number of replicas", *groups, *replicas)
	}
	// hashed are the workloads on the hashed keyspace (on go-ycsb's
	// redis binding), D last of them: its inserts add records that the
	// others would otherwise see. E, if asked for, runs after them on
	// records loaded for it alone.
	hashed := slices.DeleteFunc(slices.Clone(workloads), func(w string) bool { return w == "e" })
	slices.SortStableFunc(hashed, func(a, b string) int {
		if (a == "d") != (b == "d") {
			if a == "d" {
				return 1
			}
			return -1
		}
		return 0
	})
	withE := slices.Contains(workloads, "e")
	base := func(w string) (*properties.Properties, error) {
		text, _ := builtinWorkload(w)
		p, err := properties.LoadString(text)
		if err != nil {
			return nil, err
		}
		p.Set(prop.RecordCount, strconv.FormatInt(*records, 10))
		p.Set(prop.OperationCount, strconv.FormatInt(*ops, 10))
		p.Set(prop.LogInterval, "3600") // no interim summaries
		for _, kv := range extra {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, usagef("bench: bad property %q: want -p name=value", kv)
			}
			p.Set(k, v)
		}
		if w == "e" {
			if _, ok := p.Get(rdycsb.PropKeyspace); !ok {
				// As loadrun e --embedded: the embedded cluster's
				// ordered keyspace.
				p.Set(rdycsb.PropKeyspace, cluster.DefaultOrderedKeyspace)
			}
		}
		return p, nil
	}
	for _, w := range workloads {
		p, err := base(w)
		if err != nil {
			return err
		}
		p.Set(prop.ThreadCount, strconv.Itoa(maxThreads))
		if err := checkProps(p, "rdmakv", []string{"load", "run"}); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// go-ycsb's own prints (key ranges, the redis binding's settings) go
	// nowhere; this process's table goes to stdout.
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	defer redirectStdout(devnull)()

	start := time.Now()
	first := "e"
	if len(hashed) > 0 {
		first = hashed[0]
	}
	loadProps, err := base(first)
	if err != nil {
		return err
	}
	loadProps.Set(prop.ThreadCount, strconv.Itoa(*loadThreads))
	rd, err := openRdmakv(ctx, loadProps, true, embeddedConfig{*groups, *replicas, *heartbeat, *election, *spareP, *shmDir}, stderr)
	if err != nil {
		return err
	}
	defer rd.close()
	fmt.Fprintf(stderr, "kvycsb bench: rdmakv: %s\n", rd.desc)
	dbs := []*dbEnv{rd}
	// E's databases: rdmakv's ordered keyspace through a second binding
	// on the same client (rd itself if every workload runs there), and
	// Redis through redis-sorted.
	var dbsE []*dbEnv
	if withE {
		pe, err := base("e")
		if err != nil {
			return err
		}
		cfg, err := rdycsb.ParseConfig(pe)
		if err != nil {
			return usageError{err.Error()}
		}
		rdE := rd
		if cfg.Keyspace != rd.keyspace {
			c := rd.db.Client()
			if _, err := c.Map().FindKeyspace(cfg.Keyspace); err != nil {
				return usagef("bench: workload e: %s=%s: %v", rdycsb.PropKeyspace, cfg.Keyspace, err)
			}
			if err := rdycsb.CheckRecordSize(pe, c, cfg.Keyspace); err != nil {
				return usageError{err.Error()}
			}
			rdE = &dbEnv{name: "rdmakv", keyspace: cfg.Keyspace, db: rdycsb.New(c, cfg), desc: rd.desc}
		}
		dbsE = append(dbsE, rdE)
	}
	var redisSrv *redisproc.Server
	if *redisBin != "" {
		bin, err := exec.LookPath(*redisBin)
		if err != nil {
			return fmt.Errorf("bench: %s not found (apt-get install -y redis-server, or --redis-server \"\" for rdmakv alone): %w", *redisBin, err)
		}
		redisSrv, err = redisproc.Start(ctx, bin, redisproc.Options{Prepare: func(c *exec.Cmd) error {
			// Its own process group (a Ctrl-C reaches kvycsb, which
			// kills it), and killed if kvycsb dies.
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			return nil
		}})
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer redisSrv.Close()
		fmt.Fprintf(stderr, "kvycsb bench: redis: %s (pid %d, persistence off)\n", redisSrv.Addr, redisSrv.Pid())
		dbs = append(dbs, &dbEnv{name: "redis", desc: redisSrv.Addr})
		if withE {
			dbsE = append(dbsE, &dbEnv{name: "redis", binding: redisSortedName, desc: redisSrv.Addr})
		}
	}
	phase := func(env *dbEnv, ph, w string, p *properties.Properties) (*phaseResult, error) {
		if isRedisDB(env.name) {
			p.Set("redis.addr", redisSrv.Addr)
		}
		// Redis's phases run with the cluster's process stopped, so
		// that its idle replicas take no CPU from the baseline.
		frozen := isRedisDB(env.name)
		if frozen {
			if err := rd.child.freeze(); err != nil {
				return nil, fmt.Errorf("%s %s on %s: stop the rdmakv cluster: %w", ph, w, env.driver(), err)
			}
		}
		during := rd.child.watch(frozen)
		r, err := runPhase(ctx, phaseSpec{phase: ph, workload: w, db: env, props: p, progress: *progress, stderr: stderr, quiet: true})
		during.end()
		if frozen {
			if terr := rd.child.thaw(ctx, rd.db.Client()); terr != nil && err == nil {
				err = fmt.Errorf("resume the rdmakv cluster: %w", terr)
			}
		}
		if r != nil {
			r.Cluster = during
		}
		if err != nil {
			return r, fmt.Errorf("%s %s on %s: %w", ph, w, env.driver(), err)
		}
		note := fmt.Sprintf("the rdmakv cluster %.2f s CPU", during.CPUSeconds)
		if frozen {
			note = fmt.Sprintf("the rdmakv cluster stopped (state %s), %.2f s CPU", during.State, during.CPUSeconds)
		}
		fmt.Fprintf(stderr, "kvycsb bench: %-4s %s %-12s %2d threads: %9.0f ops/s (%d ops in %.2f s, %d errors; %s)\n",
			ph, strings.ToUpper(w), env.driver(), r.Threads, r.OpsPerSec, r.Operations, r.Seconds, r.Errors, note)
		return r, nil
	}
	var results []*phaseResult
	// loadRun loads dbs with workload load's records, then runs each of
	// ws at every thread count on each of dbs.
	loadRun := func(dbs []*dbEnv, load string, ws []string) error {
		for _, env := range dbs {
			p, err := base(load)
			if err != nil {
				return err
			}
			p.Set(prop.ThreadCount, strconv.Itoa(*loadThreads))
			r, err := phase(env, "load", load, p)
			if err != nil {
				return err
			}
			results = append(results, r)
		}
		for _, w := range ws {
			for _, t := range threads {
				for _, env := range dbs {
					p, err := base(w)
					if err != nil {
						return err
					}
					p.Set(prop.ThreadCount, strconv.Itoa(t))
					r, err := phase(env, "run", w, p)
					if err != nil {
						return err
					}
					results = append(results, r)
				}
			}
		}
		return nil
	}
	if len(hashed) > 0 {
		if err := loadRun(dbs, hashed[0], hashed); err != nil {
			return err
		}
	}
	if withE {
		if err := loadRun(dbsE, "e", []string{"e"}); err != nil {
			return err
		}
	}
	load, _ := loadAvg()
	if *jsonOut {
		return writeJSON(stdout, map[string]any{
			"records": *records, "operations": *ops, "groups": *groups, "replicas": *replicas,
			"cpus": numCPU(), "loadavg_after": load, "seconds": time.Since(start).Seconds(), "results": results,
		})
	}
	printTable(stdout, results, workloads, threads)
	if redisSrv != nil {
		fmt.Fprintf(stdout, "\norder: rdmakv's phase, then Redis's, per workload and thread count; %s\n", baselineNote(results))
	}
	fmt.Fprintf(stdout, "\n%d records, %d operations a run; %d CPUs; load average after the run: %s; took %v\n",
		*records, *ops, numCPU(), load, time.Since(start).Round(time.Second))
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// printTable prints ops/s per workload and thread count, for both
// databases, their ratio, and the Redis binding of each row.
func printTable(w io.Writer, results []*phaseResult, workloads []string, threads []int) {
	find := func(db, ph, wl string, t int) *phaseResult {
		for _, r := range results {
			if r.DB == db && r.Phase == ph && r.Workload == wl && (t == 0 || r.Threads == t) {
				return r
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tthreads\trdmakv ops/s\tredis ops/s\trdmakv/redis\trdmakv p99 us\tredis p99 us\tredis binding\terrors\t")
	row := func(label string, ph, wl string, t int) {
		rd, rs := find("rdmakv", ph, wl, t), find("redis", ph, wl, t)
		if rd == nil && rs == nil {
			return
		}
		cell := func(r *phaseResult) string {
			if r == nil {
				return "-"
			}
			return strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64)
		}
		p99 := func(r *phaseResult) string {
			if r == nil {
				return "-"
			}
			if o, ok := r.op("TOTAL"); ok {
				return strconv.FormatInt(o.P99, 10)
			}
			return "-"
		}
		ratio, errs, binding := "-", "0", "-"
		if rd != nil && rs != nil && rs.OpsPerSec > 0 {
			ratio = fmt.Sprintf("%.2fx", rd.OpsPerSec/rs.OpsPerSec)
		}
		if rs != nil {
			binding = rs.Binding
		}
		var ne []string
		for _, r := range []*phaseResult{rd, rs} {
			if r != nil && r.Errors > 0 {
				ne = append(ne, fmt.Sprintf("%s %d", r.DB, r.Errors))
			}
		}
		if len(ne) > 0 {
			errs = strings.Join(ne, ", ")
		}
		ts := "-"
		if r := rd; r != nil {
			ts = strconv.Itoa(r.Threads)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", label, ts, cell(rd), cell(rs), ratio, p99(rd), p99(rs), binding, errs)
	}
	// The main load is of the first workload other than E (its records
	// serve every one of them); E has a load of its own.
	for _, wl := range workloads {
		if wl != "e" {
			row("load", "load", wl, 0)
			break
		}
	}
	for _, wl := range workloads {
		if wl == "e" {
			continue
		}
		for _, t := range threads {
			row(strings.ToUpper(wl), "run", wl, t)
		}
	}
	if slices.Contains(workloads, "e") {
		row("load E", "load", "e", 0)
		for _, t := range threads {
			row("E", "run", "e", t)
		}
	}
	tw.Flush()
	// The targets (issue 17): at 8 threads rdmakv at least 3x Redis on the
	// load, A and F, 5x on B and C; on E (issue 18), at least 3x the
	// sorted-set baseline at 1 thread and 5x at 8.
	verdict := func(wls []string, t int, want float64) []string {
		var out []string
		for _, wl := range wls {
			ph, th := "run", t
			if wl == "load" { // the main load: of the first workload other than E
				ph, th = "load", 0
				for _, w := range workloads {
					if w != "e" {
						wl = w
						break
					}
				}
			}
			rd, rs := find("rdmakv", ph, wl, th), find("redis", ph, wl, th)
			if rd == nil || rs == nil || rs.OpsPerSec == 0 {
				continue
			}
			x := rd.OpsPerSec / rs.OpsPerSec
			mark := "met"
			if x < want {
				mark = "missed"
			}
			name := strings.ToUpper(wl)
			if ph == "load" {
				name = "load"
			}
			out = append(out, fmt.Sprintf("%s %.2fx (%s)", name, x, mark))
		}
		return out
	}
	if v := verdict([]string{"load", "a", "f"}, 8, 3); len(v) > 0 {
		fmt.Fprintf(w, "\ntarget rdmakv >= 3x Redis at 8 threads: %s\n", strings.Join(v, ", "))
	}
	if v := verdict([]string{"b", "c"}, 8, 5); len(v) > 0 {
		fmt.Fprintf(w, "target rdmakv >= 5x Redis at 8 threads: %s\n", strings.Join(v, ", "))
	}
	var ve []string
	for _, t := range []struct {
		threads int
		want    float64
	}{{1, 3}, {8, 5}} {
		for _, v := range verdict([]string{"e"}, t.threads, t.want) {
			ve = append(ve, fmt.Sprintf("%d thread(s) >= %gx: %s", t.threads, t.want, v))
		}
	}
	if len(ve) > 0 {
		fmt.Fprintf(w, "target E against %s: %s\n", redisSortedName, strings.Join(ve, "; "))
	}
	fmt.Fprintf(w, "p99 us: go-ycsb's TOTAL row (every measured operation; for F, its reads and the read-modify-writes' read and update)\n")
	fmt.Fprintf(w, "redis binding: redis = go-ycsb's (hashes: HSET, HMGET); %s = the same hashes plus a sorted-set index (insert MULTI HSET ZADD EXEC; scan ZRANGEBYLEX, then the HGETALLs in one pipeline)\n", redisSortedName)
}

func numCPU() int { return runtime.NumCPU() }

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() (string, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown", err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown", nil
	}
	return strings.Join(f[:3], " "), nil
}

// baselineNote says how Redis's phases ran: with the embedded cluster's
// process stopped, and the CPU it used during them (0 when stopped).
func baselineNote(results []*phaseResult) string {
	var cpu float64
	var running []string
	n := 0
	for _, r := range results {
		if !isRedisDB(r.DB) || r.Cluster == nil {
			continue
		}
		n++
		cpu += r.Cluster.CPUSeconds
		if !r.Cluster.stopped() {
			running = append(running, fmt.Sprintf("%s %s x%d (state %s)", r.Phase, strings.ToUpper(r.Workload), r.Threads, r.Cluster.State))
		}
	}
	if len(running) > 0 {
		return fmt.Sprintf("Redis's phases ran beside a running rdmakv cluster: %s; its CPU during Redis's %d phases: %.2f s", strings.Join(running, ", "), n, cpu)
	}
	return fmt.Sprintf("Redis's %d phases ran with the rdmakv cluster's process stopped (SIGSTOP), %.2f s of its CPU during them; kvycsb's idle rdmakv client stays open", n, cpu)
}
