package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	var ps []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ps = append(ps, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ps
}

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
	ports := freePorts(t, 7)
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
