package tcp

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// sendLimit bounds the bytes a Conn buffers for sending; Post waits for
// the flusher beyond it (a single larger frame is always admitted).
const sendLimit = 1 << 20

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
// under mu; when nothing else is outstanding it writes the buffer itself
// (the latency path: no goroutine hop), otherwise it leaves the write to
// the flusher goroutine, which sends everything posted meanwhile in one
// system call. A reader goroutine turns responses into completions.
type Conn struct {
	node     *Node
	peer     rdma.NodeID
	addr     string
	nc       net.Conn
	cq       *rdma.CQ
	depth    uint64
	maxData  int
	kick     chan struct{}
	done     chan struct{}
	closeOne sync.Once

	alive    atomic.Bool  // bytes arrived since the last keepalive tick
	unpolled atomic.Int64 // completions pushed, not yet polled
	silent   time.Duration
	pings    uint64
	ready    chan struct{} // a completion was pushed (Wait parks on it)
	timer    *time.Timer   // Wait's, reused (a Conn has one user at a time)

	mu       sync.Mutex
	space    sync.Cond // send buffer drained (Post waits on it above sendLimit)
	ops      []opRec
	head     uint64 // oldest outstanding op
	next     uint64 // seq of the next op posted
	wbuf     []byte // encoded frames not yet handed to the kernel
	spare    []byte
	flushing bool // a writer owns the socket
	err      error
	closed   bool
}

var _ rdma.Conn = (*Conn)(nil)

func newConn(n *Node, peer rdma.NodeID, addr string, nc net.Conn) *Conn {
	c := &Conn{
		node: n, peer: peer, addr: addr, nc: nc,
		cq:      rdma.NewCQ(n.opts.QueueDepth, n.db),
		depth:   uint64(n.opts.QueueDepth),
		maxData: n.opts.MaxFrame - headerLen - writeFixed,
		kick:    make(chan struct{}, 1),
		ready:   make(chan struct{}, 1),
		done:    make(chan struct{}),
		ops:     make([]opRec, n.opts.QueueDepth),
		head:    1, next: 1,
		wbuf:  make([]byte, 0, ioBufSize),
		spare: make([]byte, 0, ioBufSize),
	}
	c.space.L = &c.mu
	c.alive.Store(true)
	return c
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
func (c *Conn) Outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.next - c.head)
}

// Poll implements rdma.Conn.
func (c *Conn) Poll(cs []rdma.Completion) int {
	k := c.cq.Poll(cs)
	if k > 0 {
		c.unpolled.Add(int64(-k))
	}
	return k
}

// Wait implements rdma.Conn. It parks at once: a completion arrives from
// the network through another goroutine, and spinning (with
// runtime.Gosched) would only delay the network poller that delivers it.
// The timer is the Conn's own, reused, so Wait allocates nothing.
func (c *Conn) Wait(cs []rdma.Completion, timeout time.Duration) int {
	if k := c.Poll(cs); k > 0 || timeout <= 0 {
		return k
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
	if err := rdma.CheckWR(&wr); err != nil {
		return err
	}
	if len(wr.Buf) > c.maxData && (wr.Kind == rdma.OpWrite || wr.Kind == rdma.OpRead) {
		return fmt.Errorf("tcp: %s of %d bytes exceeds the %d-byte frame limit: %w", wr.Kind, len(wr.Buf), c.maxData, rdma.ErrInvalidOp)
	}
	c.mu.Lock()
	if err := c.stateErr(); err != nil {
		c.mu.Unlock()
		return err
	}
	out := c.next - c.head
	if out >= c.depth || out+uint64(c.unpolled.Load()) >= c.depth {
		c.mu.Unlock()
		return rdma.ErrQueueFull
	}
	if len(c.wbuf) > 0 && len(c.wbuf)+len(wr.Buf) > sendLimit {
		for c.flushing && len(c.wbuf) > 0 && c.err == nil && !c.closed {
			c.space.Wait()
		}
		if err := c.stateErr(); err != nil {
			c.mu.Unlock()
			return err
		}
		out = c.next - c.head
	}
	rec := &c.ops[c.next%c.depth]
	*rec = opRec{id: wr.ID, kind: wr.Kind, flags: wr.Flags, region: wr.Region, offset: wr.Offset, n: wr.Len()}
	switch wr.Kind {
	case rdma.OpWrite:
		w := writeReq{Notify: wr.Flags&rdma.Notify != 0, Region: wr.Region, Offset: wr.Offset, Data: wr.Buf}
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
	if c.flushing {
		c.mu.Unlock()
		return nil
	}
	c.flushing = true
	if out > 0 {
		// Ops are in flight: more posts are likely to follow, so let the
		// flusher batch them.
		c.mu.Unlock()
		c.wake()
		return nil
	}
	c.flushLocked()
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
	if c.err != nil || c.closed {
		c.wbuf = c.wbuf[:0]
	}
	c.flushing = false
	c.mu.Unlock()
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

// keepalive runs every tick on the node's keepalive goroutine.
func (c *Conn) keepalive(tick time.Duration) {
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
func (c *Conn) completeThrough(seq uint64) {
	for c.head <= seq {
		rec := &c.ops[c.head%c.depth]
		if rec.flags&rdma.Signaled != 0 {
			c.push(rdma.Completion{ID: rec.id, Kind: rec.kind})
		}
		*rec = opRec{}
		c.head++
	}
}

// breakLocked puts the Conn in the error state. With failed != 0 that op
// fails with cause and later ones with ErrConnBroken (the target reported
// an op error); with failed == 0 every outstanding op fails with cause.
func (c *Conn) breakLocked(cause error, failed uint64) {
	if c.err != nil || c.closed {
		return
	}
	for ; c.head < c.next; c.head++ {
		rec := &c.ops[c.head%c.depth]
		e := cause
		if failed != 0 && c.head != failed {
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
	c.closeNet()
}

// fail breaks the Conn, failing every outstanding op with cause.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	c.breakLocked(cause, 0)
	c.mu.Unlock()
}

// closeNet closes the socket and stops the goroutines, once.
func (c *Conn) closeNet() {
	c.closeOne.Do(func() {
		c.nc.Close()
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
		c.space.Broadcast()
	}
	c.mu.Unlock()
	c.closeNet()
	return nil
}

// readLoop turns the target's responses into completions.
func (c *Conn) readLoop() {
	defer c.node.wg.Done()
	br := bufio.NewReaderSize(aliveReader{c.nc, &c.alive}, ioBufSize)
	var scratch []byte
	maxFrame := c.node.opts.MaxFrame
	for {
		hb, err := br.Peek(headerLen)
		if err != nil {
			c.fail(c.deadErr(fmt.Sprintf("receive: %v", err)))
			return
		}
		h, err := decodeHeader(hb, maxFrame)
		if err != nil {
			c.fail(c.deadErr(fmt.Sprintf("protocol violation: %v", err)))
			return
		}
		total := headerLen + int(h.Len)
		var body []byte
		if total <= br.Size() {
			fr, err := br.Peek(total)
			if err != nil {
				c.fail(c.deadErr(fmt.Sprintf("receive: %v", err)))
				return
			}
			body = fr[headerLen:]
		} else {
			br.Discard(headerLen)
			total = 0 // the body is read past, not peeked
			if cap(scratch) < int(h.Len) {
				scratch = make([]byte, h.Len)
			}
			body = scratch[:h.Len]
			if _, err := io.ReadFull(br, body); err != nil {
				c.fail(c.deadErr(fmt.Sprintf("receive: %v", err)))
				return
			}
		}
		c.mu.Lock()
		err = c.handle(h.Type, body)
		stop := c.err != nil || c.closed
		if err != nil {
			c.breakLocked(c.deadErr(fmt.Sprintf("protocol violation: %v", err)), 0)
		}
		c.mu.Unlock()
		if err != nil || stop {
			c.closeNet()
			return
		}
		br.Discard(total)
	}
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
		if rec.flags&rdma.Signaled != 0 {
			c.push(rdma.Completion{ID: rec.id, Kind: rec.kind, Value: old})
		}
		*rec = opRec{}
		c.head++
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
