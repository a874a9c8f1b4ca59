package broadcast

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// link is this replica's side of everything it sends to one peer: the Conn
// (reconnected with backoff when it breaks), a staging area for rows and
// acknowledgement words (a write's buffer must stay untouched until the op
// completes), the outgoing ring mirrored into the peer's incoming ring, and
// a snapshot fetch in progress from that peer (on a Conn of its own).
type link struct {
	dial      *rdma.Connector // opens conn without blocking the poller (tcp)
	fetchDial *rdma.Connector // opens the snapshot fetch's Conn
	peer      rdma.NodeID
	idx       int

	conn    rdma.Conn
	up      bool
	retryAt time.Duration
	backoff time.Duration

	postSeq      uint64 // id of the next op
	lastSignaled uint64
	completed    uint64 // every op with id < completed is done

	stage     []byte
	stageSeq  []uint64 // per slot: 1 + id of the op using it, 0 when free
	stageNext int

	dirty        [nTables]bool // rows to push to this peer
	ackDirty     bool
	commitSent   MsgHdr // commit point in the last CommitSST row pushed
	commitSentAt time.Duration
	notifyOwed   bool // a write that should have rung the peer's doorbell was not posted with Notify

	out outRing

	wrs []rdma.WR // push list (pushLink), reused
	ops []pushOp
	one [1]rdma.WR // post's list

	fetch snapFetch

	cs [64]rdma.Completion
}

const (
	stageSlots  = 128
	signalEvery = 32
)

// outRing is the sender side of one ring: a local mirror of the peer's
// incoming ring. Records are written into the mirror and posted from it (one
// write per record); a byte of the mirror is reused only after the peer
// acknowledged consuming it, which implies the write landed.
type outRing struct {
	mirror   []byte
	rinc     uint64 // receiver incarnation this ring is for; 0 while unknown
	sent     uint64 // bytes written into the mirror
	posted   uint64 // bytes posted to the peer
	consumed uint64 // bytes the peer acknowledged
}

func newLink(peer rdma.NodeID, idx, ringSize int) *link {
	return &link{
		peer:     peer,
		idx:      idx,
		stage:    make([]byte, stageSlots*rowSize),
		stageSeq: make([]uint64, stageSlots),
		out:      outRing{mirror: make([]byte, ringSize)},
	}
}

// connect (re)opens the Conn if it is down and its backoff has passed.
func (l *link) connect(r *Replica, now time.Duration) {
	if l.up || now < l.retryAt {
		return
	}
	if l.dial == nil {
		l.dial = rdma.NewConnector(r.node, l.peer)
	}
	c, err, ok := l.dial.Connect()
	if !ok {
		return // connecting in the background (a tcp peer): the doorbell rings when done
	}
	if err != nil {
		l.fail(r, now)
		return
	}
	l.conn = c
	l.up = true
	r.ctr.Reconnects++
	l.completed = l.postSeq
	l.lastSignaled = l.postSeq
	clear(l.stageSeq)
	// Re-post what the peer may have missed: every row, our ack, and the
	// ring from its last acknowledged byte (rewriting a landed record is
	// harmless: same bytes at the same place).
	for t := range l.dirty {
		l.dirty[t] = true
	}
	l.ackDirty = true
	l.out.posted = l.out.consumed
	r.tracef("link %d->%d up", r.self, l.peer)
}

// fail marks the Conn broken and schedules a reconnect.
func (l *link) fail(r *Replica, now time.Duration) {
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
	if l.up {
		r.tracef("link %d->%d down", r.self, l.peer)
	}
	l.up = false
	switch {
	case l.backoff == 0:
		l.backoff = r.cfg.ReconnectMin
	default:
		l.backoff = min(2*l.backoff, r.cfg.ReconnectMax)
	}
	// jitter in [backoff/2, backoff)
	l.retryAt = now + l.backoff/2 + time.Duration(r.rng.Int64N(int64(l.backoff/2)+1))
}

// pollCompletions drains the Conn's completions; an error breaks the link.
func (l *link) pollCompletions(r *Replica, now time.Duration) bool {
	// Only signaled ops and failures complete; a failure of an unsignaled
	// op also shows at the next Post, and the heartbeat posts regularly.
	if !l.up || (l.lastSignaled < l.completed && now < r.nextHB) {
		return false
	}
	progress := false
	for {
		k := l.conn.Poll(l.cs[:])
		if k == 0 {
			break
		}
		progress = true
		for _, c := range l.cs[:k] {
			if c.Err != nil {
				l.fail(r, now)
				return true
			}
			if c.ID+1 > l.completed {
				l.completed = c.ID + 1
			}
		}
	}
	if l.up {
		l.backoff = 0
	}
	return progress
}

// post posts wr alone (postList of one).
func (l *link) post(r *Replica, wr rdma.WR) bool {
	l.one[0] = wr
	return l.postList(r, l.one[:]) == 1
}

// slotBuf returns staging slot s's 64-byte buffer, or nil while the write
// that last used it may still read it.
func (l *link) slotBuf(s int) []byte {
	if q := l.stageSeq[s]; q != 0 && q-1 >= l.completed {
		return nil
	}
	return l.stage[s*rowSize : (s+1)*rowSize]
}

// useSlot records that op id (posted) reads slot s, the next slot in turn.
func (l *link) useSlot(s int, id uint64) {
	l.stageSeq[s] = id + 1
	l.stageNext = (s + 1) % stageSlots
}

// postList posts wrs as one list, numbering them and signalling every
// signalEvery ops (selective signalling); it returns how many were posted.
// An error other than a full queue breaks the link.
func (l *link) postList(r *Replica, wrs []rdma.WR) int {
	if !l.up {
		return 0
	}
	last := l.lastSignaled
	for k := range wrs {
		wrs[k].ID = l.postSeq + uint64(k)
		if wrs[k].Kind == rdma.OpRead || wrs[k].ID-last >= signalEvery {
			wrs[k].Flags |= rdma.Signaled
			last = wrs[k].ID
		}
	}
	n, err := l.conn.PostList(wrs)
	for k := range n {
		if wrs[k].Flags&rdma.Signaled != 0 {
			l.lastSignaled = wrs[k].ID
		}
	}
	l.postSeq += uint64(n)
	if err != nil && !errors.Is(err, rdma.ErrQueueFull) {
		l.fail(r, r.now)
	}
	return n
}

// resetOut starts the outgoing ring afresh for receiver incarnation rinc.
func (o *outRing) reset(rinc uint64) {
	o.rinc = rinc
	o.sent, o.posted, o.consumed = 0, 0, 0
}

// room reports whether a record of size bytes fits now.
func (o *outRing) room(size int) bool {
	rs := uint64(len(o.mirror))
	off := o.sent % rs
	need := uint64(size)
	if off+need > rs {
		need += rs - off
	}
	return o.sent-o.consumed+need <= rs
}

// reserve returns the mirror bytes for a record of size bytes (room must
// have said yes), writing a pad record first if it must wrap.
func (o *outRing) reserve(size int, sinc uint64) []byte {
	rs := uint64(len(o.mirror))
	off := o.sent % rs
	if off+uint64(size) > rs {
		if rs-off >= recHdr+8 {
			encodeRecord(o.mirror[off:], recHeader{kind: kPad, sinc: sinc, rinc: o.rinc, seq: o.sent})
		}
		o.sent += rs - off
		off = 0
	}
	return o.mirror[off : off+uint64(size)]
}

// commitRecord seals the record reserved at the current position.
func (o *outRing) commitRecord(h recHeader, sinc uint64) {
	rs := uint64(len(o.mirror))
	off := o.sent % rs
	h.sinc, h.rinc, h.seq = sinc, o.rinc, o.sent
	n := encodeRecord(o.mirror[off:], h)
	o.sent += uint64(n)
	if tail := rs - o.sent%rs; tail < recHdr+8 && tail != rs {
		// Too little room for even a pad record: the reader wraps
		// here (readRing) and acknowledges the ring's end, so the
		// sender skips the tail now, or that acknowledgement would lie
		// beyond what it sent and be refused: a stalled ring.
		o.sent += tail
	}
}

// maxFlush bounds one ring write: records are coalesced up to it (a
// record larger than it is written alone).
const maxFlush = 64 << 10

// ringWrites appends to wrs the writes that post the records in
// [posted, sent), and to ops what each settles: contiguous records go in
// one write (each still carries its own checksum, so the receiver accepts
// them one by one as they become valid); a write ends at a pad record, at
// the end of the ring or at maxFlush bytes.
func (l *link) ringWrites(wrs []rdma.WR, ops []pushOp, region rdma.RegionID) ([]rdma.WR, []pushOp) {
	o := &l.out
	rs := uint64(len(o.mirror))
	posted := o.posted
	for posted < o.sent && len(wrs) < maxPushList {
		off := posted % rs
		if rs-off < recHdr+8 {
			posted += rs - off
			continue
		}
		// Gather records from off while they are contiguous.
		pos, end, next := posted, off, posted
		for pos < o.sent {
			roff := pos % rs
			if pos-posted >= rs-off || rs-roff < recHdr+8 {
				break // at the ring's end, or wrapping without a pad record
			}
			w0 := binary.LittleEndian.Uint64(o.mirror[roff:])
			if uint8(w0>>32) == kPad {
				end = roff + recHdr + 8
				next = pos + (rs - roff)
				break
			}
			size := uint64(recSize(int(uint32(w0))))
			if end > off && end+size-off > maxFlush {
				break
			}
			end = roff + size
			pos += size
			next = pos
		}
		wrs = append(wrs, rdma.WR{Kind: rdma.OpWrite, Region: region, Offset: off, Buf: o.mirror[off:end]})
		ops = append(ops, pushOp{kind: pushRecords, next: next})
		posted = next
	}
	return wrs, ops
}
