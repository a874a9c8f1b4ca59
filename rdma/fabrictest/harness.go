// Package fabrictest is the conformance suite every rdma fabric passes.
//
// A fabric's test file calls Run with a Harness. When the harness supports
// more than one OS process, the suite also re-executes the test binary as
// helper processes (see Main), so that FIFO visibility, atomics, revocation,
// dead-peer detection and doorbells are checked across real processes and
// not only goroutines.
package fabrictest

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// Harness builds nodes of one fabric for the suite.
type Harness struct {
	// Name is the fabric's name, used in sub-test names.
	Name string
	// NewCluster prepares a fresh, empty cluster whose nodes have ids
	// 1..n, and returns an opaque configuration string from which Open can
	// create any of those nodes, in this process or in a child process.
	// Resources (directories, listeners) are released with t.Cleanup.
	NewCluster func(t testing.TB, n int) (config string)
	// Open creates node id of the cluster described by config. The suite
	// calls it in the test process and, for MultiProcess harnesses, in
	// helper processes (from Main), so it must not depend on state of the
	// process that called NewCluster beyond what config carries.
	Open func(config string, id rdma.NodeID) (rdma.Node, error)
	// MultiProcess says that nodes opened in different OS processes of the
	// same cluster reach each other: the suite then runs its cross-process
	// cases.
	MultiProcess bool
}

// RoleEnv is the environment variable that makes a re-executed test binary
// play a helper role instead of running tests (see Main).
const RoleEnv = "RDMAKV_FABRICTEST_ROLE"
