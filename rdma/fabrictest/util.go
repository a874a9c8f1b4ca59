package fabrictest

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Generous bounds: the suite asserts behaviour, never speed, and runs on a
// loaded 2-core machine under the race detector.
const (
	// opTimeout bounds one synchronous op the suite waits for.
	opTimeout = 10 * time.Second
	// deadTimeout bounds how long a fabric may take to report a dead peer.
	deadTimeout = 15 * time.Second
	// liveTimeout bounds waiting for progress that must happen.
	liveTimeout = 10 * time.Second
)

// errNoCompletion reports that a fabric neither completed nor failed an op
// in time: a hang, which the contract forbids.
var errNoCompletion = errors.New("fabrictest: no completion in time (the fabric hung)")

// cluster is one fresh cluster of a harness.
type cluster struct {
	t   *testing.T
	h   Harness
	cfg string
}

func newCluster(t *testing.T, h Harness, n int) *cluster {
	t.Helper()
	return &cluster{t: t, h: h, cfg: h.NewCluster(t, n)}
}

// open opens node id in this process; it is closed when the test ends.
func (c *cluster) open(id rdma.NodeID) rdma.Node {
	c.t.Helper()
	n, err := c.h.Open(c.cfg, id)
	if err != nil {
		c.t.Fatalf("%s: open node %d: %v", c.h.Name, id, err)
	}
	if n.ID() != id {
		c.t.Fatalf("%s: Open(%d) returned a node with ID %d", c.h.Name, id, n.ID())
	}
	c.t.Cleanup(func() { n.Close() })
	return n
}

func register(t testing.TB, n rdma.Node, id rdma.RegionID, size int) rdma.Region {
	t.Helper()
	r, err := n.Register(id, size)
	if err != nil {
		t.Fatalf("node %d: register region %d (%d bytes): %v", n.ID(), id, size, err)
	}
	if r.ID() != id {
		t.Fatalf("node %d: Register(%d) returned region %d", n.ID(), id, r.ID())
	}
	if got, want := len(r.Bytes()), rdma.Round8(size); got != want {
		t.Fatalf("node %d region %d: len(Bytes()) = %d, want %d (size rounded up to 8)", n.ID(), id, got, want)
	}
	return r
}

func grant(t testing.TB, r rdma.Region, peer rdma.NodeID, p rdma.Perm) {
	t.Helper()
	if err := r.Grant(peer, p); err != nil {
		t.Fatalf("region %d: grant %v to node %d: %v", r.ID(), p, peer, err)
	}
}

func connect(t testing.TB, n rdma.Node, peer rdma.NodeID) rdma.Conn {
	t.Helper()
	c, err := n.Connect(peer)
	if err != nil {
		t.Fatalf("node %d: connect to node %d: %v", n.ID(), peer, err)
	}
	if c.Local() != n.ID() || c.Peer() != peer {
		t.Fatalf("node %d: Connect(%d) returned a Conn %d->%d", n.ID(), peer, c.Local(), c.Peer())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// doOp posts wr signaled on a Conn with nothing else outstanding and waits
// up to timeout for its completion. It returns the completion's error, the
// Post error, or errNoCompletion. Unlike rdma.Do it tells a hang apart from
// a fabric-reported ErrPeerDead.
func doOp(c rdma.Conn, wr rdma.WR, timeout time.Duration) (rdma.Completion, error) {
	wr.Flags |= rdma.Signaled
	if err := c.Post(wr); err != nil {
		return rdma.Completion{}, err
	}
	var cs [8]rdma.Completion
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return rdma.Completion{}, fmt.Errorf("%s on node %d region %d offset %d: %w", wr.Kind, c.Peer(), wr.Region, wr.Offset, errNoCompletion)
		}
		n := c.Wait(cs[:], min(left, 100*time.Millisecond))
		for _, cp := range cs[:n] {
			if cp.Err != nil {
				return cp, cp.Err
			}
			if cp.ID == wr.ID && cp.Kind == wr.Kind {
				return cp, nil
			}
		}
	}
}

func write(c rdma.Conn, region rdma.RegionID, off uint64, buf []byte) error {
	_, err := doOp(c, rdma.WR{ID: 1, Kind: rdma.OpWrite, Region: region, Offset: off, Buf: buf}, opTimeout)
	return err
}

func read(c rdma.Conn, region rdma.RegionID, off uint64, buf []byte) error {
	_, err := doOp(c, rdma.WR{ID: 2, Kind: rdma.OpRead, Region: region, Offset: off, Buf: buf}, opTimeout)
	return err
}

func read64(c rdma.Conn, region rdma.RegionID, off uint64) (uint64, error) {
	var b [8]byte
	err := read(c, region, off, b[:])
	return le64(b[:]), err
}

func cas(c rdma.Conn, region rdma.RegionID, off, old, new uint64) (uint64, error) {
	cp, err := doOp(c, rdma.WR{ID: 3, Kind: rdma.OpCompareAndSwap, Region: region, Offset: off, Compare: old, Value: new}, opTimeout)
	return cp.Value, err
}

func faa(c rdma.Conn, region rdma.RegionID, off, delta uint64) (uint64, error) {
	cp, err := doOp(c, rdma.WR{ID: 4, Kind: rdma.OpFetchAdd, Region: region, Offset: off, Value: delta}, opTimeout)
	return cp.Value, err
}

// le64 and put64 encode region words (native order; all supported hosts are
// little-endian, see package rdma).
func le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func put64(b []byte, v uint64) {
	_ = b[7]
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func word(v uint64) []byte {
	b := make([]byte, 8)
	put64(b, v)
	return b
}

// snapshot copies region memory word by word with atomic loads.
func snapshot(mem []byte) []byte {
	out := make([]byte, len(mem))
	for off := 0; off+8 <= len(mem); off += 8 {
		put64(out[off:], rdma.Load64(mem, off))
	}
	return out
}

// firstDiff returns the first offset where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// eventually polls cond, yielding and then sleeping, until it holds or
// timeout passes.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// pipe posts a stream of ops on one Conn the way a protocol does: writes
// are copied into buffers the pipe owns until the op completes (RDMA buffer
// rules), every signalEvery-th op is signaled, and a full send queue is
// answered by polling completions. It records the first failed completion
// and checks that completions arrive in posting order.
type pipe struct {
	c     rdma.Conn
	every int // signal every every-th op; 0: only when the caller asks

	next     uint64 // ID of the last posted op; IDs start at 1
	done     uint64 // every op with ID <= done completed successfully
	posted   int
	signaled int // signaled successful completions polled
	err      error
	order    error // first completion out of posting order
	lastSeen uint64

	bufs   [][]byte
	usedBy []uint64
	cs     [64]rdma.Completion
}

const pipeBufs = 128 // also bounds the writes in flight, as a protocol's window does

func newPipe(c rdma.Conn, every int) *pipe {
	return &pipe{c: c, every: every, bufs: make([][]byte, pipeBufs), usedBy: make([]uint64, pipeBufs)}
}

// post posts wr (its ID is assigned) and returns the ID. A write's Buf is
// copied first, so the caller may reuse it at once.
func (p *pipe) post(wr rdma.WR) (uint64, error) {
	if p.err != nil {
		return 0, p.err
	}
	p.next++
	wr.ID = p.next
	p.posted++
	if p.every > 0 && p.posted%p.every == 0 {
		wr.Flags |= rdma.Signaled
	}
	if wr.Kind == rdma.OpWrite {
		k := int(wr.ID % pipeBufs)
		if p.usedBy[k] > p.done {
			// The op that used this buffer may still be reading it.
			if err := p.waitDone(p.usedBy[k], opTimeout); err != nil {
				return 0, err
			}
		}
		if cap(p.bufs[k]) < len(wr.Buf) {
			p.bufs[k] = make([]byte, len(wr.Buf), max(len(wr.Buf), 64))
		}
		b := p.bufs[k][:len(wr.Buf)]
		copy(b, wr.Buf)
		wr.Buf = b
		p.usedBy[k] = wr.ID
		if wr.Flags&rdma.Signaled == 0 && p.every == 0 && p.next-p.done >= pipeBufs*3/4 {
			// Keep buffers reclaimable: signal now and then anyway.
			wr.Flags |= rdma.Signaled
		}
	}
	deadline := time.Now().Add(opTimeout)
	for {
		err := p.c.Post(wr)
		if err == nil {
			p.poll(0)
			return wr.ID, p.err
		}
		if !errors.Is(err, rdma.ErrQueueFull) {
			p.err = fmt.Errorf("post %s #%d: %w", wr.Kind, wr.ID, err)
			return 0, p.err
		}
		if time.Now().After(deadline) {
			p.err = fmt.Errorf("post %s #%d: send queue still full after %v: %w", wr.Kind, wr.ID, opTimeout, err)
			return 0, p.err
		}
		p.poll(time.Millisecond)
	}
}

// write posts a write of buf at (region, off).
func (p *pipe) write(region rdma.RegionID, off uint64, buf []byte, flags rdma.Flags) (uint64, error) {
	return p.post(rdma.WR{Kind: rdma.OpWrite, Flags: flags, Region: region, Offset: off, Buf: buf})
}

// write64 posts an 8-byte write of v at (region, off).
func (p *pipe) write64(region rdma.RegionID, off, v uint64, flags rdma.Flags) (uint64, error) {
	var b [8]byte
	put64(b[:], v)
	return p.write(region, off, b[:], flags)
}

// poll moves completions, waiting up to wait for a first one.
func (p *pipe) poll(wait time.Duration) {
	var n int
	if wait > 0 {
		n = p.c.Wait(p.cs[:], wait)
	} else {
		n = p.c.Poll(p.cs[:])
	}
	for _, cp := range p.cs[:n] {
		if cp.ID <= p.lastSeen && p.order == nil {
			p.order = fmt.Errorf("completion of op #%d (%s) polled after op #%d: completions out of posting order", cp.ID, cp.Kind, p.lastSeen)
		}
		p.lastSeen = max(p.lastSeen, cp.ID)
		if cp.Err != nil {
			if p.err == nil {
				p.err = fmt.Errorf("op #%d: %w", cp.ID, cp.Err)
			}
			continue
		}
		p.signaled++
		if cp.ID > p.done {
			p.done = cp.ID
		}
	}
}

// waitDone waits until op id completed (or failed, or timeout passed).
func (p *pipe) waitDone(id uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for p.done < id && p.err == nil {
		if time.Now().After(deadline) {
			p.err = fmt.Errorf("op #%d: %w after %v", id, errNoCompletion, timeout)
			break
		}
		p.poll(10 * time.Millisecond)
	}
	return p.err
}

// sync posts a signaled write of v at (region, off) and waits for it: when
// it returns nil, every op posted before completed.
func (p *pipe) sync(region rdma.RegionID, off, v uint64) error {
	id, err := p.write64(region, off, v, rdma.Signaled)
	if err != nil {
		return err
	}
	return p.waitDone(id, opTimeout)
}

// overlap makes the readers and writers of a race case really overlap on a
// fast fabric: writers keep writing until every reader i has made
// minReads[i] reads while writes were under way (or liveTimeout passed).
type overlap struct {
	reads    []atomic.Int64
	writing  atomic.Bool
	minReads []int64
	deadline time.Time
}

func newOverlap(minReads ...int64) *overlap {
	return &overlap{reads: make([]atomic.Int64, len(minReads)), minReads: minReads}
}

// start marks the writers as writing; call it before they start.
func (o *overlap) start() {
	o.deadline = time.Now().Add(liveTimeout)
	o.writing.Store(true)
}

// stop marks the writers as finished.
func (o *overlap) stop() { o.writing.Store(false) }

// read counts one read by reader i.
func (o *overlap) read(i int) {
	if o.writing.Load() {
		o.reads[i].Add(1)
	}
}

// quit tells the writers not to wait for reader i, which failed.
func (o *overlap) quit(i int) { o.reads[i].Store(o.minReads[i]) }

// more tells a writer to go on writing.
func (o *overlap) more() bool {
	if time.Now().After(o.deadline) {
		return false
	}
	for i := range o.reads {
		if o.reads[i].Load() < o.minReads[i] {
			return true
		}
	}
	return false
}

// check reports a reader that made too few reads while writes were under
// way, which would make the case vacuous.
func (o *overlap) check() error {
	for i := range o.reads {
		if n := o.reads[i].Load(); n < o.minReads[i] {
			return fmt.Errorf("reader %d made only %d reads while the writers wrote (want %d in %v)", i, n, o.minReads[i], liveTimeout)
		}
	}
	return nil
}
