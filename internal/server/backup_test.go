package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/backupcheck"
	"github.com/rdmakv/rdmakv/internal/freeport"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

// startBackupProcess starts every replica of m in mode with its state in
// dir, snapshots every MiB of log, and plant applied to its config.
func startBackupProcess(t *testing.T, m *cluster.Map, dir string, mode broadcast.Durability, plant func(*server.ProcessConfig)) (*server.Process, func()) {
	t.Helper()
	return startProcess(t, m, dir, func(pc *server.ProcessConfig) {
		pc.Durable.Mode, pc.Durable.SnapshotLogBytes = mode, 1<<20
		if plant != nil {
			plant(pc)
		}
	})
}

// backupUnderLoad loads the cluster of p with batches spanning both
// groups, takes a backup into out in the middle, and returns the
// recorder, the manifest and the backup's error.
func backupUnderLoad(t *testing.T, p *server.Process, m *cluster.Map, out string) (*backupcheck.Recorder, *server.Manifest, error) {
	return backupUnderLoad2(t, p, m, out, "", nil)
}

// backupUnderLoad2 also takes a second backup into second, at the same
// time as the first (its manifest in *secondMan).
func backupUnderLoad2(t *testing.T, p *server.Process, m *cluster.Map, out, second string, secondMan *server.Manifest) (*backupcheck.Recorder, *server.Manifest, error) {
	t.Helper()
	c := openClient(t, p, m)
	defer c.Close()
	rec := backupcheck.NewRecorder()
	lctx, stopLoad := context.WithCancel(context.Background())
	loaded := make(chan struct{})
	go func() { backupcheck.Load(lctx, c, m, rec, 4, 16); close(loaded) }()
	for rec.Batches() < 200 {
		time.Sleep(5 * time.Millisecond)
	}
	cn, err := p.ClientNode(1)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := p.ControlAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A second backup at the same time (its own marker and files), if
	// asked: its own cut, as consistent.
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		if second == "" {
			return
		}
		cn2, err := p.ClientNode(2)
		if err != nil {
			t.Error(err)
			return
		}
		man2, err := server.Backup(ctx, server.BackupOptions{Map: m, Controls: [][]string{{ctrl}, {ctrl}}, Out: second,
			Client: []client.Option{client.WithMap(m), client.WithNode(cn2), client.WithSlot(2), client.WithTimeout(30 * time.Second)}})
		if err != nil {
			t.Errorf("a second backup at the same time: %v", err)
			return
		}
		*secondMan = *man2
	}()
	man, berr := server.Backup(ctx, server.BackupOptions{Map: m, Controls: [][]string{{ctrl}, {ctrl}}, Out: out,
		Client: []client.Option{client.WithMap(m), client.WithNode(cn), client.WithSlot(1), client.WithTimeout(30 * time.Second)}})
	<-done2
	n := rec.Batches()
	for rec.Batches() < n+200 {
		time.Sleep(5 * time.Millisecond)
	}
	stopLoad()
	<-loaded
	return rec, man, berr
}

// checkRestored restores the backup in from into a new data dir, starts
// a cluster on it and checks its state against rec.
func checkRestored(t *testing.T, m *cluster.Map, from string, man *server.Manifest, rec *backupcheck.Recorder) error {
	return checkRestoredMode(t, m, from, man, rec, broadcast.Sync)
}

// checkRestoredMode is checkRestored into a cluster of durability mode.
func checkRestoredMode(t *testing.T, m *cluster.Map, from string, man *server.Manifest, rec *backupcheck.Recorder, mode broadcast.Durability) error {
	t.Helper()
	cut := map[int]uint64{}
	for _, g := range man.Groups {
		cut[g.Group] = g.Index
	}
	if err := rec.CheckCut(cut); err != nil {
		return err
	}
	dir := filepath.Join(t.TempDir(), "restored")
	if err := server.Restore(server.RestoreOptions{Map: m, DataDir: dir, Mode: mode, From: from}); err != nil {
		t.Fatalf("restore: %v", err)
	}
	p, stop := startBackupProcess(t, m, dir, mode, nil)
	defer stop()
	c := openClient(t, p, m)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := rec.CheckState(cut, backupcheck.ClientRead(ctx, c)); err != nil {
		return err
	}
	// The restored cluster takes writes, with versions above the cut's.
	k := []byte("after-restore")
	res, err := c.Put(ctx, k, []byte("x"))
	if err != nil {
		t.Fatalf("put after the restore: %v", err)
	}
	if g := int(m.GroupOf(k)); res.Version>>16 <= cut[g] {
		t.Fatalf("a put after the restore got version %d, at or below the cut's index %d", res.Version, cut[g])
	}
	return nil
}

func backupMap(t *testing.T, name string) *cluster.Map {
	m := &cluster.Map{Name: name, Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100, 101, 102}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestBackupCut: a backup taken under a load of batches spanning both
// groups has a consistent cut (no batch on both sides of it) and files
// holding exactly the state at the cut: a cluster restored from it holds,
// for every key written, the last acknowledged write at or below its
// group's index (value and version), and nothing after. The backup
// leaves no file on the replicas' side. Planted: one group's replicas
// capture later than the marker (backupKnobs.lateGroup): the restored
// state check fails.
func TestBackupCut(t *testing.T) {
	for _, planted := range []bool{false, true} {
		name := "ok"
		if planted {
			name = "late-capture"
		}
		t.Run(name, func(t *testing.T) {
			m := backupMap(t, "bk"+name)
			data := filepath.Join(t.TempDir(), "data")
			var plant func(*server.ProcessConfig)
			if planted {
				plant = func(pc *server.ProcessConfig) { server.SetBackupLateGroup(pc, 1) }
			}
			p, stop := startBackupProcess(t, m, data, broadcast.Sync, plant)
			out, out2 := filepath.Join(t.TempDir(), "backup"), ""
			var man2 server.Manifest
			if !planted {
				out2 = filepath.Join(t.TempDir(), "backup2")
			}
			rec, man, err := backupUnderLoad2(t, p, m, out, out2, &man2)
			stop()
			if err != nil {
				t.Fatalf("backup: %v", err)
			}
			// A replica that applied the marker after the DELETE
			// removes its file when its write ends (backups.finish).
			var left []string
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if left, _ = filepath.Glob(filepath.Join(data, "replica-*", "backup-*")); len(left) == 0 || time.Now().After(deadline) {
					break
				}
			}
			if len(left) > 0 {
				t.Errorf("backup files left on the replicas' side 30 s after the backup: %v", left)
			}
			if ents, _ := os.ReadDir(out); len(ents) != 3 {
				t.Errorf("the backup dir holds %d files, want 2 group files and the manifest", len(ents))
			}
			if out2 != "" {
				if len(man2.Groups) != 2 || man2.Backup == man.Backup {
					t.Fatalf("second backup %+v after %+v", man2, man)
				}
				// (restored into an async cluster)
				if err := checkRestoredMode(t, m, out2, &man2, rec, broadcast.Async); err != nil {
					t.Fatalf("the second backup: %v", err)
				}
			}
			err = checkRestored(t, m, out, man, rec)
			switch {
			case !planted && err != nil:
				t.Fatal(err)
			case planted && !errors.Is(err, backupcheck.ErrState):
				t.Fatalf("planted late capture: the check says %v, want %v", err, backupcheck.ErrState)
			case planted:
				t.Logf("planted late capture caught: %v", err)
			}
		})
	}
}

// TestRestoreRejoins: a replica of a restored cluster that starts after
// the others elected rejoins (kvserver's startMode: no stable state, and
// a member shows the group ran) and drops the restored snapshot from its
// memory; it must get its group's state from the leader all the same.
// Here the last replica of each group starts rejoining, and every key
// read from it (stale-ok, served by it) holds the state at the backup's
// cut. Planted: the restored snapshots have the header (0,0)
// (restoreKnobs.zeroHeader): the rejoined member, as far along by its
// header as the restored ones, gets a diff and no snapshot and serves an
// empty table: ErrState. (Under load such a member was then elected, and
// the group's whole state was gone: TestBackupRestoreProcesses.)
func TestRestoreRejoins(t *testing.T) {
	for _, planted := range []bool{false, true} {
		name := "ok"
		if planted {
			name = "zero-header"
		}
		t.Run(name, func(t *testing.T) {
			m := backupMap(t, "bkrj"+name)
			p, stop := startBackupProcess(t, m, filepath.Join(t.TempDir(), "data"), broadcast.Sync, nil)
			c := openClient(t, p, m)
			rec := backupcheck.NewRecorder()
			lctx, stopLoad := context.WithCancel(context.Background())
			loaded := make(chan struct{})
			go func() { backupcheck.Load(lctx, c, m, rec, 2, 16); close(loaded) }()
			for rec.Batches() < 50 {
				time.Sleep(5 * time.Millisecond)
			}
			stopLoad()
			<-loaded
			c.Close()
			cn, err := p.ClientNode(1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out := filepath.Join(t.TempDir(), "backup")
			man, err := server.Backup(ctx, server.BackupOptions{Map: m, Controls: [][]string{{p.ControlAddr()}, {p.ControlAddr()}}, Out: out,
				Client: []client.Option{client.WithMap(m), client.WithNode(cn), client.WithSlot(1), client.WithTimeout(30 * time.Second)}})
			stop()
			if err != nil {
				t.Fatalf("backup: %v", err)
			}
			cut := map[int]uint64{}
			for _, g := range man.Groups {
				cut[g.Group] = g.Index
			}
			dir := filepath.Join(t.TempDir(), "restored")
			ro := server.RestoreOptions{Map: m, DataDir: dir, Mode: broadcast.Sync, From: out}
			if planted {
				server.SetRestoreZeroHeader(&ro)
			}
			if err := server.Restore(ro); err != nil {
				t.Fatalf("restore: %v", err)
			}
			late := map[rdma.NodeID]bool{}
			for _, g := range m.Groups {
				late[g[2]] = true
			}
			p, stop = startProcessPrepared(t, m, dir, func(node rdma.Node, bc *broadcast.Config) {
				if late[node.ID()] {
					bc.Start, bc.RejoinIncarnation = broadcast.StartRejoin, uint64(time.Now().UnixNano())
				}
			})
			defer stop()
			cn, err = p.ClientNode(0)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := client.Open(ctx, client.WithMap(m), client.WithNode(cn), client.WithSlot(0), client.WithTimeout(30*time.Second),
				client.WithNearReplica(2), client.WithConsistency(client.StaleOK))
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			// Each key read from the rejoined member (until it caught
			// up, a stale-ok get reads another: read again).
			read := backupcheck.ReplicaRead(ctx, sc, late)
			err = rec.CheckState(cut, read)
			switch {
			case !planted && err != nil:
				t.Fatalf("the rejoined members: %v", err)
			case planted && !errors.Is(err, backupcheck.ErrState):
				t.Fatalf("planted zero header: the check says %v, want %v", err, backupcheck.ErrState)
			case planted:
				t.Logf("planted zero header caught: %v", err)
			}
		})
	}
}

// startProcessPrepared is startProcess in sync mode on data dir dir,
// with prepare applied to each replica's broadcast config after the data
// dir's Prepare chose how it starts.
func startProcessPrepared(t *testing.T, m *cluster.Map, dir string, prepare func(rdma.Node, *broadcast.Config)) (*server.Process, func()) {
	t.Helper()
	return startProcessWith(t, m, dir, func(pc *server.ProcessConfig) { pc.Durable.SnapshotLogBytes = 1 << 20 },
		func(pc *server.ProcessConfig) {
			base := pc.Prepare
			pc.Prepare = func(node rdma.Node, g, i int, bc *broadcast.Config) (broadcast.Stable, error) {
				st, err := base(node, g, i, bc)
				if err == nil {
					prepare(node, bc)
				}
				return st, err
			}
		})
}

// TestRestoreRefuses: restore refuses, in one line and writing nothing,
// a non-empty data dir (without --force), a cluster of another shape, a
// corrupt group file, and a config in memory mode; --force moves the
// data dir aside.
func TestRestoreRefuses(t *testing.T) {
	m := backupMap(t, "bkref")
	// Memory mode without data dirs: the replicas write their files in
	// a temporary directory of the process, removed when it stops.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	p, stop := startBackupProcess(t, m, "", broadcast.Memory, nil)
	// The load's single-group writes make the groups' indices differ,
	// but not always (CI once saw both at 178): another backup under
	// more load then, a few times at most.
	var out string
	var man *server.Manifest
	for try := 0; ; try++ {
		out = filepath.Join(t.TempDir(), "backup")
		var err error
		if _, man, err = backupUnderLoad(t, p, m, out); err != nil {
			stop()
			t.Fatalf("backup of a memory-mode cluster: %v", err)
		}
		if len(man.Groups) != 2 || man.Groups[0].Index != man.Groups[1].Index || try == 4 {
			break
		}
	}
	stop()
	if len(man.Groups) != 2 || man.Groups[0].Index == man.Groups[1].Index {
		t.Fatalf("manifest: %+v (the load's single-group writes should make the indices differ)", man)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("the process left %d entries in TMPDIR", len(ents))
	}
	base := t.TempDir()
	try := func(name string, o server.RestoreOptions, want string) {
		t.Helper()
		if o.Map == nil {
			o.Map = m
		}
		o.From = out
		err := server.Restore(o)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q", name, err, want)
		}
	}
	full := filepath.Join(base, "full")
	os.MkdirAll(filepath.Join(full, "replica-1"), 0o700)
	os.WriteFile(filepath.Join(full, "replica-1", "stable"), []byte("x"), 0o600)
	try("non-empty", server.RestoreOptions{DataDir: full, Mode: broadcast.Sync}, "is not empty")
	other := &cluster.Map{Name: "x", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	try("shape", server.RestoreOptions{Map: other, DataDir: filepath.Join(base, "shape"), Mode: broadcast.Sync}, "restore into a cluster of the same shape")
	try("memory", server.RestoreOptions{DataDir: filepath.Join(base, "mem"), Mode: broadcast.Memory}, "durability is memory")
	f := filepath.Join(out, "group-1.snap")
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 0x40
	os.WriteFile(f, b, 0o600)
	try("corrupt", server.RestoreOptions{DataDir: filepath.Join(base, "corrupt"), Mode: broadcast.Sync}, "group-1.snap: broadcast: snapshot file corrupt")
	b[len(b)/2] ^= 0x40
	os.WriteFile(f, b, 0o600)
	for _, d := range []string{"shape", "mem", "corrupt"} {
		if _, err := os.Stat(filepath.Join(base, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused restore wrote %s", d)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(full, "replica-1")); len(ents) != 1 {
		t.Errorf("a refused restore changed %s", full)
	}
	if err := server.Restore(server.RestoreOptions{Map: m, DataDir: full, Mode: broadcast.Sync, From: out, Force: true}); err != nil {
		t.Fatalf("--force: %v", err)
	}
	aside, _ := filepath.Glob(filepath.Join(full, "replica-1.before-restore-*", "stable"))
	if len(aside) != 1 {
		t.Errorf("--force did not move replica-1 aside")
	}
}

// TestBackupFailureLeavesNothing: a backup whose files cannot be fetched
// (no control port that serves them) fails within its timeout, leaves no
// backup dir, and the replicas' files (which no DELETE reached) are
// removed when the marker expires.
func TestBackupFailureLeavesNothing(t *testing.T) {
	m := backupMap(t, "bkfail")
	data := filepath.Join(t.TempDir(), "data")
	p, stop := startBackupProcess(t, m, data, broadcast.Sync, nil)
	defer stop()
	cn, err := p.ClientNode(1)
	if err != nil {
		t.Fatal(err)
	}
	dead := freeport.Addr(t)
	out := filepath.Join(t.TempDir(), "backup")
	seen := make(chan bool, 1)
	watch, unwatch := context.WithCancel(context.Background())
	go func() {
		saw := false
		for watch.Err() == nil && !saw {
			left, _ := filepath.Glob(filepath.Join(data, "replica-*", "backup-*.snap"))
			saw = len(left) > 0
			time.Sleep(10 * time.Millisecond)
		}
		seen <- saw
	}()
	_, err = server.Backup(context.Background(), server.BackupOptions{Map: m, Controls: [][]string{{dead}, {dead}}, Out: out, Timeout: 3 * time.Second,
		Client: []client.Option{client.WithMap(m), client.WithNode(cn), client.WithSlot(1), client.WithTimeout(30 * time.Second)}})
	if err == nil || !strings.Contains(err.Error(), "no replica served its backup file") {
		t.Fatalf("backup with no control port serving: %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed backup left %s", out)
	}
	unwatch()
	if !<-seen {
		t.Fatal("the replicas wrote no backup file (nothing for the expiry to remove)")
	}
	// The six replicas wrote their files; they go at the expiry.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(data, "replica-*", "backup-*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica-side files still there a minute after the expiry: %v", left)
		}
	}
}
