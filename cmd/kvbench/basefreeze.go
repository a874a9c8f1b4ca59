package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvproc"
)

// baseKnobs are planted bugs of the Redis rows' freeze, for the test that
// must catch them; all false in a real run.
var baseKnobs struct {
	// keepReplicasRunning skips stopping the replicas' process during a
	// Redis measurement. TestKVBaselineFrozen catches it as "running".
	keepReplicasRunning bool
	// noThawOnError leaves the replicas' process stopped when Redis's
	// part fails. TestFrozenResumes catches it as "left stopped".
	noThawOnError bool
}

// frozen runs f, a Redis measurement, with the replicas' processes
// stopped (SIGSTOP), so that the idle replicas (every heartbeat wakes
// each one) take no CPU from Redis and its goroutines; then resumes them
// (SIGCONT) and waits until the cluster serves a linearizable read again
// before rdmakv's next row. The result records the processes' state
// letters at the measurement's start and end (T: stopped) and the CPU
// they used meanwhile.
func (e *kvEnv) frozen(f func() (kvstat, error)) (kvstat, error) {
	var st kvstat
	d, err := e.frozenDo(func() (err error) {
		st, err = f()
		return err
	})
	st.replicas, st.replicasCPU = d.State, d.CPUSeconds
	return st, err
}

// frozenDo runs f (Redis's part of a row: a get or put measurement, or
// the load of the growth and memory rows) with the replicas' processes
// stopped, as frozen says, and returns the record of what they did
// during f. However f ends (an error, a panic), the processes are resumed
// before frozenDo returns; a Ctrl-C meanwhile ends in abort, whose
// SIGKILL ends a stopped child too (cleanup.go).
func (e *kvEnv) frozenDo(f func() error) (d kvproc.During, err error) {
	stop := !baseKnobs.keepReplicasRunning
	var stopped []int
	defer func() {
		if baseKnobs.noThawOnError && err != nil {
			return
		}
		if terr := e.thaw(stopped); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	if stop {
		for _, pid := range e.reps {
			if err := kvproc.Freeze(pid); err != nil {
				// A failed Freeze may still have sent SIGSTOP:
				// resume this one too.
				stopped = append(stopped, pid)
				return d, fmt.Errorf("stop the replicas' process: %w", err)
			}
			stopped = append(stopped, pid)
		}
	}
	during := kvproc.Watch(e.reps...)
	defer func() { during.End(); d = *during }()
	return d, f()
}

// thaw resumes pids and waits up to 30 s until a linearizable read of
// each of 16 keys (spread over the groups) succeeds or finds no key.
func (e *kvEnv) thaw(pids []int) error {
	if len(pids) == 0 {
		return nil
	}
	var err error
	for _, pid := range pids {
		err = errors.Join(err, kvproc.Thaw(pid))
	}
	if err != nil || e.c == nil {
		return err
	}
	key := make([]byte, kvKeySize)
	return kvproc.WaitServes(e.ctx, 30*time.Second, func(ctx context.Context, i int) error {
		fillKey(key, i)
		_, err := e.c.GetItem(ctx, key, client.Linearizable)
		if errors.Is(err, client.ErrNotFound) {
			return nil
		}
		return err
	})
}

// baselineReplicas is a row's baseline_replicas from the During states
// of its runs' Redis parts: "stopped" when the replicas' processes were
// stopped from the start to the end of every one, else the states seen.
func baselineReplicas(states []string) string {
	var seen []string
	for _, s := range states {
		if !kvproc.Stopped(s) {
			seen = append(seen, s)
		}
	}
	if len(seen) == 0 {
		return "stopped"
	}
	return "running (" + strings.Join(seen, ", ") + ")"
}

// mapOf is f of each of xs.
func mapOf[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
