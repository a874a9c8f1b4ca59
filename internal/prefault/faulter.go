package prefault

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Faulter is a goroutine that faults in memory a polling goroutine is
// about to write, off that goroutine: kv's heap ahead of its bump pointer
// and new index generations (kv.TableConfig.PrefaultHeap), btree's arena
// slots ahead of those it hands out (btree.StoreConfig.PrefaultNodes).
//
// For each piece of a chunk it asks the kernel to populate the pages
// (Populate, without writing them) and then touches every page with an
// atomic add of zero, which maps the page writable and pays the first
// write's cost (on this project's VM the populate alone left about half
// of it to the first real store) but never changes a byte, whatever the
// poller writes there at the same moment. Both together cost ~8 µs a page
// here, off the poller, against 15 µs or more for a fault on it.
//
// The poller only sends chunks to a buffered channel (Ask never blocks: a
// chunk that finds it full is counted and left to fault in as before).
//
// The memory must not be in the Go heap when the race detector runs: the
// touch is an atomic access the poller's plain stores may meet (regions
// are mmap'd, which the detector does not watch).
type Faulter struct {
	reqs  chan []byte
	wg    sync.WaitGroup
	pages atomic.Int64 // pages touched
	drops atomic.Int64 // chunks not queued (the queue was full)
	cpu   atomic.Int64 // the goroutine's thread CPU time in its pieces, ns
	// busy counts the chunks queued and not done yet (tests wait on
	// it: Wait).
	busy sync.WaitGroup
	// zeroes (a planted bug of the caller's tests): touch with a plain
	// store of zero instead of an add of zero.
	zeroes bool
}

// Queue is how many chunks may wait for a Faulter.
const Queue = 64

// NewFaulter starts a Faulter. zeroes plants a bug for tests: a touch
// stores zero into the page's first word instead of adding zero to it (it
// may overwrite what the poller wrote there).
func NewFaulter(zeroes bool) *Faulter {
	f := &Faulter{reqs: make(chan []byte, Queue), zeroes: zeroes}
	f.wg.Add(1)
	go f.run()
	return f
}

func (f *Faulter) run() {
	defer f.wg.Done()
	for b := range f.reqs {
		f.fault(b)
		f.busy.Done()
	}
}

// Ask queues b to be faulted in (polling goroutine); false if the queue is
// full (nothing is done for b).
func (f *Faulter) Ask(b []byte) bool {
	f.busy.Add(1)
	select {
	case f.reqs <- b:
		return true
	default:
		f.busy.Done()
		f.drops.Add(1)
		return false
	}
}

// Wait returns once every chunk queued so far is faulted in (tests, and a
// caller about to unmap memory it asked for).
func (f *Faulter) Wait() { f.busy.Wait() }

// Close stops the goroutine once it has done its queue (the memory must
// stay mapped until it returns).
func (f *Faulter) Close() {
	close(f.reqs)
	f.wg.Wait()
}

// Pages is the number of pages touched so far.
func (f *Faulter) Pages() int64 { return f.pages.Load() }

// Drops is the number of chunks not queued (the queue was full).
func (f *Faulter) Drops() int64 { return f.drops.Load() }

// CPU is the CPU time the goroutine spent faulting pages in so far, in
// nanoseconds (its thread's, over each piece: what it costs the machine
// besides the poller's own time).
func (f *Faulter) CPU() int64 { return f.cpu.Load() }

// fault maps b's pages: populate, then touch each page without changing
// it, yielding the processor between pieces (it runs beside the pollers).
func (f *Faulter) fault(b []byte) {
	page := os.Getpagesize()
	const piece = 64 << 10
	for off := 0; off < len(b); off += piece {
		end := min(off+piece, len(b))
		// Wired to its thread for the piece, so that the thread's CPU
		// time counts the piece (after the madvise the goroutine
		// would otherwise go on on another thread, if its P was taken).
		runtime.LockOSThread()
		c0 := threadCPU()
		// The error (a kernel before 5.14: EINVAL) only leaves the
		// touch below to do the whole work.
		_ = Populate(b[off:end])
		for p := off; p < end; p += page {
			f.touch(b, p)
		}
		f.pages.Add(int64((end - off + page - 1) / page))
		f.cpu.Add(threadCPU() - c0)
		runtime.UnlockOSThread()
		runtime.Gosched()
	}
}

// touch writes to the page at b[p:] without changing its bytes: an atomic
// add of zero to the aligned word holding b[p] (callers hand page-aligned
// memory, so p's word is the page's first).
func (f *Faulter) touch(b []byte, p int) {
	w := (*uint64)(unsafe.Pointer(&b[p&^7]))
	if f.zeroes {
		*w = 0 // planted: a plain store may overwrite what the poller wrote
		return
	}
	atomic.AddUint64(w, 0)
}

// threadCPU is the calling thread's CPU time in nanoseconds (0 if not
// known).
func threadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}
