package rdma

import (
	"runtime"
	"sync/atomic"
)

type atomicBool struct{ b atomic.Bool }

func (a *atomicBool) set()      { a.b.Store(true) }
func (a *atomicBool) get() bool { return a.b.Load() }

// setProcs sets GOMAXPROCS to n and returns the function that restores it.
func setProcs(n int) func() {
	old := runtime.GOMAXPROCS(n)
	return func() { runtime.GOMAXPROCS(old) }
}
