package btree

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// memNode is node 1 of a fresh in-process fabric, closed when the test
// ends.
func memNode(t *testing.T) rdma.Node {
	t.Helper()
	n, err := mem.New(mem.Options{}).NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
