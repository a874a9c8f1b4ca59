package poller_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/poller"
)

// stateTask has state that only its poller may touch (n, last: the race
// detector sees any other access) and flags the test sets while the task
// must not be polled.
type stateTask struct {
	n, last  int
	now      time.Duration
	held     atomic.Bool // set after Pause or Remove returned, cleared before Resume
	violated atomic.Int64
	polls    atomic.Int64
}

func (s *stateTask) Poll(now time.Duration) bool {
	if s.held.Load() {
		s.violated.Add(1)
	}
	s.polls.Add(1)
	s.n++
	s.now = now
	return false
}

func (s *stateTask) NextDeadline() time.Duration { return s.now + 200*time.Microsecond }

// TestHandleRace: Do, Pause, Resume and Remove from many goroutines while
// the group runs. Do's function runs serialized with the task's Polls (the
// race detector checks), a paused or removed task is never polled once
// Pause or Remove returned, Do on a removed task fails, and Do after Run
// ended runs on the caller.
func TestHandleRace(t *testing.T) {
	nodes := openNodes(t, "mem", 4)
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	g := poller.NewGroup(poller.GroupConfig{Pollers: 2})
	const k = 8
	var tasks []*stateTask
	var hs []*poller.Handle
	for i := range k {
		st := &stateTask{}
		tasks = append(tasks, st)
		hs = append(hs, g.Add(st, nodes[i%len(nodes)]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()

	var wg sync.WaitGroup
	for i := range k {
		st, h := tasks[i], hs[i]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for range 200 {
				switch rng.IntN(4) {
				case 0, 1:
					if err := h.Do(func() { st.last = st.n; st.n++ }); err != nil {
						t.Error(err)
						return
					}
				case 2:
					h.Pause()
					st.held.Store(true)
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					st.held.Store(false)
					h.Resume()
				case 3:
					nodes[rng.IntN(len(nodes))].Doorbell().Ring()
				}
			}
			if i%2 == 0 {
				h.Remove()
				st.held.Store(true)
				if err := h.Do(func() {}); !errors.Is(err, poller.ErrRemoved) {
					t.Errorf("Do on a removed task: %v, want ErrRemoved", err)
				}
			}
		})
	}
	// Tasks added while the group runs are polled too.
	late := &stateTask{}
	lh := g.Add(late, nodes[0])
	deadline := time.Now().Add(testWait)
	for late.polls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a task added while the group runs was never polled")
		}
		time.Sleep(time.Millisecond)
	}
	lh.Remove()
	wg.Wait()
	time.Sleep(5 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	ran := false
	if err := hs[1].Do(func() { ran = true }); err != nil || !ran {
		t.Fatalf("Do after Run ended: %v, ran %v", err, ran)
	}
	for i, st := range tasks {
		if v := st.violated.Load(); v > 0 {
			t.Errorf("task %d was polled %d times while paused or removed", i, v)
		}
		if st.polls.Load() == 0 {
			t.Errorf("task %d was never polled", i)
		}
	}
}

// TestPauseStopsPolls: once Pause returns the task is not polled, the
// other tasks of its poller still are, and Resume polls it again; a paused
// task's Do still runs.
func TestPauseStopsPolls(t *testing.T) {
	nodes := openNodes(t, "shm", 2)
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	g := poller.NewGroup(poller.GroupConfig{Pollers: 1})
	a, b := &stateTask{}, &stateTask{}
	ha := g.Add(a, nodes[0])
	g.Add(b, nodes[1])
	poller.RunGroup(t, g)
	waitPolls := func(s *stateTask, what string) {
		t.Helper()
		n := s.polls.Load()
		deadline := time.Now().Add(testWait)
		for s.polls.Load() < n+3 {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitPolls(a, "task a not polled")
	ha.Pause()
	a.held.Store(true)
	waitPolls(b, "task b not polled while a is paused")
	ran := false
	if err := ha.Do(func() { ran = true }); err != nil || !ran {
		t.Fatalf("Do on a paused task: %v, ran %v", err, ran)
	}
	nodes[0].Doorbell().Ring()
	waitPolls(b, "task b not polled while a is paused")
	if v := a.violated.Load(); v != 0 {
		t.Fatalf("a paused task was polled %d times", v)
	}
	a.held.Store(false)
	ha.Resume()
	waitPolls(a, "a resumed task is not polled")
}

// TestDoAcrossStop: Do calls racing the end of Run all return (run by the
// finishing poller, or on the caller once it stopped), never hang.
func TestDoAcrossStop(t *testing.T) {
	for round := range 200 {
		g := poller.NewGroup(poller.GroupConfig{Pollers: 1, Spin: -1})
		st := &stateTask{}
		h := g.Add(st)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 20 {
					h.Do(func() { st.n++ })
				}
			})
		}
		if round%2 == 0 {
			runtime.Gosched()
		}
		cancel()
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		select {
		case <-all:
		case <-time.After(testWait):
			t.Fatalf("round %d: a Do call racing the end of Run never returned", round)
		}
		<-done
	}
}
