package poller_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
)

// idle is a task with nothing to do that wants a Poll every millisecond.
type idle struct{ g *poller.Group }

func (*idle) Poll(time.Duration) bool          { return false }
func (t *idle) NextDeadline() time.Duration    { return t.g.Now() + time.Millisecond }
func (*idle) HeartbeatInterval() time.Duration { return time.Millisecond }

// TestSpinYields: a poller's spin before a park yields its processor at
// most once per rdma.SpinYield of its budget (the budget halves after
// each spin that found nothing, so the spins of an idle poller add up to
// less than twice the first budget): issue 17's profile found spin loops
// that yielded every 16 tries, each yield a thread hand-off. It still
// parks when idle.
func TestSpinYields(t *testing.T) {
	const spin = 4 * time.Millisecond
	nodes := openNodes(t, "shm", 1)
	g := poller.NewGroup(poller.GroupConfig{Pollers: 1, Spin: spin})
	g.Add(&idle{g: g}, nodes[0])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	deadline := time.Now().Add(testWait)
	for g.Stats()[0].Parks < 20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	st := g.Stats()[0]
	t.Logf("%+v", st)
	if st.Parks < 20 {
		t.Fatalf("the idle poller parked %d times in %v", st.Parks, testWait)
	}
	if st.Spins == 0 {
		t.Fatal("the poller never spun before a park")
	}
	if bound := uint64(2 * spin / rdma.SpinYield); st.Yields > bound {
		t.Fatalf("%d yields in %d spins of an idle poller (first budget %v): more than one per %v of budget (%d)", st.Yields, st.Spins, spin, rdma.SpinYield, bound)
	}
}
