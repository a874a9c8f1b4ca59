// Package reuse hands large scratch buffers from one use to the next in a
// process: the snapshot images and the restore buffers of the replicas a
// process builds at its start (issue 19).
//
// Why: on this project's VMs the first access to a page at a new address
// costs ~12 µs of CPU, once in the kernel (a read into it) and once more
// at its first access from Go code, whether the page was populated or not
// (perf of a 1 M-record restart from snapshots, 6 replicas: the read's
// copy into fresh buffers 1.2 s and the first pass over them 1.3 s of
// ~6.4 s; the second pass over the same bytes 0.05 s). A buffer used
// again at the same address pays neither, so the replicas a process
// builds one after another reuse the buffers of those built before.
package reuse

import (
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/rdmakv/rdmakv/internal/prefault"
)

// Pool holds buffers put back for the next Get. Its zero value and a nil
// *Pool are usable: they keep nothing (every Get allocates). Safe for
// concurrent use.
type Pool struct {
	mu     sync.Mutex
	open   bool
	free   [][]byte
	max    int
	reused int
	fresh  int
	// warming counts the buffers Warm is making (their capacities):
	// a Get that one of them will hold waits for it (cond).
	warming []int
	cond    sync.Cond
	warmWG  sync.WaitGroup
	// doublePut: planted bug (tests): Put keeps a buffer that is
	// already free, so two Gets may hand out the same memory.
	doublePut bool
	// warmEarly: planted bug (tests): Warm hands its buffer to the pool
	// before it touched its pages, so a Get may take it while the
	// touches still write it.
	warmEarly bool
}

// New returns a pool that keeps up to max free buffers until Close.
func New(max int) *Pool {
	p := &Pool{open: true, max: max}
	p.cond.L = &p.mu
	return p
}

// room is the capacity a fresh buffer of n bytes gets: n and a 32nd
// more, so that a slightly larger Get (the next group's snapshot, a few
// more records) still finds it: at a restart of 1 M records the second
// group's images and Restore scratch were a few KB larger than the
// first's, and its replicas took fresh ones (issue 19).
func room(n int) int { return n + n/32 }

// Get returns a buffer of n bytes: the smallest free one that holds n,
// else a new one whose pages are populated (prefault). Its bytes are
// whatever its last user left: the caller writes before it reads.
func (p *Pool) Get(n int) []byte {
	if p != nil {
		p.mu.Lock()
		for {
			best := -1
			for i, b := range p.free {
				if cap(b) >= n && (best < 0 || cap(b) < cap(p.free[best])) {
					best = i
				}
			}
			if best >= 0 {
				b := p.free[best]
				p.free = append(p.free[:best], p.free[best+1:]...)
				p.reused++
				p.mu.Unlock()
				return b[:n]
			}
			if !slices.ContainsFunc(p.warming, func(c int) bool { return c >= n }) {
				break
			}
			p.cond.Wait() // a buffer Warm is making will hold n
		}
		p.fresh++
		p.mu.Unlock()
	}
	b := make([]byte, n, room(n))
	if n >= 1<<20 {
		prefault.Populate(b[:cap(b)])
	}
	return b
}

// Warm makes k buffers for Gets of up to n bytes, one after another on
// one goroutine of its own (it takes one processor, not k), each with
// its pages written once (touched), and puts each in the pool when made:
// a Get that one of them holds waits for it rather than making one. A restart calls
// it for the snapshot images before it reads its log, so that the pages'
// first writes (on this project's VMs ~8 µs each even when populated:
// package doc) are paid on a processor the log's read leaves idle, not
// in the first replicas' reads and checks of their snapshots. A nil or
// closed pool ignores it.
func (p *Pool) Warm(n, k int) {
	if p == nil || n <= 0 || k <= 0 {
		return
	}
	c := room(n)
	p.mu.Lock()
	if !p.open {
		p.mu.Unlock()
		return
	}
	for range k {
		p.warming = append(p.warming, c)
	}
	p.mu.Unlock()
	p.warmWG.Add(1)
	go func() {
		defer p.warmWG.Done()
		for range k {
			p.warmOne(c)
		}
	}()
}

// warmOne makes one of Warm's buffers, of capacity c.
func (p *Pool) warmOne(c int) {
	{
		b := make([]byte, c)
		if p.warmEarly {
			p.warmed(b, c) // planted: lent before its touches
			for p.holds(b) {
				runtime.Gosched() // (until a Get took it: the test's)
			}
		}
		prefault.Populate(b)
		page := os.Getpagesize()
		for i := 0; i < len(b); i += page {
			b[i] = 0 // fresh memory is zero: the store changes nothing
			if i%(64<<10) == 0 {
				runtime.Gosched()
			}
		}
		if !p.warmEarly {
			p.warmed(b, c)
		}
	}
}

// warmed ends Warm's buffer b of capacity c: into the pool, and the Gets
// waiting for it woken.
func (p *Pool) warmed(b []byte, c int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.warming, c); i >= 0 {
		p.warming = slices.Delete(p.warming, i, i+1)
	}
	p.keep(b) // in the same hold: a woken Get finds it
	p.cond.Broadcast()
}

// holds reports whether b is free in the pool (the planted warmEarly).
func (p *Pool) holds(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.free, func(f []byte) bool { return unsafe.SliceData(f) == unsafe.SliceData(b) })
}

// WaitWarm returns once every Warm called so far has ended (tests).
func (p *Pool) WaitWarm() {
	if p != nil {
		p.warmWG.Wait()
	}
}

// Put gives b back for a later Get: nothing may use b after (not a slice
// of it, nor anything decoded from it that aliases it). A closed or nil
// pool drops it; a full pool drops its smallest buffer.
func (p *Pool) Put(b []byte) {
	if p == nil || cap(b) == 0 {
		return
	}
	if poisonPuts {
		// In test binaries every buffer put back is overwritten, kept or
		// not: a replica that still read a snapshot image or restore
		// scratch after its Put (an alias the contract forbids) reads
		// garbage, and the restart tests that check every value fail.
		full := b[:cap(b)]
		for i := range full {
			full[i] = 0xa5
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keep(b)
}

// keep is Put's work under p.mu (Put, warmed).
func (p *Pool) keep(b []byte) {
	if !p.open {
		return
	}
	b = b[:cap(b)]
	for _, f := range p.free {
		if unsafe.SliceData(f) == unsafe.SliceData(b) && !p.doublePut {
			return // put twice: keep one, or two Gets share it
		}
	}
	p.free = append(p.free, b)
	if len(p.free) > p.max {
		small := 0
		for i, f := range p.free {
			if cap(f) < cap(p.free[small]) {
				small = i
			}
		}
		p.free = append(p.free[:small], p.free[small+1:]...)
	}
}

// poisonPuts: Put overwrites what it is given (test binaries only).
var poisonPuts = testing.Testing()

// Close drops the free buffers (the garbage collector frees them); later
// Puts are dropped and Gets allocate.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.open, p.free = false, nil
	p.cond.Broadcast() // (a warming buffer still ends in Put, which drops it)
	p.mu.Unlock()
}

// Stats is how many Gets reused a buffer and how many allocated one.
func (p *Pool) Stats() (reused, fresh int) {
	if p == nil {
		return 0, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reused, p.fresh
}

// Slice views b as a slice of n values of T, which must hold no pointers
// (the garbage collector does not scan b) and need at most 8-byte
// alignment; b must hold n of them. For scratch of fixed-size records.
func Slice[T any](b []byte, n int) []T {
	var z T
	if n == 0 {
		return nil
	}
	if len(b) < n*int(unsafe.Sizeof(z)) || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		panic("reuse: a buffer too small or unaligned for its view")
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}
