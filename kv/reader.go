package kv

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// One-sided gets (docs/kv.md, "Gets"). A GroupReader reads one group's
// replicas with its own Conns; it is used by one goroutine at a time (the
// client keeps a pool).
//
// A get takes two dependent rounds when the key is there, one when it is
// not:
//
//  1. on one replica's Conn, in one posted list: its header, the key's two
//     bucket pairs (and, while the index grows, the old generation's pairs
//     before the new one's), its header again. For a linearizable get the
//     replica is the leader, and the same round reads the header (whose
//     first word is the member's promise) of f other members.
//  2. the record a matching slot points to.
//
// Round 1 is accepted when both header reads agree on the layout and
// validate. A linearizable get further needs the replica to serve epoch E
// (its diff committed and applied there: every write acknowledged so far,
// by this leader or an earlier one, is in its table, and its table only
// moves forward) and f+1 members, counted with the leader, to promise
// exactly E: a leader of a later epoch needs the votes of f+1 members,
// each of which promised its epoch before voting, so quorum intersection
// shows that no later leader was elected before those reads, which were
// made after the get began. No acknowledged write is therefore missing,
// and the get is linearizable at the read of round 1 (or of round 2 for
// the record's bytes, which hold exactly the version the slot named).

// Consistency is what a get promises.
type Consistency uint8

const (
	// Linearizable gets read the leader and confirm its epoch with a
	// quorum of promises (the default).
	Linearizable Consistency = iota
	// StaleOK gets read one replica (the reader's nearest) and report how
	// far behind it may be.
	StaleOK
)

func (c Consistency) String() string {
	switch c {
	case Linearizable:
		return "linearizable"
	case StaleOK:
		return "stale-ok"
	}
	return fmt.Sprintf("consistency(%d)", uint8(c))
}

// GetResult is what a get found.
type GetResult struct {
	Found   bool
	Value   []byte // valid until the reader's next call
	Version uint64
	// Member is the index of the replica read; Applied and AppliedAt are
	// its header's last applied entry and when it was applied (Unix ns):
	// the value is the key's value after entry Applied, so a stale-ok
	// get is at most as old as that.
	Member    int
	Applied   uint64
	AppliedAt int64
	// Epoch is the serving epoch a linearizable get confirmed.
	Epoch uint64
	// Retries counts rounds read again (torn reads, layout changes, a
	// leader not confirmed).
	Retries int
}

// Errors of a get.
var (
	// ErrNoLeader: no member serves linearizable gets now (an election
	// is under way, or too few members are reachable).
	ErrNoLeader = errors.New("kv: no confirmed leader")
	// errRetry: read round 1 again.
	errRetry = errors.New("kv: retry")
)

// GroupReader reads one group's tables one-sided.
type GroupReader struct {
	group   uint32
	members []rdma.NodeID
	node    rdma.Node
	conns   []rdma.Conn
	quorum  int
	leader  int
	near    int
	timeout time.Duration
	nextID  uint64

	hdr   [][2 * hdrSize]byte
	hdrOK []bool
	pairs []byte // round 1: 4 pairs of 256 bytes (2 while not migrating)
	rec   []byte
	wrs   []rdma.WR
	cs    [8]rdma.Completion

	// Reads counts one-sided reads posted; Rounds the rounds.
	Reads, Rounds uint64
}

// NewGroupReader reads group g's members from node. near is the member
// stale-ok gets read (on shm any; on tcp the closest).
func NewGroupReader(node rdma.Node, g uint32, members []rdma.NodeID, near int) *GroupReader {
	n := len(members)
	return &GroupReader{group: g, members: members, node: node, conns: make([]rdma.Conn, n),
		quorum: n/2 + 1, leader: -1, near: near % n, timeout: time.Second,
		hdr: make([][2 * hdrSize]byte, n), hdrOK: make([]bool, n),
		pairs: make([]byte, 8*bucketSize*2), rec: make([]byte, 256)}
}

// Close closes the reader's Conns.
func (r *GroupReader) Close() {
	for i, c := range r.conns {
		if c != nil {
			c.Close()
			r.conns[i] = nil
		}
	}
}

func (r *GroupReader) conn(i int) (rdma.Conn, error) {
	if c := r.conns[i]; c != nil {
		if c.Err() == nil {
			return c, nil
		}
		c.Close()
		r.conns[i] = nil
	}
	c, err := r.node.Connect(r.members[i])
	if err != nil {
		return nil, err
	}
	r.conns[i] = c
	return c, nil
}

// post posts wrs on member i's Conn, the last one signalled.
func (r *GroupReader) post(i int, wrs []rdma.WR) (uint64, error) {
	c, err := r.conn(i)
	if err != nil {
		return 0, err
	}
	r.nextID++
	id := r.nextID
	wrs[len(wrs)-1].Flags |= rdma.Signaled
	wrs[len(wrs)-1].ID = id
	r.Reads += uint64(len(wrs))
	if n, err := c.PostList(wrs); err != nil || n < len(wrs) {
		if err == nil {
			err = rdma.ErrQueueFull
		}
		return 0, err
	}
	return id, nil
}

// wait waits for the signalled completion id on member i's Conn.
func (r *GroupReader) wait(i int, id uint64) error {
	c := r.conns[i]
	deadline := time.Time{}
	for {
		n := c.Poll(r.cs[:])
		if n == 0 {
			if deadline.IsZero() {
				deadline = time.Now().Add(r.timeout)
			} else if time.Now().After(deadline) {
				return fmt.Errorf("kv: read from node %d: no completion in %v", r.members[i], r.timeout)
			}
			n = c.Wait(r.cs[:], time.Millisecond)
		}
		for _, cp := range r.cs[:n] {
			if cp.Err != nil {
				return cp.Err
			}
			if cp.ID == id {
				return nil
			}
		}
	}
}

// Get looks key up. out, if it has room, receives the value.
func (r *GroupReader) Get(key []byte, mode Consistency) (GetResult, error) {
	h := hashKey(key)
	var res GetResult
	for attempt := 0; ; attempt++ {
		res.Retries = attempt
		if attempt > 0 && attempt%64 == 0 {
			time.Sleep(time.Duration(min(attempt/64, 10)) * 100 * time.Microsecond)
		}
		if attempt > 10000 {
			return res, fmt.Errorf("kv: group %d: get gave up after %d rounds", r.group, attempt)
		}
		m := r.near
		if mode == Linearizable {
			if r.leader < 0 {
				if err := r.findLeader(); err != nil {
					return res, err
				}
			}
			m = r.leader
		}
		err := r.get(key, h, mode, m, &res)
		if err == nil {
			return res, nil
		}
		if errors.Is(err, errRetry) {
			continue
		}
		if errors.Is(err, ErrNoLeader) || mode == Linearizable {
			r.leader = -1
		}
		if mode == StaleOK {
			r.near = (r.near + 1) % len(r.members)
		}
		if attempt >= 2*len(r.members) {
			return res, err
		}
	}
}

// get is one attempt at member m.
func (r *GroupReader) get(key []byte, h uint64, mode Consistency, m int, res *GetResult) error {
	r.Rounds++
	// Round 1. The header tells the geometry; use the last one seen (a
	// layout change shows as disagreeing header reads: read again).
	prev, err := DecodeHeader(r.hdr[m][hdrSize:])
	if err != nil {
		prev, err = r.readHeader(m)
		if err != nil {
			return err
		}
	}
	g := prev.Geometry
	wrs := r.wrs[:0]
	hb := r.hdr[m][:]
	wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: hb[:hdrSize]})
	pairs := 2
	if g.Migrating {
		pairs = 4
	}
	pb := r.pairs[:pairs*2*bucketSize]
	k := 0
	if g.Migrating {
		b1, b2 := candidates(h, g.OldLog)
		for _, b := range [2]int{b1, b2} {
			wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: indexRegion(r.group, g.OldGen),
				Offset: uint64(pairOf(b) * bucketSize), Buf: pb[k*2*bucketSize : (k+1)*2*bucketSize]})
			k++
		}
	}
	b1, b2 := candidates(h, g.LogBuckets)
	for _, b := range [2]int{b1, b2} {
		wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: indexRegion(r.group, g.Gen),
			Offset: uint64(pairOf(b) * bucketSize), Buf: pb[k*2*bucketSize : (k+1)*2*bucketSize]})
		k++
	}
	wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: hb[hdrSize:]})
	r.wrs = wrs
	var ids [16]uint64
	var others [16]int
	no := 0
	if mode == Linearizable {
		// f other members' headers (their promise words), in parallel.
		for j := 1; j < len(r.members) && no < r.quorum-1; j++ {
			o := (m + j) % len(r.members)
			w := []rdma.WR{{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: r.hdr[o][:hdrSize]}}
			id, err := r.post(o, w)
			if err != nil {
				continue
			}
			ids[no], others[no] = id, o
			no++
		}
	}
	id, err := r.post(m, wrs)
	if err != nil {
		return err
	}
	if err := r.wait(m, id); err != nil {
		return err
	}
	h1, err1 := DecodeHeader(hb[:hdrSize])
	h2, err2 := DecodeHeader(hb[hdrSize:])
	if err1 != nil || err2 != nil {
		return errRetry
	}
	if !sameLayout(&h1, &h2) || h1.Geometry != g {
		return errRetry // read with the geometry just seen (kept in hdr[m])
	}
	if mode == Linearizable {
		e := h1.Serving
		if e == 0 || h2.Serving != e {
			return ErrNoLeader
		}
		votes := 0
		if h1.Promise == e && h2.Promise == e {
			votes++
		}
		for k := range no {
			o := others[k]
			if r.wait(o, ids[k]) != nil {
				continue
			}
			ho, err := DecodeHeader(r.hdr[o][:hdrSize])
			if err == nil && ho.Promise == e {
				votes++
			}
		}
		if votes < r.quorum {
			return ErrNoLeader
		}
		res.Epoch = e
	}
	res.Member, res.Applied, res.AppliedAt = m, h2.Applied, h2.AppliedAt
	// The matching slots, newest version first: buckets of the old
	// generation that were not yet moved (read first), then the new one.
	// A key has one slot at a time, but a read may see it in two places
	// (a migration, a delete and insert in between): the newest wins.
	fp := fpOf(h)
	var cand [4 * 2 * slotsPer]Slot
	nc := 0
	for k := range pairs {
		for j := range 2 {
			bk := pb[(2*k+j)*bucketSize : (2*k+j+1)*bucketSize]
			if k < pairs-2 && bucketMoved(bk) {
				continue
			}
			for i := range slotsPer {
				if s := decodeSlot(bk, i); s.Version != 0 && s.FP == fp {
					cand[nc] = s
					nc++
				}
			}
		}
	}
	for nc > 0 {
		bi := 0
		for i := 1; i < nc; i++ {
			if cand[i].Version > cand[bi].Version {
				bi = i
			}
		}
		err := r.fetch(m, key, cand[bi], res)
		if err != errOtherKey {
			return err
		}
		cand[bi] = cand[nc-1]
		nc--
	}
	res.Found, res.Value, res.Version = false, nil, 0
	return nil
}

// errOtherKey: the slot's fingerprint matched but its record is another
// key's.
var errOtherKey = errors.New("kv: fingerprint of another key")

// fetch is round 2: read the record s names and validate it. A record that
// validates with the slot's version but holds another key is a fingerprint
// collision (errOtherKey); anything else that does not validate (torn,
// memory reused since the slot was read) reads round 1 again.
func (r *GroupReader) fetch(m int, key []byte, s Slot, res *GetResult) error {
	size := int(s.Units) * recAlign
	large := s.Units == unitsLarge
	if large {
		size = recHdr + 8
	}
	for {
		if cap(r.rec) < size {
			r.rec = make([]byte, size)
		}
		b := r.rec[:size]
		wrs := append(r.wrs[:0], rdma.WR{Kind: rdma.OpRead, Region: heapRegion(r.group, int(s.Heap)), Offset: s.Off, Buf: b})
		id, err := r.post(m, wrs)
		if err != nil {
			return err
		}
		if err := r.wait(m, id); err != nil {
			return err
		}
		r.Rounds++
		if large {
			ri := recordInfo(b)
			if ri.Version != s.Version || ri.Size() > 1<<31 || ri.Size() <= unitsLarge*recAlign {
				return errRetry
			}
			large = false
			size = ri.Size()
			continue
		}
		ri, k, v, err := DecodeRecord(b)
		if err != nil || ri.Version != s.Version {
			return errRetry
		}
		if !bytes.Equal(k, key) {
			return errOtherKey
		}
		res.Found, res.Value, res.Version = true, v, ri.Version
		return nil
	}
}

// readHeader reads member m's header alone.
func (r *GroupReader) readHeader(m int) (Header, error) {
	hb := r.hdr[m][hdrSize:]
	id, err := r.post(m, []rdma.WR{{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: hb}})
	if err != nil {
		return Header{}, err
	}
	if err := r.wait(m, id); err != nil {
		return Header{}, err
	}
	return DecodeHeader(hb)
}

// findLeader reads every member's header and picks the one serving the
// highest epoch.
func (r *GroupReader) findLeader() error {
	best, be := -1, uint64(0)
	var errs []error
	for i := range r.members {
		h, err := r.readHeader(i)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", r.members[i], err))
			continue
		}
		if h.Serving > be {
			best, be = i, h.Serving
		}
	}
	if best < 0 {
		return fmt.Errorf("%w in group %d: %w", ErrNoLeader, r.group, errors.Join(errs...))
	}
	r.leader = best
	return nil
}

// Leader is the member the reader last found serving (-1: unknown).
func (r *GroupReader) Leader() int { return r.leader }
