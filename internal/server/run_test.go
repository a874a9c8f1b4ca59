package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/freeport"
	"github.com/rdmakv/rdmakv/internal/server"
)

// syncBuf is a log sink several goroutines write.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type proc struct {
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuf
}

func start(t *testing.T, cfg *cluster.Config, id int64, opts server.Options) *proc {
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{cancel: cancel, done: make(chan error, 1), logs: &syncBuf{}}
	ready := make(chan string, 1)
	opts.Ready = func(c string) { ready <- c }
	go func() { p.done <- server.Run(ctx, cfg, id, opts, slog.New(slog.NewTextHandler(p.logs, nil))) }()
	select {
	case <-ready:
	case err := <-p.done:
		cancel()
		p.done <- err
	case <-time.After(20 * time.Second):
		t.Fatalf("replica %d did not start:\n%s", id, p.logs.String())
	}
	return p
}

func (p *proc) stop() error {
	p.cancel()
	return <-p.done
}

// waitReady polls replica id's control port until /readyz answers 200.
func waitReady(t *testing.T, addr string, what string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := get(t, "http://"+addr+"/readyz"); code == 200 {
			return
		}
		if time.Now().After(deadline) {
			_, st := get(t, "http://"+addr+"/status")
			t.Fatalf("%s: not ready in 20 s:\n%s", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLostDiskRejoins checks the start-up rule for a replica without
// stable state: a replica whose data directory is lost while its group
// runs must not start as a new member (it could vote twice in an epoch it
// forgot promising): it finds, reading a member's table header, that the
// group ran, and rejoins as a new incarnation. It also checks the plain
// restart (stable state kept) and the refusals of a data directory of
// another cluster and of a member holding another secret.
func TestLostDiskRejoins(t *testing.T) {
	dir := t.TempDir()
	ports := freeport.Ports(t, 7)
	var b strings.Builder
	fmt.Fprintf(&b, "name = \"rj\"\nfabric = \"tcp\"\nsecret = \"0123456789abcdef\"\ndata_dir = %q\n[timing]\nheartbeat = \"2ms\"\nelection_timeout = \"60ms\"\n[[group]]\n", filepath.Join(dir, "data"))
	for i := range 3 {
		fmt.Fprintf(&b, "[[group.replica]]\nid = %d\naddr = \"127.0.0.1:%d\"\ncontrol = \"127.0.0.1:%d\"\n", i+1, ports[i], ports[3+i])
	}
	fmt.Fprintf(&b, "[[clients]]\ncount = 1\nlisten = \"127.0.0.1:%d\"\n", ports[6])
	cfg, err := cluster.ParseConfig([]byte(b.String()), "")
	if err != nil {
		t.Fatal(err)
	}
	control := func(id int) string { return fmt.Sprintf("127.0.0.1:%d", ports[2+id]) }
	ps := map[int64]*proc{}
	defer func() {
		for _, p := range ps {
			p.stop()
		}
	}()
	for id := int64(1); id <= 3; id++ {
		ps[id] = start(t, cfg, id, server.Options{})
		// The first two elect a leader before the third starts, which
		// then rejoins a group that ran.
		if l := ps[id].logs.String(); !strings.Contains(l, "start=new") && (id < 3 || !strings.Contains(l, "start=rejoin")) {
			t.Errorf("replica %d of a new group: %s", id, l)
		}
	}
	for id := 1; id <= 3; id++ {
		waitReady(t, control(id), "a new group")
	}

	// A restart keeps the stable state: the same member.
	if err := ps[3].stop(); err != nil {
		t.Fatal(err)
	}
	ps[3] = start(t, cfg, 3, server.Options{})
	if l := ps[3].logs.String(); !strings.Contains(l, "start=existing") {
		t.Errorf("restart with stable state: %s", l)
	}
	waitReady(t, control(3), "a restarted replica")

	// Lost disk: the data directory is gone.
	ps[3].stop()
	delete(ps, 3)
	if err := os.RemoveAll(cfg.ReplicaDir(3)); err != nil {
		t.Fatal(err)
	}
	ps[3] = start(t, cfg, 3, server.Options{})
	if l := ps[3].logs.String(); !strings.Contains(l, "start=rejoin") || !strings.Contains(l, "shows the group ran") {
		t.Fatalf("a replica that lost its disk while its group ran did not rejoin:\n%s", l)
	}
	waitReady(t, control(3), "a rejoined replica")

	// Another cluster's config over the same data directory is refused.
	other := *cfg
	other.Name = "rj2"
	if p := start(t, &other, 2, server.Options{Control: "-"}); true {
		err := <-p.done
		if err == nil || !strings.Contains(err.Error(), "already runs") {
			t.Errorf("a second process of replica 2: %v", err)
		}
	}
	ps[2].stop()
	delete(ps, 2)
	p := start(t, &other, 2, server.Options{Control: "-"})
	if err := <-p.done; err == nil || !strings.Contains(err.Error(), `of cluster "rj"`) {
		t.Errorf("another cluster's data dir: %v", err)
	}

	// A member holding another secret is found at start-up.
	os.RemoveAll(cfg.ReplicaDir(2))
	wrong := *cfg
	wrong.SecretBytes = []byte("fedcba9876543210")
	p = start(t, &wrong, 2, server.Options{Control: "-"})
	if err := <-p.done; err == nil || !strings.Contains(err.Error(), "secret") {
		t.Errorf("a replica with another secret: %v", err)
	}
}

// TestRunReplicasOfTwoGroups: one process runs replica 1 of group 0 and
// replica 4 of group 1 (kvserver --id 1,4) beside another running the
// other four; both groups serve; the first process's control port shows
// both its replicas and its pollers; restarted, its replicas come back as
// the same members (each from its own data directory); once both stop no
// shm file is left.
func TestRunReplicasOfTwoGroups(t *testing.T) {
	shmDir, err := os.MkdirTemp("/dev/shm", "rdmakv-runtest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shmDir)
	ports := freeport.Ports(t, 6)
	var b strings.Builder
	fmt.Fprintf(&b, "name = \"two\"\nfabric = \"shm\"\nshm_dir = %q\ndata_dir = %q\n[timing]\nheartbeat = \"2ms\"\nelection_timeout = \"60ms\"\n", shmDir, filepath.Join(t.TempDir(), "data"))
	for g := range 2 {
		fmt.Fprintf(&b, "[[group]]\n")
		for i := range 3 {
			fmt.Fprintf(&b, "[[group.replica]]\nid = %d\ncontrol = \"127.0.0.1:%d\"\n", 3*g+i+1, ports[3*g+i])
		}
	}
	fmt.Fprintf(&b, "[[clients]]\ncount = 1\n")
	cfg, err := cluster.ParseConfig([]byte(b.String()), "")
	if err != nil {
		t.Fatal(err)
	}
	run := func(ids ...int64) *proc {
		ctx, cancel := context.WithCancel(context.Background())
		p := &proc{cancel: cancel, done: make(chan error, 1), logs: &syncBuf{}}
		ready := make(chan string, 1)
		go func() {
			p.done <- server.RunReplicas(ctx, cfg, ids, server.Options{Ready: func(c string) { ready <- c }}, slog.New(slog.NewTextHandler(p.logs, nil)))
		}()
		select {
		case <-ready:
		case err := <-p.done:
			cancel()
			t.Fatalf("replicas %v: %v\n%s", ids, err, p.logs.String())
		case <-time.After(20 * time.Second):
			t.Fatalf("replicas %v did not start:\n%s", ids, p.logs.String())
		}
		return p
	}
	first := fmt.Sprintf("127.0.0.1:%d", ports[0])
	a := run(1, 4)
	rest := run(2, 3, 5, 6)
	running := true
	defer func() {
		if running {
			rest.stop()
		}
	}()
	waitReady(t, first, "replicas 1 and 4")
	waitReady(t, fmt.Sprintf("127.0.0.1:%d", ports[1]), "replicas 2, 3, 5 and 6")
	_, body := get(t, "http://"+first+"/status")
	var ps server.ProcessStatus
	if err := json.Unmarshal([]byte(body), &ps); err != nil {
		t.Fatal(err)
	}
	tasks := 0
	for _, st := range ps.Pollers {
		tasks += st.Tasks
	}
	if len(ps.Replicas) != 2 || ps.Replicas[0].Node != 1 || ps.Replicas[1].Node != 4 || tasks != 2 {
		t.Fatalf("/status of the process of replicas 1 and 4: %d replicas, pollers %+v:\n%s", len(ps.Replicas), ps.Pollers, body)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	a = run(1, 4)
	if l := a.logs.String(); strings.Count(l, "start=existing") != 2 {
		t.Errorf("a restart of replicas 1 and 4 with their stable state:\n%s", l)
	}
	waitReady(t, first, "restarted replicas 1 and 4")
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	running = false
	if err := rest.stop(); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(shmDir)
	for _, e := range left {
		t.Errorf("left in the shm directory: %s", e.Name())
	}
}
