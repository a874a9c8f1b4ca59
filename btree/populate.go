package btree

import "github.com/rdmakv/rdmakv/internal/prefault"

// populateBytes is how far ahead of the slots it hands out an arena has
// the kernel map its chunk's pages writable, in one madvise
// (MADV_POPULATE_WRITE) a window: 16 slots of 4 KiB nodes.
//
// Why: each leaf split takes a new slot, so an insert-heavy group writes a
// page never touched before every 15-30 inserts, on every replica. On
// this machine's VM the first write to such a page costs 15-19 µs of CPU
// (the guest's fault, then the host's sync of its shadow page table); a
// page the kernel populated costs 0.3-1 µs in the madvise and 7-9 µs at
// its first write, about half (docs/dev/btree-plan.md, branch ins8). A
// window, not the whole chunk at its growth: populating 4 MiB chunks cost
// every store the tests' simulators make 4 MiB and ~1 ms (tried and
// dropped by branch ins); a window commits at most populateBytes ahead
// of what the tree uses.
const populateBytes = 64 << 10

// populateWindow is the number of slots a window covers (at least one).
func (a *Arena) populateWindow() uint32 {
	return uint32(max(1, populateBytes/a.size))
}

// populateFrom is called by alloc when it hands out new slot s: if s is
// past the populated slots, the window [s, s+window) is populated,
// clipped to s's chunk (the next chunk is other memory: a region of its
// own, or not there yet).
func (a *Arena) populateFrom(s uint32) {
	if s < a.populated || a.noPopulate {
		return
	}
	end := s + a.populateWindow()
	if a.knobs.populateBehind {
		// Planted bug: the window ends at s, so s itself is never
		// populated ahead (a late window, off by one window).
		s, end = s-min(s, a.populateWindow()), s
	}
	if ce := (s/uint32(a.per) + 1) * uint32(a.per); end > ce && !a.knobs.populatePastChunk {
		end = ce
	}
	a.populated = max(a.populated, end)
	if a.knobs.onPopulate != nil {
		a.knobs.onPopulate(s, end)
		return
	}
	c, o := int(s)/a.per, int(s)%a.per*a.size
	n := int(end-s) * a.size
	if err := populate(a.chunks[c][o : o+n]); err != nil {
		// Not supported here (a kernel before 5.14, or memory that cannot
		// be populated): the pages fault in as they are first written.
		a.noPopulate = true
	}
}

// populate asks the kernel to map the whole pages of b writable now,
// without changing a byte (internal/prefault.Populate).
func populate(b []byte) error { return prefault.Populate(b) }
