package multicast

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// recConn is an rdma.Conn that records what is posted on it; its ops
// complete when the test says (done).
type recConn struct {
	peer    rdma.NodeID
	posts   int         // Post calls
	lists   [][]rdma.WR // PostList calls, copied
	bufs    [][]byte    // every posted write's bytes, copied at post time, in order
	pending []uint64    // ids posted, not yet completed
	failAt  int         // PostList refuses the list's wr at this index (-1: never)
	failErr error       // with this error (nil: rdma.ErrQueueFull)
	hold    bool        // Poll completes nothing
}

func (c *recConn) Local() rdma.NodeID { return 1 }
func (c *recConn) Peer() rdma.NodeID  { return c.peer }
func (c *recConn) Post(wr rdma.WR) error {
	c.posts++
	c.take(wr)
	return nil
}

func (c *recConn) PostList(wrs []rdma.WR) (int, error) {
	cp := append([]rdma.WR(nil), wrs...)
	c.lists = append(c.lists, cp)
	for i, wr := range wrs {
		if i == c.failAt {
			if c.failErr != nil {
				return i, c.failErr
			}
			return i, rdma.ErrQueueFull
		}
		c.take(wr)
	}
	return len(wrs), nil
}

func (c *recConn) take(wr rdma.WR) {
	c.bufs = append(c.bufs, append([]byte(nil), wr.Buf...))
	c.pending = append(c.pending, wr.ID)
}

func (c *recConn) Poll(cs []rdma.Completion) int {
	if len(c.pending) == 0 || c.hold {
		return 0
	}
	cs[0] = rdma.Completion{ID: c.pending[len(c.pending)-1], Kind: rdma.OpWrite}
	c.pending = nil
	return 1
}
func (c *recConn) Wait(cs []rdma.Completion, _ time.Duration) int { return c.Poll(cs) }
func (c *recConn) Outstanding() int                               { return len(c.pending) }
func (c *recConn) Err() error                                     { return nil }
func (c *recConn) Close() error                                   { return nil }

// recNode is an rdma.Node whose Connect returns its recConn.
type recNode struct {
	rdma.Node // nil: only ID, Connect and Doorbell are called
	c         *recConn
}

func (n *recNode) ID() rdma.NodeID                        { return 1 }
func (n *recNode) Connect(rdma.NodeID) (rdma.Conn, error) { return n.c, nil }
func (n *recNode) Doorbell() rdma.Doorbell                { return rdma.NewLocalDoorbell(0) }

// testPeer is a peer whose Conn is c (already up).
func testPeer(c *recConn, stage int) *peer {
	p := newPeer(&recNode{c: c}, c.peer, stage, time.Millisecond, time.Millisecond)
	if !p.link.Up(0) {
		panic("test peer not up")
	}
	return p
}

// TestRepliesOneListPerClient: the replies one Poll produced for one
// client node (and a hello) go out as one PostList with one Notify, on
// its last write; each write carries the reply a client decodes at its
// slot, and the replies of another client node go out in their own list.
func TestRepliesOneListPerClient(t *testing.T) {
	tr, err := tree.Parse("0:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1}, {2}}, ClientNodes: []rdma.NodeID{9, 10, 9},
		ClientSlots: 4, MaxResult: 16}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c9, c10 := &recConn{peer: 9, failAt: -1}, &recConn{peer: 10, failAt: -1}
	p9, p10 := testPeer(c9, 4096), testPeer(c10, 4096)
	r := &Replica{cfg: cfg, g: 0, clients: map[rdma.NodeID]*peer{9: p9, 10: p10},
		rbuf: make([]byte, replySlot(cfg.MaxResult))}
	p9.busy, p10.busy = &r.busy, &r.busy // as New wires them: sendReplies flushes the peers it queued on
	r.st = newState(&r.cfg, nopFSM{}, &r.knobs)
	r.st.onReply = func(_ uint32, slot int) { r.replyQ = append(r.replyQ, slot) }
	r.st.onHello = func(c uint32) { r.helloQ = append(r.helloQ, c) }
	addr := []Addr{{Node: 9, Region: 100}, {Node: 10, Region: 200}, {Node: 9, Region: 300}}
	for c := range addr {
		r.st.reset(uint32(c), 5, addr[c])
	}
	// one Apply pass: client 0 gets three replies, client 1 one, client 2 (node 9 too) two
	type sent struct {
		c   uint32
		seq uint64
	}
	var want []sent
	for _, m := range []sent{{0, 1}, {1, 1}, {0, 2}, {2, 1}, {0, 3}, {2, 2}} {
		r.st.remember(MsgID{Client: m.c, Inc: 5, Seq: m.seq}, addr[m.c], uint64(len(want)+1), []byte(fmt.Sprintf("r%d.%d", m.c, m.seq)))
		want = append(want, m)
	}
	if !r.sendReplies() {
		t.Fatal("sendReplies reported no progress")
	}
	if len(r.replyQ) != 0 || len(r.helloQ) != 0 {
		t.Fatalf("queues not emptied: %d replies, %d hellos", len(r.replyQ), len(r.helloQ))
	}
	// node 9: 5 replies + 2 hellos; node 10: 1 reply + 1 hello
	for _, tc := range []struct {
		c      *recConn
		writes int
	}{{c9, 7}, {c10, 2}} {
		if tc.c.posts != 0 || len(tc.c.lists) != 1 {
			t.Fatalf("node %d: %d Posts and %d PostLists, want the replies of one pass in one PostList", tc.c.peer, tc.c.posts, len(tc.c.lists))
		}
		l := tc.c.lists[0]
		if len(l) != tc.writes {
			t.Fatalf("node %d: a list of %d writes, want %d", tc.c.peer, len(l), tc.writes)
		}
		for i, wr := range l {
			if got, last := wr.Flags&rdma.Notify != 0, i == len(l)-1; got != last {
				t.Fatalf("node %d: write %d of %d has Notify %v: want one doorbell ring, on the last write", tc.c.peer, i, len(l), got)
			}
		}
	}
	// every reply is in its client's list, at its slot, decodable
	w := cfg.ClientSlots
	rs := replySlot(cfg.MaxResult)
	for _, m := range want {
		conn := map[rdma.NodeID]*recConn{9: c9, 10: c10}[addr[m.c].Node]
		off := uint64(int(m.seq%uint64(w)) * rs)
		found := false
		for i, wr := range conn.lists[0] {
			if wr.Region != addr[m.c].Region || wr.Offset != off || len(conn.bufs[i]) < replyHdr+8 {
				continue
			}
			rp, ok := decodeReply(conn.bufs[i], 0, 5, m.seq)
			if ok && string(rp.result) == fmt.Sprintf("r%d.%d", m.c, m.seq) {
				found = true
			}
		}
		if !found {
			t.Fatalf("reply c%d#%d not written at region %d offset %d", m.c, m.seq, addr[m.c].Region, off)
		}
	}
	if r.ctr.Replies != uint64(len(want)) {
		t.Fatalf("Counters.Replies %d, want %d", r.ctr.Replies, len(want))
	}
}

// TestPeerQueue: queued writes are staged apart from each other and from
// what is in flight, and kept until flush posts them as one list; a stage
// that fills posts what is queued and reaps before it refuses; a write
// after queued ones posts them with it, in staging order, as one list; a
// Conn whose send queue refuses part of a list keeps the rest for the next
// flush, and one that fails fails the peer and counts the writes not
// posted as dropped.
func TestPeerQueue(t *testing.T) {
	c := &recConn{peer: 9, failAt: -1}
	p := testPeer(c, 64)
	// stage ring of 64 bytes: two 24-byte writes fit, a third needs a completion
	a, b, d := bytes.Repeat([]byte{1}, 24), bytes.Repeat([]byte{2}, 24), bytes.Repeat([]byte{3}, 24)
	if !p.queue(0, 7, 0, a) || !p.queue(0, 7, 24, b) {
		t.Fatal("queue refused with room in the stage")
	}
	p.poll(0) // nothing in flight: must not free the stage under the queued writes
	if p.link.Queued() != 2 || c.posts+len(c.lists) != 0 {
		t.Fatalf("after queueing two writes and a poll: %d queued, %d posts, %d lists; want 2 queued, nothing posted", p.link.Queued(), c.posts, len(c.lists))
	}
	c.hold = true // nothing completes
	if p.queue(0, 7, 48, d) {
		t.Fatal("a third 24-byte write queued in a 64-byte stage whose two writes are not complete")
	}
	if p.dropped != 1 || len(c.lists) != 1 || len(c.lists[0]) != 2 || c.lists[0][1].Flags&rdma.Notify == 0 {
		t.Fatalf("full stage: dropped %d, lists %d: want the queued two posted as one list, Notify on the last, the third dropped", p.dropped, len(c.lists))
	}
	if !bytes.Equal(c.bufs[0], a) || !bytes.Equal(c.bufs[1], b) || c.lists[0][0].ID+1 != c.lists[0][1].ID {
		t.Fatalf("posted %v with ids %d, %d: want the queued writes in order, consecutive ids", c.bufs, c.lists[0][0].ID, c.lists[0][1].ID)
	}
	c.hold = false
	if !p.queue(0, 7, 48, d) { // the stage is full until the two complete: queue reaps them
		t.Fatal("queue refused though the writes in flight complete")
	}
	// write posts the queued write and its own, in one list, one Notify
	if !p.write(0, 7, 0, a, true) {
		t.Fatal("write refused")
	}
	if len(c.lists) != 2 || c.posts != 0 || !bytes.Equal(c.bufs[2], d) || !bytes.Equal(c.bufs[3], a) {
		t.Fatalf("%d lists, %d posts, bufs %v: want the queued write posted before the written one, one list", len(c.lists), c.posts, c.bufs)
	}
	if l := c.lists[1]; len(l) != 2 || l[0].ID+1 != l[1].ID || l[0].Flags&rdma.Notify != 0 || l[1].Flags&rdma.Notify == 0 {
		t.Fatalf("list %+v: want the queued write then the written one, Notify on the last only", l)
	}
	p.poll(0)
	// a full send queue refusing the second write of a list: kept for the next flush
	c.failAt = 1
	p.queue(0, 7, 0, a)
	p.queue(0, 7, 24, b)
	if n := p.flush(0); n != 1 || p.link.Queued() != 1 || !p.link.IsUp() {
		t.Fatalf("flush cut short by a full send queue: posted %d, %d queued, up %v; want 1, 1, up", n, p.link.Queued(), p.link.IsUp())
	}
	c.failAt = -1
	if n := p.flush(0); n != 1 || !bytes.Equal(c.bufs[len(c.bufs)-1], b) {
		t.Fatalf("the next flush posted %d, last bytes %v: want the kept write", n, c.bufs[len(c.bufs)-1])
	}
	p.poll(0)
	// a Conn failing the second write of a list: the peer fails, that write dropped
	c.failAt, c.failErr = 1, rdma.ErrConnBroken
	dropped := p.dropped
	p.queue(0, 7, 0, a)
	p.queue(0, 7, 24, b)
	if n := p.flush(0); n != 1 {
		t.Fatalf("flush posted %d, want 1", n)
	}
	if p.link.IsUp() || !errors.Is(p.err, rdma.ErrConnBroken) || p.fails != 1 {
		t.Fatalf("peer not failed by a refused list: up %v, err %v, fails %d", p.link.IsUp(), p.err, p.fails)
	}
	if p.dropped != dropped+1 || p.link.Queued() != 0 {
		t.Fatalf("after a refused list: dropped %d (was %d), %d queued", p.dropped, dropped, p.link.Queued())
	}
}
