// Package sim is rdmakv's deterministic simulator: it runs protocol
// replicas (Acuerdo, TRAM, the KV store) as polled state machines over the
// queued mem fabric, on one goroutine, in virtual time, under a scheduler
// and a fault schedule drawn from one seed. A run is a pure function of its
// seed and options, so a failing seed reproduces exactly.
//
// # The loop
//
// A test adds nodes, each with a factory of Processes (one Process per
// incarnation), registers checkers and runs:
//
//	s := sim.New(sim.Options{Seed: seed, Faults: sim.Faults{Until: 20 * time.Millisecond}})
//	defer s.Close()
//	for id := rdma.NodeID(1); id <= 3; id++ {
//		s.AddNode(id, func() sim.Process { return newReplica(cfg) })
//	}
//	s.Observe(func(ev sim.Event) { ... })     // every event, in order
//	s.Invariant(func() error { ... })          // after every step and fault
//	err := s.RunUntil(20 * time.Millisecond)   // faults stop and heal at Until
//	err = s.Await(converged, 70*time.Millisecond)
//
// Process.Start runs when an incarnation boots: it registers regions,
// grants peers and connects through env.Node(), an rdma.Node, and reads its
// env.Disk(). Process.Step(now) reads the node's own memory and completions,
// posts verbs and returns whether it made progress. A replica written for
// production should not import sim: give it an rdma.Node, a clock value, a
// *rand.Rand and a small storage interface (Disk has Get and Put, durable at
// once; and files: Disk is a vfs.FS and env.DiskDevice() a wal.Device whose
// unsynced writes a crash may lose or tear, see disk.go), and let a few
// lines of test code adapt it to Process.
//
// The scheduler keeps one agenda of timed items and runs the earliest
// (ties in scheduling order). A node steps when
//   - a write or atomic landed in its memory, or a completion (signaled, or
//     any error) reached one of its Conns: it is woken and steps after a
//     random latency in [StepLatency/4, StepLatency];
//   - its last Step returned true (again, after that latency);
//   - a time it asked for with Env.WakeAt comes;
//   - its periodic Tick comes (a clock for heartbeats; phases differ).
//
// Nodes that have nothing to do are not stepped, which keeps a seed cheap.
//
// Every verb is queued (mem Options.Queued). Post gives it a landing time
// now + delay (MinDelay..MaxDelay, sometimes plus a tail up to TailDelay),
// but never earlier than the previous op's on the same Conn: FIFO per Conn
// always holds. When it lands, its completion is given a return time in
// the same way, again never earlier than the previous op's. A write longer
// than 8 bytes may land torn (TearProb): a prefix first, the rest a moment
// later, with the target possibly stepping in between, as a reader of a
// real NIC's DMA can see. Readers must validate (checksum, canary).
//
// # Faults
//
//   - Crash(id): the node stops stepping and its memory is gone. Of the ops
//     it had queued on each Conn, a prefix drawn from the seed (none, all,
//     or any length) still lands; never anything out of order. Ops of peers
//     targeting it are held and fail with rdma.ErrPeerDead after
//     FabricTimeout; Connect to it fails at once with rdma.ErrPeerDead.
//     Its disk's files lose what was not synced (disk.go).
//   - Restart(id, keepDisk): a new incarnation with fresh, zeroed memory,
//     a new Process, and the previous incarnation's Disk if keepDisk.
//     Peers' old Conns stay broken; they must reconnect.
//   - Cut(from, to), Heal, Partition(a, b), HealPair, Isolate, HealAll: a
//     cut directed link holds ops from -> to, and the acknowledgements of
//     to's ops to from. Held ops proceed if the link heals within
//     FabricTimeout and fail with rdma.ErrPeerDead (with everything queued
//     behind them) if not, as an RC queue pair's retries run out. An op
//     whose acknowledgement is lost has landed but fails.
//   - SetSlow(id, k): the node steps k times less often and each leg of its
//     ops takes k times longer.
//
// Faults are scripted (call them between runs or from At) or random:
// Options.Faults draws crashes, partitions (one direction, both, or a
// whole node isolated) and slow spells from the seed until Faults.Until,
// then heals everything (restarting crashed nodes with their disks), so a
// test can check convergence after it.
//
// # Determinism rules
//
// The simulator uses math/rand/v2 PCG sources seeded from Options.Seed
// (separate streams for the fabric, the faults, the test's workload through
// Sim.Rand, and each incarnation through Env.Rand), never real time,
// goroutines, or map iteration order in any decision. Processes must follow
// the same rules to stay reproducible: randomness only from env.Rand(),
// time only from Step's argument or env.Now(), no goroutines, no blocking
// (a simulated Conn's Wait just polls; rdma.Do and Doorbell.Wait would wait
// in real time for nothing), and no map iteration that changes what is
// posted or output. TraceHash folds every event into a hash; the package's
// tests run seeds twice and compare it.
//
// # Seeds in tests
//
// Flags (RegisterFlags) give a test package -seed N (one seed), -seeds K
// (seeds 1..K; when not given, the test's own count set with
// Flags.WithDefault or DefaultSeeds, a tenth with -short) and -simtrace
// (log every event). A given -seeds K runs exactly K seeds per test.
// Flags.Run runs a body per seed; on the first failure it
// prints the seed, the last events before it (a *Failure carries them) and
// the command that reruns just that seed, e.g.
//
//	go test ./sim -run '^TestCounterSim$' -seed 1234 -v -simtrace
//
// The package's own tests show the whole pattern on a small protocol: a
// replicated counter over a shared state table (counter_test.go), checked
// over many seeds for consistent, monotone, never-ahead views and for
// convergence after faults, with a deliberately broken variant that the
// checker must catch.
package sim
