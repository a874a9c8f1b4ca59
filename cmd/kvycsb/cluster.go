package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// The embedded cluster runs in a child process: kvycsb re-executed with the
// hidden command clusterCmd, which starts every replica of the map
// (internal/localcluster on shm) and runs them until its stdin closes.
//
// Not in kvycsb's own process: each replica's driver parks in futex(2)
// system calls, and with several of them parked the Go runtime has no P
// left for kvycsb's other goroutines until sysmon takes one back (up to
// 10 ms later). Measured with 2 CPUs: go-ycsb's redis binding loading
// 100k records at 8 threads did about 900 ops/s beside an in-process
// cluster against 24k ops/s without one, and rdmakv's own writes waited
// the same way.
const clusterCmd = "_cluster"

// clusterConfig is the child's first line on stdin.
type clusterConfig struct {
	Map       *cluster.Map  `json:"map"`
	Heartbeat time.Duration `json:"heartbeat"`
	Election  time.Duration `json:"election"`
}

// clusterReply is the child's answer on stdout.
type clusterReply struct {
	Ready bool   `json:"ready,omitempty"`
	Err   string `json:"err,omitempty"`
}

// serveCluster is the child: it runs the cluster until EOF on in.
func serveCluster(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	enc := json.NewEncoder(out)
	if !sc.Scan() {
		return fmt.Errorf("no configuration on stdin: %v", sc.Err())
	}
	var cfg clusterConfig
	if err := json.Unmarshal(sc.Bytes(), &cfg); err != nil || cfg.Map == nil {
		return fmt.Errorf("bad configuration: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	lc, err := localcluster.Start(ctx, cfg.Map, broadcast.Config{HeartbeatInterval: cfg.Heartbeat, ElectionTimeout: cfg.Election})
	cancel()
	if err != nil {
		enc.Encode(clusterReply{Err: err.Error()})
		return err
	}
	defer lc.Close()
	if err := enc.Encode(clusterReply{Ready: true}); err != nil {
		return err
	}
	for sc.Scan() {
	}
	return nil
}

// childCluster is a running embedded cluster and this process's node of
// client slot 0 (kvycsb's one client).
type childCluster struct {
	m      *cluster.Map
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan error
	node   rdma.Node
}

// startChildCluster starts the cluster of ec in a child process and opens
// the client slot's shm node.
func startChildCluster(ctx context.Context, ec embeddedConfig, stderr io.Writer) (*childCluster, error) {
	m := embeddedMap(ec.groups, ec.replicas)
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
	c := &childCluster{m: m, exited: make(chan error, 1)}
	c.cmd = exec.Command(exe, clusterCmd)
	c.cmd.Stderr = stderr
	// Its own process group: a Ctrl-C reaches kvycsb, which ends the
	// phase and then closes the cluster; killed if kvycsb dies.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the cluster's process: %w", err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	if err := json.NewEncoder(c.stdin).Encode(clusterConfig{Map: m, Heartbeat: ec.heartbeat, Election: ec.election}); err != nil {
		c.close()
		return nil, err
	}
	replies := make(chan clusterReply, 1)
	go func() {
		var r clusterReply
		if err := json.NewDecoder(stdout).Decode(&r); err != nil {
			r.Err = "no answer: " + err.Error()
		}
		replies <- r
		io.Copy(io.Discard, stdout)
	}()
	select {
	case r := <-replies:
		if !r.Ready {
			c.close()
			return nil, fmt.Errorf("the cluster's process: %s", r.Err)
		}
	case <-ctx.Done():
		c.close()
		return nil, fmt.Errorf("the cluster's process did not start in time: %w", ctx.Err())
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
	c.stdin.Close()
	select {
	case err := <-c.exited:
		c.exited <- err
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		err := <-c.exited
		c.exited <- err
	}
}
