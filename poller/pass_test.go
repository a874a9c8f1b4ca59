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

// TestPassNoAllocs: a pass allocates nothing of its own.
func TestPassNoAllocs(t *testing.T) {
	var calls []string
	ts := []Task{&idleTask{}, &idleTask{}, flushTask{&logTask{calls: &calls}}}
	if n := testing.AllocsPerRun(100, func() { Pass(1, ts[:2]) }); n != 0 {
		t.Fatalf("Pass: %v allocations", n)
	}
}

type idleTask struct{}

func (*idleTask) Poll(time.Duration) bool     { return false }
func (*idleTask) NextDeadline() time.Duration { return never }
