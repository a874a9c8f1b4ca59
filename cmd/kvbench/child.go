package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/rdmakv/rdmakv/internal/childproc"
)

// Every child kvbench spawns but the fabric peer (peer.go) is a child of
// internal/childproc's one mechanism, re-executing kvbench with the
// child's kind in its environment: the kv replicas' process (server's
// "kv"), the broadcast members (groupproc's "bcast-test") and the
// multicast client path's replicas (kvbench's own mcastKind). init serves
// it, before main or a test binary's TestMain, so that the command table
// stays the only entry point users see; KVBENCH_PEER_CPUPROFILE=path
// profiles it (path.<pid>).
func init() {
	if childproc.Kind() == "" {
		return
	}
	childproc.Register(mcastKind, mcServe)
	stop := func() {}
	if prof := os.Getenv(peerProfileEnv); prof != "" {
		var err error
		if stop, err = startProfile(fmt.Sprintf("%s.%d", prof, os.Getpid())); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench %s child: %v\n", childproc.Kind(), err)
			os.Exit(1)
		}
	}
	err := childproc.Serve()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench %s child: %v\n", childproc.Kind(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childProc is a child kvbench process (startSelf) that is configured with
// one JSON line on its stdin and answers with JSON lines on its stdout:
// the multicast and kv commands' replicas' processes.
type childProc struct {
	what  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan []byte
}

// startChild starts the child of kind, sends it cfg and reads its lines
// (up to maxLine bytes each).
func startChild(what, kind string, args []string, cfg any, maxLine int) (*childProc, error) {
	cmd, in, out, err := startSelf(what, childproc.Env+"="+kind, args...)
	if err != nil {
		return nil, err
	}
	p := &childProc{what: what, cmd: cmd, in: in, lines: make(chan []byte, 4)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), maxLine)
		for sc.Scan() {
			p.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(p.lines)
	}()
	if err := json.NewEncoder(in).Encode(cfg); err != nil {
		p.kill()
		return nil, fmt.Errorf("configure %s: %w", what, err)
	}
	return p, nil
}

// childAnswer is a child's answer line: its Err field says it failed.
type childAnswer interface{ failure() string }

// childReply waits for p's next answer.
func childReply[R childAnswer](p *childProc, timeout time.Duration) (R, error) {
	var r R
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case b, ok := <-p.lines:
		if !ok {
			return r, errors.New("exited")
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return r, fmt.Errorf("bad answer %q: %w", b, err)
		}
		if msg := r.failure(); msg != "" {
			return r, errors.New(msg)
		}
		return r, nil
	case <-t.C:
		return r, fmt.Errorf("no answer in %v", timeout)
	}
}

func (p *childProc) pid() int { return p.cmd.Process.Pid }

// close ends the child (EOF on its stdin), killing it if it does not exit
// in 10 s.
func (p *childProc) close() error {
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit in 10 s; killed", p.what)
	}
}

func (p *childProc) kill() {
	p.in.Close()
	p.cmd.Process.Kill()
	p.cmd.Wait()
}
