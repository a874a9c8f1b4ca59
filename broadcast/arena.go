package broadcast

import (
	"sync"
	"sync/atomic"
)

// Message data lives in slabs (64 KiB, or 4 proposals' worth when larger:
// slabPool.size) that are reused once nothing refers
// to them: a replica carrying a steady stream of messages then neither
// allocates nor makes garbage per message (at 1000-byte messages, fresh
// slabs cost a replica about a fifth of its CPU in allocation, zeroing and
// collection).
//
// A slab counts its references: one for the cursor carving it, one for
// each Log entry whose data is in it, one for each unresolved Proposal
// whose copy of the data is in it. Whoever drops the last reference puts
// the slab in its pool. A Log entry's data is valid while the entry is in
// the Log; a Proposal's until it resolves (FSM.Apply must not keep data,
// see FSM).
//
// A pool's geometry is set once by its replica (slabPool.size) from its
// largest proposal: data up to a whole proposal (a batch entry that fills
// it included) is carved from slabs of max(64 KiB, 4 x MaxProposal), so no
// entry allocates in steady state; the pool keeps up to 4 MiB of free slabs
// (at least 8). The zero pool has the defaults below.
const (
	slabSize      = 64 << 10
	slabMaxData   = 4 << 10 // the zero pool: larger data gets an allocation of its own
	slabPoolSize  = 64      // the zero pool: free slabs kept (4 MiB)
	slabPoolBytes = 4 << 20 // free slab bytes a sized pool keeps
)

type slab struct {
	buf  []byte
	refs atomic.Int32
	pool *slabPool
}

// unref drops one reference; s may be nil (data not in a slab).
func (s *slab) unref() {
	if s == nil {
		return
	}
	switch n := s.refs.Add(-1); {
	case n == 0:
		s.pool.put(s)
	case n < 0:
		panic("broadcast: data slab released more often than referenced")
	}
}

// ref adds a reference; s may be nil.
func (s *slab) ref() {
	if s != nil {
		s.refs.Add(1)
	}
}

// slabPool keeps free slabs for the cursors of one replica.
type slabPool struct {
	mu   sync.Mutex
	free []*slab
	live atomic.Int64 // slabs handed out and not put back (Status.Slabs)

	// geometry (size sets it, before any use; zero: the defaults)
	slab    int // bytes of a slab
	maxData int // larger data is copied apart
	keep    int // free slabs kept
}

// size sizes the pool for data up to maxData bytes (a replica's
// MaxProposal): slabs of max(64 KiB, 4 x maxData), so that a slab holds
// several of the largest entries, and up to slabPoolBytes of them kept.
// Call it before the pool is used.
func (p *slabPool) size(maxData int) {
	p.maxData = max(slabMaxData, maxData)
	p.slab = max(slabSize, 4*p.maxData)
	p.keep = max(8, slabPoolBytes/p.slab)
}

func (p *slabPool) limits() (slab, maxData, keep int) {
	if p.slab == 0 {
		return slabSize, slabMaxData, slabPoolSize
	}
	return p.slab, p.maxData, p.keep
}

func (p *slabPool) get() *slab {
	p.mu.Lock()
	var s *slab
	if k := len(p.free); k > 0 {
		s = p.free[k-1]
		p.free = p.free[:k-1]
	}
	p.mu.Unlock()
	if s == nil {
		size, _, _ := p.limits()
		s = &slab{buf: make([]byte, size), pool: p}
	}
	s.refs.Store(1) // the cursor's
	p.live.Add(1)
	return s
}

func (p *slabPool) put(s *slab) {
	p.live.Add(-1)
	p.mu.Lock()
	if _, _, keep := p.limits(); len(p.free) < keep {
		p.free = append(p.free, s)
	}
	p.mu.Unlock()
}

// slabCursor carves copies out of its current slab; one goroutine (or one
// lock) at a time uses a cursor.
type slabCursor struct {
	s   *slab
	off int
}

// copy returns a copy of data and the slab holding it, with a reference
// for the caller (nil for data larger than the pool's maxData, copied
// apart).
func (c *slabCursor) copy(p *slabPool, data []byte) ([]byte, *slab) {
	return c.copy2(p, nil, data)
}

// copy2 is copy of the concatenation of a and b.
func (c *slabCursor) copy2(p *slabPool, a, b []byte) ([]byte, *slab) {
	d, s := c.alloc(p, len(a)+len(b))
	copy(d[copy(d, a):], b)
	return d, s
}

// alloc returns n bytes for the caller to fill (not zeroed: they may hold
// an earlier entry's data) and the slab holding them, with a reference
// for the caller (nil for n larger than the pool's maxData: an allocation
// of its own).
func (c *slabCursor) alloc(p *slabPool, n int) ([]byte, *slab) {
	if _, maxData, _ := p.limits(); n > maxData {
		return make([]byte, n), nil
	}
	if c.s == nil || len(c.s.buf)-c.off < n {
		c.s.unref()
		c.s, c.off = p.get(), 0
	}
	d := c.s.buf[c.off : c.off+n : c.off+n]
	c.off += n
	c.s.ref()
	return d, c.s
}

// replyArena copies FSM results for the Proposal handles that keep them
// (Proposal.Reply): small results are carved from chunks that are never
// reused (a retained handle may read its result at any time, so a chunk
// lives until no handle refers into it), larger ones get an allocation of
// their own. A stream of proposals with small results then allocates once
// per replyChunk bytes of results, and one with nil results never.
// Only the polling goroutine uses it.
type replyArena struct {
	buf []byte
}

const (
	replyChunk   = 16 << 10
	replyMaxData = 512 // larger results get an allocation of their own
)

// copy returns a copy of b (non-nil, also for an empty b).
func (a *replyArena) copy(b []byte) []byte {
	n := len(b)
	if n > replyMaxData {
		return append(make([]byte, 0, n), b...)
	}
	if len(a.buf) < n || a.buf == nil {
		a.buf = make([]byte, replyChunk)
	}
	d := a.buf[:n:n]
	a.buf = a.buf[n:]
	copy(d, b)
	return d
}
