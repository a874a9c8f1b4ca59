package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/internal/syncbuf"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
	"github.com/rdmakv/rdmakv/rdma"
)

// startDurable starts every replica of m in sync mode with its state in
// dir (UseDataDir), small log segments and snapshots every 64 KiB of log,
// and a control port; it waits until every group serves.
func startDurable(t *testing.T, m *cluster.Map, dir string) (*server.Process, func()) {
	t.Helper()
	return startDurableMode(t, m, dir, broadcast.Sync, nil)
}

// startDurableMode is startDurable in mode, logging to log (nil: none).
func startDurableMode(t *testing.T, m *cluster.Map, dir string, mode broadcast.Durability, log *slog.Logger) (*server.Process, func()) {
	t.Helper()
	return startProcess(t, m, dir, func(pc *server.ProcessConfig) {
		pc.Durable.Mode, pc.Log = mode, log
	})
}

// startProcess starts every replica of m with a control port, small log
// segments and snapshots every 64 KiB of log, its state in dir (none if
// dir is ""), and adjust applied to its config (nil: none); it waits
// until every group serves.
func startProcess(t *testing.T, m *cluster.Map, dir string, adjust func(*server.ProcessConfig)) (*server.Process, func()) {
	t.Helper()
	return startProcessWith(t, m, dir, adjust, nil)
}

// startProcessWith is startProcess with afterDir applied to the config
// once the data dir set it up (server.UseDataDir: Prepare, the stable
// state; nil: nothing).
func startProcessWith(t *testing.T, m *cluster.Map, dir string, adjust, afterDir func(*server.ProcessConfig)) (*server.Process, func()) {
	t.Helper()
	cln, err := server.ListenControl("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc := server.ProcessConfig{Map: m, Control: cln,
		Broadcast: broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond},
		Durable:   server.DurableConfig{Mode: broadcast.Sync, SegmentBytes: 64 << 10, SnapshotLogBytes: 64 << 10}}
	if adjust != nil {
		adjust(&pc)
	}
	unlock := func() {}
	if dir != "" {
		if unlock, err = server.UseDataDir(&pc, dir); err != nil {
			cln.Close()
			t.Fatal(err)
		}
	}
	if afterDir != nil {
		afterDir(&pc)
	}
	p, err := server.StartProcess(pc)
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.WaitServing(ctx); err != nil {
		p.Close()
		unlock()
		t.Fatal(err)
	}
	return p, func() { p.Close(); unlock() }
}

func openClient(t *testing.T, p *server.Process, m *cluster.Map) *client.Client {
	t.Helper()
	cn, err := p.ClientNode(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Open(ctx, client.WithMap(m), client.WithNode(cn), client.WithSlot(0), client.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestProcessDurableRestart: a Process in sync mode writes each replica's
// log and disk snapshots under its data dir, shows them in /status and
// /metrics, and a new Process on the same dir (every replica restarted at
// once) reads every acknowledged put back. A data dir whose snapshot is
// corrupt while its log was cut below it is refused in one line naming
// the file, and the refusal says what to do.
func TestProcessDurableRestart(t *testing.T) {
	dir := t.TempDir()
	// A new data dir gets one shared log with WALLayout shared, and
	// keeps it at the restarts below (asked for it or not).
	m := &cluster.Map{Name: "durable", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	val := strings.Repeat("x", 1000)
	const n = 300
	p, stop := startProcess(t, m, dir, func(pc *server.ProcessConfig) { pc.WALLayout = cluster.WALShared })
	c := openClient(t, p, m)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte(val)); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	c.Close()
	// The leader's status: its log and a snapshot (the log grew past
	// 64 KiB several times). The copy for /status is at most 50ms old,
	// so the snapshot it names may have been replaced (and removed) since:
	// its size is then unknown (0) until the next copy.
	var st server.ReplicaStatus
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = p.Replicas()[0].Status()
		if st.Disk != nil && st.Disk.Snapshot != "" && st.Disk.SnapshotBytes > 0 && st.Disk.WALBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot in the status after 30s: %+v", st.Disk)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.Durability != "sync" || st.Durable.Count == 0 && st.Durable.Epoch == 0 || st.Disk.Fsyncs == 0 || !strings.HasPrefix(st.Disk.Snapshot, filepath.Join(dir, "replica-1", "snap")) || st.Disk.SnapshotBytes <= 0 {
		t.Errorf("status: durability %q durable %v disk %+v", st.Durability, st.Durable, st.Disk)
	}
	resp, err := http.Get("http://" + p.ControlAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`rdmakv_durability{group="0",mode="sync",node="1"} 1`, "rdmakv_wal_fsync_seconds_bucket{", "rdmakv_wal_bytes_total{",
		"rdmakv_wal_segments{", "rdmakv_wal_unsynced_bytes{", "rdmakv_snapshot_age_seconds{", "rdmakv_snapshot_bytes{", "rdmakv_recovery_seconds{"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	stop()

	p, stop = startDurable(t, m, dir)
	c = openClient(t, p, m)
	for i := range n {
		v, err := c.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != val {
			t.Fatalf("after the restart k%d: %d bytes, %v", i, len(v), err)
		}
	}
	c.Close()
	if r := p.Replicas()[1].Status(); r.Disk.SharedLog != filepath.Join(dir, "wal") {
		t.Errorf("replica 2's status: shared log %q, want %s", r.Disk.SharedLog, filepath.Join(dir, "wal"))
	}
	if r := p.Replicas()[1].Status(); !strings.HasPrefix(r.Disk.Recovery, "recovered snapshot index ") {
		t.Errorf("recovery line %q: want one from a snapshot", r.Disk.Recovery)
	}
	stop()

	// Corrupt replica 2's snapshots: its log no longer starts at 1.
	snaps, _ := filepath.Glob(filepath.Join(dir, "replica-2", "snap", "*.snap"))
	if len(snaps) == 0 {
		t.Fatal("replica 2 has no snapshot file")
	}
	for _, s := range snaps {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(s, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// (The replicas write one shared log, dir/wal: the process's start
	// reads replica 2's stream of it.)
	if _, err := os.Stat(filepath.Join(dir, "wal")); err != nil {
		t.Fatalf("no shared log: %v", err)
	}
	// Asked for a log per replica, the data dir keeps its shared log,
	// and the log says so.
	var logged strings.Builder
	pc := server.ProcessConfig{Map: m, Durable: server.DurableConfig{Mode: broadcast.Sync}, WALLayout: cluster.WALPerReplica,
		Log: slog.New(slog.NewTextHandler(&logged, nil))}
	unlock, err := server.UseDataDir(&pc, dir)
	if err != nil {
		t.Fatal(err)
	}
	if pc.SharedLog != filepath.Join(dir, "wal") || !strings.Contains(logged.String(), "keeps its shared log layout (one log in "+filepath.Join(dir, "wal")+"): wal layout per-replica applies to new data dirs only") {
		t.Errorf("a shared-log data dir asked for per-replica logs: shared log %q, log %q", pc.SharedLog, logged.String())
	}
	pc.Log = nil
	if p, err = server.StartProcess(pc); err == nil {
		p.Close()
	}
	unlock()
	if err == nil || !strings.Contains(err.Error(), "no valid snapshot in "+filepath.Join(dir, "replica-2", "snap")) ||
		!strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "--rejoin") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("corrupt snapshot, log cut below it: %v", err)
	}
}

// TestOpenDurableAfterMemory: a replica that ran in memory mode (stable
// state, no log) and is restarted in sync mode must not come back as a
// voter with an empty log (it acknowledged entries it has nowhere): it
// boots catching up. In memory mode OpenDurable touches nothing.
func TestOpenDurableAfterMemory(t *testing.T) {
	dir := t.TempDir()
	if d, err := server.OpenDurable(vfs.OS, dir, 1, 0, server.DurableConfig{}, func() {}); d != nil || err != nil {
		t.Fatalf("memory mode: %v, %v", d, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("memory mode wrote %d files", len(ents))
	}
	if err := (&broadcast.FileStable{Path: filepath.Join(dir, "stable")}).Save(broadcast.StableState{Incarnation: 3, ENew: 7}); err != nil {
		t.Fatal(err)
	}
	d, err := server.OpenDurable(vfs.OS, dir, 1, 0, server.DurableConfig{Mode: broadcast.Sync}, func() {})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Recovery.Repair || !strings.Contains(d.Summary, "ran in memory mode") {
		t.Errorf("after memory mode: repair %v, summary %q", d.Recovery.Repair, d.Summary)
	}
}

// TestProcessDiskFailStop: an fsync of replica 2's log fails (EIO): that
// replica stops (fail-stop, never a retried fsync), Process.Failed names
// it and the error, and its group goes on with the other two.
func TestProcessDiskFailStop(t *testing.T) {
	dir := t.TempDir()
	m := &cluster.Map{Name: "failstop", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) { diskFailStop(t, m, filepath.Join(dir, fmt.Sprint(shared)), shared) })
	}
}

// diskFailStop is TestProcessDiskFailStop with a log per replica (an
// fsync of replica 2's fails) or the process's shared log (an fsync of
// it fails: every replica stops at once, the process reports one).
func diskFailStop(t *testing.T, m *cluster.Map, dir string, shared bool) {
	var armed atomic.Bool
	bad := filepath.Join(dir, "replica-2", "wal")
	if shared {
		bad = filepath.Join(dir, "wal")
	}
	pc := server.ProcessConfig{Map: m,
		Broadcast: broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 50 * time.Millisecond},
		Durable:   server.DurableConfig{Mode: broadcast.Sync, SegmentBytes: 64 << 10},
		FS: errorfs.Wrap(vfs.OS, errorfs.Func(func(op errorfs.Op) error {
			if armed.Load() && op.Kind == errorfs.OpSync && strings.HasPrefix(op.Path, bad) {
				return syscall.EIO
			}
			return nil
		}))}
	unlock, err := server.UseDataDir(&pc, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if pc.SharedLog != "" {
		t.Fatalf("a new data dir without WALLayout shared got the shared log %s", pc.SharedLog)
	}
	if shared {
		pc.SharedLog = filepath.Join(dir, "wal")
	}
	p, err := server.StartProcess(pc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	c := openClient(t, p, m)
	defer c.Close()
	armed.Store(true)
	if shared {
		// Every replica stops at the first failed fsync: the put may
		// fail (fail-stop), and the process reports it.
		put, cancel := context.WithTimeout(ctx, 5*time.Second)
		c.Put(put, []byte("k"), []byte("v"))
		cancel()
		select {
		case err := <-p.Failed():
			if !strings.Contains(err.Error(), "stopped on a disk error in "+bad) || !strings.Contains(err.Error(), "input/output error") {
				t.Errorf("Failed: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("no fail-stop reported; replica 2: %+v", p.Replicas()[1].Status().DiskError)
		}
		for k, r := range p.Replicas() {
			deadline := time.Now().Add(time.Minute)
			for r.Status().DiskError == "" && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if r.Status().DiskError == "" {
				t.Errorf("replica %d's status shows no disk error", k+1)
			}
		}
		return
	}
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	select {
	case err := <-p.Failed():
		if !strings.Contains(err.Error(), "replica 2 (group 0) stopped on a disk error") || !strings.Contains(err.Error(), "input/output error") {
			t.Errorf("Failed: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("no fail-stop reported; replica 2: %+v", p.Replicas()[1].Status().DiskError)
	}
	if st := p.Replicas()[1].Status(); st.DiskError == "" {
		t.Errorf("replica 2's status shows no disk error")
	}
	for i := range 20 {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "after%d", i), []byte("v")); err != nil {
			t.Fatalf("the group does not go on: put after%d: %v", i, err)
		}
	}
}

// TestBroadcastCountersJSON: every broadcast counter appears in /status
// under its snake_case name and reads back (the mirror is the same struct:
// a new counter needs no edit here).
func TestBroadcastCountersJSON(t *testing.T) {
	c := server.BroadcastCounters(broadcast.Counters{SnapshotFetchesFailed: 3, ForcedVotes: 2, Elected: 1})
	b, err := json.Marshal(server.ReplicaStatus{Counters: c})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"snapshot_fetches_failed":3`, `"forced_votes":2`, `"elected":1`, `"elections_started":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back server.ReplicaStatus
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Counters != c {
		t.Errorf("read back %+v, want %+v", back.Counters, c)
	}
}

// TestRunMemoryRefusesLog: a replica run in memory mode on a data dir
// that holds a log (it ran with durability sync) is refused in one line:
// the log would go stale, and replayed after a later switch back to sync
// it would bring the replica back as a voter with old data.
func TestRunMemoryRefusesLog(t *testing.T) {
	dir := t.TempDir()
	shm := filepath.Join(dir, "shm")
	if err := os.Mkdir(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.ParseConfig(fmt.Appendf(nil, "name = \"mem\"\nfabric = \"shm\"\nshm_dir = %q\ndata_dir = %q\n[[group]]\n[[group.replica]]\nid = 1\n[[clients]]\ncount = 1\n", shm, filepath.Join(dir, "data")), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.ReplicaDir(1), "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // without the check it runs until then
	defer cancel()
	err = server.Run(ctx, cfg, 1, server.Options{Control: "-"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "durability is memory but "+cfg.ReplicaDir(1)+" holds a log") {
		t.Fatalf("memory mode on a data dir with a log: %v", err)
	}
}

// TestProcessAsyncRestart: a Process in async mode starts (it was refused
// before async reached the server), keeps every acknowledged put across a
// clean stop of every replica (Stop flushes and syncs the queued log), and
// the restart is a recovery election (every member comes back from its
// disk): its winner logs the recovery line with the count of entries lost
// (0 after a clean stop), and /status and /metrics show seen_index,
// recovery_lost and rdmakv_recovery_lost_entries_total.
func TestProcessAsyncRestart(t *testing.T) {
	dir := t.TempDir()
	m := &cluster.Map{Name: "async", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	const n = 500
	p, stop := startDurableMode(t, m, dir, broadcast.Async, nil)
	c := openClient(t, p, m)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	c.Close()
	if st := p.Replicas()[0].Status(); st.Durability != "async" {
		t.Errorf("status durability %q, want async", st.Durability)
	}
	stop()

	var logs syncbuf.Buffer
	p, stop = startDurableMode(t, m, dir, broadcast.Async, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	c = openClient(t, p, m)
	for i := range n {
		v, err := c.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("after a clean stop and restart k%d = %q, %v: a clean stop must lose nothing in async mode", i, v, err)
		}
	}
	c.Close()
	// The recovery election's winner reports once its epoch commits
	// (before it serves); the status copy is at most 50ms old.
	var won *server.ReplicaStatus
	deadline := time.Now().Add(30 * time.Second)
	for won == nil {
		for _, r := range p.Replicas() {
			if st := r.Status(); st.RecoveryElections > 0 {
				won = &st
			}
		}
		if won == nil && time.Now().After(deadline) {
			t.Fatalf("no replica reports a recovery election after the restart of the whole group")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if won.RecoveryLost != 0 || won.SeenIndex < n {
		t.Errorf("winner's status: recovery_lost %d (want 0 after a clean stop), seen_index %d (want >= %d)", won.RecoveryLost, won.SeenIndex, n)
	}
	want := "group 0 recovered at index "
	if l := logs.String(); !strings.Contains(l, want) || !strings.Contains(l, ": 0 entries acknowledged before the outage were not found on the disks of a majority (async mode, fsync_interval 10ms)") {
		t.Errorf("log lacks the recovery line:\n%s", l)
	}
	resp, err := http.Get("http://" + p.ControlAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, w := range []string{fmt.Sprintf(`rdmakv_recovery_lost_entries_total{group="0",node="%d"} 0`, won.Node), `rdmakv_durability{group="0",mode="async",node="1"} 1`} {
		if !strings.Contains(string(b), w) {
			t.Errorf("/metrics lacks %s", w)
		}
	}
	resp, err = http.Get("http://" + p.ControlAddr() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, w := range []string{`"seen_index":`, `"recovery_lost":`} {
		if !strings.Contains(string(b), w) {
			t.Errorf("/status lacks %s", w)
		}
	}
}

// TestStableSavesOffPoller: a replica whose stable state is a file (a
// data directory, in memory and sync modes) saves it off its polling
// goroutine: after the groups elected, the only save its poller ran is
// the boot's, and the saves of the election's votes and accepts are in
// its broadcast counters (stable_saves, with their time) instead.
func TestStableSavesOffPoller(t *testing.T) {
	for _, mode := range []broadcast.Durability{broadcast.Memory, broadcast.Sync} {
		t.Run(mode.String(), func(t *testing.T) {
			m := &cluster.Map{Name: "stable", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
			if err := m.Fill(); err != nil {
				t.Fatal(err)
			}
			p, stop := startDurableMode(t, m, t.TempDir(), mode, nil)
			defer stop()
			// (The status copy may be up to 50 ms old: wait for it.)
			var async uint64
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				async = 0
				for _, r := range p.Replicas() {
					async += r.Status().Counters.StableSaves
				}
				if async >= 2 || time.Now().After(deadline) {
					break
				}
			}
			if async < 2 {
				t.Errorf("%d stable saves off the poller in all: an election saves a vote or an accept on a majority", async)
			}
			for _, r := range p.Replicas() {
				if n := server.PollStableSaves(r); n != 1 {
					t.Errorf("replica %d: %d stable saves on its poller, want only the boot's", r.Node, n)
				}
				if c := r.Status().Counters; c.StableSaves > 0 && c.StableSaveNanos == 0 {
					t.Errorf("replica %d: %d saves off the poller and no time counted", r.Node, c.StableSaves)
				}
			}
		})
	}
}

// TestCloseHeldSaves: a process stopped while a disk snapshot's save is
// held (its fsync never goes through: a replica of each group has its
// saves held) and its other replicas wait for the SaveGate stops
// without waiting for it: Close returns, no replica
// started a capture once it began ("queued:"), the held save was
// abandoned with an INFO line naming it and left no snap/tmp- file, and
// a restart from the data dir reads every acknowledged put (sync) back
// from the logs. (The planted bugs of the stop are broadcast's:
// TestCloseAbandonsHeldSave, TestSaveGateClosed.)
func TestCloseHeldSaves(t *testing.T) {
	dir := t.TempDir()
	m := &cluster.Map{Name: "heldsaves", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}}, ClientNodes: []rdma.NodeID{100}}
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	var hold *server.SaveHold
	p, stop := startProcess(t, m, dir, func(pc *server.ProcessConfig) {
		pc.WALLayout = cluster.WALShared
		pc.Log = slog.New(slog.NewTextHandler(&logs, nil))
		hold = server.HoldSaves(pc, 1, 4) // one replica a group: the other two commit on without it
	})
	c := openClient(t, p, m)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	val := strings.Repeat("v", 1000)
	const n = 400 // ~200 KB of log a group: past SnapshotLogBytes (64 KiB) in every replica
	for i := range n {
		if _, err := c.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte(val)); err != nil {
			t.Fatalf("put k%d: %v", i, err)
		}
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Minute)
	for hold.Refused() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no disk snapshot save held 5 minutes after the writes")
		}
		time.Sleep(time.Millisecond)
	}
	taken := server.SaveGateTaken(p)
	done := make(chan struct{})
	go func() {
		stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Minute): // liveness only: the hold is never released
		t.Fatal("close: the process did not stop while a save was held")
	}
	if got := server.SaveGateTaken(p); got != taken {
		t.Errorf("queued: %d captures started once the stop began", got-taken)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "replica-*", "snap", "tmp-*")); len(tmp) > 0 {
		t.Errorf("tmp: the stop left %q", tmp)
	}
	if !strings.Contains(logs.String(), "disk snapshot abandoned at the stop") || !strings.Contains(logs.String(), ".snap") {
		t.Errorf("logged: no INFO line names the abandoned save:\n%s", logs.String())
	}

	p, stop = startDurable(t, m, dir)
	defer stop()
	c = openClient(t, p, m)
	defer c.Close()
	for i := range n {
		v, err := c.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != val {
			t.Fatalf("after the restart k%d: %d bytes, %v", i, len(v), err)
		}
	}
}
