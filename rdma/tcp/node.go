package tcp

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/internal/hostregion"
	"golang.org/x/sys/unix"
)

// Defaults of Options.
const (
	// DefaultPeerTimeout bounds how long a silent peer goes unnoticed.
	DefaultPeerTimeout = 2 * time.Second
	// DefaultMaxFrame admits a 1 MiB write or read plus its frame header.
	DefaultMaxFrame = 1<<20 + headerLen + writeFixed
	// MinSecret is the shortest accepted cluster secret, in bytes.
	MinSecret = 16
	// minMaxFrame keeps room for every fixed-size frame and a small payload.
	minMaxFrame = 256
)

// ErrOptions reports invalid Options given to Open.
var ErrOptions = errors.New("tcp: invalid options")

// Options configure a Node. Listen and Secret are required.
type Options struct {
	// Listen is the TCP address to listen on, e.g. "127.0.0.1:0".
	Listen string
	// Peers maps node ids to their listen addresses; SetPeer adds more.
	Peers map[rdma.NodeID]string
	// Secret is the cluster secret, at least MinSecret bytes. Nodes prove
	// they hold it with HMAC-SHA256 over random nonces; it never crosses
	// the wire.
	Secret []byte
	// Spin is the doorbell spin budget before parking; 0 means
	// rdma.DefaultSpin, negative parks at once.
	Spin time.Duration
	// PeerTimeout bounds dead-peer detection: a peer silent for this long
	// (keepalives are sent every PeerTimeout/4) fails every outstanding op
	// with rdma.ErrPeerDead. It also bounds Connect. Default
	// DefaultPeerTimeout.
	PeerTimeout time.Duration
	// QueueDepth bounds each Conn's outstanding ops plus unpolled
	// completions; default rdma.DefaultQueueDepth.
	QueueDepth int
	// MaxFrame is the largest frame accepted, header included; default
	// DefaultMaxFrame. Larger Reads and Writes are rejected by Post.
	MaxFrame int
}

// Node is one tcp fabric endpoint: a listener, a software RNIC applying
// peers' verbs to this node's regions, and the node's outgoing Conns.
type Node struct {
	id   rdma.NodeID
	opts Options
	ln   net.Listener
	db   *rdma.LocalDoorbell
	bell *doorbell    // db as users see it (Doorbell)
	idle atomic.Int32 // Conn readers standing aside (see Conn.standAside)
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.RWMutex
	peers   map[rdma.NodeID]string
	regions map[rdma.RegionID]*Region
	conns   map[*Conn]struct{}
	servers map[*rnic]struct{}
	closed  bool
}

var _ rdma.Node = (*Node)(nil)

// Open validates opts, listens on opts.Listen and starts node id's RNIC.
func Open(id rdma.NodeID, opts Options) (*Node, error) {
	if opts.Listen == "" {
		return nil, fmt.Errorf("%w: node %d: Listen address is required", ErrOptions, id)
	}
	if len(opts.Secret) < MinSecret {
		return nil, fmt.Errorf("%w: node %d: Secret of %d bytes, need at least %d", ErrOptions, id, len(opts.Secret), MinSecret)
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = DefaultPeerTimeout
	}
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = rdma.DefaultQueueDepth
	}
	if opts.MaxFrame == 0 {
		opts.MaxFrame = DefaultMaxFrame
	}
	if opts.MaxFrame < minMaxFrame {
		return nil, fmt.Errorf("%w: node %d: MaxFrame %d below %d", ErrOptions, id, opts.MaxFrame, minMaxFrame)
	}
	spin := opts.Spin
	switch {
	case spin == 0:
		spin = rdma.DefaultSpin
	case spin < 0:
		spin = 0
	}
	opts.Secret = append([]byte(nil), opts.Secret...)
	peers := make(map[rdma.NodeID]string, len(opts.Peers))
	for k, v := range opts.Peers {
		peers[k] = v
	}
	opts.Peers = nil
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("tcp: node %d: listen: %w", id, err)
	}
	n := &Node{
		id: id, opts: opts, ln: ln, db: rdma.NewLocalDoorbell(spin), done: make(chan struct{}),
		peers: peers, regions: make(map[rdma.RegionID]*Region),
		conns: make(map[*Conn]struct{}), servers: make(map[*rnic]struct{}),
	}
	n.bell = &doorbell{LocalDoorbell: n.db, n: n}
	n.wg.Add(2)
	go n.acceptLoop()
	go n.keepaliveLoop()
	return n, nil
}

// ID implements rdma.Node.
func (n *Node) ID() rdma.NodeID { return n.id }

// Doorbell implements rdma.Node.
func (n *Node) Doorbell() rdma.Doorbell { return n.bell }

// doorbell is the node's rdma.Doorbell: the LocalDoorbell that Notify
// writes and completions ring, whose Wait first resumes the Conn readers
// that stood aside for Conn.Wait, so that completions keep arriving while
// the node parks.
type doorbell struct {
	*rdma.LocalDoorbell
	n *Node
}

// Wait implements rdma.Doorbell.
func (d *doorbell) Wait(seq uint64, timeout time.Duration) bool {
	d.PrePark()
	return d.LocalDoorbell.Wait(seq, timeout)
}

// PrePark implements rdma.PreParker: a WaitSet over the node's doorbell
// resumes the readers before it parks, as Wait does.
func (d *doorbell) PrePark() {
	if d.n.idle.Load() > 0 {
		d.n.resumeReaders()
	}
}

// resumeReaders sends every Conn reader that stands aside back to the
// socket.
func (n *Node) resumeReaders() {
	n.mu.RLock()
	for c := range n.conns {
		c.resumeReader()
	}
	n.mu.RUnlock()
}

// Addr is the address the node listens on (with the actual port when
// Options.Listen asked for port 0).
func (n *Node) Addr() string { return n.ln.Addr().String() }

// ConnectBlocks implements rdma.BlockingConnector: Connect dials and
// authenticates, and waits up to PeerTimeout for a peer that does not
// answer, so pollers connect through an rdma.Connector.
func (n *Node) ConnectBlocks() bool { return true }

// SetPeer adds or changes the address of peer; later Connects use it.
func (n *Node) SetPeer(id rdma.NodeID, addr string) {
	n.mu.Lock()
	n.peers[id] = addr
	n.mu.Unlock()
}

// Register implements rdma.Node. Region memory comes from rdma.AllocMemory.
func (n *Node) Register(id rdma.RegionID, size int) (rdma.Region, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("tcp: node %d: register region %d: %w", n.id, id, rdma.ErrClosed)
	}
	if _, ok := n.regions[id]; ok {
		return nil, fmt.Errorf("tcp: node %d region %d: %w", n.id, id, rdma.ErrRegionExists)
	}
	hr, err := hostregion.New(id, size)
	if err != nil {
		return nil, fmt.Errorf("tcp: node %d: %w", n.id, err)
	}
	r := &Region{Region: hr, node: n}
	n.regions[id] = r
	return r, nil
}

func (n *Node) region(id rdma.RegionID) *Region {
	n.mu.RLock()
	r := n.regions[id]
	n.mu.RUnlock()
	return r
}

// Connect implements rdma.Node: it dials peer's address, authenticates
// both ways with the cluster secret and returns a Conn over that one TCP
// connection. Errors wrap rdma.ErrUnknownPeer (no address, or another node
// answers), rdma.ErrPeerDead (unreachable, silent past PeerTimeout),
// ErrAuth or ErrVersion.
func (n *Node) Connect(peer rdma.NodeID) (rdma.Conn, error) {
	n.mu.RLock()
	addr, ok := n.peers[peer]
	closed := n.closed
	n.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("tcp: node %d: connect to node %d: %w", n.id, peer, rdma.ErrClosed)
	}
	if !ok {
		return nil, fmt.Errorf("tcp: node %d: no address for node %d: %w", n.id, peer, rdma.ErrUnknownPeer)
	}
	d := net.Dialer{Timeout: n.opts.PeerTimeout}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: node %d: connect to node %d at %s: %v: %w", n.id, peer, addr, err, rdma.ErrPeerDead)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nc.SetDeadline(time.Now().Add(n.opts.PeerTimeout))
	if err := dialHandshake(nc, n.id, peer, addr, n.opts.Secret); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	c, err := newConn(n, peer, addr, nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		nc.Close()
		return nil, fmt.Errorf("tcp: node %d: connect to node %d: %w", n.id, peer, rdma.ErrClosed)
	}
	n.conns[c] = struct{}{}
	n.wg.Add(2)
	n.mu.Unlock()
	go c.readLoop()
	go c.flusher()
	return c, nil
}

func (n *Node) dropConn(c *Conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// Close implements rdma.Node: it stops listening, closes every Conn and
// incoming connection, frees every region and waits for the node's
// goroutines.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns, servers, regions := n.conns, n.servers, n.regions
	n.conns, n.servers, n.regions = map[*Conn]struct{}{}, map[*rnic]struct{}{}, map[rdma.RegionID]*Region{}
	n.mu.Unlock()
	close(n.done)
	err := n.ln.Close()
	for c := range conns {
		c.Close()
	}
	for s := range servers {
		s.sock.shutdown(unix.SHUT_RDWR)
	}
	n.wg.Wait()
	for _, r := range regions {
		if e := r.Free(); e != nil && err == nil {
			err = e
		}
	}
	n.db.Ring()
	return err
}

func (n *Node) acceptLoop() {
	defer n.wg.Done()
	for {
		nc, err := n.ln.Accept()
		if err != nil {
			select {
			case <-n.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			nc.Close()
			return
		}
		n.wg.Add(1)
		n.mu.Unlock()
		go n.accept(nc)
	}
}

// accept authenticates an incoming connection and runs its RNIC loop.
func (n *Node) accept(nc net.Conn) {
	defer n.wg.Done()
	defer nc.Close()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nc.SetDeadline(time.Now().Add(n.opts.PeerTimeout))
	peer, err := acceptHandshake(nc, n.id, n.opts.Secret)
	if err != nil {
		return
	}
	nc.SetDeadline(time.Time{})
	s := &rnic{n: n, peer: peer}
	if s.sock, err = detach(nc, &s.alive); err != nil {
		return
	}
	defer s.sock.close()
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.servers[s] = struct{}{}
	n.mu.Unlock()
	s.serve()
	n.mu.Lock()
	delete(n.servers, s)
	n.mu.Unlock()
}

// keepaliveLoop pings the peers of outgoing Conns every PeerTimeout/4 and
// breaks Conns (and drops incoming connections) whose peer went silent.
func (n *Node) keepaliveLoop() {
	defer n.wg.Done()
	tick := n.opts.PeerTimeout / 4
	t := time.NewTicker(tick)
	defer t.Stop()
	var conns []*Conn
	var servers []*rnic
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
		}
		n.mu.RLock()
		conns, servers = conns[:0], servers[:0]
		for c := range n.conns {
			conns = append(conns, c)
		}
		for s := range n.servers {
			servers = append(servers, s)
		}
		n.mu.RUnlock()
		for _, c := range conns {
			c.keepalive(tick)
		}
		for _, s := range servers {
			// Initiators ping every PeerTimeout/4; allow twice the
			// timeout before giving up on one.
			if s.alive.Swap(false) {
				s.silent = 0
			} else if s.silent += tick; s.silent >= 2*n.opts.PeerTimeout {
				s.sock.shutdown(unix.SHUT_RDWR)
			}
		}
		clear(conns)
		clear(servers)
	}
}

// Region is registered memory of a tcp node; the RNIC applies ops through
// hostregion's checked path, so once Revoke returns no op of the revoked
// peer is being applied and none will be.
type Region struct {
	*hostregion.Region
	node *Node
}

var _ rdma.Region = (*Region)(nil)

// Close implements rdma.Region: the memory is freed once no op is being
// applied to it; later ops fail with rdma.ErrNoRegion.
func (r *Region) Close() error {
	n := r.node
	n.mu.Lock()
	if n.regions[r.ID()] == r {
		delete(n.regions, r.ID())
	}
	n.mu.Unlock()
	return r.Free()
}

// HugePages implements rdma.HugePager: region memory comes from
// rdma.AllocMemory.
func (n *Node) HugePages() rdma.HugePages { return rdma.AnonHugePages() }
