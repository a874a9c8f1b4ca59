package poller_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/poller"
)

// idleTask never progresses and wants no Poll for a second: its poller
// spins, then parks.
type idleTask struct{ now time.Duration }

func (t *idleTask) Poll(now time.Duration) bool { t.now = now; return false }
func (t *idleTask) NextDeadline() time.Duration { return t.now + time.Second }

// TestSpinYieldPace: a spinning poller of a group with no more pollers
// than Ps yields its P at most once per SpinYield of spinning (each
// Gosched with an idle P wakes another thread for nothing), not at every
// look at the clock. The bound holds at any load: the poller spins for at
// most the run's wall time. PlantNoYieldPace yields at every look.
func TestSpinYieldPace(t *testing.T) {
	for _, planted := range []bool{false, true} {
		yields, spins, wall := spinYields(t, planted)
		bound := uint64(wall/spinYieldTest) + spins + 1
		t.Logf("planted %v: %d yields in %d spin phases, %v wall; bound %d", planted, yields, spins, wall, bound)
		if spins == 0 {
			t.Fatalf("planted %v: the idle poller never spun", planted)
		}
		if paced := yields <= bound; paced == planted {
			t.Fatalf("planted %v: %d yields in %v of spinning at most (bound %d): paced = %v", planted, yields, wall, bound, paced)
		}
	}
}

const spinYieldTest = 2 * time.Millisecond

func spinYields(t *testing.T, planted bool) (yields, spins uint64, wall time.Duration) {
	nodes := openNodes(t, "mem", 1)
	defer nodes[0].Close()
	g := poller.NewGroup(poller.GroupConfig{Pollers: 1, Spin: 50 * time.Millisecond, SpinYield: spinYieldTest, MaxPark: 20 * time.Millisecond})
	if planted {
		poller.PlantNoYieldPace(g)
	}
	g.Add(&idleTask{}, nodes[0])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- g.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	wall = time.Since(start)
	st := g.Stats()[0]
	return st.Yields, st.Spins, wall
}
