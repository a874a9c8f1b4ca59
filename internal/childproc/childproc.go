// Package childproc is the mechanism shared by the packages that drive a
// child process with JSON lines (internal/groupproc, internal/mcproc): the
// child reads a config from the first line of its stdin and then requests,
// one a line, and answers on stdout, one a line, each answer carrying the
// id of its request (0 for the first line, which says whether it runs).
//
// Proc is the parent's side: it spawns the child, reads its lines in one
// goroutine, matches answers to requests by id, and ends the child by EOF
// on its stdin or by kill -9. ReadConfig begins the child's side.
//
// It is also the one way a binary becomes a child: Start sets Env to the
// child's kind (Options.Kind), and a binary that calls ServeIfChild first
// (in init, or a test binary's TestMain) hands its stdin and stdout to the
// entry registered for that kind (Register: "kv" by internal/server,
// "kv-test" by internal/kvproc, "bcast-test" by internal/groupproc,
// "mc-test" by internal/mcproc, and a harness's own).
package childproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"sync"
	"time"
)

// Env, in a process's environment, makes it a child of the kind it names.
const Env = "RDMAKV_CHILD"

var (
	kindsMu sync.Mutex
	kinds   = map[string]func(in io.Reader, out io.Writer) error{}
)

// Register makes serve the entry of children of kind (from the init of
// the package that serves them). A kind registered twice panics.
func Register(kind string, serve func(in io.Reader, out io.Writer) error) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, ok := kinds[kind]; ok {
		panic("childproc: kind " + kind + " registered twice")
	}
	kinds[kind] = serve
}

// Kind is the kind of child this process was started as, "" if none.
func Kind() string { return os.Getenv(Env) }

// Serve runs this process's child entry (Kind's) on stdin and stdout.
func Serve() error {
	kind := Kind()
	kindsMu.Lock()
	serve := kinds[kind]
	var known []string
	for k := range kinds {
		known = append(known, k)
	}
	kindsMu.Unlock()
	if serve == nil {
		sort.Strings(known)
		return fmt.Errorf("childproc: this binary serves no child of kind %q (it serves %v)", kind, known)
	}
	return serve(os.Stdin, os.Stdout)
}

// ServeIfChild returns at once in a process that is not a child; in a
// child it runs Serve and exits (status 1, with the error on stderr, if
// it failed).
func ServeIfChild() {
	if Kind() == "" {
		return
	}
	if err := Serve(); err != nil {
		fmt.Fprintf(os.Stderr, "%s child: %v\n", Kind(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ReadConfig returns a scanner of the lines of in (the requests) after it
// decoded the first line into cfg.
func ReadConfig(in io.Reader, cfg any) (*bufio.Scanner, error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("serve: no config line: %w", errors.Join(sc.Err(), io.ErrUnexpectedEOF))
	}
	if err := json.Unmarshal(sc.Bytes(), cfg); err != nil {
		return nil, fmt.Errorf("serve: bad config line: %w", err)
	}
	return sc, nil
}

// Options describe the child's lines, of type L.
type Options[L any] struct {
	// Kind, if set, is the child's kind: Start sets Env to it in cmd's
	// environment (os.Environ() if cmd.Env is nil).
	Kind string
	// Name begins Close's error message (e.g. "groupproc: member").
	Name string
	// MaxLine is the longest line read from the child.
	MaxLine int
	// ID returns the id of the request a line answers.
	ID func(*L) uint64
	// Event, if set, is offered every line first, in the child's order,
	// from the reading goroutine; it returns whether the line was an event
	// it took (not an answer).
	Event func(*L) bool
	// Exited is the line every request still waiting receives when the
	// child's stdout ends.
	Exited L
	// Drain: once a line cannot be read (too long), read the rest of the
	// child's stdout and discard it rather than stop reading.
	Drain bool
}

// Proc is the parent's handle on a child process.
type Proc[L any] struct {
	o   Options[L]
	cmd *exec.Cmd
	pid int

	wmu sync.Mutex // serialises writes to in
	in  io.WriteCloser
	enc *json.Encoder

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]chan L
	gone    bool

	exited  chan struct{} // closed once the process was waited for
	waitErr error
}

// Start starts cmd (Start sets its stdin and stdout; the caller may set
// Stderr and Env), sends it cfg and waits up to timeout for its first line
// (id 0), which it returns: o.Exited if the child's stdout ended first.
// If the config could not be sent or no line came in time, the process
// was killed.
func Start[L any](cmd *exec.Cmd, cfg any, timeout time.Duration, o Options[L]) (*Proc[L], L, error) {
	var zero L
	if o.Kind != "" {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, Env+"="+o.Kind)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, zero, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, zero, err
	}
	if err := cmd.Start(); err != nil {
		return nil, zero, err
	}
	p := &Proc[L]{o: o, cmd: cmd, pid: cmd.Process.Pid, in: in, enc: json.NewEncoder(in),
		waiting: map[uint64]chan L{}, exited: make(chan struct{})}
	ready := make(chan L, 1)
	p.waiting[0] = ready
	go p.read(outp)
	if err := p.write(cfg); err != nil {
		p.Kill()
		return nil, zero, fmt.Errorf("send config: %w", err)
	}
	select {
	case l := <-ready:
		return p, l, nil
	case <-time.After(timeout):
		p.Kill()
		return nil, zero, fmt.Errorf("not ready after %v", timeout)
	}
}

func (p *Proc[L]) write(v any) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return p.enc.Encode(v)
}

// read dispatches events and answers by id until the child's stdout ends,
// then fails every request still waiting with o.Exited and reaps the
// process. Lines that are not JSON are skipped.
func (p *Proc[L]) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), p.o.MaxLine)
	for sc.Scan() {
		var l L
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue
		}
		if p.o.Event != nil && p.o.Event(&l) {
			continue
		}
		id := p.o.ID(&l)
		p.mu.Lock()
		ch := p.waiting[id]
		delete(p.waiting, id)
		p.mu.Unlock()
		if ch != nil {
			ch <- l
		}
	}
	if p.o.Drain {
		io.Copy(io.Discard, out)
	}
	p.mu.Lock()
	p.gone = true
	w := p.waiting
	p.waiting = nil
	p.mu.Unlock()
	for _, ch := range w {
		ch <- p.o.Exited
	}
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// Pid is the process's id.
func (p *Proc[L]) Pid() int { return p.pid }

// Send writes the request mk returns for a fresh id and returns that id
// and where the answer will arrive (o.Exited if the process ends first).
// If the process has already ended, the channel is nil. If the write
// fails, Send returns its error; the request no longer waits, and unless
// its answer or o.Exited already arrived, the channel receives failed(err)
// (nothing if failed is nil).
func (p *Proc[L]) Send(mk func(id uint64) any, failed func(error) L) (uint64, <-chan L, error) {
	ch := make(chan L, 1)
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return 0, nil, nil
	}
	p.nextID++
	id := p.nextID
	p.waiting[id] = ch
	p.mu.Unlock()
	err := p.write(mk(id))
	if err != nil {
		p.mu.Lock()
		if p.waiting[id] == ch {
			delete(p.waiting, id)
			if failed != nil {
				ch <- failed(err)
			}
		}
		p.mu.Unlock()
	}
	return id, ch, err
}

// Forget stops waiting for the answer to request id.
func (p *Proc[L]) Forget(id uint64) {
	p.mu.Lock()
	delete(p.waiting, id)
	p.mu.Unlock()
}

// Exited is closed once the process ended and was reaped, and every line
// it wrote was read.
func (p *Proc[L]) Exited() <-chan struct{} { return p.exited }

// Kill is kill -9: the process dies at once, whatever it was doing. It
// returns once the process was reaped and its last lines were read.
func (p *Proc[L]) Kill() error {
	err := p.cmd.Process.Kill()
	<-p.exited
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	return err
}

// Close ends the process cleanly (EOF on its stdin) and waits up to
// timeout, then kills it. It returns the process's exit error, if any.
func (p *Proc[L]) Close(timeout time.Duration) error {
	p.wmu.Lock()
	p.in.Close()
	p.wmu.Unlock()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s pid %d did not exit within %v of EOF; killed", p.o.Name, p.pid, timeout)
	}
}
