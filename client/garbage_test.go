package client_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/localcluster"
)

// TestQuietGroupCollectsGarbage: a tablet of more keys than a log
// entry's garbage budget moves away from its group, and no ordered
// request reaches that group afterwards: it publishes the keys its drop
// left (more than 0). The balancer's rounds ("balancer"), or
// Client.CollectGarbage ("call"), bring the published count to 0, the
// collection's own answer says 0 left, and the balancer's status counts
// what it collected. Planted noCollect (rounds send no collection) leaves
// the garbage where it was, and the test catches it.
func TestQuietGroupCollectsGarbage(t *testing.T) {
	for _, mode := range []string{"balancer", "call", "noCollect"} {
		t.Run(mode, func(t *testing.T) {
			const n = 700
			c, ks := oneTabletCluster(t, "gc"+mode, 3, n)
			ctx := context.Background()
			tbs, count := tabletsOf(t, c)
			var big client.TabletInfo
			for _, tb := range tbs {
				if tb.Keys > big.Keys {
					big = tb
				}
			}
			if big.Keys != n {
				t.Fatalf("tablets %+v: want one holding the %d keys", tbs, n)
			}
			from, to := big.Group, uint32(0)
			for g := range count {
				if count[g] == 0 {
					to = uint32(g)
				}
			}
			if to == from || count[to] != 0 {
				t.Fatalf("tablets per group %v: want an empty group to move to", count)
			}
			if err := c.MoveTablet(ctx, big.Low, to); err != nil {
				t.Fatal(err)
			}
			// The drop's own log entry deleted a budget's worth; the rest
			// waits, published.
			var left int64
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				gs, err := c.GroupGarbage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if left = gs[from]; left == n-btree.DefaultGarbageStep {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("group %d publishes %d garbage keys, want %d", from, left, n-btree.DefaultGarbageStep)
				}
			}
			b := client.NewBalancer(client.BalancerConfig{})
			switch mode {
			case "call":
				if got, err := c.CollectGarbage(ctx, from); err != nil || got != 0 {
					t.Fatalf("CollectGarbage: %d left, %v", got, err)
				}
			case "noCollect":
				client.PlantBalancerNoCollect(b)
				fallthrough
			default:
				for r := range 3 {
					if err := b.Round(ctx, c); err != nil {
						t.Fatalf("round %d: %v", r, err)
					}
				}
			}
			var gs []int64
			wait := 20 * time.Second
			if mode == "noCollect" {
				wait = time.Second // the garbage must stay: no need to wait long
			}
			for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
				var err error
				if gs, err = c.GroupGarbage(ctx); err != nil {
					t.Fatal(err)
				}
				if gs[from] == 0 || time.Now().After(deadline) {
					break
				}
			}
			if mode == "noCollect" {
				if gs[from] != left {
					t.Fatalf("planted noCollect: group %d publishes %d garbage keys, want %d still", from, gs[from], left)
				}
				t.Logf("planted noCollect caught: group %d still publishes %d garbage keys after 3 rounds", from, gs[from])
				return
			}
			if gs[from] != 0 {
				t.Fatalf("group %d publishes %d garbage keys, want 0 (status %+v)", from, gs[from], b.Status())
			}
			if mode == "balancer" {
				st := b.Status()
				if st.GarbageCollected != uint64(left) || st.Collections < 2 || len(st.Garbage) != 3 || st.Garbage[from] != 0 || st.Moves != 0 {
					t.Fatalf("balancer status %+v: want %d garbage keys collected, none left, no move", st, left)
				}
			}
			// Idempotent: nothing left to collect, and the keys all moved.
			if got, err := c.CollectGarbage(ctx, from); err != nil || got != 0 {
				t.Fatalf("CollectGarbage after: %d left, %v", got, err)
			}
			if got := scanAll(t, ks, nil, nil); len(got) != n {
				t.Fatalf("%d keys after the collection, want %d", len(got), n)
			}
		})
	}
}

// oneTabletCluster starts a local cluster of groups groups whose
// keyspace "users" keeps one tablet (it never splits by itself), opens a
// client and puts n keys k0000... with values v0... (oneTablet).
func oneTabletCluster(t *testing.T, name string, groups, n int) (*client.Client, *client.Keyspace) {
	t.Helper()
	o := startOneTablet(t, name, groups, n)
	return o.c, o.ks
}

// oneTablet is oneTabletCluster's cluster, its client on slot 0, the
// client's keyspace "users" and the pairs it put.
type oneTablet struct {
	lc   *localcluster.Cluster
	c    *client.Client
	ks   *client.Keyspace
	want map[string]string
}

func startOneTablet(t *testing.T, name string, groups, n int) *oneTablet {
	t.Helper()
	m := orderedMap(name, groups)
	m.Keyspaces[0].FirstTabletMax = 1 << 20 // one tablet: no split
	o := &oneTablet{lc: startLocal(t, m), want: make(map[string]string, n)}
	o.c = open(t, o.lc, 0)
	o.ks = o.c.Keyspace("users")
	for i := range n {
		k, v := fmt.Sprintf("k%04d", i), fmt.Sprintf("v%d", i)
		if _, err := o.ks.Put(context.Background(), []byte(k), []byte(v)); err != nil {
			t.Fatal(err)
		}
		o.want[k] = v
	}
	return o
}

// checkPairs fails the test unless a scan of ks gives the pairs of want,
// each once.
func checkPairs(t *testing.T, ks *client.Keyspace, want map[string]string) {
	t.Helper()
	got := scanAll(t, ks, nil, nil)
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for _, kv := range got {
		if v, ok := want[string(kv.Key)]; !ok || v != string(kv.Value) {
			t.Fatalf("%s=%s, want %q (present %v)", kv.Key, kv.Value, v, ok)
		}
	}
}

// moveStopsBefore runs c's move of the tablet at low to group to until
// the step named step, where its goroutine ends (as a mover that died:
// the steps before it done, that one and the rest not sent), and fails
// the test if the move was not cut short there.
func moveStopsBefore(t *testing.T, c *client.Client, low []byte, to uint32, step string) {
	t.Helper()
	client.SetMoveHook(c, func(s string) {
		if s == step {
			runtime.Goexit()
		}
	})
	defer client.SetMoveHook(c, nil)
	done := make(chan error, 1)
	go func() {
		defer close(done)
		done <- c.MoveTablet(context.Background(), low, to)
	}()
	if err, ok := <-done; ok {
		t.Fatalf("the move did not stop before its %s: %v", step, err)
	}
}
