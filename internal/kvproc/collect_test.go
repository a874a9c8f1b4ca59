package kvproc_test

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// collect returns report, which records a failure of a concurrent worker
// (the first 10) and sets done so that every worker stops, and failures,
// which returns what was recorded (call it once the workers ended).
func collect(done *atomic.Bool) (report func(format string, args ...any), failures func() []string) {
	var mu sync.Mutex
	var bad []string
	report = func(format string, args ...any) {
		mu.Lock()
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
		done.Store(true)
	}
	failures = func() []string {
		mu.Lock()
		defer mu.Unlock()
		return bad
	}
	return report, failures
}
