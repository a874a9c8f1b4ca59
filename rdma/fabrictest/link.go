package fabrictest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmakv/rdmakv/rdma"
)

// testLink checks rdma.Link over the fabric: reconnects after its backoff,
// staging, selective signalling, op timeouts on the caller's clock, and an
// allocation-free steady state.
func testLink(t *testing.T, h Harness) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Reconnect", testLinkReconnect},
		{"StageReuse", testLinkStageReuse},
		{"SignalBound", testLinkSignalBound},
		{"OpTimeout", testLinkOpTimeout},
		{"QuietReads", testLinkQuietReads},
		{"NoAllocs", testLinkNoAllocs},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
}

// probeNode wraps a fabric's Node so that a test can hold back the
// completions of its Conns (stall: Poll finds nothing, as if the peer's
// NIC were slow) and see every work request posted.
type probeNode struct {
	rdma.Node
	mu     sync.Mutex
	stall  bool
	record bool
	events []probeEvent // posts and polled completions in order (when record)
	conns  int
}

func (n *probeNode) ConnectBlocks() bool {
	bc, ok := n.Node.(rdma.BlockingConnector)
	return ok && bc.ConnectBlocks()
}

func (n *probeNode) Connect(peer rdma.NodeID) (rdma.Conn, error) {
	c, err := n.Node.Connect(peer)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.conns++
	n.mu.Unlock()
	return &probeConn{Conn: c, n: n}, nil
}

func (n *probeNode) setStall(on bool) {
	n.mu.Lock()
	n.stall = on
	n.mu.Unlock()
}

// probeEvent is a WR posted (Buf dropped) or a completion polled.
type probeEvent struct {
	post bool
	wr   rdma.WR
	c    rdma.Completion
}

type probeConn struct {
	rdma.Conn
	n *probeNode
}

func (c *probeConn) Post(wr rdma.WR) error {
	_, err := c.PostList([]rdma.WR{wr})
	return err
}

func (c *probeConn) PostList(wrs []rdma.WR) (int, error) {
	n, err := c.Conn.PostList(wrs)
	c.n.mu.Lock()
	if c.n.record {
		for _, wr := range wrs[:n] {
			wr.Buf = nil
			c.n.events = append(c.n.events, probeEvent{post: true, wr: wr})
		}
	}
	c.n.mu.Unlock()
	return n, err
}

func (c *probeConn) Poll(cs []rdma.Completion) int {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	if c.n.stall {
		return 0
	}
	k := c.Conn.Poll(cs)
	if c.n.record {
		for _, cp := range cs[:k] {
			c.n.events = append(c.n.events, probeEvent{c: cp})
		}
	}
	return k
}

// linkEnv is one Link from node 2 to node 1, which owns region 1 of size
// bytes, writable by node 2.
type linkEnv struct {
	t     *testing.T
	owner rdma.Node
	reg   rdma.Region
	probe *probeNode
	l     *rdma.Link
	now   time.Duration // the Link's (virtual) clock
}

func newLinkEnv(t *testing.T, h Harness, size int, cfg rdma.LinkConfig) *linkEnv {
	t.Helper()
	cl := newCluster(t, h, 2)
	owner, peer := cl.open(1), cl.open(2)
	r := register(t, owner, 1, size)
	grant(t, r, 2, rdma.PermReadWrite)
	e := &linkEnv{t: t, owner: owner, reg: r, probe: &probeNode{Node: peer}, now: time.Second}
	cfg.Node, cfg.Peer = e.probe, 1
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(1, 2))
	}
	e.l = rdma.NewLink(cfg)
	t.Cleanup(e.l.Close)
	return e
}

// up waits (in real time) for Up at the current virtual time: a tcp
// Connector connects in the background.
func (e *linkEnv) up() {
	e.t.Helper()
	if !eventually(liveTimeout, func() bool { return e.l.Up(e.now) }) {
		e.t.Fatalf("link not up after %v (err %v)", liveTimeout, e.l.Err())
	}
}

// reapTo reaps until Completed passes seq or the link fails.
func (e *linkEnv) reapTo(seq uint64) {
	e.t.Helper()
	if !eventually(liveTimeout, func() bool {
		e.l.Reap(e.now)
		return e.l.Completed() > seq || !e.l.IsUp()
	}) {
		e.t.Fatalf("op %d not completed after %v (completed %d)", seq, liveTimeout, e.l.Completed())
	}
}

// write stages buf, queues it as one signaled write at off and flushes.
func (e *linkEnv) write(off uint64, buf []byte, fl rdma.Flags) uint64 {
	e.t.Helper()
	b := e.l.Stage(len(buf))
	if b == nil {
		e.t.Fatalf("Stage(%d) refused (up %v)", len(buf), e.l.IsUp())
	}
	copy(b, buf)
	seq, ok := e.l.Queue(rdma.WR{Kind: rdma.OpWrite, Flags: fl, Region: 1, Offset: off, Buf: b}, true)
	if !ok {
		e.t.Fatalf("Queue refused after Stage")
	}
	if n := e.l.Flush(e.now); n != 1 {
		e.t.Fatalf("Flush posted %d, want 1 (err %v)", n, e.l.Err())
	}
	return seq
}

// testLinkReconnect: an error completion fails the link; it stays down
// (refusing Stage and Queue) until its backoff passes on the caller's
// clock, whose step doubles while failures repeat and is reset by a
// successful completion; then Up opens a new Conn and Conn() moves on.
func testLinkReconnect(t *testing.T, h Harness) {
	const minB = time.Millisecond
	e := newLinkEnv(t, h, 64, rdma.LinkConfig{Backoff: rdma.Backoff{Min: minB, Max: 8 * minB}, StageBytes: 1024})
	l := e.l
	if l.Conn() != 0 || l.IsUp() {
		t.Fatalf("new link: Conn %d up %v, want 0 and down", l.Conn(), l.IsUp())
	}
	e.up()
	if l.Conn() != 1 {
		t.Fatalf("Conn() = %d after the first connect, want 1", l.Conn())
	}
	good := func(v uint64) {
		t.Helper()
		seq := e.write(8, word(v), rdma.Signaled)
		e.reapTo(seq)
		if !l.IsUp() {
			t.Fatalf("a good write failed the link: %v", l.Err())
		}
		if got := le64(e.reg.Bytes()[8:]); got != v {
			t.Fatalf("word 1 = %d after the write, want %d", got, v)
		}
	}
	bad := func() time.Duration {
		t.Helper()
		seq := e.write(4096, word(1), 0) // out of bounds: an error completion
		e.reapTo(seq)
		if l.IsUp() {
			t.Fatalf("an out-of-bounds write left the link up")
		}
		if !errors.Is(l.Err(), rdma.ErrBounds) {
			t.Fatalf("Err() = %v, want ErrBounds", l.Err())
		}
		if l.Completed() <= seq {
			t.Fatalf("Completed %d after the failure of op %d: the window was not released", l.Completed(), seq)
		}
		return l.RetryAt() - e.now
	}
	good(11)
	epoch := l.Conn()
	delays := []time.Duration{bad()}
	if l.Conn() != epoch {
		t.Fatalf("Conn() moved to %d at the failure, want %d until the reconnect", l.Conn(), epoch)
	}
	if l.Stage(8) != nil {
		t.Fatalf("Stage handed out a buffer while the link is down")
	}
	if _, ok := l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: word(1)}, false); ok {
		t.Fatalf("Queue accepted an op while the link is down")
	}
	if l.Up(l.RetryAt()-1) || l.NextDeadline() != l.RetryAt() {
		t.Fatalf("Up before the backoff passed, or NextDeadline %v is not RetryAt %v", l.NextDeadline(), l.RetryAt())
	}
	// Failures in a row: the step doubles (no successful completion
	// between them).
	for range 3 {
		e.now = l.RetryAt()
		e.up()
		delays = append(delays, bad())
	}
	for i, d := range delays {
		step := minB << i
		if d < step/2 || d >= step {
			t.Fatalf("failure %d in a row: retry after %v, want [%v, %v)", i+1, d, step/2, step)
		}
	}
	// A successful completion resets the step.
	e.now = l.RetryAt()
	e.up()
	good(12)
	if d := bad(); d < minB/2 || d >= minB {
		t.Fatalf("failure after a successful write: retry after %v, want [%v, %v) (backoff not reset)", d, minB/2, minB)
	}
	e.now = l.RetryAt()
	e.up()
	good(13)
	if got, want := l.Conn(), uint64(6); got != want {
		t.Fatalf("Conn() = %d after 5 failures, want %d", got, want)
	}
	// Fail drops what is queued; the next Conn gets nothing of it.
	b := l.Stage(8)
	copy(b, word(99))
	if _, ok := l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: 8, Buf: b}, true); !ok {
		t.Fatalf("Queue refused on an up link")
	}
	l.Fail(e.now, errors.New("protocol saw garbage"))
	if l.Queued() != 0 || l.Stats().Dropped != 1 {
		t.Fatalf("after Fail: %d queued, %d dropped, want 0 and 1", l.Queued(), l.Stats().Dropped)
	}
	e.now = l.RetryAt()
	e.up()
	if n := l.Flush(e.now); n != 0 {
		t.Fatalf("Flush after the reconnect posted %d ops of the failed Conn", n)
	}
	good(14)
	st := l.Stats()
	if st.Connects != 7 || st.Failures != 6 {
		t.Fatalf("stats %+v: want 7 connects and 6 failures", st)
	}
}

// testLinkStageReuse: a staged buffer is never handed out again while the
// op that owns it may still read it (its seq is not below Completed), and
// the stage holds at most StageBytes in flight. Completions are held back
// at random, so the stage fills and drains.
func testLinkStageReuse(t *testing.T, h Harness) {
	const stageBytes = 1024
	// SignalEvery is large for the stage: the stage's own rule must free it.
	e := newLinkEnv(t, h, 4096, rdma.LinkConfig{StageBytes: stageBytes, SignalEvery: 32, Depth: 64})
	l := e.l
	e.up()
	rng := rand.New(rand.NewPCG(5, 6))
	type staged struct {
		seq uint64
		buf []byte
		pat byte
	}
	var live []staged
	check := func(i int) {
		t.Helper()
		k, inFlight := 0, 0
		for _, s := range live {
			if s.seq < l.Completed() {
				continue
			}
			if !bytes.Equal(s.buf, bytes.Repeat([]byte{s.pat}, len(s.buf))) {
				t.Fatalf("step %d: the buffer of op %d (not completed; completed %d) was handed out again and overwritten", i, s.seq, l.Completed())
			}
			inFlight += len(s.buf)
			live[k] = s
			k++
		}
		live = live[:k]
		if inFlight > stageBytes {
			t.Fatalf("step %d: %d staged bytes in flight, stage is %d", i, inFlight, stageBytes)
		}
	}
	full := 0
	stalled := false
	for i := range 3000 {
		if i%100 == 0 {
			stalled = rng.IntN(2) == 0
			e.probe.setStall(stalled)
		}
		n := 1 + rng.IntN(stageBytes/4)
		b := l.Stage(n)
		if b == nil {
			full++
			l.Flush(e.now)
			l.Reap(e.now)
			check(i)
			if stalled {
				continue
			}
			// Completions flow: the stage must free up (a quarter of it
			// always does), whatever SignalEvery says.
			if !eventually(liveTimeout, func() bool { l.Reap(e.now); b = l.Stage(n); return b != nil }) {
				t.Fatalf("step %d: Stage(%d) refused for %v with completions flowing: the stage jammed", i, n, liveTimeout)
			}
			check(i)
		}
		if p := uintptr(unsafe.Pointer(&b[0])); p%8 != 0 {
			t.Fatalf("step %d: Stage(%d) returned a buffer at %#x, not 8-byte aligned", i, n, p)
		}
		pat := byte(1 + i%250)
		for j := range b {
			b[j] = pat
		}
		off := uint64(rng.IntN(4096 - n))
		seq, ok := l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: off, Buf: b}, i%7 == 0)
		if !ok {
			t.Fatalf("step %d: Queue refused right after Stage", i)
		}
		live = append(live, staged{seq: seq, buf: b, pat: pat})
		if rng.IntN(3) == 0 {
			l.Flush(e.now)
		}
		if rng.IntN(4) == 0 {
			l.Reap(e.now)
		}
		check(i)
		if !l.IsUp() {
			t.Fatalf("step %d: link failed: %v", i, l.Err())
		}
	}
	if full == 0 {
		t.Fatalf("the stage never filled: the test did not exercise reuse")
	}
	// Once everything completed, a quarter of the stage is always there.
	e.probe.setStall(false)
	l.Flush(e.now)
	if !eventually(liveTimeout, func() bool { l.Reap(e.now); return l.Completed()+32 > l.Stats().Posted }) {
		t.Fatalf("completed %d of %d posted once completions flow", l.Completed(), l.Stats().Posted)
	}
	own := word(0) // an unstaged write's buffer
	for range 4 {
		// A signaled write completing means all before it did: every
		// staged byte is free, so a quarter of the stage is there.
		seq, ok := l.Queue(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Buf: own}, false)
		if !ok {
			t.Fatalf("Queue refused with %d of %d ops completed", l.Completed(), l.Stats().Posted)
		}
		l.Flush(e.now)
		e.reapTo(seq)
		if b := l.Stage(stageBytes / 4); b == nil {
			t.Fatalf("Stage(%d) refused with nothing in flight", stageBytes/4)
		}
		e.write(0, make([]byte, 8), 0)
	}
}

// testLinkSignalBound: the Link signals so that the ops the fabric may
// still hold (posted, not covered by a polled signaled completion) never
// exceed its window, and never more than SignalEvery-1 unsignaled in a
// row; Queue refuses instead of letting the send queue fill (no Post
// fails), and a list that filled the window ends with a signaled op, so
// that its completion frees the window.
func testLinkSignalBound(t *testing.T, h Harness) {
	const depth, every = 32, 8
	e := newLinkEnv(t, h, 4096, rdma.LinkConfig{StageBytes: 4096, SignalEvery: every, Depth: depth})
	l := e.l
	e.probe.mu.Lock()
	e.probe.record = true
	e.probe.mu.Unlock()
	e.up()
	rng := rand.New(rand.NewPCG(7, 8))
	refused := 0
	for i := range 400 {
		e.probe.setStall(i%50 < 20)
		for range rng.IntN(2 * depth) {
			b := l.Stage(8)
			if b == nil {
				refused++
				break
			}
			put64(b, uint64(i))
			if _, ok := l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(8 * rng.IntN(512)), Buf: b}, false); !ok {
				t.Fatalf("Queue refused right after Stage")
			}
		}
		l.Flush(e.now)
		if rng.IntN(2) == 0 {
			l.Reap(e.now)
		}
		if !l.IsUp() {
			t.Fatalf("round %d: link failed (a Post error?): %v", i, l.Err())
		}
	}
	if refused == 0 {
		t.Fatalf("the window never filled: the test did not exercise the bound")
	}
	// The window never jams: with completions flowing, all but the
	// unsignaled ops at the end complete, and Queue has room again.
	e.probe.setStall(false)
	if !eventually(liveTimeout, func() bool { l.Reap(e.now); return l.Completed()+every > l.Stats().Posted }) {
		t.Fatalf("completed %d of %d posted: a full window's last op was not signaled", l.Completed(), l.Stats().Posted)
	}
	if b := l.Stage(8); b == nil {
		t.Fatalf("Stage refused after the completions were reaped")
	}
	e.probe.mu.Lock()
	defer e.probe.mu.Unlock()
	// Replay the posts and polls in order: no more than SignalEvery-1
	// unsignaled ops in a row, and at each post at most the window's ops
	// since the newest completion polled before it.
	run := 0
	polledUpTo := uint64(0) // 1 + highest completion ID polled
	for _, ev := range e.probe.events {
		if !ev.post {
			if ev.c.Err != nil {
				t.Fatalf("completion of op %d failed: %v", ev.c.ID, ev.c.Err)
			}
			polledUpTo = max(polledUpTo, ev.c.ID+1)
			continue
		}
		wr := ev.wr
		if wr.Flags&rdma.Signaled == 0 {
			run++
			if run >= every {
				t.Fatalf("op %d: %d unsignaled ops in a row, SignalEvery is %d", wr.ID, run, every)
			}
		} else {
			run = 0
		}
		if wr.ID+1-polledUpTo > depth {
			t.Fatalf("op %d posted with %d ops since the last polled completion, window %d", wr.ID, wr.ID+1-polledUpTo, depth)
		}
	}
	if st := l.Stats(); st.Signaled == 0 || st.Signaled == st.Posted {
		t.Fatalf("stats %+v: want some ops unsignaled and some signaled", st)
	}
}

// testLinkOpTimeout: a signaled op outstanding for OpTimeout on the
// caller's clock fails the link (never earlier, and real time plays no
// part); NextDeadline names that time; the link reconnects after its
// backoff and works.
func testLinkOpTimeout(t *testing.T, h Harness) {
	const timeout = 5 * time.Millisecond
	e := newLinkEnv(t, h, 64, rdma.LinkConfig{StageBytes: 256, OpTimeout: timeout})
	l := e.l
	e.up()
	if d := l.NextDeadline(); d < e.now+time.Hour {
		t.Fatalf("NextDeadline %v with nothing outstanding, want none", d)
	}
	e.probe.setStall(true)
	t0 := e.now
	e.write(0, word(1), rdma.Signaled)
	if got := l.NextDeadline(); got != t0+timeout {
		t.Fatalf("NextDeadline %v, want the op's timeout %v", got, t0+timeout)
	}
	time.Sleep(2 * timeout) // real time passes: it must not count
	e.now = t0 + timeout - 1
	l.Reap(e.now)
	if !l.IsUp() {
		t.Fatalf("link failed before OpTimeout on its clock: %v", l.Err())
	}
	e.now = t0 + timeout
	l.Reap(e.now)
	if l.IsUp() || !errors.Is(l.Err(), rdma.ErrOpTimeout) || l.Stats().Timeouts != 1 {
		t.Fatalf("after OpTimeout: up %v err %v timeouts %d, want down, ErrOpTimeout, 1", l.IsUp(), l.Err(), l.Stats().Timeouts)
	}
	e.probe.setStall(false)
	e.now = l.RetryAt()
	e.up()
	if l.Conn() != 2 {
		t.Fatalf("Conn() = %d after the timeout's reconnect, want 2", l.Conn())
	}
	seq := e.write(8, word(2), rdma.Signaled)
	e.reapTo(seq)
	e.now += 10 * timeout
	l.Reap(e.now)
	if !l.IsUp() || le64(e.reg.Bytes()[8:]) != 2 {
		t.Fatalf("after the reconnect: up %v (err %v), word 1 = %d, want up and 2", l.IsUp(), l.Err(), le64(e.reg.Bytes()[8:]))
	}
	// With an OpTimeout every list is timed: a list of writes nobody asked
	// to signal ends with a signaled one.
	e.probe.setStall(true)
	t1 := e.now
	for i := range 3 {
		b := l.Stage(8)
		copy(b, word(uint64(20+i)))
		l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: 16, Buf: b}, false)
	}
	l.Flush(e.now)
	e.now = t1 + timeout
	l.Reap(e.now)
	if l.IsUp() || l.Stats().Timeouts != 2 {
		t.Fatalf("a stalled list of unsignaled writes did not time out: up %v, timeouts %d", l.IsUp(), l.Stats().Timeouts)
	}
}

// testLinkQuietReads: with QuietReads a list of reads whose last one the
// caller marks Signaled posts one signaled op (one completion for the
// list), and Completed passing that op means every read of the list landed;
// SignalEvery never leaves the list's last read unsignaled. Without it
// every read is signaled.
func testLinkQuietReads(t *testing.T, h Harness) {
	const reads = 6
	for _, quiet := range []bool{true, false} {
		e := newLinkEnv(t, h, 64, rdma.LinkConfig{QuietReads: quiet, SignalEvery: 8, Depth: 16})
		l := e.l
		e.up()
		for i := range 8 {
			put64(e.reg.Bytes()[8*i:], uint64(100+i))
		}
		dst := make([]byte, 8*reads)
		for round := range 5 {
			clear(dst)
			st := l.Stats()
			var last uint64
			for k := range reads {
				wr := rdma.WR{Kind: rdma.OpRead, Region: 1, Offset: uint64(8 * k), Buf: dst[8*k : 8*k+8]}
				if k == reads-1 {
					wr.Flags = rdma.Signaled
				}
				seq, ok := l.Queue(wr, false)
				if !ok {
					t.Fatalf("Queue refused")
				}
				last = seq
			}
			if n := l.Flush(e.now); n != reads {
				t.Fatalf("Flush posted %d, want %d (err %v)", n, reads, l.Err())
			}
			e.reapTo(last)
			if !l.IsUp() {
				t.Fatalf("link failed: %v", l.Err())
			}
			for k := range reads {
				if got := le64(dst[8*k:]); got != uint64(100+k) {
					t.Fatalf("quiet %v round %d: read %d = %d after the list completed, want %d", quiet, round, k, got, 100+k)
				}
			}
			want := uint64(reads)
			if quiet {
				want = 1
			}
			if got := l.Stats().Signaled - st.Signaled; got != want {
				t.Fatalf("quiet %v round %d: %d of the list's %d reads signaled, want %d", quiet, round, got, reads, want)
			}
		}
	}
}

// testLinkNoAllocs: the steady-state Stage, Queue, Flush and Reap path
// allocates nothing.
func testLinkNoAllocs(t *testing.T, h Harness) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	e := newLinkEnv(t, h, 4096, rdma.LinkConfig{StageBytes: 4096})
	l := e.l
	e.up()
	var err error
	round := func() {
		for k := range 4 {
			b := l.Stage(64)
			for i := 0; b == nil && err == nil; i++ {
				l.Reap(e.now)
				b = l.Stage(64)
				if i > 1<<20 || !l.IsUp() {
					err = fmt.Errorf("stage never freed (up %v, err %v)", l.IsUp(), l.Err())
				}
				if i > 64 {
					time.Sleep(20 * time.Microsecond) // reuses the goroutine's timer
				} else {
					runtime.Gosched()
				}
			}
			if err != nil {
				return
			}
			b[0] = byte(k)
			l.Queue(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(64 * k), Buf: b}, k == 3)
		}
		l.Flush(e.now)
		l.Reap(e.now)
	}
	for range 100 {
		round()
	}
	allocs := testing.AllocsPerRun(500, round)
	if err != nil {
		t.Fatal(err)
	}
	if !l.IsUp() {
		t.Fatalf("link failed: %v", l.Err())
	}
	if allocs != 0 {
		t.Errorf("Stage+Queue x4, Flush, Reap: %v allocations per round, want 0", allocs)
	}
}
