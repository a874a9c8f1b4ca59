package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/magiconair/properties"
	ycsbclient "github.com/pingcap/go-ycsb/pkg/client"
	"github.com/pingcap/go-ycsb/pkg/measurement"
	"github.com/pingcap/go-ycsb/pkg/prop"
	"github.com/pingcap/go-ycsb/pkg/util"
	_ "github.com/pingcap/go-ycsb/pkg/workload" // registers the core workload
	goycsb "github.com/pingcap/go-ycsb/pkg/ycsb"

	_ "github.com/pingcap/go-ycsb/db/redis" // registers "redis"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
	rdycsb "github.com/rdmakv/rdmakv/ycsb"
)

// dbEnv is the database a phase runs against: rdmakv (one binding, one
// client, shared by every phase of the process) or Redis (go-ycsb's
// binding, created per phase with that phase's threadcount, which sizes
// its connection pool).
type dbEnv struct {
	name string // rdmakv, redis or redis-sorted
	// binding is the go-ycsb DB the phases run through, as registered
	// ("": name): bench runs workload E on Redis through redis-sorted.
	binding string
	// keyspace is the rdmakv keyspace of db's operations ("": hashed).
	keyspace string
	db       *rdycsb.DB
	child    *childCluster // the embedded cluster, if any
	desc     string        // where, for the header line
}

func (e *dbEnv) close() {
	if e.db != nil {
		e.db.Close()
	}
	if e.child != nil {
		e.child.close()
	}
}

// open returns the DB of a phase with properties p, and how to release it.
func (e *dbEnv) open(p *properties.Properties) (goycsb.DB, func(), error) {
	if e.db != nil {
		return e.db, func() {}, nil
	}
	c := goycsb.GetDBCreator(e.driver())
	if c == nil {
		return nil, nil, fmt.Errorf("database %q is not registered", e.driver())
	}
	db, err := c.Create(p)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", e.driver(), err)
	}
	return db, func() { db.Close() }, nil
}

// driver is the go-ycsb DB of the phases.
func (e *dbEnv) driver() string {
	if e.binding != "" {
		return e.binding
	}
	return e.name
}

// embeddedMap is the map of an embedded cluster: groups x replicas on shm
// in shmDir ("": /dev/shm) under a name of its own (so that it never
// meets a kvserver's), and a few client slots.
func embeddedMap(groups, replicas int, shmDir string) *cluster.Map {
	m := &cluster.Map{Name: fmt.Sprintf("kvycsb-%d", os.Getpid()), Fabric: "shm", ShmDir: cmp.Or(shmDir, "/dev/shm"),
		// The ordered keyspace workload E scans (rdmakv.keyspace): 8 KiB
		// nodes, so that YCSB's default records (10 fields of 100 bytes)
		// fit in a leaf.
		Keyspaces: []cluster.Keyspace{{Name: cluster.DefaultOrderedKeyspace, Kind: cluster.KindOrdered, ID: 1, NodeSize: embeddedNodeSize}}}
	id := rdma.NodeID(1)
	for range groups {
		var ms []rdma.NodeID
		for range replicas {
			ms = append(ms, id)
			id++
		}
		m.Groups = append(m.Groups, ms)
	}
	for k := range 4 {
		m.ClientNodes = append(m.ClientNodes, rdma.NodeID(1000+k))
	}
	return m
}

// embeddedNodeSize is the node size of the embedded cluster's ordered
// keyspace.
const embeddedNodeSize = 8192

// embeddedConfig is the shape of an embedded cluster.
type embeddedConfig struct {
	groups, replicas    int
	heartbeat, election time.Duration
	spareP              string // server.ChildConfig.SpareP
	shmDir              string // the map's ShmDir ("": /dev/shm)
}

// openRdmakv opens the binding: on the cluster of the map file, or on an
// embedded cluster it starts (in a child process: cluster.go).
func openRdmakv(ctx context.Context, p *properties.Properties, embedded bool, ec embeddedConfig, stderr io.Writer) (*dbEnv, error) {
	env := &dbEnv{name: "rdmakv"}
	var opts []client.Option
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if embedded {
		start := time.Now()
		child, err := startChildCluster(octx, ec, stderr)
		if err != nil {
			return nil, fmt.Errorf("start the embedded cluster: %w", err)
		}
		env.child = child
		// The huge page mode its regions get (rdma/shm's probe of the
		// directory), and why: a reader of the rates knows whether the
		// fresh pages of the load paid 4 KiB first writes.
		hp := shm.ProbeHugePages("", child.m.ShmDir)
		env.desc = fmt.Sprintf("embedded cluster %s: %d groups x %d replicas on shm in process %d, up in %v; shm in %s, huge pages %s (%s)",
			child.m.Name, ec.groups, ec.replicas, child.cmd.Process.Pid, time.Since(start).Round(time.Millisecond), child.m.ShmDir, hp.Mode, hp.Reason)
		// kvycsb's one client takes slot 0 through the node opened for
		// it (no slot lock file to claim).
		opts = append(opts, client.WithMap(child.m), client.WithNode(child.node), client.WithSlot(0))
	} else {
		cfg, _ := rdycsb.ParseConfig(p)
		env.desc = "cluster of " + cfg.MapFile
	}
	db, err := rdycsb.Open(octx, p, opts...)
	if err != nil {
		env.close()
		if errors.Is(err, rdycsb.ErrRecordTooLarge) || errors.Is(err, client.ErrUnknownKeyspace) {
			return nil, usageError{err.Error()}
		}
		if !embedded {
			return nil, fmt.Errorf("%w (is a cluster running? `kvserver` with no arguments starts one; or use --embedded)", err)
		}
		return nil, err
	}
	env.db = db
	if cfg, err := rdycsb.ParseConfig(p); err == nil {
		env.keyspace = cfg.Keyspace
	}
	return env, nil
}

// phaseSpec is one go-ycsb phase: load or run.
type phaseSpec struct {
	phase    string // load or run
	workload string // its label (a, or the -P files)
	db       *dbEnv
	props    *properties.Properties
	progress time.Duration
	stderr   io.Writer
	human    bool // print go-ycsb's summary to stdout
	quiet    bool // no header line on stderr
}

// phaseResult is what a phase measured.
type phaseResult struct {
	DB string `json:"db"`
	// Binding is the go-ycsb DB the phase ran through: rdmakv, redis
	// (go-ycsb's, hashes) or redis-sorted (hashes and a sorted-set
	// index, for scans); Keyspace is rdmakv's ordered keyspace, if any.
	Binding  string `json:"binding"`
	Keyspace string `json:"keyspace,omitempty"`
	Workload string `json:"workload"`
	Phase    string `json:"phase"`
	Threads  int    `json:"threads"`
	Records  int64  `json:"records"`
	// Operations is how many YCSB operations ran (a read-modify-write is
	// one), failed ones included; OpsPerSec = Operations / Seconds.
	Operations  int64   `json:"operations"`
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	Errors      int64   `json:"errors"`
	Interrupted bool    `json:"interrupted,omitempty"`
	// Ops are go-ycsb's measurements per operation type (latencies in
	// microseconds).
	Ops []opStats `json:"ops,omitempty"`
	// WriteOps and WriteMessages (rdmakv) are the single-key writes the
	// client sent during the phase and the messages that carried them
	// (client.Stats): WriteOps / WriteMessages is how many writes the
	// client combined into one message.
	WriteOps      uint64 `json:"write_ops,omitempty"`
	WriteMessages uint64 `json:"write_messages,omitempty"`
	// Cluster (bench) is the embedded cluster's process during the
	// phase: stopped during Redis's phases.
	Cluster *clusterDuring `json:"cluster,omitempty"`
}

type opStats struct {
	Operation string  `json:"operation"`
	Count     int64   `json:"count"`
	OPS       float64 `json:"ops"`
	Avg       int64   `json:"avg_us"`
	Min       int64   `json:"min_us"`
	Max       int64   `json:"max_us"`
	P50       int64   `json:"p50_us"`
	P90       int64   `json:"p90_us"`
	P95       int64   `json:"p95_us"`
	P99       int64   `json:"p99_us"`
	P999      int64   `json:"p999_us"`
	P9999     int64   `json:"p9999_us"`
}

// op returns the stats of operation name, if measured.
func (r *phaseResult) op(name string) (opStats, bool) {
	for _, o := range r.Ops {
		if o.Operation == name {
			return o, true
		}
	}
	return opStats{}, false
}

// countingWorkload counts the operations the workers completed (for the
// progress lines and the overall throughput).
type countingWorkload struct {
	goycsb.Workload
	n atomic.Int64
}

func (w *countingWorkload) DoInsert(ctx context.Context, db goycsb.DB) error {
	err := w.Workload.DoInsert(ctx, db)
	w.n.Add(1)
	return err
}

func (w *countingWorkload) DoBatchInsert(ctx context.Context, n int, db goycsb.DB) error {
	err := w.Workload.DoBatchInsert(ctx, n, db)
	w.n.Add(int64(n))
	return err
}

func (w *countingWorkload) DoTransaction(ctx context.Context, db goycsb.DB) error {
	err := w.Workload.DoTransaction(ctx, db)
	w.n.Add(1)
	return err
}

func (w *countingWorkload) DoBatchTransaction(ctx context.Context, n int, db goycsb.DB) error {
	err := w.Workload.DoBatchTransaction(ctx, n, db)
	w.n.Add(int64(n))
	return err
}

// runPhase runs one phase with go-ycsb's client and measurements.
func runPhase(ctx context.Context, s phaseSpec) (*phaseResult, error) {
	p := properties.LoadMap(s.props.Map())
	doTx := s.phase == "run"
	p.Set(prop.DoTransactions, strconv.FormatBool(doTx))
	p.Set(prop.Command, s.phase)
	if doTx {
		zipfianKeyRange(p)
	}
	threads := p.GetInt(prop.ThreadCount, 1)
	total := p.GetInt64(prop.OperationCount, 0)
	if !doTx {
		total = p.GetInt64(prop.RecordCount, 0)
		if _, ok := p.Get(prop.InsertCount); ok {
			total = p.GetInt64(prop.InsertCount, 0)
		}
	}
	res := &phaseResult{DB: s.db.name, Binding: s.db.driver(), Keyspace: s.db.keyspace, Workload: s.workload, Phase: s.phase, Threads: threads, Records: p.GetInt64(prop.RecordCount, 0)}

	if s.human {
		fmt.Fprintln(os.Stdout, "***************** properties *****************")
		keys := p.Keys()
		slices.Sort(keys)
		for _, k := range keys {
			v, _ := p.Get(k)
			fmt.Fprintf(os.Stdout, "%q=%q\n", k, v)
		}
		fmt.Fprintln(os.Stdout, "**********************************************")
	}
	if !s.quiet {
		where := s.db.desc
		if isRedisDB(s.db.driver()) {
			where = p.GetString("redis.addr", "localhost:6379")
		}
		fmt.Fprintf(s.stderr, "kvycsb: %s %s: %s (%s), %d operations, %d threads\n", s.phase, s.workload, s.db.name, where, total, threads)
	}

	measurement.InitMeasure(p)
	wc := goycsb.GetWorkloadCreator(p.GetString(prop.Workload, "core"))
	w, err := wc.Create(p)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	defer w.Close()
	db, release, err := s.db.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	cw := &countingWorkload{Workload: w}
	c := ycsbclient.NewClient(p, cw, ycsbclient.DbWrapper{DB: db})

	done := make(chan struct{})
	progressDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(progressDone)
		if s.progress <= 0 {
			return
		}
		t := time.NewTicker(s.progress)
		defer t.Stop()
		last, lastT := int64(0), start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := cw.n.Load()
				rate := float64(n-last) / now.Sub(lastT).Seconds()
				pct := ""
				if total > 0 {
					pct = fmt.Sprintf("/%d (%.0f%%)", total, 100*float64(n)/float64(total))
				}
				fmt.Fprintf(s.stderr, "kvycsb: %s %s %s: %d%s ops, %.0f ops/s now, %.0f s\n", s.phase, s.workload, s.db.name, n, pct, rate, now.Sub(start).Seconds())
				last, lastT = n, now
			}
		}
	}()
	var st0 client.Stats
	if s.db.db != nil {
		st0 = s.db.db.Client().Stats()
	}
	c.Run(ctx)
	el := time.Since(start)
	if s.db.db != nil {
		st := s.db.db.Client().Stats()
		res.WriteOps, res.WriteMessages = st.WriteOps-st0.WriteOps, st.WriteMessages-st0.WriteMessages
	}
	close(done)
	<-progressDone

	res.Operations = cw.n.Load()
	res.Seconds = el.Seconds()
	res.OpsPerSec = float64(res.Operations) / el.Seconds()
	res.Interrupted = ctx.Err() != nil
	if s.human {
		fmt.Fprintln(os.Stdout, "**********************************************")
		fmt.Fprintf(os.Stdout, "Run finished, takes %s\n", el)
		if err := outputMeasurements(); err != nil {
			return res, err
		}
	}
	if p.GetString(prop.MeasurementType, prop.MeasurementTypeDefault) == "histogram" {
		ops, err := captureMeasurements(p)
		if err != nil {
			return res, err
		}
		res.Ops = ops
		for _, o := range ops {
			if strings.HasSuffix(o.Operation, "_ERROR") {
				res.Errors += o.Count
			}
		}
	}
	if s.human {
		fmt.Fprintf(os.Stdout, "[OVERALL] %s %s on %s: %d operations in %.3f s, %.1f ops/s, %d threads, %d errors\n",
			s.phase, s.workload, s.db.name, res.Operations, res.Seconds, res.OpsPerSec, threads, res.Errors)
		if res.WriteMessages > 0 {
			fmt.Fprintf(os.Stdout, "[WRITES] %d single-key writes in %d messages, %.2f per message\n",
				res.WriteOps, res.WriteMessages, float64(res.WriteOps)/float64(res.WriteMessages))
		}
	}
	if res.Interrupted {
		return res, fmt.Errorf("%s %s interrupted after %d operations", s.phase, s.workload, res.Operations)
	}
	return res, nil
}

// zipfianKeyRange works around an off-by-one of go-ycsb v1.0.1's zipfian
// key chooser: it draws from [insertstart, insertstart+insertcount] (plus
// the keys the run's inserts are expected to add), both ends included, so
// one key in about recordcount never was loaded. YCSB (Java) draws again
// when a key is past the last one inserted; go-ycsb does not, and reads
// that key: an error on rdmakv (ErrNotFound), an empty success on Redis
// (HMGET of a missing hash). Unless insertcount is set, a run phase with
// zipfian requests gets insertcount = recordcount - insertstart - 1,
// which makes the range exactly the loaded keys (insertcount only bounds
// the key range in a run phase).
func zipfianKeyRange(p *properties.Properties) {
	if p.GetString(prop.RequestDistribution, prop.RequestDistributionDefault) != "zipfian" {
		return
	}
	if _, ok := p.Get(prop.InsertCount); ok {
		return
	}
	n := p.GetInt64(prop.RecordCount, 0) - p.GetInt64(prop.InsertStart, 0) - 1
	if n > 0 {
		p.Set(prop.InsertCount, strconv.FormatInt(n, 10))
	}
}

// captureMeasurements reads go-ycsb's measurements: its output in JSON
// style, written to a temporary file.
func captureMeasurements(p *properties.Properties) ([]opStats, error) {
	dir, err := os.MkdirTemp("", "kvycsb-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "measurements.json")
	restore := setProps(p, map[string]string{
		prop.OutputStyle:                          util.OutputStyleJson,
		prop.MeasurementRawOutputFile:             file,
		prop.MeasurementHistogramPercentileExport: "false",
	})
	err = outputMeasurements()
	restore()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, nil // nothing measured
	}
	var rows []map[string]string
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, fmt.Errorf("go-ycsb's measurements: %w", err)
	}
	out := make([]opStats, 0, len(rows))
	for _, r := range rows {
		i := func(k string) int64 { n, _ := strconv.ParseInt(r[k], 10, 64); return n }
		ops, _ := strconv.ParseFloat(r["OPS"], 64)
		out = append(out, opStats{
			Operation: r["Operation"], Count: i("Count"), OPS: ops,
			Avg: i("Avg(us)"), Min: i("Min(us)"), Max: i("Max(us)"),
			P50: i("50th(us)"), P90: i("90th(us)"), P95: i("95th(us)"), P99: i("99th(us)"),
			P999: i("99.9th(us)"), P9999: i("99.99th(us)"),
		})
	}
	return out, nil
}

// setProps sets properties and returns a function that restores them.
func setProps(p *properties.Properties, kv map[string]string) func() {
	old := map[string]*string{}
	for k, v := range kv {
		if prev, ok := p.Get(k); ok {
			old[k] = &prev
		} else {
			old[k] = nil
		}
		p.Set(k, v)
	}
	return func() {
		for k, v := range old {
			if v == nil {
				p.Delete(k)
			} else {
				p.Set(k, *v)
			}
		}
	}
}

// redirectStdout points os.Stdout, which go-ycsb prints to, at f.
func redirectStdout(f *os.File) func() {
	old := os.Stdout
	os.Stdout = f
	return func() { os.Stdout = old }
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// outputMeasurements is measurement.Output, which panics when it cannot
// write (stdout closed: kvycsb | head -1), with that as an error, so that
// kvycsb still closes its embedded cluster and says what happened in one
// line.
func outputMeasurements() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("write the measurements: %v", r)
		}
	}()
	measurement.Output()
	return nil
}
