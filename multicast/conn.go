package multicast

import (
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// peer is a Conn to one node that a replica or a client writes to (a
// child's replica, a parent's replica, a client's reply region, a group's
// replica), reconnected with backoff when it breaks. Every write's bytes
// are staged in a ring of the peer's own until the write completes (a
// write's buffer must not change until then), so callers may reuse theirs
// at once. A write that finds the Conn down or the stage full is dropped
// and counted: every write of this package is either repeated until the
// peer's effect shows (retransmission by credits, client retries) or
// re-sent by a new leader, so a lost one delays and never loses.
type peer struct {
	id      rdma.NodeID
	node    rdma.Node
	conn    rdma.Conn
	dial    *rdma.Connector // opens conn without blocking the poller (tcp)
	retryAt time.Duration
	backoff time.Duration
	min     time.Duration
	max     time.Duration

	stage      []byte
	head, tail uint64    // bytes staged: [tail, head) are in flight or queued
	ends       []opEnd   // in-flight ops' stage ends, oldest first
	nextID     uint64    // id of the next op
	unsignaled int       // ops posted since the last signaled one
	wrs        []rdma.WR // queued writes, posted by flush
	qends      []uint64  // their stage ends
	cs         [32]rdma.Completion

	dropped uint64
	err     error  // the last failure, for status
	fails   uint64 // failures so far
}

type opEnd struct {
	id  uint64
	end uint64
}

const signalEvery = 8

func newPeer(node rdma.Node, id rdma.NodeID, stage int, minBackoff, maxBackoff time.Duration) *peer {
	return &peer{id: id, node: node, dial: rdma.NewConnector(node, id), stage: make([]byte, stage), min: minBackoff, max: maxBackoff}
}

// up reports whether the Conn is usable, connecting it if its backoff
// passed.
func (p *peer) up(now time.Duration) bool {
	if p.conn != nil {
		return true
	}
	if now < p.retryAt {
		return false
	}
	c, err, ok := p.dial.Connect()
	if !ok {
		return false // connecting in the background (a tcp peer)
	}
	if err != nil {
		p.fail(now, err)
		return false
	}
	p.conn = c
	return true
}

func (p *peer) fail(now time.Duration, err error) {
	p.err = err
	p.fails++
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
	}
	p.tail, p.head = 0, 0
	p.ends = p.ends[:0]
	p.unsignaled = 0
	if len(p.wrs) > 0 { // queued writes are staged in what was just reset
		p.dropped += uint64(len(p.wrs))
		clear(p.wrs)
		p.wrs, p.qends = p.wrs[:0], p.qends[:0]
	}
	switch {
	case p.backoff == 0:
		p.backoff = p.min
	default:
		p.backoff = min(2*p.backoff, p.max)
	}
	p.retryAt = now + p.backoff
}

// poll reaps completions; it reports whether any arrived.
func (p *peer) poll(now time.Duration) bool {
	if p.conn == nil {
		return false
	}
	any := false
	for {
		n := p.conn.Poll(p.cs[:])
		if n == 0 {
			break
		}
		any = true
		for _, c := range p.cs[:n] {
			if c.Err != nil {
				p.fail(now, c.Err)
				return true
			}
			k := 0
			for k < len(p.ends) && p.ends[k].id <= c.ID {
				p.tail = p.ends[k].end
				k++
			}
			p.ends = append(p.ends[:0], p.ends[k:]...)
			p.backoff = 0
		}
		if n < len(p.cs) {
			break
		}
	}
	if len(p.ends) == 0 && len(p.wrs) == 0 {
		p.tail, p.head = 0, 0
	}
	return any
}

// write stages buf and posts it as one write to (region, off); notify
// rings the peer's doorbell. It reports whether the write was posted.
// Writes queued before it are posted first (flush), so the Conn sees
// every op in staging order.
func (p *peer) write(now time.Duration, region rdma.RegionID, off uint64, buf []byte, notify bool) bool {
	if len(p.wrs) > 0 {
		p.flush(now)
	}
	dst, ok := p.stageBuf(now, buf)
	if !ok {
		return false
	}
	fl := p.signal(uint64(len(dst)))
	if notify {
		fl |= rdma.Notify
	}
	id := p.nextID
	if err := p.conn.Post(rdma.WR{ID: id, Kind: rdma.OpWrite, Flags: fl, Region: region, Offset: off, Buf: dst}); err != nil {
		p.fail(now, err)
		p.dropped++
		return false
	}
	p.nextID++
	p.head += uint64(len(dst))
	p.ends = append(p.ends, opEnd{id: id, end: p.head})
	p.shortenEnds(fl)
	return true
}

// queue stages buf as one write to (region, off) that flush posts, with
// the other queued writes, as one list (rdma.Conn.PostList) whose last
// write alone rings the peer's doorbell: a batch of writes the peer reads
// together (replies to one client node) costs one post and one wake-up
// (more only when the stage fills: stageBuf then posts what is queued).
// It reports whether the write was staged; one that is not is dropped and
// counted, as by write.
func (p *peer) queue(now time.Duration, region rdma.RegionID, off uint64, buf []byte) bool {
	dst, ok := p.stageBuf(now, buf)
	if !ok {
		return false
	}
	fl := p.signal(uint64(len(dst)))
	p.wrs = append(p.wrs, rdma.WR{ID: p.nextID + uint64(len(p.wrs)), Kind: rdma.OpWrite, Flags: fl, Region: region, Offset: off, Buf: dst})
	p.head += uint64(len(dst))
	p.qends = append(p.qends, p.head)
	return true
}

// flush posts the queued writes as one list, Notify on the last, and
// returns how many were posted; those the Conn refused are dropped and
// counted (the Conn is then failed, as by write).
func (p *peer) flush(now time.Duration) int {
	q := len(p.wrs)
	if q == 0 {
		return 0
	}
	p.wrs[q-1].Flags |= rdma.Notify
	n, err := p.conn.PostList(p.wrs)
	for i := range n {
		p.ends = append(p.ends, opEnd{id: p.wrs[i].ID, end: p.qends[i]})
	}
	p.nextID += uint64(n)
	last := p.wrs[q-1].Flags
	clear(p.wrs) // drop the references to the stage
	p.wrs, p.qends = p.wrs[:0], p.qends[:0]
	if err != nil || n < q {
		if err == nil {
			err = rdma.ErrConnBroken
		}
		p.fail(now, err)
		p.dropped += uint64(q - n)
		return n
	}
	p.shortenEnds(last)
	return n
}

// stageBuf copies buf into the stage, contiguous, after everything staged
// (posted or queued), and returns the staged copy; the head moves only
// past a ring end it skips (the caller adds the copy's length).
// It fails, counting a drop, if the Conn is down or the stage full once
// the queued writes are posted and the completions reaped.
func (p *peer) stageBuf(now time.Duration, buf []byte) ([]byte, bool) {
	if !p.up(now) {
		p.dropped++
		return nil, false
	}
	n := uint64(len(buf))
	size := uint64(len(p.stage))
	if n > size {
		p.dropped++
		return nil, false
	}
	// the staged copy must be contiguous: skip the ring's tail end if needed
	start := p.head
	if start%size+n > size {
		start += size - start%size
	}
	if start+n-p.tail > size {
		if len(p.wrs) > 0 {
			p.flush(now) // post what is queued, so that its completions can free the stage
		}
		p.poll(now)
		start = p.head
		if start%size+n > size {
			start += size - start%size
		}
		if start+n-p.tail > size || p.conn == nil {
			p.dropped++
			return nil, false
		}
	}
	p.head = start // the skipped tail end counts as staged until this op completes
	dst := p.stage[start%size : start%size+n]
	copy(dst, buf)
	return dst, true
}

// signal returns the flags of the next op of n bytes (staged at the head):
// Signaled every signalEvery ops, or when the stage is over half full.
func (p *peer) signal(n uint64) rdma.Flags {
	var fl rdma.Flags
	p.unsignaled++
	if p.unsignaled >= signalEvery || p.head+n-p.tail > uint64(len(p.stage))/2 {
		fl |= rdma.Signaled
		p.unsignaled = 0
	}
	return fl
}

// shortenEnds keeps the in-flight list short even if nothing is signaled
// soon (fl: the flags of the op just posted).
func (p *peer) shortenEnds(fl rdma.Flags) {
	if fl&rdma.Signaled == 0 && len(p.ends) > 4*signalEvery {
		p.unsignaled = signalEvery
	}
}

// close releases the peer for good (its owner is closing).
func (p *peer) close() {
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
	}
	p.dial.Close()
}
