package btree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A Store's snapshot section (kv.Table puts it in its snapshot): the
// tablets and, for each, its entries in key order, not node bytes, so the
// section does not depend on node size or on the writer's layout, and a
// restore bulk-loads a tree at the fill factor:
//
//	[magic u64][tablets u32][0 u32][dirver u64][ownver u64][veroff u64]
//	then per tablet:
//	  [low len u32][high len u32][flags u32: 1 high is +inf][state u32][count u64]
//	  [gen u64][to u32][0 u32]
//	  [low][high], each padded to 8, then count entries:
//	  [klen u32][vlen u32][version u64][key][value], each padded to 8
//
// The directory and ownership versions, the version offset (Store.verOff)
// and the tablets' states travel too: they are replicated state (a reader compares one replica's
// ownership version with what another replica published). Restore also
// takes the first layout (magic "btsnap1": no versions, states, gens).
// The garbage ranges (garbage.go) are listed among the tablets, in key
// order, with state TabletGarbage, gen 0 and to 0, and their keys: a
// restored replica deletes them as its group-mates do.
const (
	snapMagic  = 0x3270_616e_7374_62 // "btsnap2"
	snapMagic1 = 0x3170_616e_7374_62 // "btsnap1"
)

// ErrSnapshot is returned by Restore for bytes that are not a valid
// snapshot section.
var ErrSnapshot = errors.New("btree: corrupt snapshot section")

// Snapshot returns the store's snapshot section. It copies every entry
// (the tree changes in place after it returns): a cost of one copy of
// each record's key and value plus 16 bytes, and a walk of the leaves,
// on the calling goroutine. Replicas take Capture instead (capture.go),
// which copies only metadata on the polling goroutine and walks the
// tree off it; this is the reference its sections are held to.
func (s *Store) Snapshot() []byte {
	le := binary.LittleEndian
	b := make([]byte, 40, 40+s.t.Len()*32)
	all := s.sectionTablets()
	le.PutUint64(b, snapMagic)
	le.PutUint32(b[8:], uint32(len(all)))
	le.PutUint64(b[16:], s.dirVer)
	le.PutUint64(b[24:], s.ownVer)
	le.PutUint64(b[32:], s.verOff)
	for _, tb := range all {
		var at int
		b, at = appendTabletHeader(b, tb)
		n := 0
		s.t.ascend(tb.Low, func(e Entry) bool {
			if !tb.Contains(e.Key) {
				return false
			}
			b = appendPair(b, e.Key, e.Value, e.Version)
			n++
			return true
		})
		le.PutUint64(b[at:], uint64(n))
	}
	return b
}

// appendTabletHeader appends tb's header and fences to a section (the
// layout above; Snapshot and Capture.Persist both write it) and returns
// the offset of its count word, filled in once the entries are written.
func appendTabletHeader(b []byte, tb Tablet) ([]byte, int) {
	le := binary.LittleEndian
	var h [40]byte
	le.PutUint32(h[0:], uint32(len(tb.Low)))
	le.PutUint32(h[4:], uint32(len(tb.High)))
	if tb.HighInf {
		le.PutUint32(h[8:], 1)
	}
	le.PutUint32(h[12:], uint32(tb.State))
	le.PutUint64(h[24:], tb.Gen)
	le.PutUint32(h[32:], tb.To)
	at := len(b) + 16
	b = append(b, h[:]...)
	for _, f := range [][]byte{tb.Low, tb.High} {
		b = append(b, f...)
		b = append(b, make([]byte, pad8(len(f))-len(f))...)
	}
	return b, at
}

// snapVersions are a section's directory and ownership versions.
type snapVersions struct{ dir, own, off uint64 }

// decodeSnapshot validates a section against the store's limits: its
// tablets and each tablet's entries (aliasing b), and its versions.
func (s *Store) decodeSnapshot(b []byte) ([]Tablet, [][]KVV, snapVersions, error) {
	le := binary.LittleEndian
	vs := snapVersions{dir: 1, own: 1}
	if len(b) < 16 || le.Uint64(b) != snapMagic && le.Uint64(b) != snapMagic1 || le.Uint32(b[12:]) != 0 {
		return nil, nil, vs, fmt.Errorf("%w: bad header", ErrSnapshot)
	}
	v2 := le.Uint64(b) == snapMagic
	nt := le.Uint32(b[8:])
	if nt > 2*MaxTablets+1 {
		return nil, nil, vs, fmt.Errorf("%w: %d tablets and garbage ranges (at most %d per group)", ErrSnapshot, nt, 2*MaxTablets+1)
	}
	p := 16
	if v2 {
		if len(b) < 40 {
			return nil, nil, vs, fmt.Errorf("%w: bad header", ErrSnapshot)
		}
		vs = snapVersions{dir: le.Uint64(b[16:]), own: le.Uint64(b[24:]), off: le.Uint64(b[32:])}
		if vs.dir == 0 || vs.own == 0 {
			return nil, nil, vs, fmt.Errorf("%w: version 0", ErrSnapshot)
		}
		p = 40
	}
	tablets := make([]Tablet, 0, nt)
	ents := make([][]KVV, 0, nt)
	for range nt {
		th := 24
		if v2 {
			th = 40
		}
		if len(b)-p < th {
			return nil, nil, vs, fmt.Errorf("%w: truncated tablet", ErrSnapshot)
		}
		ll, hl, fl, st := int(le.Uint32(b[p:])), int(le.Uint32(b[p+4:])), le.Uint32(b[p+8:]), le.Uint32(b[p+12:])
		count := le.Uint64(b[p+16:])
		var gen uint64
		var to, z uint32
		if v2 {
			gen, to, z = le.Uint64(b[p+24:]), le.Uint32(b[p+32:]), le.Uint32(b[p+36:])
		} else if st != 0 {
			z = 1
		}
		p += th
		if st == TabletGarbage && (!v2 || gen != 0 || to != 0) {
			z = 1
		}
		if fl > 1 || z != 0 || st > TabletGarbage || ll > s.cfg.Tree.MaxKey || hl > s.cfg.Tree.MaxKey || fl == 1 && hl != 0 ||
			pad8(ll)+pad8(hl) > len(b)-p {
			return nil, nil, vs, fmt.Errorf("%w: tablet at byte %d", ErrSnapshot, p-th)
		}
		tb := Tablet{Low: b[p : p+ll : p+ll], High: b[p+pad8(ll) : p+pad8(ll)+hl : p+pad8(ll)+hl], HighInf: fl == 1, State: uint8(st), Gen: gen, To: to}
		if !zeroPad(b[p+ll:p+pad8(ll)]) || !zeroPad(b[p+pad8(ll)+hl:p+pad8(ll)+pad8(hl)]) {
			return nil, nil, vs, fmt.Errorf("%w: tablet padding", ErrSnapshot)
		}
		p += pad8(ll) + pad8(hl)
		if !tb.HighInf && string(tb.High) <= string(tb.Low) {
			return nil, nil, vs, fmt.Errorf("%w: tablet [%q, %q)", ErrSnapshot, tb.Low, tb.High)
		}
		if tb.HighInf {
			tb.High = nil
		}
		if count > uint64(len(b)-p)/16 {
			return nil, nil, vs, fmt.Errorf("%w: %d entries in %d bytes", ErrSnapshot, count, len(b)-p)
		}
		es := make([]KVV, 0, count)
		for range count {
			if len(b)-p < 16 {
				return nil, nil, vs, fmt.Errorf("%w: truncated entry", ErrSnapshot)
			}
			kl, vl, ver := int(le.Uint32(b[p:])), int(le.Uint32(b[p+4:])), le.Uint64(b[p+8:])
			p += 16
			if kl < 1 || kl > s.cfg.Tree.MaxKey || vl > s.cfg.Tree.MaxInline() || ver == 0 || pad8(kl)+pad8(vl) > len(b)-p {
				return nil, nil, vs, fmt.Errorf("%w: entry at byte %d", ErrSnapshot, p-16)
			}
			e := KVV{Key: b[p : p+kl : p+kl], Value: b[p+pad8(kl) : p+pad8(kl)+vl : p+pad8(kl)+vl], Version: ver}
			if !zeroPad(b[p+kl:p+pad8(kl)]) || !zeroPad(b[p+pad8(kl)+vl:p+pad8(kl)+pad8(vl)]) {
				return nil, nil, vs, fmt.Errorf("%w: entry padding", ErrSnapshot)
			}
			p += pad8(kl) + pad8(vl)
			if !tb.Contains(e.Key) || len(es) > 0 && string(e.Key) <= string(es[len(es)-1].Key) {
				return nil, nil, vs, fmt.Errorf("%w: key %q out of order or outside its tablet", ErrSnapshot, e.Key)
			}
			es = append(es, e)
		}
		if n := len(tablets); n > 0 && (tablets[n-1].HighInf || string(tablets[n-1].High) > string(tb.Low)) {
			return nil, nil, vs, fmt.Errorf("%w: tablets out of order or overlapping", ErrSnapshot)
		}
		tablets, ents = append(tablets, tb), append(ents, es)
	}
	var owned []Tablet
	for i, tb := range tablets {
		if tb.State != TabletGarbage {
			owned = append(owned, tb)
		} else if i > 0 && tablets[i-1].State == TabletGarbage {
			return nil, nil, vs, fmt.Errorf("%w: garbage ranges at %q and %q with no tablet between", ErrSnapshot, tablets[i-1].Low, tb.Low)
		}
	}
	if err := checkTablets(owned, s.cfg.Tree.MaxKey); err != nil {
		return nil, nil, vs, fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	if p != len(b) {
		return nil, nil, vs, fmt.Errorf("%w: %d trailing bytes", ErrSnapshot, len(b)-p)
	}
	return tablets, ents, vs, nil
}

func zeroPad(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Restore validates a snapshot section (nil: an empty store with the
// configured tablets) and returns the function that replaces the store
// with it: the caller restores its own part, and commits only when
// nothing else can fail. The commit frees every slot at once (each slot's
// incarnation bumped, so a reader's old pointer fails), bulk-loads the
// entries and publishes the header at applied. b must stay unchanged
// until the commit.
func (s *Store) Restore(b []byte) (commit func(applied uint64), err error) {
	tablets, ents := s.cfg.Tablets, [][]KVV(nil)
	vs := snapVersions{dir: 1, own: 1}
	if b != nil {
		if tablets, ents, vs, err = s.decodeSnapshot(b); err != nil {
			return nil, err
		}
	}
	var all []KVV
	for _, es := range ents {
		all = append(all, es...)
	}
	need := s.cfg.Tree.bulkSlots(all, s.cfg.Fill)
	if need > s.cfg.MaxChunks*s.cfg.ChunkSlots-1 {
		return nil, fmt.Errorf("%w: %d nodes, the arena holds %d", ErrSnapshot, need, s.cfg.MaxChunks*s.cfg.ChunkSlots-1)
	}
	return func(applied uint64) {
		s.a.reset()
		s.pending = s.pending[:0]
		t, err := Load(s.cfg.Tree, s.a, all, s.cfg.Fill, applied)
		if err != nil {
			panic(fmt.Sprintf("btree: restore: load of validated entries: %v", err))
		}
		s.setTree(t)
		s.tablets, s.counts = s.tablets[:0], s.counts[:0]
		s.garbage, s.garbageKeys, s.gcLeft = nil, 0, s.cfg.GarbageStep
		for i, tb := range tablets {
			c := Tablet{Low: slices.Clone(tb.Low), High: slices.Clone(tb.High), HighInf: tb.HighInf, State: tb.State, Gen: tb.Gen, To: tb.To}
			n := 0
			if i < len(ents) {
				n = len(ents[i])
			}
			if tb.State == TabletGarbage {
				s.garbage, s.garbageKeys = append(s.garbage, c), s.garbageKeys+n
				continue
			}
			s.tablets = append(s.tablets, c)
			s.counts = append(s.counts, n)
		}
		// The section's versions: the same on every replica at this
		// entry. The directory area is written again whatever it held.
		s.dirVer, s.ownVer, s.verOff, s.dirPub = vs.dir, vs.own, vs.off, 0
		s.applied = applied
		s.Publish(applied)
	}, nil
}
