package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// TestKVBaselineFrozen: kvbench kv's Redis rows run with the replicas'
// process stopped from their start to their end (baseline_replicas
// "stopped", no CPU of it), and the rdmakv row after a Redis row runs
// (the cluster resumed and serves). With the planted keepReplicasRunning
// the rows say "running".
func TestKVBaselineFrozen(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server)")
	}
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepReplicasRunning=%v", planted), func(t *testing.T) {
			baseKnobs.keepReplicasRunning = planted
			defer func() { baseKnobs.keepReplicasRunning = false }()
			args := []string{"kv", "--quick", "--json", "--records", "2000", "--duration", "1ms", "--interval", "20ms",
				"--retries", "0", "--threads", "1", "--put-threads", "1", "--rows", "get,put"}
			stdout, _ := runKVBench(t, args...)
			n := 0
			for _, r := range jsonLines[struct {
				Op, Consistency, Baseline string
				BaselineReplicas          string  `json:"baseline_replicas"`
				CPU                       float64 `json:"baseline_replicas_cpu_s"`
				OpsPerS                   float64 `json:"ops_per_s"`
			}](t, stdout) {
				if r.Baseline != "redis" {
					continue
				}
				n++
				name := r.Op + " " + r.Consistency
				switch {
				case planted && !strings.HasPrefix(r.BaselineReplicas, "running ("):
					t.Errorf("planted keepReplicasRunning: row %s: baseline_replicas %q, want running", name, r.BaselineReplicas)
				case !planted && (r.BaselineReplicas != "stopped" || r.CPU != 0):
					t.Errorf("row %s: Redis ran beside the replicas: baseline_replicas %q, %.2f s of their CPU", name, r.BaselineReplicas, r.CPU)
				case !planted && r.OpsPerS <= 0:
					t.Errorf("row %s: rdmakv ops/s %v after a thaw", name, r.OpsPerS)
				}
			}
			if n != 3 {
				t.Errorf("%d rows with a Redis baseline, want 3 (get stale-ok, get linearizable, put):\n%s", n, stdout)
			}
		})
	}
}
