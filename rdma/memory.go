package rdma

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AllocMemory returns size bytes (rounded up to a page) of zeroed,
// page-aligned memory outside the Go heap, for fabrics that keep regions
// in their own process (mem, tcp). Region memory is written by remote
// peers concurrently with its owner's reads: that is the one-sided model,
// and protocols validate what they read. Keeping it off the Go heap also
// keeps the race detector, which models the Go memory model and not the
// RDMA one, out of it; the protocols' own state stays on the heap and is
// race-checked as usual. Sizes of 1 MiB and more are rounded to 2 MiB,
// 2 MiB-aligned and madvised for transparent huge pages where the host
// allows it (AnonHugePages).
func AllocMemory(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: region size %d must be positive", size)
	}
	if size >= hugeMin && AnonHugePages().Mode == "madvise" {
		n := (size + HugePageSize - 1) / HugePageSize * HugePageSize
		if b := allocHuge(n); b != nil {
			return b[:size], nil
		}
	}
	pg := unix.Getpagesize()
	n := (size + pg - 1) / pg * pg
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("rdma: allocate %d bytes: %w", n, err)
	}
	return b[:size], nil // cap(b) is the whole mapping, which FreeMemory needs
}

// FreeMemory releases memory from AllocMemory. b must be the slice
// AllocMemory returned (any length, same start and capacity).
func FreeMemory(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if p := unsafePointer(b); hugeAllocs.CompareAndDelete(uintptr(p), cap(b)) {
		return unix.MunmapPtr(p, uintptr(cap(b)))
	}
	return unix.Munmap(b[:cap(b)])
}

// Round8 rounds n up to a multiple of 8.
func Round8(n int) int { return (n + 7) &^ 7 }

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

func word(b []byte, off int) *uint64 {
	p := unsafe.Pointer(&b[off:][:8][0]) // bounds-checked
	if uintptr(p)%8 != 0 {
		panic("rdma: unaligned 8-byte access")
	}
	return (*uint64)(p)
}

// Load64 atomically loads the aligned native-endian 8-byte
// word at b[off:]. Every fabric stores words in the host's byte order; all
// supported hosts are little-endian.
func Load64(b []byte, off int) uint64 { return atomic.LoadUint64(word(b, off)) }

// Store64 atomically stores v at b[off:].
func Store64(b []byte, off int, v uint64) { atomic.StoreUint64(word(b, off), v) }

// CAS64 atomically compares and swaps the word at b[off:], returning the
// previous value.
func CAS64(b []byte, off int, old, new uint64) uint64 {
	w := word(b, off)
	for {
		if atomic.CompareAndSwapUint64(w, old, new) {
			return old
		}
		if cur := atomic.LoadUint64(w); cur != old {
			return cur
		}
	}
}

// Add64 atomically adds delta to the word at b[off:], returning the
// previous value.
func Add64(b []byte, off int, delta uint64) uint64 {
	return atomic.AddUint64(word(b, off), delta) - delta
}

// Apply performs wr's effect on region memory mem, which the caller has
// already checked for permission and bounds. Aligned 8-byte writes and reads
// are single atomic accesses; larger ones are copies that a concurrent
// reader may see torn. It returns the previous word for atomics.
func Apply(mem []byte, wr *WR) uint64 {
	off := int(wr.Offset)
	switch wr.Kind {
	case OpWrite:
		if len(wr.Buf) == 8 && off%8 == 0 {
			Store64(mem, off, *(*uint64)(unsafe.Pointer(&wr.Buf[0])))
		} else {
			copy(mem[off:], wr.Buf)
		}
	case OpRead:
		if len(wr.Buf) == 8 && off%8 == 0 {
			*(*uint64)(unsafe.Pointer(&wr.Buf[0])) = Load64(mem, off)
		} else {
			copy(wr.Buf, mem[off:off+len(wr.Buf)])
		}
	case OpCompareAndSwap:
		return CAS64(mem, off, wr.Compare, wr.Value)
	case OpFetchAdd:
		return Add64(mem, off, wr.Value)
	}
	return 0
}
