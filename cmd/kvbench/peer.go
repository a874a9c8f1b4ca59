package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
)

// The parent drives a peer, the other end of every two-party measurement,
// with one JSON request per line and reads one JSON reply per line. The peer
// is a re-executed kvbench (hidden subcommand peerCmd) for the shm and tcp
// fabrics and every baseline, so that both ends are separate OS processes;
// for the mem fabric it is a localPeer: the same handler called in-process.

// peerCmd is the hidden subcommand a re-executed kvbench runs.
const peerCmd = "_peer"

// peerEnv marks a re-executed process as a peer; the smoke test's TestMain
// checks it, since a test binary has no subcommands.
const peerEnv = "KVBENCH_PEER"

// request is one command to a peer.
type request struct {
	Cmd string `json:"cmd"`
	// open: the fabric node the peer opens, and how to reach the parent.
	Cluster *clusterConfig `json:"cluster,omitempty"`
	// pingpong, passive, ring: the measurement number, from which region
	// ids derive, and the ring's shape.
	K     int    `json:"k,omitempty"`
	Size  int    `json:"size,omitempty"`
	Slots int    `json:"slots,omitempty"`
	Path  string `json:"path,omitempty"` // raw-shm, raw-futex: the shared file
	Addr  string `json:"addr,omitempty"` // raw-tcp, raw-stream: where to dial
}

// reply answers a request.
type reply struct {
	Err  string `json:"err,omitempty"`
	Addr string `json:"addr,omitempty"` // open on tcp: the peer node's address
	Seen uint64 `json:"seen,omitempty"` // stop: messages the peer consumed
	Bad  uint64 `json:"bad,omitempty"`  // stop: messages that failed validation
}

// peer is the parent's handle on the other end.
type peer interface {
	call(req request) (reply, error)
	close() error
	pid() int // the peer's process id; 0 if it is this process
}

// callOK is call that turns a reply's Err into an error.
func callOK(p peer, req request) (reply, error) {
	r, err := p.call(req)
	if err == nil && r.Err != "" {
		err = fmt.Errorf("peer %s: %s", req.Cmd, r.Err)
	}
	return r, err
}

// procPeer is a peer in a child process.
type procPeer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	enc *json.Encoder
}

// startSelf re-executes this binary with args and env ("NAME=value") set, its stdin
// and stdout piped to the caller and its stderr shared (what a child
// process of a measurement is: childCmd's settings); what names the child
// in errors.
func startSelf(what, env string, args ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kvbench: find own executable: %w", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env)
	if err := childCmd(cmd); err != nil {
		return nil, nil, nil, err
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("kvbench: start %s: %w", what, err)
	}
	return cmd, in, out, nil
}

// startPeer re-executes this binary as a peer.
func startPeer() (*procPeer, error) {
	cmd, in, out, err := startSelf("peer process", peerEnv+"=1", peerCmd)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &procPeer{cmd: cmd, in: in, out: sc, enc: json.NewEncoder(in)}, nil
}

func (p *procPeer) call(req request) (reply, error) {
	if err := p.enc.Encode(req); err != nil {
		return reply{}, fmt.Errorf("kvbench: send %s to peer: %w", req.Cmd, err)
	}
	if !p.out.Scan() {
		err := p.out.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return reply{}, fmt.Errorf("kvbench: peer died during %s: %w", req.Cmd, err)
	}
	var r reply
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return reply{}, fmt.Errorf("kvbench: bad reply from peer to %s: %w", req.Cmd, err)
	}
	return r, nil
}

func (p *procPeer) pid() int { return p.cmd.Process.Pid }

func (p *procPeer) close() error {
	p.in.Close() // the peer exits on EOF
	return p.cmd.Wait()
}

// localPeer is the mem fabric's peer: a target in this process.
type localPeer struct {
	mu sync.Mutex
	t  *target
}

func (p *localPeer) call(req request) (reply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.t.handle(req), nil
}

func (p *localPeer) close() error { return p.t.shutdown() }

func (p *localPeer) pid() int { return 0 }

// peerMain is the peer process: it serves requests from stdin until EOF.
func peerMain(stdin io.Reader, stdout io.Writer) error {
	t := &target{}
	defer t.shutdown()
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	enc := json.NewEncoder(stdout)
	for sc.Scan() {
		var req request
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			r.Err = fmt.Sprintf("bad request: %v", err)
		} else {
			r = t.handle(req)
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
