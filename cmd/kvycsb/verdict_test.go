package main

import (
	"strings"
	"testing"
)

// TestBenchVerdicts checks the target lines under kvycsb bench's table
// against issue 17's targets: at 8 threads the load, A and F at least 3x
// Redis, B and C at least 5x; each judged on its own 8-thread row (the
// 1-thread rows here have other ratios, so a verdict that read one would
// say so).
func TestBenchVerdicts(t *testing.T) {
	var rs []*phaseResult
	add := func(wl, ph string, threads int, rdmakv, redis float64) {
		rs = append(rs,
			&phaseResult{DB: "rdmakv", Binding: "rdmakv", Workload: wl, Phase: ph, Threads: threads, OpsPerSec: rdmakv},
			&phaseResult{DB: "redis", Binding: "redis", Workload: wl, Phase: ph, Threads: threads, OpsPerSec: redis})
	}
	add("a", "load", 8, 20, 10) // load 2x: missed
	for _, th := range []int{1, 8} {
		k := float64(th) // the 1-thread rows: 1/8 of the 8-thread ratio
		add("a", "run", th, 31*k, 80)
		add("b", "run", th, 49*k, 80)
		add("c", "run", th, 60*k, 80)
		add("f", "run", th, 24*k, 80)
	}
	var b strings.Builder
	printTable(&b, rs, []string{"a", "b", "c", "f"}, []int{1, 8})
	out := b.String()
	for _, want := range []string{
		"target rdmakv >= 3x Redis at 8 threads: load 2.00x (missed), A 3.10x (met), F 2.40x (missed)",
		"target rdmakv >= 5x Redis at 8 threads: B 4.90x (missed), C 6.00x (met)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
}
