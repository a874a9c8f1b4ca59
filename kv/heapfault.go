package kv

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdmakv/rdmakv/internal/prefault"
)

// Heap pre-faulting (TableConfig.PrefaultHeap). Inserts of new keys take
// fresh heap memory at the bump pointer, and the first store to each fresh
// page of a region faults it in on the polling goroutine: on this
// project's VM 15-30 µs of CPU per 4 KiB page, once per ~3.7 records of
// YCSB's 1 KB (the load phase's profile put 38% of the embedded cluster's
// CPU in encodeRecord's copy, nearly all of it those faults). A goroutine
// of the table keeps the pages from the bump pointer to PrefaultHeap bytes
// past it mapped instead: it asks the kernel to populate a chunk
// (MADV_POPULATE_WRITE, without writing it) and then touches every page
// of it with an atomic add of zero, which maps the page writable and pays
// the first write's cost (the populate alone left ~half of it to the
// first real store) but never changes a byte, whatever the poller writes
// there at the same moment. Both together cost ~8 µs a page here, off the
// poller, against 15 µs or more a fault on it.
//
// The poller only sends chunks to a buffered channel (never blocks: a
// chunk that finds it full is counted and left to be faulted as before).

// prefaultChunk is the most bytes one request asks the goroutine to fault
// in (a request per this many bytes allocated).
const prefaultChunk = 1 << 20

// prefaultQueue is how many chunks may wait for the goroutine.
const prefaultQueue = 64

// heapFaulter is the pre-fault goroutine's side of a heap.
type heapFaulter struct {
	reqs  chan []byte
	wg    sync.WaitGroup
	pages atomic.Int64 // pages touched
	drops atomic.Int64 // chunks not queued (the queue was full)
	// busy counts the chunks queued and not done yet (tests wait on
	// it: wait).
	busy sync.WaitGroup
	// zeroes (planted touchChanges): touch with a plain store of zero
	// instead of an add of zero.
	zeroes bool
}

func newHeapFaulter(zeroes bool) *heapFaulter {
	f := &heapFaulter{reqs: make(chan []byte, prefaultQueue), zeroes: zeroes}
	f.wg.Add(1)
	go f.run()
	return f
}

func (f *heapFaulter) run() {
	defer f.wg.Done()
	for b := range f.reqs {
		f.fault(b)
		f.busy.Done()
	}
}

// ask queues b to be faulted in (polling goroutine); false if the queue is
// full.
func (f *heapFaulter) ask(b []byte) bool {
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

// wait returns once every chunk queued so far is faulted in (tests).
func (f *heapFaulter) wait() { f.busy.Wait() }

// close stops the goroutine once it has done its queue (the regions must
// stay mapped until it returns).
func (f *heapFaulter) close() {
	close(f.reqs)
	f.wg.Wait()
}

// fault maps b's pages: populate, then touch each page without changing
// it, yielding the processor between pieces (it runs beside the pollers).
func (f *heapFaulter) fault(b []byte) {
	page := os.Getpagesize()
	const piece = 64 << 10
	for off := 0; off < len(b); off += piece {
		end := min(off+piece, len(b))
		// The error (a kernel before 5.14: EINVAL) only leaves the
		// touch below to do the whole work.
		_ = prefault.Populate(b[off:end])
		for p := off; p < end; p += page {
			f.touch(b, p)
		}
		f.pages.Add(int64((end - off + page - 1) / page))
		runtime.Gosched()
	}
}

// touch writes to the page at b[p:] without changing its bytes: an atomic
// add of zero to the aligned word holding b[p] (regions are page aligned,
// so p's word is the page's first).
func (f *heapFaulter) touch(b []byte, p int) {
	w := (*uint64)(unsafe.Pointer(&b[p&^7]))
	if f.zeroes {
		*w = 0 // planted: a plain store may overwrite a record the poller wrote
		return
	}
	atomic.AddUint64(w, 0)
}

// HeapPrefaults counts the heap's pre-faulting off the polling goroutine
// (TableConfig.PrefaultHeap): pages touched, and chunks not asked for as
// the goroutine's queue was full.
type HeapPrefaults struct {
	Pages, Drops int64
}

func (hp *heap) prefaults() HeapPrefaults {
	if hp.faulter == nil {
		return HeapPrefaults{}
	}
	return HeapPrefaults{Pages: hp.faulter.pages.Load(), Drops: hp.faulter.drops.Load()}
}

// prefaultsDone waits for the chunks asked for so far (polling goroutine,
// before it unmaps a region the goroutine may touch: an old index
// generation; by then its chunks are long done).
func (hp *heap) prefaultsDone() {
	if hp.faulter != nil {
		hp.faulter.wait()
	}
}

// stopFaulter ends the goroutine once its queue is done.
func (hp *heap) stopFaulter() {
	if hp.faulter != nil {
		hp.faulter.close()
		hp.faulter = nil
	}
}

// prefaultRange asks the goroutine for all of b, in chunks (a new index
// generation; polling goroutine). Chunks the queue has no room for are
// left to fault in as before.
func (hp *heap) prefaultRange(b []byte) {
	if hp.lookahead <= 0 {
		return
	}
	if hp.faulter == nil {
		hp.faulter = newHeapFaulter(hp.knobs.touchChanges)
	}
	for off := 0; off < len(b); off += prefaultChunk {
		if !hp.faulter.ask(b[off:min(off+prefaultChunk, len(b))]) {
			return
		}
	}
}

// prefaultAhead asks the goroutine for the region's bytes up to
// PrefaultHeap past the bump pointer not asked for yet (polling goroutine,
// after each bump allocation).
func (hp *heap) prefaultAhead() {
	if hp.lookahead <= 0 || hp.knobs.prefaultOnce && hp.ahead > 0 {
		return
	}
	if hp.faulter == nil {
		hp.faulter = newHeapFaulter(hp.knobs.touchChanges)
	}
	mem := hp.mems[hp.cur]
	if hp.ahead < hp.bump {
		// The goroutine fell behind (or the region is new): the
		// pages below the bump are faulted in already.
		hp.ahead = hp.bump &^ (os.Getpagesize() - 1)
	}
	want := min(hp.bump+hp.lookahead, len(mem))
	for hp.ahead < want {
		end := min(hp.ahead+prefaultChunk, len(mem))
		if !hp.faulter.ask(mem[hp.ahead:end]) {
			return // tried again at the next allocation
		}
		hp.ahead = end
	}
}
