package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// checkBaselineFrozen returns an error naming each Redis phase that ran
// beside a running (not stopped) embedded cluster, or an rdmakv phase
// that ran against a stopped one.
func checkBaselineFrozen(results []*phaseResult) error {
	var bad []string
	redis := 0
	for _, r := range results {
		c := r.Cluster
		if c == nil {
			bad = append(bad, fmt.Sprintf("%s %s %s x%d: no record of the cluster", r.DB, r.Phase, r.Workload, r.Threads))
			continue
		}
		switch {
		case isRedisDB(r.DB) && (!c.stopped() || c.CPUSeconds != 0):
			bad = append(bad, fmt.Sprintf("redis %s %s x%d ran beside a running cluster (state %s, %.2f s CPU)", r.Phase, r.Workload, r.Threads, c.State, c.CPUSeconds))
		case !isRedisDB(r.DB) && strings.Contains(c.State, "T"):
			bad = append(bad, fmt.Sprintf("rdmakv %s %s x%d ran against a stopped cluster (state %s)", r.Phase, r.Workload, r.Threads, c.State))
		}
		if isRedisDB(r.DB) {
			redis++
		}
	}
	if redis == 0 {
		bad = append(bad, "no Redis phase")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}

// TestBenchBaselineFrozen runs kvycsb bench small in this process: every
// Redis phase (the load and the runs) ran with the embedded cluster's
// process stopped from its start to its end and using no CPU, and every
// rdmakv phase after one of them ran (the cluster resumed and served).
// With the planted keepClusterRunning, the check names the Redis phases
// that ran beside the running cluster.
func TestBenchBaselineFrozen(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server)")
	}
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepClusterRunning=%v", planted), func(t *testing.T) {
			benchKnobs.keepClusterRunning = planted
			defer func() { benchKnobs.keepClusterRunning = false }()
			// stderr: the cluster's child writes to it too (exec's copier).
			var stdout bytes.Buffer
			var stderr syncbuf.Buffer
			err := runBench([]string{"--records", "100", "--ops", "100", "--threads", "1", "--workloads", "a", "--load-threads", "2", "--progress", "0", "--json"}, &stdout, &stderr)
			if err != nil {
				t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
			}
			var doc struct{ Results []*phaseResult }
			if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
				t.Fatalf("json: %v\n%s", err, stdout.String())
			}
			if len(doc.Results) != 4 {
				t.Fatalf("%d results, want 4 (the load and A on each)", len(doc.Results))
			}
			err = checkBaselineFrozen(doc.Results)
			if !planted {
				if err != nil {
					t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "redis load a x2 ran beside a running cluster") || !strings.Contains(err.Error(), "redis run a x1 ran beside a running cluster") {
				t.Fatalf("planted keepClusterRunning: check says %v, want the Redis phases beside a running cluster", err)
			}
		})
	}
}
