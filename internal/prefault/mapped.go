package prefault

import (
	"encoding/binary"
	"os"
	"unsafe"
)

// Mapped reports whether the page holding b[0] is mapped in this process
// (its present bit in /proc/self/pagemap): the tests of the pre-faulting
// callers check what a Faulter or Populate mapped.
func Mapped(b []byte) (bool, error) {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return false, err
	}
	defer f.Close()
	addr := uintptr(unsafe.Pointer(&b[0]))
	var e [8]byte
	if _, err := f.ReadAt(e[:], int64(addr/uintptr(pageSize))*8); err != nil {
		return false, err
	}
	return binary.LittleEndian.Uint64(e[:])&(1<<63) != 0, nil
}
