package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestBTreeQuickJSON runs kvbench btree with tiny counts (2000 records,
// measurements of 1 ms, 40 cold lookups) and checks its JSON lines: the
// rows a run must have (memory; lookup and scan of each consistency and
// mixed at each goroutine count, put and insert at 1 and --put-threads
// with the replicas' counts, cold), each naming its op,
// threads, consistency and baseline, with the baseline's ratios present;
// a warm lookup from one goroutine reads at least one node (from more,
// read delegation may share a leaf's read: positive), and the cache's hit
// rate is in [0, 1]; the lookup rows carry the tidwall/btree floor; a scan of 20
// keys reads at least one node; the cold curve has 20 points of at least
// one read each and its first lookup read the root and a leaf. It checks
// shapes and sanity, not figures (closedLoop measures on until every
// goroutine completed an op, so they are positive however loaded the
// machine). Nothing of the cluster is left afterwards.
func TestBTreeQuickJSON(t *testing.T) {
	args := []string{"btree", "--json", "--records", "2000", "--duration", "1ms", "--runs", "1", "--retries", "0",
		"--threads", "1,2", "--put-threads", "4", "--scan-length", "20", "--cold", "40"}
	lines, stderr := runJSONLines(t, args...)
	required := []string{"bench", "op", "consistency", "threads", "records", "p50_ns", "p99_ns", "ops_per_s",
		"baseline", "baseline_ops_per_s", "ratio_ops", "ratio_p50", "runs", "replicas", "groups"}
	rows := map[string]map[string]any{}
	for _, obj := range lines {
		hasKeys(t, obj, required...)
		if obj["bench"] != "btree" || obj["records"] != float64(2000) || obj["replicas"] != "kvbench-child" || obj["groups"] != float64(1) {
			t.Errorf("row %v: want bench btree, 2000 records, kvbench-child, 1 group", obj)
		}
		name := fmt.Sprintf("%v/%v/%v", obj["op"], obj["consistency"], obj["threads"])
		if _, dup := rows[name]; dup {
			t.Errorf("two rows %s", name)
		}
		rows[name] = obj
	}
	get := func(name string) map[string]any {
		r, ok := rows[name]
		if !ok {
			t.Errorf("no row %s; have %v", name, keys(rows))
		}
		return r
	}
	for _, n := range []int{1, 2} {
		for _, cons := range []string{"stale-ok", "linearizable"} {
			if r := get(fmt.Sprintf("lookup/%s/%d", cons, n)); r != nil {
				positive(t, r, "ops_per_s", "p50_ns", "baseline_ops_per_s", "ratio_ops", "ratio_p50",
					"floor_ops_per_s", "ratio_floor_ops", "lists_per_op", "cost_ops", "cache_bytes", "raw_bytes")
				nonNegative(t, r, kvCostFields...)
				if r["baseline"] != "hash-get" || r["floor"] != "tidwall-btree" {
					t.Errorf("row lookup/%s/%d: baseline %v, floor %v; want hash-get, tidwall-btree", cons, n, r["baseline"], r["floor"])
				}
				// From one goroutine a lookup reads its leaf at least; from
				// more, read delegation shares a leaf's read between lookups.
				if v, _ := r["reads_per_op"].(float64); v <= 0 || n == 1 && v < 1 {
					t.Errorf("row lookup/%s/%d: reads_per_op %v, want positive, at least 1 from 1 goroutine (the leaf)", cons, n, r["reads_per_op"])
				}
				if v, ok := r["hit_rate"].(float64); !ok || v < 0 || v > 1 {
					t.Errorf("row lookup/%s/%d: hit_rate %v, want in [0, 1]", cons, n, r["hit_rate"])
				}
			}
			if r := get(fmt.Sprintf("scan/%s/%d", cons, n)); r != nil {
				positive(t, r, "ops_per_s", "p50_ns", "baseline_ops_per_s", "ratio_ops", "ratio_p50", "keys_per_s", "reads_per_op", "lists_per_op")
				if r["baseline"] != "lookup" || r["scan_length"] != float64(20) {
					t.Errorf("row scan/%s/%d: baseline %v, scan_length %v; want lookup, 20", cons, n, r["baseline"], r["scan_length"])
				}
			}
		}
	}
	for _, n := range []int{1, 2} {
		if r := get(fmt.Sprintf("mixed/stale-ok/%d", n)); r != nil {
			positive(t, r, "ops_per_s", "baseline_ops_per_s", "ratio_ops", "reads_per_op", "cache_bytes", "cache_ratio")
			if r["baseline"] != "hash-get-put" || r["insert_pct"] != float64(5) {
				t.Errorf("row mixed/stale-ok/%d: baseline %v, insert_pct %v; want hash-get-put, 5", n, r["baseline"], r["insert_pct"])
			}
			if v, ok := r["hit_rate"].(float64); !ok || v < 0 || v > 1 {
				t.Errorf("row mixed/stale-ok/%d: hit_rate %v, want in [0, 1]", n, r["hit_rate"])
			}
		}
	}
	for _, n := range []int{1, 4} {
		for _, op := range []string{"put", "insert"} {
			if r := get(fmt.Sprintf("%s//%d", op, n)); r != nil {
				positive(t, r, "ops_per_s", "p50_ns", "baseline_ops_per_s", "ratio_ops", "ratio_p50", "cost_ops",
					"writes_per_message", "baseline_writes_per_message")
				nonNegative(t, r, "baseline_cpu_us_per_op") // CPU in ticks: 0 over 1 ms
				if r["baseline"] != "hash-put" {
					t.Errorf("row %s//%d: baseline %v, want hash-put", op, n, r["baseline"])
				}
				// What the one group applied meanwhile: at least the row's
				// writes, in at least one message.
				msgs, _ := r["group_messages"].([]any)
				writes, _ := r["group_writes"].([]any)
				if len(msgs) != 1 || len(writes) != 1 || msgs[0].(float64) < 1 || writes[0].(float64) < msgs[0].(float64) {
					t.Errorf("row %s//%d: group_messages %v, group_writes %v; want one group's, writes >= messages >= 1", op, n, r["group_messages"], r["group_writes"])
				}
				if _, ok := r["leaf_splits_per_k_inserts"].(float64); op == "insert" && !ok {
					t.Errorf("row insert//%d: no leaf_splits_per_k_inserts", n)
				}
			}
		}
	}
	// The ordered part after the load: 2000 keys in nodes that take more
	// than the raw bytes (headers, free room), leaves partly filled, and
	// the arena's chunks at least the live nodes.
	if r := get("memory//0"); r != nil {
		positive(t, r, "leaves", "node_size", "node_bytes_per_record", "ratio_raw", "leaf_fill", "arena_bytes_per_record")
		nb, _ := r["node_bytes_per_record"].(float64)
		ab, _ := r["arena_bytes_per_record"].(float64)
		fill, _ := r["leaf_fill"].(float64)
		if r["keys"] != float64(2000) || r["raw_bytes_per_record"] != float64(116) || nb <= 116 || ab < nb || fill > 1 {
			t.Errorf("memory row: keys %v, raw %v, node bytes %v, arena bytes %v, leaf fill %v; want 2000 keys, 116 raw, node bytes above raw, arena at least node bytes, fill at most 1",
				r["keys"], r["raw_bytes_per_record"], nb, ab, fill)
		}
	}
	if r := get("cold/linearizable/1"); r != nil {
		positive(t, r, "ops_per_s", "reads_per_op")
		if r["cold_lookups"] != float64(40) || r["curve_step"] != float64(2) {
			t.Errorf("cold row: cold_lookups %v, curve_step %v; want 40, 2", r["cold_lookups"], r["curve_step"])
		}
		curve, _ := r["curve"].([]any)
		if len(curve) != 20 {
			t.Errorf("cold row: curve %v, want 20 points", r["curve"])
		}
		for i, v := range curve {
			if f, _ := v.(float64); f < 1 {
				t.Errorf("cold row: curve point %d is %v reads per lookup, want at least 1", i, v)
			}
		}
		if f, _ := r["first_reads"].(float64); f < 2 {
			t.Errorf("cold row: first_reads %v, want at least 2 (2000 records take several leaves under a root)", r["first_reads"])
		}
	}
	checkKVLeftovers(t, stderr)
}

// TestBTreeGroupsQuick runs kvbench btree --groups 2 (the child's 2
// groups, the ordered keyspace cut at the loaded keys' median) with the
// insert and scan rows: every row says 2 groups, inserts and their hashed
// baseline are measured, and scans (which cross the tablet boundary)
// answer (without the lookup rows, their baseline, they have no ratio).
func TestBTreeGroupsQuick(t *testing.T) {
	args := []string{"btree", "--json", "--records", "2000", "--duration", "1ms", "--runs", "1", "--retries", "0",
		"--threads", "1", "--put-threads", "4", "--scan-length", "20", "--groups", "2", "--rows", "insert,scan"}
	rows, stderr := runJSONLines(t, args...)
	ops := map[string]int{}
	for _, obj := range rows {
		if obj["groups"] != float64(2) {
			t.Errorf("row %v: want groups 2", obj)
		}
		positive(t, obj, "ops_per_s")
		if obj["op"] == "insert" {
			positive(t, obj, "baseline_ops_per_s", "ratio_ops")
		}
		ops[fmt.Sprint(obj["op"])]++
	}
	if ops["insert"] != 2 || ops["scan"] != 2 {
		t.Fatalf("rows by op %v, want 2 insert (x1, x4) and 2 scan (both consistencies)", ops)
	}
	checkKVLeftovers(t, stderr)
}

// TestBTreeNodeSize runs kvbench btree --node-size 1KiB with the memory
// and insert rows: the child's tree has the asked node size (the memory
// row's node_size), although 1 KiB nodes cannot hold keys of 255 bytes
// (the cluster's max_key is then 64), and inserts are measured. Sizes
// that are not a node size, and --node-size with --embedded, are refused.
func TestBTreeNodeSize(t *testing.T) {
	args := []string{"btree", "--json", "--records", "2000", "--duration", "1ms", "--runs", "1", "--retries", "0",
		"--put-threads", "4", "--rows", "memory,insert", "--node-size", "1KiB"}
	rows, stderr := runJSONLines(t, args...)
	ops := map[string]int{}
	for _, obj := range rows {
		switch obj["op"] {
		case "memory":
			if obj["node_size"] != float64(1024) || obj["keys"] != float64(2000) {
				t.Errorf("memory row: node_size %v, keys %v; want 1024, 2000", obj["node_size"], obj["keys"])
			}
		case "insert":
			positive(t, obj, "ops_per_s", "baseline_ops_per_s", "ratio_ops")
		}
		ops[fmt.Sprint(obj["op"])]++
	}
	if ops["memory"] != 1 || ops["insert"] != 2 {
		t.Fatalf("rows by op %v, want 1 memory and 2 insert (x1, x4)", ops)
	}
	checkKVLeftovers(t, stderr)
	for _, bad := range [][]string{{"--node-size", "1000"}, {"--node-size", "128"}, {"--node-size", "x"}, {"--embedded", "--node-size", "2KiB"}} {
		if _, err := parseBTreeFlags(bad, io.Discard); err == nil || !strings.Contains(err.Error(), "--node-size") {
			t.Errorf("btree %s: error %v, want one about --node-size", strings.Join(bad, " "), err)
		}
	}
}
