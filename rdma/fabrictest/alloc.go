package fabrictest

import (
	"runtime"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// testNoAllocs: the steady-state verb path allocates nothing, so protocols
// can post at line rate without feeding the garbage collector.
func testNoAllocs(t *testing.T, h Harness) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	cl := newCluster(t, h, 2)
	owner, peer := cl.open(1), cl.open(2)
	r := register(t, owner, 1, 64)
	grant(t, r, 2, rdma.PermReadWrite)
	c := connect(t, peer, 1)
	buf := word(7)
	var cs [4]rdma.Completion
	flush := func() {
		t.Helper()
		if err := c.Post(rdma.WR{ID: 1, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Buf: buf}); err != nil {
			t.Fatalf("post: %v", err)
		}
		if _, err := awaitAny(c, cs[:]); err != nil {
			t.Fatal(err)
		}
	}
	flush()

	unsignaled := rdma.WR{ID: 2, Kind: rdma.OpWrite, Region: 1, Offset: 8, Buf: buf}
	var postErr error
	allocs := testing.AllocsPerRun(500, func() {
		if err := c.Post(unsignaled); err != nil && postErr == nil {
			postErr = err
		}
	})
	if postErr != nil {
		t.Fatalf("post unsignaled: %v", postErr)
	}
	flush()
	if allocs != 0 {
		t.Errorf("Post of an unsignaled 8-byte write: %v allocations per op, want 0", allocs)
	}

	signaled := rdma.WR{ID: 3, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Offset: 16, Buf: buf}
	var loopErr error
	allocs = testing.AllocsPerRun(500, func() {
		if err := c.Post(signaled); err != nil {
			loopErr = err
			return
		}
		if _, err := awaitAny(c, cs[:]); err != nil {
			loopErr = err
		}
	})
	if loopErr != nil {
		t.Fatal(loopErr)
	}
	if allocs != 0 {
		t.Errorf("Post of a signaled 8-byte write and Poll of its completion: %v allocations per op, want 0", allocs)
	}
}

// awaitAny polls c until a completion arrives, for up to opTimeout. It
// avoids Conn.Wait, whose timer allocates: it spins briefly, then sleeps in
// short steps (time.Sleep reuses the goroutine's timer), because a
// goroutine that only yields keeps the scheduler from polling the network
// for up to 10ms, which starves fabrics whose completions come from sockets.
func awaitAny(c rdma.Conn, cs []rdma.Completion) (rdma.Completion, error) {
	start := time.Now()
	for i := 0; ; i++ {
		if n := c.Poll(cs); n > 0 {
			return cs[0], cs[0].Err
		}
		if i%1024 == 1023 {
			if err := c.Err(); err != nil {
				return rdma.Completion{}, err
			}
			if time.Since(start) > opTimeout {
				return rdma.Completion{}, errNoCompletion
			}
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}
