package multicast

import (
	"math/rand/v2"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// peer is the writes to one node that a replica or a client makes (a
// child's replica, a parent's replica, a client's reply region, a group's
// replica), on an rdma.Link: reconnected with backoff when it breaks, every
// write's bytes staged in the link's ring until the write completes (a
// write's buffer must not change until then), so callers may reuse theirs
// at once. A write that finds the link down or the stage full is dropped
// and counted: every write of this package is either repeated until the
// peer's effect shows (retransmission by credits, client retries) or
// re-sent by a new leader, so a lost one delays and never loses.
type peer struct {
	id   rdma.NodeID
	link *rdma.Link

	dropped uint64 // writes dropped (refused, or queued when the link failed)
	err     error  // the last failure, for status
	fails   uint64 // failures so far

	linkDropped uint64 // link.Stats().Dropped already counted in dropped

	// busy, if set, is the owner's list of peers that pollPeers reaps:
	// queueWrite adds the peer (once: listed) when it stages a write, and
	// the owner drops it once its link is idle (rdma.Link.Idle), so that a
	// pass reaps the peers written to, not every client, child and parent.
	busy   *[]*peer
	listed bool
}

func newPeer(node rdma.Node, id rdma.NodeID, stage int, minBackoff, maxBackoff time.Duration) *peer {
	// The backoff's jitter comes from a generator seeded by the two ends,
	// so that a simulation stays deterministic.
	seed := uint64(node.ID())<<32 | uint64(id)
	return &peer{id: id, link: rdma.NewLink(rdma.LinkConfig{
		Node:       node,
		Peer:       id,
		Backoff:    rdma.Backoff{Min: minBackoff, Max: maxBackoff},
		Rand:       rand.New(rand.NewPCG(seed, seed^0x6d63617374)),
		StageBytes: stage,
	})}
}

// sync copies the link's failures and drops into the peer's counters.
func (p *peer) sync() {
	fails, dropped := p.link.Failed()
	p.dropped += dropped - p.linkDropped
	p.linkDropped = dropped
	p.fails = fails
	p.err = p.link.Err()
}

// poll reaps completions; it reports whether any arrived.
func (p *peer) poll(now time.Duration) bool {
	any := p.link.Reap(now)
	p.sync()
	return any
}

// write stages buf and posts it as one write to (region, off), with the
// writes queued before it (in staging order, as one list); notify rings
// the peer's doorbell once they land. It reports whether the write was
// posted (or left queued behind a full send queue, for the next flush).
func (p *peer) write(now time.Duration, region rdma.RegionID, off uint64, buf []byte, notify bool) bool {
	if !p.queueWrite(now, region, off, buf, notify) {
		return false
	}
	p.link.Flush(now)
	p.sync()
	return p.link.IsUp()
}

// queue stages buf as one write to (region, off) that flush posts, with
// the other queued writes, as one list (rdma.Conn.PostList) whose last
// write alone rings the peer's doorbell: a batch of writes the peer reads
// together (replies to one client node) costs one post and one wake-up
// (more only when the stage fills: the queued writes are then posted to
// make room). It reports whether the write was staged; one that is not is
// dropped and counted, as by write.
func (p *peer) queue(now time.Duration, region rdma.RegionID, off uint64, buf []byte) bool {
	return p.queueWrite(now, region, off, buf, true)
}

func (p *peer) queueWrite(now time.Duration, region rdma.RegionID, off uint64, buf []byte, notify bool) bool {
	if p.busy != nil && !p.listed {
		p.listed = true
		*p.busy = append(*p.busy, p)
	}
	dst := p.stageBuf(now, len(buf))
	if dst == nil {
		p.dropped++
		return false
	}
	copy(dst, buf)
	if _, ok := p.link.Queue(rdma.WR{Kind: rdma.OpWrite, Region: region, Offset: off, Buf: dst}, notify); !ok {
		p.dropped++
		return false
	}
	return true
}

// flush posts the queued writes as one list, Notify on the last, and
// returns how many were posted; if the Conn fails, those not posted are
// dropped and counted.
func (p *peer) flush(now time.Duration) int {
	n := p.link.Flush(now)
	p.sync()
	return n
}

// stageBuf returns n bytes of the link's stage, connecting it if its
// backoff passed; when the stage is full it posts what is queued and
// reaps completions first. nil if the link is down or the stage stays
// full.
func (p *peer) stageBuf(now time.Duration, n int) []byte {
	if !p.link.Up(now) {
		p.sync()
		return nil
	}
	if dst := p.link.Stage(n); dst != nil {
		return dst
	}
	p.link.Flush(now) // post what is queued, so that its completions can free the stage
	p.link.Reap(now)
	p.sync()
	return p.link.Stage(n)
}

// close releases the peer for good (its owner is closing).
func (p *peer) close() {
	p.link.Close()
}
