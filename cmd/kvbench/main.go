// Command kvbench benchmarks each layer of rdmakv and, in the same run, the
// baseline each layer is judged against, so that every figure comes with a
// ratio measured on the same machine under the same load.
//
//	kvbench fabric [flags]      one-sided verbs on the mem, shm and tcp fabrics
//	kvbench broadcast [flags]   Acuerdo atomic broadcast inside one group
//	kvbench multicast [flags]   TRAM atomic multicast across groups
//	kvbench kv [flags]          gets and puts of the replicated store against Redis
//	kvbench btree [flags]       lookups, scans and puts of the ordered keyspace against hashed ones
//	kvbench disk [flags]        one small durable write on the disk, without rdmakv (--raw-fsync)
//	kvbench recover [flags]     restart of a durable embedded cluster: recovery time, disk bytes, snapshot stalls
//	kvbench help [command]      list the commands, or one command's flags
//
// Each command prints a table, or with --json one JSON object per result.
// Progress goes to stderr.
//
// Two-party measurements run their second party in a child process: kvbench
// re-executes itself with a hidden subcommand and drives the child with
// JSON lines on its stdin and stdout (peer.go).
//
// Shared-memory files go to a work directory of this process under
// --shm-dir. SIGINT, SIGTERM or a closed stdout end a run cleanly: the
// children are killed, the work directory removed, and kvbench exits
// non-zero (128+signal, or 1) with one line on stderr. Each run starts by
// removing what dead processes left in --shm-dir (cleanup.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/rdmakv/rdmakv/internal/version"
)

// command is one kvbench subcommand.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands in help order.
func commands() []command {
	return []command{
		{"fabric", "latency and throughput of one-sided verbs on mem, shm and tcp, against raw shm, futex and TCP baselines", runFabric},
		{"broadcast", "Acuerdo atomic broadcast: commit latency and throughput by window (Fig. 8), election time (Table 1), --soak memory, --kill-follower outage, --snapshot-catchup large-snapshot catch-up", runBroadcast},
		{"multicast", "TRAM atomic multicast: latency and throughput by tree, destinations, payload and group size (Fig. 5-8), leader changes (Table 1), client path against the one-way write, single-group tax against broadcast, scaling, --soak memory", runMulticast},
		{"kv", "the replicated store (3 replicas on shm, client in another process): gets (stale-ok, linearizable) and puts by goroutines, gets while the index grows, bytes per record; against redis-server in the same run", runKV},
		{"btree", "the ordered keyspace through client.Keyspace: warm lookups against hashed gets and tidwall/btree in process, node reads per lookup, cache hit rate, scans, puts against hashed puts, the cold-cache curve", runBTree},
		{"disk", "--raw-fsync: p50/p99 of one small write + fdatasync and O_DSYNC on the disk under --dir, the figure durable puts compare with", runDisk},
		{"recover", "a durable embedded cluster's restart: time to recover --records from disk, the recovery lines, disk bytes per record before and after a snapshot, the longest poller pass while the snapshot is written", runRecover},
	}
}

func main() {
	if os.Getenv(peerEnv) != "" || (len(os.Args) > 1 && os.Args[1] == peerCmd) {
		if prof := os.Getenv(peerProfileEnv); prof != "" {
			stop, err := startProfile(fmt.Sprintf("%s.%d", prof, os.Getpid()))
			if err != nil {
				fmt.Fprintf(os.Stderr, "kvbench peer: %v\n", err)
				os.Exit(1)
			}
			defer stop()
		}
		if err := peerMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench peer: %v\n", err)
			os.Exit(1)
		}
		return
	}
	stderr := &gatedWriter{w: os.Stderr}
	handleSignals(stderr)
	exit(run(os.Args[1:], stdoutWriter{w: os.Stdout, stderr: stderr}, stderr))
}

// peerProfileEnv, if set to a path, makes every peer process write a CPU
// profile to that path suffixed with its process id (the target side of a
// measurement; --cpuprofile covers the initiator's side).
const peerProfileEnv = "KVBENCH_PEER_CPUPROFILE"

// startProfile starts a CPU profile into path and returns its stop function.
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

// run executes a kvbench command line and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	if name == "--version" || name == "-version" || name == "version" {
		fmt.Fprintln(stdout, version.String("kvbench"))
		return 0
	}
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		if len(args) > 1 && name == "help" {
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(args[1:], stdout, stderr)
		if _, rerr := removeWorkDirs(false); rerr != nil {
			fmt.Fprintf(stderr, "kvbench %s: remove work directory: %v\n", name, rerr)
		}
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case err != nil:
			fmt.Fprintf(stderr, "kvbench %s: %v\n", name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "kvbench: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, "usage: kvbench <command> [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "help", "this list; 'kvbench help <command>' shows a command's flags")
	fmt.Fprintf(w, "  %-10s %s\n", "--version", "the module version and commit kvbench was built from")
}
