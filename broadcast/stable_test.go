package broadcast

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/rdmakv/rdmakv/rdma"
	"testing"
)

func TestFileStable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acuerdo.stable")
	fs := FileStable{Path: path}
	if s, err := fs.Load(); err != nil || s != (StableState{}) {
		t.Fatalf("missing file: %+v, %v; want the zero state", s, err)
	}
	want := StableState{Incarnation: 7, ENew: MakeEpoch(3, 2)}
	if err := fs.Save(want); err != nil {
		t.Fatal(err)
	}
	if s, err := fs.Load(); err != nil || s != want {
		t.Fatalf("load: %+v, %v; want %+v", s, err, want)
	}
	b, _ := os.ReadFile(path)
	b[5] ^= 1
	os.WriteFile(path, b, 0o644)
	if _, err := fs.Load(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt file: %v, want ErrCorrupt", err)
	}
}

// TestRestartKeepsPromise: a replica restarted on the same Stable store
// comes back as a new incarnation that remembers its E_new and counts as
// catching up (it will not vote before a diff).
func TestRestartKeepsPromise(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.settle(nil)
	n2 := c.get(2)
	c.crash(2, 0)
	c.boot(n2)
	s := n2.r.Status()
	if s.Incarnation != 2 || s.ENew != MakeEpoch(0, 1) || !s.CatchingUp {
		t.Fatalf("restarted: %+v, want incarnation 2, e_new (0,1), catching up", s)
	}
	p := c.get(1).r.Propose([]byte("x"))
	c.settle(not(3))
	c.settle(not(3)) // node 1 reconnects to the new node 2 after its backoff
	select {
	case <-p.Done():
	default:
		t.Fatalf("x not resolved; node 1 %+v; node 2 %+v\n%s", c.get(1).r.Status(), n2.r.Status(), c.takeTrace())
	}
	if i, err := p.Result(); err != nil || i != 1 {
		t.Fatalf("x: %d, %v", i, err)
	}
	if s := n2.r.Status(); s.CatchingUp || s.Index != 1 {
		t.Fatalf("after catching up: %+v", s)
	}
}
