package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/childproc"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// The client path across processes: every replica of the cluster runs in
// one child process (kvbench re-executed as a child of kind mcastKind; each replica
// an shm node of its own there, placed as mcSpec.placement says), and the
// client in this process, on an shm node of its own. The child speaks
// internal/childproc's lines: its mcProcConfig first, {"ready":true} once
// every group has a leader, then one answer per request ("check": the
// replicas' anomaly counters); EOF on stdin closes the replicas and ends
// it.

// mcastKind is the kind (internal/childproc) of the replicas' process of
// the multicast client path: kvbench's own child, registered by child.go's
// init.
const mcastKind = "kvbench-mcast"

// mcProcConfig is the cluster the child runs.
type mcProcConfig struct {
	Dir         string        `json:"dir"`  // the shm cluster directory
	Tree        string        `json:"tree"` // tree.Tree text form
	Replicas    int           `json:"replicas"`
	Window      int           `json:"window"`
	SlotSize    int           `json:"slot_size"`
	ET          time.Duration `json:"election_timeout"`
	Spin        time.Duration `json:"spin"`
	ClientNodes []rdma.NodeID `json:"client_nodes"`
	Placement   string        `json:"placement,omitempty"` // mcSpec.placement ("": mcRuntime)
}

// mcProcReply answers the config (ready, ID 0) and each request (its ID).
type mcProcReply struct {
	ID    uint64 `json:"id,omitempty"`
	Ready bool   `json:"ready,omitempty"`
	Err   string `json:"err,omitempty"`
}

// mcServe is the child: it runs the cluster until EOF on in.
func mcServe(in io.Reader, out io.Writer) error {
	var cfg mcProcConfig
	sc, err := childproc.ReadConfig(in, &cfg)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	tr, err := tree.Parse(cfg.Tree)
	if err != nil {
		enc.Encode(mcProcReply{Err: err.Error()})
		return err
	}
	c, err := openMcCluster(context.Background(), mcSpec{fabric: "shm", tree: tr, replicas: cfg.Replicas, clients: len(cfg.ClientNodes),
		window: cfg.Window, slotSize: cfg.SlotSize, et: cfg.ET, spin: cfg.Spin, shmPath: cfg.Dir, clientNodes: cfg.ClientNodes, placement: cfg.Placement})
	if err != nil {
		enc.Encode(mcProcReply{Err: err.Error()})
		return err
	}
	defer c.close()
	if err := enc.Encode(mcProcReply{Ready: true}); err != nil {
		return err
	}
	for sc.Scan() {
		var req struct {
			ID  uint64 `json:"id"`
			Cmd string `json:"cmd"`
		}
		var r mcProcReply
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			r.Err = fmt.Sprintf("bad request: %v", err)
		} else if req.Cmd == "check" {
			if err := c.check(); err != nil {
				r.Err = err.Error()
			}
		} else {
			r.Err = fmt.Sprintf("unknown command %q", req.Cmd)
		}
		r.ID = req.ID
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return c.close()
}

// mcProc is the parent's handle on the child.
type mcProc struct{ c *childproc.Proc[mcProcReply] }

// startMcProc starts the child with cfg and waits until it is ready.
func startMcProc(cfg mcProcConfig) (*mcProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("kvbench: find own executable: %w", err)
	}
	cmd := exec.Command(exe)
	if err := childCmd(cmd); err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	c, r, err := childproc.Start(cmd, cfg, 30*time.Second, childproc.Options[mcProcReply]{Kind: mcastKind, Name: "kvbench: the replicas' process",
		MaxLine: 1 << 20, ID: func(r *mcProcReply) uint64 { return r.ID }, Exited: mcProcReply{Err: "exited"}, Drain: true})
	if err != nil {
		return nil, fmt.Errorf("replicas' process: %w", err)
	}
	if !r.Ready {
		c.Kill()
		return nil, fmt.Errorf("replicas' process: %s", r.Err)
	}
	return &mcProc{c}, nil
}

// check asks the child for its replicas' anomaly counters.
func (p *mcProc) check() error {
	_, ch, err := p.c.Send(func(id uint64) any { return map[string]any{"id": id, "cmd": "check"} }, nil)
	if ch == nil {
		return errors.New("the replicas' process exited")
	}
	if err != nil {
		return err
	}
	select {
	case r := <-ch:
		if r.Err != "" {
			return errors.New(r.Err)
		}
		return nil
	case <-time.After(stallTimeout):
		return fmt.Errorf("no answer in %v", stallTimeout)
	}
}

// close ends the child (EOF on its stdin), killing it if it does not exit
// in 10 s.
func (p *mcProc) close() error { return p.c.Close(10 * time.Second) }

// mcRemote is a cluster whose replicas run in a child process (shm) and
// whose clients run here.
type mcRemote struct {
	proc    *mcProc
	dir     string
	nodes   []rdma.Node
	loaders []*mcLoader
}

// openMcRemote starts spec's replicas in a child process and its clients
// in this one.
func openMcRemote(ctx context.Context, spec mcSpec) (*mcRemote, error) {
	wd, err := workDir(spec.shmDir)
	if err != nil {
		return nil, err
	}
	m := &mcRemote{}
	if m.dir, err = os.MkdirTemp(wd, "mcast-"); err != nil {
		return nil, fmt.Errorf("shm: cluster directory: %w", err)
	}
	var members [][]rdma.NodeID
	for g := range spec.tree.Len() {
		var ms []rdma.NodeID
		for i := range spec.replicas {
			ms = append(ms, mcReplicaID(g, i, spec.replicas))
		}
		members = append(members, ms)
	}
	var cnodes []rdma.NodeID
	for k := range spec.clients {
		id := mcClientID(k)
		n, err := fabric.Open(fabric.Spec{Fabric: "shm", ShmDir: m.dir, Cluster: "mcast", Spin: spec.spin}, id)
		if err != nil {
			m.close()
			return nil, err
		}
		m.nodes = append(m.nodes, n)
		cnodes = append(cnodes, id)
	}
	m.proc, err = startMcProc(mcProcConfig{Dir: m.dir, Tree: spec.tree.String(), Replicas: spec.replicas, Window: spec.window,
		SlotSize: spec.slotSize, ET: spec.et, Spin: spec.spin, ClientNodes: cnodes, Placement: spec.placement})
	if err != nil {
		m.close()
		return nil, err
	}
	inc := uint64(time.Now().UnixNano())
	for k, n := range m.nodes {
		l, err := newMcLoader(n, k, inc, spec.tree, members, spec.window, spec.slotSize)
		if err != nil {
			m.close()
			return nil, err
		}
		m.loaders = append(m.loaders, l)
	}
	if err := registerAll(ctx, m.loaders); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// close ends the clients, then the child, and removes the directory.
func (m *mcRemote) close() error {
	var err error
	for _, l := range m.loaders {
		err = errors.Join(err, l.c.Close())
	}
	if m.proc != nil {
		err = errors.Join(err, m.proc.close())
	}
	for _, n := range m.nodes {
		err = errors.Join(err, n.Close())
	}
	return errors.Join(err, os.RemoveAll(m.dir))
}

func (p *mcProc) pid() int { return p.c.Pid() }
