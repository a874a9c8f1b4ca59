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

// prefaultPiece is the most bytes of new slots one request to the faulter
// names (a request per this many bytes of splits).
const prefaultPiece = 64 << 10

// DefaultPrefaultNodes is a lookahead for StoreConfig.PrefaultNodes: 256
// slots of 4 KiB nodes. Splits take a new slot every 5-50 inserts
// (kvbench btree's insert rows), so at 100 k inserts a second the arena
// moves through ~8 MiB a second, and 1 MiB leaves the faulter ~0.1 s to
// keep up. kvserver does not set it (docs/btree.md: on this machine the
// faulter takes the pages off the poller but costs more CPU in all).
const DefaultPrefaultNodes = 1 << 20

// SetPrefault makes the arena keep the pages of the bytes new slots past
// the one it hands out mapped, by a goroutine of its own (a
// prefault.Faulter), instead of populating windows on the writer's
// goroutine (0: off). The arena's chunks must not be Go heap memory under
// the race detector (the faulter's touches are atomic adds the writer's
// copies may meet): a Store's regions are mapped memory. Close stops the
// goroutine.
func (a *Arena) SetPrefault(bytes int) {
	a.prefault = 0
	if bytes > 0 {
		a.prefault = max(1, bytes/a.size)
	}
}

// prefaultFrom is alloc's pre-fault when it hands out new slot s (with
// SetPrefault): it asks the faulter for the slots past the ones asked
// for already, up to s+prefault, clipped to s's chunk (the next chunk is
// not there before it grows), in requests of prefaultPiece bytes. Slot s
// itself is written at once: if it was never asked for (a chunk's first
// slot, or the faulter's queue was full), its page faults in on the
// writer as without pre-faulting. A request the queue has no room for is
// asked again at the next new slot.
func (a *Arena) prefaultFrom(s uint32) {
	if a.asked <= s {
		a.asked = s + 1
	}
	if a.knobs.prefaultOnce && a.faulter != nil {
		return
	}
	want := s + 1 + uint32(a.prefault)
	if ce := (s/uint32(a.per) + 1) * uint32(a.per); want > ce {
		want = ce
	}
	piece := uint32(max(1, prefaultPiece/a.size))
	for a.asked < want {
		end := min(a.asked+piece, want)
		if a.faulter == nil {
			a.faulter = prefault.NewFaulter(a.knobs.prefaultTouchZero)
		}
		c, o := int(a.asked)/a.per, int(a.asked)%a.per*a.size
		if !a.faulter.Ask(a.chunks[c][o : o+int(end-a.asked)*a.size]) {
			return
		}
		a.asked = end
	}
}

// Prefaults counts the arena's pre-faulting (SetPrefault): pages the
// faulter touched, requests not made as its queue was full, and the CPU
// time the faulter spent (ns).
func (a *Arena) Prefaults() (pages, drops, cpu int64) {
	if a.faulter == nil {
		return 0, 0, 0
	}
	return a.faulter.Pages(), a.faulter.Drops(), a.faulter.CPU()
}

// closeFaulter stops the faulter once its queue is done (before the
// chunks are unmapped).
func (a *Arena) closeFaulter() {
	if a.faulter != nil {
		a.faulter.Close()
		a.faulter = nil
	}
}
