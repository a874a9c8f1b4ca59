package kv

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// The reader's per-member I/O on rdma.Link: how many lists, reads and
// completions a get costs, read timeouts and reconnects on the reader's
// clock, the pending rule, and background connects.

// countNode wraps a reader's node: it counts the PostList calls, work
// requests, signaled ones and Polls of its Conns, keeps the mem Conns (to
// deliver a queued fabric's ops, member by member) and notes any list
// posted to a member while ops of an earlier one are still out.
type countNode struct {
	rdma.Node
	queued                    bool // the fabric's ops complete when delivered
	mu                        sync.Mutex
	lists, posted, sig, polls int
	conns                     []*mem.Conn
	overlap                   []string // posts made while a list was out on the Conn
	blockPeer                 rdma.NodeID
	block                     chan struct{} // Connect(blockPeer) waits for it to close
}

// ConnectBlocks makes the reader's Links connect in the background, as
// on tcp, when a peer's Connect is to block.
func (n *countNode) ConnectBlocks() bool { return n.block != nil }

func (n *countNode) Connect(p rdma.NodeID) (rdma.Conn, error) {
	if n.block != nil && p == n.blockPeer {
		<-n.block
	}
	c, err := n.Node.Connect(p)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	if mc, ok := c.(*mem.Conn); ok {
		n.conns = append(n.conns, mc)
	}
	n.mu.Unlock()
	return &countConn{Conn: c, n: n}, nil
}

// deliver lands and completes every op queued to a peer other than skip.
func (n *countNode) deliver(skip rdma.NodeID) {
	if !n.queued {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		if c.Peer() != skip {
			for c.Deliver() {
			}
		}
	}
}

func (n *countNode) reset() {
	n.mu.Lock()
	n.lists, n.posted, n.sig, n.polls = 0, 0, 0, 0
	n.mu.Unlock()
}

type countConn struct {
	rdma.Conn
	n *countNode
}

func (c *countConn) PostList(wrs []rdma.WR) (int, error) {
	c.n.mu.Lock()
	c.n.lists++
	c.n.posted += len(wrs)
	for _, wr := range wrs {
		if wr.Flags&rdma.Signaled != 0 {
			c.n.sig++
		}
	}
	if mc, ok := c.Conn.(*mem.Conn); ok && c.n.queued {
		if out := mc.Pending() + mc.Landed(); out > 0 {
			c.n.overlap = append(c.n.overlap, fmt.Sprintf("a list of %d posted to node %d with %d ops of an earlier one out", len(wrs), c.Peer(), out))
		}
	}
	c.n.mu.Unlock()
	return c.Conn.PostList(wrs)
}

func (c *countConn) Poll(cs []rdma.Completion) int {
	c.n.mu.Lock()
	c.n.polls++
	c.n.mu.Unlock()
	return c.Conn.Poll(cs)
}

// linkGroup makes a group of three tables (nodes 1-3, node 1 serving epoch
// 5, all promising it) holding "k" = "v", on a mem fabric (queued: ops
// complete when the test delivers them), and a reader on node 9 made for
// member near.
func linkGroup(t *testing.T, queued bool, near int) (*GroupReader, *countNode) {
	t.Helper()
	f := mem.New(mem.Options{Queued: queued})
	for id := rdma.NodeID(1); id <= 3; id++ {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := NewTable(TableConfig{Readers: []rdma.NodeID{9}}, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tb.Close() })
		tb.Promise(5)
		if id == 1 {
			tb.SetServing(5)
		}
		tb.Apply(broadcast.Entry{Index: 1, Data: AppendRequest(nil, []Op{{Kind: OpPut, Key: []byte("k"), Value: []byte("v")}})})
	}
	rn, err := f.NewNode(9)
	if err != nil {
		t.Fatal(err)
	}
	cn := &countNode{Node: rn, queued: queued}
	r := NewGroupReader(cn, 0, []rdma.NodeID{1, 2, 3}, near)
	t.Cleanup(r.Close)
	return r, cn
}

// drive runs a get on the reader's clock: each pass polls at *now, then
// delivers the ops to every member but skip, then calls step (which may
// move the clock). It fails the test if the get takes over 10000 passes.
func drive(t *testing.T, r *GroupReader, n *countNode, mode Consistency, now *time.Duration, skip rdma.NodeID, step func()) (GetResult, error) {
	t.Helper()
	r.Begin([]byte("k"), mode)
	for i := 0; !r.Poll(*now); i++ {
		if i > 10000 {
			t.Fatalf("%v get not done after %d passes (state %d, last cause %v)", mode, i, r.st, r.lastErr)
		}
		n.deliver(skip)
		if step != nil {
			step()
		}
	}
	return r.Result()
}

// TestReaderOpsPerGet pins what a get costs on the reader's Links: per
// stale-ok get (fresh header) 2 PostLists, 4 reads, 2 of them signaled and
// 2 Polls; per linearizable get of 3 members (leader known) 3 PostLists,
// 5 reads, 3 signaled and 3 Polls. These are the counts of the reader
// before it moved onto rdma.Link (main at 6a1aa0a, measured with this
// wrapper): one list per member per round, only each list's last read
// signaled, and one Poll per list.
func TestReaderOpsPerGet(t *testing.T) {
	r, n := linkGroup(t, false, 1)
	const gets = 100
	now := time.Second // the reader's clock stands still: a cached header stays fresh
	for _, c := range []struct {
		mode                     Consistency
		lists, reads, sig, polls int
	}{
		{StaleOK, 2, 4, 2, 2},
		{Linearizable, 3, 5, 3, 3},
	} {
		for range 3 { // warm: the Links connected, the leader and the headers known
			if res, err := drive(t, r, n, c.mode, &now, 0, nil); err != nil || string(res.Value) != "v" {
				t.Fatalf("%v get: %q %v", c.mode, res.Value, err)
			}
		}
		var before rdma.LinkStats
		for i := range r.m {
			st := r.link(i).Stats()
			before.Lists += st.Lists
			before.Posted += st.Posted
			before.Signaled += st.Signaled
		}
		n.reset()
		for range gets {
			if res, err := drive(t, r, n, c.mode, &now, 0, nil); err != nil || string(res.Value) != "v" || res.Retries != 0 {
				t.Fatalf("%v get: %+v %v", c.mode, res, err)
			}
		}
		var after rdma.LinkStats
		for i := range r.m {
			st := r.link(i).Stats()
			after.Lists += st.Lists
			after.Posted += st.Posted
			after.Signaled += st.Signaled
		}
		lists, posted, sig := after.Lists-before.Lists, after.Posted-before.Posted, after.Signaled-before.Signaled
		if lists != uint64(c.lists*gets) || posted != uint64(c.reads*gets) || sig != uint64(c.sig*gets) {
			t.Errorf("%v: Link stats per %d gets: %d lists, %d posted, %d signaled; want %d, %d, %d",
				c.mode, gets, lists, posted, sig, c.lists*gets, c.reads*gets, c.sig*gets)
		}
		if n.lists != c.lists*gets || n.posted != c.reads*gets || n.sig != c.sig*gets || n.polls != c.polls*gets {
			t.Errorf("%v: Conns per %d gets: %d PostLists, %d reads, %d signaled, %d Polls; want %d, %d, %d, %d",
				c.mode, gets, n.lists, n.posted, n.sig, n.polls, c.lists*gets, c.reads*gets, c.sig*gets, c.polls*gets)
		}
	}
}

// TestReaderTimeoutOnItsClock: a member that stops answering (its reads
// never complete: a stalled peer on the queued mem fabric) fails the read
// exactly when Timeout has passed on the reader's clock, never before and
// whatever real time does; the stale-ok get then reads another member.
// The member's Link reconnects only after its Reconnect backoff (the home
// retry that comes first finds it down and waits), and once it is up
// again gets go back to it.
func TestReaderTimeoutOnItsClock(t *testing.T) {
	const (
		timeout   = 40 * time.Millisecond
		reconnect = 25 * time.Millisecond // past the first home retry (homeRetryMin)
	)
	r, n := linkGroup(t, true, 0)
	r.Timeout = timeout
	r.Reconnect = rdma.Backoff{Min: reconnect, Max: time.Second}
	now := time.Second
	res, err := drive(t, r, n, StaleOK, &now, 0, nil)
	if err != nil || res.Member != 0 {
		t.Fatalf("first get: member %d, %v; want member 0", res.Member, err)
	}
	l := r.m[0].link
	if l.Stats().Connects != 1 {
		t.Fatalf("%d connects to member 0, want 1", l.Stats().Connects)
	}

	// Member 0 stalls. The get posts its round at t0 and waits.
	now += 2 * FreshHeader
	t0 := now
	r.Begin([]byte("k"), StaleOK)
	if r.Poll(now) {
		t.Fatalf("the get finished without an answer")
	}
	if got := r.NextDeadline(); got != t0+timeout {
		t.Fatalf("NextDeadline %v, want the read's timeout %v", got, t0+timeout)
	}
	time.Sleep(10 * time.Millisecond) // real time passes: it must not count
	n.deliver(1)                      // the other members answer nothing: nothing was asked of them
	now = t0 + timeout - 1
	if r.Poll(now) || !l.IsUp() {
		t.Fatalf("before Timeout on the reader's clock: get done %v, link up %v (%v)", !r.Busy(), l.IsUp(), l.Err())
	}
	now = t0 + timeout
	r.Poll(now)
	if l.IsUp() || l.Stats().Timeouts != 1 {
		t.Fatalf("at Timeout: link up %v, %d timeouts; want down by 1 timeout", l.IsUp(), l.Stats().Timeouts)
	}
	if !errors.Is(r.lastErr, rdma.ErrOpTimeout) || !strings.Contains(r.lastErr.Error(), "node 1") {
		t.Fatalf("the attempt failed with %v, want ErrOpTimeout naming node 1", r.lastErr)
	}
	tFail := now
	for i := 0; !r.Poll(now); i++ {
		n.deliver(1)
		if r.st == gsWait {
			now = r.retryAt
		}
		if i > 1000 {
			t.Fatalf("the get did not finish on another member")
		}
	}
	if res, err := r.Result(); err != nil || res.Member == 0 || string(res.Value) != "v" {
		t.Fatalf("get after the timeout: member %d %q %v; want another member's v", res.Member, res.Value, err)
	}
	if got, want := l.RetryAt(), tFail+reconnect; got != want {
		t.Fatalf("the link retries at %v, want %v (no jitter without Rand)", got, want)
	}

	// Member 0 answers again. The home retry at tFail+homeRetryMin finds
	// the link still backing off: no connect, another member is read.
	now = tFail + homeRetryMin
	res, err = drive(t, r, n, StaleOK, &now, 0, nil)
	if err != nil || res.Member == 0 || l.Stats().Connects != 1 {
		t.Fatalf("home retry during the link's backoff: member %d, %v, %d connects; want another member, 1 connect", res.Member, err, l.Stats().Connects)
	}
	// After the backoff, the next home retry reconnects and reads it.
	now = max(l.RetryAt(), r.homeAt)
	res, err = drive(t, r, n, StaleOK, &now, 0, nil)
	if err != nil || res.Member != 0 {
		t.Fatalf("home retry after the backoff: member %d, %v; want member 0", res.Member, err)
	}
	if st := l.Stats(); st.Connects != 2 || l.Conn() != 2 {
		t.Fatalf("link stats %+v, Conn %d; want a second connect", st, l.Conn())
	}
}

// TestReaderPendingRule: a get abandoned with its reads out (GetCtx's ctx
// ended) leaves them landing in the member's buffers; the next get posts
// nothing to that member until they completed, then reads it. The planted
// bug reuseInFlight, which posts anyway, is caught.
func TestReaderPendingRule(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			r, n := linkGroup(t, true, 0)
			r.knobs.reuseInFlight = planted
			now := time.Second
			if res, err := drive(t, r, n, StaleOK, &now, 0, nil); err != nil || res.Member != 0 {
				t.Fatalf("first get: member %d, %v", res.Member, err)
			}
			// A get posts its round to member 0, which does not answer
			// yet; it is abandoned.
			r.Begin([]byte("k"), StaleOK)
			if r.Poll(now) {
				t.Fatalf("get finished with its reads out")
			}
			r.st = gsIdle
			// The next get, member 0 still silent, for a while.
			r.Begin([]byte("k"), StaleOK)
			for range 50 {
				if r.Poll(now) {
					t.Fatalf("get finished with member 0 silent (last cause %v)", r.lastErr)
				}
				now += 10 * time.Microsecond
			}
			// Member 0 answers: the get reads it.
			for i := 0; !r.Poll(now); i++ {
				n.deliver(0)
				if r.st == gsWait {
					now = r.retryAt
				}
				if i > 10000 {
					t.Fatalf("get not done")
				}
			}
			res, err := r.Result()
			if err != nil || string(res.Value) != "v" || res.Member != 0 {
				t.Fatalf("get: member %d %q %v", res.Member, res.Value, err)
			}
			n.mu.Lock()
			overlap := n.overlap
			n.mu.Unlock()
			switch {
			case !planted && len(overlap) > 0:
				t.Fatalf("pending rule broken: %s", overlap[0])
			case planted && len(overlap) == 0:
				t.Fatalf("the planted bug (posting with a list out) was not caught")
			}
		})
	}
}

// TestReaderConnectInBackground: a member whose connect blocks (tcp's,
// to a member that is down) is connected in the background: stale-ok
// gets of a reader made for it wait for it only up to Timeout on the
// reader's clock (a member being connected is not failed at once), then
// read another member, and later gets read that member too (the home
// retries find the connect still under way), all while the connect is
// still blocked. Once it returns, gets go back to the home member.
func TestReaderConnectInBackground(t *testing.T) {
	r, n := linkGroup(t, false, 0)
	n.blockPeer, n.block = 1, make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(n.block)
		}
	}()
	r.Timeout = 50 * time.Millisecond
	now := time.Second
	// Members 2 and 3 connect first (in the background too), so that
	// only member 1's connect is under way during the gets.
	for _, i := range []int{1, 2} {
		l := r.link(i)
		for k := 0; !l.Up(now); k++ {
			if k > 100000 {
				t.Fatalf("member %d's link not up: %v", i, l.Err())
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	step := func() { now += time.Millisecond }
	for i := range 5 {
		start := now
		res, err := drive(t, r, n, StaleOK, &now, 0, step)
		if err != nil || res.Member == 0 || string(res.Value) != "v" {
			t.Fatalf("get %d while member 0 connects: member %d %q %v; want another member's v", i, res.Member, res.Value, err)
		}
		if i == 0 && now-start < r.Timeout {
			t.Fatalf("the first get left member 0 after %v of its connect, before Timeout %v: a member being connected counted as failed", now-start, r.Timeout)
		}
		now += homeRetryMin // the next get retries home
	}
	if !r.m[0].connecting || r.m[0].link.Stats().Connects != 0 {
		// (Its Connect cannot have returned: block is open.)
		t.Fatalf("member 0: connecting %v, %d connects; want a connect under way", r.m[0].connecting, r.m[0].link.Stats().Connects)
	}
	close(n.block)
	released = true
	for i := 0; ; i++ {
		now += homeRetryMax
		res, err := drive(t, r, n, StaleOK, &now, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Member == 0 {
			break
		}
		if i > 1000 {
			t.Fatalf("gets never went back to member 0 after its connect returned")
		}
		time.Sleep(time.Millisecond) // the background connect's goroutine
	}
}
