// Package prefault maps memory a caller is about to write in one system
// call instead of one page fault per page.
//
// Why (issue 19): on this project's VMs the first write to a fresh page
// costs 15-19 µs of CPU, a fault in the guest and the host's sync of its
// page tables; a restart from disk writes every page of its read buffers,
// index and heap once (~60 k pages a replica of 500 k records). A page
// populated by madvise(MADV_POPULATE_WRITE) costs about half at its first
// write (btree/populate.go measured the same).
package prefault

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

var pageSize = os.Getpagesize()

// Populate asks the kernel to map the whole pages of b writable now
// (MADV_POPULATE_WRITE): it faults them in without changing a byte. The
// partial pages at b's ends are left alone, so nothing outside b is
// touched. An error (a kernel before 5.14) changes nothing: the pages
// fault in as they are first written.
func Populate(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (p + uintptr(pageSize) - 1) &^ uintptr(pageSize-1)
	hi := (p + uintptr(len(b))) &^ uintptr(pageSize-1)
	if hi <= lo {
		return nil
	}
	return unix.Madvise(b[lo-p:hi-p], unix.MADV_POPULATE_WRITE)
}
