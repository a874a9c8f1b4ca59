package multicast

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// batchMsg is one message of a batch entry, as scan orders it.
type batchMsg struct {
	src    uint8
	client uint32
	pos    uint64
	fwd    []uint64
	rec    record
}

func randBatch(rng *rand.Rand) []batchMsg {
	ms := make([]batchMsg, 1+rng.IntN(12))
	for i := range ms {
		m := &ms[i]
		m.src, m.client = srcClient, uint32(rng.IntN(100))
		if rng.IntN(3) == 0 {
			m.src, m.client = srcParent, 0
		}
		m.pos = 1 + rng.Uint64N(1<<40)
		for range rng.IntN(4) {
			m.fwd = append(m.fwd, rng.Uint64())
		}
		m.rec = record{pos: rng.Uint64(), id: MsgID{Client: m.client, Inc: rng.Uint64(), Seq: rng.Uint64()},
			dst: tree.Set(rng.Uint64()), reply: Addr{Node: 3, Region: 9}, payload: make([]byte, rng.IntN(40))}
		for k := range m.rec.payload {
			m.rec.payload[k] = byte(rng.Uint32())
		}
	}
	return ms
}

func encodeBatch(ms []batchMsg) []byte {
	b := appendBatchHeader(nil, len(ms))
	for i := range ms {
		m := &ms[i]
		b = appendBatchSub(b, m.src, m.client, m.pos, m.fwd, &m.rec)
	}
	return b
}

// TestBatchEntryRoundTrip: a batch entry decodes to the messages it was
// built from, in order (decode(encode(x)) == x), for random batches; its
// size is the sum scan computes (batchHdr and each sub-entry padded); and
// every message entry of the old format still decodes as before.
func TestBatchEntryRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 17))
	for range 2000 {
		ms := randBatch(rng)
		b := encodeBatch(ms)
		size := batchHdr
		for _, m := range ms {
			size += pad8(messageEntrySize(len(m.fwd), len(m.rec.payload)))
		}
		if len(b) != size || len(b)%8 != 0 {
			t.Fatalf("batch of %d: %d bytes, computed %d", len(ms), len(b), size)
		}
		e, err := decodeEntry(b)
		if err != nil || e.kind != entryBatch || e.count != len(ms) {
			t.Fatalf("decode: kind %d count %d (want %d), %v", e.kind, e.count, len(ms), err)
		}
		var got []batchMsg
		for rest := e.subs; len(rest) > 0; {
			var sub []byte
			sub, rest = nextSub(rest)
			se, err := decodeEntry(sub)
			if err != nil {
				t.Fatal(err)
			}
			m := batchMsg{src: se.src, client: se.client, pos: se.pos, rec: se.rec}
			for i := range len(se.fwd) / 8 {
				m.fwd = append(m.fwd, se.fwdPos(i))
			}
			got = append(got, m)
		}
		if !slices.EqualFunc(got, ms, func(a, b batchMsg) bool {
			return a.src == b.src && a.client == b.client && a.pos == b.pos && slices.Equal(a.fwd, b.fwd) &&
				a.rec.pos == b.rec.pos && a.rec.id == b.rec.id && a.rec.dst == b.rec.dst && a.rec.reply == b.rec.reply &&
				bytes.Equal(a.rec.payload, b.rec.payload)
		}) {
			t.Fatalf("batch decodes to %+v, built from %+v", got, ms)
		}
		// The first message alone, as an old-format message entry.
		m := &ms[0]
		one := appendMessageEntry(nil, m.src, m.client, m.pos, m.fwd, &m.rec)
		if e, err := decodeEntry(one); err != nil || e.kind != entryMessage || e.pos != m.pos || !bytes.Equal(e.rec.payload, m.rec.payload) {
			t.Fatalf("message entry: %+v, %v", e, err)
		}
	}
}

// TestBatchEntryGarbage: decodeEntry never panics on garbage: random
// bytes, and valid batches truncated, extended or with any byte changed.
// What it accepts walks cleanly (nextSub) into valid message entries.
func TestBatchEntryGarbage(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	check := func(b []byte) {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("decode of %x panicked: %v", b, p)
			}
		}()
		e, err := decodeEntry(b)
		if err != nil || e.kind != entryBatch {
			return
		}
		n := 0
		for rest := e.subs; len(rest) > 0; n++ {
			var sub []byte
			sub, rest = nextSub(rest)
			if se, err := decodeEntry(sub); err != nil || se.kind != entryMessage {
				t.Fatalf("accepted batch has a bad sub-entry %d: %v", n, err)
			}
		}
		if n != e.count {
			t.Fatalf("accepted batch of %d walks %d sub-entries", e.count, n)
		}
	}
	refused := 0
	for range 3000 {
		b := encodeBatch(randBatch(rng))
		switch rng.IntN(4) {
		case 0:
			b = b[:rng.IntN(len(b))]
		case 1:
			b = append(b, make([]byte, 1+rng.IntN(16))...)
		case 2:
			b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		case 3:
			b = make([]byte, rng.IntN(200))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if len(b) > 0 && rng.IntN(2) == 0 {
				b[0] = entryBatch
			}
		}
		if _, err := decodeEntry(b); err != nil {
			refused++
		}
		check(b)
	}
	if refused < 1000 {
		t.Fatalf("only %d of 3000 damaged entries refused", refused)
	}
}

// traceFSM records the calls a BatchFSM application gets.
type traceFSM struct {
	nopFSM
	log *[]string
}

func (f traceFSM) Apply(e broadcast.Entry) []byte {
	*f.log = append(*f.log, fmt.Sprintf("apply %d", e.Index))
	return []byte("r")
}
func (f traceFSM) BeginBatch() { *f.log = append(*f.log, "begin") }
func (f traceFSM) EndBatch()   { *f.log = append(*f.log, "end") }

// TestBatchApplyOrder: a batch entry's messages destined to the group are
// applied between one BeginBatch and one EndBatch, and their replies reach
// the leader's reply path (onReply) only after EndBatch; a message for a
// child only (passing through) is applied without a bracket when it is
// alone in its batch; a plain message entry gets no bracket and its reply
// at once; dedup stays per message (a batch repeating a position applies
// it once).
func TestBatchApplyOrder(t *testing.T) {
	var log []string
	s := fuzzState(t)
	s.app = traceFSM{log: &log}
	s.batchApp = traceFSM{log: &log}
	s.onReply = func(c uint32, slot int) { log = append(log, fmt.Sprintf("reply c%d", c)) }
	s.reset(0, 1, Addr{Node: 9, Region: 1})
	s.reset(1, 1, Addr{Node: 9, Region: 2})
	msg := func(c uint32, pos uint64, dst tree.Set) batchMsg {
		m := batchMsg{src: srcClient, client: c, pos: pos,
			rec: record{pos: pos, id: MsgID{Client: c, Inc: 1, Seq: pos}, dst: dst, payload: []byte("p")}}
		if dst.Has(1) {
			m.fwd = []uint64{s.out[0] + 1}
		}
		return m
	}
	check := func(step string, want ...string) {
		t.Helper()
		if !slices.Equal(log, want) {
			t.Fatalf("%s: calls %q, want %q", step, log, want)
		}
		log = log[:0]
	}
	s.Apply(entryOf(encodeBatch([]batchMsg{msg(0, 1, tree.Of(0)), msg(1, 1, tree.Of(0)), msg(0, 2, tree.Of(0))})))
	check("batch of 3", "begin", "apply 1", "apply 2", "apply 3", "end", "reply c0", "reply c1", "reply c0")
	s.Apply(entryOf(encodeBatch([]batchMsg{msg(1, 2, tree.Of(1))})))
	check("batch passing through")
	m := msg(0, 3, tree.Of(0))
	s.Apply(entryOf(appendMessageEntry(nil, m.src, m.client, m.pos, m.fwd, &m.rec)))
	check("message entry", "apply 4", "reply c0")
	s.Apply(entryOf(encodeBatch([]batchMsg{msg(0, 3, tree.Of(0)), msg(0, 4, tree.Of(0)), msg(1, 3, tree.Of(0, 1))})))
	check("batch with a duplicate", "begin", "apply 5", "apply 6", "end", "reply c0", "reply c1")
	if s.dups != 1 || s.cpos[0] != 4 || s.cpos[1] != 3 || s.out[0] != 2 {
		t.Fatalf("dups %d, positions %v, child out %v", s.dups, s.cpos, s.out)
	}
}
