package mcproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/rdmakv/rdmakv/internal/childproc"
)

// ChildKind is a replica or client process's kind (childproc.Register):
// Spawn starts a binary that calls childproc.ServeIfChild as one.
const ChildKind = "mc-test"

func init() { childproc.Register(ChildKind, Serve) }

// Serve is a process's main loop: it reads the Config from the first line
// of in, runs the replica or the client it describes (answering Ready on
// out once it runs), serves requests until in ends, closes everything and
// returns. Event lines go to out as they happen.
func Serve(in io.Reader, out io.Writer) error {
	var cfg Config
	sc, err := childproc.ReadConfig(in, &cfg)
	if err != nil {
		return fmt.Errorf("mcproc: %w", err)
	}
	em := newEmitter(bufio.NewWriterSize(out, 64<<10))
	switch cfg.Role {
	case RoleReplica:
		err = serveReplica(cfg, sc, em)
	case RoleClient:
		err = serveClient(cfg, sc, em)
	default:
		err = fmt.Errorf("mcproc: serve: role %q", cfg.Role)
	}
	if err != nil {
		em.emit(Line{Err: err.Error()}) // before Ready: Spawn reports it
	}
	em.close()
	return err
}

// ErrExited: the process ended before it answered.
var ErrExited = errors.New("mcproc: process exited")

// Proc is the parent's handle on a replica or client process.
type Proc struct {
	c   *childproc.Proc[Line]
	inc uint64
}

// Spawn starts cmd (an executable that calls Serve with its stdin and
// stdout; Spawn sets both, the caller may set Stderr and Env), sends it
// cfg and waits up to timeout for it to run. onEvent (nil: none) is called
// with every event line, in the child's order, from one goroutine per
// Proc; it must not block for long (the child's writes wait for it).
func Spawn(cmd *exec.Cmd, cfg Config, onEvent func(*Line), timeout time.Duration) (*Proc, error) {
	c, l, err := childproc.Start(cmd, cfg, timeout, childproc.Options[Line]{
		Kind:    ChildKind,
		Name:    "mcproc:",
		MaxLine: 64 << 20,
		ID:      func(l *Line) uint64 { return l.ID },
		Event: func(l *Line) bool {
			if l.Deliver != nil || l.Restore != nil || l.Multicast != nil || l.Outcome != nil || l.Failure != nil {
				if onEvent != nil {
					onEvent(l)
				}
				return true
			}
			return false
		},
		Exited: Line{Err: ErrExited.Error()},
		Drain:  true,
	})
	if err != nil {
		return nil, fmt.Errorf("mcproc: spawn %s: %w", cfg.Role, err)
	}
	if !l.Ready {
		c.Kill()
		return nil, fmt.Errorf("mcproc: spawn %s: %s: %w", cfg.Role, l.Err, ErrExited)
	}
	return &Proc{c: c, inc: l.ClientInc}, nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.c.Pid() }

// ClientInc is a client process's incarnation (0 for a replica).
func (p *Proc) ClientInc() uint64 { return p.inc }

// Call sends a request with cmd and waits for its answer or ctx's end.
func (p *Proc) Call(ctx context.Context, cmd string) (Line, error) {
	pid := p.Pid()
	id, ch, err := p.c.Send(func(id uint64) any { return Request{ID: id, Cmd: cmd} }, nil)
	if ch == nil {
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, pid, ErrExited)
	}
	if err != nil {
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w (%v)", cmd, pid, ErrExited, err)
	}
	select {
	case l := <-ch:
		if l.Err != "" {
			if l.ID == 0 {
				return l, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, pid, ErrExited)
			}
			return l, fmt.Errorf("mcproc: %s at pid %d: %s", cmd, pid, l.Err)
		}
		return l, nil
	case <-ctx.Done():
		p.c.Forget(id)
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, pid, ctx.Err())
	}
}

// Status returns a replica process's status.
func (p *Proc) Status(ctx context.Context) (Status, error) {
	l, err := p.Call(ctx, CmdStatus)
	if err != nil {
		return Status{}, err
	}
	if l.Status == nil {
		return Status{}, fmt.Errorf("mcproc: status at pid %d: answer without a status", p.Pid())
	}
	return *l.Status, nil
}

// LoadStatus returns a client process's counts so far.
func (p *Proc) LoadStatus(ctx context.Context) (LoadResult, error) {
	l, err := p.Call(ctx, CmdStatus)
	if err != nil {
		return LoadResult{}, err
	}
	if l.Load == nil {
		return LoadResult{}, fmt.Errorf("mcproc: status at pid %d: answer without load counts", p.Pid())
	}
	return *l.Load, nil
}

// StopLoad ends a client process's load and returns its counts, once the
// calls in progress ended (each within its CallTimeout).
func (p *Proc) StopLoad(ctx context.Context) (LoadResult, error) {
	l, err := p.Call(ctx, CmdStopLoad)
	if err != nil {
		return LoadResult{}, err
	}
	if l.Load == nil {
		return LoadResult{}, fmt.Errorf("mcproc: stop-load at pid %d: answer without load counts", p.Pid())
	}
	return *l.Load, nil
}

// Exited is closed once the process ended and was reaped, and every
// event line it wrote was handed to onEvent.
func (p *Proc) Exited() <-chan struct{} { return p.c.Exited() }

// Kill is kill -9: the process dies at once, whatever it was doing. It
// returns once the process was reaped and its last lines were read.
func (p *Proc) Kill() error { return p.c.Kill() }

// Close ends the process cleanly (EOF on its stdin: it closes everything
// and exits) and waits up to timeout, then kills it. It returns the
// process's exit error, if any.
func (p *Proc) Close(timeout time.Duration) error { return p.c.Close(timeout) }
