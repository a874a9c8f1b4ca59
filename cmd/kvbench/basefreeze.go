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
}

// frozen runs f, a Redis measurement, with the replicas' processes
// stopped (SIGSTOP), so that the idle replicas (every heartbeat wakes
// each one) take no CPU from Redis and its goroutines; then resumes them
// (SIGCONT) and waits until the cluster serves a linearizable read again
// before rdmakv's next row. The result records the processes' state
// letters at the measurement's start and end (T: stopped) and the CPU
// they used meanwhile.
func (e *kvEnv) frozen(f func() (kvstat, error)) (kvstat, error) {
	if !baseKnobs.keepReplicasRunning {
		for i, pid := range e.reps {
			if err := kvproc.Freeze(pid); err != nil {
				e.thaw(e.reps[:i])
				return kvstat{}, fmt.Errorf("stop the replicas' process: %w", err)
			}
		}
	}
	during := kvproc.Watch(e.reps...)
	st, err := f()
	during.End()
	st.replicas, st.replicasCPU = during.State, during.CPUSeconds
	if !baseKnobs.keepReplicasRunning {
		if terr := e.thaw(e.reps); terr != nil && err == nil {
			err = terr
		}
	}
	return st, err
}

// thaw resumes pids and waits up to 30 s until a linearizable read of
// each of 16 keys (spread over the groups) succeeds or finds no key.
func (e *kvEnv) thaw(pids []int) error {
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

// baselineReplicas is a row's baseline_replicas: "stopped" when the
// replicas' processes were stopped from the start to the end of every
// Redis measurement of the row, else the states seen.
func baselineReplicas(ps []kvPair) string {
	var seen []string
	for _, p := range ps {
		if !kvproc.Stopped(p.base.replicas) {
			seen = append(seen, p.base.replicas)
		}
	}
	if len(seen) == 0 {
		return "stopped"
	}
	return "running (" + strings.Join(seen, ", ") + ")"
}
