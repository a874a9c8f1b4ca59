package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// groupSpec is one group to measure: a fabric and a size.
type groupSpec struct {
	fabric string
	n      int
}

func (g groupSpec) String() string { return fmt.Sprintf("%s:%d", g.fabric, g.n) }

// parseGroups parses "shm:3,mem:7".
func parseGroups(s string) ([]groupSpec, error) {
	var out []groupSpec
	for _, f := range splitList(s) {
		fab, n, ok := strings.Cut(f, ":")
		k, err := strconv.Atoi(n)
		if !ok || err != nil || k < 1 || k > 255 || k%2 == 0 {
			return nil, fmt.Errorf("bad group %q (want fabric:replicas, an odd number of replicas, e.g. shm:3)", f)
		}
		if fab != "mem" && fab != "shm" && fab != "tcp" {
			return nil, fmt.Errorf("bad group %q: unknown fabric %q (want mem, shm, tcp)", f, fab)
		}
		out = append(out, groupSpec{fab, k})
	}
	return out, nil
}

// bgroup is a running broadcast group: member processes (shm, tcp) or
// in-process members on one mem fabric, each on a poller of its own; or
// (openGroupRuntime) in-process members on mem or shm polled by one
// poller group, the group on one poller, as kvserver polls a group's
// replicas.
type bgroup struct {
	spec    groupSpec
	cfgs    []groupproc.Config
	procs   []*groupproc.Proc   // shm, tcp
	members []*groupproc.Member // mem, or every fabric with pg
	memf    *mem.Fabric
	dir     string // shm cluster directory
	// runtime placement: the poller group polling every member
	pg     *poller.Group
	pgStop func()
}

// parks is the runtime placement's poller parks so far (-1 for another).
func (g *bgroup) parks() int64 { return groupParks(g.pg) }

// groupParks is the parks of pg's pollers so far; -1 for no group (a
// placement other than the runtime's).
func groupParks(pg *poller.Group) int64 {
	if pg == nil {
		return -1
	}
	var n int64
	for _, s := range pg.Stats() {
		n += int64(s.Parks)
	}
	return n
}

// local reports whether the members run in this process.
func (g *bgroup) local() bool { return g.memf != nil || g.pg != nil }

// openGroup starts a group of spec.n members with tuning and waits until
// one leads an epoch whose diff has committed. spin is the nodes' doorbell
// spin budget (0: rdma.DefaultSpin, negative: park at once).
func openGroup(ctx context.Context, spec groupSpec, tuning groupproc.Tuning, spin time.Duration, shmDir string) (*bgroup, error) {
	return openGroupWith(ctx, spec, tuning, spin, shmDir, nil)
}

// openGroupWith is openGroup with a hook that adjusts every member's
// Config (adjust may be nil) before the members start.
func openGroupWith(ctx context.Context, spec groupSpec, tuning groupproc.Tuning, spin time.Duration, shmDir string, adjust func(*groupproc.Config)) (*bgroup, error) {
	return openBGroup(ctx, spec, tuning, spin, shmDir, adjust, false)
}

// openGroupRuntime is openGroup with every member in this process (mem or
// shm nodes) polled by one poller group, all on one poller (AddTo with
// one key), as kvserver's server.Process polls a group's replicas: their
// messages to each other need no wake-up. The multicast tax's baseline
// runs so, as its multicast replicas do.
func openGroupRuntime(ctx context.Context, spec groupSpec, tuning groupproc.Tuning, spin time.Duration, shmDir string) (*bgroup, error) {
	if spec.fabric != "mem" && spec.fabric != "shm" {
		return nil, fmt.Errorf("%v group: the runtime placement runs mem or shm members in this process", spec)
	}
	return openBGroup(ctx, spec, tuning, spin, shmDir, nil, true)
}

func openBGroup(ctx context.Context, spec groupSpec, tuning groupproc.Tuning, spin time.Duration, shmDir string, adjust func(*groupproc.Config), onePoller bool) (*bgroup, error) {
	g := &bgroup{spec: spec}
	ids := make([]rdma.NodeID, spec.n)
	for i := range ids {
		ids[i] = rdma.NodeID(i + 1)
	}
	base := groupproc.Config{Fabric: spec.fabric, Members: ids, Tuning: tuning, Spin: spin, Start: broadcast.StartNew}
	switch spec.fabric {
	case "shm":
		wd, err := workDir(shmDir)
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp(wd, "bcast-")
		if err != nil {
			return nil, fmt.Errorf("shm: cluster directory: %w", err)
		}
		g.dir, base.ShmDir, base.ShmCluster = dir, dir, "bcast"
	case "tcp":
		base.Secret = make([]byte, 32)
		rand.Read(base.Secret)
		base.Addrs = map[rdma.NodeID]string{}
		var ls []net.Listener
		for _, id := range ids {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				for _, l := range ls {
					l.Close()
				}
				return nil, err
			}
			ls = append(ls, l)
			base.Addrs[id] = l.Addr().String()
		}
		for _, l := range ls {
			l.Close()
		}
	case "mem":
		g.memf = mem.New(mem.Options{Spin: spin})
	}
	if onePoller {
		g.pg = poller.NewGroup(poller.GroupConfig{Pollers: 1, Spin: spin})
		pctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.pg.Run(pctx) }()
		g.pgStop = func() { cancel(); <-done }
	}
	for _, id := range ids {
		c := base
		c.Self = id
		if g.dir != "" {
			c.StablePath = filepath.Join(g.dir, fmt.Sprintf("stable.%d", id))
		}
		if adjust != nil {
			adjust(&c)
		}
		g.cfgs = append(g.cfgs, c)
	}
	for i := range ids {
		if err := g.start(i); err != nil {
			g.close()
			return nil, err
		}
	}
	if _, err := g.leader(ctx, -1); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// start starts member i.
func (g *bgroup) start(i int) error {
	c := g.cfgs[i]
	if g.local() {
		s := c.FabricSpec()
		s.Mem = g.memf
		n, err := fabric.Open(s, c.Self)
		if err != nil {
			return err
		}
		var m *groupproc.Member
		if g.pg != nil {
			m, err = groupproc.StartOn(c, n, g.pg, 0)
		} else {
			m, err = groupproc.Start(c, n)
		}
		if err != nil {
			return err
		}
		if g.members == nil {
			g.members = make([]*groupproc.Member, len(g.cfgs))
		}
		g.members[i] = m
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe)
	if err := childCmd(cmd); err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	p, err := groupproc.Spawn(cmd, c, 30*time.Second)
	if err != nil {
		return err
	}
	if g.procs == nil {
		g.procs = make([]*groupproc.Proc, len(g.cfgs))
	}
	g.procs[i] = p
	return nil
}

func (g *bgroup) alive(i int) bool {
	if g.local() {
		return g.members[i] != nil
	}
	return g.procs[i] != nil
}

func (g *bgroup) status(ctx context.Context, i int) (broadcast.Status, error) {
	if g.local() {
		return g.members[i].Replica().Status(), nil
	}
	return g.procs[i].Status(ctx)
}

// leader waits until a live member other than not leads an epoch whose
// diff committed there (bounded by ctx and stallTimeout).
func (g *bgroup) leader(ctx context.Context, not int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, stallTimeout)
	defer cancel()
	for {
		for i := range g.cfgs {
			if i == not || !g.alive(i) {
				continue
			}
			s, err := g.status(ctx, i)
			if err == nil && s.Role == broadcast.Leader && s.Committed.E == s.ECur {
				return i, nil
			}
		}
		if err := ctx.Err(); err != nil {
			return -1, fmt.Errorf("%v group: no leader: %w", g.spec, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// load runs a client at member i.
func (g *bgroup) load(ctx context.Context, i int, spec groupproc.LoadSpec) (groupproc.LoadResult, error) {
	if g.local() {
		return g.members[i].Load(ctx, spec)
	}
	r, err := g.procs[i].Call(ctx, groupproc.Request{Cmd: groupproc.CmdLoad, Load: &spec})
	if err != nil {
		return groupproc.LoadResult{}, err
	}
	return *r.Load, nil
}

func (g *bgroup) events(ctx context.Context, i int) ([]groupproc.TimedEvent, error) {
	if g.local() {
		return g.members[i].Events(), nil
	}
	r, err := g.procs[i].Call(ctx, groupproc.Request{Cmd: groupproc.CmdEvents})
	return r.Events, err
}

// kill crashes member i: kill -9 of its process, or Crash in process.
func (g *bgroup) kill(i int) error {
	if g.local() {
		err := g.members[i].Crash()
		g.members[i] = nil
		return err
	}
	err := g.procs[i].Kill()
	g.procs[i] = nil
	return err
}

// pids lists the member processes (none for mem).
func (g *bgroup) pids() []int {
	var out []int
	for _, p := range g.procs {
		if p != nil {
			out = append(out, p.Pid())
		}
	}
	return out
}

// pin pins member ldr's process to CPU 0 and the other members' processes
// round-robin to CPUs 1, 2, ... (no-op for goroutine members).
func (g *bgroup) pin(ldr int) error {
	n := runtime.NumCPU()
	if n < 2 {
		return fmt.Errorf("kvbench: --pin needs at least 2 CPUs, have %d", n)
	}
	next := 1
	for i, p := range g.procs {
		if p == nil {
			continue
		}
		cpu := 0
		if i != ldr {
			cpu = next
			next = next%(n-1) + 1
		}
		if err := pinProcess(p.Pid(), cpu); err != nil {
			return err
		}
	}
	return nil
}

// close ends every member and removes the shm directory.
func (g *bgroup) close() error {
	var err error
	for i, p := range g.procs {
		if p != nil {
			err = errors.Join(err, p.Close(10*time.Second))
			g.procs[i] = nil
		}
	}
	for i, m := range g.members {
		if m != nil {
			err = errors.Join(err, m.Close())
			g.members[i] = nil
		}
	}
	if g.pgStop != nil {
		g.pgStop()
		g.pgStop = nil
	}
	if g.dir != "" {
		err = errors.Join(err, os.RemoveAll(g.dir))
	}
	return err
}

// rssKB is a process's resident set (VmRSS) in KiB, from /proc.
func rssKB(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// cpuOf is takeCPU counting the group's processes as ours.
func cpuOf(pids []int) cpuSnap {
	s := takeCPU(0)
	for _, p := range pids {
		t, ok := procTicks(p)
		if !ok {
			s.ok = false
		}
		s.ours += t
	}
	return s
}
