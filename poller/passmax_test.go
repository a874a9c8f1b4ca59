package poller

import (
	"sync/atomic"
	"testing"
	"time"
)

// notePass keeps the longest pass since the start and, for
// RecentMaxPass, the longest of the current and the previous window: a
// long pass stays visible for at least one window after it, and is
// forgotten after two.
func TestNotePassWindows(t *testing.T) {
	p := &poller{g: &Group{}}
	stats := func() (all, recent time.Duration) {
		p.g.ps = []*poller{p}
		st := p.g.Stats()[0]
		return st.MaxPass, st.RecentMaxPass
	}
	ms := time.Millisecond
	p.notePass(0, 2*ms)
	p.notePass(10*ms, 40*ms) // a long pass
	p.notePass(50*ms, 51*ms)
	if all, recent := stats(); all != 30*ms || recent != 30*ms {
		t.Fatalf("after a 30ms pass: max %v, recent %v; want 30ms and 30ms", all, recent)
	}
	// the next window: the long pass is in the previous one, still seen
	p.notePass(PassWindow+ms, PassWindow+2*ms)
	if all, recent := stats(); all != 30*ms || recent != 30*ms {
		t.Fatalf("one window later: max %v, recent %v; want 30ms and 30ms", all, recent)
	}
	// two windows later: forgotten by RecentMaxPass, not by MaxPass
	p.notePass(2*PassWindow+2*ms, 2*PassWindow+5*ms)
	if all, recent := stats(); all != 30*ms || recent != 3*ms {
		t.Fatalf("two windows later: max %v, recent %v; want 30ms and 3ms", all, recent)
	}
	// after windows with no pass at all (a parked poller) it is gone too
	p.notePass(10*PassWindow, 10*PassWindow+ms)
	if _, recent := stats(); recent != ms {
		t.Fatalf("after an idle stretch: recent %v", recent)
	}
}

// slowTask's first Poll takes at least slow (a snapshot captured on the
// polling goroutine); the others return at once.
type slowTask struct {
	slow  time.Duration
	polls atomic.Int64
}

func (s *slowTask) Poll(now time.Duration) bool {
	if s.polls.Add(1) == 1 {
		time.Sleep(s.slow)
	}
	return false
}

func (s *slowTask) NextDeadline() time.Duration { return 0 }

// A running Group's Stats show a pass at least as long as a slow Poll in
// MaxPass (a lower bound: a loaded machine only makes passes longer).
func TestGroupMaxPass(t *testing.T) {
	g := NewGroup(GroupConfig{Pollers: 1, MaxPark: time.Millisecond})
	task := &slowTask{slow: 30 * time.Millisecond}
	g.Add(task)
	stop := runGroup(t, g)
	deadline := time.Now().Add(30 * time.Second)
	for task.polls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := g.Stats()[0]
	stop()
	if task.polls.Load() < 3 {
		t.Fatalf("%d polls", task.polls.Load())
	}
	if st.MaxPass < task.slow || st.RecentMaxPass > st.MaxPass {
		t.Fatalf("max pass %v, recent %v; want the max at least the slow Poll's %v, and the recent one at most the max", st.MaxPass, st.RecentMaxPass, task.slow)
	}
}
