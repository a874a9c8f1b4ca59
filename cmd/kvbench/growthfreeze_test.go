package main

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/kvproc"
)

// TestKVGrowthBaselineFrozen: Redis's part of kvbench kv's
// get-during-growth row (its seed keys, gets and load) and the load the
// memory row's Redis figure measures run with the replicas' process
// stopped from start to end (baseline_replicas "stopped", none of its
// CPU); the memory row, read from the replicas after Redis's load, shows
// the cluster resumed. With the planted keepReplicasRunning, --rows
// memory (the load without the growth figure, plainLoad) says "running"
// with the states its record saw (so that load went through frozenDo,
// which stops the process unless planted). Two runs, about 2 s each.
func TestKVGrowthBaselineFrozen(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server)")
	}
	for _, c := range []struct {
		rows    string
		planted bool
	}{{"growth,memory", false}, {"memory", true}} {
		t.Run(fmt.Sprintf("rows=%s,keepReplicasRunning=%v", c.rows, c.planted), func(t *testing.T) {
			baseKnobs.keepReplicasRunning = c.planted
			defer func() { baseKnobs.keepReplicasRunning = false }()
			args := []string{"kv", "--quick", "--json", "--records", "2000", "--duration", "1ms", "--interval", "20ms",
				"--retries", "0", "--rows", c.rows}
			stdout, _ := runKVBench(t, args...)
			seen := map[string]bool{}
			for _, r := range jsonLines[struct {
				Op, Baseline     string
				BaselineReplicas string  `json:"baseline_replicas"`
				CPU              float64 `json:"baseline_replicas_cpu_s"`
				Bytes            float64 `json:"bytes_per_record"`
			}](t, stdout) {
				seen[r.Op] = true
				if r.Baseline != "redis" {
					t.Errorf("row %s: baseline %q, want redis", r.Op, r.Baseline)
					continue
				}
				switch {
				case c.planted && (!strings.HasPrefix(r.BaselineReplicas, "running (") || r.BaselineReplicas == "running ()"):
					t.Errorf("planted keepReplicasRunning: row %s: baseline_replicas %q, want running (the states seen)", r.Op, r.BaselineReplicas)
				case !c.planted && (r.BaselineReplicas != "stopped" || r.CPU != 0):
					t.Errorf("row %s: Redis's load ran beside the replicas: baseline_replicas %q, %.2f s of their CPU", r.Op, r.BaselineReplicas, r.CPU)
				case r.Op == "memory" && r.Bytes <= 0:
					t.Errorf("memory row: bytes_per_record %v after Redis's load", r.Bytes)
				}
			}
			want := strings.ReplaceAll(c.rows, "growth", "get-during-growth")
			for _, op := range strings.Split(want, ",") {
				if !seen[op] {
					t.Errorf("no %s row:\n%s", op, stdout)
				}
			}
		})
	}
}

// TestFrozenResumes: frozenDo resumes the replicas' process (here a
// sleep) when Redis's part fails or panics, and its record says the
// process was stopped throughout. With the planted noThawOnError the
// failed part leaves the process stopped.
func TestFrozenResumes(t *testing.T) {
	for _, c := range []struct {
		name    string
		f       func() error
		planted bool
	}{
		{"error", func() error { return errors.New("redis failed") }, false},
		{"error,noThawOnError", func() error { return errors.New("redis failed") }, true},
		{"panic", func() error { panic("redis panicked") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			baseKnobs.noThawOnError = c.planted
			defer func() { baseKnobs.noThawOnError = false }()
			e := &kvEnv{reps: []int{pid}}
			var d kvproc.During
			var err error
			panicked := func() (p any) {
				defer func() { p = recover() }()
				d, err = e.frozenDo(c.f)
				return nil
			}()
			if c.name == "panic" {
				if panicked == nil {
					t.Fatal("frozenDo swallowed the part's panic")
				}
			} else if err == nil || !strings.Contains(err.Error(), "redis failed") {
				t.Fatalf("frozenDo: %v, want the part's error", err)
			}
			if c.name != "panic" && !d.Stopped() {
				t.Errorf("the record says %q (%.2f s), want stopped", d.State, d.CPUSeconds)
			}
			_, s, serr := kvproc.CPUTime(pid)
			if serr != nil {
				t.Fatal(serr)
			}
			left := s == 'T'
			if c.planted && !left {
				t.Errorf("planted noThawOnError: process in state %c after the failed part, want left stopped", s)
			}
			if !c.planted && left {
				t.Errorf("process left stopped (state T) after the part's %s", c.name)
			}
		})
	}
}
