package kv

import (
	"fmt"

	"github.com/rdmakv/rdmakv/internal/prefault"
	"github.com/rdmakv/rdmakv/rdma"
)

// heap allocates records in the table's heap regions: size classes with a
// free list each, and a bump pointer in the newest region. Every replica
// applies the same entries, so in the simulator (snapshots persisted
// inline) every replica's heap is laid out alike; a free waits while a
// snapshot still reads the record (deferred), so a capture never sees its
// records overwritten.
type heap struct {
	node     rdma.Node
	group    uint32
	size     int // bytes per heap region
	regions  []rdma.Region
	mems     [][]byte
	cur      int       // the region the bump pointer is in
	bump     int       // next free byte in region cur
	free     freeLists // class size -> refs (heap<<40 | off)
	deferred []uint64  // freed while a snapshot reads: (class<<48 | ref)
	grant    func(rdma.Region) error
	used     int // bytes in live records (class sizes)
	// lookahead is TableConfig.PrefaultHeap: the bytes past the bump
	// pointer the faulter keeps mapped (0: no faulter); ahead is the
	// offset in region cur up to which it was asked to (heapfault.go).
	lookahead int
	ahead     int
	faulter   *prefault.Faulter // started at the first allocation
	knobs     *testingKnobs
}

func refOf(h int, off int) uint64 { return uint64(h)<<40 | uint64(off) }

func refHeap(ref uint64) int { return int(ref >> 40) }
func refOff(ref uint64) int  { return int(ref & (1<<40 - 1)) }

// classOf is the allocation size for a record of size bytes: exact
// 16-byte steps up to 2 KiB, then eight steps per power of two.
func classOf(size int) int {
	if size <= smallClasses {
		return (size + recAlign - 1) &^ (recAlign - 1)
	}
	p := smallClasses
	for p*2 < size {
		p *= 2
	}
	step := p / 8
	return (size + step - 1) / step * step
}

func (hp *heap) alloc(size int) (uint64, error) {
	c := classOf(size)
	if c > hp.size {
		return 0, fmt.Errorf("kv: a %d-byte record does not fit a %d-byte heap region", size, hp.size)
	}
	if l := hp.free.list(c); len(l) > 0 {
		ref := l[len(l)-1]
		hp.free.set(c, l[:len(l)-1])
		hp.used += c
		return ref, nil
	}
	if len(hp.regions) == 0 || hp.bump+c > hp.size {
		if err := hp.grow(); err != nil {
			return 0, err
		}
	}
	ref := refOf(hp.cur, hp.bump)
	hp.bump += c
	hp.used += c
	hp.prefaultAhead()
	return ref, nil
}

// freeLists is the heap's free lists by class: the classes up to 2 KiB
// (classOf's 16-byte steps) in an array, so that a put's alloc and its
// old record's release index it (a map's hashing and assignment were ~3%
// of the replicas' CPU at 64 writers, brief m500), the larger in a map.
type freeLists struct {
	small [smallClasses/recAlign + 1][]uint64 // by class/recAlign
	large map[int][]uint64
}

// smallClasses is the largest class in freeLists' array.
const smallClasses = 2048

func (f *freeLists) list(c int) []uint64 {
	if c <= smallClasses {
		return f.small[c/recAlign]
	}
	return f.large[c]
}

func (f *freeLists) set(c int, l []uint64) {
	if c <= smallClasses {
		f.small[c/recAlign] = l
		return
	}
	if f.large == nil {
		f.large = map[int][]uint64{}
	}
	f.large[c] = l
}

// each calls fn for every class with a list (not in class order for the
// large ones).
func (f *freeLists) each(fn func(c int, l []uint64)) {
	for i, l := range f.small {
		if l != nil {
			fn(i*recAlign, l)
		}
	}
	for c, l := range f.large {
		fn(c, l)
	}
}

func (hp *heap) grow() error {
	if len(hp.regions) > 0 && hp.cur+1 < len(hp.regions) {
		hp.cur++ // reuse a region after a reset
		hp.bump, hp.ahead = 0, 0
		return nil
	}
	if len(hp.regions) == maxHeaps {
		return fmt.Errorf("kv: heap full: %d regions of %d bytes", maxHeaps, hp.size)
	}
	r, err := hp.node.Register(heapRegion(hp.group, len(hp.regions)), hp.size)
	if err != nil {
		return fmt.Errorf("kv: register heap region: %w", err)
	}
	if hp.grant != nil {
		if err := hp.grant(r); err != nil {
			r.Close()
			return err
		}
	}
	hp.regions = append(hp.regions, r)
	hp.mems = append(hp.mems, r.Bytes())
	hp.cur = len(hp.regions) - 1
	hp.bump, hp.ahead = 0, 0
	return nil
}

// ensure registers regions until there are at least n (Restore, before it
// commits).
func (hp *heap) ensure(n int) error {
	for len(hp.regions) < n {
		cur, bump, ahead := hp.cur, hp.bump, hp.ahead
		hp.cur = len(hp.regions) - 1
		err := hp.grow()
		hp.cur, hp.bump, hp.ahead = cur, bump, ahead
		if err != nil {
			return err
		}
	}
	return nil
}

// release frees the record at ref of size bytes; while snapshots read the
// heap it is deferred.
func (hp *heap) release(ref uint64, size int, deferring bool) {
	c := classOf(size)
	hp.used -= c
	if deferring {
		hp.deferred = append(hp.deferred, uint64(c)<<48|ref)
		return
	}
	hp.free.set(c, append(hp.free.list(c), ref))
}

// undefer returns deferred frees to their free lists.
func (hp *heap) undefer() {
	for _, d := range hp.deferred {
		c := int(d >> 48)
		hp.free.set(c, append(hp.free.list(c), d&(1<<48-1)))
	}
	hp.deferred = hp.deferred[:0]
}

// reset forgets every record (Restore); the regions stay registered.
func (hp *heap) reset() {
	hp.free = freeLists{}
	hp.deferred = nil
	hp.used = 0
	// Start over in region 0; later regions are reused as the bump
	// pointer reaches them.
	hp.cur, hp.bump, hp.ahead = 0, 0, 0
}

func (hp *heap) bytes(ref uint64, size int) []byte {
	off := refOff(ref)
	return hp.mems[refHeap(ref)][off : off+size]
}

func (hp *heap) close() {
	hp.stopFaulter() // before the regions it touches are unmapped
	for _, r := range hp.regions {
		r.Close()
	}
	hp.regions, hp.mems = nil, nil
}
