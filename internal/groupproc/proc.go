package groupproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/internal/childproc"
)

// Commands of the control protocol (Request.Cmd).
const (
	CmdPropose  = "propose"   // Data: propose it; answered when it resolves (Index or Err)
	CmdStatus   = "status"    // answered with Status
	CmdDump     = "dump"      // answered with Entries (record mode) and Digest
	CmdDigest   = "digest"    // answered with Digest (hashing the ballast state, if any)
	CmdFSMStats = "fsm-stats" // answered with FSMStats
	CmdEvents   = "events"    // answered with Events
	CmdLoad     = "load"      // Load: run a client here; answered with LoadResult when it ends
	CmdStopLoad = "stop-load" // end every running load early (each answers its own request)
	CmdMark     = "mark"      // Data: begin a segment so named in every running load (LoadSpec.Segments); answered with Index = loads marked
)

// Request is one line from the parent.
type Request struct {
	ID   uint64    `json:"id"`
	Cmd  string    `json:"cmd"`
	Data string    `json:"data,omitempty"`
	Load *LoadSpec `json:"load,omitempty"`
}

// Codes classify Reply.Err, so that the parent can tell the proposal
// outcomes broadcast distinguishes.
const (
	CodeBusy     = "busy"      // broadcast.ErrBusy: not delivered
	CodeTimeout  = "timeout"   // broadcast.ErrTimeout: not delivered
	CodeTooLarge = "too-large" // broadcast.ErrTooLarge: not delivered
	CodeStopped  = "stopped"   // broadcast.ErrStopped: outcome unknown
	CodeExited   = "exited"    // the process ended before answering: outcome unknown
	CodeOther    = "error"     // anything else
)

// Reply is one line from the child. Ready is set on the first line, once
// the member runs.
type Reply struct {
	ID      uint64            `json:"id"`
	Err     string            `json:"err,omitempty"`
	Code    string            `json:"code,omitempty"`
	Ready   bool              `json:"ready,omitempty"`
	Pid     int               `json:"pid,omitempty"`
	Index   uint64            `json:"index,omitempty"`
	Status  *broadcast.Status `json:"status,omitempty"`
	Entries []string          `json:"entries,omitempty"`
	Digest  *Digest           `json:"digest,omitempty"`
	FSM     *FSMStats         `json:"fsm,omitempty"`
	Events  []TimedEvent      `json:"events,omitempty"`
	Load    *LoadResult       `json:"load,omitempty"`
}

// Error returns the reply's error, wrapping the broadcast sentinel its Code
// names (nil if the request succeeded).
func (r Reply) Error() error {
	if r.Err == "" {
		return nil
	}
	var s error
	switch r.Code {
	case CodeBusy:
		s = broadcast.ErrBusy
	case CodeTimeout:
		s = broadcast.ErrTimeout
	case CodeTooLarge:
		s = broadcast.ErrTooLarge
	case CodeStopped:
		s = broadcast.ErrStopped
	case CodeExited:
		s = ErrExited
	default:
		return fmt.Errorf("groupproc: %s", r.Err)
	}
	return fmt.Errorf("groupproc: %s: %w", r.Err, s)
}

// ErrExited: the member's process ended before it answered.
var ErrExited = errors.New("groupproc: member process exited")

func codeOf(err error) string {
	switch {
	case errors.Is(err, broadcast.ErrBusy):
		return CodeBusy
	case errors.Is(err, broadcast.ErrTimeout):
		return CodeTimeout
	case errors.Is(err, broadcast.ErrTooLarge):
		return CodeTooLarge
	case errors.Is(err, broadcast.ErrStopped):
		return CodeStopped
	}
	return CodeOther
}

// ChildKind is a member process's kind (childproc.Register): Spawn starts
// a binary that calls childproc.ServeIfChild as one.
const ChildKind = "bcast-test"

func init() { childproc.Register(ChildKind, Serve) }

// Serve is a member process's main loop: it reads the Config from the
// first line of in, opens the node and starts the member, answers Ready,
// then serves requests until in ends, and closes the member.
func Serve(in io.Reader, out io.Writer) error {
	var cfg Config
	sc, err := childproc.ReadConfig(in, &cfg)
	if err != nil {
		return fmt.Errorf("groupproc: %w", err)
	}
	node, err := fabric.Open(cfg.FabricSpec(), cfg.Self)
	if err != nil {
		return fmt.Errorf("groupproc: %w", err)
	}
	m, err := Start(cfg, node)
	if err != nil {
		return err
	}
	var wmu sync.Mutex
	enc := json.NewEncoder(out)
	send := func(r Reply) {
		wmu.Lock()
		defer wmu.Unlock()
		enc.Encode(r) // a parent that stopped reading is gone; EOF on in follows
	}
	send(Reply{Ready: true, Pid: os.Getpid()})

	ctx, cancel := context.WithCancel(context.Background())
	var loads sync.WaitGroup // running loads and digests
	var lmu sync.Mutex
	stopLoads := func() {}
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			send(Reply{Err: fmt.Sprintf("bad request %q: %v", sc.Text(), err), Code: CodeOther})
			continue
		}
		switch req.Cmd {
		case CmdPropose:
			p := m.r.Propose([]byte(req.Data))
			go func() {
				i, err := p.Result()
				r := Reply{ID: req.ID, Index: i}
				if err != nil {
					r.Err, r.Code = err.Error(), codeOf(err)
				}
				send(r)
			}()
		case CmdStatus:
			s := m.r.Status()
			send(Reply{ID: req.ID, Status: &s})
		case CmdDump:
			d := m.fsm.Digest()
			send(Reply{ID: req.ID, Entries: m.fsm.Entries(), Digest: &d})
		case CmdDigest:
			loads.Add(1)
			go func() { // hashing a large ballast takes a while: other requests go on
				defer loads.Done()
				d := m.fsm.Digest()
				send(Reply{ID: req.ID, Digest: &d})
			}()
		case CmdFSMStats:
			st := m.fsm.Stats()
			send(Reply{ID: req.ID, FSM: &st})
		case CmdEvents:
			send(Reply{ID: req.ID, Events: m.Events()})
		case CmdLoad:
			if req.Load == nil {
				send(Reply{ID: req.ID, Err: "load without a spec", Code: CodeOther})
				continue
			}
			lmu.Lock()
			lctx, lcancel := context.WithCancel(ctx)
			prev := stopLoads
			stopLoads = func() { prev(); lcancel() }
			lmu.Unlock()
			loads.Add(1)
			go func() {
				defer loads.Done()
				res, err := m.Load(lctx, *req.Load)
				r := Reply{ID: req.ID, Load: &res}
				if err != nil {
					r.Err, r.Code = err.Error(), CodeOther
				}
				send(r)
			}()
		case CmdMark:
			send(Reply{ID: req.ID, Index: uint64(m.Mark(req.Data))})
		case CmdStopLoad:
			lmu.Lock()
			stopLoads()
			stopLoads = func() {}
			lmu.Unlock()
			send(Reply{ID: req.ID})
		default:
			send(Reply{ID: req.ID, Err: fmt.Sprintf("unknown command %q", req.Cmd), Code: CodeOther})
		}
	}
	cancel()
	loads.Wait()
	return errors.Join(sc.Err(), m.Close())
}

// Proc is the parent's handle on a member process.
type Proc struct {
	c *childproc.Proc[Reply]
}

// exitedReply answers every request still waiting when the process ends.
var exitedReply = Reply{Err: "member process exited", Code: CodeExited}

// Spawn starts cmd (an executable that calls Serve with its stdin and
// stdout; Spawn sets both, the caller may set Stderr and Env), sends it cfg
// and waits up to timeout for the member to run.
func Spawn(cmd *exec.Cmd, cfg Config, timeout time.Duration) (*Proc, error) {
	c, r, err := childproc.Start(cmd, cfg, timeout, childproc.Options[Reply]{
		Kind:    ChildKind,
		Name:    "groupproc: member",
		MaxLine: 256 << 20,
		ID:      func(r *Reply) uint64 { return r.ID },
		Exited:  exitedReply,
	})
	if err != nil {
		return nil, fmt.Errorf("groupproc: spawn member %d: %w", cfg.Self, err)
	}
	if !r.Ready {
		c.Kill()
		return nil, fmt.Errorf("groupproc: spawn member %d: %w", cfg.Self, errors.Join(r.Error(), ErrExited))
	}
	return &Proc{c: c}, nil
}

// Pid is the member process's id.
func (p *Proc) Pid() int { return p.c.Pid() }

// Send sends req (its ID is assigned) and returns where its reply will
// arrive (a reply with CodeExited if the process ends first).
func (p *Proc) Send(req Request) <-chan Reply {
	_, ch, _ := p.c.Send(func(id uint64) any { req.ID = id; return req },
		func(err error) Reply { return Reply{Err: "send: " + err.Error(), Code: CodeExited} })
	if ch == nil {
		gone := make(chan Reply, 1)
		gone <- exitedReply
		return gone
	}
	return ch
}

// Call sends req and waits for its reply or ctx's end.
func (p *Proc) Call(ctx context.Context, req Request) (Reply, error) {
	select {
	case r := <-p.Send(req):
		return r, r.Error()
	case <-ctx.Done():
		return Reply{}, fmt.Errorf("groupproc: %s at pid %d: %w", req.Cmd, p.Pid(), ctx.Err())
	}
}

// Status returns the member's broadcast status.
func (p *Proc) Status(ctx context.Context) (broadcast.Status, error) {
	r, err := p.Call(ctx, Request{Cmd: CmdStatus})
	if err != nil {
		return broadcast.Status{}, err
	}
	if r.Status == nil {
		return broadcast.Status{}, fmt.Errorf("groupproc: status reply without status")
	}
	return *r.Status, nil
}

// Exited is closed once the process has ended and was reaped.
func (p *Proc) Exited() <-chan struct{} { return p.c.Exited() }

// Kill is kill -9: the process dies at once, whatever it was doing.
func (p *Proc) Kill() error { return p.c.Kill() }

// Close ends the member cleanly (EOF on its stdin: it closes its replica
// and node and exits) and waits up to timeout, then kills it. It returns
// the process's exit error, if any.
func (p *Proc) Close(timeout time.Duration) error { return p.c.Close(timeout) }
