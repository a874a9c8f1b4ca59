package multicast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// state is TRAM's replicated state in one group: what every replica
// derives from the group's Acuerdo log by applying it, and what a snapshot
// carries. It is the broadcast.FSM of the group's Acuerdo replica and
// wraps the application's FSM, which sees only the messages destined to
// this group, in order, with consecutive indices.
//
// The input pointers (TRAM Alg. 2's in[]) and output pointers (out[]) here
// are the applied ones; a new leader starts from them, which is Alg. 5
// step 1 ("recompute the input pointers from the log"): when its epoch's
// diff commits, every entry that will ever be delivered from earlier
// epochs has been applied.
type state struct {
	g         tree.Group
	t         *tree.Tree
	children  []tree.Group
	childIdx  [tree.MaxGroups]int8 // child group -> index in children, -1 if not a child
	window    int
	pslots    int
	slotSize  int
	maxResult int
	app       broadcast.FSM
	batchApp  BatchFSM        // app, if it brackets batches
	preApp    BatchPrefetcher // app, if it prefetches batches

	// replicated
	cinc      []uint64 // per client slot: the registered incarnation (0: none)
	caddr     []Addr   // per client slot: its reply address
	cpos      []uint64 // per client slot: last consumed position of its ring
	ppos      uint64   // last consumed position of the parent ring
	out       []uint64 // per child: last assigned parent-ring position
	delivered uint64   // delivery index: messages delivered in this group
	replies   []replyRec
	fwd       [][]byte // per child: pslots x slotSize, the forwarded records by position mod pslots

	// Counters of anomalies, which the simulator asserts are zero: a
	// duplicate that the leader's pointers should have prevented, a gap in
	// positions, a record of an unregistered incarnation.
	dups, gaps, stale uint64
	knobs             *testingKnobs // the replica's planted bugs (knobs.go)

	// hooks for the replica (not replicated): what Apply produced that a
	// leader sends.
	onReply func(c uint32, slot int)
	onHello func(c uint32)
	// replies a batch produced, handed to onReply after its EndBatch
	batchReplies []replyOf
	// batchMsgs: the messages of the batch entry being applied, decoded
	// once for the prefetch and the apply (reused across batches).
	batchMsgs []logEntry
	inBatch   bool
	// ownSpare is the buffer of a persisted snapshot's own part, which
	// the next Snapshot encodes into (its pages mapped and its size
	// right): encoding into a growing fresh slice on the polling goroutine
	// cost a capture up to tens of ms of CPU on a loaded machine, in
	// page faults and copies of each growth (issue 19, perf of kvserver).
	ownSpare atomic.Pointer[[]byte]
}

type replyOf struct {
	c    uint32
	slot int
}

// BatchFSM is implemented by an application (the broadcast.FSM given to
// New) that wants to know which deliveries come from one log entry: a
// batch entry's messages destined to the group are applied between one
// BeginBatch and one EndBatch, on the polling goroutine, with nothing
// else (no Snapshot, no Restore) in between. An application may defer
// making what it applied visible to others (kv.Table publishes its header
// once, at EndBatch): the replies to a batch's messages are handed to the
// leader's reply path only after EndBatch returns, never before the data
// they acknowledge is published. A message in an entry of its own (a
// batch of one, or MaxBatch 1) gets no bracket: its Apply stands alone,
// as for an application without BatchFSM.
type BatchFSM interface {
	BeginBatch()
	EndBatch()
}

// BatchPrefetcher is implemented by a BatchFSM application that can start
// the memory loads of a batch's messages before it applies them (kv.Table
// touches the index buckets and records of their keys, so that the CPU
// overlaps their cache misses instead of taking them one after the
// other). Prefetch is called with the payload of each message of a batch
// entry destined to the group, in order, before BeginBatch, duplicates
// and stale messages included; it is a hint and must not change what the
// application applies or returns.
type BatchPrefetcher interface {
	Prefetch(payload []byte)
}

// replyRec is one remembered outcome (the exactly-once table: per client,
// the last Window sequence numbers' replies).
type replyRec struct {
	reply
	addr Addr
	buf  []byte // maxResult bytes; result aliases it
}

func newState(cfg *Config, app broadcast.FSM, knobs *testingKnobs) *state {
	s := &state{
		g: cfg.Group, t: cfg.Tree, children: cfg.Tree.Children(cfg.Group),
		window: cfg.ClientSlots, pslots: cfg.ParentSlots, slotSize: cfg.SlotSize, maxResult: cfg.MaxResult,
		app: app, knobs: knobs,
		cinc: make([]uint64, len(cfg.ClientNodes)), caddr: make([]Addr, len(cfg.ClientNodes)), cpos: make([]uint64, len(cfg.ClientNodes)),
		replies: make([]replyRec, len(cfg.ClientNodes)*cfg.ClientSlots),
	}
	s.batchApp, _ = app.(BatchFSM)
	if s.batchApp != nil {
		s.preApp, _ = app.(BatchPrefetcher)
	}
	for i := range s.childIdx {
		s.childIdx[i] = -1
	}
	for i, c := range s.children {
		s.childIdx[c] = int8(i)
	}
	s.out = make([]uint64, len(s.children))
	s.fwd = make([][]byte, len(s.children))
	for i := range s.fwd {
		s.fwd[i] = make([]byte, s.pslots*s.slotSize)
	}
	for i := range s.replies {
		s.replies[i].buf = make([]byte, cfg.MaxResult)
	}
	// The first capture's buffer, as large as an encoding can be, its
	// pages touched here (replica construction) rather than in the
	// capture on the polling goroutine.
	own := make([]byte, s.maxEncoded())
	for i := 0; i < len(own); i += 4096 {
		own[i] = 0
	}
	own = own[:0]
	s.ownSpare.Store(&own)
	return s
}

// maxEncoded bounds the length of encode's output: every child's forward
// buffer and every reply slot full.
func (s *state) maxEncoded() int {
	n := 6*8 + 3*8*len(s.cinc) + 8
	n += len(s.children) * (8 + s.pslots*(8+pad8(s.slotSize)))
	return n + len(s.replies)*(6*8+pad8(s.maxResult))
}

// fwdSlot returns the bytes of the slot holding child i's position q.
func (s *state) fwdSlot(i int, q uint64) []byte {
	off := int(q%uint64(s.pslots)) * s.slotSize
	return s.fwd[i][off : off+s.slotSize]
}

// Apply implements broadcast.FSM: it applies one entry of the group's log
// (TRAM Alg. 2 steps "leader message delivery" and "followers message
// delivery": every replica runs the same code on the same committed
// entries).
func (s *state) Apply(e broadcast.Entry) []byte {
	le, err := decodeEntry(e.Data)
	if err != nil {
		panic(fmt.Sprintf("multicast: group %d: committed entry %d: %v", s.g, e.Index, err)) // only our own leaders write entries
	}
	switch le.kind {
	case entryReset:
		s.reset(le.client, le.pos, le.addr)
		return nil
	case entryBatch:
		s.applyBatch(e, &le)
		return nil
	}
	s.applyMessage(e, &le)
	return nil
}

// applyBatch applies a batch entry's messages in order, each exactly as
// an entry of its own, between BeginBatch and EndBatch; their replies go
// to the leader after EndBatch.
func (s *state) applyBatch(e broadcast.Entry, le *logEntry) {
	msgs := s.batchMsgs[:0]
	for rest := le.subs; len(rest) > 0; {
		var sub []byte
		sub, rest = nextSub(rest)
		m, err := decodeEntry(sub)
		if err != nil { // decodeEntry validated the batch
			panic(fmt.Sprintf("multicast: group %d: committed entry %d: %v", s.g, e.Index, err))
		}
		msgs = append(msgs, m)
	}
	if s.preApp != nil {
		for i := range msgs {
			if msgs[i].rec.dst.Has(s.g) {
				s.preApp.Prefetch(msgs[i].rec.payload)
			}
		}
	}
	s.inBatch = true
	began := false
	for i := range msgs {
		m := &msgs[i]
		if s.batchApp != nil && !began && m.rec.dst.Has(s.g) {
			s.batchApp.BeginBatch()
			began = true
		}
		s.applyMessage(e, m)
	}
	clear(msgs) // no payload kept past the entry
	s.batchMsgs = msgs[:0]
	if began {
		s.batchApp.EndBatch()
	}
	s.inBatch = false
	for _, r := range s.batchReplies {
		if s.onReply != nil {
			s.onReply(r.c, r.slot)
		}
	}
	s.batchReplies = s.batchReplies[:0]
}

// applyMessage applies one message entry (alone or in a batch).
func (s *state) applyMessage(e broadcast.Entry, le *logEntry) {
	// Alg. 2 / Alg. 5: each input position is consumed once; a new
	// leader's pointers start after the applied ones, so a duplicate is
	// a bug the simulator counts (and nothing is applied twice).
	switch le.src {
	case srcClient:
		c := le.client
		if int(c) >= len(s.cpos) || le.rec.id.Client != c {
			panic(fmt.Sprintf("multicast: group %d: entry %d names client slot %d (record %v)", s.g, e.Index, c, le.rec.id))
		}
		if le.rec.id.Inc != s.cinc[c] {
			s.stale++
			return
		}
		if le.pos <= s.cpos[c] && !s.knobs.noDedup {
			s.dups++
			return
		}
		if le.pos != s.cpos[c]+1 {
			s.gaps++
		}
		s.cpos[c] = le.pos
	case srcParent:
		if le.pos <= s.ppos && !s.knobs.noDedup {
			s.dups++
			return
		}
		if le.pos != s.ppos+1 {
			s.gaps++
		}
		s.ppos = le.pos
	}
	// The positions assigned in the children (Alg. 2: stored in the log
	// entry, so a new leader re-forwards to the same positions).
	next := s.t.Next(s.g, le.rec.dst)
	k := 0
	for _, c := range s.children {
		if !next.Has(c) {
			continue
		}
		i := s.childIdx[c]
		q := le.fwdPos(k)
		k++
		if q != s.out[i]+1 {
			s.gaps++
		}
		s.out[i] = q
		r := le.rec
		r.pos = q
		encodeRecord(s.fwdSlot(int(i), q), &r)
	}
	if !le.rec.dst.Has(s.g) {
		return // passes through: ordered here, delivered below (TRAM is not genuine)
	}
	s.delivered++
	res := s.app.Apply(broadcast.Entry{Index: s.delivered, Hdr: e.Hdr, Data: le.rec.payload})
	s.remember(le.rec.id, le.rec.reply, s.delivered, res)
}

// remember keeps the outcome in the exactly-once table, unless the slot
// holds a later message of the client, and hands it to the leader.
func (s *state) remember(id MsgID, addr Addr, index uint64, res []byte) {
	if int(id.Client) >= len(s.cinc) {
		return
	}
	slot := int(id.Client)*s.window + int(id.Seq%uint64(s.window))
	r := &s.replies[slot]
	if r.inc > id.Inc || r.inc == id.Inc && r.seq > id.Seq {
		return
	}
	r.seq, r.inc, r.index, r.addr, r.flags = id.Seq, id.Inc, index, addr, 0
	n := copy(r.buf, res)
	if n < len(res) {
		r.flags = replyTruncated
	}
	r.result = r.buf[:n]
	if s.inBatch && !s.knobs.replyBeforePublish {
		s.batchReplies = append(s.batchReplies, replyOf{id.Client, slot})
	} else if s.onReply != nil {
		s.onReply(id.Client, slot)
	}
}

// reset registers incarnation inc of client slot c: its ring starts again
// at position 1 and its replies go to addr.
func (s *state) reset(c uint32, inc uint64, addr Addr) {
	if int(c) >= len(s.cinc) || inc <= s.cinc[c] {
		s.stale++
		return
	}
	s.cinc[c], s.caddr[c], s.cpos[c] = inc, addr, 0
	if s.onHello != nil {
		s.onHello(c)
	}
}

// Snapshot implements broadcast.FSM: TRAM's state, copied (it is small:
// pointers, the exactly-once table and the forward buffers), followed by
// the application's snapshot.
func (s *state) Snapshot() (broadcast.FSMSnapshot, error) {
	app, err := s.app.Snapshot()
	if err != nil {
		return nil, err
	}
	var b []byte
	if p := s.ownSpare.Swap(nil); p != nil {
		b = (*p)[:0]
	}
	own := s.encode(b)
	if s.knobs.ownSpareEarly {
		s.ownSpare.Store(&own) // planted: offered while this capture needs it
	}
	return &snap{s: s, own: own, n: len(own), app: app}, nil
}

type snap struct {
	s   *state
	own []byte // nil once Persist copied it and handed it on
	n   int    // len(own)
	app broadcast.FSMSnapshot
}

func (p *snap) Size() int { return 8 + p.n + p.app.Size() }

// Persist copies the own part and hands its buffer on to the next
// Snapshot (any goroutine, once), then persists the application's.
func (p *snap) Persist(dst []byte) error {
	if p.own == nil {
		return errors.New("multicast: a snapshot persisted twice")
	}
	binary.LittleEndian.PutUint64(dst, uint64(p.n))
	copy(dst[8:], p.own)
	own := p.own
	p.own = nil
	p.s.ownSpare.Store(&own)
	return p.app.Persist(dst[8+p.n:])
}

func (p *snap) Release() { p.app.Release() }

const snapVersion = 1

// encode appends the replicated state to b:
//
//	[version u64][group u64][clients u64][children u64][delivered u64][ppos u64]
//	clients x [inc u64][addr u64][pos u64]
//	children x [out u64] then that child's valid records, each
//	  [len u64][record bytes padded to 8]
//	replies: [count u64] then count x [slot u64][seq][inc][index][addr][flags|len u64][result padded]
func (s *state) encode(b []byte) []byte {
	le := binary.LittleEndian
	for _, v := range []uint64{snapVersion, uint64(s.g), uint64(len(s.cinc)), uint64(len(s.children)), s.delivered, s.ppos} {
		b = le.AppendUint64(b, v)
	}
	for c := range s.cinc {
		b = le.AppendUint64(b, s.cinc[c])
		b = le.AppendUint64(b, s.caddr[c].word())
		b = le.AppendUint64(b, s.cpos[c])
	}
	for i := range s.children {
		b = le.AppendUint64(b, s.out[i])
		lo := uint64(1)
		if s.out[i] > uint64(s.pslots) {
			lo = s.out[i] - uint64(s.pslots) + 1
		}
		for q := lo; q <= s.out[i] && s.out[i] > 0; q++ {
			slot := s.fwdSlot(i, q)
			n := recordSize(int(le.Uint32(slot[28:])))
			b = le.AppendUint64(b, uint64(n))
			b = append(b, slot[:n]...)
		}
	}
	count := 0
	for i := range s.replies {
		if s.replies[i].seq != 0 {
			count++
		}
	}
	b = le.AppendUint64(b, uint64(count))
	for i := range s.replies {
		r := &s.replies[i]
		if r.seq == 0 {
			continue
		}
		for _, v := range []uint64{uint64(i), r.seq, r.inc, r.index, r.addr.word(), uint64(r.flags)<<32 | uint64(len(r.result))} {
			b = le.AppendUint64(b, v)
		}
		b = append(b, r.result...)
		b = append(b, make([]byte, pad8(len(r.result))-len(r.result))...)
	}
	return b
}

// errSnapshot reports a snapshot that does not decode.
var errSnapshot = errors.New("multicast: malformed snapshot")

// Restore implements broadcast.FSM.
func (s *state) Restore(b []byte) error {
	le := binary.LittleEndian
	if len(b) < 8 {
		return fmt.Errorf("%w: %d bytes", errSnapshot, len(b))
	}
	n := le.Uint64(b)
	if n > uint64(len(b)-8) {
		return fmt.Errorf("%w: own part of %d bytes in %d", errSnapshot, n, len(b))
	}
	if err := s.decode(b[8 : 8+n]); err != nil {
		return err
	}
	return s.app.Restore(b[8+n:])
}

// decode replaces the replicated state with an encoded one; on error the
// state is unchanged.
func (s *state) decode(b []byte) error {
	d := decoder{b: b}
	if v := d.u64(); v != snapVersion {
		return fmt.Errorf("%w: version %d", errSnapshot, v)
	}
	if g := d.u64(); g != uint64(s.g) {
		return fmt.Errorf("%w: of group %d, this is group %d", errSnapshot, g, s.g)
	}
	if c, k := d.u64(), d.u64(); c != uint64(len(s.cinc)) || k != uint64(len(s.children)) {
		return fmt.Errorf("%w: %d clients and %d children, configured %d and %d", errSnapshot, c, k, len(s.cinc), len(s.children))
	}
	n := newShadow(s)
	n.delivered, n.ppos = d.u64(), d.u64()
	for c := range n.cinc {
		n.cinc[c], n.caddr[c], n.cpos[c] = d.u64(), addrOf(d.u64()), d.u64()
	}
	for i := range s.children {
		n.out[i] = d.u64()
		lo := uint64(1)
		if n.out[i] > uint64(s.pslots) {
			lo = n.out[i] - uint64(s.pslots) + 1
		}
		for q := lo; q <= n.out[i] && n.out[i] > 0 && d.err == nil; q++ {
			size := int(d.u64())
			rec := d.bytes(size)
			if d.err != nil {
				break
			}
			if size > s.slotSize {
				return fmt.Errorf("%w: forwarded record of %d bytes, slots are %d", errSnapshot, size, s.slotSize)
			}
			if size < recHdr+recCheck || size != recordSize(int(leU32(rec[28:]))) {
				return fmt.Errorf("%w: forwarded record of %d bytes at position %d", errSnapshot, size, q)
			}
			if _, err := decodeRecord(rec, q); err != nil {
				return fmt.Errorf("%w: forwarded record at position %d of child %d: %v", errSnapshot, q, s.children[i], err)
			}
			copy(n.fwdSlot(i, q), rec)
		}
	}
	count := d.u64()
	for k := uint64(0); k < count && d.err == nil; k++ {
		slot := d.u64()
		if slot >= uint64(len(n.replies)) {
			return fmt.Errorf("%w: reply slot %d of %d", errSnapshot, slot, len(n.replies))
		}
		r := &n.replies[slot]
		r.seq, r.inc, r.index, r.addr = d.u64(), d.u64(), d.u64(), addrOf(d.u64())
		fl := d.u64()
		r.flags = uint32(fl >> 32)
		size := int(uint32(fl))
		if size > s.maxResult {
			return fmt.Errorf("%w: reply result of %d bytes, limit %d", errSnapshot, size, s.maxResult)
		}
		res := d.bytes(pad8(size))
		if d.err == nil {
			r.result = r.buf[:copy(r.buf, res[:size])]
		}
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errSnapshot, len(d.b))
	}
	s.cinc, s.caddr, s.cpos, s.out, s.fwd, s.replies = n.cinc, n.caddr, n.cpos, n.out, n.fwd, n.replies
	s.delivered, s.ppos = n.delivered, n.ppos
	return nil
}

// newShadow returns an empty state of s's shape to decode into.
func newShadow(s *state) *state {
	n := &state{pslots: s.pslots, slotSize: s.slotSize}
	n.cinc, n.caddr, n.cpos = make([]uint64, len(s.cinc)), make([]Addr, len(s.cinc)), make([]uint64, len(s.cinc))
	n.out = make([]uint64, len(s.children))
	n.fwd = make([][]byte, len(s.children))
	for i := range n.fwd {
		n.fwd[i] = make([]byte, s.pslots*s.slotSize)
	}
	n.replies = make([]replyRec, len(s.replies))
	for i := range n.replies {
		n.replies[i].buf = make([]byte, s.maxResult)
	}
	return n
}

// decoder reads little-endian words, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = fmt.Errorf("%w: truncated", errSnapshot)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = fmt.Errorf("%w: truncated (%d bytes wanted, %d left)", errSnapshot, n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
