package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// clusterConfig tells a peer process how to open its node of the fabric
// under test and reach the initiator's.
type clusterConfig struct {
	Fabric string        `json:"fabric"`
	Mode   string        `json:"mode"`           // "spin" or "park"
	Spin   time.Duration `json:"spin"`           // the fabric's Options.Spin
	Dir    string        `json:"dir,omitempty"`  // shm: region directory
	Name   string        `json:"name,omitempty"` // shm: cluster name
	Secret []byte        `json:"secret,omitempty"`
	Addr   string        `json:"addr,omitempty"` // tcp: the initiator's listen address
}

// fabricSpin is the doorbell spin budget a fabric is opened with. In spin
// mode the benchmark polls memory itself and never waits in the doorbell,
// so the default is kept; in park mode the doorbell parks at once unless
// --park-spin asks for a spin phase, so that park-mode figures measure
// wake-ups and not spinning.
func fabricSpin(mode string, parkSpin time.Duration) time.Duration {
	if mode != "park" {
		return 0
	}
	if parkSpin <= 0 {
		return -1
	}
	return parkSpin
}

// placement says where a fabric's two nodes run during the benchmark.
func placement(fabric string) string {
	if fabric == "mem" {
		return "goroutines"
	}
	return "processes"
}

// openNode opens node id of a multi-process fabric in this process and
// returns its address if it has one (tcp nodes listen on a loopback port
// of their own and know the initiator's address, if cfg has it).
func openNode(cfg *clusterConfig, id rdma.NodeID) (rdma.Node, string, error) {
	s := fabric.Spec{Fabric: cfg.Fabric, ShmDir: cfg.Dir, Cluster: cfg.Name, Listen: "127.0.0.1:0", Secret: cfg.Secret, Spin: cfg.Spin}
	if cfg.Addr != "" {
		s.Addrs = map[rdma.NodeID]string{initiatorID: cfg.Addr}
	}
	n, err := fabric.Open(s, id)
	if err != nil {
		return nil, "", err
	}
	if t, ok := n.(*tcp.Node); ok {
		return n, t.Addr(), nil
	}
	return n, "", nil
}

// openSession opens the fabric's two nodes: the initiator here, the target
// in a peer (a goroutine for mem, a child process otherwise).
func openSession(fabric, mode string, o *fabricFlags) (*session, error) {
	spin := fabricSpin(mode, o.parkSpin)
	s := &session{fabric: fabric, park: mode == "park"}
	switch fabric {
	case "mem":
		f := mem.New(mem.Options{Spin: spin})
		a, err := f.NewNode(initiatorID)
		if err != nil {
			return nil, err
		}
		b, err := f.NewNode(targetID)
		if err != nil {
			a.Close()
			return nil, err
		}
		bc, err := b.Connect(initiatorID)
		if err != nil {
			a.Close()
			b.Close()
			return nil, err
		}
		s.node = a
		s.peer = &localPeer{t: &target{node: b, conn: bc, ww: &wordWriter{c: bc}, park: s.park}}
		s.close = a.Close
	case "shm", "tcp":
		if err := s.openProcs(fabric, mode, spin, o.shmDir); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown fabric %q", fabric)
	}
	c, err := s.node.Connect(targetID)
	if err != nil {
		s.shutdown()
		return nil, fmt.Errorf("%s: connect node %d to %d: %w", fabric, initiatorID, targetID, err)
	}
	s.conn, s.ww = c, &wordWriter{c: c}
	return s, nil
}

// openProcs opens the initiator's node here and the target's in a child
// process: shm nodes find each other in a fresh directory, tcp nodes
// exchange their loopback addresses.
func (s *session) openProcs(fabric, mode string, spin time.Duration, shmDir string) error {
	cfg := &clusterConfig{Fabric: fabric, Mode: mode, Spin: spin}
	var cleanup []func() error
	undo := func() error {
		var err error
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
		return err
	}
	switch fabric {
	case "shm":
		wd, err := workDir(shmDir)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp(wd, "fabric-")
		if err != nil {
			return fmt.Errorf("shm: cluster directory: %w", err)
		}
		cleanup = append(cleanup, func() error { return os.RemoveAll(dir) })
		cfg.Dir, cfg.Name = dir, "kvbench"
	case "tcp":
		cfg.Secret = make([]byte, 32)
		rand.Read(cfg.Secret)
	}
	n, addr, err := openNode(cfg, initiatorID)
	if err != nil {
		undo()
		return err
	}
	s.node, cfg.Addr = n, addr
	cleanup = append(cleanup, s.node.Close)
	p, err := startPeer()
	if err != nil {
		undo()
		return err
	}
	cleanup = append(cleanup, p.close)
	r, err := callOK(p, request{Cmd: "open", Cluster: cfg})
	if err != nil {
		undo()
		return err
	}
	if tn, ok := s.node.(*tcp.Node); ok {
		tn.SetPeer(targetID, r.Addr)
	}
	// The peer is closed first, by shutdown; then the rest.
	cleanup = cleanup[:len(cleanup)-1]
	s.peer, s.close = p, undo
	return nil
}

// shutdown closes the peer, then the initiator's node and resources.
func (s *session) shutdown() error {
	var err error
	if s.peer != nil {
		err = s.peer.close()
	}
	if s.conn != nil {
		s.conn.Close()
	}
	if s.close != nil {
		if cerr := s.close(); err == nil {
			err = cerr
		}
	}
	return err
}
