package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestProcessTwoGroupsOneNode: one node runtime hosts replica 0 of each
// of two groups (kvserver --id 1,4), a second hosts the other four. The
// first one's pollers own both its replicas; clients write to both
// groups; a paused replica's table header stays readable one-sided and
// does not move while the others apply; resumed, it catches up; a
// stopped one is gone (Do refuses) while its group goes on; Close of both
// leaves no file in the shm directory.
func TestProcessTwoGroupsOneNode(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-proctest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	m := &cluster.Map{Name: "proc", Fabric: "shm", ShmDir: dir,
		Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	bc := broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
	a, err := server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{1, 4}, Broadcast: bc})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{2, 3, 5, 6}, Broadcast: bc})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !a.Hosts(0, 0) || !a.Hosts(1, 0) || a.Hosts(0, 1) || b.Hosts(0, 0) {
		t.Fatalf("hosts: a (0,0) %v (1,0) %v (0,1) %v; b (0,0) %v", a.Hosts(0, 0), a.Hosts(1, 0), a.Hosts(0, 1), b.Hosts(0, 0))
	}
	tasks := 0
	for _, st := range a.PollerStats() {
		tasks += st.Tasks
	}
	if tasks != 2 || len(a.Replicas()) != 2 {
		t.Fatalf("process a: pollers own %d tasks, %d replicas; want 2 and 2", tasks, len(a.Replicas()))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cn, err := a.ClientNode(0)
	if err != nil {
		t.Fatal(err)
	}
	c := openClient(t, a, m)
	defer c.Close()
	n := 0
	put := func(k int) {
		t.Helper()
		for range k {
			key := fmt.Sprintf("k%d", n)
			n++
			if _, err := c.Put(ctx, []byte(key), []byte("v")); err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
		}
	}
	put(40)
	groups := map[uint32]bool{}
	for i := range n {
		groups[m.GroupOf(fmt.Appendf(nil, "k%d", i))] = true
	}
	if len(groups) != 2 {
		t.Fatalf("the keys went to groups %v, want both", groups)
	}

	// A paused replica's memory stays readable and frozen.
	readHeader := func(id rdma.NodeID, g uint32) kv.Header {
		t.Helper()
		conn, err := cn.Connect(id)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		h, err := kv.ReadHeader(conn, g, 5*time.Second)
		if err != nil {
			t.Fatalf("read node %d's header: %v", id, err)
		}
		return h
	}
	appliedDo := func(p *server.Process, g, i int) uint64 {
		t.Helper()
		var ap uint64
		if err := p.Do(g, i, func(r *kv.Replica) { ap = r.Table().Header().Applied }); err != nil {
			t.Fatal(err)
		}
		return ap
	}
	a.Pause(0, 0)
	frozen := readHeader(1, 0)
	put(40)
	if h := readHeader(1, 0); h.Applied != frozen.Applied {
		t.Fatalf("paused replica's applied index moved from %d to %d", frozen.Applied, h.Applied)
	}
	if ap := appliedDo(a, 0, 0); ap != frozen.Applied {
		t.Fatalf("Do on the paused replica sees applied %d, its memory %d", ap, frozen.Applied)
	}
	a.Resume(0, 0)
	var leaderApplied uint64
	for i := range 3 {
		if b.Hosts(0, i) && b.Leader(0) == i {
			leaderApplied = appliedDo(b, 0, i)
		}
	}
	for readHeader(1, 0).Applied < max(leaderApplied, frozen.Applied+1) {
		if ctx.Err() != nil {
			t.Fatalf("the resumed replica did not catch up: applied %d, the group's leader %d", readHeader(1, 0).Applied, leaderApplied)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A stopped replica is gone; its group goes on.
	a.Stop(0, 0)
	if a.Hosts(0, 0) {
		t.Fatal("a stopped replica is still hosted")
	}
	if err := a.Do(0, 0, func(*kv.Replica) {}); err == nil {
		t.Fatal("Do on a stopped replica succeeded")
	}
	put(40)

	c.Close()
	a.Close()
	b.Close()
	a.Close() // twice is fine
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("left in the shm directory after Close: %s", e.Name())
	}
}

// TestStatusPollerStats: a Process's /status carries its pollers'
// counters (every replica owned by one of them), which move while puts
// run, and /metrics exports them.
func TestStatusPollerStats(t *testing.T) {
	m := &cluster.Map{Name: "pstat", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	ln, err := server.ListenControl("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := server.StartProcess(server.ProcessConfig{Map: m, Control: ln,
		Broadcast: broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 30 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	statusBody := func() string {
		_, body := get(t, "http://"+p.ControlAddr()+"/status")
		return body
	}
	status := func() server.ProcessStatus {
		t.Helper()
		code, body := get(t, "http://"+p.ControlAddr()+"/status")
		var ps server.ProcessStatus
		if code != 200 {
			t.Fatalf("/status: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &ps); err != nil {
			t.Fatalf("/status: %v in %s", err, body)
		}
		return ps
	}
	sum := func(ps server.ProcessStatus) (tasks int, passes uint64) {
		for _, st := range ps.Pollers {
			tasks += st.Tasks
			passes += st.Passes
		}
		return
	}
	before := status()
	if len(before.Pollers) == 0 {
		t.Fatal("/status has no pollers")
	}
	if tasks, _ := sum(before); tasks != 6 {
		t.Fatalf("/status: pollers own %d replicas, want 6: %+v", tasks, before.Pollers)
	}
	c := openClient(t, p, m)
	defer c.Close()
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	after := status()
	_, p0 := sum(before)
	_, p1 := sum(after)
	if p1 <= p0 {
		t.Fatalf("poller passes did not move over 50 puts: %d then %d", p0, p1)
	}
	if !strings.Contains(statusBody(), `"pass_max_recent_us"`) {
		t.Fatal("/status lacks pass_max_recent_us")
	}
	for _, st := range after.Pollers {
		// a pass polls every replica it owns: it takes some time
		if st.Tasks > 0 && (st.PassMaxUs <= 0 || st.PassMaxRecentUs > st.PassMaxUs) {
			t.Fatalf("poller %d: pass_max_us %v, pass_max_recent_us %v: want a positive max, and the recent one at most it", st.Poller, st.PassMaxUs, st.PassMaxRecentUs)
		}
	}
	code, body := get(t, "http://"+p.ControlAddr()+"/metrics")
	for _, name := range []string{"rdmakv_poller_passes_total{poller=\"0\"}", "rdmakv_poller_parks_total", "rdmakv_poller_wakes_total", "rdmakv_poller_spin_hits_total", "rdmakv_poller_tasks"} {
		if code != 200 || !strings.Contains(body, name) {
			t.Fatalf("/metrics (%d) lacks %s", code, name)
		}
	}
}

// TestStartProcessFailsCleanly: a Process that cannot open one of its
// nodes (another process's runtime holds it) fails with the fabric's
// one-line error and releases what it had opened: its other node's files
// and its control listener.
func TestStartProcessFailsCleanly(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-procfail-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	m := &cluster.Map{Name: "pf", Fabric: "shm", ShmDir: dir, Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	holder, err := server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	before, _ := os.ReadDir(dir)
	ln, err := server.ListenControl("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, err = server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{1, 2}, Control: ln})
	if err == nil || !strings.Contains(err.Error(), "node 2 already runs") {
		t.Fatalf("StartProcess of a node another runtime holds: %v", err)
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("the control listener is still open after the failed start")
	}
	after, _ := os.ReadDir(dir)
	if len(after) != len(before) {
		t.Errorf("shm files before the failed start %d, after %d: %v", len(before), len(after), after)
	}
	if _, err := server.StartProcess(server.ProcessConfig{Map: m, IDs: []rdma.NodeID{7}}); err == nil || !strings.Contains(err.Error(), "not a replica") {
		t.Errorf("StartProcess of a node not in the map: %v", err)
	}
}
