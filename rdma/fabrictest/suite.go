package fabrictest

import (
	"testing"
)

// Run runs the conformance suite against h: one sub-test per property of the
// rdma contract. Cross-process cases run only when h.MultiProcess is set;
// they need the test binary's TestMain to call Main.
func Run(t *testing.T, h Harness) {
	if h.Name == "" || h.NewCluster == nil || h.Open == nil {
		t.Fatalf("fabrictest: incomplete Harness %+v: Name, NewCluster and Open are required", h)
	}
	cases := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"FIFOVisibility", testFIFOVisibility},
		{"SelectiveSignalling", testSelectiveSignalling},
		{"Atomic8Byte", testAtomic8Byte},
		{"TornRecordsDetectable", testTornRecords},
		{"Bounds", testBounds},
		{"Permissions", testPermissions},
		{"ErrorStateAndReconnect", testErrorState},
		{"RevokeRacingWriters", testRevokeRacingWriters},
		{"AtomicsContention", testAtomicsContention},
		{"DeadPeer", testDeadPeer},
		{"Doorbell", testDoorbell},
		{"WaitSet", testWaitSet},
		{"NoAllocs", testNoAllocs},
		{"PostList", testPostList},
		{"Link", testLink},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
	if h.MultiProcess {
		t.Run("CrossProcess", func(t *testing.T) { runCrossProcess(t, h) })
	}
}
