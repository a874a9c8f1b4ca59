package poller

import (
	"context"
	"sync"
	"testing"
)

// runGroup runs g in the background until stop (which the test's cleanup
// also calls) cancels it and waits for Run to return.
func runGroup(t *testing.T, g *Group) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// RunGroup is runGroup for the package's external tests.
var RunGroup = runGroup
