package broadcast

import (
	"encoding/binary"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// link is this replica's side of everything it sends to one peer: an
// rdma.Link (the Conn, reconnected with backoff when it breaks, and a
// staging ring for rows and acknowledgement words, whose bytes stay
// untouched until their write completes), the outgoing ring mirrored into
// the peer's incoming ring, and a snapshot fetch in progress from that peer
// (on a Conn of its own).
type link struct {
	io        *rdma.Link
	fetchDial *rdma.Connector // opens the snapshot fetch's Conn
	peer      rdma.NodeID
	idx       int

	conn uint64 // io.Conn() that the state below was (re-)posted on
	up   bool   // io was up at the last look (traces "down" once)

	dirty        [nTables]bool // rows to push to this peer
	ackDirty     bool
	commitSent   MsgHdr // commit point in the last CommitSST row pushed
	commitSentAt time.Duration
	notifyOwed   bool // a write that should have rung the peer's doorbell was not posted with Notify

	out outRing

	wrs []rdma.WR // ring writes of a push (pushLink), reused
	ops []pushOp

	fetch snapFetch
}

// stageBytes is a link's staging ring: 128 rows.
const stageBytes = 128 * rowSize

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

func (r *Replica) newLink(peer rdma.NodeID, idx int) *link {
	return &link{
		io: rdma.NewLink(rdma.LinkConfig{
			Node:       r.node,
			Peer:       peer,
			Backoff:    rdma.Backoff{Min: r.cfg.ReconnectMin, Max: r.cfg.ReconnectMax},
			Rand:       r.rng, // jitter from the replica's seeded randomness
			StageBytes: stageBytes,
		}),
		peer: peer,
		idx:  idx,
		out:  outRing{mirror: make([]byte, r.cfg.RingSize)},
	}
}

// isUp reports whether the link's Conn is usable.
func (l *link) isUp() bool { return l.io.IsUp() }

// connect (re)opens the Conn if it is down and its backoff has passed, and
// after each new Conn re-posts what the peer may have missed: every row,
// our ack, and the ring from its last acknowledged byte (rewriting a
// landed record is harmless: same bytes at the same place).
func (l *link) connect(r *Replica, now time.Duration) {
	if !l.io.Up(now) || l.io.Conn() == l.conn {
		return
	}
	l.conn, l.up = l.io.Conn(), true
	r.ctr.Reconnects++
	for t := range l.dirty {
		l.dirty[t] = true
	}
	l.ackDirty = true
	l.out.posted = l.out.consumed
	r.tracef("link %d->%d up", r.self, l.peer)
}

// noteDown traces the link's failure once (Reap or Flush failed it).
func (l *link) noteDown(r *Replica) {
	if l.up && !l.io.IsUp() {
		l.up = false
		r.tracef("link %d->%d down", r.self, l.peer)
	}
}

// pollCompletions reaps the Conn's completions; an error breaks the link.
func (l *link) pollCompletions(r *Replica, now time.Duration) bool {
	progress := l.io.Reap(now)
	l.noteDown(r)
	return progress
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
		ops = append(ops, pushOp{next: next})
		posted = next
	}
	return wrs, ops
}
