// Command kvycsb runs YCSB workloads (go-ycsb v1.0.1's core workload and
// measurements) against rdmakv, through the binding in package ycsb, or
// against Redis through go-ycsb's redis binding.
//
//	kvycsb load a                 # load workload A's records into the cluster kvserver runs
//	kvycsb run a --threads 8      # then run its operations
//	kvycsb loadrun a --embedded   # both, against a cluster kvycsb starts (a child process)
//	kvycsb bench                  # A, B, C, D, F at 1, 8, 32 threads, rdmakv and Redis (--workloads e: scans)
//
// docs/ycsb.md explains the flags, the properties and the output.
package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/prop"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/version"
	rdycsb "github.com/rdmakv/rdmakv/ycsb"
)

func main() {
	ignoreSIGPIPE()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// ignoreSIGPIPE makes writes to a closed stdout or stderr fail with EPIPE
// instead of killing kvycsb: the Go runtime kills a program whose write to
// fd 1 or 2 hits a closed pipe with SIGPIPE unless it asked to be notified
// of SIGPIPE. kvycsb --embedded | head -1 died at its next line of output,
// before it closed its embedded cluster, whose shared memory files stayed
// behind. Nothing reads the channel: the write's error is what counts.
func ignoreSIGPIPE() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

const usage = `usage: kvycsb <command> [flags] [workload]

Runs YCSB workloads against rdmakv (the go-ycsb binding in package
github.com/rdmakv/rdmakv/ycsb) or against Redis (go-ycsb's redis binding, or
redis-sorted: the same hashes plus a sorted-set index, which scans).

Commands:
  load      insert the workload's records (recordcount of them)
  run       run the workload's operations (operationcount of them) on
            records loaded before
  loadrun   load, then run, in one process (the way to use --embedded)
  bench     workloads A, B, C, D and F at 1, 8 and 32 threads against an
            embedded rdmakv cluster and a Redis server kvycsb starts, and a
            table of ops/s and the rdmakv/Redis ratio (kvycsb bench -h;
            --workloads e adds E, against a sorted-set index on Redis)
  --version the module version and commit kvycsb was built from

Workloads: a, b, c, d, e, f are YCSB's standard core workloads, built in
(e scans: it needs an ordered keyspace, -p rdmakv.keyspace=NAME; with
--embedded it defaults to the embedded cluster's "ordered"; without either
kvycsb refuses it up front with exit status 2). With rdmakv.keyspace every
workload runs on that ordered keyspace. -P file loads a property file
instead or in addition, as go-ycsb does.

Without --embedded, kvycsb connects to a running cluster: the map file of
rdmakv.map (default %s, where kvserver with no
arguments writes it; --map sets it).

Examples:
  kvserver &                          # an embedded local cluster
  kvycsb load a --records 100000 --threads 8
  kvycsb run a --ops 100000 --threads 8
  kvycsb loadrun b --embedded --records 10000 --threads 8
  kvycsb loadrun e --embedded --records 10000   # scans, on the ordered keyspace
  kvycsb load e -p rdmakv.keyspace=ordered -p fieldlength=80   # kvserver's 4 KiB nodes
  kvycsb run e -p rdmakv.keyspace=ordered --ops 10000
  kvycsb loadrun a --db redis -p redis.addr=127.0.0.1:6379
  kvycsb loadrun e --db redis-sorted -p redis.addr=127.0.0.1:6379   # scans on Redis
  kvycsb run -P myworkload -p operationcount=5000 -p rdmakv.consistency=stale-ok

Exit status: 0 done (the summary counts failed operations in its _ERROR
rows), 1 a failure (no cluster, a lost connection), 2 bad usage or an
unsupported workload.

Flags of load, run and loadrun:
`

//go:embed workloads/workload?
var builtin embed.FS

// builtinWorkload returns the property file of workload name (a to f).
func builtinWorkload(name string) (string, bool) {
	b, err := builtin.ReadFile("workloads/workload" + strings.ToLower(name))
	return string(b), err == nil
}

// multiFlag is a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// usageError is a bad command line or an unsupported workload: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, client.DefaultMapFile)
		newFlags(stderr).fs.PrintDefaults()
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "load", "run", "loadrun":
		err = runPhases(cmd, rest, stdout, stderr)
	case "bench":
		err = runBench(rest, stdout, stderr)
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, version.String("kvycsb"))
		return 0
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, usage, client.DefaultMapFile)
		newFlags(stdout).fs.PrintDefaults()
		return 0
	default:
		fmt.Fprintf(stderr, "kvycsb: unknown command %q (want load, run, loadrun or bench; kvycsb -h for help)\n", cmd)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvycsb: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "kvycsb: %v\n", err)
		return 1
	}
}

// flags are the options of load, run and loadrun.
type flags struct {
	fs        *flag.FlagSet
	files     multiFlag
	props     multiFlag
	db        string
	threads   int
	target    int
	records   int64
	ops       int64
	table     string
	mapFile   string
	embedded  bool
	groups    int
	replicas  int
	election  time.Duration
	heartbeat time.Duration
	spareP    string
	shmDir    string
	interval  int
	progress  time.Duration
	jsonOut   bool
	cpuProf   string
	workloads []string // positional
}

func newFlags(out io.Writer) *flags {
	f := &flags{fs: flag.NewFlagSet("kvycsb", flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(out)
	fs.Var(&f.files, "P", "a property `file` (repeatable; after the built-in workload's properties)")
	fs.Var(&f.props, "p", "a property `key=value` (repeatable; after the files)")
	fs.StringVar(&f.db, "db", "rdmakv", "the database: rdmakv, redis (go-ycsb's binding; redis.addr, default localhost:6379) or redis-sorted (hashes plus a sorted-set index: scans too)")
	fs.IntVar(&f.threads, "threads", 1, "YCSB client threads (goroutines), as the threadcount property")
	fs.IntVar(&f.target, "target", 0, "throttle to this many operations per second in total (0: unlimited)")
	fs.Int64Var(&f.records, "records", 0, "recordcount (0: from the workload)")
	fs.Int64Var(&f.ops, "ops", 0, "operationcount (0: from the workload)")
	fs.StringVar(&f.table, "table", "", "the table name (default usertable)")
	fs.StringVar(&f.mapFile, "map", "", "the cluster map file, as the rdmakv.map property (default "+client.DefaultMapFile+")")
	fs.BoolVar(&f.embedded, "embedded", false, "start an rdmakv local cluster (shm fabric, in a child process) and run against it; it ends with kvycsb, so use loadrun")
	fs.IntVar(&f.groups, "groups", 2, "with --embedded: groups (shards)")
	fs.IntVar(&f.replicas, "replicas", 3, "with --embedded: replicas per group (odd)")
	fs.DurationVar(&f.election, "election-timeout", time.Second, "with --embedded: the replicas' election timeout (long, so that a descheduled leader is not voted out mid-run)")
	fs.DurationVar(&f.heartbeat, "heartbeat", 10*time.Millisecond, "with --embedded: the replicas' heartbeat interval (kvserver's default, the cluster a user starts)")
	fs.StringVar(&f.spareP, "spare-p", cluster.SparePAuto, "with --embedded: the replicas' pollers' spare P, as kvserver --spare-p: auto (GOMAXPROCS one above the pollers while a stream is dense) or off")
	fs.StringVar(&f.shmDir, "shm-dir", "/dev/shm", "with --embedded: the directory of the cluster's shared-memory files; a tmpfs mounted with huge pages (docs/operations.md, Huge pages) makes the first write to a fresh heap page far cheaper on VMs")
	fs.IntVar(&f.interval, "interval", 10, "seconds between go-ycsb's interim summaries (measurement.interval)")
	fs.DurationVar(&f.progress, "progress", 3*time.Second, "interval of the progress lines on stderr (0: none)")
	fs.BoolVar(&f.jsonOut, "json", false, "print one JSON document with each phase's results on stdout instead of the text summary")
	fs.StringVar(&f.cpuProf, "cpuprofile", "", "write a CPU profile of kvycsb's process (go-ycsb, the binding and the client) over the phases to `file`, for go tool pprof; "+clusterProfileEnv+"=path profiles the embedded cluster's process (path.<pid>)")
	return f
}

// parse parses args, flags and positional arguments in any order.
func (f *flags) parse(args []string) error {
	for {
		if err := f.fs.Parse(args); err != nil {
			return err
		}
		if f.fs.NArg() == 0 {
			return nil
		}
		f.workloads = append(f.workloads, f.fs.Arg(0))
		args = f.fs.Args()[1:]
	}
}

// buildProps assembles the properties: the built-in workload, the -P
// files, the -p values, then the flags.
func (f *flags) buildProps() (*properties.Properties, string, error) {
	p := properties.NewProperties()
	var label []string
	if len(f.workloads) > 1 {
		return nil, "", usagef("one workload at a time (got %s)", strings.Join(f.workloads, " "))
	}
	for _, w := range f.workloads {
		text, ok := builtinWorkload(w)
		if !ok || len(w) != 1 {
			return nil, "", usagef("unknown workload %q: the built-in ones are a, b, c, d, e and f (-P file for another)", w)
		}
		bp, err := properties.LoadString(text)
		if err != nil {
			return nil, "", fmt.Errorf("built-in workload %s: %w", w, err)
		}
		p.Merge(bp)
		label = append(label, strings.ToLower(w))
	}
	for _, file := range f.files {
		fp, err := properties.LoadFile(file, properties.UTF8)
		if err != nil {
			return nil, "", usagef("-P %s: %v", file, err)
		}
		p.Merge(fp)
		label = append(label, file)
	}
	if len(label) == 0 {
		return nil, "", usagef("no workload: name one of a, b, c, d, e, f or give -P file")
	}
	for _, kv := range f.props {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, "", usagef("bad property %q: want -p name=value", kv)
		}
		if _, _, err := p.Set(k, v); err != nil {
			return nil, "", usagef("property %s: %v", k, err)
		}
	}
	set := func(k, v string) { p.Set(k, v) }
	set(prop.ThreadCount, strconv.Itoa(f.threads))
	if f.target > 0 {
		set(prop.Target, strconv.Itoa(f.target))
	}
	if f.records > 0 {
		set(prop.RecordCount, strconv.FormatInt(f.records, 10))
	}
	if f.ops > 0 {
		set(prop.OperationCount, strconv.FormatInt(f.ops, 10))
	}
	if f.table != "" {
		set(prop.TableName, f.table)
	}
	if f.mapFile != "" {
		set(rdycsb.PropMap, f.mapFile)
	}
	set(prop.LogInterval, strconv.Itoa(f.interval))
	return p, strings.Join(label, "+"), nil
}

// checkProps refuses, before anything runs, what go-ycsb would fail on
// later (or exit on): scans, too few operations for the threads, a
// workload other than core.
func checkProps(p *properties.Properties, db string, phases []string) error {
	if wl := p.GetString(prop.Workload, "core"); wl != "core" && wl != "site.ycsb.workloads.CoreWorkload" {
		return usagef("workload=%s: kvycsb runs go-ycsb's core workload only", wl)
	}
	if sp := p.GetFloat64(prop.ScanProportion, 0); sp > 0 {
		if db == "redis" && slices.Contains(phases, "run") {
			return usagef("the workload scans (scanproportion=%v, YCSB workload E), and go-ycsb's redis binding does not support scans (--db %s does: hashes plus a sorted-set index)", sp, redisSortedName)
		}
		// Its load too: records loaded into the hashed keyspace could
		// not be scanned.
		if db == "rdmakv" && p.GetString(rdycsb.PropKeyspace, "") == "" {
			return usagef("the workload scans (scanproportion=%v, YCSB workload E): rdmakv scans need an ordered keyspace: give -p %s=NAME (the local cluster of kvserver declares %q), or run with --embedded", sp, rdycsb.PropKeyspace, cluster.DefaultOrderedKeyspace)
		}
	}
	threads := p.GetInt64(prop.ThreadCount, 1)
	for _, ph := range phases {
		if ph == "load" {
			n := p.GetInt64(prop.RecordCount, 0)
			what := prop.RecordCount
			if _, ok := p.Get(prop.InsertCount); ok {
				n, what = p.GetInt64(prop.InsertCount, 0), prop.InsertCount
			}
			if n < threads {
				return usagef("%s=%d is less than the %d threads: each thread needs at least one record to insert", what, n, threads)
			}
		} else if n := p.GetInt64(prop.OperationCount, 0); n < threads {
			return usagef("operationcount=%d is less than the %d threads: each thread needs at least one operation", n, threads)
		}
	}
	if p.GetInt(prop.LogInterval, 10) <= 0 {
		return usagef("--interval (measurement.interval) must be positive")
	}
	if mt := p.GetString(prop.MeasurementType, prop.MeasurementTypeDefault); mt != "histogram" && mt != "raw" && mt != "csv" {
		return usagef("measurementtype=%s: want histogram, raw or csv", mt)
	}
	if st := p.GetString(prop.OutputStyle, "plain"); st != "plain" && st != "table" && st != "json" {
		return usagef("outputstyle=%s: want plain, table or json", st)
	}
	if _, err := rdycsb.ParseConfig(p); err != nil && db == "rdmakv" {
		return usageError{err.Error()}
	}
	return nil
}

func runPhases(cmd string, args []string, stdout, stderr io.Writer) error {
	f := newFlags(stderr)
	f.fs.Usage = func() {
		fmt.Fprintf(stderr, usage, client.DefaultMapFile)
		f.fs.PrintDefaults()
	}
	if err := f.parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	phases := []string{cmd}
	if cmd == "loadrun" {
		phases = []string{"load", "run"}
	}
	switch {
	case f.db != "rdmakv" && f.db != "redis" && f.db != redisSortedName:
		return usagef("--db %s: want rdmakv, redis or %s", f.db, redisSortedName)
	case f.embedded && f.db != "rdmakv":
		return usagef("--embedded starts an rdmakv cluster: it goes with --db rdmakv")
	case f.embedded && cmd == "run":
		return usagef("--embedded: the embedded cluster lives as long as kvycsb, so a run alone would find no records; use loadrun")
	case f.threads < 1:
		return usagef("--threads %d: want at least 1", f.threads)
	case f.embedded && (f.groups < 1 || f.replicas < 1 || f.replicas%2 == 0):
		return usagef("--groups %d --replicas %d: want at least one group and an odd number of replicas", f.groups, f.replicas)
	case cluster.CheckSpareP(f.spareP) != nil:
		return usagef("--spare-p %v", cluster.CheckSpareP(f.spareP))
	}
	p, label, err := f.buildProps()
	if err != nil {
		return err
	}
	if f.embedded && p.GetFloat64(prop.ScanProportion, 0) > 0 {
		if _, ok := p.Get(rdycsb.PropKeyspace); !ok {
			// Workload E on the embedded cluster: its ordered keyspace.
			p.Set(rdycsb.PropKeyspace, cluster.DefaultOrderedKeyspace)
		}
	}
	if err := checkProps(p, f.db, phases); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if f.jsonOut {
		// go-ycsb prints to os.Stdout on its own (the workload's key
		// range, the redis binding's settings, interim summaries): that
		// goes to stderr, and stdout has the JSON document alone.
		restore := redirectStdout(os.Stderr)
		defer restore()
	}

	var env *dbEnv
	if f.db == "rdmakv" {
		env, err = openRdmakv(ctx, p, f.embedded, embeddedConfig{f.groups, f.replicas, f.heartbeat, f.election, f.spareP, f.shmDir}, stderr)
		if err != nil {
			return err
		}
		defer env.close()
	} else {
		env = &dbEnv{name: f.db}
	}
	if f.cpuProf != "" {
		stop, err := startProfile(f.cpuProf)
		if err != nil {
			return err
		}
		defer stop()
	}
	var results []*phaseResult
	for _, ph := range phases {
		r, err := runPhase(ctx, phaseSpec{
			phase: ph, workload: label, db: env, props: p,
			progress: f.progress, stderr: stderr, human: !f.jsonOut,
		})
		if r != nil {
			results = append(results, r)
		}
		if err != nil {
			if f.jsonOut {
				writeJSON(stdout, map[string]any{"phases": results, "error": err.Error()})
			}
			return err
		}
	}
	if f.jsonOut {
		return writeJSON(stdout, map[string]any{"phases": results})
	}
	return nil
}
