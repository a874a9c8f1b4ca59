package mcproc

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
	"time"
)

// Serve is a process's main loop: it reads the Config from the first line
// of in, runs the replica or the client it describes (answering Ready on
// out once it runs), serves requests until in ends, closes everything and
// returns. Event lines go to out as they happen.
func Serve(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	if !sc.Scan() {
		return fmt.Errorf("mcproc: serve: no config line: %w", errors.Join(sc.Err(), io.ErrUnexpectedEOF))
	}
	var cfg Config
	if err := json.Unmarshal(sc.Bytes(), &cfg); err != nil {
		return fmt.Errorf("mcproc: serve: bad config line: %w", err)
	}
	em := newEmitter(bufio.NewWriterSize(out, 64<<10))
	var err error
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
	cmd     *exec.Cmd
	pid     int
	inc     uint64
	onEvent func(*Line)

	wmu sync.Mutex
	in  io.WriteCloser
	enc *json.Encoder

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]chan Line
	gone    bool

	exited  chan struct{}
	waitErr error
}

// Spawn starts cmd (an executable that calls Serve with its stdin and
// stdout; Spawn sets both, the caller may set Stderr and Env), sends it
// cfg and waits up to timeout for it to run. onEvent (nil: none) is called
// with every event line, in the child's order, from one goroutine per
// Proc; it must not block for long (the child's writes wait for it).
func Spawn(cmd *exec.Cmd, cfg Config, onEvent func(*Line), timeout time.Duration) (*Proc, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("mcproc: spawn %s: %w", cfg.Role, err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("mcproc: spawn %s: %w", cfg.Role, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("mcproc: spawn %s: %w", cfg.Role, err)
	}
	p := &Proc{cmd: cmd, pid: cmd.Process.Pid, onEvent: onEvent, in: in, enc: json.NewEncoder(in),
		waiting: map[uint64]chan Line{}, exited: make(chan struct{})}
	ready := make(chan Line, 1)
	p.waiting[0] = ready
	go p.read(outp)
	if err := p.write(cfg); err != nil {
		p.Kill()
		return nil, fmt.Errorf("mcproc: spawn %s: send config: %w", cfg.Role, err)
	}
	select {
	case l := <-ready:
		if !l.Ready {
			p.Kill()
			return nil, fmt.Errorf("mcproc: spawn %s: %s: %w", cfg.Role, l.Err, ErrExited)
		}
		p.inc = l.ClientInc
	case <-time.After(timeout):
		p.Kill()
		return nil, fmt.Errorf("mcproc: spawn %s: not ready after %v", cfg.Role, timeout)
	}
	return p, nil
}

func (p *Proc) write(v any) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return p.enc.Encode(v)
}

// read dispatches answers by id and events to onEvent until the child's
// stdout ends, then fails every request still waiting and reaps the
// process. Lines that are not JSON (a test binary's chatter) are skipped.
func (p *Proc) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue
		}
		if l.Deliver != nil || l.Restore != nil || l.Multicast != nil || l.Outcome != nil || l.Failure != nil {
			if p.onEvent != nil {
				p.onEvent(&l)
			}
			continue
		}
		p.mu.Lock()
		ch := p.waiting[l.ID]
		delete(p.waiting, l.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- l
		}
	}
	io.Copy(io.Discard, out)
	p.mu.Lock()
	p.gone = true
	w := p.waiting
	p.waiting = nil
	p.mu.Unlock()
	for _, ch := range w {
		ch <- Line{Err: ErrExited.Error()}
	}
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.pid }

// ClientInc is a client process's incarnation (0 for a replica).
func (p *Proc) ClientInc() uint64 { return p.inc }

// Call sends a request with cmd and waits for its answer or ctx's end.
func (p *Proc) Call(ctx context.Context, cmd string) (Line, error) {
	ch := make(chan Line, 1)
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, p.pid, ErrExited)
	}
	p.nextID++
	id := p.nextID
	p.waiting[id] = ch
	p.mu.Unlock()
	if err := p.write(Request{ID: id, Cmd: cmd}); err != nil {
		p.mu.Lock()
		if p.waiting != nil {
			delete(p.waiting, id)
		}
		p.mu.Unlock()
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w (%v)", cmd, p.pid, ErrExited, err)
	}
	select {
	case l := <-ch:
		if l.Err != "" {
			if l.ID == 0 {
				return l, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, p.pid, ErrExited)
			}
			return l, fmt.Errorf("mcproc: %s at pid %d: %s", cmd, p.pid, l.Err)
		}
		return l, nil
	case <-ctx.Done():
		p.mu.Lock()
		if p.waiting != nil {
			delete(p.waiting, id)
		}
		p.mu.Unlock()
		return Line{}, fmt.Errorf("mcproc: %s at pid %d: %w", cmd, p.pid, ctx.Err())
	}
}

// Status returns a replica process's status.
func (p *Proc) Status(ctx context.Context) (Status, error) {
	l, err := p.Call(ctx, CmdStatus)
	if err != nil {
		return Status{}, err
	}
	if l.Status == nil {
		return Status{}, fmt.Errorf("mcproc: status at pid %d: answer without a status", p.pid)
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
		return LoadResult{}, fmt.Errorf("mcproc: status at pid %d: answer without load counts", p.pid)
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
		return LoadResult{}, fmt.Errorf("mcproc: stop-load at pid %d: answer without load counts", p.pid)
	}
	return *l.Load, nil
}

// Exited is closed once the process ended and was reaped, and every
// event line it wrote was handed to onEvent.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Kill is kill -9: the process dies at once, whatever it was doing. It
// returns once the process was reaped and its last lines were read.
func (p *Proc) Kill() error {
	err := p.cmd.Process.Kill()
	<-p.exited
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	return err
}

// Close ends the process cleanly (EOF on its stdin: it closes everything
// and exits) and waits up to timeout, then kills it. It returns the
// process's exit error, if any.
func (p *Proc) Close(timeout time.Duration) error {
	p.wmu.Lock()
	p.in.Close()
	p.wmu.Unlock()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("mcproc: pid %d did not exit within %v of EOF; killed", p.pid, timeout)
	}
}
