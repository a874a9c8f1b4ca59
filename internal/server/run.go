package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// Options are a replica process's settings beyond its config.
type Options struct {
	// Listen overrides the replica's addr as the address it binds (tcp),
	// e.g. "0.0.0.0:7001" behind address translation.
	Listen string
	// Control overrides the replica's control address ("" keeps the
	// config's; "-" disables the control port).
	Control string
	// Pprof serves /debug/pprof/ on the control port.
	Pprof bool
	// Rejoin starts a replica that has no stable state as a new
	// incarnation catching up from its group (a lost disk), even if no
	// other member can be reached to tell that the group ran before.
	Rejoin bool
	// Ready, if set, is called once the replica runs, with the control
	// port's address ("" if none).
	Ready func(control string)
	// FS is the file system of the durable state (nil: vfs.OS). Tests
	// running a replica in a child process inject disk faults with it
	// (internal/e2e TestDiskErrorsInProcess); kvserver has no such flag.
	FS vfs.FS
	// BalancerStuckAfter and BalancerBeforeStep, if set (tests), are the
	// tablet balancer's StuckAfter and BeforeStep (BalanceConfig).
	BalancerStuckAfter time.Duration
	BalancerBeforeStep func(step string)
	// SpareP is ProcessConfig.SpareP (kvserver sets it: it raises the
	// process's GOMAXPROCS).
	SpareP bool

	// dropBalanceLoad (a planted bug, tests only): the replicas' balancer
	// gets the config's interval but not its balance_min_writes and
	// balance_split_keys (the defaults run instead).
	dropBalanceLoad bool
}

// identity is what a replica's data directory records of the cluster it
// belongs to, so that a directory of another cluster is never used.
type identity struct {
	Cluster string        `json:"cluster"`
	Fabric  string        `json:"fabric"`
	Node    rdma.NodeID   `json:"node"`
	Group   int           `json:"group"`
	Members []rdma.NodeID `json:"members"`
}

// Run runs replica id of cfg until ctx ends, then stops it cleanly. Its
// errors are one line saying what is wrong and what to do.
func Run(ctx context.Context, cfg *cluster.Config, id int64, opts Options, log *slog.Logger) error {
	return RunReplicas(ctx, cfg, []int64{id}, opts, log)
}

// RunReplicas runs replicas ids of cfg (of any groups) in this process,
// on one node runtime (Process), until ctx ends, then stops them cleanly.
// Each keeps its own data directory (locked, with its identity); the
// control port is the first replica's (or opts.Control) and shows them
// all. Its errors are one line saying what is wrong and what to do.
func RunReplicas(ctx context.Context, cfg *cluster.Config, ids []int64, opts Options, log *slog.Logger) error {
	if len(ids) == 0 {
		return errors.New("no replica to run")
	}
	m, err := cfg.Map()
	if err != nil {
		return err
	}
	if len(ids) > 1 && opts.Listen != "" {
		return fmt.Errorf("--listen gives one replica's address: run replicas %v one per process to override their addresses", ids)
	}
	type hostedReplica struct {
		dir    string
		log    *slog.Logger
		stable broadcast.FileStable
		ident  identity
	}
	reps := map[rdma.NodeID]*hostedReplica{}
	var nodes []rdma.NodeID
	caddr := ""
	for k, id := range ids {
		g, _, entry, err := cfg.Replica(id)
		if err != nil {
			return err
		}
		self := rdma.NodeID(id)
		if reps[self] != nil {
			return fmt.Errorf("replica %d given twice", id)
		}
		dir := cfg.ReplicaDir(id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		unlock, err := lockDir(dir, id)
		if err != nil {
			return err
		}
		defer unlock()
		if k == 0 {
			caddr = entry.Control
		}
		reps[self] = &hostedReplica{dir: dir, log: log.With("node", self, "group", g),
			stable: broadcast.FileStable{Path: filepath.Join(dir, "stable")},
			ident:  identity{Cluster: m.Name, Fabric: m.Fabric, Node: self, Group: g, Members: m.Groups[g]}}
		nodes = append(nodes, self)
	}
	if opts.Control != "" {
		caddr = opts.Control
	}
	if caddr == "-" {
		caddr = ""
	}
	var cln net.Listener
	if caddr != "" {
		if cln, err = ListenControl(caddr); err != nil {
			return err
		}
		defer func() {
			if cln != nil {
				cln.Close()
			}
		}()
	}
	dc, err := DurableFor(cfg)
	if err != nil {
		return err
	}
	for _, id := range nodes {
		if err := checkIdentity(reps[id].dir, reps[id].ident); err != nil {
			return err
		}
		if dc.Mode == broadcast.Memory {
			if err := checkNoLog(reps[id].dir, int64(id)); err != nil {
				return err
			}
		}
	}

	spec := fabric.ForMap(m)
	spec.Listen, spec.Secret, spec.PeerTimeout = opts.Listen, cfg.SecretBytes, time.Duration(cfg.Timing.PeerTimeout)
	proc, err := StartProcess(ProcessConfig{Map: m, IDs: nodes, Spec: &spec, SpareP: opts.SpareP,
		Broadcast: broadcast.Config{RejoinIncarnation: uint64(time.Now().UnixNano()),
			HeartbeatInterval: time.Duration(cfg.Timing.Heartbeat), ElectionTimeout: time.Duration(cfg.Timing.ElectionTimeout)},
		Prepare: func(node rdma.Node, g, _ int, bc *broadcast.Config) (broadcast.Stable, error) {
			r := reps[node.ID()]
			start, why, err := startMode(node, m, g, r.stable, opts.Rejoin, r.log)
			if err != nil {
				return nil, err
			}
			r.log.Info("replica starting", "cluster", m.Name, "fabric", m.Fabric, "start", start.String(), "why", why, "data_dir", r.dir)
			bc.Start = start
			return r.stable, nil
		},
		Durable: dc, ReplicaDir: func(id rdma.NodeID) string { return reps[id].dir }, FS: opts.FS,
		Control: cln, Pprof: opts.Pprof, Secret: cfg.SecretBytes, Commands: true, Log: log,
		Balance: balanceConfig(cfg, opts)})
	cln = nil // StartProcess closes it
	if err != nil {
		if errors.Is(err, broadcast.ErrCorrupt) {
			dir := cfg.DataDir
			if len(nodes) == 1 {
				dir = reps[nodes[0]].dir
			}
			return fmt.Errorf("the stable state in %s is corrupt (%v): if the disk lost it, move the file away and start with --rejoin", dir, err)
		}
		return err
	}
	defer proc.Close()
	if caddr = proc.ControlAddr(); caddr != "" {
		log.Info("control port", "addr", caddr)
	}
	if opts.Ready != nil {
		opts.Ready(caddr)
	}
	select {
	case <-ctx.Done():
	case err := <-proc.Failed():
		return err
	}
	log.Info("stopping")
	return nil
}

// balanceConfig is the balancer's configuration from cfg's [ordered]
// section and opts.
func balanceConfig(cfg *cluster.Config, opts Options) BalanceConfig {
	bc := BalanceConfig{Interval: cfg.BalanceInterval(), MinWrites: cfg.BalanceMinWrites(), SplitKeys: cfg.BalanceSplitKeys(),
		StuckAfter: opts.BalancerStuckAfter, Secret: cfg.SecretBytes, BeforeStep: opts.BalancerBeforeStep}
	if opts.dropBalanceLoad {
		bc.MinWrites, bc.SplitKeys = 0, 0 // planted
	}
	return bc
}

// DurableFor is the durability a cluster config asks for.
func DurableFor(cfg *cluster.Config) (DurableConfig, error) {
	mode := cfg.Durability
	if mode == "" {
		mode = cluster.DurabilityMemory
	}
	m, err := ParseDurability(mode)
	if err != nil {
		return DurableConfig{}, err
	}
	return DurableConfig{Mode: m, FsyncInterval: time.Duration(cfg.FsyncInterval), SnapshotLogBytes: cfg.Snapshot.LogBytesN}, nil
}

// flockDir takes dir/lock for the process's life and writes the
// process id into it; if another process holds it, it returns that
// process's id (as the file says) and ok false.
func flockDir(dir string) (unlock func(), holder string, err error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if holder = strings.TrimSpace(string(b)); holder == "" {
			holder = "unknown"
		}
		return nil, holder, nil
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { f.Close() }, "", nil
}

// lockDir takes a replica's data directory's lock for this process's life.
func lockDir(dir string, id int64) (func(), error) {
	unlock, holder, err := flockDir(dir)
	if err == nil && unlock == nil {
		err = fmt.Errorf("replica %d already runs (process %s holds %s)", id, holder, filepath.Join(dir, "lock"))
	}
	return unlock, err
}

// checkIdentity records the replica's identity in a fresh data directory
// and refuses one that holds another cluster's or replica's state.
func checkIdentity(dir string, want identity) error {
	path := filepath.Join(dir, "identity.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b, _ := json.MarshalIndent(want, "", "  ")
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		return os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	var got identity
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("data dir %s: %s is not an rdmakv identity file (%v): is data_dir right?", dir, path, err)
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("data dir %s holds the state of node %d of group %d %v of cluster %q (%s), not of node %d of group %d %v of cluster %q (%s): point data_dir elsewhere, or remove the directory if that cluster is gone",
			dir, got.Node, got.Group, got.Members, got.Cluster, got.Fabric, want.Node, want.Group, want.Members, want.Cluster, want.Fabric)
	}
	return nil
}

// startMode decides how the replica starts. With stable state it restarts
// as the member it was (StartExisting: it catches up from its group).
// Without, it is a new member (StartNew) only if no other member it can
// reach has run: a member whose promise word or serving epoch is set
// proves the group ran, and then this replica lost its state (or never
// started while the group ran) and must rejoin as a new incarnation that
// learns the epochs it may have promised (StartRejoin), or it could vote
// twice in an epoch. opts.Rejoin forces that when no member answers.
func startMode(node rdma.Node, m *cluster.Map, g int, st broadcast.FileStable, rejoin bool, log *slog.Logger) (broadcast.StartMode, string, error) {
	// Probe every other member: one that refuses our secret stops us
	// (whatever our state: a replica that cannot talk to its group would
	// only wait), and one whose header shows the group ran tells a
	// replica without state to rejoin.
	ran := ""
	for _, peer := range m.Groups[g] {
		if peer == node.ID() {
			continue
		}
		h, err := readHeader(node, peer, uint32(g))
		if err != nil {
			if errors.Is(err, tcp.ErrAuth) {
				return 0, "", fmt.Errorf("member %d refused our cluster secret: the secret differs from its (check secret_file on both hosts)", peer)
			}
			log.Debug("probe member", "member", peer, "err", err)
			continue
		}
		if ran == "" && (h.Promise != 0 || h.Serving != 0) {
			ran = fmt.Sprintf("member %d shows the group ran (epoch %v)", peer, broadcast.Epoch(max(h.Promise, h.Serving)))
		}
	}
	if _, err := os.Stat(st.Path); err == nil {
		if _, err := st.Load(); err != nil {
			return 0, "", fmt.Errorf("the stable state %s is unreadable (%v): if the disk lost it, move the file away and start with --rejoin", st.Path, err)
		}
		return broadcast.StartExisting, "stable state found: restarting as the same member", nil
	}
	if rejoin {
		return broadcast.StartRejoin, "no stable state, --rejoin given", nil
	}
	if ran != "" {
		return broadcast.StartRejoin, "no stable state, and " + ran + ": rejoining as a new incarnation", nil
	}
	return broadcast.StartNew, "no stable state and no member of the group has run: a new member", nil
}

// readHeader reads member peer's kv table header one-sided.
func readHeader(node rdma.Node, peer rdma.NodeID, g uint32) (kv.Header, error) {
	conn, err := node.Connect(peer)
	if err != nil {
		return kv.Header{}, err
	}
	defer conn.Close()
	return kv.ReadHeader(conn, g, time.Second)
}
