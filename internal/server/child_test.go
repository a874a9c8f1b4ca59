package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/childproc"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

// TestMain plays the replica child when spawned as one (SpawnChild).
func TestMain(m *testing.M) {
	childproc.ServeIfChild()
	os.Exit(m.Run())
}

// TestChildServesAndExitsOnSIGTERM: a replica child spawned through the
// one mechanism (this test binary re-executed as a child of kind "kv") runs a 1x3
// cluster on shm, answers stats and status (its pollers' counters
// included), serves a client's puts from this process, and on SIGTERM
// closes its replicas and exits with status 0, leaving no shm file.
func TestChildServesAndExitsOnSIGTERM(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-childtest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	m := &cluster.Map{Name: "child", Fabric: "shm", ShmDir: dir, Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ch, err := server.SpawnChild(cmd, server.ChildConfig{Map: m, Heartbeat: time.Millisecond, ElectionTimeout: 50 * time.Millisecond, Control: "127.0.0.1:0"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Kill()
	if ch.Ready.Pid != ch.Pid() || ch.Ready.Control == "" {
		t.Fatalf("ready line %+v (pid %d)", ch.Ready, ch.Pid())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	node, err := fabric.Open(fabric.ForMap(m), 100)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Open(ctx, client.WithMap(m), client.WithNode(node))
	if err != nil {
		node.Close()
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	node.Close()
	stats, err := ch.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 3 {
		t.Fatalf("stats of %d replicas, want 3", len(stats))
	}
	for _, s := range stats {
		if s.Records != 20 {
			// Followers apply after the leader replies: wait a little.
			time.Sleep(50 * time.Millisecond)
			if stats, err = ch.Stats(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	for i, s := range stats {
		if s.Records != 20 {
			t.Errorf("replica %d holds %d records, want 20", i, s.Records)
		}
	}
	st, err := ch.Request(ctx, server.ChildStatus)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Replicas) != 3 || len(st.Pollers) == 0 || st.Pollers[0].Passes == 0 {
		t.Fatalf("status: %d replicas, pollers %+v", len(st.Replicas), st.Pollers)
	}

	if err := syscall.Kill(ch.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not exit within 30 s of SIGTERM")
	}
	if err := ch.Close(time.Second); err != nil {
		t.Fatalf("the child's exit after SIGTERM: %v", err)
	}
	left, _ := os.ReadDir(dir)
	for _, e := range left {
		t.Errorf("left in the shm directory after the child's exit: %s", e.Name())
	}
}

// TestChildSpareP: a replica child runs its pollers with the spare P its
// parent's ChildConfig names, and with none named takes the default,
// auto, as kvserver does (/status spare_p). A child that ignored the
// config (or read its environment instead) shows one answer for both. A
// bad value ends the child with a line naming the key.
func TestChildSpareP(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "rdmakv-childspare-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for k, c := range []struct{ set, want string }{{"off", "off"}, {"", "auto"}, {"auto", "auto"}, {"never", ""}} {
		m := &cluster.Map{Name: fmt.Sprintf("spare%d", k), Fabric: "shm", ShmDir: dir, Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100}}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		ch, err := server.SpawnChild(cmd, server.ChildConfig{Map: m, Heartbeat: time.Millisecond, ElectionTimeout: 50 * time.Millisecond, Control: "127.0.0.1:0", SpareP: c.set}, time.Minute)
		if c.want == "" {
			if err == nil || !strings.Contains(err.Error(), `spare_p "never": want "auto" or "off"`) {
				t.Errorf("spare_p %q: %v, want a refusal naming spare_p", c.set, err)
			}
			if err == nil {
				ch.Kill()
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + ch.Ready.Control + "/status")
		if err != nil {
			ch.Kill()
			t.Fatal(err)
		}
		var ps server.ProcessStatus
		err = json.NewDecoder(resp.Body).Decode(&ps)
		resp.Body.Close()
		spare := ""
		if ps.SpareP != nil {
			spare = ps.SpareP.Setting
		}
		if err != nil || spare != c.want {
			t.Errorf("a child told spare_p %q: /status spare_p.setting %q (%v), want %q", c.set, spare, err, c.want)
		}
		if err := ch.Close(10 * time.Second); err != nil {
			t.Errorf("the child's close: %v", err)
		}
	}
}
