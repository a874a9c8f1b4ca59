package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

const recoverUsage = `usage: kvbench recover [flags]

Measures a durable cluster's restart from its disk: kvserver's embedded
cluster (what 'make run' starts; kvserver built with go build, or
--kvserver FILE) with --groups groups x 3 replicas on shm, --durability
sync or async, its data in a fresh directory under $TMPDIR (put $TMPDIR
on the disk to measure; removed at the end). 16-byte keys, --value-size
byte values; raw = key + value bytes.

The run:
  1. start with --snapshot-log-bytes 1024MiB (no disk snapshot for up to
     1 GiB of log per replica), load --records keys (batches of as many
     puts as fit one request slot, 8 goroutines), stop it as Ctrl-C does
     (SIGINT), and measure the data dir: the log alone.
  2. start it again with --snapshot-log-bytes 1MiB: the "log" row's
     recovery. Once every replica holds every record and the pollers are
     quiet (2.5 s), overwrite loaded keys until every replica has taken a
     disk snapshot (it snapshots after 1 MiB of new log), stop, and
     measure the data dir: a snapshot and the log after it.
  3. start it again: the "snapshot" row's recovery.

Columns (one row per restart):
  recover     from starting kvserver to every replica holding every
              record it held before the stop (/status records, polled
              every 10 ms)
  up          from starting kvserver to its "is up" line (every group
              elected a leader)
  replica     the longest replica's own recovery figure (/status
              disk.recovery_seconds: reading the snapshot and the log and
              replaying them, as its "recovered ... in Ns" log line says;
              the line of the slowest replica is printed under the row)
  disk/rec    bytes the data dir holds on disk (allocated blocks: the
              log's segments are preallocated) per record and copy:
              size / (records x 3 replicas); log: after step 1 (log
              only), snapshot: after step 2 (a snapshot and the log after
              it). x raw: disk/rec / raw (issue 19's target: <= 2 after
              a snapshot)
  poll max    the longest poller pass (/status pollers
              pass_max_recent_us, sampled every 250 ms; a pass polls every
              replica of the poller once, so it is the longest a leader
              waited for its next Poll while busy): log: during step 1's
              load, from 2.5 s after the start; snapshot: from the first
              overwrite of step 2 until 1.5 s after every replica's
              snapshot was durable. ET/20 is issue 19's bound
              (--election-timeout / 20)
  put         from starting kvserver to a put acknowledged by every
              group (one put a group, from a client opened after "is
              up"): what a user waits for
  save max    the longest pass of a leader's poller that overlapped a
              disk snapshot's save, from its capture until its files
              are durable (/status pollers save_pass_max_us): issue
              19's bound is on these passes (ET/20); over: how many of
              those passes (after the slash) were longer than ET/20
  capture     the disk snapshot captures on the pollers in the same
              sampling (/status disk): the longest one's wall time, and
              after the slash the most CPU time one took on its polling
              thread, its own work (the rest of the wall time it waited
              for a processor: Go's scheduler or the OS)

--json prints one object per row with these figures and the recovery
line, the data dir's log and snapshot bytes apart (wal_bytes,
snap_bytes), the load's time, the longest replica Poll with a capture
that the sampling saw with its capture's wall and CPU time
(capture_poll_*), the longest replica Poll that overlapped a save
(save_poll), a restart's phases from starting kvserver (start_s:
StartProcess called, opened_s: every node open, built_s: every replica
built, its recovery, polled_s: every replica polled, then up_s and
first_put_s), each replica's recovery (replica_s) and the longest
reading part of one (replica_read_max_s), the load's batches retried
after a client deadline (load_retries), and the runtime's longest
scheduling latency (sched_latency_max_us).

--rounds N restarts kvserver N more times from the log after step 1
and N more from the snapshot after step 2 (rows log-a, snapshot-a); with
--compare B each round restarts --kvserver (A) and B, alternated (A
first in even rounds), in the same minutes (rows log-a, log-b,
snapshot-a, snapshot-b): an A/B of the recovery on a shared machine.

--kvserver-args "FLAGS" passes more flags to every kvserver start, e.g.
the save gate's A/B in two runs of one binary: --kvserver K, then
--kvserver K --kvserver-args=--saves-at-once (each saves at once).

--trace FILE records a Go execution trace of kvserver over the first
--trace-for of the overwrites (go tool trace FILE): which goroutines held
the processors while a poller waited.

Example:
  kvbench recover --records 1000000 --value-size 100 --durability sync

flags:
`

// recoverFlags are kvbench recover's options.
type recoverFlags struct {
	records    int
	groups     int
	durability string
	kvserver   string
	// walLayout and spareP are kvserver's --wal-layout and --spare-p
	// ("": not passed)
	walLayout, spareP string
	et                time.Duration
	shmDir            string
	json              bool
	quick             bool
	// trace: a Go execution trace of kvserver over the first
	// traceFor of step 2's overwrites (its disk snapshots) goes there.
	trace    string
	traceFor time.Duration
	// compare is a second kvserver binary (B) and rounds the restart
	// pairs of A and B measured from the log (after step 1) and from
	// the snapshot (after step 2).
	compare string
	rounds  int
	// kvserverArgs are more kvserver flags for every start (A and B):
	// --kvserver-args, split on spaces.
	kvserverArgs []string
	// keep: copies of the data dir after step 1 (keep/log) and step 2
	// (keep/snapshot) go there, for restarts by hand (profiles)
	keep string
}

// recoverRow is one restart of kvbench recover.
type recoverRow struct {
	Row           string  `json:"row"`              // log or snapshot
	Binary        string  `json:"binary,omitempty"` // --rounds' rows: a (--kvserver) or b (--compare)
	Durability    string  `json:"durability"`
	KVServerArgs  string  `json:"kvserver_args,omitempty"` // --kvserver-args
	Records       int     `json:"records"`
	ValueSize     int     `json:"value_size"`
	Groups        int     `json:"groups"`
	RecoverS      float64 `json:"recover_s"`
	UpS           float64 `json:"up_s"`
	ReplicaMaxS   float64 `json:"replica_recovery_max_s"`
	Recovery      string  `json:"recovery"` // the slowest replica's recovery line
	DiskBytes     int64   `json:"disk_bytes"`
	WALBytes      int64   `json:"wal_bytes"`
	SnapBytes     int64   `json:"snap_bytes"`
	DiskPerRecord float64 `json:"disk_bytes_per_record"`
	RawPerRecord  int     `json:"raw_bytes_per_record"`
	DiskXRaw      float64 `json:"disk_x_raw"`
	PollMaxUS     float64 `json:"poll_max_us"`
	ETOver20US    float64 `json:"et_over_20_us"`
	// The disk snapshots' captures on the pollers while the row's
	// sampling ran (snapshot row; /status disk): how many, the longest
	// one's wall time and the most CPU time one took on its polling
	// thread (the maxima count from kvserver's start: the sampling's, as
	// no capture runs before it) (its own work; the rest of the wall time it waited for a
	// processor). CapturePoll is the longest replica Poll with a capture
	// that the sampling saw (/status poll_max_recent; zero if every
	// window's longest Poll was another), with its capture's wall and
	// CPU time and the table's index copy in it.
	Captures         uint64  `json:"captures"`
	CaptureMaxUS     float64 `json:"capture_max_us"`
	CaptureCPUMaxUS  float64 `json:"capture_cpu_max_us"`
	CapturePollUS    float64 `json:"capture_poll_us"`
	CapturePollCapUS float64 `json:"capture_poll_capture_us"`
	CapturePollCPUUS float64 `json:"capture_poll_capture_cpu_us"`
	CapturePollIdxUS float64 `json:"capture_poll_index_us"`
	// The save passes (/status pollers save_*): the passes of a
	// leader's poller that overlapped a disk snapshot's save (from its
	// capture until its files are durable) in the row's sampling, how
	// many were longer than ET/20, and the longest (the pollers' count
	// from kvserver's start: no save runs before the sampling in
	// kvbench recover's steps). SavePoll is the longest replica Poll
	// that overlapped a save, and what it did (/status poll_max_saving).
	SavePasses     uint64            `json:"save_passes"`
	SavePassesOver uint64            `json:"save_passes_over"`
	SavePassMaxUS  float64           `json:"save_pass_max_us"`
	SavePoll       server.PollDetail `json:"save_poll"`
	// SavePollRead is the longest replica Poll in a save whose thread
	// was read (/status poll_max_saving_read): its CPU, run delay, the
	// rest, faults and switches (thread_*).
	SavePollRead server.PollDetail `json:"save_poll_read"`
	// A restart's phases, from starting kvserver (restart rows; seconds):
	// StartProcess called (StartS: kvserver's own setup before it), every
	// node opened, every replica built (their recoveries, RecoverWorkers
	// at once, default two), every replica polled, kvserver's
	// "is up" (UpS), and a put to every group acknowledged (FirstPutS,
	// a put per group from a client opened after "is up": what a user
	// waits for). ReplicaS are the replicas' own recovery times (map
	// order), ReplicaReadMaxS the longest reading part of one (log and
	// snapshot read and checked; the rest is the replay).
	StartS          float64   `json:"start_s,omitempty"`
	OpenedS         float64   `json:"opened_s,omitempty"`
	BuiltS          float64   `json:"built_s,omitempty"`
	PolledS         float64   `json:"polled_s,omitempty"`
	FirstPutS       float64   `json:"first_put_s,omitempty"`
	ReplicaS        []float64 `json:"replica_s,omitempty"`
	ReplicaReadMaxS float64   `json:"replica_read_max_s,omitempty"`
	// LoadRetries counts the load's batches retried after a client
	// deadline (on a loaded machine; the batch puts the same values
	// again).
	LoadRetries int64 `json:"load_retries,omitempty"`
	// SchedLatencyMaxUS is the longest a runnable goroutine of kvserver
	// waited for a processor while the row's sampling ran (/status
	// runtime.sched_latency_max_us, a histogram bucket's bound).
	SchedLatencyMaxUS float64 `json:"sched_latency_max_us"`
	LoadS             float64 `json:"load_s"` // log: step 1's load; snapshot: step 2's overwrites
	FS                string  `json:"fs"`
}

func parseRecoverFlags(args []string, stderr io.Writer) (*recoverFlags, error) {
	o := &recoverFlags{}
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, recoverUsage)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.records, "records", 1000000, "keys loaded before the first stop")
	fs.IntVar(&kvValueSize, "value-size", 100, "bytes per value (at least the 16-byte key, which each value starts with)")
	fs.IntVar(&o.groups, "groups", 2, "the embedded cluster's groups of 3 replicas (kvserver --groups)")
	fs.StringVar(&o.durability, "durability", "sync", "kvserver --durability: sync or async")
	fs.StringVar(&o.kvserver, "kvserver", "", "the kvserver `binary` to run (default: go build it from this module)")
	fs.StringVar(&o.walLayout, "wal-layout", "", "kvserver --wal-layout of the data dir's first start: per-replica or shared (default: not passed, so kvserver's default: shared)")
	fs.StringVar(&o.spareP, "spare-p", "", "kvserver --spare-p: auto or off (default: not passed, auto)")
	fs.DurationVar(&o.et, "election-timeout", 150*time.Millisecond, "kvserver --election-timeout (ET/20 is the poll max's bound)")
	fs.StringVar(&o.shmDir, "shm-dir", "/dev/shm", "directory for the cluster's shared-memory files (kvbench's work directory in it, removed at the end)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per row instead of a table")
	fs.BoolVar(&o.quick, "quick", false, "a smoke test: 20,000 records (unless --records is given)")
	fs.StringVar(&o.trace, "trace", "", "write a Go execution trace of kvserver (its /debug/pprof/trace, kvserver --pprof) over the first --trace-for of step 2's overwrites, where the disk snapshots are captured, to `FILE` (go tool trace FILE)")
	fs.DurationVar(&o.traceFor, "trace-for", 5*time.Second, "how long --trace records")
	fs.StringVar(&o.compare, "compare", "", "a second kvserver `binary` (B) for --rounds' A/B restarts")
	fs.Func("kvserver-args", "more kvserver `flags` for every start of --kvserver (and --compare), split on spaces, e.g. --kvserver-args=--saves-at-once: the save gate's A/B is two runs of one binary, with and without it", func(v string) error {
		o.kvserverArgs = append(o.kvserverArgs, strings.Fields(v)...)
		return nil
	})
	fs.StringVar(&o.keep, "keep", "", "copy the data dir after step 1 to `DIR`/log and after step 2 to DIR/snapshot (DIR must not hold them), for restarts by hand, e.g. under perf")
	fs.IntVar(&o.rounds, "rounds", 0, "restart pairs of --kvserver (A) and --compare (B), alternated, measured from the log after step 1 and from the snapshot after step 2 (rows log-a, log-b, snapshot-a, snapshot-b; without --compare, restarts of A alone)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick && !set["records"] {
		o.records = 20000
	}
	switch {
	case o.records <= 0 || o.groups <= 0:
		return nil, fmt.Errorf("--records %d --groups %d: want both positive", o.records, o.groups)
	case o.durability != "sync" && o.durability != "async":
		return nil, fmt.Errorf("--durability %q: want sync or async (memory keeps nothing to recover)", o.durability)
	case kvValueSize < kvKeySize || kvValueSize > 1<<20:
		return nil, fmt.Errorf("--value-size %d: want %d to %d bytes", kvValueSize, kvKeySize, 1<<20)
	case o.et <= 0:
		return nil, errors.New("--election-timeout must be positive")
	case o.rounds < 0:
		return nil, fmt.Errorf("--rounds %d: want 0 or more", o.rounds)
	case o.walLayout != "" && cluster.CheckWALLayout(o.walLayout) != nil:
		return nil, fmt.Errorf("--wal-layout %v", cluster.CheckWALLayout(o.walLayout))
	case o.spareP != "" && cluster.CheckSpareP(o.spareP) != nil:
		return nil, fmt.Errorf("--spare-p %v", cluster.CheckSpareP(o.spareP))
	}
	return o, nil
}

func runRecover(args []string, stdout, stderr io.Writer) error {
	o, err := parseRecoverFlags(args, stderr)
	if err != nil {
		return err
	}
	bin, cleanup, err := kvserverBinary("recover", true, o.kvserver, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	sweepShmDir(o.shmDir, stderr)
	wd, err := workDir(o.shmDir)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "kvbench-recover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	r := &recoverRun{o: o, bin: bin, wd: wd, data: filepath.Join(tmp, "data"), stderr: stderr,
		name: fmt.Sprintf("kvbench-rec-%d-%x", os.Getpid(), time.Now().UnixNano()&0xffffffff)}
	if r.fs, err = fsTypeOf(tmp); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "kvbench recover: %d records of %d+%d B, durability %s, %d x 3 replicas, data in %s (%s); load average %s\n",
		o.records, kvKeySize, kvValueSize, o.durability, o.groups, r.data, r.fs, loadAvg())
	rows, err := r.run()
	if err != nil {
		return err
	}
	return emitRows("recover", stdout, stderr, rows, o.json, func() { printRecoverTable(stdout, rows, o, r) }, nil)
}

// recoverRun is one kvbench recover run.
type recoverRun struct {
	o      *recoverFlags
	bin    string
	wd     string // shm files and the map
	data   string // kvserver --data-dir
	name   string
	fs     string
	stderr io.Writer

	retries atomic.Int64 // the loads' batches retried (write)
	srv     *kvserverProc
	control string         // the running kvserver's control address
	want    map[uint64]int // node -> records it held before the last stop
}

func (r *recoverRun) note(f string, a ...any) {
	fmt.Fprintf(r.stderr, "kvbench recover: "+f+"\n", a...)
}

func (r *recoverRun) run() (rows []recoverRow, err error) {
	o := r.o
	defer func() {
		if r.srv != nil {
			r.srv.kill()
		}
	}()
	raw := kvKeySize + kvValueSize
	row := func(name string) recoverRow {
		return recoverRow{Row: name, Durability: o.durability, KVServerArgs: strings.Join(o.kvserverArgs, " "), Records: o.records, ValueSize: kvValueSize, Groups: o.groups,
			RawPerRecord: raw, ETOver20US: float64(o.et.Microseconds()) / 20, FS: r.fs}
	}
	logRow, snapRow := row("log"), row("snapshot")

	// 1. Load, with no disk snapshot.
	if _, err := r.start("1024MiB", ""); err != nil {
		return nil, err
	}
	c, m, err := r.open()
	if err != nil {
		return nil, err
	}
	upAt := time.Now()
	var stopSampling func() pollSample
	t0 := time.Now()
	err = r.write(c, m, o.records, func(done int) bool {
		if stopSampling == nil && time.Since(upAt) > 2500*time.Millisecond {
			stopSampling = r.samplePollMax()
		}
		return done >= o.records
	})
	logRow.LoadS, logRow.LoadRetries = time.Since(t0).Seconds(), r.retries.Swap(0)
	if stopSampling != nil {
		stopSampling().fill(&logRow)
	}
	c.Close()
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	r.note("loaded %d keys in %.1fs", o.records, logRow.LoadS)
	if err := r.stop(); err != nil {
		return nil, err
	}
	if logRow.DiskBytes, logRow.WALBytes, logRow.SnapBytes, err = dataDirBytes(r.data); err != nil {
		return nil, err
	}
	if err := r.keep("log"); err != nil {
		return nil, err
	}
	extra, err := r.rounds("log", row)
	if err != nil {
		return nil, err
	}

	// 2. Recover from the log; then snapshot.
	if err := r.restart(&logRow, "1MiB"); err != nil {
		return nil, err
	}
	time.Sleep(2500 * time.Millisecond) // the pollers' recent max forgets the recovery's passes
	c, m, err = r.open()
	if err != nil {
		return nil, err
	}
	stopSampling = r.samplePollMax()
	stopTrace := r.startTrace()
	t0 = time.Now()
	var snapped, checked time.Time
	var serr error
	limit := 4*o.records + (64<<20)/raw // far more than 1 MiB of log per replica
	err = r.write(c, m, o.records, func(done int) bool {
		if time.Since(checked) >= 200*time.Millisecond {
			checked = time.Now()
			var ok bool
			if ok, serr = r.allSnapshotted(); ok {
				snapped = checked
			}
		}
		return !snapped.IsZero() || serr != nil || done >= limit || time.Since(t0) > 10*time.Minute
	})
	snapRow.LoadS, snapRow.LoadRetries = time.Since(t0).Seconds(), r.retries.Swap(0)
	c.Close()
	if err == nil && serr != nil {
		err = serr
	}
	if err == nil && snapped.IsZero() {
		err = fmt.Errorf("no disk snapshot on every replica after %.1fs of overwrites", snapRow.LoadS)
	}
	if err != nil {
		stopSampling()
		stopTrace()
		return nil, fmt.Errorf("overwrites until a snapshot: %w", err)
	}
	time.Sleep(1500 * time.Millisecond) // the log dropped behind it; the last passes sampled
	stopSampling().fill(&snapRow)
	if err := stopTrace(); err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	r.note("every replica took a disk snapshot after %.1fs of overwrites", snapRow.LoadS)
	if err := r.stop(); err != nil {
		return nil, err
	}
	if snapRow.DiskBytes, snapRow.WALBytes, snapRow.SnapBytes, err = dataDirBytes(r.data); err != nil {
		return nil, err
	}
	if err := r.keep("snapshot"); err != nil {
		return nil, err
	}
	more, err := r.rounds("snapshot", row)
	if err != nil {
		return nil, err
	}
	extra = append(extra, more...)

	// 3. Recover from the snapshot.
	if err := r.restart(&snapRow, "1024MiB"); err != nil {
		return nil, err
	}
	if err := r.stop(); err != nil {
		return nil, err
	}
	rows = append([]recoverRow{logRow, snapRow}, extra...)
	for k := range rows {
		x := &rows[k]
		x.DiskPerRecord = float64(x.DiskBytes) / float64(o.records*kvReplicas)
		x.DiskXRaw = x.DiskPerRecord / float64(raw)
	}
	return rows, nil
}

// rounds restarts kvserver --rounds times from the data dir as it is
// (name: log or snapshot), alternating --kvserver (A) and --compare (B)
// in each round (A first in even rounds, B first in odd ones), and
// returns a row per restart. --snapshot-log-bytes is 1 GiB, so that no
// restart takes a disk snapshot the next one would start from.
func (r *recoverRun) rounds(name string, row func(string) recoverRow) ([]recoverRow, error) {
	type bin struct{ label, path string }
	bins := []bin{{"a", r.bin}}
	if r.o.compare != "" {
		bins = append(bins, bin{"b", r.o.compare})
	}
	defer func(a string) { r.bin = a }(r.bin)
	var rows []recoverRow
	for round := range r.o.rounds {
		for k := range bins {
			b := bins[(k+round)%len(bins)]
			r.bin = b.path
			x := row(name)
			x.Row, x.Binary = name+"-"+b.label, b.label
			var err error
			if x.DiskBytes, x.WALBytes, x.SnapBytes, err = dataDirBytes(r.data); err != nil {
				return nil, err
			}
			r.note("round %d: %s", round+1, b.path)
			if err := r.restart(&x, "1024MiB"); err != nil {
				return nil, err
			}
			if err := r.stop(); err != nil {
				return nil, err
			}
			rows = append(rows, x)
		}
	}
	return rows, nil
}

// keep copies the data dir to --keep's name (a stopped kvserver's).
func (r *recoverRun) keep(name string) error {
	if r.o.keep == "" {
		return nil
	}
	dst := filepath.Join(r.o.keep, name)
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("--keep: %s exists", dst)
	}
	if err := os.MkdirAll(r.o.keep, 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", r.data, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("--keep: cp: %v: %s", err, out)
	}
	r.note("data dir kept in %s", dst)
	return nil
}

// freeControl returns a free loopback address for kvserver's control
// port.
func freeControl() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// start runs kvserver on the data dir with --snapshot-log-bytes snapLog
// and its control port on control ("": a free one), and returns when it
// is up, with the time it was started.
func (r *recoverRun) start(snapLog, control string) (time.Time, error) {
	if control == "" {
		var err error
		if control, err = freeControl(); err != nil {
			return time.Time{}, err
		}
	}
	r.control = control
	mapFile := filepath.Join(r.wd, r.name+".map.json")
	args := []string{"--groups", strconv.Itoa(r.o.groups), "--replicas", "3", "--name", r.name,
		"--map", mapFile, "--shm-dir", r.wd, "--control", control, "--election-timeout", r.o.et.String(),
		"--durability", r.o.durability, "--data-dir", r.data, "--snapshot-log-bytes", snapLog}
	if kvserverHasFlag(r.bin, "save-poll-detail") { // kvservers before it have no such flag
		args = append(args, "--save-poll-detail")
	}
	args = append(args, settingArgs(r.o.walLayout, r.o.spareP)...)
	args = append(args, r.o.kvserverArgs...)
	if r.o.trace != "" {
		args = append(args, "--pprof")
	}
	t0 := time.Now()
	// A durable restart is up once every replica replayed its data,
	// two at a time (RecoverWorkers): one at a time, 1 M records from the log
	// took 150-280 s at load 18-28 (2 cores), far past the 60 s other
	// subcommands give a fresh cluster. The same bound as restart's
	// wait for the records.
	srv, err := runKVServer(r.bin, mapFile, "", args, recoverUpWithin)
	if err != nil {
		return t0, err
	}
	r.srv = srv
	return t0, nil
}

// recoverUpWithin bounds a kvserver start of kvbench recover (a restart
// replays every replica's snapshot and log before it is up).
const recoverUpWithin = 10 * time.Minute

// restart starts kvserver again (--snapshot-log-bytes snapLog) and fills
// x's recovery figures: the time to every replica holding what it held
// before the stop.
func (r *recoverRun) restart(x *recoverRow, snapLog string) error {
	control, err := freeControl()
	if err != nil {
		return err
	}
	type result struct {
		at  time.Time
		st  server.ProcessStatus
		err error
	}
	t0 := time.Now()
	done := make(chan result, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// from kvserver's start: the control port answers once the
		// replicas are made, their recovery done
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := getStatus(control)
			if err == nil && r.applied(st) {
				done <- result{at: time.Now(), st: st}
				return
			}
			if time.Since(t0) > recoverUpWithin+time.Minute {
				done <- result{err: fmt.Errorf("replicas not back to their records in %v (last: %v)", recoverUpWithin+time.Minute, err)}
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	start, err := r.start(snapLog, control)
	if err != nil {
		return err
	}
	up := time.Since(start)
	var res result
	select {
	case res = <-done:
	case <-runCtx.Done():
		return errStopping
	}
	if res.err != nil {
		return res.err
	}
	x.RecoverS, x.UpS = res.at.Sub(start).Seconds(), up.Seconds()
	for _, rep := range res.st.Replicas {
		if d := rep.Disk; d != nil {
			x.ReplicaS = append(x.ReplicaS, d.RecoverySeconds)
			x.ReplicaReadMaxS = max(x.ReplicaReadMaxS, d.RecoveryReadSeconds)
			if d.RecoverySeconds >= x.ReplicaMaxS {
				x.ReplicaMaxS, x.Recovery = d.RecoverySeconds, d.Recovery
			}
		}
	}
	if ps := res.st.Start; ps != nil {
		x.StartS = ps.Began.Sub(start).Seconds()
		x.OpenedS, x.BuiltS, x.PolledS = x.StartS+ps.OpenedSeconds, x.StartS+ps.BuiltSeconds, x.StartS+ps.PolledSeconds
	}
	put, err := r.firstPut()
	if err != nil {
		return fmt.Errorf("%s: the first puts: %w", x.Row, err)
	}
	x.FirstPutS = put.Sub(start).Seconds()
	r.note("%s: StartProcess at %.2fs, nodes open %.2fs, replicas built %.2fs, polled %.2fs, every replica back %.2fs, up %.2fs, a put to every group %.2fs; slowest replica: %s (reading %.2fs of the longest read)",
		x.Row, x.StartS, x.OpenedS, x.BuiltS, x.PolledS, x.RecoverS, x.UpS, x.FirstPutS, x.Recovery, x.ReplicaReadMaxS)
	return nil
}

// firstPut opens a client on the running kvserver and puts one key into
// every group, retrying each until it is acknowledged (a minute at
// most), and returns when the last was.
func (r *recoverRun) firstPut() (time.Time, error) {
	c, m, err := r.open()
	if err != nil {
		return time.Time{}, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(runCtx, time.Minute)
	defer cancel()
	todo := map[uint32]bool{}
	for g := range m.Groups {
		todo[uint32(g)] = true
	}
	key := make([]byte, kvKeySize)
	val := make([]byte, kvValueSize)
	for i := 0; len(todo) > 0; i++ {
		// keys past the loaded ones: the row's records stay as they were
		fillKey(key, r.o.records+i)
		g := m.GroupOf(key)
		if !todo[g] {
			continue
		}
		fillValue(val, key, 'p')
		for {
			_, err := c.Put(ctx, key, val)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return time.Time{}, fmt.Errorf("group %d: %w", g, err)
			}
			time.Sleep(time.Millisecond)
		}
		delete(todo, g)
	}
	return time.Now(), nil
}

// applied reports whether every replica of st holds the records it held
// before the last stop (r.want).
func (r *recoverRun) applied(st server.ProcessStatus) bool {
	if len(st.Replicas) != len(r.want) {
		return false
	}
	for _, rep := range st.Replicas {
		if rep.Records < r.want[uint64(rep.Node)] {
			return false
		}
	}
	return true
}

// stop records what every replica holds (r.want) and stops kvserver as
// Ctrl-C does.
func (r *recoverRun) stop() error {
	st, err := getStatus(r.control)
	if err != nil {
		return fmt.Errorf("status before the stop: %w", err)
	}
	r.want = map[uint64]int{}
	for _, rep := range st.Replicas {
		r.want[uint64(rep.Node)] = rep.Records
	}
	srv := r.srv
	r.srv = nil
	return srv.close()
}

// allSnapshotted reports whether every replica has a durable disk
// snapshot.
func (r *recoverRun) allSnapshotted() (bool, error) {
	st, err := getStatus(r.control)
	if err != nil {
		return false, err
	}
	for _, rep := range st.Replicas {
		if rep.Disk == nil || rep.Disk.SnapshotIndex == 0 {
			return false, nil
		}
	}
	return len(st.Replicas) > 0, nil
}

// pollSample is what samplePollMax saw.
type pollSample struct {
	passMax    float64           // the pollers' longest pass (µs)
	capPoll    server.PollDetail // the longest replica Poll with a capture
	captures   uint64            // captures in the sampling (all replicas)
	capMax     float64           // the longest capture (µs)
	capCPUMax  float64           // the most CPU a capture took (µs)
	schedLatUs float64           // runtime.sched_latency_max_us
	// the save passes in the sampling (counts: last - first; the
	// longest: since kvserver's start) and the longest replica Poll in
	// a save
	savePasses, saveOver uint64
	saveMax              float64
	savePoll             server.PollDetail
	saveRead             server.PollDetail // the longest replica Poll in a save with its thread's counters
}

// fill sets x's poll and capture figures.
func (s pollSample) fill(x *recoverRow) {
	x.PollMaxUS, x.Captures, x.CaptureMaxUS, x.CaptureCPUMaxUS = s.passMax, s.captures, s.capMax, s.capCPUMax
	x.CapturePollUS, x.CapturePollCapUS, x.CapturePollCPUUS, x.CapturePollIdxUS = s.capPoll.Us, s.capPoll.CaptureUs, s.capPoll.CaptureCPUUs, s.capPoll.IndexUs
	x.SchedLatencyMaxUS = s.schedLatUs
	x.SavePasses, x.SavePassesOver, x.SavePassMaxUS, x.SavePoll = s.savePasses, s.saveOver, s.saveMax, s.savePoll
	x.SavePollRead = s.saveRead
}

// samplePollMax samples the pollers' pass_max_recent_us and the
// replicas' longest Polls every 250 ms until the returned function is
// called, which returns the largest, and the captures since the call.
func (r *recoverRun) samplePollMax() func() pollSample {
	var mu sync.Mutex
	best := 0.0
	// Each replica's capture counters at the start and end (they count
	// from the process's start: the maxima at the end are the sampling's
	// when no capture ran before it, as in kvbench recover's steps).
	capsAt := map[rdma.NodeID]uint64{}
	var first, last server.ProcessStatus
	firstOK := false
	var worst, worstCap server.PollDetail // the longest replica Poll seen (and with a capture), and whose
	var who, whoCap string
	var rt server.RuntimeStatus // the longest runtime pauses seen
	stop := make(chan struct{})
	var wg sync.WaitGroup
	sample := func() {
		if st, err := getStatus(r.control); err == nil {
			mu.Lock()
			if !firstOK {
				first, firstOK = st, true
			}
			last = st
			for _, p := range st.Pollers {
				best = max(best, p.PassMaxRecentUs)
			}
			for _, rep := range st.Replicas {
				if d := rep.PollMaxRecent; d.Us > worst.Us {
					worst, who = d, fmt.Sprintf("group %d replica %d (%s)", rep.Group, rep.Index, rep.Role)
				}
				if d := rep.PollMaxRecent; d.Captures > 0 && d.Us > worstCap.Us {
					worstCap, whoCap = d, fmt.Sprintf("group %d replica %d (%s)", rep.Group, rep.Index, rep.Role)
				}
			}
			x := st.Runtime
			rt.GCStopMaxUs, rt.GCPauseMaxUs = max(rt.GCStopMaxUs, x.GCStopMaxUs), max(rt.GCPauseMaxUs, x.GCPauseMaxUs)
			rt.OtherStopMaxUs, rt.OtherPauseMaxUs = max(rt.OtherStopMaxUs, x.OtherStopMaxUs), max(rt.OtherPauseMaxUs, x.OtherPauseMaxUs)
			rt.SchedLatencyMaxUs = max(rt.SchedLatencyMaxUs, x.SchedLatencyMaxUs)
			mu.Unlock()
		}
	}
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	})
	sample()
	return func() pollSample {
		close(stop)
		wg.Wait()
		sample()
		mu.Lock()
		defer mu.Unlock()
		res := pollSample{passMax: best, capPoll: worstCap, schedLatUs: rt.SchedLatencyMaxUs}
		for _, rep := range first.Replicas {
			if rep.Disk != nil {
				capsAt[rep.Node] = rep.Disk.Captures
			}
		}
		for _, x := range first.Pollers {
			res.savePasses -= x.SavePasses
			res.saveOver -= x.SavePassesOver
		}
		whoSave := ""
		for _, x := range last.Pollers {
			res.savePasses += x.SavePasses
			res.saveOver += x.SavePassesOver
			res.saveMax = max(res.saveMax, x.SavePassMaxUs)
		}
		whoRead := ""
		for _, rep := range last.Replicas {
			if d := rep.PollMaxSaving; d.Us > res.savePoll.Us {
				res.savePoll, whoSave = d, fmt.Sprintf("group %d replica %d (%s)", rep.Group, rep.Index, rep.Role)
			}
			if d := rep.PollMaxSavingRead; d.Us > res.saveRead.Us {
				res.saveRead, whoRead = d, fmt.Sprintf("group %d replica %d (%s)", rep.Group, rep.Index, rep.Role)
			}
		}
		if res.savePasses > 0 {
			b, _ := json.Marshal(res.savePoll)
			r.note("%d save passes (a leader's poller's passes during a disk snapshot's save), %d over ET/20, the longest %.1f ms; the longest replica Poll in a save: %s: %s",
				res.savePasses, res.saveOver, res.saveMax/1e3, whoSave, b)
			if line := threadLine(res.saveRead); line != "" {
				r.note("the longest replica Poll in a save whose thread was read (one that started in a save): %s: %s", whoRead, line)
			}
		}
		for _, rep := range last.Replicas {
			if d := rep.Disk; d != nil && d.Captures > capsAt[rep.Node] {
				res.captures += d.Captures - capsAt[rep.Node]
				res.capMax, res.capCPUMax = max(res.capMax, d.CaptureMaxUs), max(res.capCPUMax, d.CaptureCPUMaxUs)
			}
		}
		if worst.Us > 0 {
			b, _ := json.Marshal(worst)
			r.note("longest replica poll: %s: %s", who, b)
		}
		if worstCap.Us > 0 {
			b, _ := json.Marshal(worstCap)
			r.note("longest replica poll with a capture: %s: %s", whoCap, b)
		}
		b, _ := json.Marshal(rt)
		r.note("longest runtime pauses: %s", b)
		if res.captures > 0 {
			r.note("%d disk snapshot captures: the longest %.1f ms, the most CPU one took on its polling thread %.1f ms", res.captures, res.capMax/1e3, res.capCPUMax/1e3)
		}
		return res
	}
}

// startTrace starts reading a Go execution trace of kvserver for
// --trace-for into --trace (none without --trace); the function it
// returns waits for it to be written.
func (r *recoverRun) startTrace() func() error {
	if r.o.trace == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	url := fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%g", r.control, r.o.traceFor.Seconds())
	go func() {
		done <- func() error {
			resp, err := http.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", url, resp.Status)
			}
			f, err := os.Create(r.o.trace)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}()
	}()
	return func() error {
		err := <-done
		if err == nil {
			r.note("execution trace of the first %v of the overwrites in %s", r.o.traceFor, r.o.trace)
		}
		return err
	}
}

var statusClient = &http.Client{Timeout: time.Minute}

// getStatus reads /status of the control port at addr.
func getStatus(addr string) (server.ProcessStatus, error) {
	var st server.ProcessStatus
	resp, err := statusClient.Get("http://" + addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// open opens a client on the running kvserver's map file.
func (r *recoverRun) open() (*client.Client, *cluster.Map, error) {
	ctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
	defer cancel()
	c, err := client.Open(ctx, client.WithMapFile(r.srv.mapFile))
	if err != nil {
		return nil, nil, err
	}
	m, err := cluster.Load(r.srv.mapFile)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, m, nil
}

// loadRetries bounds the retries of one batch that a client deadline
// failed (its outcome unknown, or not sent: no leader yet).
const loadRetries = 10

// write puts keys 0..records-1 (again and again) in batches that fit one
// request slot, on kvLoaders goroutines, until enough (called after every
// batch with the keys written so far, from one goroutine at a time) says
// so.
func (r *recoverRun) write(c *client.Client, m *cluster.Map, records int, enough func(done int) bool) error {
	s := &rdmakvStore{c: c, ctx: runCtx}
	batch := loadBatch(m.Limits.SlotSize, m.Limits.MaxBatch)
	nb := (records + batch - 1) / batch
	var next, written atomic.Int64
	var stopped atomic.Bool
	var mu sync.Mutex
	errs := make([]error, kvLoaders)
	var wg sync.WaitGroup
	lastNote := time.Now()
	for j := range kvLoaders {
		wg.Go(func() {
			for !stopped.Load() {
				b := int(next.Add(1)-1) % nb
				first := b * batch
				n := min(batch, records-first)
				err := s.writeBatch(j, first, n)
				for try := 1; err != nil && try <= loadRetries && (errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, context.DeadlineExceeded)) && runCtx.Err() == nil; try++ {
					// a client deadline on a loaded machine (elections):
					// the same puts again
					r.retries.Add(1)
					err = s.writeBatch(j, first, n)
				}
				if err != nil {
					errs[j] = fmt.Errorf("keys %d..: %w", first, err)
					stopped.Store(true)
					return
				}
				done := int(written.Add(int64(n)))
				mu.Lock()
				if !stopped.Load() && enough(done) {
					stopped.Store(true)
				}
				if time.Since(lastNote) > 5*time.Second {
					lastNote = time.Now()
					r.note("%d keys written", done)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// dataDirBytes sums what the files under dir hold on disk (allocated
// blocks), and those of its wal and snap directories apart.
func dataDirBytes(dir string) (all, walBytes, snapBytes int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n := fi.Size()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n = st.Blocks * 512
		}
		all += n
		switch filepath.Base(filepath.Dir(path)) {
		case "wal":
			walBytes += n
		case "snap":
			snapBytes += n
		}
		return nil
	})
	return all, walBytes, snapBytes, err
}

func printRecoverTable(w io.Writer, rows []recoverRow, o *recoverFlags, r *recoverRun) {
	fmt.Fprintf(w, "kvbench recover  %s  %s, %d CPUs, %s\n%d records, %d B keys, %d B values (raw %d B), durability %s; kvserver's embedded cluster (%d x 3 replicas on shm), data dir under %s (%s)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(),
		o.records, kvKeySize, kvValueSize, kvKeySize+kvValueSize, o.durability, o.groups, os.TempDir(), r.fs)
	if len(o.kvserverArgs) > 0 {
		fmt.Fprintf(w, "kvserver started with %s\n\n", strings.Join(o.kvserverArgs, " "))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\trecover\tup\tput\treplica\tdisk/rec\tx raw\twal MiB\tsnap MiB\tpoll max\tsave max\tover\tET/20\tcapture\t")
	sec := func(s float64) string { return fmtDur(time.Duration(s * float64(time.Second))) }
	us := func(u float64) string { return fmtDur(time.Duration(u * 1e3)) }
	for _, x := range rows {
		capture := "-"
		if x.Captures > 0 {
			capture = us(x.CaptureMaxUS) + " / " + us(x.CaptureCPUMaxUS)
		}
		save := "-"
		if x.SavePasses > 0 {
			save = us(x.SavePassMaxUS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%.1f\t%.1f\t%s\t%s\t%d/%d\t%s\t%s\t\n", x.Row, sec(x.RecoverS), sec(x.UpS), sec(x.FirstPutS), sec(x.ReplicaMaxS),
			x.DiskPerRecord, x.DiskXRaw, float64(x.WALBytes)/(1<<20), float64(x.SnapBytes)/(1<<20), us(x.PollMaxUS), save, x.SavePassesOver, x.SavePasses, us(x.ETOver20US), capture)
	}
	tw.Flush()
	for _, x := range rows {
		fmt.Fprintf(w, "  %s: slowest replica: %s\n", x.Row, x.Recovery)
	}
}

// threadLine says where a replica Poll's wall time went on its thread
// (PollDetail's thread_*: read only for a Poll that started in a save):
// its own CPU, the OS's run queue (other threads on the cores), or
// neither (asleep, or its goroutine waiting in Go's scheduler); "" if
// the Poll's thread was not read.
func threadLine(d server.PollDetail) string {
	if !d.Thread || d.Us <= 0 {
		return ""
	}
	pct := func(x float64) float64 { return 100 * x / d.Us }
	what := "its own CPU"
	switch {
	case d.ThreadRunDelayUs >= d.ThreadCPUUs && d.ThreadRunDelayUs >= d.ThreadOffUs:
		what = "waiting for a core on the OS's run queue"
	case d.ThreadOffUs >= d.ThreadCPUUs:
		what = "off the CPU and off the run queue (asleep, or waiting in Go's scheduler)"
	}
	return fmt.Sprintf("%.1f ms, mostly %s: on a CPU %.1f ms (%.0f%%), runnable waiting for one %.1f ms (%.0f%%), neither %.1f ms (%.0f%%); %d minor and %d major page faults, %d sleeps, %d preemptions by the OS",
		d.Us/1e3, what, d.ThreadCPUUs/1e3, pct(d.ThreadCPUUs), d.ThreadRunDelayUs/1e3, pct(d.ThreadRunDelayUs), d.ThreadOffUs/1e3, pct(d.ThreadOffUs),
		d.ThreadMinFaults, d.ThreadMajFaults, d.ThreadSleeps, d.ThreadPreempted)
}
