package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdmakv/rdmakv/internal/hist"
)

const fabricUsage = `usage: kvbench fabric [flags]

Measures every fabric (mem, shm, tcp) in spin and park mode:

  write-oneway  8-byte write seen by a polling target: ping-pong, A writes
                B's word, B sees it and writes A's; one-way = half the round
                trip. In park mode both sides park in Doorbell.Wait (the
                fabric opened with no spin phase) and the writes use Notify.
  read-rtt      round trip of a signaled 8-byte OpRead, waiting for its
                completion (spin on Poll; park: Conn.Wait).
  ring-write    throughput of 64 B and 1 KiB writes into a ring: batches of
                unsignaled slot writes, then one tail write with Notify, the
                batch and its tail posted with one Conn.PostList; a consumer
                in the target process validates every message and returns
                credits. Counted: messages the consumer saw.

mem runs its two nodes as goroutines of this process; shm and tcp run the
target in a child process (kvbench re-executes itself). Every run also
measures, in the same run, the baselines the fabric rows compare to:

  raw-shm     spin ping-pong on a MAP_SHARED word, two processes (spin rows)
  futex       FUTEX_WAIT/FUTEX_WAKE ping-pong, two processes (park rows)
  raw-tcp     8-byte ping-pong over loopback TCP, TCP_NODELAY (tcp rows)
  raw-ring    the same ring by hand in a shared file (shm and mem rings)
  raw-stream  the same messages written in batches into one loopback TCP
              connection (tcp rings)

Ratios: latency rows p50 / baseline p50 (lower is better); ring rows
ops/s / baseline ops/s (higher is better). Each figure is the median over
--runs runs, the ratio the median of the per-run ratios.

Spin figures need a free CPU per spinner: every measurement records how
many CPUs other processes used meanwhile ("other cpu", JSON other_cpu) and
is repeated (--retries) while that exceeds --max-other. Progress goes to
stderr.

flags:
`

// fabricFlags are the options of the fabric benchmark.
type fabricFlags struct {
	commonFlags
	fabrics  []string
	modes    []string
	ops      []string
	sizes    []int
	parkSpin time.Duration
	batch    int
	slots    int
	noBase   bool
}

func parseFabricFlags(args []string, stderr io.Writer) (*fabricFlags, error) {
	o := &fabricFlags{}
	fs := o.commonFlags.flagSet("fabric", fabricUsage, stderr,
		"how long each measurement runs (after a short warm-up)",
		"repeat a measurement while other processes use more than this many CPUs",
		"write a CPU profile of this (the initiator's) process to `file`, for go tool pprof; KVBENCH_PEER_CPUPROFILE=path profiles the peer processes")
	fabrics := fs.String("fabrics", "mem,shm,tcp", "comma-separated fabrics to measure")
	modes := fs.String("modes", "spin,park", "comma-separated modes: spin (poll memory), park (Doorbell.Wait)")
	ops := fs.String("ops", "write,read,ring", "comma-separated measurements: write (write-oneway), read (read-rtt), ring (ring-write)")
	sizes := fs.String("sizes", "64,1024", "comma-separated ring message sizes in bytes (multiples of 8, >= 16)")
	fs.DurationVar(&o.parkSpin, "park-spin", 0, "doorbell spin budget in park mode (0: park at once)")
	fs.IntVar(&o.batch, "batch", 64, "ring messages per tail publication")
	fs.IntVar(&o.slots, "slots", 4096, "ring slots")
	fs.BoolVar(&o.noBase, "no-baselines", false, "skip the baselines (no ratios; for profiling a fabric alone)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("fabric: unexpected argument %q", fs.Arg(0))
	}
	o.fabrics = splitList(*fabrics)
	for _, f := range o.fabrics {
		if f != "mem" && f != "shm" && f != "tcp" {
			return nil, fmt.Errorf("fabric: unknown fabric %q (want mem, shm, tcp)", f)
		}
	}
	o.modes = splitList(*modes)
	for _, m := range o.modes {
		if m != "spin" && m != "park" {
			return nil, fmt.Errorf("fabric: unknown mode %q (want spin, park)", m)
		}
	}
	o.ops = splitList(*ops)
	for _, op := range o.ops {
		if op != "write" && op != "read" && op != "ring" {
			return nil, fmt.Errorf("fabric: unknown measurement %q (want write, read, ring)", op)
		}
	}
	for _, s := range splitList(*sizes) {
		n, err := strconv.Atoi(s)
		if err != nil || n < minSlotSize || n%8 != 0 {
			return nil, fmt.Errorf("fabric: bad ring message size %q (want a multiple of 8, >= %d)", s, minSlotSize)
		}
		o.sizes = append(o.sizes, n)
	}
	if err := o.commonFlags.check("fabric"); err != nil {
		return nil, err
	}
	switch {
	case o.batch <= 0 || o.slots < o.batch:
		return nil, fmt.Errorf("fabric: need 0 < --batch (%d) <= --slots (%d)", o.batch, o.slots)
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// key names one result row.
type key struct {
	fabric, mode, op string
	size             int
}

// Ops of the fabric rows and the baseline rows.
const (
	opWriteOneway    = "write-oneway"
	opReadRTT        = "read-rtt"
	opRingWrite      = "ring-write"
	opPingPongOneway = "pingpong-oneway"
	opPingPongRTT    = "pingpong-rtt"
	opStreamWrite    = "stream-write"
)

// baselineOf is the baseline row a fabric row compares to.
func baselineOf(k key) key {
	if k.fabric == "tcp" {
		switch k.op {
		case opWriteOneway:
			return key{"raw-tcp", "block", opPingPongOneway, 8}
		case opReadRTT:
			return key{"raw-tcp", "block", opPingPongRTT, 8}
		}
		return key{"raw-stream", "block", opStreamWrite, k.size}
	}
	if k.op == opRingWrite {
		return key{"raw-ring", "spin", opRingWrite, k.size}
	}
	b := key{"raw-shm", "spin", opPingPongOneway, 8}
	if k.mode == "park" {
		b = key{"futex", "park", opPingPongOneway, 8}
	}
	if k.op == opReadRTT {
		b.op = opPingPongRTT
	}
	return b
}

// isThroughput says whether a row is compared by ops/s rather than p50.
func isThroughput(op string) bool { return op == opRingWrite || op == opStreamWrite }

// fabricRows lists the rows the flags select, in output order.
func fabricRows(o *fabricFlags) []key {
	var rows []key
	for _, f := range o.fabrics {
		for _, m := range o.modes {
			if slices.Contains(o.ops, "write") {
				rows = append(rows, key{f, m, opWriteOneway, 8})
			}
			if slices.Contains(o.ops, "read") {
				rows = append(rows, key{f, m, opReadRTT, 8})
			}
			if slices.Contains(o.ops, "ring") {
				for _, sz := range o.sizes {
					rows = append(rows, key{f, m, opRingWrite, sz})
				}
			}
		}
	}
	return rows
}

// row is one output line.
type row struct {
	Bench           string  `json:"bench"`
	Fabric          string  `json:"fabric"`
	Mode            string  `json:"mode"`
	Op              string  `json:"op"`
	Size            int     `json:"size"`
	Placement       string  `json:"placement"`
	P50NS           int64   `json:"p50_ns"`
	P99NS           int64   `json:"p99_ns"`
	OpsPerS         float64 `json:"ops_per_s"`
	Baseline        string  `json:"baseline"`
	BaselineP50NS   int64   `json:"baseline_p50_ns"`
	BaselineOpsPerS float64 `json:"baseline_ops_per_s"`
	Ratio           float64 `json:"ratio"`
	RatioOf         string  `json:"ratio_of,omitempty"`
	Runs            int     `json:"runs"`
	N               uint64  `json:"n"`
	OtherCPU        float64 `json:"other_cpu"` // CPUs used by other processes (median over runs)
	Retries         int     `json:"retries"`   // measurements repeated because of background load
}

// results collects per-run stats of every row.
type results map[key][]stat

// runFabric is the fabric subcommand.
func runFabric(args []string, stdout, stderr io.Writer) error {
	o, err := parseFabricFlags(args, stderr)
	if err != nil {
		return err
	}
	sweepShmDir(o.shmDir, stderr)
	rows := fabricRows(o)
	var bases []key
	for _, k := range rows {
		if o.noBase {
			break
		}
		if b := baselineOf(k); !slices.Contains(bases, b) {
			bases = append(bases, b)
		}
	}
	if o.cpuProf != "" {
		stop, err := startProfile(o.cpuProf)
		if err != nil {
			return fmt.Errorf("fabric: %w", err)
		}
		defer stop()
	}
	tm := timing{dur: o.duration, warm: min(o.duration/10, 100*time.Millisecond)}
	res := results{}
	var failed []string
	fail := func(what string, err error) {
		failed = append(failed, what)
		fmt.Fprintf(stderr, "kvbench: %s: %v\n", what, err)
	}
	fmt.Fprintf(stderr, "kvbench fabric: %d run(s) x %v per measurement; load average %s\n", o.runs, o.duration, loadAvg())
	h := &hist.Hist{}
	for run := 1; run <= o.runs; run++ {
		progress := func(k key, st stat) {
			fmt.Fprintf(stderr, "[run %d/%d] %-10s %-5s %-15s %5dB  p50 %-8s p99 %-8s %8s ops/s  other %.2f CPUs\n",
				run, o.runs, k.fabric, k.mode, k.op, k.size, fmtDur(st.p50), fmtDur(st.p99), fmtOps(st.opsPerS), st.otherCPU)
		}
		add := func(k key, st stat) {
			st.run = run
			res[k] = append(res[k], st)
			progress(k, st)
		}
		g := newGuard(o.maxOther, o.retries, func(msg string) { fmt.Fprintf(stderr, "[run %d/%d] %s\n", run, o.runs, msg) })
		br := &baselineRun{dir: o.shmDir, tm: tm, h: h, guard: g}
		fabrics := func() {
			for _, f := range o.fabrics {
				for _, m := range o.modes {
					measureFabric(f, m, o, tm, h, g, add, fail)
				}
			}
		}
		// Alternate the order, so that drifting background load does not
		// always favour the baselines or the fabrics.
		if run%2 == 1 {
			measureBaselines(br, bases, o.batch, o.slots, add, fail)
			fabrics()
		} else {
			fabrics()
			measureBaselines(br, bases, o.batch, o.slots, add, fail)
		}
	}
	out := summarize(rows, bases, res, o.runs)
	return emitRows("fabric", stdout, stderr, out, o.json, func() { printTable(stdout, out, o) }, failed)
}

// measureBaselines measures every baseline row once.
func measureBaselines(br *baselineRun, bases []key, batch, slots int, add func(key, stat), fail func(string, error)) {
	pingpong := func(name, mode string, f func() (stat, error)) {
		oneway := key{name, mode, opPingPongOneway, 8}
		rtt := key{name, mode, opPingPongRTT, 8}
		if !slices.Contains(bases, oneway) && !slices.Contains(bases, rtt) {
			return
		}
		st, err := f()
		if err != nil {
			fail(name+" ping-pong", err)
			return
		}
		add(rtt, st)
		half := st
		half.p50, half.p99 = st.p50/2, st.p99/2
		add(oneway, half)
	}
	pingpong("raw-shm", "spin", br.rawShm)
	pingpong("futex", "park", br.rawFutex)
	pingpong("raw-tcp", "block", br.rawTCP)
	for _, b := range bases {
		var st stat
		var err error
		switch b.fabric {
		case "raw-ring":
			st, err = br.rawRing(b.size, slots, batch)
		case "raw-stream":
			st, err = br.rawStream(b.size, batch)
		default:
			continue
		}
		if err != nil {
			fail(fmt.Sprintf("%s %dB", b.fabric, b.size), err)
			continue
		}
		add(b, st)
	}
}

// measureFabric measures every row of one fabric in one mode, on one
// session (one pair of nodes).
func measureFabric(fabric, mode string, o *fabricFlags, tm timing, h *hist.Hist, g guard, add func(key, stat), fail func(string, error)) {
	s, err := openSession(fabric, mode, o)
	if err != nil {
		fail(fabric+" "+mode+" open", err)
		return
	}
	defer func() {
		if err := s.shutdown(); err != nil {
			fail(fabric+" "+mode+" close", err)
		}
	}()
	k := 0
	one := func(op string, size int, f func() (stat, error)) {
		k++
		st, err := g(s.peer.pid(), f)
		if err != nil {
			fail(fmt.Sprintf("%s %s %s %dB", fabric, mode, op, size), err)
			return
		}
		add(key{fabric, mode, op, size}, st)
	}
	if slices.Contains(o.ops, "write") {
		one(opWriteOneway, 8, func() (stat, error) {
			st, err := s.writeLatency(k, tm, h)
			st.p50, st.p99 = st.p50/2, st.p99/2
			return st, err
		})
	}
	if slices.Contains(o.ops, "read") {
		one(opReadRTT, 8, func() (stat, error) { return s.readLatency(k, tm, h) })
	}
	if slices.Contains(o.ops, "ring") {
		for _, sz := range o.sizes {
			one(opRingWrite, sz, func() (stat, error) { return s.ringThroughput(k, sz, o.slots, o.batch, tm) })
		}
	}
}

// summarize turns per-run stats into output rows: medians over runs, and
// for fabric rows the median of the per-run ratios to the baseline.
func summarize(rows, bases []key, res results, runs int) []row {
	var out []row
	mk := func(k key) (row, bool) {
		sts := res[k]
		if len(sts) == 0 {
			return row{}, false
		}
		r := row{Bench: "fabric", Fabric: k.fabric, Mode: k.mode, Op: k.op, Size: k.size, Placement: placement(k.fabric), Runs: len(sts)}
		r.P50NS = int64(median(sts, func(s stat) float64 { return float64(s.p50) }))
		r.P99NS = int64(median(sts, func(s stat) float64 { return float64(s.p99) }))
		r.OpsPerS = median(sts, func(s stat) float64 { return s.opsPerS })
		r.N = uint64(median(sts, func(s stat) float64 { return float64(s.n) }))
		r.OtherCPU = median(sts, func(s stat) float64 { return s.otherCPU })
		for _, st := range sts {
			r.Retries += st.retries
		}
		return r, true
	}
	for _, b := range bases {
		if r, ok := mk(b); ok {
			out = append(out, r)
		}
	}
	for _, k := range rows {
		r, ok := mk(k)
		if !ok {
			continue
		}
		bk := baselineOf(k)
		if br, ok := mk(bk); ok {
			r.Baseline = bk.fabric
			r.BaselineP50NS, r.BaselineOpsPerS = br.P50NS, br.OpsPerS
			// Per-run ratios: each run of the row against the same run of
			// its baseline.
			var ratios []stat
			for _, st := range res[k] {
				i := slices.IndexFunc(res[bk], func(b stat) bool { return b.run == st.run })
				if i < 0 {
					continue
				}
				b := res[bk][i]
				var q float64
				if isThroughput(k.op) {
					r.RatioOf = "ops_per_s"
					q = st.opsPerS / b.opsPerS
				} else {
					r.RatioOf = "p50"
					q = float64(st.p50) / float64(b.p50)
				}
				ratios = append(ratios, stat{opsPerS: q})
			}
			r.Ratio = median(ratios, func(s stat) float64 { return s.opsPerS })
		}
		out = append(out, r)
	}
	return out
}

// median of f over sts (mean of the middle two for an even count).
func median(sts []stat, f func(stat) float64) float64 {
	if len(sts) == 0 {
		return 0
	}
	v := make([]float64, len(sts))
	for i, s := range sts {
		v[i] = f(s)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func printTable(w io.Writer, out []row, o *fabricFlags) {
	fmt.Fprintf(w, "kvbench fabric  %s  %s, %d CPUs, %s  medians of %d run(s) x %v\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), o.runs, o.duration)
	fmt.Fprintf(w, "mem: both nodes goroutines of one process; shm, tcp and baselines: two OS processes\n")
	fmt.Fprintf(w, "latency rows: ratio = p50 / baseline p50; ring/stream rows: ratio = ops/s / baseline ops/s\n")
	fmt.Fprintf(w, "other cpu: CPUs used by other processes during the measurement (median over runs)\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fabric\tmode\top\tsize\tp50\tp99\tops/s\tbaseline\tbase p50\tbase ops/s\tratio\tother cpu\t")
	for _, r := range out {
		base, bp50, bops, ratio := "", "", "", ""
		if r.Baseline != "" {
			base, bp50, bops = r.Baseline, fmtDur(time.Duration(r.BaselineP50NS)), fmtOps(r.BaselineOpsPerS)
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t\n", r.Fabric, r.Mode, r.Op, r.Size,
			fmtDur(time.Duration(r.P50NS)), fmtDur(time.Duration(r.P99NS)), fmtOps(r.OpsPerS), base, bp50, bops, ratio, r.OtherCPU)
	}
	tw.Flush()
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.2fus", float64(d)/1e3)
	default:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
}

func fmtOps(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// loadAvg is the 1, 5 and 15 minute load average, for the record.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// cpuModel is the CPU's model name from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
		}
	}
	return runtime.GOARCH
}
