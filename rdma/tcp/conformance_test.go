package tcp

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma/fabrictest"
)

var harness = fabrictest.Harness{
	Name:         "tcp",
	NewCluster:   newCluster,
	Open:         openNode,
	MultiProcess: true,
}

func TestMain(m *testing.M) { fabrictest.Main(m, harness) }

func TestConformance(t *testing.T) { fabrictest.Run(t, harness) }
