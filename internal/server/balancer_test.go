package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestProcessBalancer: a process hosting every replica of 3 groups, with
// a keyspace that a load of 300 keys cuts early into 3 tablets in group
// 0 (and more while moves run: a group with fewer tablets than groups
// splits early too), spreads them by itself (its balancer, no client
// asks): every group ends with a tablet or more, none with 2 more than
// another; /status shows the balancer's moves and last
// move, /metrics its counters, and every key reads back. With interval 0
// the balancer is off and says so.
func TestProcessBalancer(t *testing.T) {
	for _, interval := range []time.Duration{100 * time.Millisecond, 0} {
		t.Run(interval.String(), func(t *testing.T) {
			m := &cluster.Map{Name: "procbal", Fabric: "mem",
				Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, ClientNodes: []rdma.NodeID{100, 101},
				Keyspaces: []cluster.Keyspace{{Name: "users", Kind: cluster.KindOrdered, ID: 1, FirstTabletMax: 40}}}
			ln, err := server.ListenControl("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			p, err := server.StartProcess(server.ProcessConfig{Map: m, Control: ln,
				Broadcast: broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond},
				Balance:   server.BalanceConfig{Interval: interval}})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := p.WaitServing(ctx); err != nil {
				t.Fatal(err)
			}
			c := openClient(t, p, m)
			defer c.Close()
			ks := c.Keyspace("users")
			for i := range 300 {
				if _, err := ks.Put(ctx, fmt.Appendf(nil, "k%04d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			status := func() server.ProcessStatus {
				t.Helper()
				resp, err := http.Get("http://" + p.ControlAddr() + "/status")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var ps server.ProcessStatus
				if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil || ps.Balancer == nil {
					t.Fatalf("/status: %v, balancer %v", err, ps.Balancer)
				}
				return ps
			}
			if interval == 0 {
				time.Sleep(300 * time.Millisecond)
				if st := status().Balancer; st.State != "off" || st.Moves != 0 || st.Rounds != 0 {
					t.Fatalf("balancer off: %+v", st)
				}
				return
			}
			var st *client.BalancerStatus
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				st = status().Balancer
				if st.Moves >= 2 && st.State == "balanced" && len(st.Tablets) == 3 && slices.Min(st.Tablets) >= 1 && slices.Max(st.Tablets)-slices.Min(st.Tablets) <= 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not spread after 30s: %+v", st)
				}
			}
			if st.Last == nil || st.Last.Source == st.Last.Target || st.Last.Err != "" || st.Interval != "100ms" {
				t.Fatalf("balancer status %+v, last move %+v", st, st.Last)
			}
			// The groups' write load the rounds measured (per-tablet
			// write counts: fewer than MinWrites here, so the count rule
			// decided).
			if len(st.Writes) != 3 {
				t.Fatalf("balancer status %+v: want each group's writes", st)
			}
			// /metrics shows the status it reads at that moment; the
			// groups go on splitting tablets past FirstTabletMax and the
			// balancer may move one more, so the status to compare with
			// is read again until both agree (a count read between a
			// change and the metrics once failed: group 2's tablets).
			var missing []string
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				now := status().Balancer
				resp, err := http.Get("http://" + p.ControlAddr() + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				missing = missing[:0]
				for _, want := range []string{fmt.Sprintf("rdmakv_balancer_moves_total %d", now.Moves), "rdmakv_balancer_active 1", fmt.Sprintf(`rdmakv_balancer_tablets{group="2"} %d`, now.Tablets[2]),
					"rdmakv_balancer_splits_total 0", `rdmakv_balancer_writes{group="0"}`, `rdmakv_balancer_garbage_keys{group="0"}`, "rdmakv_balancer_garbage_collected_total",
					"rdmakv_balancer_leftovers_removed_total 0"} {
					if !strings.Contains(string(b), want) {
						missing = append(missing, want)
					}
				}
				if len(missing) == 0 || time.Now().After(deadline) {
					break
				}
			}
			for _, want := range missing {
				t.Errorf("/metrics has no %q", want)
			}
			i := 0
			for kv, err := range ks.Scan(ctx, nil, nil) {
				if err != nil {
					t.Fatal(err)
				}
				if string(kv.Key) != fmt.Sprintf("k%04d", i) || string(kv.Value) != fmt.Sprintf("v%d", i) {
					t.Fatalf("pair %d: %s=%s", i, kv.Key, kv.Value)
				}
				i++
			}
			if i != 300 {
				t.Fatalf("%d keys after the moves, want 300", i)
			}
		})
	}
}
