package mem_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/fabrictest"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// clusters maps a harness config string to its in-process fabric: mem nodes
// only reach each other inside one process, so the config is just a key.
type clusters struct {
	mu   sync.Mutex
	next int
	m    map[string]*memCluster
}

type memCluster struct {
	f *mem.Fabric
	n int
}

func (cs *clusters) harness(opts mem.Options) fabrictest.Harness {
	return fabrictest.Harness{
		Name: "mem",
		NewCluster: func(t testing.TB, n int) string {
			cs.mu.Lock()
			defer cs.mu.Unlock()
			cs.next++
			cfg := fmt.Sprintf("mem-%d", cs.next)
			cs.m[cfg] = &memCluster{f: mem.New(opts), n: n}
			t.Cleanup(func() {
				cs.mu.Lock()
				delete(cs.m, cfg)
				cs.mu.Unlock()
			})
			return cfg
		},
		Open: func(cfg string, id rdma.NodeID) (rdma.Node, error) {
			cs.mu.Lock()
			c := cs.m[cfg]
			cs.mu.Unlock()
			if c == nil {
				return nil, fmt.Errorf("mem harness: no cluster %q", cfg)
			}
			if id < 1 || int(id) > c.n {
				return nil, fmt.Errorf("mem harness: node %d outside cluster %q of %d nodes", id, cfg, c.n)
			}
			return c.f.NewNode(id)
		},
	}
}

func newClusters() *clusters { return &clusters{m: map[string]*memCluster{}} }

func TestMain(m *testing.M) {
	fabrictest.Main(m, newClusters().harness(mem.Options{}))
}

func TestConformance(t *testing.T) {
	fabrictest.Run(t, newClusters().harness(mem.Options{}))
}
