package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

const replicaUsage = `usage: kvserver --config FILE --id N[,M...] [flags]

Runs replica N of the cluster FILE describes (a TOML config; kvserver init
writes a commented example) until SIGINT or SIGTERM; --id N,M runs several
replicas (of any groups) in this one process, on one set of pollers and
one control port (the first replica's). A replica's stable state lives in
the config's data_dir/replica-N. A replica that restarts catches
up from its group; one whose state was lost (a new disk) rejoins as a new
incarnation, on its own when another member shows the group ran, or with
--rejoin.

Flags:
`

func runReplica(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, replicaUsage)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "the cluster config (TOML)")
	id := fs.String("id", "", "the replica to run: its id in the config (N,M,...: several in this process)")
	listen := fs.String("listen", "", "tcp: bind this address instead of the replica's addr (e.g. 0.0.0.0:7001)")
	control := fs.String("control", "", "the control port's address instead of the config's; \"-\": none")
	pprofOn := fs.Bool("pprof", false, "serve /debug/pprof/ on the control port")
	rejoin := fs.Bool("rejoin", false, "with no stable state: rejoin as a new incarnation even if no other member answers (a replaced disk)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error (default: the config's log_level)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvserver: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *config == "" || *id == "" {
		fmt.Fprintln(stderr, "kvserver: --config and --id go together: kvserver --config FILE --id N")
		return 2
	}
	var ids []int64
	for _, f := range strings.Split(*id, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "kvserver: --id %q: want a replica id from the config, or several separated by commas\n", *id)
			return 2
		}
		ids = append(ids, n)
	}
	cfg, err := cluster.LoadConfig(*config)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	if *logLevel == "" {
		*logLevel = cfg.LogLevel
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	for _, n := range ids {
		if _, _, _, err := cfg.Replica(n); err != nil {
			fmt.Fprintf(stderr, "kvserver: %v\n", err)
			return 2
		}
	}
	what := "replica " + *id
	if len(ids) > 1 {
		what = "replicas " + *id
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Once the stop begins, a second SIGINT or SIGTERM ends the process at
	// once (the signal's default action), as kill -9 would.
	go func() { <-ctx.Done(); stop() }()
	err = server.RunReplicas(ctx, cfg, ids, server.Options{Listen: *listen, Control: *control, Pprof: *pprofOn, Rejoin: *rejoin, SpareP: cfg.SpareP != cluster.SparePOff,
		Ready: func(c string) {
			if c != "" {
				c = ", control http://" + c
			}
			fmt.Fprintf(stdout, "kvserver: %s of cluster %q runs (pid %d%s)\n", what, cfg.Name, os.Getpid(), c)
		}}, log)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %s: %v\n", what, err)
		return 1
	}
	return 0
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// exampleShm is the commented config `kvserver init --shm` writes.
//
//go:embed example_shm.toml
var exampleShm string

func runInit(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	shm := fs.Bool("shm", false, "a cluster of one host (fabric shm) instead of three (tcp)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvserver init [--force] [--shm] [FILE]\n\nWrites a commented example config for a cluster of 2 groups x 3 replicas on\n3 hosts (tcp), or with --shm on this host (shared memory), to FILE (default\ncluster.toml; \"-\": standard output).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	path := "cluster.toml"
	if fs.NArg() > 1 {
		fs.Usage()
		return 2
	} else if fs.NArg() == 1 {
		path = fs.Arg(0)
	}
	example, next := cluster.ExampleConfig, "edit the addresses, write the secret file it names, then run kvserver --config %[1]s --id <N> for each replica"
	if *shm {
		example, next = exampleShm, "run kvserver --config %[1]s --id <N> for N = 1 to 6, one process each; then kvcli --config %[1]s"
	}
	if path == "-" {
		fmt.Fprint(stdout, example)
		return 0
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if *force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			fmt.Fprintf(stderr, "kvserver init: %s exists (--force overwrites it)\n", path)
		} else {
			fmt.Fprintf(stderr, "kvserver init: %v\n", err)
		}
		return 1
	}
	if _, err := io.WriteString(f, example); err != nil {
		f.Close()
		fmt.Fprintf(stderr, "kvserver init: %v\n", err)
		return 1
	}
	if err := f.Close(); err != nil {
		fmt.Fprintf(stderr, "kvserver init: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s: "+next+"\n", path)
	return 0
}

func runCheck(cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "the cluster config (TOML)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *config == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "usage: kvserver %s --config FILE\n", cmd)
		return 2
	}
	cfg, err := cluster.LoadConfig(*config)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	m, err := cfg.Map()
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	if cmd == "map" {
		b, _ := json.MarshalIndent(m, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	fmt.Fprintf(stdout, "%s: cluster %q, fabric %s, %s, %s, data_dir %s, heartbeat %v, election timeout %v\n",
		*config, cfg.Name, cfg.Fabric, plural(len(cfg.Groups), "group"), plural(len(m.ClientNodes), "client slot"), cfg.DataDir, time.Duration(cfg.Timing.Heartbeat), time.Duration(cfg.Timing.ElectionTimeout))
	switch cfg.Durability {
	case cluster.DurabilityMemory:
		fmt.Fprintf(stdout, "  durability memory: replicas keep only their stable state on disk; a group whose replicas all stop at once loses its data (set durability = \"sync\" to keep it)\n")
	case cluster.DurabilityAsync:
		fmt.Fprintf(stdout, "  durability async: fsync at least every %v; a power cut of a whole group loses at most the writes of the last interval\n", time.Duration(cfg.FsyncInterval))
	default:
		fmt.Fprintf(stdout, "  durability %s: a write is acknowledged once a majority of its group has it on disk\n", cfg.Durability)
	}
	if cfg.Durability != cluster.DurabilityMemory {
		fmt.Fprintf(stdout, "  wal_layout %s: each replica writes a log of its own in data_dir/replica-<id>/wal\n", cfg.WALLayout)
	}
	if cfg.SpareP == cluster.SparePOff {
		fmt.Fprintf(stdout, "  spare_p off: a replica process's pollers never raise GOMAXPROCS; every wait gives its core up (the least CPU, fewer puts a second at many writers)\n")
	} else {
		fmt.Fprintf(stdout, "  spare_p %s: a replica process raises GOMAXPROCS to its pollers + 1 while a poller's stream is dense, and its pollers' short waits keep their core (spare_p = \"off\": never)\n", cfg.SpareP)
	}
	for g, gr := range cfg.Groups {
		for _, r := range gr.Replicas {
			fmt.Fprintf(stdout, "  group %d replica %d", g, r.ID)
			if r.Addr != "" {
				fmt.Fprintf(stdout, " addr %s", r.Addr)
			}
			if r.Control != "" {
				fmt.Fprintf(stdout, " control %s", r.Control)
			}
			fmt.Fprintln(stdout)
		}
	}
	if tc, ok := m.OrderedTree(); ok {
		for _, ks := range m.Keyspaces {
			fmt.Fprintf(stdout, "  keyspace %q: %s (id %d), nodes of %d bytes, keys up to %d bytes, values up to %d, %d tablets in groups %v\n",
				ks.Name, ks.Kind, ks.ID, tc.NodeSize, m.OrderedMaxKey(), m.OrderedMaxValue(), len(ks.Splits)+1, m.OrderedGroups())
		}
		for _, l := range balancerLines(cfg, m) {
			fmt.Fprintln(stdout, "  "+l)
		}
	}
	return 0
}

// balancerLines is what check says of the tablet balancer: its interval
// and the rule by load's thresholds in force, and on tcp each host of group 0's replicas where no client slot
// listens (the balancer runs in the process of group 0's leader, on a
// client slot of its host).
func balancerLines(cfg *cluster.Config, m *cluster.Map) []string {
	if len(m.Groups) < 2 {
		return nil
	}
	d := cfg.BalanceInterval()
	if d == 0 {
		return []string{"tablet balancer: off ([ordered] balance_interval = \"0\"): tablets move when an operator asks (kvcli balance)"}
	}
	out := []string{fmt.Sprintf("tablet balancer: a move at most every %v, by the process hosting group 0's leader (by the tablets' write load, splitting a hot tablet of %d keys or more first; by their count under %d writes a round: [ordered] balance_split_keys, balance_min_writes)",
		d, cfg.BalanceSplitKeys(), cfg.BalanceMinWrites())}
	if m.Fabric != "tcp" {
		return out
	}
	hosts := map[string]bool{}
	for _, id := range m.ClientNodes {
		if h, _, err := net.SplitHostPort(m.Addrs[id]); err == nil {
			hosts[h] = true
		}
	}
	for _, id := range m.Groups[0] {
		h, _, err := net.SplitHostPort(m.Addrs[id])
		if err == nil && !hosts[h] {
			out = append(out, fmt.Sprintf("warning: no client slot listens on %s (replica %d of group 0): the tablet balancer cannot run there while it leads (add a [[clients]] block with count = 1 listening on %s)", h, id, h))
			hosts[h] = true // once per host
		}
	}
	return out
}
