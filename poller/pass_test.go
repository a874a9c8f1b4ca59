package poller

import (
	"fmt"
	"testing"
	"time"
)

// log records the calls a Pass makes.
type logTask struct {
	name     string
	progress bool
	next     time.Duration
	calls    *[]string
	flush    bool
}

func (t *logTask) Poll(now time.Duration) bool {
	*t.calls = append(*t.calls, fmt.Sprintf("%s.Poll(%v)", t.name, now))
	return t.progress
}

func (t *logTask) NextDeadline() time.Duration { return t.next }

type flushTask struct{ *logTask }

func (t flushTask) Flush(now time.Duration) {
	*t.calls = append(*t.calls, fmt.Sprintf("%s.Flush(%v)", t.name, now))
}

// TestPass: every task polls once, in order, at the pass's time; a
// Flusher flushes right after its own Poll; progress is any task's and
// next the earliest deadline (never with no tasks).
func TestPass(t *testing.T) {
	var calls []string
	a := &logTask{name: "a", next: 50, calls: &calls}
	b := &logTask{name: "b", next: 20, calls: &calls, progress: true}
	c := &logTask{name: "c", next: 30, calls: &calls}
	progress, next := Pass(7, []Task{a, flushTask{b}, c})
	if want := "[a.Poll(7ns) b.Poll(7ns) b.Flush(7ns) c.Poll(7ns)]"; fmt.Sprint(calls) != want {
		t.Fatalf("calls %v, want %s", calls, want)
	}
	if !progress || next != 20 {
		t.Fatalf("Pass = %v, %v; want true, 20ns", progress, next)
	}
	b.progress = false
	if progress, _ := Pass(8, []Task{a, b, c}); progress {
		t.Fatal("Pass reported progress that no task made")
	}
	if progress, next := Pass(9, nil); progress || next != never {
		t.Fatalf("Pass of no tasks = %v, %v", progress, next)
	}
}

// TestPassNoAllocs: a pass (a Flusher among its tasks) allocates nothing
// of its own.
func TestPassNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	ts := []Task{&idleTask{}, &idleTask{}, &nopFlusher{}}
	if n := testing.AllocsPerRun(100, func() { Pass(1, ts) }); n != 0 {
		t.Fatalf("Pass: %v allocations", n)
	}
}

type nopFlusher struct{ idleTask }

func (*nopFlusher) Flush(time.Duration) {}

type idleTask struct{}

func (*idleTask) Poll(time.Duration) bool     { return false }
func (*idleTask) NextDeadline() time.Duration { return never }

// TestAssignment: Add gives each task to the least loaded poller; AddTo
// keeps the tasks of one key on the poller of the key's first task (which
// Add's rule chose), and Remove frees the slot for the next Add.
func TestAssignment(t *testing.T) {
	g := NewGroup(GroupConfig{Pollers: 2})
	var hs []*Handle
	for i := range 6 {
		hs = append(hs, g.AddTo(i/3, &idleTask{})) // key 0: tasks 0-2, key 1: 3-5
	}
	for i, h := range hs {
		if h.p != hs[i/3*3].p {
			t.Fatalf("task %d of key %d is on poller %d, its key's first task on %d", i, i/3, h.p.idx, hs[i/3*3].p.idx)
		}
	}
	if hs[0].p == hs[3].p {
		t.Fatal("both keys on one poller: the second key's first task did not go to the least loaded one")
	}
	a, b := g.Add(&idleTask{}), g.Add(&idleTask{})
	if a.p == b.p {
		t.Fatal("two tasks added to pollers of equal load went to the same one")
	}
	hs[0].Remove()
	hs[1].Remove()
	if c := g.Add(&idleTask{}); c.p != hs[0].p {
		t.Fatalf("Add after two Removes chose poller %d, not the less loaded %d", c.p.idx, hs[0].p.idx)
	}
	if st := g.Stats(); st[0].Tasks+st[1].Tasks != 7 {
		t.Fatalf("stats count %d+%d tasks, want 7", st[0].Tasks, st[1].Tasks)
	}
}
