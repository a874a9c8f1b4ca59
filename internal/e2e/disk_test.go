package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

const (
	// helperReplica runs one replica like kvserver --config C --id N
	// (the same server.RunReplicas, the same start and failure lines) on
	// a file system that fails as faultsEnv says.
	helperReplica = "replica"
	// faultsEnv is the errorfs spec: "KIND:ERRNO:ARMFILE": operations of
	// KIND (sync, or write: writes and preallocations) on the replica's
	// write-ahead log fail with ERRNO (EIO, ENOSPC) once ARMFILE exists.
	faultsEnv = "RDMAKV_E2E_ERRORFS"
	// replicaArgsEnv holds the replica's kvserver arguments, separated by
	// \x1f.
	replicaArgsEnv = "RDMAKV_E2E_REPLICA_ARGS"
)

// armedFaults is the injector faultsEnv describes.
type armedFaults struct {
	kinds []errorfs.OpKind
	err   error
	arm   string
	armed atomic.Bool
	last  atomic.Int64 // when arm was last looked for (unix ns)
}

func parseFaults(spec string) (*armedFaults, error) {
	f := strings.SplitN(spec, ":", 3)
	if len(f) != 3 {
		return nil, fmt.Errorf("errorfs spec %q: want KIND:ERRNO:ARMFILE", spec)
	}
	a := &armedFaults{arm: f[2]}
	switch f[0] {
	case "sync":
		a.kinds = []errorfs.OpKind{errorfs.OpSync}
	case "write":
		a.kinds = []errorfs.OpKind{errorfs.OpWrite, errorfs.OpAllocate}
	default:
		return nil, fmt.Errorf("errorfs spec %q: kind %q", spec, f[0])
	}
	switch f[1] {
	case "EIO":
		a.err = syscall.EIO
	case "ENOSPC":
		a.err = syscall.ENOSPC
	default:
		return nil, fmt.Errorf("errorfs spec %q: errno %q", spec, f[1])
	}
	return a, nil
}

func (a *armedFaults) MaybeError(op errorfs.Op) error {
	hit := false
	for _, k := range a.kinds {
		hit = hit || op.Kind == k
	}
	if !hit || !strings.Contains(op.Path, string(filepath.Separator)+"wal") {
		return nil
	}
	if !a.armed.Load() {
		now := time.Now().UnixNano()
		if now-a.last.Load() < int64(2*time.Millisecond) {
			return nil
		}
		a.last.Store(now)
		if _, err := os.Stat(a.arm); err != nil {
			return nil
		}
		a.armed.Store(true)
	}
	return a.err
}

// runFaultyReplica is the replica helper: kvserver's replica command
// (cmd/kvserver/replica.go) reduced to --config and --id, with the file
// system wrapped by errorfs.
func runFaultyReplica() int {
	args := strings.Split(os.Getenv(replicaArgsEnv), "\x1f")
	var path string
	var id int64
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--config":
			path = args[i+1]
		case "--id":
			id, _ = strconv.ParseInt(args[i+1], 10, 64)
		}
	}
	inj, err := parseFaults(os.Getenv(faultsEnv))
	if err != nil || path == "" || id == 0 {
		fmt.Fprintf(os.Stderr, "kvserver: replica helper: %v (args %q)\n", err, args)
		return 2
	}
	cfg, err := cluster.LoadConfig(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	what := fmt.Sprintf("replica %d", id)
	err = server.Run(ctx, cfg, id, server.Options{FS: errorfs.Wrap(vfs.OS, inj),
		Ready: func(c string) {
			if c != "" {
				c = ", control http://" + c
			}
			fmt.Fprintf(os.Stdout, "kvserver: %s of cluster %q runs (pid %d%s)\n", what, cfg.Name, os.Getpid(), c)
		}}, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %s: %v\n", what, err)
		return 1
	}
	return 0
}

// TestDiskErrorsInProcess (issue 19 D5): disk faults injected into a real
// replica process (the test binary re-executed as the replica helper: the
// server code kvserver runs, on an errorfs file system armed by a file
// the test creates), 1 group x 3 on shm, durability sync, under puts:
//
//   - eio: fsync of one follower's log fails with EIO. That process
//     exits 1 with one line naming the replica, its data dir and the
//     error (fail-stop: never retry an fsync), and the group goes on
//     with the other two: puts succeed.
//   - enospc: every write of one follower's log finds the disk full. That
//     replica stops the same way (exit 1, one line naming "disk full"),
//     the group goes on; once space returns (started again, unarmed) it
//     reads back what its disk holds (nothing corrupt: it starts, and
//     logs its recovery), catches up, and holds exactly the group's
//     records; every acknowledged put reads back.
func TestDiskErrorsInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 replica processes")
	}
	for _, tc := range []struct{ name, kind, errno, want string }{
		{"eio", "sync", "EIO", "input/output error"},
		{"enospc", "write", "ENOSPC", "disk full"},
	} {
		t.Run(tc.name, func(t *testing.T) { diskErrors(t, tc.kind, tc.errno, tc.want) })
	}
}

func diskErrors(t *testing.T, kind, errno, want string) {
	s := loopbackSpec(t, "disk", "shm", 1)
	s.Durability = "sync"
	c := newCluster(t, s)
	arm := filepath.Join(c.dir, "arm")
	victim := int64(2)
	c.faults = map[int64]string{victim: kind + ":" + errno + ":" + arm}
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	if l := c.leader(0, 10*time.Second); l == victim {
		// the test wants a follower's disk to fail: make another lead
		c.term(victim)
		c.start(victim)
		c.waitReady(30*time.Second, c.allIDs()...)
	}
	cl := c.openClient(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	acked := map[string]string{}
	put := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			k, v := fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("v-%s-%d", prefix, i)
			pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := cl.Put(pctx, []byte(k), []byte(v))
			pcancel()
			if err != nil {
				t.Fatalf("put %s: %v%s", k, err, c.describe())
			}
			acked[k] = v
		}
	}
	put("before", 200)
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.logf("armed: %s of replica %d's log fail with %s", kind, victim, errno)
	p := c.proc(victim)
	// Puts go on while the victim fails; it must exit, not hang.
	deadline := time.Now().Add(40 * time.Second)
	n := 0
	for !p.exited() {
		if time.Now().After(deadline) {
			t.Fatalf("replica %d still runs 40 s after its disk failed (%d puts since)%s", victim, n, c.describe())
		}
		put(fmt.Sprintf("during-%d", n), 10)
		n++
	}
	if code := p.exitCode(); code != 1 {
		t.Errorf("replica %d exited %d, want 1", victim, code)
	}
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	last := lines[len(lines)-1]
	dir := c.cfg.ReplicaDir(victim)
	c.logf("replica %d's last line: %s", victim, last)
	for _, w := range []string{fmt.Sprintf("kvserver: replica %d: ", victim), fmt.Sprintf("replica %d (group 0) stopped on a disk error", victim), dir, want} {
		if !strings.Contains(last, w) {
			t.Errorf("replica %d's last line %q lacks %q", victim, last, w)
		}
	}
	// The group goes on with the other two.
	put("after", 200)

	// Space returns (the helper starts unarmed): the replica reads its
	// disk back and catches up.
	if err := os.Remove(arm); err != nil {
		t.Fatal(err)
	}
	q := c.start(victim)
	c.waitReady(30*time.Second, c.allIDs()...)
	if !q.logged("recovered ") {
		t.Errorf("replica %d logged no recovery line: %s", victim, tail(q.stderr.String(), 2<<10))
	}
	put("restarted", 50)
	c.waitConverged(30 * time.Second)
	// Every acknowledged put reads back, from the restarted replica's
	// memory too (a stale-ok get of the nearest replica: the victim).
	near, err := client.Open(ctx, client.WithConfigFile(c.path), client.WithSlot(1), client.WithNearReplica(int(victim-1)), client.WithConsistency(client.StaleOK))
	if err != nil {
		t.Fatal(err)
	}
	defer near.Close()
	bad, fromVictim := 0, 0
	for k, v := range acked {
		got, err := cl.Get(ctx, []byte(k))
		if err != nil || string(got) != v {
			if bad++; bad <= 5 {
				t.Errorf("get %s: %q, %v; want %q", k, got, err, v)
			}
		}
		it, err := near.GetItem(ctx, []byte(k), client.StaleOK)
		if err != nil || string(it.Value) != v {
			if bad++; bad <= 5 {
				t.Errorf("stale-ok get %s from replica %d: %q, %v; want %q", k, it.Replica, it.Value, err, v)
			}
		}
		if int64(it.Replica) == victim {
			fromVictim++
		}
	}
	if fromVictim == 0 {
		t.Errorf("no stale-ok get read replica %d", victim)
	}
	c.logf("%d acknowledged puts read back (linearizable, and stale-ok: %d from replica %d); %d wrong", len(acked), fromVictim, victim, bad)
}
