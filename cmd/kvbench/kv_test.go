package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClosedLoopSlowOps: ops that each take longer than the measured
// window (what a loaded machine does to a short --duration) still give a
// measurement: each goroutine measures on until it completed an op, and
// ops/s is over the lengthened window. It once failed with "no op
// completed in the measured 200ms".
func TestClosedLoopSlowOps(t *testing.T) {
	const threads = 3
	st, err := closedLoop(threads, timing{dur: time.Millisecond, warm: 0}, func(int) kvOp {
		return func() error { time.Sleep(20 * time.Millisecond); return nil }
	})
	if err != nil {
		t.Fatalf("closedLoop of ops slower than its window: %v", err)
	}
	if st.n < threads || st.opsPerS <= 0 || st.p50 <= 0 || st.p99 < st.p50 {
		t.Errorf("closedLoop of ops slower than its window: %+v, want an op of each goroutine measured, positive ops/s and latencies", st)
	}
	// ops/s is over the window the ops took, not over the 1 ms asked for.
	if max := float64(st.n) / (20 * time.Millisecond).Seconds(); st.opsPerS > max {
		t.Errorf("closedLoop: %v ops/s from %d ops of at least 20 ms each, want at most %v (over the lengthened window)", st.opsPerS, st.n, max)
	}
}

// TestKVQuickJSON runs the kv benchmark in --quick mode (20000 records,
// short measurements) and checks its JSON lines: every line carries the
// required keys; there is a get row of each consistency at each goroutine
// count, a put row at 1 and at --put-threads goroutines, a growth row whose
// index grew through generations, and a memory row; with redis-server
// installed every get and put row has its Redis baseline. Afterwards no
// file of the run's shm cluster is left in /dev/shm, and its work
// directory is gone. It checks the output's shape, not the figures: the
// measurements last 1 ms, shorter than some ops take on a busy machine
// (closedLoop then measures on until each goroutine completed one, see
// TestClosedLoopSlowOps), so every figure it checks is positive however
// loaded the machine.
func TestKVQuickJSON(t *testing.T) {
	opLog := filepath.Join(t.TempDir(), "ops")
	args := []string{"kv", "--quick", "--json", "--records", "20000", "--duration", "1ms", "--interval", "20ms",
		"--retries", "0", "--threads", "1,4", "--put-threads", "16", "--op-log", opLog}
	lines, stderr := runJSONLines(t, args...)
	_, redisErr := exec.LookPath("redis-server")
	if redisErr != nil {
		t.Logf("no redis-server: the rows have no baseline (apt-get install -y redis-server)")
	}
	required := []string{"bench", "op", "consistency", "threads", "p50_ns", "p99_ns", "ops_per_s",
		"baseline", "baseline_ops_per_s", "baseline_p50_ns"}
	rows := map[string]map[string]any{}
	for _, obj := range lines {
		hasKeys(t, obj, required...)
		if obj["bench"] != "kv" {
			t.Errorf("row %v: bench = %v, want kv", obj, obj["bench"])
		}
		rows[fmt.Sprintf("%v/%v/%v", obj["op"], obj["consistency"], obj["threads"])] = obj
	}
	var want []string
	for _, n := range []int{1, 4} {
		want = append(want, fmt.Sprintf("get/stale-ok/%d", n), fmt.Sprintf("get/linearizable/%d", n))
	}
	want = append(want, "put//1", "put//16")
	for _, name := range want {
		r, ok := rows[name]
		if !ok {
			t.Errorf("no row %s; have %v", name, keys(rows))
			continue
		}
		positive(t, r, "ops_per_s", "p50_ns", "p99_ns", "cost_ops", "mean_ns", "p90_ns", "p999_ns", "max_ns")
		// medians over one run: the distribution's own order
		if q := []float64{num(r["p50_ns"]), num(r["p90_ns"]), num(r["p99_ns"]), num(r["p999_ns"]), num(r["max_ns"])}; !slices.IsSorted(q) || num(r["mean_ns"]) > q[4] {
			t.Errorf("row %s: p50, p90, p99, p99.9, max %v and mean %v out of order", name, q, r["mean_ns"])
		}
		nonNegative(t, r, kvCostFields...)
		if hp, _ := r["huge_pages"].(map[string]any); hp == nil || hp["mode"] == nil || hp["reason"] == nil {
			t.Errorf("row %s: huge_pages %v, want a mode and a reason", name, r["huge_pages"])
		}
		if r["replicas"] != "kvbench-child" || r["groups"] != float64(1) {
			t.Errorf("row %s: replicas %v, groups %v; want kvbench-child, 1", name, r["replicas"], r["groups"])
		}
		if redisErr == nil {
			positive(t, r, "baseline_ops_per_s", "baseline_p50_ns", "ratio_ops", "ratio_p50")
			if r["baseline"] != "redis" {
				t.Errorf("row %s: baseline %v, want redis", name, r["baseline"])
			}
		}
	}
	// --op-log: a line for every measured op of the one-goroutine rows
	// (gets of both consistencies, the put), none of the others'
	b, err := os.ReadFile(opLog)
	if err != nil {
		t.Fatal(err)
	}
	logged := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var row string
		var run int
		var end, lat int64
		if n, err := fmt.Sscanf(line, "%s %d %d %d", &row, &run, &end, &lat); n != 4 || err != nil || run != 1 || end < 1e18 || lat <= 0 {
			t.Fatalf("--op-log line %q: want row, run 1, end ns since the epoch, latency ns (%v)", line, err)
		}
		logged[row]++
	}
	for row, name := range map[string]string{"get_stale-ok_x1": "get/stale-ok/1", "get_linearizable_x1": "get/linearizable/1", "put_x1": "put//1"} {
		if r := rows[name]; r != nil && logged[row] != num(r["n"]) {
			t.Errorf("--op-log: %v lines of %s, want the row's n %v", logged[row], row, r["n"])
		}
	}
	if len(logged) != 3 {
		t.Errorf("--op-log has rows %v, want the three one-goroutine rows", logged)
	}
	if g, ok := rows["get-during-growth/stale-ok/1"]; !ok {
		t.Errorf("no get-during-growth row; have %v", keys(rows))
	} else {
		positive(t, g, "ops_per_s", "before_ops_per_s", "dip", "generations", "load_ops_per_s")
		if redisErr == nil {
			positive(t, g, "baseline_ops_per_s", "baseline_before_ops_per_s")
		}
	}
	if m, ok := rows["memory//0"]; !ok {
		t.Errorf("no memory row; have %v", keys(rows))
	} else {
		positive(t, m, "bytes_per_record", "index_bytes_per_record", "heap_bytes_per_record", "raw_bytes_per_record")
		if m["raw_bytes_per_record"] != float64(kvKeySize+kvValueSize) {
			t.Errorf("memory row: raw_bytes_per_record %v, want %d", m["raw_bytes_per_record"], kvKeySize+kvValueSize)
		}
		if redisErr == nil {
			positive(t, m, "baseline_bytes_per_record")
		}
	}
	checkKVLeftovers(t, stderr)
}

// checkKVLeftovers checks that nothing of the run's cluster (kvbench kv's
// setup, named on stderr) is left: neither its work directory nor a
// file in /dev/shm.
func checkKVLeftovers(t *testing.T, stderr string) {
	t.Helper()
	where := regexp.MustCompile(`cluster (\S+) in (\S+)`).FindStringSubmatch(stderr)
	if where == nil {
		t.Fatalf("stderr names no cluster:\n%s", stderr)
	}
	name, dir := where[1], where[2]
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("work directory %s still there (%v)", dir, err)
	}
	prefix := fmt.Sprintf("kvbench-kv-%d-", os.Getpid())
	if !strings.HasPrefix(name, prefix) {
		t.Errorf("cluster name %q, want the prefix %q", name, prefix)
	}
	filepath.WalkDir("/dev/shm", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // other processes' files come and go
		}
		if strings.Contains(d.Name(), prefix) {
			t.Errorf("left in /dev/shm: %s", p)
		}
		return nil
	})
}

// kvCostFields are the cost-per-op keys of every get and put row.
var kvCostFields = []string{"client_allocs_per_op", "client_wakeups_per_op", "server_wakeups_per_op",
	"client_nonvoluntary_per_op", "server_nonvoluntary_per_op",
	"client_cpu_us_per_op", "server_cpu_us_per_op", "cpu_us_per_op"}

// nonNegative checks that each key is a number >= 0 (a cost per op can be
// 0: CPU time is counted in 10 ms ticks).
func nonNegative(t *testing.T, row map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := row[k].(float64); !ok || v < 0 {
			t.Errorf("row %v: %q = %v, want a number >= 0", row, k, row[k])
		}
	}
}

// TestKVEmbeddedJSON runs kvbench kv --embedded briefly: it builds
// kvserver, runs it as the embedded cluster (2 groups x 3 replicas in one
// process) and puts through a client that opened kvserver's map file. It
// checks the JSON's shape, not the figures: exactly a put row at 1 and at
// --put-threads goroutines, each with its latencies, ops/s, the placement
// and the cost per op (client allocations, wake-ups and CPU of both
// processes); afterwards neither a process, the work directory nor a file
// of the cluster is left.
func TestKVEmbeddedJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvserver and runs it")
	}
	args := []string{"kv", "--embedded", "--quick", "--json", "--records", "2000", "--duration", "1ms",
		"--retries", "0", "--put-threads", "4", "--redis-server", ""}
	stdout, stderr := runKVBench(t, args...)
	rows := map[string]map[string]any{}
	for _, obj := range jsonLines[map[string]any](t, stdout) {
		rows[fmt.Sprintf("%v/%v/%v", obj["op"], obj["consistency"], obj["threads"])] = obj
	}
	if got := keys(rows); strings.Join(got, " ") != "put//1 put//4" {
		t.Fatalf("rows %v, want put//1 and put//4 only; stdout:\n%s", got, stdout)
	}
	for name, r := range rows {
		if r["bench"] != "kv" || r["replicas"] != "embedded-kvserver" || r["groups"] != float64(2) || r["records"] != float64(2000) {
			t.Errorf("row %s: bench %v, replicas %v, groups %v, records %v; want kv, embedded-kvserver, 2, 2000",
				name, r["bench"], r["replicas"], r["groups"], r["records"])
		}
		positive(t, r, "ops_per_s", "p50_ns", "p99_ns", "cost_ops")
		nonNegative(t, r, kvCostFields...)
		// the waits: the client's, and kvserver's pollers' from its /status
		nonNegative(t, r, "client_spins_per_op", "client_spin_hits_per_op", "client_parks_per_op", "client_wake_calls_per_op",
			"server_spins_per_op", "server_spin_hits_per_op", "server_parks_per_op", "server_probes_per_op", "server_probe_hits_per_op")
		if _, ok := r["baseline_ops_per_s"]; !ok {
			t.Errorf("row %s lacks baseline_ops_per_s", name)
		}
	}
	// kvserver is gone, and so is everything of the run's cluster.
	if pid := regexp.MustCompile(`in process (\d+)`).FindStringSubmatch(stderr); pid == nil {
		t.Errorf("stderr names no kvserver process:\n%s", stderr)
	} else if _, err := os.Stat("/proc/" + pid[1] + "/status"); err == nil {
		t.Errorf("kvserver (process %s) still runs", pid[1])
	}
	where := regexp.MustCompile(`cluster (\S+) in (\S+)`).FindStringSubmatch(stderr)
	if where == nil {
		t.Fatalf("stderr names no cluster:\n%s", stderr)
	}
	if _, err := os.Stat(where[2]); !os.IsNotExist(err) {
		t.Errorf("work directory %s still there (%v)", where[2], err)
	}
	filepath.WalkDir("/dev/shm", func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), where[1]) {
			t.Errorf("left in /dev/shm: %s", p)
		}
		return nil
	})
}

// TestKVEmbeddedDurability: --embedded --durability async runs kvserver in
// async mode (its note says so) with its data in a fresh directory under
// $TMPDIR, removed at the end; the default is memory (comparable with the
// earlier figures).
func TestKVEmbeddedDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvserver and runs it")
	}
	o, err := parseKVFlags([]string{"--embedded"}, io.Discard)
	if err != nil || o.durability != "memory" {
		t.Fatalf("--embedded: durability %q, %v; want memory", o.durability, err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	args := []string{"kv", "--embedded", "--durability", "async", "--quick", "--json", "--records", "2000", "--duration", "1ms",
		"--retries", "0", "--put-threads", "4", "--redis-server", ""}
	_, stderr := runKVBench(t, args...)
	if !strings.Contains(stderr, "durability async) in process") {
		t.Errorf("stderr does not say the embedded cluster runs in async mode:\n%s", stderr)
	}
	ents, _ := os.ReadDir(tmp)
	for _, e := range ents {
		t.Errorf("left in $TMPDIR: %s", e.Name())
	}
}

// TestKVRowsFlags: --rows selects measurements; --embedded defaults to the
// put rows and 100 k records and refuses the rows that need kvbench's own
// replicas' process; --groups and --kvserver need --embedded.
func TestKVRowsFlags(t *testing.T) {
	o, err := parseKVFlags([]string{}, io.Discard)
	if err != nil || strings.Join(o.rows, ",") != "growth,memory,get,put" || o.embedded || o.records != 1000000 {
		t.Errorf("no flags: rows %v, embedded %v, records %d, %v; want every row, not embedded, 1000000", o.rows, o.embedded, o.records, err)
	}
	o, err = parseKVFlags([]string{"--embedded"}, io.Discard)
	if err != nil || strings.Join(o.rows, ",") != "put" || o.groups != 2 || o.records != 100000 {
		t.Errorf("--embedded: rows %v, groups %d, records %d, %v; want put, 2, 100000", o.rows, o.groups, o.records, err)
	}
	if _, err := parseKVFlags([]string{"--value-size", "1000"}, io.Discard); err != nil || kvValueSize != 1000 {
		t.Errorf("--value-size 1000: values of %d bytes, %v", kvValueSize, err)
	}
	o, err = parseKVFlags([]string{"--embedded", "--rows", "put,get,put", "--groups", "1", "--records", "5000"}, io.Discard)
	if kvValueSize != 100 {
		t.Errorf("without --value-size: values of %d bytes, want 100", kvValueSize)
	}
	if err != nil || strings.Join(o.rows, ",") != "put,get" || o.groups != 1 || o.records != 5000 {
		t.Errorf("--embedded --rows put,get,put --groups 1: rows %v, groups %d, records %d, %v", o.rows, o.groups, o.records, err)
	}
	for _, args := range [][]string{
		{"--rows", "gets"},
		{"--embedded", "--rows", "put,memory"},
		{"--embedded", "--rows", "growth"},
		{"--groups", "2"},
		{"--kvserver", "/bin/true"},
		{"--embedded", "--groups", "0"},
		{"--value-size", "15"}, // shorter than the key each value starts with
		{"--durability", "async"},
		{"--embedded", "--durability", "fsync"},
	} {
		if _, err := parseKVFlags(args, io.Discard); err == nil {
			t.Errorf("kv %v: no error", args)
		}
	}
}

// num is a JSON number of a row (0 if absent).
func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
