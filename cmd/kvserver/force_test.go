package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestForceNewClusterArgs: force-new-cluster needs --config and --group,
// names a group that is not in the config, and refuses in one line when
// no majority of the group answers (here: no control ports at all). The
// full command runs against real processes in internal/e2e
// (TestForceNewCluster).
func TestForceNewClusterArgs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.toml")
	cfg := "name = \"f\"\nfabric = \"shm\"\ndata_dir = \"data\"\n[[group]]\n  [[group.replica]]\n  id = 1\n  [[group.replica]]\n  id = 2\n  [[group.replica]]\n  id = 3\n[[clients]]\ncount = 1\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runArgs("force-new-cluster", "--config", path); code != 2 || !strings.Contains(errOut, "usage: kvserver force-new-cluster") {
		t.Errorf("without --group: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := runArgs("force-new-cluster", "--config", path, "--group", "1"); code != 2 || !strings.Contains(errOut, "no group 1") {
		t.Errorf("--group 1 of 1 group: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code := runArgs("force-new-cluster", "--config", path, "--group", "0", "--yes")
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "only 0 of 3 replicas answer") || !strings.Contains(errOut, "no control port") {
		t.Errorf("no replica reachable: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
