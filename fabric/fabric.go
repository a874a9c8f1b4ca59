// Package fabric opens a node of the fabric a cluster map (or any other
// description) names: the one switch over mem, shm and tcp, with one-line
// errors that say what is wrong. Callers describe the fabric with a Spec,
// usually ForMap's, and override what they know better (a tcp listen
// address, the secret, spin and timeouts).
package fabric

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
	"github.com/rdmakv/rdmakv/rdma/shm"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// Spec says which fabric to open a node of and how to reach its other
// nodes. Fields a fabric does not use are ignored.
type Spec struct {
	// Fabric is "mem" (nodes of one process: Mem), "shm" (processes of
	// one host: ShmDir, Cluster) or "tcp" (hosts: Listen, Addrs, Secret).
	Fabric string
	// ShmDir is the shm fabric's directory ("": /dev/shm); Cluster names
	// the shm cluster's files ([A-Za-z0-9_-]{1,64}).
	ShmDir, Cluster string
	// Listen is the tcp address the node binds; "" takes Addrs[id].
	Listen string
	// Addrs maps tcp node ids to their addresses (the node's own may be
	// among them); peers missing here can be added later (tcp.Node.SetPeer).
	Addrs map[rdma.NodeID]string
	// Secret is the tcp cluster's secret (at least tcp.MinSecret bytes).
	Secret []byte
	// Spin is the doorbell spin budget (0: rdma.DefaultSpin; negative
	// parks at once); it applies to shm and tcp, a mem node takes its
	// Fabric's.
	Spin time.Duration
	// PeerTimeout bounds how long a dead peer goes unnoticed (shm, tcp;
	// 0: the fabric's default).
	PeerTimeout time.Duration
	// Mem is the in-process fabric a mem node joins.
	Mem *mem.Fabric
}

// ErrSpec is wrapped by Open's errors about the Spec itself: an unknown
// fabric, a mem Spec without Mem, a tcp node without an address.
var ErrSpec = errors.New("fabric: bad spec")

// ForMap is the Spec of m's fabric. A mem map needs Mem set, a tcp one
// Secret (a map does not carry it).
func ForMap(m *cluster.Map) Spec {
	return Spec{Fabric: m.Fabric, ShmDir: m.ShmDir, Cluster: m.Name, Addrs: m.Addrs}
}

// Open opens node id of the fabric s names. Its errors are one line naming
// the problem; they wrap the fabric's (shm.ErrNodeInUse,
// syscall.EADDRINUSE, tcp.ErrOptions...) and ErrSpec.
func Open(s Spec, id rdma.NodeID) (rdma.Node, error) {
	switch s.Fabric {
	case "mem":
		if s.Mem == nil {
			return nil, specError("fabric mem: node %d lives in one process's mem.Fabric: give that, or a node opened on it", id)
		}
		n, err := s.Mem.NewNode(id)
		if err != nil {
			return nil, fmt.Errorf("open the mem node %d: %w", id, err)
		}
		return n, nil
	case "shm":
		n, err := shm.Open(id, shm.Options{Dir: s.ShmDir, Cluster: s.Cluster, Spin: s.Spin, PeerTimeout: s.PeerTimeout})
		switch {
		case errors.Is(err, shm.ErrNodeInUse):
			return nil, fmt.Errorf("node %d already runs in a live process on this host (%w)", id, err)
		case err != nil:
			return nil, fmt.Errorf("open the shm node %d: %w", id, err)
		}
		return n, nil
	case "tcp":
		listen := s.Listen
		if listen == "" {
			listen = s.Addrs[id]
		}
		if listen == "" {
			return nil, specError("fabric tcp: no address for node %d (neither a listen address nor one in the addresses %v)", id, s.Addrs)
		}
		n, err := tcp.Open(id, tcp.Options{Listen: listen, Peers: s.Addrs, Secret: s.Secret, Spin: s.Spin, PeerTimeout: s.PeerTimeout})
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			return nil, &shortError{fmt.Sprintf("listen on %s: the address is in use (by another process?)", listen), err}
		case errors.Is(err, tcp.ErrOptions):
			return nil, fmt.Errorf("open the tcp node %d: %w", id, err)
		case err != nil:
			return nil, fmt.Errorf("listen on %s: %w", listen, err)
		}
		return n, nil
	case "":
		return nil, specError("no fabric named (want mem, shm or tcp)")
	}
	return nil, specError("unknown fabric %q (want mem, shm or tcp)", s.Fabric)
}

func specError(format string, args ...any) error {
	return &shortError{fmt.Sprintf(format, args...), ErrSpec}
}

// shortError says msg and wraps err without repeating it.
type shortError struct {
	msg string
	err error
}

func (e *shortError) Error() string { return e.msg }
func (e *shortError) Unwrap() error { return e.err }
