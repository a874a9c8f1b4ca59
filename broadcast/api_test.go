package broadcast

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestProposalReply: FSM.Apply receives each entry's index and header (the
// same on every replica, Hdr.E the epoch whose leader ordered it), and a
// proposal resolves with the result the proposer's own FSM returned: a
// handle's Reply is a copy (the FSM reuses its buffer), a callback gets
// it during the callback; failures and nil results give nil.
func TestProposalReply(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	for _, n := range c.nodes {
		n.fsm.reply = true
	}
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.settle(nil)
	e := c.get(1).r.Status().ECur
	if e.Leader() != 1 {
		t.Fatalf("node 1 does not lead: %v", e)
	}

	pa := c.get(1).r.Propose([]byte("a")) // at the leader
	pb := c.get(2).r.Propose([]byte("b")) // forwarded by a follower
	var cbIndex uint64
	var cbResult []byte
	var cbCalls int
	c.get(3).r.ProposeFunc([]byte("c"), func(i uint64, res []byte, err error) {
		cbCalls++
		if err != nil {
			t.Errorf("c: %v", err)
		}
		cbIndex, cbResult = i, append([]byte(nil), res...)
	})
	for range 3 {
		c.settle(nil)
	}
	// More entries: the FSMs overwrite the buffer they returned results in.
	for k := range 3 {
		c.get(1).r.Propose(fmt.Appendf(nil, "more-%d", k))
	}
	for range 3 {
		c.settle(nil)
	}
	for _, tc := range []struct {
		p    *Proposal
		data string
	}{{pa, "a"}, {pb, "b"}} {
		i, err := waitProposal(t, tc.p, tc.data, 0, qreplicas(c)...)
		if err != nil {
			t.Fatalf("%s: %v", tc.data, err)
		}
		if want := fmt.Sprintf("%d %v %s", i, e, tc.data); string(tc.p.Reply()) != want {
			t.Errorf("%s: Reply %q, want %q", tc.data, tc.p.Reply(), want)
		}
	}
	if want := fmt.Sprintf("%d %v c", cbIndex, e); cbCalls != 1 || string(cbResult) != want {
		t.Errorf("c: %d callbacks, result %q, want one with %q", cbCalls, cbResult, want)
	}
	// Every replica saw the same headers, all of the leader's epoch.
	h1 := c.get(1).fsm.hdrs
	if len(h1) != 6 {
		t.Fatalf("node 1 applied %d entries, want 6", len(h1))
	}
	for k, h := range h1 {
		if h.E != e || h.Cnt != uint64(k+1) {
			t.Errorf("entry %d: header %v, want (%v,%d)", k+1, h, e, k+1)
		}
	}
	for _, id := range []rdma.NodeID{2, 3} {
		if h := c.get(id).fsm.hdrs; fmt.Sprint(h) != fmt.Sprint(h1) {
			t.Errorf("node %d headers %v, node 1 %v", id, h, h1)
		}
	}

	// Failures and nil results: Reply is nil.
	big := c.get(1).r.Propose(make([]byte, c.get(1).r.MaxProposal()+1))
	if _, err := big.Result(); err != ErrTooLarge || big.Reply() != nil {
		t.Errorf("oversized: %v, Reply %q", err, big.Reply())
	}
	for _, n := range c.nodes {
		n.fsm.reply = false
	}
	pn := c.get(1).r.Propose([]byte("nil"))
	for range 3 {
		c.settle(nil)
	}
	if _, err := waitProposal(t, pn, "nil", 0, qreplicas(c)...); err != nil || pn.Reply() != nil {
		t.Errorf("nil result: %v, Reply %q", err, pn.Reply())
	}
}

// TestReplyArena: copies stay intact as the arena moves on and are never
// nil (an empty result is not "no result").
func TestReplyArena(t *testing.T) {
	var a replyArena
	var held [][]byte
	for i := range 5000 {
		n := i % (2 * replyMaxData)
		b := bytes.Repeat([]byte{byte(i)}, n)
		d := a.copy(b)
		if d == nil || !bytes.Equal(d, b) {
			t.Fatalf("copy %d: %v", i, d)
		}
		held = append(held, d)
	}
	for i, d := range held {
		if n := i % (2 * replyMaxData); len(d) != n || n > 0 && d[n-1] != byte(i) {
			t.Fatalf("copy %d was overwritten", i)
		}
	}
}

// replyArenaAllocs is TestSlabReuse's check (make noalloc) that copying a
// small result for Proposal.Reply allocates once per chunk, not per copy.
func replyArenaAllocs(t *testing.T) {
	var a replyArena
	msg := []byte("0123456789")
	if allocs := testing.AllocsPerRun(1000, func() { a.copy(msg) }); allocs > 0.01 {
		t.Errorf("a 10-byte result copy allocates %.3f per op", allocs)
	}
}
