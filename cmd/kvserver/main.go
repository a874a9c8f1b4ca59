// Command kvserver runs rdmakv replicas.
//
// With no arguments it starts an embedded local cluster: every replica of a
// small cluster (2 groups of 3 replicas by default) in this process, on the
// shm fabric, so that other processes on the host (kvcli, Go programs using
// package client, YCSB drivers) read its memory one-sided. It writes the
// cluster map where those find it by default (client.DefaultMapFile),
// prints how to connect, and runs until SIGINT or SIGTERM, after which it
// leaves no file behind (shared memory, map, lock) but its data directory:
// by default its replicas keep their data in --data-dir in sync mode
// (every acknowledged write survives a restart, even after kill -9), and
// --memory keeps nothing.
//
// With --config FILE --id N it runs one replica of a cluster described by
// a TOML config (kvserver init writes a commented example): one process
// per replica, on the tcp fabric (hosts) or shm (one host), with its
// stable state in the config's data_dir and an HTTP control port
// (status, Prometheus metrics, health, readiness, the cluster map).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/internal/version"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

func main() {
	ignoreSIGPIPE()
	restore := func() {}
	if os.Getenv(foregroundEnv) == "1" {
		restore = takeTerminal()
	}
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	restore()
	os.Exit(code)
}

// ignoreSIGPIPE makes writes to a closed stdout or stderr fail with EPIPE
// (which kvserver ignores) instead of killing it. Go's runtime kills a
// program whose write to fd 1 or 2 hits a closed pipe with SIGPIPE unless
// the program asked to be notified of SIGPIPE: kvserver | tee, then Ctrl-C,
// killed kvserver as it printed "stopping", before it removed its shared
// memory, map and lock. Nothing reads the channel: the notification is
// dropped, the write's error is what counts.
func ignoreSIGPIPE() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

const usage = `usage:
  kvserver [flags]                      an embedded local cluster (below)
  kvserver --config FILE --id N [...]   one replica of a cluster (kvserver --config x --help)
  kvserver init [--shm] [FILE]          write a commented example config (default cluster.toml;
                                        --shm: every replica on this host)
  kvserver check --config FILE          validate a config and summarise it
  kvserver map --config FILE            print the cluster map clients use (JSON)
  kvserver force-new-cluster --config FILE --group G [--from ID] [--yes]
                                        a group whose majority restarted without its data
                                        (memory mode) cannot elect: go on from a replica
                                        that kept it, losing what only the others held
                                        (says what it would do; --yes does it)
  kvserver backup --config FILE --out DIR
                                        a consistent backup of the whole cluster (one file
                                        per group, at one index per group) into DIR
  kvserver restore --config FILE --from DIR [--force]
                                        write a backup into every replica's (empty) data dir,
                                        offline: started, they are a new cluster at the backup
  kvserver --version                    the module version and commit it was built from

With no flags, kvserver starts an embedded local cluster of 2 groups x 3
replicas on the shm fabric, writes its cluster map to %s,
and runs until Ctrl-C (SIGINT) or SIGTERM. kvcli and Go programs using
github.com/rdmakv/rdmakv/client find the map there by default. Its data is
kept in --data-dir (durability async: Ctrl-C loses nothing, a power cut
or kill -9 at most the last 10ms of writes; --durability sync loses
nothing acknowledged) and comes back when it is started again with the
same flags; --memory keeps nothing.

Flags of the embedded cluster:
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "--version", "-version", "version":
			fmt.Fprintln(stdout, version.String("kvserver"))
			return 0
		case "init":
			return runInit(args[1:], stdout, stderr)
		case "check", "map":
			return runCheck(args[0], args[1:], stdout, stderr)
		case "force-new-cluster":
			return runForce(args[1:], stdout, stderr)
		case "backup":
			return runBackup(args[1:], stdout, stderr)
		case "restore":
			return runRestore(args[1:], stdout, stderr)
		}
	}
	for _, a := range args {
		if a == "--config" || a == "-config" || strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "-config=") {
			return runReplica(args, stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("kvserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, usage, client.DefaultMapFile)
		fs.PrintDefaults()
	}
	groups := fs.Int("groups", 2, "embedded cluster: number of groups (shards)")
	replicas := fs.Int("replicas", 3, "embedded cluster: replicas per group (odd: 1, 3, 5)")
	clients := fs.Int("clients", 32, "embedded cluster: client slots (processes that may be connected at once)")
	mapFile := fs.String("map", client.DefaultMapFile, "where to write the cluster map")
	shmDir := fs.String("shm-dir", "/dev/shm", "the shm fabric's directory (a tmpfs)")
	name := fs.String("name", "local", "the cluster's name ([A-Za-z0-9_-]{1,64})")
	heartbeat := fs.Duration("heartbeat", 10*time.Millisecond, "replicas' heartbeat interval (each wakes every replica: the idle CPU cost)")
	election := fs.Duration("election-timeout", 150*time.Millisecond, "how long a group waits for its leader before electing another")
	control := fs.String("control", "127.0.0.1:0", "the control port's address (status, metrics, health); \"-\": none")
	pprofOn := fs.Bool("pprof", false, "serve /debug/pprof/ on the control port")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	dataDir := fs.String("data-dir", "", "where the replicas keep their data (default $XDG_STATE_HOME/rdmakv/<name>, else ~/.local/state/rdmakv/<name>)")
	durability := fs.String("durability", defaultDurability, "what the replicas keep on disk: async (synced at least every 10ms: a power cut or kill -9 loses at most the last 10ms of writes, Ctrl-C nothing), sync (a write is acknowledged once a majority of its group synced it) or memory (nothing: the data is gone when kvserver stops)")
	memory := fs.Bool("memory", false, "keep nothing on disk (--durability memory): the data is gone when kvserver stops")
	balance := fs.Duration("balance-interval", cluster.DefaultBalanceInterval, "the tablet balancer's pause between moves of the ordered keyspace's tablets (each round moves or splits at most one: by the tablets' write load, else from the group with the most to the one with the fewest); 0: no balancer (kvcli balance moves them)")
	minWrites := fs.Int64("balance-min-writes", cluster.DefaultBalanceMinWrites, "the fewest writes (all groups together) between two balancer rounds for the balancer to go by the tablets' write load (fewer: by their count); 1 to 10^12 (0: the default), as [ordered] balance_min_writes in a config")
	splitKeys := fs.Int64("balance-split-keys", cluster.DefaultBalanceSplitKeys, "the fewest keys a hot tablet must hold for the balancer to split it (going by load); 2 to 65536 (0: the default), as [ordered] balance_split_keys in a config")
	walLayout := fs.String("wal-layout", cluster.WALShared, "sync and async: how a new data dir lays out the logs: shared (one log for all the replicas of the process: one fsync covers them; the faster layout at one writer and at many on one disk) or per-replica (each replica a log of its own); a data dir keeps the layout it was made with")
	spareP := fs.String("spare-p", cluster.SparePAuto, "the pollers' spare P: auto (raise GOMAXPROCS by one while a poller's stream is dense, so its short waits keep their core: more puts a second at many writers) or off (never: the least CPU)")
	savesAtOnce := fs.Bool("saves-at-once", false, "durable modes: the process's replicas save their disk snapshots each when its log says, all at once (to compare; by default one at a time)")
	savePollDetail := fs.Bool("save-poll-detail", false, "a diagnostic: while a disk snapshot is saved, read each replica Poll's thread counters (CPU, run-queue wait, faults, switches: /status poll_max_saving_read), about ten system calls a Poll")
	snapLog := fs.String("snapshot-log-bytes", "", "sync and async: how much log (bytes of synced batches, e.g. 64MiB: 1MiB to 1024MiB) a replica writes before it takes a disk snapshot and drops the log behind it (default 64MiB, as [snapshot] log_bytes in a config)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvserver: unexpected argument %q (see kvserver --help)\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	if *replicas < 1 || *replicas%2 == 0 || *groups < 1 || *clients < 1 {
		fmt.Fprintf(stderr, "kvserver: --groups %d --replicas %d --clients %d: want at least one group, an odd number of replicas and at least one client slot\n", *groups, *replicas, *clients)
		return 2
	}
	m := embeddedMap(*name, *shmDir, *groups, *replicas, *clients)
	if err := m.Fill(); err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	if *heartbeat <= 0 || *election < 4**heartbeat {
		fmt.Fprintf(stderr, "kvserver: --heartbeat %v --election-timeout %v: want a positive heartbeat and an election timeout of at least 4 heartbeats\n", *heartbeat, *election)
		return 2
	}
	if err := cluster.CheckBalanceInterval(*balance); err != nil {
		fmt.Fprintf(stderr, "kvserver: --balance-interval %v\n", err)
		return 2
	}
	if err := cluster.CheckBalanceMinWrites(*minWrites); err != nil {
		fmt.Fprintf(stderr, "kvserver: --balance-min-writes %v\n", err)
		return 2
	}
	if err := cluster.CheckBalanceSplitKeys(*splitKeys); err != nil {
		fmt.Fprintf(stderr, "kvserver: --balance-split-keys %v\n", err)
		return 2
	}
	if err := cluster.CheckWALLayout(*walLayout); err != nil {
		fmt.Fprintf(stderr, "kvserver: --wal-layout %v\n", err)
		return 2
	}
	if err := cluster.CheckSpareP(*spareP); err != nil {
		fmt.Fprintf(stderr, "kvserver: --spare-p %v\n", err)
		return 2
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	eo := embedOpts{control: *control, pprof: *pprofOn, log: log, balance: *balance, minWrites: uint64(*minWrites), splitKeys: uint64(*splitKeys),
		logLevel: *logLevel, stderr: stderr, spareP: *spareP != cluster.SparePOff, savePollDetail: *savePollDetail, savesAtOnce: *savesAtOnce}
	eo.walLayout, eo.walLayoutDefault = *walLayout, !explicit["wal-layout"]
	if *memory {
		if explicit["durability"] && *durability != "memory" {
			fmt.Fprintf(stderr, "kvserver: --memory and --durability %s: give one\n", *durability)
			return 2
		}
		*durability = "memory"
	}
	mode, err := server.ParseDurability(*durability)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: --%v\n", err)
		return 2
	}
	eo.durable = server.DurableConfig{Mode: mode, SegmentBytes: embeddedSegmentBytes}
	if *snapLog != "" {
		n, err := cluster.ParseByteSize(*snapLog)
		if err == nil && n < 1<<20 {
			err = fmt.Errorf("%q: want at least 1MiB", *snapLog)
		}
		if err != nil {
			fmt.Fprintf(stderr, "kvserver: --snapshot-log-bytes %v\n", err)
			return 2
		}
		eo.durable.SnapshotLogBytes = int64(n)
	}
	if mode == broadcast.Memory {
		if explicit["data-dir"] || explicit["snapshot-log-bytes"] || explicit["wal-layout"] {
			fmt.Fprintf(stderr, "kvserver: --data-dir, --snapshot-log-bytes or --wal-layout with durability memory: memory mode keeps nothing on disk (leave them out, or --memory)\n")
			return 2
		}
	} else {
		eo.dataDir = *dataDir
		if eo.dataDir == "" {
			if eo.dataDir, err = defaultDataDir(*name); err != nil {
				fmt.Fprintf(stderr, "kvserver: %v (give --data-dir, or --memory)\n", err)
				return 2
			}
		}
	}
	bc := broadcast.Config{HeartbeatInterval: *heartbeat, ElectionTimeout: *election}
	if err := serve(m, bc, *mapFile, eo, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 1
	}
	return 0
}

// embeddedMap is the embedded cluster's map: groups x replicas on shm
// (nodes 1, 2, ...), client slots on nodes 1000, 1001, ..., and the
// ordered keyspace.
func embeddedMap(name, shmDir string, groups, replicas, clients int) *cluster.Map {
	m := &cluster.Map{Name: name, Fabric: "shm", ShmDir: shmDir,
		Keyspaces: []cluster.Keyspace{{Name: cluster.DefaultOrderedKeyspace, Kind: cluster.KindOrdered, ID: 1}}}
	id := rdma.NodeID(1)
	for range groups {
		var ms []rdma.NodeID
		for range replicas {
			ms = append(ms, id)
			id++
		}
		m.Groups = append(m.Groups, ms)
	}
	for k := range clients {
		m.ClientNodes = append(m.ClientNodes, rdma.NodeID(1000+k))
	}
	return m
}

// defaultDurability is the embedded cluster's --durability default:
// async, like Redis's appendfsync everysec, for a development cluster
// (Ctrl-C and a restart keep everything: a clean stop syncs the logs;
// a power cut or kill -9 loses at most the last fsync interval's writes)
// with writes close to memory mode's speed. `kvserver init` writes
// durability = "sync" instead (cluster/example.toml): a production
// cluster's acknowledged write must survive a power cut of its group.
const defaultDurability = "async"

// embeddedSegmentBytes is the embedded cluster's log segment size: six
// replicas on one disk (a laptop's, often), each preallocating a segment
// or two, so smaller than a replica's default 64 MiB: 48-96 MiB of
// preallocated space for a fresh `make run` is too much.
const embeddedSegmentBytes = 8 << 20

// defaultDataDir is the embedded cluster's default --data-dir:
// $XDG_STATE_HOME/rdmakv/<name>, else ~/.local/state/rdmakv/<name>.
func defaultDataDir(name string) (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "rdmakv", name), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no data directory: %v", err)
	}
	return filepath.Join(home, ".local", "state", "rdmakv", name), nil
}

// serve runs the embedded cluster of map m until a signal.
type embedOpts struct {
	control string
	pprof   bool
	log     *slog.Logger
	durable server.DurableConfig
	dataDir string // "" in memory mode
	// balance is the tablet balancer's interval (0: none); its lines go
	// to stderr at info unless the log level is error.
	balance time.Duration
	// minWrites and splitKeys are the balancer's rule by load's
	// thresholds (0: the defaults).
	minWrites, splitKeys uint64
	logLevel             string
	stderr               io.Writer
	// walLayout is the log layout a new data dir gets (--wal-layout;
	// walLayoutDefault: not given); spareP is --spare-p auto.
	walLayout        string
	walLayoutDefault bool
	spareP           bool
	savePollDetail   bool // --save-poll-detail
	savesAtOnce      bool // --saves-at-once
}

func serve(m *cluster.Map, bc broadcast.Config, mapFile string, eo embedOpts, stdout, stderr io.Writer) error {
	if err := os.MkdirAll(filepath.Dir(mapFile), 0o755); err != nil {
		return err
	}
	// One embedded cluster per map file: a lock held for the process's
	// life (the kernel drops it if the process dies).
	lock, err := os.OpenFile(mapFile+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(mapFile + ".lock")
		return fmt.Errorf("a local cluster already runs with map %s (process %s); stop it first, or give another --map and --name", mapFile, trim(pid))
	}
	defer os.Remove(mapFile + ".lock")
	lock.Truncate(0)
	fmt.Fprintf(lock, "%d\n", os.Getpid())

	if removed, err := shm.SweepStale(m.ShmDir); err != nil {
		fmt.Fprintf(stderr, "kvserver: cleaning %s: %v\n", m.ShmDir, err)
	} else if len(removed) > 0 {
		fmt.Fprintf(stderr, "kvserver: removed %s that dead rdmakv processes left in %s\n", plural(len(removed), "file"), m.ShmDir)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	var cln net.Listener
	controlLine := "none (--control)"
	if eo.control != "-" {
		if cln, err = server.ListenControl(eo.control); err != nil {
			return fmt.Errorf("%w (give another --control, or \"-\" for none)", err)
		}
	}
	pc := server.ProcessConfig{Map: m, Broadcast: bc, Control: cln, Pprof: eo.pprof, Log: eo.log, Durable: eo.durable, SpareP: eo.spareP, WALLayout: eo.walLayout, WALLayoutDefault: eo.walLayoutDefault, SavePollDetail: eo.savePollDetail, SavesAtOnce: eo.savesAtOnce,
		Balance: server.BalanceConfig{Interval: eo.balance, MinWrites: eo.minWrites, SplitKeys: eo.splitKeys}}
	if eo.logLevel == "warn" && eo.stderr != nil {
		// The default level hides info lines; the balancer's moves (a
		// line each, rare) are shown anyway.
		pc.Balance.Log = slog.New(slog.NewTextHandler(eo.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	dataLine := "in memory only (--memory): nothing is kept when kvserver stops"
	if eo.dataDir != "" {
		unlock, err := server.UseDataDir(&pc, eo.dataDir)
		if err != nil {
			if cln != nil {
				cln.Close()
			}
			return err
		}
		defer unlock()
		layout := "a log per replica"
		if pc.SharedLog != "" {
			layout = "one shared log"
		}
		dataLine = fmt.Sprintf("%s (durability %v, %s; --memory keeps nothing)", eo.dataDir, eo.durable.Mode, layout)
	}
	proc, err := server.StartProcess(pc)
	if err != nil {
		return fmt.Errorf("start the local cluster: %w", err)
	}
	defer proc.Close()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = proc.WaitServing(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("start the local cluster: %w", err)
	}
	if err := m.Save(mapFile); err != nil {
		return fmt.Errorf("write the cluster map: %w", err)
	}
	defer os.Remove(mapFile)
	if a := proc.ControlAddr(); a != "" {
		controlLine = "http://" + a + "/status  (also /metrics /healthz /readyz /map)"
	}
	fmt.Fprintf(stdout, `rdmakv local cluster %q is up in %v: %s x %s on shm (%s), pid %d
  cluster map:  %s
  data:         %s
  control:      %s
  spare P:      %s
  try:          go run ./cmd/kvcli put hello world && go run ./cmd/kvcli get hello
  from Go:      c, err := client.Open(ctx)   // package github.com/rdmakv/rdmakv/client
  ordered:      c.Keyspace("ordered")         // sorted keys and Scan (docs/client.md)
  stop:         Ctrl-C (or kill %d)
`, m.Name, time.Since(start).Round(time.Millisecond), plural(len(m.Groups), "group"), plural(len(m.Groups[0]), "replica"), m.ShmDir, os.Getpid(), mapFile, dataLine, controlLine, spareLine(eo.spareP), os.Getpid())
	select {
	case <-ctx.Done():
	case err := <-proc.Failed():
		return err
	}
	// A second Ctrl-C or SIGTERM during the stop ends the process at once
	// (the signal's default action), as kill -9 would.
	stop()
	fmt.Fprintln(stdout, "kvserver: stopping (a second Ctrl-C exits at once, as kill -9 does)")
	return nil
}

// spareLine is the banner's line on the pollers' spare P.
func spareLine(on bool) string {
	if on {
		return "auto: GOMAXPROCS one above the pollers while a stream is dense (--spare-p off: never)"
	}
	return "off (--spare-p): GOMAXPROCS stays; every wait gives its core up"
}

// plural is n and word, with an s unless n is 1 ("1 group", "3 groups").
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func trim(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}
