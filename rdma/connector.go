package rdma

import "sync"

// BlockingConnector is a Node whose Connect may block for long: the tcp
// fabric dials and authenticates, and waits up to its peer timeout for a
// peer that is down, stopped or cut off. A polled protocol must not wait
// there (its group would stall behind one dead member): it opens its
// Conns through a Connector, which connects such a node's Conns in the
// background.
type BlockingConnector interface {
	ConnectBlocks() bool
}

// Connector opens Conns to one peer for a poller without blocking it.
// On a node whose Connect is immediate (mem, shm: every Node but a
// BlockingConnector) Connect calls Node.Connect directly, so a
// deterministic simulation stays deterministic. On a blocking one, the
// first Connect starts Node.Connect on a goroutine and reports it in
// progress; the goroutine rings the node's Doorbell when it is done, and
// a later Connect returns its result. Use from one goroutine (the
// poller's); Close from any.
type Connector struct {
	node  Node
	peer  NodeID
	async bool

	mu      sync.Mutex
	running bool
	done    bool
	conn    Conn
	err     error
	closed  bool
}

// NewConnector returns a Connector to peer on node.
func NewConnector(node Node, peer NodeID) *Connector {
	bc, ok := node.(BlockingConnector)
	return &Connector{node: node, peer: peer, async: ok && bc.ConnectBlocks()}
}

// Connect returns a new Conn (ok, err nil), Node.Connect's error (ok,
// err set), or ok false while a background connect is under way.
func (c *Connector) Connect() (conn Conn, err error, ok bool) {
	if !c.async {
		conn, err = c.node.Connect(c.peer)
		return conn, err, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed, true
	}
	if c.done {
		conn, err = c.conn, c.err
		c.done, c.conn, c.err = false, nil, nil
		return conn, err, true
	}
	if !c.running {
		c.running = true
		go c.run()
	}
	return nil, nil, false
}

func (c *Connector) run() {
	conn, err := c.node.Connect(c.peer)
	c.mu.Lock()
	c.running = false
	if c.closed {
		c.mu.Unlock()
		if conn != nil {
			conn.Close()
		}
		return
	}
	c.done, c.conn, c.err = true, conn, err
	c.mu.Unlock()
	c.node.Doorbell().Ring()
}

// Close abandons the Connector: a Conn connected in the background and
// not yet returned is closed.
func (c *Connector) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	c.done = false
}
