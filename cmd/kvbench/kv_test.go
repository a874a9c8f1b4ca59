package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	args := []string{"kv", "--quick", "--json", "--records", "20000", "--duration", "1ms", "--interval", "20ms",
		"--retries", "0", "--threads", "1,4", "--put-threads", "16"}
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("kvbench %s exited %d; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	}
	_, redisErr := exec.LookPath("redis-server")
	if redisErr != nil {
		t.Logf("no redis-server: the rows have no baseline (apt-get install -y redis-server)")
	}
	required := []string{"bench", "op", "consistency", "threads", "p50_ns", "p99_ns", "ops_per_s",
		"baseline", "baseline_ops_per_s", "baseline_p50_ns"}
	rows := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		for _, k := range required {
			if _, ok := obj[k]; !ok {
				t.Errorf("line %q lacks key %q", line, k)
			}
		}
		if obj["bench"] != "kv" {
			t.Errorf("line %q: bench = %v, want kv", line, obj["bench"])
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
		positive(t, r, "ops_per_s", "p50_ns", "p99_ns")
		if redisErr == nil {
			positive(t, r, "baseline_ops_per_s", "baseline_p50_ns", "ratio_ops", "ratio_p50")
			if r["baseline"] != "redis" {
				t.Errorf("row %s: baseline %v, want redis", name, r["baseline"])
			}
		}
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
	// Nothing of the run's cluster is left in /dev/shm.
	where := regexp.MustCompile(`cluster (\S+) in (\S+)`).FindStringSubmatch(stderr.String())
	if where == nil {
		t.Fatalf("stderr names no cluster:\n%s", stderr.String())
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
