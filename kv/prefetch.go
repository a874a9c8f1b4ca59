package kv

import (
	"encoding/binary"

	"github.com/rdmakv/rdmakv/kv/opwire"
)

// Memory-level parallelism in the apply (issue 17). A put's lookup (find)
// is a chain of two dependent cache and TLB misses: the key's candidate
// buckets in a large index, then the record header a matching slot
// points to. Applied one after the other, a batch's lookups pay those
// misses in series: a put's apply is far longer than the CPU's reorder
// window, so the next put's loads do not start before this one's end.
// Prefetch keeps each message of a batch; at BeginBatch touchBatch hashes
// their keys and touch loads what find will load for all of them (before
// a multi request's ops when its batch did not), in passes of independent
// loads (all the buckets, then all the records), so that the CPU overlaps
// the misses of different keys; the apply then runs as before, in order,
// on memory that is in cache. Go has no prefetch instruction: the passes are plain loads
// summed into t.sink, which the compiler cannot drop. Nothing else
// changes: the table, its header and every result are what the apply
// without them leaves (TestPrefetchSameImage).

// maxPrefetch bounds the hashes a batch keeps for touch (a batch entry
// carries at most multicast's MaxBatch messages, each of at most MaxMulti
// ops in practice); keys past it are not touched.
const maxPrefetch = 1024

// maxPrefetchMsgs bounds the payloads a batch keeps for touchBatch
// (multicast's MaxBatch is 64 by default).
const maxPrefetchMsgs = 256

// Prefetch implements multicast.BatchPrefetcher: multicast calls it for
// each message of a batch entry the group applies, before BeginBatch. It
// keeps the payload (a slice of the entry, which outlives the batch's
// apply) for BeginBatch's touchBatch. It changes nothing a replica
// applies or publishes.
func (t *Table) Prefetch(data []byte) {
	if !t.knobs.noPrefetch && len(t.prePay) < maxPrefetchMsgs {
		t.prePay = append(t.prePay, data)
	}
}

// touchBatch, at BeginBatch, touches the keys of the payloads Prefetch
// kept, if there are several: the ops of requests and multi requests, on
// this group's keys (a payload it cannot read is skipped: Apply refuses
// it). A batch of one message is left to applyMulti (a multi request
// touches its own ops): a single key has nothing to overlap with, and
// its hash would be computed twice. It reports whether it touched.
func (t *Table) touchBatch() bool {
	pays := t.prePay
	defer func() {
		clear(pays) // drop the references to the entry
		t.prePay = pays[:0]
	}()
	if o, ok := t.cfg.Ordered.(orderedPrefetcher); ok && !t.knobs.noPrefetch {
		// The ordered part finds and touches its requests' leaves
		// (btree/prefetch.go), even for one message: a multi request's
		// keys overlap.
		for _, data := range pays {
			if len(data) > 0 && data[0] == OrderedFormat {
				o.Prefetch(data)
			}
		}
		o.TouchBatch()
	}
	if len(pays) < 2 {
		return false
	}
	for _, data := range pays {
		if len(data) == 0 || data[0] != reqFormat && data[0] != multiFormat {
			continue
		}
		d, n, err := opwire.NewDecoder(data, data[0], 0, ErrMalformed)
		if err != nil {
			continue
		}
		for range n {
			oh, err := d.Header()
			if err != nil {
				break
			}
			key, _, _, err := d.Parts(oh)
			if err != nil || len(key) == 0 {
				break
			}
			t.prefetchKey(key)
		}
	}
	t.touch()
	t.batchTouches++
	return true
}

// prefetchOps touches the keys of ops decoded already (a multi request
// applied outside a batch, or alone in its batch).
func (t *Table) prefetchOps(ops []Op) {
	if t.knobs.noPrefetch {
		return
	}
	for i := range ops {
		t.prefetchKey(ops[i].Key)
	}
	t.touch()
}

// prefetchKey keeps a key's hash for touch if the key is this group's.
func (t *Table) prefetchKey(key []byte) {
	h := hashKey(key)
	if !t.owns(h) || len(t.pre) == maxPrefetch {
		return
	}
	t.pre = append(t.pre, h)
	if t.knobs.prefetchMigrates {
		// Planted bug: the prefetch migrates the key's old buckets
		// (to have the migration's loads early too), before the batch's
		// earlier ops are applied: their inserts then find other slots
		// taken than in the apply without prefetch.
		t.migrateKey(h)
	}
}

// touch loads, for every hash prefetchKey kept, what find will load: both
// cache lines of both candidate buckets of the current generation (a key
// lives in the less loaded of the two, and find scans the first before
// the second; the neighbours, where a key goes only when both are full,
// are left alone), then the record header and key of every slot there
// whose fingerprint matches. Each pass first computes its addresses and
// then loads them in a loop of a few instructions per load, so that the
// CPU's reorder window holds the loads of many keys at once: with the
// hashing or the slot scan in the same loop it held one or two keys' and
// the misses stayed serial (measured: docs/dev/write-path-plan.md). A
// single key has nothing to overlap with and is not touched. It empties
// the kept hashes.
func (t *Table) touch() {
	if len(t.pre) < 2 {
		t.pre = t.pre[:0]
		return
	}
	mem, log := t.cur.mem, t.cur.log
	offs := t.preOff[:0]
	for _, h := range t.pre {
		b1, b2 := candidates(h, log)
		o1, o2 := b1*bucketSize, b2*bucketSize
		offs = append(offs, o1+bucketHdr+8, o1+bucketSize-8, o2+bucketHdr+8, o2+bucketSize-8)
	}
	var sink uint64
	for _, o := range offs {
		sink += uint64(mem[o])
	}
	// The records: the slots whose fingerprint matches, as find reads
	// them (its record's first bytes and the key's last).
	offs = offs[:0]
	mems := t.heap.mems
	for _, h := range t.pre {
		fp := fpOf(h)
		b1, b2 := candidates(h, log)
		for _, b := range [2]int{b1, b2} {
			off := b*bucketSize + bucketHdr
			for i := range slotsPer {
				so := off + i*slotSize
				if mem[so+8] != fp {
					continue
				}
				ref := binary.LittleEndian.Uint64(mem[so+8:])
				if binary.LittleEndian.Uint64(mem[so:]) == 0 || int(uint8(ref>>24)) >= len(mems) {
					continue
				}
				ro := int(ref>>32) * recAlign
				if ro+recHdr+maxKeyTouch <= len(mems[uint8(ref>>24)]) {
					offs = append(offs, int(uint8(ref>>24))<<40|ro)
				}
			}
		}
	}
	for _, r := range offs {
		hm := mems[r>>40]
		o := r & (1<<40 - 1)
		sink += uint64(hm[o]) + uint64(hm[o+recHdr+maxKeyTouch-1])
	}
	t.sink += sink
	t.touched += uint64(len(t.pre))
	t.preOff = offs[:0]
	t.pre = t.pre[:0]
}

// maxKeyTouch: touch loads a record's first recHdr+maxKeyTouch bytes
// (its header and a 16-byte key: find compares the key).
const maxKeyTouch = 16

// orderedPrefetcher is an ordered part that prefetches a batch
// (btree.Store): Prefetch for each ordered message of the batch, then
// TouchBatch, before the batch's applies.
type orderedPrefetcher interface {
	Prefetch(data []byte)
	TouchBatch()
}
