package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/kvproc"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// The embedded cluster runs in a child process: kvycsb re-executed as a
// replica child (server.SpawnChild, the hidden argument clusterCmd naming
// it in ps), which init hands (serveChild: childproc.Serve) to
// server.ServeChild: every replica of the map in one server.Process on
// shm, until its stdin closes.
//
// Not in kvycsb's own process: each replica's driver parks in futex(2)
// system calls, and with several of them parked the Go runtime has no P
// left for kvycsb's other goroutines until sysmon takes one back (up to
// 10 ms later). Measured with 2 CPUs: go-ycsb's redis binding loading
// 100k records at 8 threads did about 900 ops/s beside an in-process
// cluster against 24k ops/s without one, and rdmakv's own writes waited
// the same way.
const clusterCmd = "_cluster"

func init() { serveChild() }

// childCluster is a running embedded cluster and this process's node of
// client slot 0 (kvycsb's one client).
type childCluster struct {
	m    *cluster.Map
	cmd  *exec.Cmd
	ch   *server.Child
	node rdma.Node
}

// startChildCluster starts the cluster of ec in a child process and opens
// the client slot's shm node.
func startChildCluster(ctx context.Context, ec embeddedConfig, stderr io.Writer) (*childCluster, error) {
	m := embeddedMap(ec.groups, ec.replicas, ec.shmDir)
	if err := m.Fill(); err != nil {
		return nil, err
	}
	if removed, err := shm.SweepStale(m.ShmDir); err == nil && len(removed) > 0 {
		fmt.Fprintf(stderr, "kvycsb: removed %d files that dead rdmakv processes left in %s\n", len(removed), m.ShmDir)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &childCluster{m: m}
	c.cmd = exec.Command(exe, clusterCmd)
	c.cmd.Stderr = stderr
	// Its own process group: a Ctrl-C reaches kvycsb, which ends the
	// phase and then closes the cluster; killed if kvycsb dies.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	timeout := time.Minute
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if c.ch, err = server.SpawnChild(c.cmd, server.ChildConfig{Map: m, Heartbeat: ec.heartbeat, ElectionTimeout: ec.election, SpareP: ec.spareP}, timeout); err != nil {
		return nil, fmt.Errorf("the cluster's process: %w", err)
	}
	if c.node, err = fabric.Open(fabric.ForMap(m), m.ClientNodes[0]); err != nil {
		c.close()
		return nil, fmt.Errorf("the client's node: %w", err)
	}
	return c, nil
}

// close closes the client's node and ends the child (EOF on its stdin,
// then SIGKILL if it has not exited in 10 s).
func (c *childCluster) close() {
	if c.node != nil {
		c.node.Close()
		c.node = nil
	}
	c.ch.Close(10 * time.Second)
}

// clusterDuring is what the embedded cluster's process did during a
// phase (kvproc.During): its state letters at the phase's start and end
// (T: stopped) and the CPU it used meanwhile.
type clusterDuring struct {
	Pid        int            `json:"pid"`
	Frozen     bool           `json:"frozen"` // bench stopped it for the phase (SIGSTOP)
	State      string         `json:"state"`  // the letters at the start and the end, e.g. "TT"
	CPUSeconds float64        `json:"cpu_seconds"`
	d          *kvproc.During // nil once decoded from JSON
}

// watch starts a clusterDuring of the child's process.
func (c *childCluster) watch(frozen bool) *clusterDuring {
	return &clusterDuring{Pid: c.ch.Pid(), Frozen: frozen, d: kvproc.Watch(c.ch.Pid())}
}

// end completes d at the end of the phase.
func (d *clusterDuring) end() {
	d.d.End()
	d.State, d.CPUSeconds = d.d.State, d.d.CPUSeconds
}

// stopped reports whether the process was stopped at both ends.
func (d *clusterDuring) stopped() bool { return kvproc.Stopped(d.State) }

// freeze stops the cluster's process (a Redis phase runs without it).
func (c *childCluster) freeze() error {
	if benchKnobs.keepClusterRunning {
		return nil
	}
	return kvproc.Freeze(c.ch.Pid())
}

// thaw resumes the cluster's process and returns once every group serves
// a linearizable read again: a replica whose heartbeats paused may first
// stand for election, and the next rdmakv phase must not measure that.
func (c *childCluster) thaw(ctx context.Context, cl *client.Client) error {
	if benchKnobs.keepClusterRunning {
		return nil
	}
	if err := kvproc.Thaw(c.ch.Pid()); err != nil {
		return err
	}
	return waitServes(ctx, cl, 30*time.Second)
}

// waitServes waits up to timeout until a linearizable read of each of 16
// keys (spread over the groups by the hash) succeeds or finds no key.
func waitServes(ctx context.Context, cl *client.Client, timeout time.Duration) error {
	return kvproc.WaitServes(ctx, timeout, func(ctx context.Context, i int) error {
		_, err := cl.GetItem(ctx, []byte(fmt.Sprintf("kvycsb-probe-%d", i)), client.Linearizable)
		if errors.Is(err, client.ErrNotFound) {
			return nil
		}
		return err
	})
}
