package fabric_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/freeport"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/shm"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// assertFree checks that nothing of a closed or refused node stays behind:
// the shm directory is empty and the tcp address can be bound again.
func assertFree(t *testing.T, dir, addr string) {
	t.Helper()
	if dir != "" {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			t.Errorf("%s left behind in %s", e.Name(), dir)
		}
	}
	if addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s still held: %v", addr, err)
			return
		}
		l.Close()
	}
}

// TestOpen opens two nodes of each fabric from one Spec each, connects the
// second to the first (the Spec says where the first is), and closes them:
// nothing stays behind.
func TestOpen(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		s := fabric.Spec{Fabric: "mem", Mem: mem.New(mem.Options{})}
		pair(t, s, s)
	})
	t.Run("shm", func(t *testing.T) {
		dir := t.TempDir()
		s := fabric.Spec{Fabric: "shm", ShmDir: dir, Cluster: "fab", Spin: -1}
		pair(t, s, s)
		assertFree(t, dir, "")
	})
	t.Run("tcp", func(t *testing.T) {
		addrs := map[rdma.NodeID]string{1: freeport.Addr(t), 2: freeport.Addr(t)}
		s := fabric.Spec{Fabric: "tcp", Addrs: addrs, Secret: secret}
		pair(t, s, s)
		assertFree(t, "", addrs[1])
		assertFree(t, "", addrs[2])
	})
	t.Run("tcp-listen", func(t *testing.T) {
		// Listen overrides the node's own address; the peer is found in
		// Addrs.
		a := fabric.Spec{Fabric: "tcp", Listen: "127.0.0.1:0", Secret: secret}
		n1, err := fabric.Open(a, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer n1.Close()
		addr := n1.(*tcp.Node).Addr()
		b := fabric.Spec{Fabric: "tcp", Listen: "127.0.0.1:0", Addrs: map[rdma.NodeID]string{1: addr}, Secret: secret}
		n2, err := fabric.Open(b, 2)
		if err != nil {
			t.Fatal(err)
		}
		defer n2.Close()
		c, err := n2.Connect(1)
		if err != nil {
			t.Fatalf("connect node 2 to node 1 at %s: %v", addr, err)
		}
		c.Close()
	})
}

func pair(t *testing.T, a, b fabric.Spec) {
	t.Helper()
	n1, err := fabric.Open(a, 1)
	if err != nil {
		t.Fatalf("%s: open node 1: %v", a.Fabric, err)
	}
	n2, err := fabric.Open(b, 2)
	if err != nil {
		n1.Close()
		t.Fatalf("%s: open node 2: %v", b.Fabric, err)
	}
	if n1.ID() != 1 || n2.ID() != 2 {
		t.Errorf("%s: nodes %d and %d, want 1 and 2", a.Fabric, n1.ID(), n2.ID())
	}
	c, err := n2.Connect(1)
	if err != nil {
		t.Errorf("%s: connect node 2 to 1: %v", a.Fabric, err)
	} else {
		c.Close()
	}
	if err := n2.Close(); err != nil {
		t.Errorf("%s: close node 2: %v", a.Fabric, err)
	}
	if err := n1.Close(); err != nil {
		t.Errorf("%s: close node 1: %v", a.Fabric, err)
	}
}

// TestOpenErrors checks that a Spec Open cannot serve gives one line naming
// the problem, wrapping the sentinel a caller tests for, and leaves nothing
// behind.
func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	addr := freeport.Addr(t)
	cases := []struct {
		name string
		spec fabric.Spec
		id   rdma.NodeID
		is   error    // wrapped, if not nil
		want []string // in the message
	}{
		{"unknown-fabric", fabric.Spec{Fabric: "rdma"}, 1, fabric.ErrSpec, []string{`unknown fabric "rdma"`, "mem, shm or tcp"}},
		{"no-fabric", fabric.Spec{}, 1, fabric.ErrSpec, []string{"no fabric"}},
		{"mem-without-fabric", fabric.Spec{Fabric: "mem"}, 4, fabric.ErrSpec, []string{"node 4", "mem.Fabric"}},
		{"shm-missing-dir", fabric.Spec{Fabric: "shm", ShmDir: filepath.Join(dir, "gone"), Cluster: "c"}, 1, os.ErrNotExist, []string{"shm node 1", filepath.Join(dir, "gone")}},
		{"shm-bad-cluster", fabric.Spec{Fabric: "shm", ShmDir: dir, Cluster: "a b"}, 1, nil, []string{"shm node 1", `cluster name "a b"`}},
		{"shm-no-cluster", fabric.Spec{Fabric: "shm", ShmDir: dir}, 1, nil, []string{"shm node 1", `cluster name ""`}},
		{"tcp-no-address", fabric.Spec{Fabric: "tcp", Addrs: map[rdma.NodeID]string{1: addr}, Secret: secret}, 3, fabric.ErrSpec, []string{"no address for node 3"}},
		{"tcp-no-secret", fabric.Spec{Fabric: "tcp", Listen: addr}, 1, tcp.ErrOptions, []string{"tcp node 1", "Secret of 0 bytes"}},
		{"tcp-short-secret", fabric.Spec{Fabric: "tcp", Addrs: map[rdma.NodeID]string{1: addr}, Secret: []byte("abc")}, 1, tcp.ErrOptions, []string{"tcp node 1", "Secret of 3 bytes", "at least 16"}},
		{"tcp-bad-address", fabric.Spec{Fabric: "tcp", Listen: "127.0.0.1:notaport", Secret: secret}, 1, nil, []string{"listen on 127.0.0.1:notaport"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := fabric.Open(c.spec, c.id)
			if err == nil {
				n.Close()
				t.Fatalf("Open(%+v, %d) = nil error, want one naming %q", c.spec, c.id, c.want)
			}
			checkErr(t, err, c.is, c.want...)
			assertFree(t, dir, addr)
		})
	}
}

func checkErr(t *testing.T, err, is error, want ...string) {
	t.Helper()
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("error of several lines:\n%s", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not name %q", msg, w)
		}
	}
	if is != nil && !errors.Is(err, is) {
		t.Errorf("error %q does not wrap %v", msg, is)
	}
	t.Log(msg)
}

// TestOpenInUse checks the errors of a node opened twice: on shm (a live
// process holds it), on tcp (its address is taken) and on mem.
func TestOpenInUse(t *testing.T) {
	t.Run("shm", func(t *testing.T) {
		dir := t.TempDir()
		s := fabric.Spec{Fabric: "shm", ShmDir: dir, Cluster: "twice"}
		n, err := fabric.Open(s, 1)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fabric.Open(s, 1)
		checkErr(t, err, shm.ErrNodeInUse, "node 1 already runs in a live process", "pid")
		n.Close()
		assertFree(t, dir, "")
	})
	t.Run("tcp", func(t *testing.T) {
		addr := freeport.Addr(t)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fabric.Open(fabric.Spec{Fabric: "tcp", Addrs: map[rdma.NodeID]string{1: addr}, Secret: secret}, 1)
		checkErr(t, err, syscall.EADDRINUSE, "listen on "+addr, "in use")
		l.Close()
		assertFree(t, "", addr)
	})
	t.Run("mem", func(t *testing.T) {
		s := fabric.Spec{Fabric: "mem", Mem: mem.New(mem.Options{})}
		n, err := fabric.Open(s, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		_, err = fabric.Open(s, 1)
		checkErr(t, err, nil, "mem node 1", "already exists")
	})
}

// TestForMap checks that a map's Spec opens the map's nodes.
func TestForMap(t *testing.T) {
	dir := t.TempDir()
	m := &cluster.Map{Name: "formap", Fabric: "shm", ShmDir: dir, Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{9}}
	s := fabric.ForMap(m)
	if s.Fabric != "shm" || s.ShmDir != dir || s.Cluster != "formap" {
		t.Fatalf("ForMap = %+v", s)
	}
	n, err := fabric.Open(s, 9)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) == 0 {
		t.Errorf("node 9 of the map's shm fabric has no file in %s", dir)
	}
	n.Close()
	assertFree(t, dir, "")

	addrs := map[rdma.NodeID]string{1: freeport.Addr(t), 9: freeport.Addr(t)}
	m = &cluster.Map{Name: "formap", Fabric: "tcp", Addrs: addrs, Groups: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{9}}
	s = fabric.ForMap(m)
	s.Secret = secret
	n, err = fabric.Open(s, 9)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.(*tcp.Node).Addr(); got != addrs[9] {
		t.Errorf("node 9 listens on %s, the map says %s", got, addrs[9])
	}
	n.Close()
	assertFree(t, "", addrs[9])
}
