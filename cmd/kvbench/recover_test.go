package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// jsonRows parses one JSON object per line of out by its "row".
func jsonRows(t *testing.T, out string) map[string]map[string]any {
	t.Helper()
	rows := map[string]map[string]any{}
	for _, obj := range jsonLines[map[string]any](t, out) {
		rows[obj["row"].(string)] = obj
	}
	return rows
}

// TestDiskJSON: kvbench disk --raw-fsync measures its five rows in --dir
// (named with its file system type) and leaves no file there.
func TestDiskJSON(t *testing.T) {
	dir := t.TempDir()
	args := []string{"disk", "--raw-fsync", "--json", "--ops", "5", "--rounds", "2", "--dir", dir}
	stdout, _ := runKVBench(t, args...)
	rows := jsonRows(t, stdout)
	if got := strings.Join(keys(rows), " "); got != "O_DSYNC append+fdatasync reused+fdatasync write+fdatasync written+fdatasync" {
		t.Fatalf("rows %s; stdout:\n%s", got, stdout)
	}
	for name, r := range rows {
		positive(t, r, "p50_us", "p99_us", "mean_us", "max_us")
		if r["fs"] == "" || r["dir"] != dir || r["ops"] != float64(5) || r["rounds"] != float64(2) || r["size"] != float64(4096) {
			t.Errorf("row %s: fs %v, dir %v, ops %v, rounds %v, size %v", name, r["fs"], r["dir"], r["ops"], r["rounds"], r["size"])
		}
		if r["p99_us"].(float64) < r["p50_us"].(float64) || r["max_us"].(float64) < r["p99_us"].(float64) {
			t.Errorf("row %s: p50 %v, p99 %v, max %v not in order", name, r["p50_us"], r["p99_us"], r["max_us"])
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("left in --dir: %s", e.Name())
	}
}

// TestRecoverFlags: recover refuses memory mode (nothing to recover) and
// --quick loads 20,000 records.
func TestRecoverFlags(t *testing.T) {
	o, err := parseRecoverFlags([]string{"--quick"}, io.Discard)
	if err != nil || o.records != 20000 || o.durability != "sync" || kvValueSize != 100 {
		t.Fatalf("--quick: records %d, durability %s, value size %d, %v", o.records, o.durability, kvValueSize, err)
	}
	for _, bad := range [][]string{{"--durability", "memory"}, {"--records", "0"}, {"--value-size", "8"}} {
		if _, err := parseRecoverFlags(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestRecoverJSON runs kvbench recover on a few thousand records: it
// builds kvserver and restarts its embedded cluster twice. The log row
// recovers from the log alone (no snapshot on disk), the snapshot row
// from a snapshot; both found every record back; the data dir under
// $TMPDIR is gone afterwards.
func TestRecoverJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvserver and runs it")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	args := []string{"recover", "--json", "--records", "3000", "--durability", "async"}
	stdout, _ := runKVBench(t, args...)
	rows := jsonRows(t, stdout)
	if got := strings.Join(keys(rows), " "); got != "log snapshot" {
		t.Fatalf("rows %s; stdout:\n%s", got, stdout)
	}
	for name, r := range rows {
		positive(t, r, "recover_s", "up_s", "replica_recovery_max_s", "disk_bytes", "wal_bytes", "disk_bytes_per_record", "disk_x_raw", "et_over_20_us")
		if r["records"] != float64(3000) || r["raw_bytes_per_record"] != float64(116) || r["durability"] != "async" {
			t.Errorf("row %s: records %v, raw %v, durability %v", name, r["records"], r["raw_bytes_per_record"], r["durability"])
		}
	}
	if l, s := rows["log"], rows["snapshot"]; l["snap_bytes"] != float64(0) || s["snap_bytes"].(float64) <= 0 ||
		strings.Contains(l["recovery"].(string), "snapshot") || !strings.Contains(s["recovery"].(string), "recovered snapshot index ") {
		t.Errorf("log row: snap_bytes %v, recovery %q; snapshot row: snap_bytes %v, recovery %q; want the snapshot only in the second",
			l["snap_bytes"], l["recovery"], s["snap_bytes"], s["recovery"])
	}
	if rows["snapshot"]["poll_max_us"].(float64) <= 0 {
		t.Errorf("snapshot row: poll_max_us %v, want the pollers' longest pass", rows["snapshot"]["poll_max_us"])
	}
	// Every replica captured a snapshot in the snapshot row's sampling:
	// the most CPU one took is positive and within the longest one's
	// wall time.
	s := rows["snapshot"]
	if n, wall, cpu := s["captures"].(float64), s["capture_max_us"].(float64), s["capture_cpu_max_us"].(float64); n < 6 || cpu <= 0 || cpu > wall+50 {
		t.Errorf("snapshot row: %v captures, the longest %v µs, the most CPU %v µs: want at least one a replica, CPU in (0, wall]", n, wall, cpu)
	}
	// Every replica's disk snapshot was saved while its group had a
	// leader: passes of a leader's poller overlapped the saves.
	if n, over := s["save_passes"].(float64), s["save_passes_over"].(float64); n <= 0 || over > n || s["save_pass_max_us"].(float64) <= 0 {
		t.Errorf("snapshot row: %v save passes, %v over ET/20, the longest %v µs: want some, and no more over than in all", n, over, s["save_pass_max_us"])
	}
	// A restart's phases come in order, each replica's recovery is there.
	for name, r := range rows {
		prev, prevName := 0.0, "kvserver's start"
		for _, k := range []string{"start_s", "opened_s", "built_s", "polled_s", "up_s", "first_put_s"} {
			v, _ := r[k].(float64)
			if v <= 0 || v < prev {
				t.Errorf("row %s: %s %v after %s %v: want the phases positive and in order", name, k, r[k], prevName, prev)
			}
			prev, prevName = v, k
		}
		if rs, _ := r["replica_s"].([]any); len(rs) != 6 || r["replica_read_max_s"].(float64) <= 0 {
			t.Errorf("row %s: replica_s %v, replica_read_max_s %v: want the six replicas' recoveries", name, r["replica_s"], r["replica_read_max_s"])
		}
	}
	ents, _ := os.ReadDir(tmp)
	for _, e := range ents {
		t.Errorf("left in $TMPDIR: %s", e.Name())
	}
}
