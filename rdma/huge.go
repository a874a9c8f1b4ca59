package rdma

import (
	"os"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HugePages is how a node's large regions are backed by huge pages, and
// why: each fabric decides when a node opens (shm: see its huge.go; mem
// and tcp: AllocMemory's transparent huge pages).
type HugePages struct {
	// Mode is off, hugetlbfs, tmpfs (a tmpfs mounted with huge pages),
	// madvise (MADV_HUGEPAGE on each large region), or unknown.
	Mode   string `json:"mode"`
	Reason string `json:"reason"`
	// PageSize is the huge page size in bytes (0 when off).
	PageSize int `json:"page_size,omitempty"`
}

// String is "mode (reason)".
func (h HugePages) String() string { return h.Mode + " (" + h.Reason + ")" }

// HugePager is a Node that reports its huge pages.
type HugePager interface{ HugePages() HugePages }

// HugePagesOf is n's HugePages, or mode "unknown" for a node that does not
// say.
func HugePagesOf(n Node) HugePages {
	if h, ok := n.(HugePager); ok {
		return h.HugePages()
	}
	return HugePages{Mode: "unknown", Reason: "the fabric does not report huge pages"}
}

const (
	// HugePageSize is the (PMD) huge page size AllocMemory aligns to.
	HugePageSize = 2 << 20
	// hugeMin is the smallest AllocMemory size put on huge pages.
	hugeMin        = 1 << 20
	thpEnabledFile = "/sys/kernel/mm/transparent_hugepage/enabled"
	thpDefragFile  = "/sys/kernel/mm/transparent_hugepage/defrag"
)

var anonHuge = sync.OnceValue(func() HugePages {
	e, _ := os.ReadFile(thpEnabledFile)
	d, _ := os.ReadFile(thpDefragFile)
	return probeAnonHuge(string(e), string(d))
})

// selected is the bracketed choice of a sysfs selector ("a [b] c": b).
func selected(text string) (string, bool) {
	_, rest, ok := strings.Cut(text, "[")
	sel, _, _ := strings.Cut(rest, "]")
	return sel, ok
}

// probeAnonHuge decides from the texts of transparent_hugepage/enabled
// and transparent_hugepage/defrag. Madvised regions get huge pages only
// where a fault in them does not compact memory in the faulting thread
// (defrag defer or never): with defrag madvise, always or defer+madvise,
// the first touch of a madvised page may stall the thread that touches it
// for milliseconds while the kernel compacts, and that thread is often a
// poller (broadcast's TestLargeSnapshotCatchUp saw Polls of 8 ms on CPU).
func probeAnonHuge(enabled, defrag string) HugePages {
	sel, ok := selected(enabled)
	switch {
	case !ok:
		return HugePages{Mode: "off", Reason: "the kernel has no transparent huge pages"}
	case sel != "always" && sel != "madvise":
		return HugePages{Mode: "off", Reason: "transparent_hugepage/enabled=" + sel}
	}
	if d, _ := selected(defrag); d != "defer" && d != "never" {
		return HugePages{Mode: "off", Reason: "transparent_hugepage/defrag=" + d + ": a fault in a madvised region would compact memory in the faulting thread (a poller), stalling it for milliseconds"}
	}
	return HugePages{Mode: "madvise", PageSize: HugePageSize,
		Reason: "anonymous regions of 1 MiB or more are 2 MiB-aligned and madvised (transparent_hugepage/enabled=" + sel + ")"}
}

// AnonHugePages is how AllocMemory backs large regions on this host.
func AnonHugePages() HugePages { return anonHuge() }

// hugeAllocs holds allocHuge's mappings (address to length) until
// FreeMemory unmaps them.
var hugeAllocs sync.Map

// allocHuge maps n bytes (a multiple of HugePageSize) at a 2 MiB-aligned
// address and advises huge pages; nil if that cannot be done. The mapping
// is made with MmapPtr, not Mmap (whose bookkeeping knows only whole
// mappings): FreeMemory unmaps it with MunmapPtr.
func allocHuge(n int) []byte {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n+HugePageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	addr := uintptr(p)
	off := (HugePageSize - addr%HugePageSize) % HugePageSize
	if off > 0 {
		unix.MunmapPtr(p, off)
	}
	if tail := HugePageSize - off; tail > 0 {
		unix.MunmapPtr(unsafe.Add(p, off+uintptr(n)), tail)
	}
	b := unsafe.Slice((*byte)(unsafe.Add(p, off)), n)
	hugeAllocs.Store(uintptr(unsafe.Add(p, off)), n)
	unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: an error leaves small pages
	return b
}
