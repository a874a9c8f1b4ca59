package multicast

import (
	"bytes"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// FuzzRecord: a ring slot is written by another process (a client, a
// parent group's leader). Any bytes either decode to a record whose
// payload fits the slot and that encodes back to the same bytes, or are
// refused; a valid record survives the round trip, and flipping any byte
// of it is detected.
func FuzzRecord(f *testing.F) {
	rec := record{pos: 7, id: MsgID{Client: 3, Inc: 9, Seq: 11}, dst: tree.Of(1, 2), reply: Addr{Node: 5, Region: 6}, payload: []byte("hello")}
	f.Add(encodeRecord(make([]byte, 256), &rec), uint64(7), 5)
	f.Add(make([]byte, 64), uint64(1), 0)
	f.Fuzz(func(t *testing.T, slot []byte, pos uint64, flip int) {
		r, err := decodeRecord(slot, pos)
		if err == nil {
			if r.pos != pos || recordSize(len(r.payload)) > len(slot) {
				t.Fatalf("decoded position %d (asked %d), payload %d in a %d-byte slot", r.pos, pos, len(r.payload), len(slot))
			}
			again := encodeRecord(make([]byte, len(slot)), &r)
			if !bytes.Equal(again, slot[:len(again)]) {
				t.Fatalf("record does not re-encode to its bytes")
			}
		}
		// a record we encode decodes to itself, and a flipped byte is caught
		if len(slot) > 200 {
			slot = slot[:200]
		}
		mine := record{pos: pos | 1, id: MsgID{Client: 1, Inc: 2, Seq: 3}, dst: tree.Set(pos), reply: Addr{Node: 4, Region: 5}, payload: slot}
		buf := encodeRecord(make([]byte, recordSize(len(slot))), &mine)
		got, err := decodeRecord(buf, mine.pos)
		if err != nil || got.id != mine.id || got.dst != mine.dst || got.reply != mine.reply || !bytes.Equal(got.payload, slot) {
			t.Fatalf("round trip: %+v, %v", got, err)
		}
		if flip < 0 {
			flip = -flip
		}
		i := flip % len(buf) // the check covers every byte of the record, padding included
		buf[i] ^= 0x40
		if _, err := decodeRecord(buf, mine.pos); err == nil {
			t.Fatalf("flipped byte %d of %d not detected", i, len(buf))
		}
	})
}

// FuzzReply: a reply slot is written into a client's memory by a group's
// leader. Any bytes decode to a reply for exactly the asked message whose
// result fits, or are refused.
func FuzzReply(f *testing.F) {
	rp := reply{seq: 4, inc: 2, index: 10, result: []byte("ok")}
	f.Add(encodeReply(make([]byte, 128), 3, &rp), uint32(3), uint64(2), uint64(4))
	f.Fuzz(func(t *testing.T, slot []byte, g uint32, inc, seq uint64) {
		got, ok := decodeReply(slot, tree.Group(g), inc, seq)
		if ok {
			if got.seq != seq || got.inc != inc || replyHdr+pad8(len(got.result))+8 > len(slot) {
				t.Fatalf("decoded %+v for (%d,%d) from %d bytes", got, inc, seq, len(slot))
			}
		}
		mine := reply{seq: seq, inc: inc, index: seq ^ inc, result: slot[:min(len(slot), 64)]}
		buf := encodeReply(make([]byte, replySlot(64)), tree.Group(g), &mine)
		back, ok := decodeReply(buf, tree.Group(g), inc, seq)
		if !ok || back.index != mine.index || !bytes.Equal(back.result, mine.result) {
			t.Fatalf("reply round trip failed")
		}
		if _, ok := decodeReply(buf, tree.Group(g)+1, inc, seq); ok {
			t.Fatalf("a reply of group %d decoded as group %d's", g, g+1)
		}
	})
}

// FuzzEntry: log entries come from this group's leaders (through
// Acuerdo, checksummed), yet decode must refuse garbage rather than
// panic, and an entry we build decodes to what we built.
func FuzzEntry(f *testing.F) {
	rec := record{pos: 3, id: MsgID{Client: 1, Inc: 1, Seq: 1}, dst: tree.Of(0, 2), payload: []byte("x")}
	f.Add(appendMessageEntry(nil, srcClient, 1, 3, []uint64{5, 6}, &rec))
	f.Add(appendResetEntry(nil, 2, 77, Addr{Node: 1, Region: 2}))
	// batches: one sub-entry, several (client and parent sources, with and
	// without child positions, payloads of every padding)
	one := appendBatchHeader(nil, 1)
	f.Add(appendBatchSub(one, srcClient, 1, 3, []uint64{5, 6}, &rec))
	many := appendBatchHeader(nil, 4)
	for i := range 4 {
		r := rec
		r.payload = bytes.Repeat([]byte{byte('a' + i)}, i*3)
		src, client := uint8(srcClient), uint32(i)
		if i%2 == 1 {
			src, client = srcParent, 0
		}
		many = appendBatchSub(many, src, client, uint64(10+i), []uint64{uint64(i)}[:i%2], &r)
	}
	f.Add(many)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			return
		}
		switch e.kind {
		case entryReset:
			if again := appendResetEntry(nil, e.client, e.pos, e.addr); !bytes.Equal(again, b) {
				t.Fatalf("reset entry does not re-encode")
			}
		case entryMessage:
			fwd := make([]uint64, len(e.fwd)/8)
			for i := range fwd {
				fwd[i] = e.fwdPos(i)
			}
			again := appendMessageEntry(nil, e.src, e.client, e.pos, fwd, &e.rec)
			if !bytes.Equal(again, b) {
				t.Fatalf("message entry does not re-encode")
			}
		case entryBatch:
			again := appendBatchHeader(nil, e.count)
			n := 0
			for rest := e.subs; len(rest) > 0; n++ {
				var sub []byte
				sub, rest = nextSub(rest)
				se, err := decodeEntry(sub)
				if err != nil || se.kind != entryMessage {
					t.Fatalf("sub-entry %d of an accepted batch: kind %d, %v", n, se.kind, err)
				}
				fwd := make([]uint64, len(se.fwd)/8)
				for i := range fwd {
					fwd[i] = se.fwdPos(i)
				}
				again = appendBatchSub(again, se.src, se.client, se.pos, fwd, &se.rec)
			}
			if n != e.count || !bytes.Equal(again, b) {
				t.Fatalf("batch entry of %d sub-entries (%d walked) does not re-encode", e.count, n)
			}
		default:
			t.Fatalf("decoded unknown kind %d", e.kind)
		}
	})
}

// FuzzSnapshot: a snapshot is fetched from another replica. Restore either
// refuses it and leaves the state unchanged, or takes it and encodes it
// back to the same bytes.
func FuzzSnapshot(f *testing.F) {
	s := fuzzState(f)
	rec := record{pos: 1, id: MsgID{Client: 0, Inc: 1, Seq: 1}, dst: tree.Of(1), payload: []byte("p")}
	s.cinc[0] = 1
	s.Apply(entryOf(appendMessageEntry(nil, srcClient, 0, 1, []uint64{1}, &rec)))
	f.Add(s.encode(nil))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := fuzzState(t)
		before := s.encode(nil)
		if err := s.decode(b); err != nil {
			if !bytes.Equal(s.encode(nil), before) {
				t.Fatalf("a refused snapshot changed the state: %v", err)
			}
			return
		}
		// what it took encodes to a snapshot that decodes to the same state
		enc := s.encode(nil)
		s2 := fuzzState(t)
		if err := s2.decode(enc); err != nil {
			t.Fatalf("re-encoded snapshot refused: %v", err)
		}
		if !bytes.Equal(s2.encode(nil), enc) {
			t.Fatalf("snapshot round trip differs")
		}
	})
}

// nopFSM is an application that remembers nothing.
type nopFSM struct{}

func (nopFSM) Apply(broadcast.Entry) []byte { return []byte("r") }
func (nopFSM) Snapshot() (broadcast.FSMSnapshot, error) {
	return broadcast.BytesSnapshot(nil), nil
}
func (nopFSM) Restore([]byte) error { return nil }

// fuzzState is the state of group 0 of the tree 0:1 with two client slots.
func fuzzState(t testing.TB) *state {
	tr, err := tree.Parse("0:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1}, {2}}, ClientNodes: []rdma.NodeID{9, 9},
		ClientSlots: 2, ParentSlots: 4, SlotSize: 128, MaxResult: 16}
	cfg, err = cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newState(&cfg, nopFSM{}, new(testingKnobs))
}

func entryOf(data []byte) broadcast.Entry { return broadcast.Entry{Index: 1, Data: data} }
