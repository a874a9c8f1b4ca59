package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magiconair/properties"
	"github.com/pingcap/go-ycsb/pkg/prop"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// kvycsbBin builds the command once per test binary.
func kvycsbBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvycsb-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvycsb")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// runBin runs kvycsb and returns its exit status, stdout and stderr.
func runBin(t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(kvycsbBin(t), args...)
	cmd.Dir = t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("kvycsb %s: still running after %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), timeout, stdout.String(), stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func TestLoadRunEmbedded(t *testing.T) {
	// In a directory of its own (--shm-dir): the cluster's files are
	// made there, and stderr names it and its huge page mode.
	dir := t.TempDir()
	code, out, errOut := runBin(t, 60*time.Second, "loadrun", "a", "--embedded", "--records", "300", "--ops", "300", "--threads", "4", "--shm-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"INSERT - ", "READ   - ", "UPDATE - ", "TOTAL  - ",
		"[OVERALL] load a on rdmakv: 300 operations", "[OVERALL] run a on rdmakv: 300 operations", "4 threads, 0 errors",
		`"requestdistribution"="zipfian"`} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "_ERROR") {
		t.Errorf("failed operations:\n%s", out)
	}
	m := regexp.MustCompile(`embedded cluster (kvycsb-[0-9]+): .* in process ([0-9]+),`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("stderr does not say where it ran:\n%s", errOut)
	}
	if want := "; shm in " + dir + ", huge pages "; !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
	// Nothing left: the cluster's process and its shm files are gone.
	if _, err := os.Stat("/proc/" + m[2]); err == nil {
		t.Errorf("the cluster's process %s still exists", m[2])
	}
	for _, d := range []string{dir, "/dev/shm"} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.Contains(e.Name(), m[1]+".") {
				t.Errorf("left in %s: %s", d, e.Name())
			}
		}
	}
	// A directory that is not there: the cluster's start fails, naming it.
	missing := filepath.Join(dir, "missing")
	code, _, errOut = runBin(t, 60*time.Second, "loadrun", "a", "--embedded", "--records", "10", "--ops", "10", "--shm-dir", missing)
	if code == 0 || !strings.Contains(errOut, "open directory "+missing) {
		t.Errorf("--shm-dir %s: exit %d, stderr:\n%s", missing, code, errOut)
	}
}

// Workload E without an ordered keyspace is refused up front (nothing
// is printed before the refusal, which the output checks show; how long
// it took is not asserted, a loaded machine may take its time).
func TestWorkloadERefusedWithoutKeyspace(t *testing.T) {
	code, out, errOut := runBin(t, 30*time.Second, "loadrun", "e", "--records", "100000", "--map", filepath.Join(t.TempDir(), "none.json"))
	if code != 2 {
		t.Fatalf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "rdmakv.keyspace") || !strings.Contains(errOut, "scan") {
		t.Errorf("stderr does not say that scans need rdmakv.keyspace:\n%s", errOut)
	}
	if out != "" {
		t.Errorf("something ran before the refusal:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	// The same from a property file.
	file := filepath.Join(t.TempDir(), "w")
	os.WriteFile(file, []byte("recordcount=10\noperationcount=10\nscanproportion=0.5\nreadproportion=0.5\n"), 0o644)
	for _, ph := range []string{"load", "run"} {
		if code, _, errOut := runBin(t, 30*time.Second, ph, "-P", file); code != 2 || !strings.Contains(errOut, "rdmakv.keyspace") {
			t.Errorf("%s -P (scans): exit %d, stderr:\n%s", ph, code, errOut)
		}
	}
}

// TestWorkloadEEmbedded: workload E runs on --embedded, on the embedded
// cluster's ordered keyspace, with YCSB's default records, and every
// scan and insert succeeds.
func TestWorkloadEEmbedded(t *testing.T) {
	code, out, errOut := runBin(t, 90*time.Second, "loadrun", "e", "--embedded", "--records", "300", "--ops", "200", "--threads", "2")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"SCAN   - ", "INSERT - ", "[OVERALL] run e on rdmakv: 200 operations", "2 threads, 0 errors",
		`"rdmakv.keyspace"="ordered"`, `"maxscanlength"="100"`} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "_ERROR") {
		t.Errorf("failed operations:\n%s", out)
	}
	// Records too large for the keyspace's values are refused before
	// the load (go-ycsb would count each insert as an error, silently).
	code, out, errOut = runBin(t, 90*time.Second, "loadrun", "e", "--embedded", "--records", "10", "-p", "fieldcount=30")
	if code != 2 || !strings.Contains(errOut, "records too large") || !strings.Contains(errOut, "fieldlength=") || strings.Contains(out, "INSERT") {
		t.Errorf("fieldcount=30: exit %d, want 2 naming a fieldlength that fits\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

func TestJSON(t *testing.T) {
	code, out, errOut := runBin(t, 60*time.Second, "loadrun", "c", "--embedded", "--records", "200", "--ops", "400", "--threads", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var doc struct {
		Phases []phaseResult `json:"phases"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("stdout is not one JSON document (%v):\n%s", err, out)
	}
	if len(doc.Phases) != 2 {
		t.Fatalf("%d phases, want 2: %+v", len(doc.Phases), doc.Phases)
	}
	ld, rn := doc.Phases[0], doc.Phases[1]
	if ld.Phase != "load" || ld.Operations != 200 || rn.Phase != "run" || rn.Operations != 400 || rn.Errors != 0 || rn.OpsPerSec <= 0 || rn.Threads != 2 || rn.DB != "rdmakv" {
		t.Fatalf("phases: %+v", doc.Phases)
	}
	r, ok := rn.op("READ")
	if !ok || r.Count != 400 || r.P99 < r.P50 {
		t.Fatalf("run's READ row: %+v %v (ops %+v)", r, ok, rn.Ops)
	}
	// Each insert is one single-key write, in a message of its own or
	// combined with others; workload C's run writes nothing.
	if ld.WriteOps != 200 || ld.WriteMessages < 1 || ld.WriteMessages > ld.WriteOps {
		t.Errorf("load: %d writes in %d messages, want 200 writes in 1 to 200 messages", ld.WriteOps, ld.WriteMessages)
	}
	if rn.WriteOps != 0 || rn.WriteMessages != 0 {
		t.Errorf("run of workload c: %d writes in %d messages, want none", rn.WriteOps, rn.WriteMessages)
	}
}

// TestCPUProfile: --cpuprofile profiles kvycsb's process and
// KVYCSB_CLUSTER_CPUPROFILE the embedded cluster's (path.<pid>); both are
// gzipped pprof profiles once kvycsb has ended.
func TestCPUProfile(t *testing.T) {
	dir := t.TempDir()
	prof, cprof := filepath.Join(dir, "kvycsb.prof"), filepath.Join(dir, "cluster.prof")
	t.Setenv(clusterProfileEnv, cprof)
	code, out, errOut := runBin(t, 60*time.Second, "loadrun", "a", "--embedded", "--records", "200", "--ops", "200", "--threads", "2", "--cpuprofile", prof)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "[WRITES] ") {
		t.Errorf("stdout lacks the load's [WRITES] line:\n%s", out)
	}
	m := regexp.MustCompile(`in process ([0-9]+),`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("stderr does not say where the cluster ran:\n%s", errOut)
	}
	for _, f := range []string{prof, cprof + "." + m[1]} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("profile: %v", err)
			continue
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s: %d bytes, not a gzipped pprof profile", f, len(b))
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{nil, 2, "usage: kvycsb"},
		{[]string{"-h"}, 0, ""},
		{[]string{"frob"}, 2, "unknown command"},
		{[]string{"load"}, 2, "no workload"},
		{[]string{"load", "z"}, 2, "unknown workload"},
		{[]string{"load", "a", "b"}, 2, "one workload at a time"},
		{[]string{"run", "a", "--embedded"}, 2, "use loadrun"},
		{[]string{"load", "a", "--db", "mongo"}, 2, "want rdmakv, redis or redis-sorted"},
		{[]string{"load", "a", "--db", "redis", "--embedded"}, 2, "--embedded"},
		{[]string{"run", "a", "--ops", "2", "--threads", "4"}, 2, "operationcount=2 is less than the 4 threads"},
		{[]string{"load", "a", "-p", "rdmakv.consistency=strong"}, 2, "rdmakv.consistency"},
		{[]string{"load", "a", "-p", "novalue"}, 2, "want -p name=value"},
		{[]string{"run", "e", "--db", "redis"}, 2, "redis binding does not support scans (--db redis-sorted does"},
		{[]string{"load", "a", "--map", "/nonexistent/cluster.json"}, 1, "kvserver"},
		{[]string{"bench", "--workloads", "a,g"}, 2, "want a, b, c, d, e, f"},
		{[]string{"bench", "--threads", "0"}, 2, "--threads"},
		{[]string{"bench", "extra"}, 2, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.msg) {
			t.Errorf("kvycsb %q: exit %d (want %d), output lacks %q?\nstdout: %s\nstderr: %s", tc.args, code, tc.code, tc.msg, stdout.String(), stderr.String())
		}
	}
}

func TestBuiltinWorkloads(t *testing.T) {
	want := map[string]struct {
		read, update, insert, scan, rmw float64
		dist                            string
	}{
		"a": {0.5, 0.5, 0, 0, 0, "zipfian"},
		"b": {0.95, 0.05, 0, 0, 0, "zipfian"},
		"c": {1, 0, 0, 0, 0, "zipfian"},
		"d": {0.95, 0, 0.05, 0, 0, "latest"},
		"e": {0, 0, 0.05, 0.95, 0, "zipfian"},
		"f": {0.5, 0, 0, 0, 0.5, "zipfian"},
	}
	for name, w := range want {
		text, ok := builtinWorkload(name)
		if !ok {
			t.Fatalf("workload %s is not built in", name)
		}
		p, err := properties.LoadString(text)
		if err != nil {
			t.Fatalf("workload %s: %v", name, err)
		}
		got := [5]float64{p.GetFloat64(prop.ReadProportion, -1), p.GetFloat64(prop.UpdateProportion, -1),
			p.GetFloat64(prop.InsertProportion, -1), p.GetFloat64(prop.ScanProportion, -1), p.GetFloat64(prop.ReadModifyWriteProportion, 0)}
		if got != [5]float64{w.read, w.update, w.insert, w.scan, w.rmw} || p.GetString(prop.RequestDistribution, "") != w.dist ||
			p.GetInt64(prop.RecordCount, 0) != 1000 || p.GetInt64(prop.OperationCount, 0) != 1000 || !p.GetBool(prop.ReadAllFields, false) {
			t.Errorf("workload %s: %v %s, want %+v", name, got, p.GetString(prop.RequestDistribution, ""), w)
		}
	}
	if _, ok := builtinWorkload("g"); ok {
		t.Error("workload g exists")
	}
}

func TestZipfianKeyRange(t *testing.T) {
	p := properties.MustLoadString("requestdistribution=zipfian\nrecordcount=1000\n")
	zipfianKeyRange(p)
	if got := p.GetInt64(prop.InsertCount, 0); got != 999 {
		t.Errorf("insertcount %d, want 999 (keys 0 to 999)", got)
	}
	p = properties.MustLoadString("requestdistribution=zipfian\nrecordcount=1000\ninsertcount=500\n")
	zipfianKeyRange(p)
	if got := p.GetInt64(prop.InsertCount, 0); got != 500 {
		t.Errorf("a given insertcount changed to %d", got)
	}
	p = properties.MustLoadString("requestdistribution=uniform\nrecordcount=1000\n")
	zipfianKeyRange(p)
	if _, ok := p.Get(prop.InsertCount); ok {
		t.Error("insertcount set for a uniform distribution")
	}
}

// TestBench runs kvycsb bench small, against Redis too when redis-server
// is installed.
func TestBench(t *testing.T) {
	args := []string{"bench", "--records", "200", "--ops", "200", "--threads", "1,2", "--workloads", "a,d", "--load-threads", "2"}
	withRedis := true
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Log("redis-server not installed: rdmakv alone")
		args = append(args, "--redis-server", "")
		withRedis = false
	}
	code, out, errOut := runBin(t, 90*time.Second, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"workload", "rdmakv ops/s", "load", "A", "D"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 8 && (f[0] == "A" || f[0] == "D") {
			lines++
			if withRedis && !strings.HasSuffix(f[4], "x") {
				t.Errorf("row without a ratio: %q", l)
			}
			if f[len(f)-1] != "0" {
				t.Errorf("row with errors: %q", l)
			}
		}
	}
	if lines != 4 {
		t.Errorf("%d rows of A and D, want 4 (2 thread counts each):\n%s", lines, out)
	}
}

// TestBenchE runs kvycsb bench --workloads e small: rdmakv on the
// embedded cluster's ordered keyspace, Redis through redis-sorted, both
// rows in the table and in the JSON, with no failed operation.
func TestBenchE(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server): the E baseline needs it")
	}
	args := []string{"bench", "--records", "200", "--ops", "200", "--threads", "1,2", "--workloads", "e", "--load-threads", "2", "--progress", "0"}
	// Records too large for the ordered keyspace are refused before
	// anything is loaded, as with loadrun e --embedded.
	code, out, errOut := runBin(t, 120*time.Second, append(args, "-p", "fieldcount=30")...)
	if code != 2 || !strings.Contains(errOut, "records too large") || strings.Contains(errOut, "load E") {
		t.Errorf("fieldcount=30: exit %d, want 2 and records too large\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = runBin(t, 120*time.Second, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	rows := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 10 && f[0] == "load" && f[1] == "E":
			f = append([]string{"load E"}, f[2:]...)
		case len(f) == 9 && f[0] == "E":
		default:
			continue
		}
		rows[f[0]]++
		// workload threads rdmakv redis ratio p99 p99 binding errors
		if f[2] == "-" || f[3] == "-" || !strings.HasSuffix(f[4], "x") || f[7] != redisSortedName || f[8] != "0" {
			t.Errorf("row without both databases, with another binding or with errors: %q", l)
		}
	}
	if rows["load E"] != 1 || rows["E"] != 2 {
		t.Errorf("rows %v, want a load E row and 2 E rows (1 and 2 threads):\n%s", rows, out)
	}
	if !strings.Contains(out, "target E against redis-sorted") {
		t.Errorf("no E target line:\n%s", out)
	}

	code, out, errOut = runBin(t, 120*time.Second, append(args, "--threads", "2", "--json")...)
	if code != 0 {
		t.Fatalf("--json: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var doc struct {
		Results []phaseResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("stdout is not one JSON document (%v):\n%s", err, out)
	}
	got := map[string]phaseResult{}
	for _, r := range doc.Results {
		got[r.Phase+" "+r.DB] = r
	}
	for _, want := range []phaseResult{
		{Phase: "load", DB: "rdmakv", Binding: "rdmakv", Keyspace: "ordered", Operations: 200},
		{Phase: "run", DB: "rdmakv", Binding: "rdmakv", Keyspace: "ordered", Operations: 200},
		{Phase: "load", DB: "redis", Binding: redisSortedName, Operations: 200},
		{Phase: "run", DB: "redis", Binding: redisSortedName, Operations: 200},
	} {
		r, ok := got[want.Phase+" "+want.DB]
		if !ok || r.Workload != "e" || r.Binding != want.Binding || r.Keyspace != want.Keyspace || r.Operations != want.Operations || r.Errors != 0 {
			t.Errorf("%s %s: %+v (found %v), want binding %s, keyspace %q, %d operations, no errors", want.Phase, want.DB, r, ok, want.Binding, want.Keyspace, want.Operations)
		}
		if want.Phase == "run" {
			if _, ok := r.op("SCAN"); !ok {
				t.Errorf("%s %s: no SCAN row in %+v", want.Phase, want.DB, r.Ops)
			}
		}
	}
	if len(doc.Results) != 4 {
		t.Errorf("%d results, want 4: %+v", len(doc.Results), doc.Results)
	}
}
