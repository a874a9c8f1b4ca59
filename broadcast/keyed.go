package broadcast

import "encoding/binary"

// Keyed proposals (docs/broadcast.md, "Keyed proposals"): a proposal may
// carry its caller's Key, and the replicated state machine then applies
// each key once. Every replica keeps, in the keyed table, each client's
// last delivered Seq with the index it was delivered at and the result
// its FSM returned; the table is part of the replicated state (every
// replica updates it at the same entries, snapshots carry it), so every
// replica takes the same decision for every entry.

// Key names a keyed proposal: Client identifies the caller (any nonzero
// value unique among the group's callers), Seq its request (nonzero,
// increasing per Client). See ProposeKeyed.
type Key struct{ Client, Seq uint64 }

// maxKeptResult bounds the FSM result the keyed table keeps per client; a
// longer one is not kept (a duplicate then resolves with a nil result).
const maxKeptResult = 1024

// ProposeKeyed is Propose for a request that its caller may submit more
// than once (retried after ErrTimeout or ErrStopped, or at another
// replica): the group delivers an entry for every submission, but the FSM
// applies key.Seq of key.Client at most once. An entry whose key.Seq is at
// most the last Seq delivered for key.Client is a duplicate: it takes its
// index like any entry (so the FSM sees a gap in the indices it is given)
// but FSM.Apply is not called for it, and a proposal that resolves with it
// gets, when key.Seq is that last Seq, the index and result of the
// original delivery (the result is nil if it was longer than 1 KiB), and
// otherwise ErrDuplicate. So a client must use increasing Seqs and have at
// most one request outstanding that it may retry.
//
// The table holds at most Config.MaxKeyedClients clients; when a new
// client comes to a full table, the client whose last delivery is the
// oldest is forgotten (on every replica alike), and its retried requests
// are applied again: a client must not retry a request after a long
// silence. Key.Client and key.Seq must be nonzero (else the proposal fails
// with ErrInvalidKey), and data may have at most MaxProposal()-16 bytes
// (the key travels with it).
func (r *Replica) ProposeKeyed(key Key, data []byte) *Proposal {
	return r.proposeKeyed(key, data, nil)
}

// ProposeKeyedFunc is ProposeKeyed with a completion callback, as
// ProposeFunc is Propose with one.
func (r *Replica) ProposeKeyedFunc(key Key, data []byte, done func(index uint64, result []byte, err error)) {
	r.proposeKeyed(key, data, done)
}

func (r *Replica) proposeKeyed(key Key, data []byte, cb func(uint64, []byte, error)) *Proposal {
	if key.Client == 0 || key.Seq == 0 {
		p := &Proposal{cb: cb}
		p.finish(0, nil, ErrInvalidKey)
		return p
	}
	if len(data) > maxProposal(r.cfg.MaxRecord)-keyLen {
		p := &Proposal{cb: cb}
		p.finish(0, nil, ErrTooLarge)
		return p
	}
	return r.propose(key, data, cb)
}

// putKey writes k as a keyed entry's data prefix.
func putKey(dst []byte, k Key) {
	binary.LittleEndian.PutUint64(dst[0:], k.Client)
	binary.LittleEndian.PutUint64(dst[8:], k.Seq)
}

// keyRec is one client's record in the keyed table, on a list in order of
// last delivery (index).
type keyRec struct {
	client, seq, index uint64
	result             []byte // reused from delivery to delivery
	big                bool
	prev, next         *keyRec
}

// keyTable is the keyed table: clients by id, and a list of them from the
// oldest last delivery (head, evicted first) to the newest (tail). Only
// the polling goroutine touches it.
type keyTable struct {
	m          map[uint64]*keyRec
	head, tail *keyRec
}

func (t *keyTable) get(client uint64) *keyRec { return t.m[client] }

func (t *keyTable) unlink(k *keyRec) {
	if k.prev != nil {
		k.prev.next = k.next
	} else {
		t.head = k.next
	}
	if k.next != nil {
		k.next.prev = k.prev
	} else {
		t.tail = k.prev
	}
	k.prev, k.next = nil, nil
}

func (t *keyTable) pushBack(k *keyRec) {
	k.prev = t.tail
	if t.tail != nil {
		t.tail.next = k
	} else {
		t.head = k
	}
	t.tail = k
}

// record notes key delivered at index with the FSM's result, evicting the
// client of the oldest last delivery if a new client finds limit clients.
func (t *keyTable) record(key Key, index uint64, result []byte, limit int) {
	if t.m == nil {
		t.m = make(map[uint64]*keyRec)
	}
	k := t.m[key.Client]
	switch {
	case k != nil:
		t.unlink(k)
	case len(t.m) >= limit && t.head != nil:
		k = t.head // reused, with its result buffer
		t.unlink(k)
		delete(t.m, k.client)
		t.m[key.Client] = k
	default:
		k = &keyRec{}
		t.m[key.Client] = k
	}
	k.client, k.seq, k.index = key.Client, key.Seq, index
	k.big = len(result) > maxKeptResult
	if k.big {
		k.result = k.result[:0]
	} else {
		k.result = append(k.result[:0], result...)
	}
	t.pushBack(k)
}

// reply is the result a duplicate of k's last Seq resolves with.
func (k *keyRec) reply() []byte {
	if len(k.result) == 0 {
		return nil
	}
	return k.result
}

// capture copies the table for a snapshot, oldest last delivery first.
func (t *keyTable) capture() []keySnap {
	if len(t.m) == 0 {
		return nil
	}
	n := 0
	for k := t.head; k != nil; k = k.next {
		n += len(k.result)
	}
	buf := make([]byte, 0, n)
	out := make([]keySnap, 0, len(t.m))
	for k := t.head; k != nil; k = k.next {
		s := keySnap{client: k.client, seq: k.seq, index: k.index, big: k.big}
		if len(k.result) > 0 {
			buf = append(buf, k.result...)
			s.result = buf[len(buf)-len(k.result) : len(buf) : len(buf)]
		}
		out = append(out, s)
	}
	return out
}

// restore replaces the table with a snapshot's (oldest last delivery
// first), keeping the newest limit clients.
func (t *keyTable) restore(keys []keySnap, limit int) {
	*t = keyTable{m: make(map[uint64]*keyRec, min(len(keys), limit))}
	if len(keys) > limit {
		keys = keys[len(keys)-limit:]
	}
	for _, s := range keys {
		k := &keyRec{client: s.client, seq: s.seq, index: s.index, big: s.big, result: append([]byte(nil), s.result...)}
		t.m[s.client] = k
		t.pushBack(k)
	}
}

// len is the number of clients in the table.
func (t *keyTable) len() int { return len(t.m) }
