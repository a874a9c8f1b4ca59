package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// runMulticastJSON runs kvbench multicast with args and --json and returns
// its rows.
func runMulticastJSON(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	rows, _ := runJSONLines(t, append([]string{"multicast", "--json", "--runs", "1", "--retries", "0", "--shm-dir", t.TempDir()}, args...)...)
	return rows
}

// positive checks that row has every key of keys with a positive number.
func positive(t *testing.T, row map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := row[k].(float64); !ok || v <= 0 {
			t.Errorf("row %v: %q = %v, want a positive number", row, k, row[k])
		}
	}
}

// TestMulticastJSON runs the multicast benchmark briefly over two groups of
// three replicas: a Fig. 5 row per destination count, Table 1's leader
// changes with their delayed messages, the client path on shm (replicas in
// a child process, a one-way baseline) and the single-group tax against a
// broadcast group; every line carries the required keys.
func TestMulticastJSON(t *testing.T) {
	rows := runMulticastJSON(t, "--fig", "5,table1,client,tax", "--groups", "2", "--duration", "100ms",
		"--election-timeout", "50ms", "--clients", "2", "--window", "2")
	required := []string{"bench", "fig", "tree", "groups", "dests", "replicas", "size", "p50_ns", "p99_ns", "ops_per_s"}
	figs := map[string]int{}
	changes := map[float64]bool{}
	trees := map[any]int{}
	for _, r := range rows {
		hasKeys(t, r, required...)
		if r["bench"] != "multicast" || r["groups"] != 2.0 || r["replicas"] != 3.0 {
			t.Errorf("row %v: want bench multicast, 2 groups of 3", r)
		}
		fig, _ := r["fig"].(string)
		figs[fig]++
		if p, _ := r["placement"].(string); !strings.HasPrefix(p, mcRuntime+":") {
			t.Errorf("row %v: placement %q, want the default, runtime", r, p)
		}
		switch fig {
		case "5":
			positive(t, r, "p50_ns", "p99_ns", "ops_per_s", "dests")
			trees[r["tree"]]++
			if r["fabric"] != "mem" || r["dest_kind"] != "random" || r["clients"] != 2.0 || r["window"] != 2.0 {
				t.Errorf("fig 5 row %v: want mem, random destinations, 2 clients W=2", r)
			}
		case "table1":
			positive(t, r, "p50_ns", "ops_per_s")
			if r["tree"] != "breadth" || r["dests"] != 2.0 {
				t.Errorf("table1 row %v: want the breadth tree, messages to both groups", r)
			}
			if c, ok := r["change"].(float64); ok {
				changes[c] = true
				positive(t, r, "change_ns", "count", "avg_ns", "min_ns", "max_ns", "baseline_p50_ns", "ratio")
				if r["min_ns"].(float64) > r["avg_ns"].(float64) || r["avg_ns"].(float64) > r["max_ns"].(float64) {
					t.Errorf("table1 row %v: min, avg, max out of order", r)
				}
			}
		case "client", "tax":
			positive(t, r, "p50_ns", "p99_ns", "ops_per_s", "baseline_p50_ns", "ratio", "target")
			if r["dests"] != 1.0 || r["window"] != 1.0 || r["clients"] != 1.0 {
				t.Errorf("%s row %v: want one client, W=1, single-group messages", fig, r)
			}
			if want := map[string]string{"client": "shm", "tax": "mem"}[fig]; r["fabric"] != want {
				t.Errorf("%s row %v: fabric %v, want %s", fig, r, r["fabric"], want)
			}
		default:
			t.Errorf("unexpected row %v", r)
		}
	}
	// Fig. 5: k = 1, 2 (the default 4 and 8 exceed 2 groups) for each of
	// the three trees; table1: a normal row and three changes.
	if figs["5"] != 6 || trees["base"] != 2 || trees["breadth"] != 2 || trees["depth"] != 2 ||
		figs["table1"] != 4 || figs["client"] != 1 || figs["tax"] != 1 || len(changes) != 3 {
		t.Errorf("rows by figure %v, fig 5 trees %v, changes %v; want 6 fig 5 (k=1,2 for base, breadth, depth), 4 table1 (changes 1-3), 1 client, 1 tax",
			figs, trees, changes)
	}
}

// TestMulticastScale runs the scaling figure (both default placements: a
// node per replica on kvserver's runtime, and nodes shared by the groups
// with one poller each) and
// Fig. 6 over breadth trees of 1 and 3 groups: the 3-group rows have a
// speedup over the 1-group row of the same run and placement, and Fig.
// 6's destinations are adjacent.
func TestMulticastScale(t *testing.T) {
	rows := runMulticastJSON(t, "--fig", "scale,6", "--tree", "breadth", "--groups", "1,3", "--dests", "2",
		"--duration", "100ms", "--election-timeout", "50ms", "--window", "2")
	var scale, six int
	placements := map[any]int{}
	for _, r := range rows {
		switch r["fig"] {
		case "scale":
			scale++
			placements[r["placement"]]++
			if r["groups"] == 1.0 && r["speedup"] != 1.0 {
				t.Errorf("scale row %v: the 1-group row is its placement's baseline", r)
			}
			positive(t, r, "ops_per_s", "p50_ns", "speedup")
			if r["dests"] != 1.0 || r["clients"] != 2*r["groups"].(float64) {
				t.Errorf("scale row %v: want single-group messages, 2 clients per group", r)
			}
		case "6":
			six++
			positive(t, r, "ops_per_s", "p50_ns")
			if r["dest_kind"] != "adjacent" || r["groups"] != 3.0 || r["dests"] != 2.0 {
				t.Errorf("fig 6 row %v: want 2 adjacent destinations of 3 groups", r)
			}
		}
	}
	if scale != 4 || six != 1 || placements[mcPlacement("scale", "mem", mcRuntime)] != 2 || placements[mcPlacement("scale", "mem", mcShared)] != 2 {
		t.Errorf("%d scale rows (by placement %v), %d fig 6 rows; want 2 per placement and 1:\n%v", scale, placements, six, rows)
	}
}

// TestAdjacentSet checks that Fig. 6's destination sets are connected
// sets of k groups.
func TestAdjacentSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, shape := range []string{"base", "breadth", "depth"} {
		tr, err := tree.Shape(shape, 8)
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= 8; k++ {
			for range 50 {
				s := adjacentSet(tr, k, rng)
				if s.Len() != k {
					t.Fatalf("%s k=%d: %v has %d groups", shape, k, s, s.Len())
				}
				// connected: exactly one group of s has its parent outside s
				tops := 0
				for _, g := range s.Groups() {
					if p, ok := tr.Parent(g); !ok || !s.Has(p) {
						tops++
					}
				}
				if tops != 1 {
					t.Fatalf("%s k=%d: %v is not connected (%d tops)", shape, k, s, tops)
				}
			}
		}
	}
}

// TestMulticastFlags checks the figure defaults and flag errors.
func TestMulticastFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseMulticastFlags([]string{"--fig", "all"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range o.figs {
		var trees []string
		for _, tr := range f.trees {
			trees = append(trees, fmt.Sprintf("%s/%d", tr.name, tr.t.Len()))
		}
		got = append(got, fmt.Sprintf("%s %v r%v k%v s%v %s c%d w%d p%v", f.name, trees, f.replicas, f.dests, f.sizes, f.fabric, f.clients, f.window, f.placements))
	}
	want := []string{
		"5 [base/8 breadth/8 depth/8] r[3] k[1 2 4 8] s[64] mem c8 w4 p[runtime]",
		"6 [base/8 breadth/8 depth/8] r[3] k[2 4] s[64] mem c8 w4 p[runtime]",
		"7 [base/8] r[3] k[1 8] s[64 256 1024 4096 16384] mem c8 w4 p[runtime]",
		"8 [0:1,2/3] r[3 5 7] k[1 2 3] s[64] mem c8 w4 p[runtime]",
		"table1 [breadth/8] r[3] k[8] s[64] mem c16 w4 p[runtime]",
		"client [base/1] r[3] k[1] s[64] shm c1 w1 p[runtime]",
		"tax [base/1] r[3] k[1] s[64] mem c1 w1 p[runtime]",
		"scale [breadth/1 breadth/2 breadth/4 breadth/8] r[3] k[1] s[64] mem c2 w4 p[runtime shared]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("figure defaults:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range [][]string{{"--fig", "9"}, {"--replicas", "4"}, {"--fabric", "tcp"}, {"--tree", "0:0"}, {"--size", "4"}, {"--fig", "table1", "--replicas", "1"},
		{"--placement", "goroutines"}, {"--fig", "tax", "--placement", "shared"}, {"--fig", "table1", "--placement", "runtime,shared"}} {
		if _, err := parseMulticastFlags(bad, &stderr); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
}

// TestMulticastLateCompletion: a measurement whose window passed before
// any message completed (one message outlasting it on a busy machine)
// counts the first completion after it and measures ops/s until then,
// instead of failing with "no message completed"; later ones do not
// count.
func TestMulticastLateCompletion(t *testing.T) {
	now := time.Now()
	sp := &mcLoadSpec{from: now.Add(-2 * time.Second), to: now.Add(-time.Second)}
	l := &mcLoader{sent: make([]time.Time, 4)}
	res := &mcLoadResult{}
	l.sp, l.res = sp, res
	for seq := range uint64(3) {
		l.sent[seq%4] = now.Add(-3 * time.Second)
		l.done(&multicast.Outcome{ID: multicast.MsgID{Seq: seq}, Dst: tree.Of(0), Replies: []multicast.Reply{{Group: 0, Index: seq + 1}}})
	}
	if res.n != 1 || res.bad != 0 {
		t.Fatalf("three completions after the window, none in it: %d measured (%d bad), want the first", res.n, res.bad)
	}
	m := merge(sp, []mcLoadResult{*res}, time.Second)
	if m.err != nil || m.n != 1 || m.p50 <= 0 {
		t.Fatalf("merge: %+v", m)
	}
	// One op over at least the 2 s from the window's start to it.
	if m.opsPerS <= 0 || m.opsPerS > 0.5 {
		t.Errorf("ops/s %v, want over the lengthened window (at most 0.5)", m.opsPerS)
	}
}

// goid is the calling goroutine's id (from its stack header).
func goid() string {
	b := make([]byte, 64)
	b = b[:goruntime.Stack(b, false)]
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// TestMulticastPlacement checks where each placement polls the replicas:
// runtime (every figure's default) polls a group's replicas on one
// goroutine, as kvserver's pollers do, also after a replica crashed (left
// its poller) and restarted (joined it again); own polls each replica on a
// goroutine of its own. The tax's runtime baseline runs its group's
// members as one poller's tasks.
func TestMulticastPlacement(t *testing.T) {
	ctx := context.Background()
	tr, err := tree.Shape("breadth", 3)
	if err != nil {
		t.Fatal(err)
	}
	pollers := func(c *mcCluster, x *mcReplica) string {
		var id string
		if !x.do(func() { id = goid() }) {
			t.Fatalf("group %d replica %d is not polled", x.g, x.i)
		}
		return id
	}
	for _, pl := range []string{mcRuntime, mcOwn} {
		c, err := openMcCluster(ctx, mcSpec{fabric: "mem", tree: tr, replicas: 3, window: 1, slotSize: mcSlotSize(64), et: 50 * time.Millisecond, placement: pl})
		if err != nil {
			t.Fatal(err)
		}
		groupsOf := func() (per [][]string, distinct int) {
			seen := map[string]bool{}
			for _, rs := range c.reps {
				var ids []string
				for _, x := range rs {
					id := pollers(c, x)
					ids = append(ids, id)
					seen[id] = true
				}
				per = append(per, ids)
			}
			return per, len(seen)
		}
		per, n := groupsOf()
		for g, ids := range per {
			same := ids[0] == ids[1] && ids[1] == ids[2]
			if pl == mcRuntime && !same || pl == mcOwn && n != 9 {
				t.Errorf("placement %s: group %d's replicas polled on goroutines %v (%d distinct in all)", pl, g, ids, n)
			}
		}
		if pl == mcRuntime {
			// crash group 1's replica 0 and restart it: it joins its group's poller
			x := c.reps[1][0]
			x.cancel()
			<-x.done
			if err := x.halt(); err != nil {
				t.Fatal(err)
			}
			if err := restart(ctx, c, []*mcReplica{x}); err != nil {
				t.Fatal(err)
			}
			if per, _ := groupsOf(); per[1][0] != per[1][1] || per[1][1] != per[1][2] {
				t.Errorf("after a restart, group 1's replicas polled on goroutines %v", per[1])
			}
		}
		if err := c.check(); err != nil {
			t.Error(err)
		}
		if err := c.close(); err != nil {
			t.Error(err)
		}
	}
	g, err := openGroupRuntime(ctx, groupSpec{"mem", 3}, groupproc.Tuning{ElectionTimeout: 50 * time.Millisecond}, 0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	if st := g.pg.Stats(); len(st) != 1 || st[0].Tasks != 3 {
		t.Errorf("the runtime baseline's poller group: %+v, want one poller with the 3 members", st)
	}
}
