package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmakv/rdmakv/rdma"
	"golang.org/x/sys/unix"
)

// sendLimit bounds the bytes a Conn buffers for sending; Post waits for
// the flusher beyond it (a single larger frame is always admitted).
const sendLimit = 1 << 20

// inlineEvery is how many fruitless Polls (with ops outstanding) pass
// between two inline receives.
const inlineEvery = 32

// askEvery is how often an unsignaled write asks for an ack anyway (every
// askEvery-th op), so that its buffer and queue slot are retired.
const askEvery = 64

// opRec is a posted op awaiting its completion.
type opRec struct {
	id     uint64
	kind   rdma.OpKind
	flags  rdma.Flags
	region rdma.RegionID
	offset uint64
	buf    []byte // read destination
	n      int    // bytes touched
}

// Conn is an outgoing tcp connection, the initiator side of a queue pair.
//
// Ops are numbered 1, 2, ... in posting order; the target answers in that
// order (acks, read and atomic responses, or one error), so op records sit
// in a ring indexed by seq. Post encodes the op's frame into a send buffer
// under mu; when no answer is pending it writes the buffer itself
// (the latency path: no goroutine hop), otherwise it leaves the write to
// the flusher goroutine, which sends everything posted meanwhile in one
// system call. Responses become completions in whichever goroutine drains
// the socket (see the receive side below).
type Conn struct {
	node     *Node
	peer     rdma.NodeID
	addr     string
	nc       net.Conn
	cq       *rdma.CQ
	depth    uint64
	maxData  int
	kick     chan struct{}
	resume   chan struct{} // sends a reader that stands aside back to the socket
	done     chan struct{}
	closeOne sync.Once

	alive       atomic.Bool  // bytes arrived since the last keepalive tick
	unpolled    atomic.Int64 // completions pushed, not yet polled
	outstanding atomic.Int64 // next - head, for Poll and Outstanding without mu
	silent      time.Duration
	pings       uint64
	ready       chan struct{} // a completion was pushed (Wait parks on it)
	timer       *time.Timer   // Wait's, reused (a Conn has one user at a time)

	raw        syscall.RawConn
	pollFn     func(fd uintptr) // pollReceive, bound once
	emptyPolls uint32           // Polls that found nothing, since the last inline receive
	pollErr    error            // pollReceive's result
	wnc        net.Conn         // a duplicate of nc's descriptor, Wait's own
	wraw       syscall.RawConn
	waitFn     func(fd uintptr) bool // waitReceive, bound once
	finalFn    func(fd uintptr)      // finalReceive, bound once
	waitErr    error                 // waitReceive's result
	waiting    atomic.Bool           // Wait is in the poller: the reader stands aside

	rx   sync.Mutex // owns rbuf and reads the socket
	rbuf []byte     // received bytes; [rr, rw) not yet handled
	rr   int
	rw   int

	mu       sync.Mutex
	space    sync.Cond // send buffer drained (Post waits on it above sendLimit)
	ops      []opRec
	head     uint64 // oldest outstanding op
	next     uint64 // seq of the next op posted
	asked    uint64 // latest op the target will answer (read, atomic, write with Ack)
	wbuf     []byte // encoded frames not yet handed to the kernel
	spare    []byte
	flushing bool // a writer owns the socket
	err      error
	closed   bool
}

var _ rdma.Conn = (*Conn)(nil)

func newConn(n *Node, peer rdma.NodeID, addr string, nc net.Conn) (*Conn, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("tcp: %T has no file descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("tcp: connection to node %d: %w", peer, err)
	}
	c := &Conn{
		node: n, peer: peer, addr: addr, nc: nc,
		cq:      rdma.NewCQ(n.opts.QueueDepth, n.db),
		depth:   uint64(n.opts.QueueDepth),
		maxData: n.opts.MaxFrame - headerLen - writeFixed,
		kick:    make(chan struct{}, 1),
		resume:  make(chan struct{}, 1),
		ready:   make(chan struct{}, 1),
		done:    make(chan struct{}),
		ops:     make([]opRec, n.opts.QueueDepth),
		head:    1, next: 1,
		wbuf:  make([]byte, 0, ioBufSize),
		spare: make([]byte, 0, ioBufSize),
		raw:   raw,
	}
	c.space.L = &c.mu
	c.alive.Store(true)
	c.rbuf = make([]byte, ioBufSize)
	c.pollFn = c.pollReceive
	c.waitFn = c.waitReceive
	c.finalFn = c.finalReceive
	var derr error
	if err := raw.Control(func(fd uintptr) {
		d, err := unix.Dup(int(fd))
		if err != nil {
			derr = err
			return
		}
		f := os.NewFile(uintptr(d), "tcp-wait")
		c.wnc, derr = net.FileConn(f)
		f.Close()
	}); err != nil || derr != nil {
		return nil, fmt.Errorf("tcp: connection to node %d: duplicate descriptor: %w", peer, errors.Join(err, derr))
	}
	if c.wraw, derr = c.wnc.(syscall.Conn).SyscallConn(); derr != nil {
		c.wnc.Close()
		return nil, fmt.Errorf("tcp: connection to node %d: %w", peer, derr)
	}
	return c, nil
}

// Local implements rdma.Conn.
func (c *Conn) Local() rdma.NodeID { return c.node.id }

// Peer implements rdma.Conn.
func (c *Conn) Peer() rdma.NodeID { return c.peer }

// Err implements rdma.Conn.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Outstanding implements rdma.Conn.
func (c *Conn) Outstanding() int { return int(c.outstanding.Load()) }

// Poll implements rdma.Conn.
// When it keeps finding nothing while ops are outstanding, it drains the
// socket itself every inlineEvery calls (one non-blocking read).
func (c *Conn) Poll(cs []rdma.Completion) int {
	k := c.cq.Poll(cs)
	if k > 0 {
		c.unpolled.Add(int64(-k))
		c.emptyPolls = 0
		return k
	}
	if c.emptyPolls++; c.emptyPolls%inlineEvery == 0 && c.outstanding.Load() > 0 {
		c.raw.Control(c.pollFn)
		if err := c.pollErr; err != nil {
			c.pollErr = nil
			c.receiveFailed(err)
		}
		if k = c.cq.Poll(cs); k > 0 {
			c.unpolled.Add(int64(-k))
		}
	}
	return k
}

// Wait implements rdma.Conn. It never spins (spinning, with or without
// runtime.Gosched, takes the CPU the network poller and the target need).
// With ops outstanding it blocks in the network poller itself, on its own
// duplicate of the socket's descriptor, and handles the answer in its own
// goroutine, as a raw TCP client would: no hand-off from the reader
// goroutine (a cross-core wake-up) on the round trip. Otherwise it parks
// until a completion is pushed. Wait allocates nothing.
func (c *Conn) Wait(cs []rdma.Completion, timeout time.Duration) int {
	if k := c.Poll(cs); k > 0 || timeout <= 0 {
		return k
	}
	deadline := time.Now().Add(timeout)
	if c.outstanding.Load() > 0 {
		c.waiting.Store(true)
		c.wnc.SetReadDeadline(deadline)
		c.wraw.Read(c.waitFn)
		c.waiting.Store(false)
		c.wraw.Control(c.finalFn)
		if err := c.waitErr; err != nil {
			c.waitErr = nil
			c.receiveFailed(err)
		}
		if k := c.Poll(cs); k > 0 {
			return k
		}
		if timeout = time.Until(deadline); timeout <= 0 {
			return 0
		}
	}
	if c.timer == nil {
		c.timer = time.NewTimer(timeout)
	} else {
		c.timer.Reset(timeout)
	}
	defer c.timer.Stop()
	for {
		select {
		case <-c.ready:
			if k := c.Poll(cs); k > 0 {
				return k
			}
		case <-c.timer.C:
			return c.Poll(cs)
		}
	}
}

func (c *Conn) stateErr() error {
	if c.closed {
		return rdma.ErrClosed
	}
	if c.err != nil {
		return fmt.Errorf("%w: %w", rdma.ErrConnBroken, c.err)
	}
	return nil
}

// Post implements rdma.Conn. Reads and writes longer than the frame limit
// (MaxFrame less the header) fail with rdma.ErrInvalidOp.
func (c *Conn) Post(wr rdma.WR) error {
	_, err := c.PostList(unsafe.Slice(&wr, 1)) // wr does not escape
	return err
}

// PostList implements rdma.Conn. It encodes the list's frames under one
// lock and sends them with one write: its own when no answer was pending
// (the latency path: no goroutine hop), else the flusher's, which batches
// what is posted while answers stream back.
func (c *Conn) PostList(wrs []rdma.WR) (int, error) {
	c.mu.Lock()
	if err := c.stateErr(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	idle := c.asked < c.head
	n := 0
	var err error
	for ; n < len(wrs); n++ {
		if err = c.encode(&wrs[n]); err != nil {
			break
		}
	}
	if n == 0 || c.flushing {
		c.mu.Unlock()
		return n, err
	}
	c.flushing = true
	if !idle {
		// Answers are in flight: more posts are likely to follow, so let
		// the flusher batch them.
		c.mu.Unlock()
		c.wake()
		return n, err
	}
	c.flushLocked()
	return n, err
}

// encode checks wr, records it and appends its frame to the send buffer;
// c.mu is held (Cond waits may release it).
func (c *Conn) encode(wr *rdma.WR) error {
	if err := rdma.CheckWR(wr); err != nil {
		return err
	}
	if len(wr.Buf) > c.maxData && (wr.Kind == rdma.OpWrite || wr.Kind == rdma.OpRead) {
		return fmt.Errorf("tcp: %s of %d bytes exceeds the %d-byte frame limit: %w", wr.Kind, len(wr.Buf), c.maxData, rdma.ErrInvalidOp)
	}
	out := c.next - c.head
	if out >= c.depth || out+uint64(c.unpolled.Load()) >= c.depth {
		return rdma.ErrQueueFull
	}
	if len(c.wbuf) > 0 && len(c.wbuf)+len(wr.Buf) > sendLimit {
		if !c.flushing {
			// Frames of this list are waiting: hand them to the flusher.
			c.flushing = true
			c.wake()
		}
		for c.flushing && len(c.wbuf) > 0 && c.err == nil && !c.closed {
			c.space.Wait()
		}
		if err := c.stateErr(); err != nil {
			return err
		}
	}
	rec := &c.ops[c.next%c.depth]
	*rec = opRec{id: wr.ID, kind: wr.Kind, flags: wr.Flags, region: wr.Region, offset: wr.Offset, n: wr.Len()}
	if wr.Kind != rdma.OpWrite || wr.Flags&rdma.Signaled != 0 || c.next%askEvery == 0 || out >= c.depth/4 {
		c.asked = c.next
	}
	switch wr.Kind {
	case rdma.OpWrite:
		w := writeReq{Notify: wr.Flags&rdma.Notify != 0, Ack: c.asked == c.next, Region: wr.Region, Offset: wr.Offset, Data: wr.Buf}
		c.wbuf = appendWriteReq(c.wbuf, &w)
	case rdma.OpRead:
		rec.buf = wr.Buf
		r := readReq{Region: wr.Region, Len: uint32(len(wr.Buf)), Offset: wr.Offset}
		c.wbuf = appendReadReq(c.wbuf, &r)
	case rdma.OpCompareAndSwap:
		a := atomicReq{Region: wr.Region, Offset: wr.Offset, Compare: wr.Compare, Value: wr.Value}
		c.wbuf = appendCASReq(c.wbuf, &a)
	case rdma.OpFetchAdd:
		a := atomicReq{Region: wr.Region, Offset: wr.Offset, Value: wr.Value}
		c.wbuf = appendFAAReq(c.wbuf, &a)
	}
	c.next++
	c.outstanding.Store(int64(c.next - c.head))
	return nil
}

// flushLocked writes the send buffer until it is empty. c.mu is held and
// c.flushing set by the caller; it returns with c.mu released.
func (c *Conn) flushLocked() {
	for len(c.wbuf) > 0 && c.err == nil && !c.closed {
		buf := c.wbuf
		c.wbuf, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		c.spare = buf[:0]
		c.space.Broadcast()
		if err != nil {
			c.breakLocked(c.deadErr(fmt.Sprintf("send: %v", err)), 0)
		}
	}
	stop := c.err != nil || c.closed
	if stop {
		c.wbuf = c.wbuf[:0]
	}
	c.flushing = false
	c.mu.Unlock()
	if stop {
		c.closeNet()
	}
}

// flusher writes what Post and the keepalive loop leave to it.
func (c *Conn) flusher() {
	defer c.node.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.kick:
		}
		c.mu.Lock()
		c.flushLocked()
	}
}

// sendPing queues a keepalive ping for the flusher.
func (c *Conn) sendPing() {
	c.mu.Lock()
	if c.err != nil || c.closed {
		c.mu.Unlock()
		return
	}
	c.pings++
	c.wbuf = appendWord(c.wbuf, typePing, c.pings)
	if c.flushing {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	c.mu.Unlock()
	c.wake()
}

// wake hands the send buffer to the flusher (a pending kick suffices).
func (c *Conn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// keepalive runs every tick on the node's keepalive goroutine. It also
// resumes a reader that stands aside, so that pongs are read (and the
// peer seen alive) while the user calls neither Wait nor Poll.
func (c *Conn) keepalive(tick time.Duration) {
	c.resumeReader()
	if c.alive.Swap(false) {
		c.silent = 0
	} else if c.silent += tick; c.silent >= c.node.opts.PeerTimeout {
		c.fail(c.deadErr(fmt.Sprintf("no answer for %v", c.silent)))
		return
	}
	c.sendPing()
}

func (c *Conn) deadErr(why string) error {
	return fmt.Errorf("tcp: node %d at %s: %s: %w", c.peer, c.addr, why, rdma.ErrPeerDead)
}

func (c *Conn) opErr(rec *opRec, err error) error {
	return &rdma.OpError{Op: rec.kind, Peer: c.peer, Region: rec.region, Offset: rec.offset, Len: rec.n, Err: err}
}

func (c *Conn) push(cp rdma.Completion) {
	c.unpolled.Add(1)
	c.cq.Push(cp)
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// completeThrough completes ops up to and including seq successfully.
// Outstanding drops before the completions appear, so a user who polled
// one never sees its op still counted.
func (c *Conn) completeThrough(seq uint64) {
	if seq < c.head {
		return
	}
	from := c.head
	c.head = seq + 1
	c.outstanding.Store(int64(c.next - c.head))
	for s := from; s <= seq; s++ {
		rec := &c.ops[s%c.depth]
		if rec.flags&rdma.Signaled != 0 {
			c.push(rdma.Completion{ID: rec.id, Kind: rec.kind})
		}
		*rec = opRec{}
	}
}

// breakLocked puts the Conn in the error state. With failed != 0 that op
// fails with cause and later ones with ErrConnBroken (the target reported
// an op error); with failed == 0 every outstanding op fails with cause.
func (c *Conn) breakLocked(cause error, failed uint64) {
	if c.err != nil || c.closed {
		return
	}
	from := c.head
	c.head = c.next
	c.outstanding.Store(0)
	for s := from; s < c.next; s++ {
		rec := &c.ops[s%c.depth]
		e := cause
		if failed != 0 && s != failed {
			e = rdma.ErrConnBroken
		}
		err := c.opErr(rec, e)
		if c.err == nil {
			c.err = err
		}
		c.push(rdma.Completion{ID: rec.id, Kind: rec.kind, Err: err})
		*rec = opRec{}
	}
	if c.err == nil {
		c.err = cause
	}
	c.space.Broadcast()
	// The caller closes the socket (closeNet) once it holds neither mu nor
	// a reference to the descriptor: closing waits for those references.
}

// fail breaks the Conn, failing every outstanding op with cause.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	c.breakLocked(cause, 0)
	c.mu.Unlock()
	c.closeNet()
}

// closeNet closes the socket and stops the goroutines, once.
func (c *Conn) closeNet() {
	c.closeOne.Do(func() {
		c.nc.Close()
		c.wnc.Close()
		close(c.done)
		c.node.dropConn(c)
	})
}

// Close implements rdma.Conn. Outstanding ops are discarded without
// completions; the target may or may not have applied them.
func (c *Conn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		for ; c.head < c.next; c.head++ {
			c.ops[c.head%c.depth] = opRec{}
		}
		c.outstanding.Store(0)
		c.space.Broadcast()
	}
	c.mu.Unlock()
	c.closeNet()
	return nil
}

// The receive side. Responses land in rbuf, which whoever holds rx fills
// from the socket with non-blocking reads and parses. Three parties may:
//   - the reader goroutine, woken by the network poller, for users that
//     park on the node's doorbell or do other work;
//   - Wait, blocked in the poller on a duplicate descriptor (the reader
//     skips its wake-ups meanwhile, and Wait drains once more as it
//     leaves);
//   - Poll, which drains the socket itself every inlineEvery fruitless
//     calls while ops are outstanding, so a spinning user's completions do
//     not wait for the Go scheduler to run the reader.
//
// Whoever drains reads until the socket is empty (or a read comes back
// short), so any later byte raises a new readiness edge: none is lost.

// errStop ends the reader after the Conn broke or closed.
var errStop = errors.New("tcp: conn stopped")

// readLoop turns the target's responses into completions.
func (c *Conn) readLoop() {
	defer c.node.wg.Done()
	for {
		var derr error
		aside := false
		err := c.raw.Read(func(fd uintptr) bool {
			if c.waiting.Load() {
				aside = true
				return true
			}
			c.rx.Lock()
			derr = c.drain(int(fd))
			c.rx.Unlock()
			return derr != nil
		})
		if aside && err == nil {
			if c.standAside() {
				continue
			}
			return // closed
		}
		if derr == nil {
			derr = err
		}
		c.receiveFailed(derr)
		return
	}
}

// standAside parks the reader off the socket while Wait reads it. Both
// wait in the network poller on the same socket (the reader on nc, Wait on
// its duplicate), so each answer would wake two goroutines, and the
// second makes the runtime wake another thread, on this 2-CPU machine
// often a halted CPU, on the round trip. The reader returns to the socket
// when the node's doorbell is about to park (Node.Doorbell's Wait), on
// the next keepalive tick, and if Wait has already left. It reports false
// once the Conn is done.
func (c *Conn) standAside() bool {
	n := c.node
	n.idle.Add(1)
	defer n.idle.Add(-1)
	// A doorbell Wait that missed the count above started after Wait
	// left (Conn use is sequential), so the reader sees waiting false.
	if !c.waiting.Load() {
		return true
	}
	select {
	case <-c.resume:
		return true
	case <-c.done:
		return false
	}
}

// resumeReader sends a reader that stands aside back to the socket (a
// pending resume suffices).
func (c *Conn) resumeReader() {
	select {
	case c.resume <- struct{}{}:
	default:
	}
}

// waitReceive is Wait's callback on the duplicate descriptor: it drains the
// socket and says whether Wait is done (a completion arrived, or nothing is
// outstanding any more).
func (c *Conn) waitReceive(fd uintptr) bool {
	if c.unpolled.Load() > 0 {
		return true
	}
	c.rx.Lock()
	err := c.drain(int(fd))
	c.rx.Unlock()
	if err != nil {
		c.waitErr = err
		return true
	}
	return c.unpolled.Load() > 0 || c.outstanding.Load() == 0
}

// finalReceive drains the socket as Wait leaves: while Wait was waiting the
// reader goroutine skipped its wake-ups, so bytes that arrived after Wait's
// last read are the leaver's to handle.
func (c *Conn) finalReceive(fd uintptr) {
	c.rx.Lock()
	if err := c.drain(int(fd)); err != nil && c.waitErr == nil {
		c.waitErr = err
	}
	c.rx.Unlock()
}

// pollReceive drains the socket from Poll when the reader goroutine is not
// at it; c.pollFn calls it with the descriptor kept valid by Control, and
// Poll handles pollErr once Control has returned.
func (c *Conn) pollReceive(fd uintptr) {
	if !c.rx.TryLock() {
		return
	}
	c.pollErr = c.drain(int(fd))
	c.rx.Unlock()
}

func (c *Conn) receiveFailed(err error) {
	if err == nil || err == errStop {
		c.closeNet()
		return
	}
	if errors.Is(err, errMalformed) {
		c.fail(c.deadErr(fmt.Sprintf("protocol violation: %v", err)))
	} else {
		c.fail(c.deadErr(fmt.Sprintf("receive: %v", err)))
	}
}

// drain reads everything the socket holds and handles every whole frame;
// c.rx is held. It returns nil when the socket is empty.
func (c *Conn) drain(fd int) error {
	for {
		if err := c.parse(); err != nil {
			return err
		}
		if c.rw == len(c.rbuf) && c.rr > 0 {
			c.rw = copy(c.rbuf, c.rbuf[c.rr:c.rw])
			c.rr = 0
		}
		space := len(c.rbuf) - c.rw
		n, err := unix.Read(fd, c.rbuf[c.rw:])
		switch {
		case n > 0 && n < space:
			// A short read emptied the socket: anything arriving later
			// raises a new readiness edge, so skip the read that would
			// only say EAGAIN and let the woken user run sooner.
			c.rw += n
			c.alive.Store(true)
			return c.parse()
		case n > 0:
			c.rw += n
			c.alive.Store(true)
		case err == unix.EAGAIN:
			return nil
		case err == unix.EINTR:
		case err != nil:
			return err
		default:
			return io.EOF
		}
	}
}

// parse handles the whole frames in rbuf and makes room for the next one.
func (c *Conn) parse() error {
	if c.rw-c.rr < headerLen {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.rw-c.rr >= headerLen {
		if c.err != nil || c.closed {
			return errStop
		}
		h, err := decodeHeader(c.rbuf[c.rr:c.rw], c.node.opts.MaxFrame)
		if err != nil {
			return err
		}
		total := headerLen + int(h.Len)
		if c.rw-c.rr < total {
			if c.rr+total > len(c.rbuf) {
				c.rw = copy(c.rbuf, c.rbuf[c.rr:c.rw])
				c.rr = 0
				if total > len(c.rbuf) {
					c.rbuf = append(c.rbuf, make([]byte, total-len(c.rbuf))...)
				}
			}
			return nil
		}
		if err := c.handle(h.Type, c.rbuf[c.rr+headerLen:c.rr+total]); err != nil {
			return err
		}
		c.rr += total
	}
	if c.rr == c.rw {
		c.rr, c.rw = 0, 0
	}
	if c.err != nil || c.closed {
		return errStop
	}
	return nil
}

// pending returns the record of outstanding op seq if it has kind k.
func (c *Conn) pending(seq uint64, kinds ...rdma.OpKind) (*opRec, error) {
	if seq < c.head || seq >= c.next {
		return nil, fmt.Errorf("%w: response for op %d, outstanding [%d,%d)", errMalformed, seq, c.head, c.next)
	}
	rec := &c.ops[seq%c.depth]
	for _, k := range kinds {
		if rec.kind == k {
			return rec, nil
		}
	}
	return nil, fmt.Errorf("%w: response type does not match op %d (%s)", errMalformed, seq, rec.kind)
}

// handle applies one response frame; c.mu is held.
func (c *Conn) handle(typ uint8, body []byte) error {
	if c.err != nil || c.closed {
		return nil
	}
	switch typ {
	case typePong:
		_, err := decodeWord(body)
		return err
	case typeAck:
		seq, err := decodeWord(body)
		if err != nil {
			return err
		}
		if seq >= c.next {
			return fmt.Errorf("%w: ack of op %d, only %d posted", errMalformed, seq, c.next-1)
		}
		c.completeThrough(seq)
	case typeReadRsp:
		seq, data, err := decodeReadRsp(body)
		if err != nil {
			return err
		}
		rec, err := c.pending(seq, rdma.OpRead)
		if err != nil {
			return err
		}
		if len(data) != len(rec.buf) {
			return fmt.Errorf("%w: read response of %d bytes for a %d-byte read", errMalformed, len(data), len(rec.buf))
		}
		c.completeThrough(seq - 1)
		copy(rec.buf, data)
		c.completeThrough(seq)
	case typeAtomRsp:
		seq, old, err := decodeAtomRsp(body)
		if err != nil {
			return err
		}
		rec, err := c.pending(seq, rdma.OpCompareAndSwap, rdma.OpFetchAdd)
		if err != nil {
			return err
		}
		c.completeThrough(seq - 1)
		c.head++
		c.outstanding.Store(int64(c.next - c.head))
		if rec.flags&rdma.Signaled != 0 {
			c.push(rdma.Completion{ID: rec.id, Kind: rec.kind, Value: old})
		}
		*rec = opRec{}
	case typeError:
		seq, code, err := decodeErrorRsp(body)
		if err != nil {
			return err
		}
		if _, err := c.pending(seq, rdma.OpWrite, rdma.OpRead, rdma.OpCompareAndSwap, rdma.OpFetchAdd); err != nil {
			return err
		}
		c.completeThrough(seq - 1)
		c.breakLocked(codeErr(code), seq)
	default:
		return fmt.Errorf("%w: request frame type %d sent to an initiator", errMalformed, typ)
	}
	return nil
}
