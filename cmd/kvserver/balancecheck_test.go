package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/cluster"
)

// TestCheckBalancer: kvserver check of a config with a keyspace says
// what the tablet balancer does: its interval, off with "0", and on tcp
// a warning for each host of group 0's replicas where no client slot
// listens (the example's clients are all on 10.0.0.9), gone once a
// [[clients]] block listens on each.
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
	if !strings.Contains(out, "tablet balancer: a move at most every 5s") || strings.Count(out, "warning: no client slot listens on 10.0.0.") != 3 {
		t.Fatalf("check of the tcp example:\n%s", out)
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
