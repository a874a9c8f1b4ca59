package vfs

import (
	_ "unsafe" // go:linkname

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

// Reached by linkname, as rdma/shm does (go.dev/issue/67401 keeps both
// for such callers).
//
//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()
