package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/rdmakv/rdmakv/internal/childproc"
)

// clusterProfileEnv, set to a path, makes the embedded cluster's process
// write a CPU profile to that path suffixed with its process id (the
// replicas' side; --cpuprofile covers kvycsb's own process: go-ycsb and the
// client).
const clusterProfileEnv = "KVYCSB_CLUSTER_CPUPROFILE"

// serveChild serves the child process kvycsb re-executed itself as (the
// embedded cluster), profiled when clusterProfileEnv is set, and exits;
// it returns at once in kvycsb itself.
func serveChild() {
	if childproc.Kind() == "" {
		return
	}
	stop := func() {}
	if path := os.Getenv(clusterProfileEnv); path != "" {
		var err error
		if stop, err = startProfile(fmt.Sprintf("%s.%d", path, os.Getpid())); err != nil {
			fmt.Fprintf(os.Stderr, "kvycsb %s child: %v\n", childproc.Kind(), err)
			os.Exit(1)
		}
	}
	err := childproc.Serve()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvycsb %s child: %v\n", childproc.Kind(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// startProfile starts a CPU profile into path and returns its stop
// function.
func startProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
