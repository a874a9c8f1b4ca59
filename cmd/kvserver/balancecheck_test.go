package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/cluster"
)

// TestCheckBalancer: kvserver check of a config with a keyspace says
// what the tablet balancer does: its interval and the rule by load's
// thresholds in force (the defaults, or [ordered] balance_min_writes and
// balance_split_keys), off with "0", and on tcp a warning for each host
// of group 0's replicas where no client slot listens (the example's
// clients are all on 10.0.0.9), gone once a [[clients]] block listens on
// each. The embedded cluster's --balance-min-writes and
// --balance-split-keys refuse what the config refuses.
func TestCheckBalancer(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("0123456789abcdef0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	ks := "[[keyspace]]\nname = \"users\"\nkind = \"ordered\"\n"
	check := func(doc string) string {
		t.Helper()
		path := filepath.Join(dir, "cluster.toml")
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := runArgs("check", "--config", path)
		if code != 0 {
			t.Fatalf("check: exit %d: %s", code, errOut)
		}
		return out
	}
	out := check(cluster.ExampleConfig + ks)
	if !strings.Contains(out, "tablet balancer: a move at most every 5s") || strings.Count(out, "warning: no client slot listens on 10.0.0.") != 3 ||
		!strings.Contains(out, "splitting a hot tablet of 64 keys or more first; by their count under 1000 writes a round") {
		t.Fatalf("check of the tcp example:\n%s", out)
	}
	out = check(strings.Replace(cluster.ExampleConfig, "# [ordered]\n# balance_interval = \"5s\"\n# balance_min_writes = 1000\n# balance_split_keys = 64",
		"[ordered]\nbalance_interval = \"2s\"\nbalance_min_writes = 300\nbalance_split_keys = 5000", 1) + ks)
	if !strings.Contains(out, "tablet balancer: a move at most every 2s") || !strings.Contains(out, "splitting a hot tablet of 5000 keys or more first; by their count under 300 writes a round") {
		t.Fatalf("check with balance_min_writes and balance_split_keys:\n%s", out)
	}
	for _, tc := range []struct{ flag, value, msg string }{
		{"--balance-min-writes", "-1", "kvserver: --balance-min-writes -1: want 1 to 1000000000000 writes a round"},
		{"--balance-split-keys", "1", "kvserver: --balance-split-keys 1: want 2 to 65536 keys"},
		{"--balance-split-keys", "70000", "kvserver: --balance-split-keys 70000: want 2 to 65536 keys"},
	} {
		if _, errOut, code := runArgs(tc.flag, tc.value); code != 2 || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%s %s: exit %d, %q; want 2 and %q", tc.flag, tc.value, code, errOut, tc.msg)
		}
	}
	more := ""
	for h := 1; h <= 3; h++ {
		more += "[[clients]]\ncount = 1\nlisten = \"10.0.0." + string(rune('0'+h)) + ":7399\"\n"
	}
	out = check(strings.Replace(cluster.ExampleConfig, "[[clients]]", more+"[[clients]]", 1) + ks)
	if strings.Contains(out, "warning") || !strings.Contains(out, "tablet balancer: a move at most every 5s") {
		t.Fatalf("check with a client slot on each host:\n%s", out)
	}
	out = check(strings.Replace(cluster.ExampleConfig, "# [ordered]\n# balance_interval = \"5s\"", "[ordered]\nbalance_interval = \"0\"", 1) + ks)
	if !strings.Contains(out, "tablet balancer: off") {
		t.Fatalf("check with the balancer off:\n%s", out)
	}
}
