package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/childproc"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// The replica child of the harnesses that run kv replicas in a process of
// their own (kvbench kv, kvycsb's embedded cluster), on the one child
// mechanism (internal/childproc): the harness re-executes its own binary
// as a child of kind ChildKind (SpawnChild), and the binary's
// childproc.ServeIfChild hands the process to ServeChild, which runs a
// Process of the replicas its ChildConfig names. The child speaks
// childproc's JSON lines: its config first, then requests (ChildRequest),
// each answered by a ChildLine with the request's id. EOF on its stdin,
// SIGTERM or SIGINT close the Process (its shm files go) and end it.

// ChildKind is the replica child's kind (childproc.Register).
const ChildKind = "kv"

func init() { childproc.Register(ChildKind, ServeChild) }

// ChildConfig is what a replica child runs: its first line.
type ChildConfig struct {
	Map *cluster.Map `json:"map"`
	// IDs are the replicas it hosts; nil hosts every replica of Map and
	// answers Ready once every group has a leader.
	IDs []rdma.NodeID `json:"ids,omitempty"`
	// Heartbeat and ElectionTimeout are the replicas' (0: the defaults).
	Heartbeat       time.Duration `json:"heartbeat,omitempty"`
	ElectionTimeout time.Duration `json:"election_timeout,omitempty"`
	// Pollers is the number of poller goroutines (0: ProcessConfig's
	// default).
	Pollers int `json:"pollers,omitempty"`
	// Control is the control port's address ("": none), e.g.
	// "127.0.0.1:0"; the ready line says where it listens.
	Control string `json:"control,omitempty"`
	// SpareP is the pollers' spare P (ProcessConfig.SpareP):
	// cluster.SparePAuto (or "") or cluster.SparePOff. The child takes
	// it from here, never from its environment.
	SpareP string `json:"spare_p,omitempty"`
}

// Child requests (ChildRequest.Cmd).
const (
	ChildStats  = "stats"  // every hosted replica's kv.Stats, read on its poller
	ChildStatus = "status" // every hosted replica's Status and the pollers'
)

// ChildRequest is a request line to a replica child.
type ChildRequest struct {
	ID  uint64 `json:"id"`
	Cmd string `json:"cmd"`
}

// ChildLine is a replica child's answer: the ready line (ID 0) or the
// answer to request ID.
type ChildLine struct {
	ID       uint64          `json:"id,omitempty"`
	Ready    bool            `json:"ready,omitempty"`
	Pid      int             `json:"pid,omitempty"`
	Control  string          `json:"control,omitempty"` // the control port's address
	Err      string          `json:"err,omitempty"`
	Stats    []kv.Stats      `json:"stats,omitempty"`
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	Pollers  []PollerStatus  `json:"pollers,omitempty"`
}

// ServeChild is a replica child's main loop on in and out (its stdin and
// stdout): it reads the ChildConfig, starts the Process, answers the ready
// line, serves requests, and on EOF, SIGTERM or SIGINT closes the Process
// and returns (nil: a clean end).
func ServeChild(in io.Reader, out io.Writer) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	var cfg ChildConfig
	sc, err := childproc.ReadConfig(in, &cfg)
	if err != nil {
		return fmt.Errorf("replica child: %w", err)
	}
	var wmu sync.Mutex
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	emit := func(l ChildLine) error {
		wmu.Lock()
		defer wmu.Unlock()
		if err := enc.Encode(&l); err != nil {
			return err
		}
		return w.Flush()
	}
	if cfg.Map == nil {
		err := errors.New("replica child: no map in the config line")
		emit(ChildLine{Err: err.Error()})
		return err
	}
	if cfg.SpareP == "" {
		cfg.SpareP = cluster.SparePAuto
	}
	if err := cluster.CheckSpareP(cfg.SpareP); err != nil {
		err = fmt.Errorf("replica child: spare_p %v", err)
		emit(ChildLine{Err: err.Error()})
		return err
	}
	pc := ProcessConfig{Map: cfg.Map, IDs: cfg.IDs, Pollers: cfg.Pollers, SpareP: cfg.SpareP != cluster.SparePOff,
		Broadcast: broadcast.Config{HeartbeatInterval: cfg.Heartbeat, ElectionTimeout: cfg.ElectionTimeout}}
	if cfg.Control != "" {
		if pc.Control, err = ListenControl(cfg.Control); err != nil {
			emit(ChildLine{Err: err.Error()})
			return err
		}
	}
	p, err := StartProcess(pc)
	if err == nil && cfg.IDs == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err = p.WaitServing(ctx); err != nil {
			p.Close()
		}
		cancel()
	}
	if err != nil {
		emit(ChildLine{Err: err.Error()})
		return fmt.Errorf("replica child: %w", err)
	}
	defer p.Close()
	if err := emit(ChildLine{Ready: true, Pid: os.Getpid(), Control: p.ControlAddr()}); err != nil {
		return err
	}
	reqs := make(chan []byte)
	go func() {
		defer close(reqs)
		for sc.Scan() {
			reqs <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	for {
		select {
		case <-sigs:
			return nil
		case b, ok := <-reqs:
			if !ok {
				return sc.Err()
			}
			var req ChildRequest
			if err := json.Unmarshal(b, &req); err != nil {
				emit(ChildLine{Err: fmt.Sprintf("bad request %q: %v", b, err)})
				continue
			}
			emit(p.answer(req))
		}
	}
}

// answer answers a child request.
func (p *Process) answer(req ChildRequest) ChildLine {
	l := ChildLine{ID: req.ID}
	switch req.Cmd {
	case ChildStats:
		for g := range p.Map.Groups {
			for i := range p.Map.Groups[g] {
				if !p.Hosts(g, i) {
					continue
				}
				var s kv.Stats
				if err := p.Do(g, i, func(r *kv.Replica) { s = r.Table().Stats() }); err != nil {
					l.Err = err.Error()
					return l
				}
				l.Stats = append(l.Stats, s)
			}
		}
	case ChildStatus:
		for _, r := range p.all {
			l.Replicas = append(l.Replicas, r.Status())
		}
		l.Pollers = pollerStatus(p.all)
	default:
		l.Err = fmt.Sprintf("unknown command %q", req.Cmd)
	}
	return l
}

// ErrChildExited: the child ended before it answered.
var ErrChildExited = errors.New("replica child exited")

// Child is the parent's handle on a replica child.
type Child struct {
	c *childproc.Proc[ChildLine]
	// Ready is its ready line (Pid, Control).
	Ready ChildLine
}

// SpawnChild starts cmd (a binary that calls childproc.ServeIfChild
// first and links this package; SpawnChild sets its kind in cmd.Env, and
// its stdin and stdout, the caller may set Stderr and SysProcAttr), sends
// it cfg and waits up to timeout for its ready line.
func SpawnChild(cmd *exec.Cmd, cfg ChildConfig, timeout time.Duration) (*Child, error) {
	c, l, err := childproc.Start(cmd, cfg, timeout, childproc.Options[ChildLine]{
		Kind:    ChildKind,
		Name:    "replica child",
		MaxLine: 16 << 20,
		ID:      func(l *ChildLine) uint64 { return l.ID },
		Exited:  ChildLine{Err: ErrChildExited.Error()},
		Drain:   true,
	})
	if err != nil {
		return nil, fmt.Errorf("replica child: %w", err)
	}
	if !l.Ready {
		c.Kill()
		return nil, fmt.Errorf("replica child: %s", l.Err)
	}
	return &Child{c: c, Ready: l}, nil
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.c.Pid() }

// Request sends cmd and waits for its answer (or ctx's end).
func (c *Child) Request(ctx context.Context, cmd string) (ChildLine, error) {
	id, ch, err := c.c.Send(func(id uint64) any { return ChildRequest{ID: id, Cmd: cmd} }, nil)
	if ch == nil {
		return ChildLine{}, ErrChildExited
	}
	if err != nil {
		return ChildLine{}, fmt.Errorf("%w (%v)", ErrChildExited, err)
	}
	select {
	case l := <-ch:
		if l.Err != "" {
			if l.ID == 0 {
				return l, ErrChildExited
			}
			return l, fmt.Errorf("replica child: %s: %s", cmd, l.Err)
		}
		return l, nil
	case <-ctx.Done():
		c.c.Forget(id)
		return ChildLine{}, fmt.Errorf("replica child: %s: %w", cmd, ctx.Err())
	}
}

// Stats is every hosted replica's table stats, in map order.
func (c *Child) Stats(ctx context.Context) ([]kv.Stats, error) {
	l, err := c.Request(ctx, ChildStats)
	return l.Stats, err
}

// Exited is closed once the child ended and was reaped.
func (c *Child) Exited() <-chan struct{} { return c.c.Exited() }

// Kill is kill -9 of the child; it returns once it was reaped.
func (c *Child) Kill() error { return c.c.Kill() }

// Close ends the child cleanly (EOF on its stdin: it closes its replicas
// and nodes and exits), killing it if it has not exited within timeout.
func (c *Child) Close(timeout time.Duration) error { return c.c.Close(timeout) }
