package main

import (
	"fmt"
	"os"

	"github.com/rdmakv/rdmakv/internal/childproc"
)

// Every child kvbench spawns but the fabric peer (peer.go) is a child of
// internal/childproc's one mechanism, re-executing kvbench with the
// child's kind in its environment: the kv replicas' process (server's
// "kv"), the broadcast members (groupproc's "bcast-test") and the
// multicast client path's replicas (kvbench's own mcastKind). init serves
// it, before main or a test binary's TestMain, so that the command table
// stays the only entry point users see; KVBENCH_PEER_CPUPROFILE=path
// profiles it (path.<pid>).
func init() {
	if childproc.Kind() == "" {
		return
	}
	childproc.Register(mcastKind, mcServe)
	stop := func() {}
	if prof := os.Getenv(peerProfileEnv); prof != "" {
		var err error
		if stop, err = startProfile(fmt.Sprintf("%s.%d", prof, os.Getpid())); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench %s child: %v\n", childproc.Kind(), err)
			os.Exit(1)
		}
	}
	err := childproc.Serve()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench %s child: %v\n", childproc.Kind(), err)
		os.Exit(1)
	}
	os.Exit(0)
}
