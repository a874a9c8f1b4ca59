package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/internal/server"
)

// TestEmbeddedSettingsFlags: --wal-layout and --spare-p refuse a bad
// value in one line naming the flag and the values it takes, and
// --wal-layout goes with a durable mode only.
func TestEmbeddedSettingsFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvserver")
	}
	kvserver := build(t, "./cmd/kvserver")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--wal-layout", "one"}, `kvserver: --wal-layout "one": want "per-replica" or "shared"` + "\n"},
		{[]string{"--spare-p", "on"}, `kvserver: --spare-p "on": want "auto" or "off"` + "\n"},
		{[]string{"--memory", "--wal-layout", "shared"}, "kvserver: --data-dir, --snapshot-log-bytes or --wal-layout with durability memory: memory mode keeps nothing on disk (leave them out, or --memory)\n"},
	} {
		cmd := exec.Command(kvserver, c.args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || stderr.String() != c.want {
			t.Errorf("kvserver %v: %v, stderr %q; want exit 2 and %q", c.args, err, stderr.String(), c.want)
		}
	}
}

// TestEmbeddedSettingsStatus: the embedded cluster started with each
// value of --wal-layout and --spare-p runs with it and says so in its
// banner and /status: --wal-layout shared --spare-p off opens one
// shared log (shared_log in /status) and leaves the spare P off; the
// defaults give each replica a log of its own (no shared_log) and the
// spare P auto.
func TestEmbeddedSettingsStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	kvserver := build(t, "./cmd/kvserver")
	dir := t.TempDir()
	shmDir := filepath.Join(dir, "shm")
	if err := os.Mkdir(shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, c := range []struct {
		flags             []string
		layout, spare     string
		banner, bannerSpr string
	}{
		{[]string{"--wal-layout", "shared", "--spare-p", "off"}, "shared", "off", "one shared log", "spare P:      off"},
		{nil, "shared", "auto", "one shared log", "spare P:      auto"},
	} {
		name := fmt.Sprintf("settings%d-%d", os.Getpid(), k)
		data := filepath.Join(dir, name)
		args := append([]string{"--durability", "async", "--groups", "1", "--data-dir", data, "--map", filepath.Join(dir, name+".json"),
			"--shm-dir", shmDir, "--name", name, "--balance-interval", "0"}, c.flags...)
		srv, banner, stderr := startServer(t, kvserver, args...)
		if !strings.Contains(banner, c.banner) || !strings.Contains(banner, c.bannerSpr) {
			t.Errorf("kvserver %v: the banner says neither %q nor %q:\n%s", c.flags, c.banner, c.bannerSpr, banner)
		}
		var ps server.ProcessStatus
		getStatus(t, banner, &ps)
		spare := ""
		if ps.SpareP != nil {
			spare = ps.SpareP.Setting
		}
		if ps.WALLayout != c.layout || (ps.SharedLog != nil) != (c.layout == "shared") || spare != c.spare {
			t.Errorf("kvserver %v: /status wal_layout %q, shared_log %v, spare_p.setting %q; want %q, shared log %v, %q",
				c.flags, ps.WALLayout, ps.SharedLog != nil, spare, c.layout, c.layout == "shared", c.spare)
		}
		_, err := os.Stat(filepath.Join(data, "wal"))
		if shared := err == nil; shared != (c.layout == "shared") {
			t.Errorf("kvserver %v: a shared log dir in the data dir: %v", c.flags, shared)
		}
		srv.Process.Signal(os.Interrupt)
		if err := srv.Wait(); err != nil {
			t.Errorf("kvserver %v after SIGINT: %v; stderr: %s", c.flags, err, stderr.String())
		}
	}
}

// getStatus reads the /status of the control port a banner names.
func getStatus(t *testing.T, banner string, ps *server.ProcessStatus) {
	t.Helper()
	i := strings.Index(banner, "http://")
	if i < 0 {
		t.Fatalf("no control port in the banner:\n%s", banner)
	}
	url, _, _ := strings.Cut(banner[i:], " ")
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(ps); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}
