package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

// TestEmbeddedBalancer is `make run` and an ordered load: the embedded
// cluster (2 groups) with --balance-interval 200ms spreads the ordered
// keyspace over both groups by itself (a load past 4096 keys splits
// group 0's tablet early, and the balancer moves one half), prints one
// line for the move at the default log level, shows it in /status (with
// the rule by load's thresholds that --balance-min-writes and
// --balance-split-keys gave), and after SIGTERM leaves no client slot
// lock file behind.
func TestEmbeddedBalancer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvserver")
	}
	dir := t.TempDir()
	kvserver := build(t, "./cmd/kvserver")
	shmDir := filepath.Join(dir, "shm")
	if err := os.Mkdir(shmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	mapFile := filepath.Join(dir, "run", "cluster.json")
	name := fmt.Sprintf("bal%d", os.Getpid())
	slots := filepath.Join(os.TempDir(), "rdmakv-slots", name)
	t.Cleanup(func() { os.RemoveAll(slots) })
	srv, banner, stderr := startServer(t, kvserver, "--memory", "--map", mapFile, "--shm-dir", shmDir, "--name", name, "--balance-interval", "200ms",
		"--balance-min-writes", "900", "--balance-split-keys", "48")
	m := regexp.MustCompile(`http://([0-9.:]+)/status`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("no control address in the banner:\n%s", banner)
	}
	control := m[1]
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := client.Open(ctx, client.WithMapFile(mapFile), client.WithSlot(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ks := c.Keyspace(cluster.DefaultOrderedKeyspace)
	const n = 5000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if _, err := ks.Put(ctx, fmt.Appendf(nil, "key%06d", i), []byte("v")); err != nil {
					t.Errorf("put %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var st *client.BalancerStatus
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + control + "/status")
		if err != nil {
			t.Fatal(err)
		}
		var ps server.ProcessStatus
		err = json.NewDecoder(resp.Body).Decode(&ps)
		resp.Body.Close()
		if err != nil || ps.Balancer == nil {
			t.Fatalf("/status: %v, balancer %v", err, ps.Balancer)
		}
		st = ps.Balancer
		if st.Moves >= 1 && st.State == "balanced" && len(st.Tablets) == 2 && st.Tablets[0] >= 1 && st.Tablets[1] >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the balancer did not spread the tablets: %+v; stderr: %s", st, stderr.String())
		}
	}
	// The flags' thresholds are the ones in force.
	if st.MinWrites != 900 || st.SplitKeys != 48 {
		t.Fatalf("the balancer runs with min_writes %d, split_keys %d; want --balance-min-writes 900, --balance-split-keys 48", st.MinWrites, st.SplitKeys)
	}
	// The moved tablet's low fence is min or a key of the keyspace
	// ("[min, ordered:key000729)" when the rule by load split first).
	if !regexp.MustCompile(`balancer: moved tablet \[(min|ordered:[^,]+), [^)]+\) from group [01] to group [01]`).MatchString(stderr.String()) {
		t.Fatalf("no line for the move on stderr: %s", stderr.String())
	}
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "balancer:") {
			t.Log(l)
		}
	}
	i := 0
	for kv, err := range ks.Scan(ctx, nil, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if string(kv.Key) != fmt.Sprintf("key%06d", i) {
			t.Fatalf("key %d is %s", i, kv.Key)
		}
		i++
	}
	if i != n {
		t.Fatalf("%d keys after the move, want %d", i, n)
	}
	c.Close()
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("kvserver after SIGTERM: %v; stderr: %s", err, stderr.String())
	}
	if _, err := os.Stat(slots); !os.IsNotExist(err) {
		t.Errorf("the client slots' lock directory %s is still there (%v)", slots, err)
	}
}
