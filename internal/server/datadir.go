package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/rdma"
)

// clusterIdentity is what an embedded cluster's data directory records
// of the cluster it holds, so that a directory of another shape is never
// used.
type clusterIdentity struct {
	Cluster string          `json:"cluster"`
	Fabric  string          `json:"fabric"`
	Groups  [][]rdma.NodeID `json:"groups"`
}

func (c clusterIdentity) shape() string {
	n := 0
	if len(c.Groups) > 0 {
		n = len(c.Groups[0])
	}
	return fmt.Sprintf("cluster %q (%d groups x %d replicas, %s)", c.Cluster, len(c.Groups), n, c.Fabric)
}

// UseDataDir makes pc (a process hosting every replica of pc.Map: the
// embedded cluster) keep its replicas' state in dir: each replica's stable
// state, log and snapshots in dir/replica-<id>. It takes dir's lock for
// the process's life (unlock releases it), records the cluster's shape
// in dir/identity.json and refuses a directory that holds another
// cluster's (another name, number of groups or replicas). It sets
// pc.Prepare (a replica with stable state restarts as the member it was)
// and pc.ReplicaDir; pc.Durable says what the replicas keep besides the
// stable state. In a durable mode each replica writes a log of its own
// (dir/replica-<id>/wal), or all write one shared log, dir/wal
// (pc.SharedLog): the one the data dir holds, and for a new data dir the
// one pc.WALLayout names (per-replica unless it says shared).
func UseDataDir(pc *ProcessConfig, dir string) (_ func(), err error) {
	m := pc.Map
	if m == nil {
		return nil, errors.New("server: no cluster map")
	}
	if pc.WALLayout != "" {
		if err := cluster.CheckWALLayout(pc.WALLayout); err != nil {
			return nil, fmt.Errorf("wal layout %v", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	unlock, err := lockClusterDir(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	want := clusterIdentity{Cluster: m.Name, Fabric: m.Fabric, Groups: m.Groups}
	path := filepath.Join(dir, "identity.json")
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		b, _ := json.MarshalIndent(want, "", "  ")
		if err := writeFileSync(path, append(b, '\n')); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("data dir: %w", err)
	default:
		var got clusterIdentity
		if err := json.Unmarshal(b, &got); err != nil {
			return nil, fmt.Errorf("data dir %s: %s is not an rdmakv identity file (%v): give another --data-dir", dir, path, err)
		}
		if !reflect.DeepEqual(got, want) {
			return nil, fmt.Errorf("data dir %s holds the data of %s, not of %s: give another --data-dir (or the flags it was started with), or remove the directory if that data is not wanted",
				dir, got.shape(), want.shape())
		}
	}
	ran := false
	var ownLogs []string // replicas' logs of their own that hold files
	for _, ms := range m.Groups {
		for _, id := range ms {
			rd := replicaDir(dir, id)
			if err := os.MkdirAll(rd, 0o700); err != nil {
				return nil, fmt.Errorf("data dir: %w", err)
			}
			if _, err := os.Stat(filepath.Join(rd, "stable")); err == nil {
				ran = true
			}
			if n, err := dirEntries(vfs.OS, filepath.Join(rd, "wal")); err != nil {
				return nil, fmt.Errorf("data dir: %w", err)
			} else if n > 0 {
				ownLogs = append(ownLogs, filepath.Join(rd, "wal"))
			}
		}
	}
	// The log layout is the data dir's, chosen at its first durable
	// start and kept: a shared log (SharedLog) that holds files is used,
	// replicas' logs of their own are used, and a new data dir gets the
	// layout pc.WALLayout names (per-replica if none). Nothing on disk is
	// ever ignored: asked for the other layout, the dir keeps its own
	// and the log says so.
	shared := filepath.Join(dir, "wal")
	n, err := dirEntries(vfs.OS, shared)
	switch {
	case err != nil:
		return nil, fmt.Errorf("data dir: %w", err)
	case len(ownLogs) > 0 && n > 0:
		return nil, fmt.Errorf("data dir %s holds both the process's shared log (%s) and logs of single replicas (%s...): one of them is stale; move the data dir aside and restore a backup, or remove what is not wanted", dir, shared, ownLogs[0])
	case n > 0:
		pc.SharedLog = shared
	case len(ownLogs) == 0 && pc.WALLayout == cluster.WALShared:
		pc.SharedLog = shared
	default:
		pc.SharedLog = ""
	}
	if kept := keptLayout(pc.SharedLog != ""); pc.WALLayout != "" && !pc.WALLayoutDefault && pc.WALLayout != kept && pc.Durable.Mode != broadcast.Memory && pc.Log != nil {
		pc.Log.Warn(fmt.Sprintf("data dir %s keeps its %s log layout (%s): wal layout %s applies to new data dirs only", dir, kept, layoutWhere(dir, kept), pc.WALLayout))
	}
	rejoinInc := uint64(time.Now().UnixNano())
	pc.ReplicaDir = func(id rdma.NodeID) string { return replicaDir(dir, id) }
	pc.Prepare = func(node rdma.Node, g, _ int, bc *broadcast.Config) (broadcast.Stable, error) {
		st := broadcast.FileStable{Path: filepath.Join(replicaDir(dir, node.ID()), "stable")}
		_, err := os.Stat(st.Path)
		switch {
		case err == nil:
			bc.Start = broadcast.StartExisting
		case ran:
			// The cluster ran before and this replica lost its state
			// (or never saved it): it rejoins as a new incarnation, or
			// it could vote twice in an epoch.
			bc.Start, bc.RejoinIncarnation = broadcast.StartRejoin, rejoinInc
		default:
			bc.Start = broadcast.StartNew
		}
		return st, nil
	}
	return unlock, nil
}

// keptLayout names a data dir's log layout: cluster.WALShared if its
// replicas write one shared log, else cluster.WALPerReplica.
func keptLayout(shared bool) string {
	if shared {
		return cluster.WALShared
	}
	return cluster.WALPerReplica
}

// layoutWhere is where a data dir's logs of a layout are.
func layoutWhere(dir, layout string) string {
	if layout == cluster.WALShared {
		return "one log in " + filepath.Join(dir, "wal")
	}
	return "a log per replica in " + filepath.Join(dir, "replica-<id>", "wal")
}

func replicaDir(dir string, id rdma.NodeID) string {
	return filepath.Join(dir, fmt.Sprintf("replica-%d", id))
}

// lockClusterDir takes an embedded cluster's data directory's lock
// (dir/lock) for the process's life.
func lockClusterDir(dir string) (func(), error) {
	unlock, holder, err := flockDir(dir)
	if err == nil && unlock == nil {
		err = fmt.Errorf("data dir %s is in use by process %s: stop it first, or give another --data-dir", dir, holder)
	}
	return unlock, err
}

// writeFileSync writes path through a synced temporary file and renames
// it into place.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// checkNoLog refuses to run a replica in memory mode over a data
// directory that holds a log: the log would go stale, and a later start
// in a durable mode would replay it as if it were current.
func checkNoLog(dir string, id int64) error {
	if _, err := os.Stat(filepath.Join(dir, "wal")); err == nil {
		return fmt.Errorf("replica %d: durability is memory but %s holds a log (it ran with durability sync or async): set durability back, or remove %s and %s to run it in memory mode",
			id, dir, filepath.Join(dir, "wal"), filepath.Join(dir, "snap"))
	}
	return nil
}
