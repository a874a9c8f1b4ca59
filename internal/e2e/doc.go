// Package e2e holds end-to-end tests of rdmakv as it is deployed: real
// kvserver processes, built with go build into a temporary directory, run
// from a TOML cluster config (kvserver --config FILE --id N), reached by
// package client over the shm fabric or the tcp fabric, and watched through
// their control ports (/status, /readyz).
//
// The tests:
//
//   - TestProcessesKillRestartUnderLoad (shm, and tcp on loopback): 2
//     groups x 3 replica processes under a load of gets, puts, deletes and
//     compare-and-swaps; the leaders are killed with kill -9 and restarted
//     from their data dirs (twice), then a follower; the history is
//     checked with porcupine (internal/kvcheck), a final read of every key
//     is part of it, and every replica must have applied what its leader
//     applied.
//   - TestStoppedReplica (shm, tcp): a follower, then the leader, stopped
//     with SIGSTOP under load; writes must go on in every second.
//   - TestNearReplicaTCP: clients opened WithNearReplica(i) on tcp read
//     member i with every stale-ok get; while it is stopped (SIGSTOP)
//     they read another member, and after SIGCONT member i again.
//   - TestNetnsPartition: one replica per network namespace on the tcp
//     fabric, the client in a namespace of its own (the test binary run as
//     a helper process); the leader's link goes down, the majority elects
//     a new leader and goes on taking writes, the link comes back and the
//     old leader catches up; the client's history is checked with
//     porcupine. It needs root and ip(8), and skips without them.
//   - TestStartupErrors: the ways kvserver refuses to start each give an
//     exit code other than 0 and one line on stderr naming the cause; and
//     SIGTERM stops a replica with exit code 0, leaving no shm file and
//     releasing its data dir's lock.
//   - TestDeadGroupIsolated, TestOpenWithDeadGroup: 2 groups, two of
//     group 0's three replicas killed. A client whose writes to group 0
//     time out must still complete its writes to group 1. A new client
//     must open, serve group 1, and fail its calls to group 0 at once with
//     *UnavailableError saying why.
//   - TestOpenWithCatchingUpGroup: 2 groups; group 1's leader and a
//     follower killed and restarted without their data (catching up,
//     they cannot vote). A new client must open, serve group 0, and fail
//     a write to group 1 at once with *UnavailableError saying the
//     restarted replicas cannot vote; /readyz says so too.
//   - TestWholeGroupRestart: a group whose every replica stopped does not
//     come back on its own, and starts over once its data dirs are
//     removed (the procedure docs/deploy.md gives).
//   - TestBalancerProcesses (shm), TestBalancerProcessesTCP (tcp; make
//     test runs it without -race), TestBalancerKilledMidMove: the
//     tablet balancer of the process hosting group 0's leader spreads an
//     ordered load over the groups with no kvcli call (porcupine-checked
//     history), and the next leader's process finishes a move whose
//     balancer was killed with -9 after the freeze.
//
// Set RDMAKV_E2E_RACE_SERVER=1 to build kvserver with -race as well.
//
// The package has no code of its own besides this comment: the harness
// is in its test files.
package e2e
