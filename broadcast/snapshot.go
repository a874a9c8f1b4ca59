package broadcast

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
)

// Snapshots (docs/broadcast.md, "Snapshots"): the leader captures the FSM
// at its commit point from Poll (FSM.Snapshot: a cheap point-in-time
// capture), serialises it off the polling goroutine into registered memory
// (FSMSnapshot.Persist; or serves the FSM's own registered memory,
// RegionSnapshot), and announces it to each member behind its pruned Log;
// the member fetches it with one-sided reads on a Conn of its own, so that
// a long transfer neither delays its rows and acknowledgements nor, when a
// read fails, breaks the link that carries them.

// FSMSnapshot is a point-in-time capture of an FSM's state, returned by
// FSM.Snapshot (after hashicorp/raft's FSMSnapshot). The replica calls
// Persist once, from a goroutine of its own, while Apply goes on on the
// polling goroutine; so the capture must not change when Apply does (copy
// on write, versions, or a copy of a small state). Release is called once
// the replica no longer needs it, after Persist returned (or without
// Persist being called).
type FSMSnapshot interface {
	// Size is the number of bytes Persist writes.
	Size() int
	// Persist writes the snapshot into dst (len(dst) == Size()), registered
	// memory that members read once Persist returned.
	Persist(dst []byte) error
	// Release frees what the capture holds. The replica calls it off its
	// polling goroutine (it may unmap large regions), so it may run
	// concurrently with Apply and after a later Snapshot: it must free
	// only this capture's holdings, not what a later capture shares.
	Release()
}

// RegionSnapshot is an FSMSnapshot whose bytes already sit in registered
// memory of the FSM's own: Size() bytes at offset of region, unchanged
// until Release. The replica then serves them from there (no copy, no
// Persist call): a state machine whose state lives in registered regions
// (the kv layer's table, with versioned records) is caught up without a
// second copy of it. The FSM grants the group's members read access to the
// region.
type RegionSnapshot interface {
	FSMSnapshot
	Region() (region rdma.Region, offset int)
}

// BytesSnapshot is an FSMSnapshot of b, which must not change afterwards:
// for a state machine whose state is small enough to copy in Snapshot.
func BytesSnapshot(b []byte) FSMSnapshot { return bytesSnapshot(b) }

type bytesSnapshot []byte

func (b bytesSnapshot) Size() int                { return len(b) }
func (b bytesSnapshot) Persist(dst []byte) error { copy(dst, b); return nil }
func (b bytesSnapshot) Release()                 {}

// leaderSnap is the snapshot the leader serves (one at a time, shared by
// every member it catches up).
type leaderSnap struct {
	at       MsgHdr // the commit point it was taken at
	slot     int    // region id slot (snapRegionIDs)
	fsm      FSMSnapshot
	meta     rdma.Region
	state    rdma.Region // nil when served from the FSM's region
	size     int         // state bytes
	mcheck   uint64      // xxhash of the meta region
	metaSize int         // the meta region's bytes
	done     atomic.Bool // Persist and the meta region are done (err says how)
	err      error
}

// snapRegionIDs returns the meta and state region ids of a slot: two
// slots alternate, so that a member still reading a released snapshot
// gets ErrNoRegion rather than the next one's bytes.
func (r *Replica) snapRegionIDs(slot int) (meta, state rdma.RegionID) {
	b := r.cfg.RegionBase + 1 + rdma.RegionID(r.n) + rdma.RegionID(2*slot)
	return b, b + 1
}

// snapshotFor returns the snapshot to announce to a member behind the
// pruned Log, or nil while one is being made (it starts one if needed). A
// snapshot is usable while the Log still holds every entry after its
// commit point.
func (r *Replica) snapshotFor() *leaderSnap {
	s := r.snap
	if s != nil && !s.done.Load() {
		return nil
	}
	if s != nil && (s.err != nil || s.at.Less(r.pruned)) {
		if s.err != nil {
			r.tracef("node %d: snapshot at %v: %v", r.self, s.at, s.err)
		}
		r.releaseSnap()
		s = nil
	}
	if s != nil {
		return s
	}
	if r.now < r.snapRetryAt {
		return nil
	}
	capture, err := r.fsm.Snapshot() // Acuerdo leaves this to us: a capture at our commit point
	if err != nil {
		r.tracef("node %d: snapshot: %v", r.self, err)
		r.snapRetryAt = r.now + r.cfg.ElectionTimeout
		return nil
	}
	r.snapSlot ^= 1
	s = &leaderSnap{at: r.committed, slot: r.snapSlot, fsm: capture, size: capture.Size()}
	r.snap = s
	meta := snapMeta{index: r.index, table: append([]tableRec(nil), r.table...), keys: r.keys.capture()}
	r.ctr.SnapshotsTaken++
	r.tracef("node %d takes a snapshot at %v (%d bytes)", r.self, s.at, s.size)
	r.startPersist(persistNet, func() {
		s.err = r.persistSnap(s, meta)
		s.done.Store(true)
		r.node.Doorbell().Ring() // a parked driver announces it at once
	})
	return nil
}

// persistSnap writes the snapshot's state and meta regions; it runs off
// the polling goroutine (runPersist) and touches only s and the node.
func (r *Replica) persistSnap(s *leaderSnap, m snapMeta) error {
	metaID, stateID := r.snapRegionIDs(s.slot)
	m.size = uint64(s.size)
	if rs, ok := s.fsm.(RegionSnapshot); ok {
		reg, off := rs.Region()
		if off < 0 || off+s.size > len(reg.Bytes()) {
			return fmt.Errorf("broadcast: region snapshot of %d bytes at %d of a %d-byte region", s.size, off, len(reg.Bytes()))
		}
		m.region, m.off = reg.ID(), uint64(off)
		m.stateCheck = hashChunked(reg.Bytes()[off : off+s.size])
	} else {
		reg, err := r.node.Register(stateID, max(s.size, 8))
		if err != nil {
			return fmt.Errorf("broadcast: register snapshot state region: %w", err)
		}
		s.state = reg
		if err := r.grantMembers(reg); err != nil {
			return err
		}
		b := reg.Bytes()[:s.size]
		if err := s.fsm.Persist(b); err != nil {
			return fmt.Errorf("broadcast: persist snapshot: %w", err)
		}
		m.region = stateID
		m.stateCheck = hashChunked(b)
	}
	mb := encodeSnapMeta(r.cfg.Members, m)
	s.metaSize = len(mb)
	reg, err := r.node.Register(metaID, len(mb))
	if err != nil {
		return fmt.Errorf("broadcast: register snapshot meta region: %w", err)
	}
	s.meta = reg
	copy(reg.Bytes(), mb)
	s.mcheck = xxhash.Sum64(mb)
	return r.grantMembers(reg)
}

// hashChunked is xxhash.Sum64(b), fed a MiB at a time: one call over a GiB
// is an assembly loop the Go scheduler cannot preempt for a tenth of a
// second, which would hold up a stop-the-world and with it every
// goroutine, the polling ones included.
func hashChunked(b []byte) uint64 {
	d := xxhash.New()
	for len(b) > 0 {
		n := min(len(b), 1<<20)
		d.Write(b[:n])
		b = b[n:]
		runtime.Gosched() // runnable pollers go first (off Poll only)
	}
	return d.Sum64()
}

func (r *Replica) grantMembers(reg rdma.Region) error {
	for i, id := range r.cfg.Members {
		if i != r.me {
			if err := reg.Grant(id, rdma.PermRead); err != nil {
				return fmt.Errorf("broadcast: grant snapshot region %d to %d: %w", reg.ID(), id, err)
			}
		}
	}
	return nil
}

// releaseSnap drops the leader's snapshot (it must be done): members still
// reading it get ErrNoRegion, skip its announcement, and are synced again.
// The regions are closed off the polling goroutine too: unmapping a GiB
// of touched pages takes the kernel tens of milliseconds.
func (r *Replica) releaseSnap() {
	s := r.snap
	if s == nil {
		return
	}
	r.snap = nil
	r.startPersist(persistRelease, func() {
		if s.meta != nil {
			s.meta.Close()
		}
		if s.state != nil {
			s.state.Close()
		}
		s.fsm.Release()
	})
}

// snapInUse reports whether a member may still need the leader's snapshot:
// it is to be announced, or announced and its diff not accepted yet, and
// we heard the member within the election timeout (a dead member does not
// keep a copy of the state alive; it gets a fresh snapshot if it returns).
func (r *Replica) snapInUse() bool {
	for i := range r.fol {
		f := &r.fol[i]
		if i == r.me || !f.snap || r.now-r.mems[i].heardAt > r.cfg.ElectionTimeout {
			continue
		}
		if f.state == fsSync || (f.state == fsStream && r.mems[i].acceptHdr().Less(f.end)) {
			return true
		}
	}
	return false
}

// Fetching, at the member: phases of a snapFetch.
const (
	fetchMeta   = iota // reading the meta region
	fetchState         // reading the state
	fetchReady         // fetched and verified
	fetchFailed        // refused, malformed, or the leader released it: skip the announcement
)

// snapFetch is a snapshot being read with one-sided reads, on a Conn of
// its own (conn) to the leader that announced it.
type snapFetch struct {
	active    bool
	phase     int
	metaID    rdma.RegionID
	metaSize  int
	metaCheck uint64
	commit    MsgHdr
	at        uint64 // ring cursor of the announcement last read for it
	meta      snapMeta
	buf       []byte // meta, then state
	nextOff   int    // next byte to request
	doneOff   int    // bytes whose read completed
	inflight  []int
	digest    *xxhash.Digest

	conn    rdma.Conn
	retryAt time.Duration
	backoff rdma.Backoff // Min and Max set at the first failure
	cs      [16]rdma.Completion
}

const (
	fetchChunk    = 64 << 10
	fetchInflight = 16
)

// startFetch begins fetching the snapshot a kSnapshot record announced.
func (l *link) startFetch(metaID rdma.RegionID, size int, check uint64, commit MsgHdr) {
	l.stopFetch()
	l.fetch = snapFetch{active: true, metaID: metaID, metaSize: size, metaCheck: check, commit: commit, buf: make([]byte, size)}
}

// stopFetch abandons any fetch and closes its Conn.
func (l *link) stopFetch() {
	if l.fetch.conn != nil {
		l.fetch.conn.Close()
	}
	l.fetch = snapFetch{}
}

// driveFetch posts the reads of a fetch and settles their completions. A
// failed read closes the fetch's Conn only: the transfer resumes where it
// was after a backoff, or, if the leader released the snapshot (the
// region is gone), the fetch fails and the announcement is skipped.
func (r *Replica) driveFetch(l *link) bool {
	f := &l.fetch
	if !f.active || f.phase >= fetchReady {
		return false
	}
	progress := false
	if f.conn == nil {
		if r.now < f.retryAt {
			return false
		}
		if l.fetchDial == nil {
			l.fetchDial = rdma.NewConnector(r.node, l.peer)
		}
		c, err, ok := l.fetchDial.Connect()
		if !ok {
			return false // connecting in the background
		}
		if err != nil {
			r.fetchBackoff(f)
			return false
		}
		f.conn = c
		f.nextOff, f.inflight = f.doneOff, f.inflight[:0]
	}
	for {
		k := f.conn.Poll(f.cs[:])
		for _, c := range f.cs[:k] {
			if c.Err != nil {
				r.fetchError(l, c.Err)
				return true
			}
			end := f.inflight[0]
			f.inflight = f.inflight[1:]
			if f.phase == fetchState {
				f.digest.Write(f.buf[f.doneOff:end])
				r.fetched += uint64(end - f.doneOff)
			}
			f.doneOff = end
			f.backoff.Reset() // the peer serves reads again
			progress = true
		}
		if k < len(f.cs) {
			break
		}
	}
	region, off := f.metaID, uint64(0)
	if f.phase == fetchState {
		region, off = f.meta.region, f.meta.off
	}
	for f.nextOff < len(f.buf) && len(f.inflight) < fetchInflight {
		n := min(fetchChunk, len(f.buf)-f.nextOff)
		wr := rdma.WR{Kind: rdma.OpRead, Region: region, Offset: off + uint64(f.nextOff), Buf: f.buf[f.nextOff : f.nextOff+n], Flags: rdma.Signaled}
		if err := f.conn.Post(wr); err != nil {
			if !errors.Is(err, rdma.ErrQueueFull) {
				r.fetchError(l, err)
				return true
			}
			break
		}
		f.nextOff += n
		f.inflight = append(f.inflight, f.nextOff)
		progress = true
	}
	if f.doneOff < len(f.buf) {
		return progress
	}
	switch f.phase {
	case fetchMeta:
		if xxhash.Sum64(f.buf) != f.metaCheck {
			r.fetchFail(l, "meta region checksum mismatch (replaced)")
			return true
		}
		m, err := decodeSnapMeta(f.buf, r.cfg.Members)
		if err != nil {
			r.fetchFail(l, err.Error())
			return true
		}
		if m.size > uint64(r.cfg.MaxSnapshot) {
			// Not fetched, so the diff that follows is refused: we stay
			// behind, visibly, rather than allocate it.
			r.ctr.SnapshotsRefused++
			r.fetchFail(l, fmt.Sprintf("a %d-byte snapshot: MaxSnapshot is %d", m.size, r.cfg.MaxSnapshot))
			return true
		}
		f.meta, f.phase = m, fetchState
		f.buf, f.nextOff, f.doneOff = make([]byte, m.size), 0, 0
		f.digest = xxhash.New()
		r.tracef("node %d fetches snapshot at %v (%d bytes) from node %d", r.self, f.commit, m.size, l.peer)
	case fetchState:
		if f.digest.Sum64() != f.meta.stateCheck {
			r.fetchFail(l, "state checksum mismatch (replaced)")
			return true
		}
		f.phase = fetchReady
		f.conn.Close()
		f.conn = nil
	}
	return true
}

// fetchError handles a failed read or post of a fetch.
func (r *Replica) fetchError(l *link, err error) {
	f := &l.fetch
	f.conn.Close()
	f.conn = nil
	if errors.Is(err, rdma.ErrNoRegion) || errors.Is(err, rdma.ErrPermission) || errors.Is(err, rdma.ErrBounds) {
		r.fetchFail(l, err.Error())
		return
	}
	r.tracef("node %d: snapshot fetch from node %d: %v; resuming at %d", r.self, l.peer, err, f.doneOff)
	r.fetchBackoff(f)
}

// fetchBackoff schedules the fetch's next connect: rdma.Backoff between
// ReconnectMin and ReconnectMax, jitter from the replica's seeded rng.
func (r *Replica) fetchBackoff(f *snapFetch) {
	f.backoff.Min, f.backoff.Max = r.cfg.ReconnectMin, r.cfg.ReconnectMax
	f.retryAt = f.backoff.Next(r.now, r.rng)
}

// fetchFail ends a fetch that cannot succeed: its announcement is skipped
// (acceptSnapshot), the diff after it refused, and the leader syncs us
// again with a fresh snapshot.
func (r *Replica) fetchFail(l *link, why string) {
	f := &l.fetch
	if f.conn != nil {
		f.conn.Close()
		f.conn = nil
	}
	f.phase = fetchFailed
	f.buf = nil
	r.ctr.SnapshotFetchesFailed++
	r.tracef("node %d: snapshot at %v from node %d not installed: %s", r.self, f.commit, l.peer, why)
}
