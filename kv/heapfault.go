package kv

import (
	"os"

	"github.com/rdmakv/rdmakv/internal/prefault"
)

// Heap pre-faulting (TableConfig.PrefaultHeap). Inserts of new keys take
// fresh heap memory at the bump pointer, and the first store to each fresh
// page of a region faults it in on the polling goroutine: on this
// project's VM 15-30 µs of CPU per 4 KiB page, once per ~3.7 records of
// YCSB's 1 KB (the load phase's profile put 38% of the embedded cluster's
// CPU in encodeRecord's copy, nearly all of it those faults). A goroutine
// of the table (an internal/prefault.Faulter: populate, then touch each
// page with an atomic add of zero) keeps the pages from the bump pointer
// to PrefaultHeap bytes past it mapped instead, ~8 µs a page off the
// poller against 15 µs or more a fault on it.
//
// The poller only sends chunks to the Faulter's buffered channel (never
// blocks: a chunk that finds it full is counted and left to be faulted as
// before).

// prefaultChunk is the most bytes one request asks the goroutine to fault
// in (a request per this many bytes allocated).
const prefaultChunk = 1 << 20

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
	return HeapPrefaults{Pages: hp.faulter.Pages(), Drops: hp.faulter.Drops()}
}

// prefaultsDone waits for the chunks asked for so far (polling goroutine,
// before it unmaps a region the goroutine may touch: an old index
// generation; by then its chunks are long done).
func (hp *heap) prefaultsDone() {
	if hp.faulter != nil {
		hp.faulter.Wait()
	}
}

// stopFaulter ends the goroutine once its queue is done.
func (hp *heap) stopFaulter() {
	if hp.faulter != nil {
		hp.faulter.Close()
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
		hp.faulter = prefault.NewFaulter(hp.knobs.touchChanges)
	}
	for off := 0; off < len(b); off += prefaultChunk {
		if !hp.faulter.Ask(b[off:min(off+prefaultChunk, len(b))]) {
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
		hp.faulter = prefault.NewFaulter(hp.knobs.touchChanges)
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
		if !hp.faulter.Ask(mem[hp.ahead:end]) {
			return // tried again at the next allocation
		}
		hp.ahead = end
	}
}
