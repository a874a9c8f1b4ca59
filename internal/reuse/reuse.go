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
	// doublePut: planted bug (tests): Put keeps a buffer that is
	// already free, so two Gets may hand out the same memory.
	doublePut bool
}

// New returns a pool that keeps up to max free buffers until Close.
func New(max int) *Pool { return &Pool{open: true, max: max} }

// Get returns a buffer of n bytes: the smallest free one that holds n,
// else a new one whose pages are populated (prefault). Its bytes are
// whatever its last user left: the caller writes before it reads.
func (p *Pool) Get(n int) []byte {
	if p != nil {
		p.mu.Lock()
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
		p.fresh++
		p.mu.Unlock()
	}
	b := make([]byte, n)
	if n >= 1<<20 {
		prefault.Populate(b)
	}
	return b
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
