package wal

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// asyncDueRun appends one record to Async Writers at random Poll times
// and reports the first broken rule: the batch must start by
// FsyncInterval after the record was appended (the async promise: a
// power cut loses at most the last interval, docs/broadcast.md), not
// before its deadline, and writers whose records opened within one
// interval on the grid are due at the same instant (one wake-up per
// interval for a process's replicas).
func asyncDueRun(t *testing.T, knobs testingKnobs) string {
	rng := rand.New(rand.NewPCG(19, 7))
	for _, iv := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 7*time.Millisecond + 300*time.Microsecond} {
		for range 15 {
			at := time.Duration(rng.Int64N(int64(100 * iv)))
			var due [2]time.Duration
			for k := range due {
				mem := vfs.NewMem()
				d := newTestDevice(mem)
				w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Async, FsyncInterval: iv})
				w.knobs = knobs
				open := at + time.Duration(k)*(at/iv*iv+iv-1-at) // the second: the grid cell's last ns
				w.Poll(open)
				seq, _ := w.Append(RecEntry, []byte("x"))
				due[k] = w.NextDeadline()
				if due[k] > open+iv {
					return fmt.Sprintf("late: a record appended at %v is due at %v, more than FsyncInterval %v later", open, due[k], iv)
				}
				if due[k] <= open {
					return fmt.Sprintf("early: a record appended at %v is due at once (%v)", open, due[k])
				}
				w.Poll(due[k] - 1)
				if len(d.queue) != 0 {
					return fmt.Sprintf("early: a batch started at %v, before its deadline %v", due[k]-1, due[k])
				}
				drain(t, w, d, due[k])
				if w.Synced() < seq {
					return fmt.Sprintf("late: the record appended at %v was not synced at its deadline %v", open, due[k])
				}
			}
			if due[0] != due[1] {
				return fmt.Sprintf("apart: records appended at %v and %v (one grid cell of %v) are due at %v and %v", at, at/iv*iv+iv-1, iv, due[0], due[1])
			}
		}
	}
	return ""
}

// TestAsyncDueOnGrid: an Async batch is due at the first multiple of
// FsyncInterval after it opened; the planted gridLate (the second
// multiple) breaks the promise and is caught by the "late" check.
func TestAsyncDueOnGrid(t *testing.T) {
	if f := asyncDueRun(t, testingKnobs{}); f != "" {
		t.Fatal(f)
	}
	f := asyncDueRun(t, testingKnobs{gridLate: true})
	if len(f) < 5 || f[:5] != "late:" {
		t.Fatalf("gridLate not caught by the late check: %q", f)
	}
	t.Logf("gridLate caught: %s", f)
}
