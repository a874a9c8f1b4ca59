package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/fabrictest"
)

// harness runs the conformance suite on shm. A cluster's config string is
// <dir>/<cluster>: a fresh directory under /dev/shm (removed at cleanup)
// and the cluster name, all a child process needs to open its nodes.
var harness = fabrictest.Harness{
	Name: "shm",
	NewCluster: func(t testing.TB, n int) string {
		dir, err := os.MkdirTemp("/dev/shm", "rdmakv-fabrictest-")
		if err != nil {
			t.Fatalf("shm harness: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return filepath.Join(dir, fmt.Sprintf("c%d", n))
	},
	Open: func(config string, id rdma.NodeID) (rdma.Node, error) {
		return Open(id, Options{Dir: filepath.Dir(config), Cluster: filepath.Base(config)})
	},
	MultiProcess: true,
}

func TestConformance(t *testing.T) { fabrictest.Run(t, harness) }
