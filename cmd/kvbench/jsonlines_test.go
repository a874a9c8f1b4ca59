package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// runKVBench runs the kvbench command line args in this process (run) and
// returns what it printed; it fails the test, with both outputs, if
// kvbench exits other than 0.
func runKVBench(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("kvbench %s exited %d; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// jsonLines decodes each line of out (what kvbench --json prints: one JSON
// object a line) into a T, in order. It fails the test at the first line
// that does not decode; an empty out is one such line (a run that printed
// no row fails).
func jsonLines[T any](t *testing.T, out string) []T {
	t.Helper()
	var rows []T
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r T
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		rows = append(rows, r)
	}
	return rows
}

// runJSONLines runs kvbench (runKVBench) and returns its stdout's lines
// decoded as JSON objects (jsonLines), and its stderr.
func runJSONLines(t *testing.T, args ...string) (rows []map[string]any, stderr string) {
	t.Helper()
	stdout, stderr := runKVBench(t, args...)
	return jsonLines[map[string]any](t, stdout), stderr
}

// hasKeys checks that row has every key of keys.
func hasKeys(t *testing.T, row map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := row[k]; !ok {
			t.Errorf("row %v lacks key %q", row, k)
		}
	}
}
