package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

const backupUsage = `usage: kvserver backup --config FILE --out DIR [--timeout D]
       kvserver backup --control ADDR [--map FILE] --out DIR [--timeout D]

Takes a consistent backup of the whole cluster while it runs: one marker
is multicast to every group, and each group's state at the marker (the
same cut for every group: a batch spanning groups is in the backup in
every group or in none) is written by its replicas, fetched from one of
them through its control port, checked, and saved as DIR/group-<g>.snap
with DIR/manifest.json (the cluster, each group's index, the files'
check words). The replicas' copies are removed at the end, and nothing
is left in DIR if the backup fails. DIR must be new or empty.

With --config, the control ports are the config's replicas'. An embedded
cluster (kvserver with no --config, make run) takes --control, the
address its banner prints, and --map (default %s).
kvserver restore starts a new cluster from a backup.

`

func runBackup(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, backupUsage, client.DefaultMapFile)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "the cluster config (TOML)")
	control := fs.String("control", "", "an embedded cluster: its control port (host:port)")
	mapFile := fs.String("map", client.DefaultMapFile, "an embedded cluster: its map file")
	out := fs.String("out", "", "the backup directory (new or empty)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long (replicas that apply the marker later write nothing)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *out == "" || fs.NArg() > 0 || (*config == "") == (*control == "") {
		fmt.Fprintln(stderr, "kvserver backup: give --out DIR and either --config FILE or --control ADDR (see kvserver backup --help)")
		return 2
	}
	o := server.BackupOptions{Out: *out, Timeout: *timeout, Progress: stderr}
	if *config != "" {
		cfg, err := cluster.LoadConfig(*config)
		if err != nil {
			fmt.Fprintf(stderr, "kvserver: %v\n", err)
			return 2
		}
		if o.Map, err = cfg.Map(); err != nil {
			fmt.Fprintf(stderr, "kvserver: %v\n", err)
			return 2
		}
		// A group's own replicas first, then every other control port
		// (a process running several replicas, --id 1,4, serves them
		// all on its first replica's).
		for g := range cfg.Groups {
			var cs []string
			for _, r := range cfg.Groups[g].Replicas {
				cs = append(cs, r.Control)
			}
			for h := range cfg.Groups {
				if h != g {
					for _, r := range cfg.Groups[h].Replicas {
						cs = append(cs, r.Control)
					}
				}
			}
			o.Controls = append(o.Controls, cs)
		}
		o.Secret, o.Client = cfg.SecretBytes, []client.Option{client.WithConfigFile(*config)}
	} else {
		m, err := cluster.Load(*mapFile)
		if err != nil {
			fmt.Fprintf(stderr, "kvserver backup: %v (is the embedded cluster running? give its --map)\n", err)
			return 2
		}
		o.Map, o.Client = m, []client.Option{client.WithMapFile(*mapFile)}
		for range m.Groups {
			o.Controls = append(o.Controls, []string{*control})
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	man, err := server.Backup(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver backup: %v\n", err)
		return 1
	}
	for _, g := range man.Groups {
		fmt.Fprintf(stdout, "group %d: index %d, %d bytes from node %d, check word %s: %s\n", g.Group, g.Index, g.Bytes, g.Node, g.Check, filepath.Join(*out, g.File))
	}
	fmt.Fprintf(stdout, "backup %s of cluster %q: %s\n", man.Backup, man.Cluster, filepath.Join(*out, server.ManifestName))
	return 0
}

const restoreUsage = `usage: kvserver restore --config FILE --from DIR [--force]
       kvserver restore --from DIR [--data-dir D] [--clients N] [--force]

Offline (every replica stopped): writes the backup in DIR into the data
directory of every replica of the cluster, as its group's only snapshot,
with no stable state and no log: started again, the replicas form a new
cluster whose data is the backup's cut (writes after the backup are not
in it). It checks everything first and writes nothing if a check fails:
the backup must be of a cluster of the same shape (groups, replicas per
group, hash slots), every file must pass its checks, the durability must
be sync or async (a replica in memory mode starts from nothing), and
each data directory must be empty or absent (--force moves a non-empty
one aside to <dir>.before-restore-<time>).

Without --config it restores an embedded cluster's data dir (kvserver
--data-dir; default as kvserver's for the backup's cluster name), whose
shape is the backup's; --clients must be what that kvserver runs with.

`

func runRestore(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, restoreUsage)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "the cluster config (TOML)")
	from := fs.String("from", "", "the backup directory (kvserver backup --out)")
	force := fs.Bool("force", false, "move non-empty data directories aside instead of refusing")
	dataDir := fs.String("data-dir", "", "an embedded cluster: its data dir (default $XDG_STATE_HOME/rdmakv/<name>, else ~/.local/state/rdmakv/<name>)")
	clients := fs.Int("clients", 32, "an embedded cluster: its --clients")
	durability := fs.String("durability", "sync", "an embedded cluster: its --durability (sync or async)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *from == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "kvserver restore: give --from DIR (see kvserver restore --help)")
		return 2
	}
	o := server.RestoreOptions{From: *from, Force: *force, Out: stdout}
	if *config != "" {
		cfg, err := cluster.LoadConfig(*config)
		if err != nil {
			fmt.Fprintf(stderr, "kvserver: %v\n", err)
			return 2
		}
		o.Config = cfg
	} else {
		b, err := os.ReadFile(filepath.Join(*from, server.ManifestName))
		var man server.Manifest
		if err == nil {
			err = json.Unmarshal(b, &man)
		}
		if err != nil || len(man.Members) == 0 {
			fmt.Fprintf(stderr, "kvserver restore: %s is not a backup directory (%v)\n", *from, err)
			return 1
		}
		if o.Mode, err = server.ParseDurability(*durability); err != nil {
			fmt.Fprintf(stderr, "kvserver restore: --%v\n", err)
			return 2
		}
		o.Map = embeddedMap(man.Cluster, "/dev/shm", len(man.Members), len(man.Members[0]), *clients)
		if o.DataDir = *dataDir; o.DataDir == "" {
			if o.DataDir, err = defaultDataDir(man.Cluster); err != nil {
				fmt.Fprintf(stderr, "kvserver restore: %v (give --data-dir)\n", err)
				return 2
			}
		}
	}
	if err := server.Restore(o); err != nil {
		fmt.Fprintf(stderr, "kvserver restore: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "restored: start the replicas (they elect and serve the backup's data)")
	return 0
}
