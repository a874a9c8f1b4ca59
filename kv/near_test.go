package kv

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/tcp"
)

// nearTCP is a group of three tables on tcp nodes over loopback and a
// reader node (9) that knows their addresses.
type nearTCP struct {
	t      *testing.T
	secret []byte
	addrs  map[rdma.NodeID]string
	nodes  map[rdma.NodeID]*tcp.Node
	tabs   map[rdma.NodeID]*Table
	reader *tcp.Node
}

var nearMembers = []rdma.NodeID{1, 2, 3}

func newNearTCP(t *testing.T) *nearTCP {
	c := &nearTCP{t: t, secret: []byte("near-replica-test-secret"), addrs: map[rdma.NodeID]string{},
		nodes: map[rdma.NodeID]*tcp.Node{}, tabs: map[rdma.NodeID]*Table{}}
	t.Cleanup(c.close)
	for _, id := range nearMembers {
		c.start(id, "127.0.0.1:0")
	}
	rn, err := tcp.Open(9, tcp.Options{Listen: "127.0.0.1:0", Secret: c.secret, Peers: c.addrs, PeerTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.reader = rn
	return c
}

// start opens node id listening on addr, with a table that applied one
// put of "k".
func (c *nearTCP) start(id rdma.NodeID, addr string) {
	c.t.Helper()
	n, err := tcp.Open(id, tcp.Options{Listen: addr, Secret: c.secret, PeerTimeout: 2 * time.Second})
	if err != nil {
		c.t.Fatalf("node %d: %v", id, err)
	}
	tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{9}, MaxValue: 1 << 10, HeapRegionSize: 1 << 20}, n)
	if err != nil {
		n.Close()
		c.t.Fatalf("node %d's table: %v", id, err)
	}
	tb.Apply(broadcast.Entry{Index: 1, Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}})})
	c.nodes[id], c.tabs[id], c.addrs[id] = n, tb, n.Addr()
}

// stop closes node id and its table.
func (c *nearTCP) stop(id rdma.NodeID) {
	c.tabs[id].Close()
	c.nodes[id].Close()
	delete(c.tabs, id)
	delete(c.nodes, id)
}

func (c *nearTCP) close() {
	for id := range c.nodes {
		c.stop(id)
	}
	if c.reader != nil {
		c.reader.Close()
	}
}

func (c *nearTCP) get(r *GroupReader) (GetResult, error) {
	res, err := r.Get([]byte("k"), StaleOK)
	if err == nil && (!res.Found || string(res.Value) != "v") {
		err = fmt.Errorf("read %v %q, want \"v\"", res.Found, res.Value)
	}
	return res, err
}

// TestStaleOKReadsNearTCP: on the tcp fabric, where a reader's Conns are
// connected in the background, a stale-ok get of a new reader made for
// member i reads member i (its first attempt finds i's Conn still
// connecting: that is no failure of i), and so does every later one.
func TestStaleOKReadsNearTCP(t *testing.T) {
	c := newNearTCP(t)
	for near := range nearMembers {
		for k := range 3 {
			r := NewGroupReader(c.reader, 0, nearMembers, near)
			r.Timeout = 10 * time.Second // a loaded machine is no dead member
			for j := range 5 {
				res, err := c.get(r)
				if err != nil {
					t.Fatalf("reader %d near %d, get %d: %v", k, near, j, err)
				}
				if res.Member != near {
					t.Errorf("reader %d near member %d, get %d: read member %d", k, near, j, res.Member)
				}
			}
			r.Close()
		}
	}
}

// TestStaleOKReturnsNearTCP: while the reader's near member is down,
// stale-ok gets read another member; once it is up again (same address),
// they read it again.
func TestStaleOKReturnsNearTCP(t *testing.T) {
	c := newNearTCP(t)
	const near = 1
	id := nearMembers[near]
	r := NewGroupReader(c.reader, 0, nearMembers, near)
	r.Timeout = 10 * time.Second // a loaded machine is no dead member
	defer r.Close()
	if res, err := c.get(r); err != nil || res.Member != near {
		t.Fatalf("get: member %d, %v; want member %d", res.Member, err, near)
	}
	addr := c.addrs[id]
	c.stop(id)
	for j := range 5 {
		res, err := c.get(r)
		if err != nil {
			t.Fatalf("get %d with member %d down: %v", j, near, err)
		}
		if res.Member == near {
			t.Fatalf("get %d with member %d down read it", j, near)
		}
	}
	// The same address again (the listener's port may take a moment to
	// be free on a loaded machine).
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen on %s again: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.start(id, addr)
	deadline = time.Now().Add(30 * time.Second)
	for j := 0; ; j++ {
		res, err := c.get(r)
		if err != nil {
			t.Fatalf("get %d after member %d came back: %v", j, near, err)
		}
		if res.Member == near {
			t.Logf("get %d after member %d came back read it", j, near)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %d up again for 30 s, and stale-ok gets near it still read member %d", near, res.Member)
		}
		time.Sleep(time.Millisecond)
	}
	// And stay there.
	for j := range 5 {
		if res, err := c.get(r); err != nil || res.Member != near {
			t.Fatalf("get %d once back: member %d, %v; want member %d", j, res.Member, err, near)
		}
	}
}
