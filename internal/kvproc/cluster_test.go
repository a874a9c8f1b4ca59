package kvproc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/childproc"
	"github.com/rdmakv/rdmakv/internal/kvproc"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// TestMain plays a replica process when spawned as one (kvproc.Spawn).
func TestMain(m *testing.M) {
	childproc.ServeIfChild()
	os.Exit(m.Run())
}

// raceEnabled reports whether the binary was built with the race detector.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// replica is one replica's process and config.
type replica struct {
	cfg kvproc.Config
	p   *kvproc.Proc // nil while down
}

// kvCluster is a cluster of replica processes on shm: groups of 3, in a
// directory of /dev/shm of its own, with stable files in a test temp dir.
type kvCluster struct {
	t      *testing.T
	t0     time.Time
	m      *cluster.Map
	dir    string // the shm directory
	reps   [][]*replica
	tuning kvproc.Tuning

	mu     sync.Mutex
	events int      // role-change lines
	log    []string // the first role changes, for failure messages
}

var clusterSeq atomic.Int64

// newCluster starts groups x 3 replica processes (and registers their
// killing, whatever happens) and waits until every group has a leader.
// The map has clients client slots.
func newCluster(t *testing.T, ctx context.Context, groups, clients int, tu kvproc.Tuning) *kvCluster {
	t.Helper()
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	dir, err := shm.MkdirOwned("/dev/shm", "kvproc-test-")
	if err != nil {
		t.Fatal(err)
	}
	c := &kvCluster{t: t, t0: time.Now(), dir: dir, tuning: tu}
	t.Cleanup(func() { // whatever happened: no process outlives the test
		for _, rs := range c.reps {
			for _, r := range rs {
				if r.p != nil {
					r.p.Kill() // also a stopped one
				}
			}
		}
		os.RemoveAll(dir)
	})
	m := &cluster.Map{Name: fmt.Sprintf("kvproc-%d-%d", os.Getpid(), clusterSeq.Add(1)), Fabric: "shm", ShmDir: dir,
		Limits: cluster.Limits{MaxKey: 64, MaxValue: 1024}}
	id := rdma.NodeID(1)
	for range groups {
		m.Groups = append(m.Groups, []rdma.NodeID{id, id + 1, id + 2})
		id += 3
	}
	for k := range clients {
		m.ClientNodes = append(m.ClientNodes, rdma.NodeID(100+k))
	}
	// Fill once here: client.Open fills the map it is given, and the
	// clients share this one.
	if err := m.Fill(); err != nil {
		t.Fatal(err)
	}
	c.m = m
	stable := t.TempDir()
	var all []*replica
	for g := range groups {
		var rs []*replica
		for i := range 3 {
			r := &replica{cfg: kvproc.Config{Map: *m, Group: g, Replica: i, Inc: 1,
				StablePath: filepath.Join(stable, fmt.Sprintf("g%d-r%d.stable", g, i)), Start: broadcast.StartNew,
				Spin: -1, PeerTimeout: 500 * time.Millisecond, Tuning: tu}}
			rs = append(rs, r)
			all = append(all, r)
		}
		c.reps = append(c.reps, rs)
	}
	c.spawnAll(all)
	for g := range groups {
		c.leader(ctx, g)
	}
	return c
}

func (c *kvCluster) since() time.Duration { return time.Since(c.t0).Round(time.Millisecond) }

func (c *kvCluster) onEvent(s *kvproc.Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	if len(c.log) < 200 {
		c.log = append(c.log, fmt.Sprintf("+%v g%d r%d inc %d (node %d): leading %v epoch %v catching-up %v snapshots %d delivered %d applied %d",
			c.since(), s.Group, s.Replica, s.Inc, c.m.Groups[s.Group][s.Replica], s.Leading, s.Epoch, s.CatchingUp, s.SnapshotsRestored, s.Delivered, s.Applied))
	}
}

func (c *kvCluster) spawn(cfg kvproc.Config) (*kvproc.Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Stderr = os.Stderr
	// Killed with the test binary, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return kvproc.Spawn(cmd, cfg, c.onEvent, 60*time.Second)
}

// spawnAll starts the given replicas in parallel.
func (c *kvCluster) spawnAll(rs []*replica) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() { r.p, errs[i] = c.spawn(r.cfg) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			c.t.Fatalf("spawn group %d replica %d: %v", rs[i].cfg.Group, rs[i].cfg.Replica, err)
		}
	}
}

// status asks a live replica for its status (nil if down or silent).
func (c *kvCluster) status(r *replica) *kvproc.Status {
	if r.p == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.p.Status(ctx)
	if err != nil {
		return nil
	}
	return &s
}

// leader waits until a live replica of group g leads a committed epoch
// and returns it (the highest epoch's, if a deposed one still says so).
func (c *kvCluster) leader(ctx context.Context, g int) int {
	c.t.Helper()
	for {
		best, be := -1, broadcast.Epoch(0)
		for i, r := range c.reps[g] {
			if s := c.status(r); s != nil && s.Leading && s.Epoch > be {
				best, be = i, s.Epoch
			}
		}
		if best >= 0 {
			return best
		}
		if ctx.Err() != nil {
			c.t.Fatalf("+%v: group %d has no leader: %v%s", c.since(), g, ctx.Err(), c.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// describe lists every replica's status for a failure message.
func (c *kvCluster) describe() string {
	var b strings.Builder
	for g, rs := range c.reps {
		for i, r := range rs {
			if s := c.status(r); s == nil {
				fmt.Fprintf(&b, "\n\tgroup %d replica %d: down or silent", g, i)
			} else {
				fmt.Fprintf(&b, "\n\tgroup %d replica %d inc %d pid %d: leading %v epoch %v delivered %d applied %d records %d catching-up %v snapshots %d anomalies %d/%d/%d",
					g, i, s.Inc, s.Pid, s.Leading, s.Epoch, s.Delivered, s.Applied, s.Records, s.CatchingUp, s.SnapshotsRestored, s.Dups, s.Gaps, s.Stale)
			}
		}
	}
	c.mu.Lock()
	if n := len(c.log); n > 0 {
		fmt.Fprintf(&b, "\n\trole changes (%d lines, the first %d):\n\t\t%s", c.events, n, strings.Join(c.log, "\n\t\t"))
	}
	c.mu.Unlock()
	return b.String()
}

// waitCaughtUp waits until replica r delivered at least target and is not
// catching up.
func (c *kvCluster) waitCaughtUp(ctx context.Context, r *replica, target uint64, what string) *kvproc.Status {
	c.t.Helper()
	for {
		s := c.status(r)
		if s != nil && s.Delivered >= target && !s.CatchingUp {
			return s
		}
		if ctx.Err() != nil {
			c.t.Fatalf("+%v: %s: group %d replica %d did not catch up to %d: %+v%s", c.since(), what, r.cfg.Group, r.cfg.Replica, target, s, c.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// converge waits until every replica of each group delivered and applied
// as much as the group's most advanced one, and returns their statuses.
func (c *kvCluster) converge(ctx context.Context) [][]kvproc.Status {
	c.t.Helper()
	for {
		var final [][]kvproc.Status
		done := true
		for _, rs := range c.reps {
			var ss []kvproc.Status
			var most, applied uint64
			for _, r := range rs {
				s := c.status(r)
				if s == nil {
					c.t.Fatalf("group %d replica %d not answering%s", r.cfg.Group, r.cfg.Replica, c.describe())
				}
				ss = append(ss, *s)
				most, applied = max(most, s.Delivered), max(applied, s.Applied)
			}
			for _, s := range ss {
				if s.Delivered != most || s.Applied != applied || s.CatchingUp {
					done = false
				}
			}
			final = append(final, ss)
		}
		if done {
			return final
		}
		if ctx.Err() != nil {
			c.t.Fatalf("replicas did not converge: %v%s", ctx.Err(), c.describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closeAll ends every replica process cleanly (each closes its replica and
// its node, removing its shm files) and reports exit errors.
func (c *kvCluster) closeAll() {
	c.t.Helper()
	var wg sync.WaitGroup
	for _, rs := range c.reps {
		for _, r := range rs {
			if r.p == nil {
				continue
			}
			wg.Go(func() {
				if err := r.p.Close(20 * time.Second); err != nil {
					c.t.Errorf("group %d replica %d: exit: %v", r.cfg.Group, r.cfg.Replica, err)
				}
			})
		}
	}
	wg.Wait()
	for _, rs := range c.reps {
		for _, r := range rs {
			r.p = nil
		}
	}
}

// checkNoFiles fails the test if any file but the directory's owner file
// is left in the shm directory.
func (c *kvCluster) checkNoFiles() {
	c.t.Helper()
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		if e.Name() != "rdmakv.owner" {
			left = append(left, e.Name())
		}
	}
	if len(left) > 0 {
		c.t.Errorf("shm files left in %s after every process and client closed: %v", c.dir, left)
	}
}

// openClient opens a client on slot k with its own shm node (client.Open
// opens it from the map).
func (c *kvCluster) openClient(ctx context.Context, k int, opts ...client.Option) (*client.Client, error) {
	return client.Open(ctx, append([]client.Option{client.WithMap(c.m), client.WithSlot(k)}, opts...)...)
}
