package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestControlPort checks each endpoint of the control port against a
// local cluster: status, metrics, health, readiness (before and after a
// group loses its leader's majority), the map, and pprof only when asked.
func TestControlPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := &cluster.Map{Name: "ctl", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	reps := lc.Replicas()
	wctx, wstop := context.WithCancel(ctx)
	defer wstop()
	watched := make(chan struct{})
	go func() {
		server.Watch(wctx, reps, log)
		close(watched)
	}()
	c, err := server.StartControl("127.0.0.1:0", m, reps, false, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := "http://" + c.Addr()

	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	// A serving cluster is ready and its status shows one serving leader
	// per group that every replica follows. On a loaded machine (-race, a
	// 30 ms election timeout) a group may elect again at any moment, so
	// this waits for a sample that shows it settled rather than failing
	// on the first.
	var code int
	var body string
	var ps server.ProcessStatus
	settled := func() error {
		if c, b := get(t, base+"/readyz"); c != 200 {
			return fmt.Errorf("/readyz of a serving cluster: %d %q", c, b)
		}
		code, body = get(t, base+"/status")
		ps = server.ProcessStatus{}
		if err := json.Unmarshal([]byte(body), &ps); code != 200 || err != nil {
			return fmt.Errorf("/status: %d %v %q", code, err, body)
		}
		if ps.Cluster != "ctl" || len(ps.Replicas) != 6 {
			return fmt.Errorf("/status: cluster %q, %d replicas", ps.Cluster, len(ps.Replicas))
		}
		leaders := map[int]int{}
		for _, r := range ps.Replicas {
			if r.Role == "leader" {
				leaders[r.Group]++
				if !r.Serving {
					return fmt.Errorf("leader %d not serving", r.Node)
				}
			}
			if r.Leader == 0 || len(r.Members) != 3 {
				return fmt.Errorf("replica %d: leader %d, %d members", r.Node, r.Leader, len(r.Members))
			}
		}
		if leaders[0] != 1 || leaders[1] != 1 {
			return fmt.Errorf("leaders per group %v", leaders)
		}
		return nil
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := settled()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not settle in 20 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkStatusSchema(t, body)
	code, body = get(t, base+"/metrics")
	for _, want := range []string{`rdmakv_role{group="0",node="1",role=`, `rdmakv_serving{group="1",node="4"}`, "rdmakv_delivered_total", "rdmakv_poll_busy_seconds_bucket", "go_memstats_heap_alloc_bytes", "rdmakv_member_up"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	code, body = get(t, base+"/map")
	var got cluster.Map
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || got.Fill() != nil || len(got.Groups) != 2 {
		t.Errorf("/map: %d %v %+v", code, err, got)
	}
	if code, _ := get(t, base+"/debug/pprof/"); code != 404 {
		t.Errorf("pprof without --pprof: %d, want 404", code)
	}

	// Group 1 loses its leader and another replica: the last one elects
	// forever, so the process is not ready, and the log says why.
	l := lc.Leader(1)
	lc.Stop(1, l)
	lc.Stop(1, (l+1)%3)
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body = get(t, base+"/readyz")
		if code == 503 {
			break
		}
		if time.Now().After(deadline) {
			_, st := get(t, base+"/status")
			t.Fatalf("/readyz with group 1 down to one replica: %d %q\n%s", code, body, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, "group 1") || !strings.Contains(body, "electing") && !strings.Contains(body, "unreachable") {
		t.Errorf("/readyz says %q: want the group and why", body)
	}
	// Once the survivor gave up on its leader, it says its group cannot
	// elect, and which replicas it misses.
	gone := []rdma.NodeID{lc.Map.Groups[1][l], lc.Map.Groups[1][(l+1)%3]}
	slices.Sort(gone)
	want := fmt.Sprintf("group 1 cannot elect a leader: replicas %d and %d unreachable", gone[0], gone[1])
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(body, want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz says %q: want %q", body, want)
		}
		_, body = get(t, base+"/readyz")
	}
	time.Sleep(50 * time.Millisecond) // a Watch tick
	wstop()
	<-watched
	if !regexp.MustCompile(`msg=role group=\d+ node=\d+ role=(leader|follower) epoch=\(\d+,\d+\)`).MatchString(logs.String()) || !strings.Contains(logs.String(), "not ready: its leader") {
		t.Errorf("no role logged:\n%s", logs.String())
	}
}

// TestControlPortInUse: a control address in use is refused with the
// address in the error.
func TestControlPortInUse(t *testing.T) {
	m := &cluster.Map{Name: "ctl2", Fabric: "mem", Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100}}
	m.Fill()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := server.StartControl("127.0.0.1:0", m, nil, true, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if code, _ := get(t, "http://"+c.Addr()+"/debug/pprof/"); code != 200 {
		t.Errorf("pprof with --pprof: %d", code)
	}
	if _, err := server.StartControl(c.Addr(), m, nil, false, log); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("second control port on %s: %v", c.Addr(), err)
	}
}

// checkStatusSchema checks /status's JSON as docs/operations.md describes
// it: every key snake_case (the counters' too), and epochs numbers, round
// << 32 | leader node, as kvcli status --json has them.
func checkStatusSchema(t *testing.T, body string) {
	t.Helper()
	var raw any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if !snake.MatchString(k) {
					t.Errorf("/status key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), x)
			}
		}
	}
	walk("", raw)
	for _, r := range raw.(map[string]any)["replicas"].([]any) {
		r := r.(map[string]any)
		for _, k := range []string{"elections_started", "snapshots_restored", "delivered"} {
			if _, ok := r["counters"].(map[string]any)[k]; !ok {
				t.Errorf("/status counters lack %q: %v", k, r["counters"])
			}
		}
		// huge_pages: the mode and why (mem: AllocMemory's anonymous
		// memory, madvised or off).
		if hp, _ := r["huge_pages"].(map[string]any); hp == nil || hp["mode"] == "" || hp["mode"] == nil || hp["reason"] == "" || hp["reason"] == nil || hp["mode"] == "unknown" {
			t.Errorf("/status huge_pages %v: want a mode and a reason", r["huge_pages"])
		}
		e, ok := r["epoch"].(float64)
		if !ok {
			t.Errorf("/status epoch %v (%T): want a number", r["epoch"], r["epoch"])
			continue
		}
		if r["role"] != "electing" && (uint64(e)>>32 != uint64(r["round"].(float64)) || uint64(e)&0xffffffff != uint64(r["leader"].(float64))) {
			t.Errorf("/status epoch %v, round %v, leader %v: want round << 32 | leader", e, r["round"], r["leader"])
		}
	}
}
