package kv

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"

	"github.com/rdmakv/rdmakv/internal/reuse"
)

// Placing a snapshot's records in a new index (Restore). The records come
// in the snapshot's order, which is the heap's, and their keys' buckets
// are random: placing them in that order costs a cache miss (often a TLB
// miss: the index of 1 M records is ~32 MB) per record, and looking for a
// key twice cost four more (issue 19: the duplicate search and the
// placement were ~60% of BenchmarkRestore's Restore). So Restore places
// them in the order of their first bucket (candidates' b1, the low bits of
// the hash) instead: the index is written front to back, and two records
// of one key, which have one hash, fall in one run of equal b1, where the
// duplicate check compares hashes in the cache. And a record goes to
// the less loaded bucket of b1's aligned pair while that pair has room
// (restoreSlot), not to the less loaded of b1 and b2 as a put's freeSlot
// does: comparing with b2 would read a random bucket per record again.
// A key may live in any of its four places (readers read both pairs), so
// either is an index readers find the key in; the restored index is only
// less balanced between the two pairs, at half the load an index grows
// at (Restore's sizing), where b1's pair overflows for under 1% of keys.

// placeRec is a record to place: its key's hash, what its slot holds and
// its index in recs (read only to compare keys), so that placing it reads
// nothing out of order.
type placeRec struct {
	h, version, ref uint64
	k, size         uint32
}

// radixBits is the digit of placeOrder's radix sort: 2^11 counters fit
// the L1 cache, and a pass writes to at most 2^11 places at once.
const radixBits = 11

// placeOrder returns recs' hashes and indices ordered by b1 = h &
// (2^log-1) (a stable LSD radix sort: records of one b1 stay in snapshot
// order). The two buffers it uses are populated before they are written
// (a fresh page's first write is the costly part on this project's VMs).
func placeOrder(recs []restoreRec, log int, a, b []placeRec) []placeRec {
	for k := range recs {
		r := &recs[k]
		a[k] = placeRec{h: r.h, version: r.version, ref: r.ref, k: uint32(k), size: uint32(r.size)}
	}
	mask := uint64(1)<<log - 1
	var count [1 << radixBits]int
	for shift := 0; shift < log; shift += radixBits {
		clear(count[:])
		for _, r := range a {
			count[(r.h&mask)>>shift&(1<<radixBits-1)]++
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for _, r := range a {
			d := (r.h & mask) >> shift & (1<<radixBits - 1)
			b[count[d]] = r
			count[d]++
		}
		a, b = b, a
	}
	return a
}

// placeRecords places recs in ng's index in placeOrder's order and fails
// on a key held twice (unless planted dupUnchecked). placed is false when
// a key found its four buckets full (Restore tries again with twice the
// buckets).
func placeRecords(ng *gen, b []byte, recs []restoreRec, dupUnchecked bool, scratch *reuse.Pool) (placed bool, err error) {
	// The sort's two buffers: lent by scratch (the Restores before this
	// one's), else fresh and populated before they are written.
	n, size := len(recs), int(unsafe.Sizeof(placeRec{}))
	bufA, bufB := scratch.Get(n*size), scratch.Get(n*size)
	defer scratch.Put(bufA)
	defer scratch.Put(bufB)
	ord := placeOrder(recs, ng.log, reuse.Slice[placeRec](bufA, n), reuse.Slice[placeRec](bufB, n))
	mask := uint64(1)<<ng.log - 1
	for i := 0; i < len(ord); {
		// The run of one first bucket: its records, sorted by hash, so
		// that a key's two records are next to each other.
		j := i + 1
		for j < len(ord) && ord[j].h&mask == ord[i].h&mask {
			j++
		}
		run := ord[i:j]
		if len(run) > 1 {
			slices.SortFunc(run, func(x, y placeRec) int {
				return cmp.Or(cmp.Compare(x.h, y.h), cmp.Compare(x.k, y.k))
			})
		}
		for x, p := range run {
			// Every earlier record of the same hash (two keys may share
			// one: compare with each, not only the one before).
			for y := x - 1; y >= 0 && run[y].h == p.h && !dupUnchecked; y-- {
				if key := recs[p.k].key(b); bytes.Equal(recs[run[y].k].key(b), key) {
					return false, fmt.Errorf("%w: key %q twice (records %d and %d)", ErrSnapshot, key, run[y].k, p.k)
				}
			}
			s := Slot{Version: p.version, FP: fpOf(p.h), Units: unitsOf(int(p.size)), Heap: uint8(refHeap(p.ref)), Off: uint64(refOff(p.ref))}
			bo, si, ok := restoreSlot(ng, p.h)
			if !ok {
				return false, nil
			}
			storeSlot(ng.mem, bo, si, s)
		}
		i = j
	}
	return true, nil
}

// restoreSlot is a free slot for a key of hash h in ng (placeRecords):
// in the less loaded bucket of its first pair (b1, b1^1), else where
// freeSlot finds one.
func restoreSlot(ng *gen, h uint64) (bucket, slot int, ok bool) {
	b1, _ := candidates(h, ng.log)
	b := b1
	if bucketLoad(ng, b1^1) < bucketLoad(ng, b1) {
		b = b1 ^ 1
	}
	off := b * bucketSize
	for i := range slotsPer {
		if binary.LittleEndian.Uint64(ng.mem[off+bucketHdr+i*slotSize:]) == 0 {
			return off, i, true
		}
	}
	return freeSlot(ng, h)
}
