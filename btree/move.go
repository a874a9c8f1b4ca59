package btree

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Tablet moves (docs/btree.md, "Moving a tablet"): a tablet of group g
// goes to group t in four steps, each an ordered request applied through
// one group's log (deterministic on every replica, idempotent, so a step
// sent again after a lost answer or a leader change changes nothing more):
//
//  1. CtlFreeze at g: the tablet is frozen (writes to its keys get
//     StatusMoving; reads go on), marked for t and the move's generation
//     (the tablet's generation + 1).
//  2. CtlIngest at t, as many as needed: the frozen tablet's entries
//     (the mover reads them from g through g's log after the freeze, so
//     they are the tablet's last state), with their versions. t holds
//     them as an installing tablet: neither read nor written yet.
//  3. CtlDrop at g: g stops owning the tablet, and its keys become
//     garbage that g deletes in bounded steps afterwards (garbage.go). Its
//     ownership version changes, so a reader of g with an older directory
//     fails its ownership check instead of answering from g.
//  4. CtlActivate at t, only after the drop was applied: t serves the
//     tablet (its ownership version changes).
//
// Between 3 and 4 no group serves the range: clients wait and retry. No
// group ever serves the range's writes while another serves its reads,
// which is what keeps the move linearizable: every write applied at g
// was applied before the freeze (so it was ingested), and t applies
// writes only after g's drop, which a linearizable reader of g sees.
// CtlAbort undoes a move that has not dropped: it removes t's installing
// tablet, and unfreezes g's, which then serves at the move's generation
// (so every move of a range, aborted or not, has a generation of its
// own). An ingest meeting an installing tablet of an older generation
// (left of an abort that reached g but not t) removes it first.
//
// A control request (format RequestFormat, flags FlagTablet):
//
//	[format u8 = 5][flags u8 = 2][cmd u8][0 u8][0 u32]
//	[to u32][0 u32][gen u64]
//	[low len u32][high len u32][flags u32: 1 high is +inf][count u32]
//	[low][high], each padded to 8, then count entries (CtlIngest only):
//	  [klen u32][vlen u32][version u64][key][value], each padded to 8
//
// Its result is a write's 24-byte result: StatusOK; StatusCondFailed when
// the group's tablets do not match the step (a stale or conflicting
// move: nothing changed); StatusMalformed; StatusRefused (LimitHeap) for
// an ingest the arena cannot take.
const (
	// FlagTablet in a request's second byte: a tablet control request.
	FlagTablet = 2

	CtlFreeze   = 1
	CtlIngest   = 2
	CtlDrop     = 3
	CtlActivate = 4
	CtlAbort    = 5
	// CtlSplit splits a serving tablet of the group at its median key,
	// as a tablet past TabletMax splits (both halves stay in the group;
	// the balancer's split of a hot tablet, load.go). Gen is the
	// tablet's generation + 1 (a check, as a freeze's); both halves keep
	// the tablet's generation. Sent again (its answer lost), it finds
	// the lower half (the same low fence and generation, a lower high
	// fence) and answers StatusOK, changing nothing. StatusCondFailed:
	// no such serving tablet, or it cannot be cut (fewer than 2 keys,
	// MaxTablets, the directory area full).
	CtlSplit = 6
	// CtlCollect deletes up to GarbageStep of the group's garbage keys
	// (garbage.go: keys of dropped tablets) with a budget of its own, and
	// answers StatusOK with Count the garbage keys left (2^32-1 if more)
	// and Prev the keys it deleted.
	// Its tablet and gen are not looked at (any valid ones: the client
	// sends the whole keyspace, gen 1). Idempotent: with no garbage it
	// changes nothing. A group that gets no ordered requests deletes
	// its garbage only through these (the balancer sends them).
	CtlCollect = 7

	ctlHdr = 40
)

// Tablet states (in the directory area and in snapshots).
const (
	// TabletFrozen: a move to Tablet.To is under way; writes are refused
	// with StatusMoving, reads are served.
	TabletFrozen = 1
	// TabletInstalling: the group is taking the tablet in (CtlIngest):
	// not served until CtlActivate.
	TabletInstalling = 2
)

// StatusMoving: the key's tablet is frozen for a move; nothing applied.
// The client waits and sends the write again (after reading the
// directory again: the tablet may have moved by then).
const StatusMoving = 6

// Ctl is a decoded tablet control request.
type Ctl struct {
	Cmd     uint8
	To      uint32
	Gen     uint64
	Tablet  Tablet // its fences
	Entries []KVV  // CtlIngest
}

// IsCtl reports whether b is (the header of) a tablet control request.
func IsCtl(b []byte) bool { return len(b) >= 2 && b[0] == RequestFormat && b[1] == FlagTablet }

// AppendCtl appends c's encoding to dst.
func AppendCtl(dst []byte, c *Ctl) []byte {
	le := binary.LittleEndian
	var h [ctlHdr]byte
	h[0], h[1], h[2] = RequestFormat, FlagTablet, c.Cmd
	le.PutUint32(h[8:], c.To)
	le.PutUint64(h[16:], c.Gen)
	le.PutUint32(h[24:], uint32(len(c.Tablet.Low)))
	le.PutUint32(h[28:], uint32(len(c.Tablet.High)))
	if c.Tablet.HighInf {
		le.PutUint32(h[32:], 1)
	}
	le.PutUint32(h[36:], uint32(len(c.Entries)))
	dst = append(dst, h[:]...)
	for _, f := range [][]byte{c.Tablet.Low, c.Tablet.High} {
		dst = append(dst, f...)
		dst = append(dst, make([]byte, pad8(len(f))-len(f))...)
	}
	for _, e := range c.Entries {
		dst = appendPair(dst, e.Key, e.Value, e.Version)
	}
	return dst
}

// CtlSize is the encoded size of a control request of tablet tb with
// entries es.
func CtlSize(tb Tablet, es []KVV) int {
	n := ctlHdr + pad8(len(tb.Low)) + pad8(len(tb.High))
	for _, e := range es {
		n += pairSize(e.Key, e.Value)
	}
	return n
}

// DecodeCtl decodes a control request (entries alias b), checking it
// against a tree's limits (maxKey, maxValue).
func DecodeCtl(b []byte, maxKey, maxValue int) (Ctl, error) {
	le := binary.LittleEndian
	var c Ctl
	if len(b) < ctlHdr || !IsCtl(b) || b[3] != 0 || le.Uint32(b[4:]) != 0 || le.Uint32(b[12:]) != 0 {
		return c, fmt.Errorf("%w: tablet control header", ErrMalformedRequest)
	}
	c.Cmd, c.To, c.Gen = b[2], le.Uint32(b[8:]), le.Uint64(b[16:])
	ll, hl, fl, n := int(le.Uint32(b[24:])), int(le.Uint32(b[28:])), le.Uint32(b[32:]), int(le.Uint32(b[36:]))
	switch {
	case c.Cmd < CtlFreeze || c.Cmd > CtlCollect, fl > 1, fl == 1 && hl != 0, ll > maxKey, hl > maxKey,
		c.Gen == 0, n != 0 && c.Cmd != CtlIngest:
		return c, fmt.Errorf("%w: tablet control %d", ErrMalformedRequest, c.Cmd)
	}
	p := ctlHdr
	if pad8(ll)+pad8(hl) > len(b)-p {
		return c, fmt.Errorf("%w: truncated", ErrMalformedRequest)
	}
	c.Tablet = Tablet{Low: b[p : p+ll : p+ll], HighInf: fl == 1}
	if !c.Tablet.HighInf {
		c.Tablet.High = b[p+pad8(ll) : p+pad8(ll)+hl : p+pad8(ll)+hl]
		if string(c.Tablet.High) <= string(c.Tablet.Low) {
			return c, fmt.Errorf("%w: empty tablet", ErrMalformedRequest)
		}
	}
	if !zeroPad(b[p+ll:p+pad8(ll)]) || !zeroPad(b[p+pad8(ll)+hl:p+pad8(ll)+pad8(hl)]) {
		return c, fmt.Errorf("%w: padding not zero", ErrMalformedRequest)
	}
	p += pad8(ll) + pad8(hl)
	if n > (len(b)-p)/16 {
		return c, fmt.Errorf("%w: %d entries in %d bytes", ErrMalformedRequest, n, len(b)-p)
	}
	for range n {
		kl, vl, ver := int(le.Uint32(b[p:])), int(le.Uint32(b[p+4:])), le.Uint64(b[p+8:])
		p += 16
		if kl < 1 || kl > maxKey || vl > maxValue || ver == 0 || pad8(kl)+pad8(vl) > len(b)-p {
			return c, fmt.Errorf("%w: entry", ErrMalformedRequest)
		}
		e := KVV{Key: b[p : p+kl : p+kl], Value: b[p+pad8(kl) : p+pad8(kl)+vl : p+pad8(kl)+vl], Version: ver}
		if !zeroPad(b[p+kl:p+pad8(kl)]) || !zeroPad(b[p+pad8(kl)+vl:p+pad8(kl)+pad8(vl)]) {
			return c, fmt.Errorf("%w: padding not zero", ErrMalformedRequest)
		}
		p += pad8(kl) + pad8(vl)
		if !c.Tablet.Contains(e.Key) || len(c.Entries) > 0 && string(e.Key) <= string(c.Entries[len(c.Entries)-1].Key) {
			return c, fmt.Errorf("%w: entry %q out of order or outside the tablet", ErrMalformedRequest, e.Key)
		}
		c.Entries = append(c.Entries, e)
	}
	if p != len(b) {
		return c, fmt.Errorf("%w: %d trailing bytes", ErrMalformedRequest, len(b)-p)
	}
	return c, nil
}

// sameFences reports whether a and b are the same key range.
func sameFences(a, b Tablet) bool {
	return string(a.Low) == string(b.Low) && a.HighInf == b.HighInf && (a.HighInf || string(a.High) == string(b.High))
}

// overlaps reports whether a and b share a key.
func overlaps(a, b Tablet) bool {
	return (a.HighInf || string(b.Low) < string(a.High)) && (b.HighInf || string(a.Low) < string(b.High))
}

// find is the index of the tablet (in any state) holding key, or -1.
func (s *Store) find(key []byte) int {
	i := searchTablets(s.tablets, key)
	if i >= 0 && s.tablets[i].Contains(key) {
		return i
	}
	return -1
}

// exact is the index of the tablet with tb's fences, or -1.
func (s *Store) exact(tb Tablet) int {
	i := s.find(tb.Low)
	if i >= 0 && sameFences(s.tablets[i], tb) {
		return i
	}
	return -1
}

// OwnVersion is the version of the keys the group serves: bumped when a
// tablet leaves the group (CtlDrop) or starts being served in it
// (CtlActivate), not when one splits. Readers check it (header word 4).
func (s *Store) OwnVersion() uint64 { return s.ownVer }

// applyCtl applies a tablet control request at entry index.
func (s *Store) applyCtl(index uint64, data []byte) []byte {
	c, err := DecodeCtl(data, s.cfg.Tree.MaxKey, s.cfg.Tree.MaxInline())
	if err != nil {
		return s.result(&Result{Status: StatusMalformed})
	}
	ok := Result{Status: StatusOK, Version: index << 16, Count: len(c.Entries)}
	cond := Result{Status: StatusCondFailed}
	k := s.exact(c.Tablet)
	switch c.Cmd {
	case CtlFreeze:
		if k < 0 {
			return s.result(&cond)
		}
		tb := &s.tablets[k]
		switch {
		case tb.State == TabletFrozen && tb.To == c.To && tb.Gen+1 == c.Gen:
			return s.result(&ok) // sent again
		case tb.State != TabletServing || tb.Gen+1 != c.Gen || c.To == s.cfg.Group:
			return s.result(&cond)
		}
		tb.State, tb.To = TabletFrozen, c.To
		s.dirVer++
	case CtlIngest:
		// An installing tablet of an older generation overlapping this
		// move's is left of a move that was aborted at its source but
		// not at this target (an undo interrupted between its steps):
		// that move can never finish (its source serves the range again,
		// at a generation past it), and this move's pairs are the range's
		// last state. Taking them in over the leftover would keep its
		// keys that were deleted at the source since: they go first.
		if !s.knobs.ingestOverLeftover {
			for i := len(s.tablets) - 1; i >= 0; i-- {
				if tb := s.tablets[i]; tb.State == TabletInstalling && tb.Gen < c.Gen && overlaps(tb, c.Tablet) {
					s.removeTablet(i) // its keys become garbage, cleared below in this range
				}
			}
			k = s.exact(c.Tablet)
		}
		if k < 0 {
			for i := range s.tablets {
				if overlaps(s.tablets[i], c.Tablet) {
					return s.result(&cond)
				}
			}
			if len(s.tablets) >= MaxTablets || dirSize(s.tablets)+dirEnt+len(c.Tablet.Low)+len(c.Tablet.High) > DirBytes {
				return s.result(&cond)
			}
			// A tablet coming back while keys it left behind are
			// still garbage: they go first (the ingest must not put
			// its pairs over them, nor a later collect delete the
			// pairs it puts).
			s.clearGarbage(c.Tablet, index)
			at := searchTablets(s.tablets, c.Tablet.Low) + 1
			s.tablets = slices.Insert(s.tablets, at, Tablet{Low: slices.Clone(c.Tablet.Low), High: slices.Clone(c.Tablet.High),
				HighInf: c.Tablet.HighInf, State: TabletInstalling, Gen: c.Gen, To: s.cfg.Group})
			s.counts = slices.Insert(s.counts, at, 0)
			s.dirVer++
			k = at
		} else if tb := s.tablets[k]; tb.State != TabletInstalling || tb.Gen != c.Gen {
			if tb.State == TabletServing && tb.Gen == c.Gen {
				return s.result(&ok) // activated already: sent again
			}
			return s.result(&cond)
		}
		if room := s.a.room(); room >= 0 && len(c.Entries) > 0 {
			if need := len(c.Entries) * (s.t.height() + 1); need > room {
				r := refusedRes(LimitHeap, 0, s.cfg.MaxChunks*s.cfg.ChunkSlots*s.cfg.Tree.NodeSize, s.a.Slots()*s.cfg.Tree.NodeSize)
				return s.result(&r)
			}
		}
		for _, e := range c.Entries {
			// Every version issued after this apply exceeds e's.
			if next := (index+1)<<16 + s.verOff; e.Version >= next && !s.knobs.noVersionFloor {
				s.verOff += e.Version - next + 1
			}
			existed, err := s.t.Put(e.Key, e.Value, e.Version, index)
			if err != nil {
				panic(fmt.Sprintf("btree: ingest checked before: %v", err))
			}
			if !existed {
				s.counts[k]++
			}
		}
	case CtlDrop:
		if k < 0 {
			return s.result(&ok) // dropped already
		}
		tb := s.tablets[k]
		if tb.State != TabletFrozen || tb.To != c.To || tb.Gen+1 != c.Gen {
			return s.result(&cond)
		}
		switch {
		case s.knobs.dropKeepsKeys:
			s.tablets = slices.Delete(s.tablets, k, k+1) // planted: the keys stay
			s.counts = slices.Delete(s.counts, k, k+1)
			s.dirVer++
			if !s.knobs.noOwnBump {
				s.ownVer++
			}
		case s.knobs.dropBeforePublish:
			s.deleteRange(tb, index) // planted: the keys go under the old version
			s.tablets = slices.Delete(s.tablets, k, k+1)
			s.counts = slices.Delete(s.counts, k, k+1)
			s.dirVer++
			if !s.knobs.noOwnBump {
				s.ownVer++
			}
		default:
			// The tablet leaves the group's list and the ownership
			// version changes, published (header and directory area),
			// before the first node write deletes its keys: a reader
			// checks the version around its node reads, and one that
			// met a leaf without the keys under the old version would
			// answer "not found" for keys that moved (the client's
			// TestKeyspaceMoveLinearizable, 1 run in 5 under -race).
			// The keys become garbage, deleted GarbageStep per batch
			// from this apply on (garbage.go), all after this publish.
			n := s.counts[k]
			s.tablets = slices.Delete(s.tablets, k, k+1)
			s.counts = slices.Delete(s.counts, k, k+1)
			s.dirVer++
			if !s.knobs.noOwnBump {
				s.ownVer++
			}
			s.publishBefore()
			s.addGarbage(tb, n)
		}
	case CtlActivate:
		if k < 0 {
			return s.result(&cond)
		}
		tb := &s.tablets[k]
		switch {
		case tb.State == TabletServing && tb.Gen == c.Gen:
			return s.result(&ok)
		case tb.State != TabletInstalling || tb.Gen != c.Gen:
			return s.result(&cond)
		}
		tb.State, tb.To = TabletServing, 0
		s.dirVer++
		if !s.knobs.noOwnBump {
			s.ownVer++
		}
	case CtlAbort:
		if k < 0 {
			return s.result(&ok)
		}
		tb := &s.tablets[k]
		switch {
		case tb.State == TabletInstalling && tb.Gen == c.Gen:
			s.removeTablet(k)
		case tb.State == TabletFrozen && tb.Gen+1 == c.Gen:
			tb.State, tb.To = TabletServing, 0
			// The aborted move's generation is used up: the tablet
			// serves again at it, so the next move of the range has a
			// generation of its own. A freeze of this move sent again
			// late is refused, and an installing copy of this move left
			// at the target (its abort never ran) is older than the next
			// move's, which replaces it (CtlIngest) instead of taking
			// its pairs over the leftover's.
			if !s.knobs.ingestOverLeftover {
				tb.Gen = c.Gen
			}
			s.dirVer++
			// The ownership version too, though the group serves the
			// same keys: a mover that resumes the move from a directory
			// read before the abort (a replica behind) reads the tablet
			// checked at that version, and must fail (ErrNotOwner), not
			// read a tablet that takes writes again and ingest it at the
			// target, where it would stay an installing tablet no move
			// finishes (the kv simulator's lagging-mover case).
			if !s.knobs.noOwnBump {
				s.ownVer++
			}
		case tb.State == TabletServing:
			return s.result(&ok) // nothing under way
		default:
			return s.result(&cond)
		}
	case CtlSplit:
		if k < 0 && !s.knobs.splitResendRefused {
			// Sent again after its answer was lost: the tablet at the
			// request's low fence is its lower half, of the same
			// generation (a split keeps it) and with a high fence below
			// the request's. Only a split narrows a tablet and keeps its
			// generation (a move or an abort gives a new one), so the
			// tablet was split: this request's or one past TabletMax
			// meanwhile, and either way what was asked is done.
			if i := s.find(c.Tablet.Low); i >= 0 {
				tb := s.tablets[i]
				if string(tb.Low) == string(c.Tablet.Low) && tb.State != TabletInstalling && tb.Gen+1 == c.Gen && !tb.HighInf &&
					(c.Tablet.HighInf || string(tb.High) < string(c.Tablet.High)) {
					return s.result(&ok)
				}
			}
		}
		if k < 0 || s.tablets[k].State != TabletServing || s.tablets[k].Gen+1 != c.Gen || s.counts[k] < 2 {
			return s.result(&cond)
		}
		n := len(s.tablets)
		if s.splitTablet(k); len(s.tablets) == n {
			return s.result(&cond)
		}
	case CtlCollect:
		// A budget of its own (Apply's collect after this one finds it
		// spent, or no garbage left): deterministic, it depends on the
		// log alone.
		s.gcLeft = s.cfg.GarbageStep
		if s.knobs.gcIgnoresBudget {
			s.gcLeft = -1 // planted: every key in one apply
		}
		before := s.garbageKeys
		s.collect(index)
		s.gcLeft = 0
		ok.Count = int(min(uint64(s.garbageKeys), math.MaxUint32))
		ok.Prev = uint64(before - s.garbageKeys)
	}
	if s.knobs.freeAtOnce {
		s.reclaim(index)
	}
	return s.result(&ok)
}

// removeTablet removes tablet k (an installing tablet an abort undoes)
// from the group's list; its keys become garbage, deleted in bounded
// steps from this apply on (garbage.go). No reader reads them meanwhile:
// an installing tablet is never served.
func (s *Store) removeTablet(k int) {
	tb, n := s.tablets[k], s.counts[k]
	s.tablets = slices.Delete(s.tablets, k, k+1)
	s.counts = slices.Delete(s.counts, k, k+1)
	s.dirVer++
	s.addGarbage(tb, n)
}

// publishBefore publishes the header and the directory area in the
// middle of an apply, before its first node write: the tablets and
// versions as they are now, with the applied index the header had (a
// node stamped at most that index still holds its state as of it: every
// node written since is stamped later; a request of the same batch
// before this one has its node writes done but may share or follow
// that index, so the index is not advanced here).
func (s *Store) publishBefore() {
	if s.regs == nil {
		return
	}
	h, err := DecodeHeader(s.regs.hdr.Bytes()[:HeaderSize])
	if err != nil {
		panic(fmt.Sprintf("btree: own header: %v", err))
	}
	dir := s.tablets
	if dir == nil {
		dir = []Tablet{}
	}
	s.dirPub = s.dirVer
	s.regs.Publish(s.t, h.Applied, s.dirVer, s.ownVer, dir)
}

// deleteRange deletes tablet tb's keys from the tree at entry index.
func (s *Store) deleteRange(tb Tablet, index uint64) {
	var keys [][]byte
	s.t.ascend(tb.Low, func(e Entry) bool {
		if !tb.Contains(e.Key) {
			return false
		}
		keys = append(keys, slices.Clone(e.Key))
		return true
	})
	for _, key := range keys {
		s.t.Delete(key, index)
	}
}
