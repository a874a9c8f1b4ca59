package poller

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// watchTask is a poller's task for the watched-pass tests: it watches
// passes while watching is set (a leader), and runs each action handed
// to it once, in a Poll (a follower's capture).
type watchTask struct {
	watching atomic.Bool
	act      atomic.Pointer[func()]
	acted    atomic.Int64 // actions run
	polls    atomic.Int64
}

func (w *watchTask) Poll(now time.Duration) bool {
	if f := w.act.Swap(nil); f != nil {
		(*f)()
		w.acted.Add(1)
	}
	w.polls.Add(1)
	return false
}

func (w *watchTask) NextDeadline() time.Duration { return 1 << 62 }

func (w *watchTask) WatchesPasses() bool { return w.watching.Load() }

// do runs f in one of w's Polls and returns after two more Polls (the
// pass f ran in has ended and been noted).
func (w *watchTask) do(t *testing.T, f func()) {
	t.Helper()
	n := w.acted.Load()
	w.act.Store(&f)
	w.waitPolls(t, func() bool { return w.acted.Load() > n })
	w.after(t, 2)
}

// after returns once w was polled k more times.
func (w *watchTask) after(t *testing.T, k int64) {
	t.Helper()
	p := w.polls.Load()
	w.waitPolls(t, func() bool { return w.polls.Load() >= p+k })
}

func (w *watchTask) waitPolls(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("the poller did not poll the task in a minute")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// runWatched runs the watched-pass scenario on a poller with bug
// planted and returns the first property that failed (nil: none).
// Every bound is a lower bound of a sleep: a loaded machine only makes
// passes longer, and a pass outside an interval is never counted.
func runWatched(t *testing.T, bug watchBug) error {
	const slow = 20 * time.Millisecond
	w := &Watch{}
	g := NewGroup(GroupConfig{Pollers: 1, MaxPark: time.Millisecond, Spin: -1, Watch: w, WatchOver: slow / 2, watchBug: bug})
	task := &watchTask{}
	g.Add(task)
	runGroup(t, g)
	stats := func() PollerStats { return g.Stats()[0] }
	sleep := func() { time.Sleep(slow) }

	// 1. A long pass with no interval open, the task watching.
	task.watching.Store(true)
	task.do(t, sleep)
	if st := stats(); st.MaxPass < slow || st.WatchedPasses != 0 || st.WatchedMaxPass != 0 {
		return fmt.Errorf("outside: a %v pass with no interval open counted as watched (max pass %v, watched %d, longest watched %v)", slow, st.MaxPass, st.WatchedPasses, st.WatchedMaxPass)
	}
	// 2. An interval open, no task watching (a poller of followers).
	task.watching.Store(false)
	w.Begin()
	task.do(t, sleep)
	if st := stats(); st.WatchedPasses != 0 {
		return fmt.Errorf("unwatched: %d passes counted with no task watching", st.WatchedPasses)
	}
	w.End()
	task.after(t, 2) // the pass End ran in is over (it overlapped)
	// 3. The task watching; an interval begins in the middle of a long
	// pass, after its watcher's Poll (a follower's capture: Begin at the
	// end of the capturing Poll).
	task.watching.Store(true)
	task.after(t, 2)
	if st := stats(); st.WatchedPasses != 0 {
		return fmt.Errorf("outside: %d passes counted after the interval ended", st.WatchedPasses)
	}
	task.do(t, func() { sleep(); w.Begin() })
	st := stats()
	if st.WatchedMaxPass < slow || st.WatchedRecentMaxPass < slow || st.WatchedOver < 1 {
		return fmt.Errorf("began: the %v pass in which an interval began not counted (watched %d, over %d, longest %v, recent %v)", slow, st.WatchedPasses, st.WatchedOver, st.WatchedMaxPass, st.WatchedRecentMaxPass)
	}
	if st.WatchedMaxPass > st.MaxPass || st.WatchedOver > st.WatchedPasses || st.WatchedPasses > st.Passes {
		return fmt.Errorf("counts: watched %d of %d passes, %d over, longest %v of %v", st.WatchedPasses, st.Passes, st.WatchedOver, st.WatchedMaxPass, st.MaxPass)
	}
	// 4. Passes while it is open count; after it ended, none does.
	task.after(t, 3)
	open := stats().WatchedPasses
	if open < st.WatchedPasses+3 {
		return fmt.Errorf("open: %d passes counted over 3 passes with the interval open (%d before)", open, st.WatchedPasses)
	}
	w.End()
	task.after(t, 2)
	n := stats().WatchedPasses
	task.after(t, 3)
	if m := stats().WatchedPasses; m != n {
		return fmt.Errorf("outside: %d passes counted after the interval ended", m-n)
	}
	if w.Open() != 0 {
		return fmt.Errorf("%d intervals open", w.Open())
	}
	return nil
}

// The pollers count a pass as watched (the longest pass a leader waited
// through while a disk snapshot was written: issue 19's bound) only if
// it overlapped a Watch interval and a task of the poller watches
// passes; the pass in which an interval began counts.
func TestWatchedPasses(t *testing.T) {
	if err := runWatched(t, watchOK); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		bug  watchBug
		want string
	}{
		{"atStart", watchAtStart, "began:"},
		{"anyTask", watchAnyTask, "unwatched:"},
		{"every", watchEvery, "outside:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := runWatched(t, c.bug)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("planted %s: got %v, want a %q failure", c.name, err, c.want)
			}
			t.Logf("planted %s caught: %v", c.name, err)
		})
	}
}

// watchOverlaps: an interval open at the first read, or one begun
// between the reads (even if it ended again), overlaps.
func TestWatchOverlaps(t *testing.T) {
	w := &Watch{}
	a := w.load()
	if watchOverlaps(a, w.load()) {
		t.Fatal("none open, none begun: overlaps")
	}
	w.Begin()
	w.End()
	if !watchOverlaps(a, w.load()) {
		t.Fatal("one begun and ended between the reads: no overlap")
	}
	w.Begin()
	b := w.load()
	if !watchOverlaps(b, b) {
		t.Fatal("one open at the first read: no overlap")
	}
	w.End()
	if w.Open() != 0 || (*Watch)(nil).load() != 0 {
		t.Fatal("open count")
	}
}
