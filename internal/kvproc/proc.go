package kvproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/internal/childproc"
)

// ChildKind is a replica process's kind (childproc.Register): Spawn
// starts a binary that calls childproc.ServeIfChild as one.
const ChildKind = "kv-test"

func init() { childproc.Register(ChildKind, Serve) }

// Serve is a replica process's main loop: it reads the Config from the
// first line of in, runs the replica (answering Ready on out once it
// runs), serves requests until in ends, closes everything and returns.
func Serve(in io.Reader, out io.Writer) error {
	var cfg Config
	sc, err := childproc.ReadConfig(in, &cfg)
	if err != nil {
		return fmt.Errorf("kvproc: %w", err)
	}
	w := &lineWriter{w: bufio.NewWriterSize(out, 16<<10)}
	w.enc = json.NewEncoder(w.w)
	if err := serveReplica(cfg, sc, w); err != nil {
		w.emit(Line{Err: err.Error()}) // before Ready: Spawn reports it
		return err
	}
	return nil
}

// lineWriter writes one JSON line at a time, flushed, from any goroutine.
type lineWriter struct {
	mu  sync.Mutex
	w   *bufio.Writer
	enc *json.Encoder
	err error
}

func (lw *lineWriter) emit(l Line) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return // the parent stopped reading: it is gone, EOF follows
	}
	if err := lw.enc.Encode(&l); err != nil {
		lw.err = err
		return
	}
	lw.err = lw.w.Flush()
}

// ErrExited: the process ended before it answered.
var ErrExited = errors.New("kvproc: process exited")

// Proc is the parent's handle on a replica process.
type Proc struct {
	c *childproc.Proc[Line]
}

// Spawn starts cmd (an executable that calls Serve with its stdin and
// stdout; Spawn sets both, the caller may set Stderr, Env and
// SysProcAttr), sends it cfg and waits up to timeout for it to run.
// onEvent (nil: none) is called with every event line, in the child's
// order, from one goroutine per Proc; it must not block for long.
func Spawn(cmd *exec.Cmd, cfg Config, onEvent func(*Status), timeout time.Duration) (*Proc, error) {
	c, l, err := childproc.Start(cmd, cfg, timeout, childproc.Options[Line]{
		Kind:    ChildKind,
		Name:    "kvproc: replica",
		MaxLine: 1 << 20,
		ID:      func(l *Line) uint64 { return l.ID },
		Event: func(l *Line) bool {
			if l.Event == nil {
				return false
			}
			if onEvent != nil {
				onEvent(l.Event)
			}
			return true
		},
		Exited: Line{Err: ErrExited.Error()},
		Drain:  true,
	})
	if err != nil {
		return nil, fmt.Errorf("kvproc: spawn group %d replica %d: %w", cfg.Group, cfg.Replica, err)
	}
	if !l.Ready {
		c.Kill()
		return nil, fmt.Errorf("kvproc: spawn group %d replica %d: %s: %w", cfg.Group, cfg.Replica, l.Err, ErrExited)
	}
	return &Proc{c: c}, nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.c.Pid() }

// Status returns the replica's state; it waits for the answer or ctx's
// end (a stopped process does not answer).
func (p *Proc) Status(ctx context.Context) (Status, error) {
	pid := p.Pid()
	id, ch, err := p.c.Send(func(id uint64) any { return Request{ID: id, Cmd: CmdStatus} }, nil)
	if ch == nil {
		return Status{}, fmt.Errorf("kvproc: status at pid %d: %w", pid, ErrExited)
	}
	if err != nil {
		return Status{}, fmt.Errorf("kvproc: status at pid %d: %w (%v)", pid, ErrExited, err)
	}
	select {
	case l := <-ch:
		switch {
		case l.Err != "" && l.ID == 0:
			return Status{}, fmt.Errorf("kvproc: status at pid %d: %w", pid, ErrExited)
		case l.Err != "":
			return Status{}, fmt.Errorf("kvproc: status at pid %d: %s", pid, l.Err)
		case l.Status == nil:
			return Status{}, fmt.Errorf("kvproc: status at pid %d: answer without a status", pid)
		}
		return *l.Status, nil
	case <-ctx.Done():
		p.c.Forget(id)
		return Status{}, fmt.Errorf("kvproc: status at pid %d: %w", pid, ctx.Err())
	}
}

// Signal sends sig to the process (SIGSTOP and SIGCONT: stop it and let
// it run again; its shm memory stays readable meanwhile).
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.c.Exited():
		return fmt.Errorf("kvproc: signal %v to pid %d: %w", sig, p.Pid(), ErrExited)
	default:
	}
	return syscall.Kill(p.Pid(), sig)
}

// Exited is closed once the process ended and was reaped.
func (p *Proc) Exited() <-chan struct{} { return p.c.Exited() }

// Kill is kill -9: the process dies at once, whatever it was doing (also
// a stopped one). It returns once the process was reaped.
func (p *Proc) Kill() error { return p.c.Kill() }

// Close ends the process cleanly (EOF on its stdin: it closes the replica
// and its node, removing its shm files, and exits) and waits up to
// timeout, then kills it. It returns the process's exit error, if any.
func (p *Proc) Close(timeout time.Duration) error { return p.c.Close(timeout) }

// CPUTime is the user plus system CPU time the process has used, from
// /proc/<pid>/stat (in clock ticks), and its state letter (R, S, T, ...).
func CPUTime(pid int) (ticks uint64, state byte, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// start after the last ')'.
	i := len(b) - 1
	for i >= 0 && b[i] != ')' {
		i--
	}
	if i < 0 {
		return 0, 0, fmt.Errorf("kvproc: /proc/%d/stat: no ')'", pid)
	}
	var f [13]string
	n, _ := fmt.Sscan(string(b[i+1:]), &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11], &f[12])
	if n < 13 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("kvproc: /proc/%d/stat: %d fields after the name", pid, n)
	}
	// Fields after the name: state(3) ppid pgrp session tty_nr tpgid
	// flags minflt cminflt majflt cmajflt utime(14) stime(15).
	var ut, st uint64
	if _, err := fmt.Sscan(f[11], &ut); err != nil {
		return 0, 0, err
	}
	if _, err := fmt.Sscan(f[12], &st); err != nil {
		return 0, 0, err
	}
	return ut + st, f[0][0], nil
}
