package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestMain lets the test binary play kvbench's peer process: the fabric
// command re-executes its own binary with peerEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" {
		if err := peerMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench peer: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// TestFabricMemJSON runs the fabric benchmark on mem with a tiny duration
// and checks the JSON lines: every line parses, carries the required keys,
// and every selected row and its baseline are present.
func TestFabricMemJSON(t *testing.T) {
	rows, _ := runJSONLines(t, "fabric", "--fabrics", "mem", "--duration", "20ms", "--runs", "1", "--retries", "0", "--json")
	required := []string{"bench", "fabric", "mode", "op", "size", "p50_ns", "p99_ns", "ops_per_s",
		"baseline", "baseline_p50_ns", "baseline_ops_per_s"}
	seen := map[string]map[string]any{}
	measured := map[any]bool{} // fabric names with rows, baselines included
	for _, obj := range rows {
		hasKeys(t, obj, required...)
		if obj["bench"] != "fabric" {
			t.Errorf("row %v: bench = %v, want fabric", obj, obj["bench"])
		}
		if ops, _ := obj["ops_per_s"].(float64); ops <= 0 {
			t.Errorf("row %v: ops_per_s = %v, want > 0", obj, obj["ops_per_s"])
		}
		seen[fmt.Sprintf("%v/%v/%v/%v", obj["fabric"], obj["mode"], obj["op"], obj["size"])] = obj
		measured[obj["fabric"]] = true
	}
	for _, mode := range []string{"spin", "park"} {
		for _, op := range []string{"write-oneway/8", "read-rtt/8", "ring-write/64", "ring-write/1024"} {
			name := "mem/" + mode + "/" + op
			obj, ok := seen[name]
			if !ok {
				t.Errorf("no row %s; have %v", name, keys(seen))
				continue
			}
			if !measured[obj["baseline"]] {
				t.Errorf("row %s compares to baseline %v, which has no row of its own", name, obj["baseline"])
			}
		}
	}
	for _, base := range []string{"raw-shm/spin/pingpong-oneway/8", "futex/park/pingpong-oneway/8", "raw-ring/spin/ring-write/64"} {
		if _, ok := seen[base]; !ok {
			t.Errorf("no baseline row %s; have %v", base, keys(seen))
		}
	}
}

func keys(m map[string]map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestHelpListsCommands checks the command list and the exit codes of
// help, a bad command and bad flags.
func TestHelpListsCommands(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "fabric") {
		t.Errorf("help: exit %d, output %q; want 0 and a list naming fabric", code, out.String())
	}
	if code := run([]string{"nosuch"}, &out, &errb); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if code := run([]string{"fabric", "--fabrics", "ib"}, &out, &errb); code != 1 {
		t.Errorf("unknown fabric: exit %d, want 1", code)
	}
	errb.Reset()
	if code := run([]string{"fabric", "--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--duration") && !strings.Contains(errb.String(), "-duration") {
		t.Errorf("fabric --help: exit %d, output %q; want 0 and the flags", code, errb.String())
	}
}
