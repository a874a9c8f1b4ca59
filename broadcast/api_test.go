package broadcast

import (
	"bytes"
	"fmt"
	"strings"
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

// TestLeading: Leading is false at followers, false at a new leader until
// its epoch's diff committed (and already true when EventEpochCommitted
// is reported, so that OnEvent may Append), true then, and false again
// once the leader is deposed, while the new leader reports its epoch.
func TestLeading(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	var atEvent []string
	for _, n := range c.nodes {
		n.r.cfg.OnEvent = func(ev Event) {
			if ev.Kind == EventEpochCommitted && ev.Epoch.Leader() == n.id {
				e, ok := n.r.Leading()
				atEvent = append(atEvent, fmt.Sprintf("%d %v %v", n.id, e, ok))
			}
		}
	}
	leading := func(id rdma.NodeID) (Epoch, bool) { return c.get(id).r.Leading() }
	c.settle(nil)
	for _, n := range c.nodes {
		if e, ok := n.r.Leading(); ok {
			t.Fatalf("node %d leads %v before any election", n.id, e)
		}
	}
	// Node 1 wins: Leading stays false until its diff committed.
	c.get(1).r.startElection(true)
	sawLeader := false
	for i := 0; i < 100; i++ {
		c.pollAll()
		if c.get(1).r.Status().Role == Leader && c.get(1).r.Status().Committed.E != c.get(1).r.Status().ECur {
			sawLeader = true
			if e, ok := leading(1); ok {
				t.Fatalf("node 1 reports Leading %v before its diff committed", e)
			}
		}
		if _, ok := leading(1); ok {
			break
		}
		c.deliver(nil)
	}
	if !sawLeader {
		t.Fatal("never saw node 1 as a leader whose diff had not committed")
	}
	c.settle(nil)
	e1, ok := leading(1)
	if !ok || e1 != c.get(1).r.Status().ECur || e1.Leader() != 1 {
		t.Fatalf("node 1: Leading %v %v after its diff committed, status %+v", e1, ok, c.get(1).r.Status())
	}
	for _, id := range []rdma.NodeID{2, 3} {
		if e, ok := leading(id); ok {
			t.Errorf("follower %d reports Leading %v", id, e)
		}
	}
	if want := fmt.Sprintf("1 %v true", e1); len(atEvent) != 1 || atEvent[0] != want {
		t.Errorf("Leading at EventEpochCommitted: %q, want [%q]", atEvent, want)
	}

	// Node 1 is cut off; 2 and 3 elect one of them.
	c.loseLeader(not(1), 2, 3)
	c.get(2).r.startElection(true)
	for range 5 {
		c.settle(not(1))
	}
	var e2 Epoch
	for _, id := range []rdma.NodeID{2, 3} {
		if e, ok := leading(id); ok {
			e2 = e
		}
	}
	if e2 <= e1 || e2.Leader() == 1 {
		t.Fatalf("no new leader reports Leading: %v", statuses(qreplicas(c)))
	}
	// Node 1 steps down once it has not heard a majority for an election
	// timeout, and follows node 2 when the partition heals.
	c.now += c.cfg.ElectionTimeout
	c.settle(not(1))
	if e, ok := leading(1); ok {
		t.Errorf("deposed node 1 still reports Leading %v (role %v)", e, c.get(1).r.Status().Role)
	}
	for range 5 {
		c.settle(nil)
	}
	if e, ok := leading(1); ok {
		t.Errorf("node 1 reports Leading %v after the partition healed", e)
	}
	var e3 Epoch
	for _, id := range []rdma.NodeID{2, 3} {
		if e, ok := leading(id); ok {
			e3 = e
		}
	}
	if e3 < e2 {
		t.Fatalf("no leader after the partition healed: %v", statuses(qreplicas(c)))
	}
	// Closed: false.
	c.crash(e3.Leader(), 0)
	if e, ok := leading(e3.Leader()); ok {
		t.Errorf("closed node %d reports Leading %v", e3.Leader(), e)
	}
}

// TestAppend: Append fails at followers (ErrNotLeader); at the leader it
// takes up to MaxUncommitted entries (AppendRoom counts down, then
// ErrBusy), sends them in the next Poll without a timer, and every
// replica delivers them in Append order, interleaved with proposals in
// the order the leader broadcast them. An OnEvent callback may Append at
// its epoch's first commit.
func TestAppend(t *testing.T) {
	const bound = 8
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) { cfg.MaxUncommitted = bound })
	c.settle(nil)
	var onEvent []error
	n1 := c.get(1)
	n1.r.cfg.OnEvent = func(ev Event) {
		if ev.Kind == EventEpochCommitted {
			onEvent = append(onEvent, n1.r.Append([]byte("first")))
		}
	}
	if err := n1.r.Append([]byte("x")); err != ErrNotLeader {
		t.Fatalf("Append before any election: %v, want ErrNotLeader", err)
	}
	n1.r.startElection(true)
	c.settle(nil)
	if _, ok := n1.r.Leading(); !ok || len(onEvent) != 1 || onEvent[0] != nil {
		t.Fatalf("node 1 leads: %v; Append from OnEvent: %v", ok, onEvent)
	}
	for _, id := range []rdma.NodeID{2, 3} {
		if err := c.get(id).r.Append([]byte("x")); err != ErrNotLeader {
			t.Errorf("Append at follower %d: %v, want ErrNotLeader", id, err)
		}
		if k := c.get(id).r.AppendRoom(); k != 0 {
			t.Errorf("AppendRoom at follower %d: %d", id, k)
		}
	}
	c.settle(nil)
	if err := n1.r.Append(make([]byte, n1.r.MaxProposal()+1)); err != ErrTooLarge {
		t.Errorf("oversized Append: %v, want ErrTooLarge", err)
	}
	var want []string
	for k := range bound {
		if room := n1.r.AppendRoom(); room != bound-k {
			t.Fatalf("AppendRoom %d after %d appends, want %d", room, k, bound-k)
		}
		d := fmt.Sprintf("e%d", k)
		if err := n1.r.Append([]byte(d)); err != nil {
			t.Fatalf("Append %s: %v", d, err)
		}
		want = append(want, d)
	}
	if err := n1.r.Append([]byte("over")); err != ErrBusy || n1.r.AppendRoom() != 0 {
		t.Fatalf("Append beyond MaxUncommitted: %v, room %d; want ErrBusy, 0", err, n1.r.AppendRoom())
	}
	// One Poll of the leader, at the same instant (no timer due), sends
	// them; the followers accept all of them.
	n1.r.Poll(c.now)
	c.deliver(nil)
	for _, id := range []rdma.NodeID{2, 3} {
		c.get(id).r.Poll(c.now)
		if a := c.get(id).r.Status().Accepted; a.Cnt != uint64(1+bound) {
			t.Errorf("follower %d accepted up to %v after one leader Poll, want count %d", id, a, 1+bound)
		}
	}
	c.settle(nil)
	if room := n1.r.AppendRoom(); room != bound {
		t.Errorf("AppendRoom %d once committed, want %d", room, bound)
	}
	// Appends and proposals interleave in the leader's order.
	p := n1.r.Propose([]byte("p0"))
	n1.r.Poll(c.now) // broadcasts p0
	if err := n1.r.Append([]byte("e-after-p0")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.settle(nil)
	}
	if _, err := waitProposal(t, p, "p0", 0, qreplicas(c)...); err != nil {
		t.Fatal(err)
	}
	want = append(append([]string{"first"}, want...), "p0", "e-after-p0")
	for _, n := range c.nodes {
		wantSeq(t, c, n.id, want...)
	}
}

// TestAppendLostEpoch: entries a leader appended in an epoch that ends
// before they commit are delivered by the next leader's diff (one that
// reached a member of the new majority) or lost (one that reached
// nobody), never twice, never forwarded or requeued, also when the old
// leader's stale records land after the partition heals; the deposed
// leader's Append fails.
func TestAppendLostEpoch(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, nil)
	n1, n2 := c.get(1), c.get(2)
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	c.settle(nil)
	if err := n1.r.Append([]byte("committed")); err != nil {
		t.Fatal(err)
	}
	c.settle(nil)
	// x1 reaches node 2 only; x2 is written but lands nowhere until the
	// partition heals (then in an epoch nobody accepts any more).
	if err := n1.r.Append([]byte("x1")); err != nil {
		t.Fatal(err)
	}
	n1.r.Poll(c.now)
	c.deliver(only([2]rdma.NodeID{1, 2}))
	if err := n1.r.Append([]byte("x2")); err != nil {
		t.Fatal(err)
	}
	n1.r.Poll(c.now)
	n2.r.Poll(c.now)
	if a := n2.r.Status().Accepted; a.Cnt != 2 {
		t.Fatalf("node 2 accepted %v, want count 2 (committed, x1)", a)
	}

	// Node 1 is cut off; node 2 (with x1) wins.
	c.loseLeader(not(1), 2, 3)
	n2.r.startElection(true)
	for range 5 {
		c.settle(not(1))
	}
	e2, ok := n2.r.Leading()
	if !ok {
		t.Fatalf("node 2 does not lead: %v", statuses(qreplicas(c)))
	}
	if err := n2.r.Append([]byte("y1")); err != nil {
		t.Fatal(err)
	}
	c.settle(not(1))
	// Heal: node 1 steps down, its stale records land, it follows e2.
	c.now += c.cfg.ElectionTimeout
	for range 10 {
		c.settle(nil)
	}
	if err := n1.r.Append([]byte("z")); err != ErrNotLeader {
		t.Errorf("Append at the deposed leader: %v, want ErrNotLeader", err)
	}
	if s := n1.r.Status(); s.ECur < e2 {
		t.Fatalf("node 1 did not follow %v: %+v", e2, s)
	}
	for _, n := range c.nodes {
		wantSeq(t, c, n.id, "committed", "x1", "y1")
		if s := n.r.Status(); s.Counters.Requeued != 0 {
			t.Errorf("node %d requeued %d proposals", n.id, s.Counters.Requeued)
		}
	}
}

// TestAppendFunc: AppendFunc refuses as Append does (ErrNotLeader at a
// follower, ErrTooLarge, ErrBusy) without calling fill; otherwise fill
// writes the entry in place, every replica delivers it as written (a
// whole proposal's worth included), and entries up to MaxProposal are
// carved from slabs (TestSlabReuse: reused without allocating).
func TestAppendFunc(t *testing.T) {
	const bound = 4
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) { cfg.MaxUncommitted = bound })
	c.settle(nil)
	n1 := c.get(1)
	n1.r.startElection(true)
	for range 3 {
		c.settle(nil)
	}
	called := 0
	fill := func(s string) func([]byte) {
		return func(b []byte) {
			called++
			for i := range b {
				b[i] = s[i%len(s)]
			}
		}
	}
	if err := c.get(2).r.AppendFunc(8, fill("x")); err != ErrNotLeader {
		t.Fatalf("AppendFunc at a follower: %v, want ErrNotLeader", err)
	}
	if err := n1.r.AppendFunc(n1.r.MaxProposal()+1, fill("x")); err != ErrTooLarge {
		t.Fatalf("oversized AppendFunc: %v, want ErrTooLarge", err)
	}
	if called != 0 {
		t.Fatalf("fill called %d times for refused entries", called)
	}
	big := n1.r.MaxProposal()
	var want []string
	for k := range bound {
		n := 5
		if k == 1 {
			n = big
		}
		s := fmt.Sprintf("f%d", k)
		if err := n1.r.AppendFunc(n, fill(s)); err != nil {
			t.Fatal(err)
		}
		if e, _ := n1.r.log.Max(); e.slab == nil || len(e.data) != n {
			t.Fatalf("a %d-byte entry (MaxProposal %d) is not in a slab", n, big)
		}
		want = append(want, strings.Repeat(s, n)[:n])
	}
	if err := n1.r.AppendFunc(8, fill("over")); err != ErrBusy || called != bound {
		t.Fatalf("AppendFunc beyond MaxUncommitted: %v (fill called %d times), want ErrBusy", err, called)
	}
	for range 3 {
		c.settle(nil)
	}
	for _, n := range c.nodes {
		wantSeq(t, c, n.id, want...)
	}
}
