package vfs

import (
	"io"
	"unsafe" // go:linkname; pwrite's buffer

	"golang.org/x/sys/unix"
)

// fdatasync is fdatasync(2) entered as a system call known to block (the
// runtime's entersyscallblock, as rdma/shm's futex sleeps): the calling
// goroutine's P is handed off at once instead of staying with the thread
// for the whole flush until sysmon takes it back. A wal.FileDevice's
// goroutine spends most of its time here; holding the P meanwhile kept the
// other replicas' device goroutines, made runnable by the same poller pass,
// waiting behind it (each replica's flush started one OS thread
// hand-off after the previous one instead of together).
func fdatasync(fd int) error {
	var e unix.Errno
	fdatasyncBlocking(uintptr(fd), &e)
	if e != 0 {
		return e
	}
	return nil
}

// fdatasyncBlocking: nosplit, and only a raw system call between the two
// runtime calls (nothing may grow the stack or be preempted there).
//
//go:nosplit
//go:norace
func fdatasyncBlocking(fd uintptr, errno *unix.Errno) {
	entersyscallblock()
	_, _, e := unix.RawSyscall(unix.SYS_FDATASYNC, fd, 0, 0)
	exitsyscall()
	*errno = e
}

// BigWrite: a WriteAt of a vfs.OS file at least this long enters the
// kernel as a blocking system call (pwriteBlocking), handing its P off
// at once. A shorter write (a sync-mode batch: a few KiB, a few µs)
// keeps its P: a hand-off would cost more than the copy.
//
// Why (branch asy5, async x64): an async batch is ~FsyncInterval of puts
// (~270 KB at 200 k puts/s), a pwrite of 150-300 µs copying into the page
// cache. As a plain system call it kept its P past sysmon's 20 µs, so
// sysmon took the P back, and each retake resets sysmon's backoff: it
// then wakes every 20 µs for about 50 rounds before it sleeps longer
// again, ~100 times a second, a timer wake-up and two context switches
// each on a 2-vCPU VM whose pollers spin (durability-plan, "asy3" (3) and
// "asy5").
const BigWrite = 64 << 10

// pwrite writes b at off with pwrite(2) entered as a blocking system
// call, the whole of b unless an error stops it (EINTR is retried).
func pwrite(fd int, b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		var e unix.Errno
		var w uintptr
		pwriteBlocking(uintptr(fd), b[n:], off+int64(n), &w, &e)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return n, e
		case w == 0:
			return n, io.ErrUnexpectedEOF // no progress: not expected of a regular file
		}
		n += int(w)
	}
	return n, nil
}

// pwriteBlocking: as fdatasyncBlocking.
//
//go:nosplit
//go:norace
func pwriteBlocking(fd uintptr, b []byte, off int64, n *uintptr, errno *unix.Errno) {
	p := unsafe.Pointer(unsafe.SliceData(b))
	l := uintptr(len(b))
	entersyscallblock()
	r, _, e := unix.RawSyscall6(unix.SYS_PWRITE64, fd, uintptr(p), l, uintptr(off), 0, 0)
	exitsyscall()
	*n, *errno = r, e
}

// Reached by linkname, as rdma/shm does (go.dev/issue/67401 keeps both
// for such callers).
//
//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()
