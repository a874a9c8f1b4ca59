package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/freeport"
	"github.com/rdmakv/rdmakv/internal/server"
)

// TestRunBalancerLoadOptions: a config's [ordered] balance_min_writes
// and balance_split_keys reach the balancer of the process that runs its
// replicas (RunReplicas, as kvserver --config): /status shows the
// values in force, and the defaults when the config gives none. Planted
// dropBalanceLoad (the values dropped between the config and the
// balancer, the defaults run instead) is caught.
func TestRunBalancerLoadOptions(t *testing.T) {
	for _, tc := range []struct {
		name, ordered    string
		minWrites, split uint64
		plant            bool
	}{
		{"given", "balance_min_writes = 7\nbalance_split_keys = 9\n", 7, 9, false},
		{"defaults", "", client.DefaultMinWrites, client.DefaultSplitKeys, false},
		{"dropBalanceLoad", "balance_min_writes = 7\nbalance_split_keys = 9\n", 7, 9, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := runBalancerStatus(t, tc.ordered, tc.plant)
			ok := st.MinWrites == tc.minWrites && st.SplitKeys == tc.split
			switch {
			case tc.plant && !ok:
				t.Logf("planted dropBalanceLoad caught: the balancer runs with min_writes %d, split_keys %d; the config gave %d, %d", st.MinWrites, st.SplitKeys, tc.minWrites, tc.split)
			case tc.plant:
				t.Fatalf("planted dropBalanceLoad not caught: status %+v", st)
			case !ok:
				t.Fatalf("the balancer runs with min_writes %d, split_keys %d; want %d, %d (status %+v)", st.MinWrites, st.SplitKeys, tc.minWrites, tc.split, st)
			}
		})
	}
}

// runBalancerStatus runs a cluster of 2 groups of one replica, with an
// ordered keyspace and [ordered] holding ordered (after a balance
// interval of an hour: no round runs), in one process, and returns its
// balancer's status.
func runBalancerStatus(t *testing.T, ordered string, plant bool) *client.BalancerStatus {
	shmDir, err := os.MkdirTemp("/dev/shm", "rdmakv-runbal-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shmDir)
	port := freeport.Ports(t, 1)[0]
	doc := fmt.Sprintf(`name = "runbal"
fabric = "shm"
shm_dir = %q
data_dir = %q
[[group]]
[[group.replica]]
id = 1
control = "127.0.0.1:%d"
[[group]]
[[group.replica]]
id = 2
[[clients]]
count = 2
[[keyspace]]
name = "users"
kind = "ordered"
[ordered]
balance_interval = "1h"
%s`, shmDir, filepath.Join(t.TempDir(), "data"), port, ordered)
	cfg, err := cluster.ParseConfig([]byte(doc), "")
	if err != nil {
		t.Fatal(err)
	}
	opts := server.Options{}
	if plant {
		server.PlantDropBalanceLoad(&opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuf{}
	done := make(chan error, 1)
	ready := make(chan string, 1)
	opts.Ready = func(c string) { ready <- c }
	go func() {
		done <- server.RunReplicas(ctx, cfg, []int64{1, 2}, opts, slog.New(slog.NewTextHandler(logs, nil)))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replicas 1 and 2: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("replicas 1 and 2: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("replicas 1 and 2 did not start:\n%s", logs.String())
	}
	_, body := get(t, fmt.Sprintf("http://127.0.0.1:%d/status", port))
	var ps server.ProcessStatus
	if err := json.Unmarshal([]byte(body), &ps); err != nil || ps.Balancer == nil {
		t.Fatalf("/status (%v) has no balancer:\n%s", err, body)
	}
	return ps.Balancer
}
