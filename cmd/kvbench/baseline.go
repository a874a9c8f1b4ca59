package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/rdma"
)

// The baselines are what the fabrics are measured against, in the same run:
// the same ping-pong or ring done by hand, with nothing between the two
// processes but the mechanism itself.
//
// Raw shared file (raw-shm, raw-futex), mapped MAP_SHARED by both
// processes:
//
//	[0,8)     initiator's word: the target writes it (raw-futex: a uint32 futex)
//	[128,136) target's word: the initiator writes it
//
// Raw ring file (raw-ring): a ring region (layout.go) at 0, and the credits
// word (head) at rawCreditsOffset.
const (
	rawInitiatorWord = 0
	rawTargetWord    = 128
	rawPingPongSize  = 4096
)

func rawCreditsOffset(slots, size int) int { return (ringSize(slots, size) + 63) &^ 63 }

func rawRingFileSize(slots, size int) int { return rawCreditsOffset(slots, size) + 64 }

// createShared creates path with size bytes and maps it shared.
func createShared(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("size %s: %w", path, err)
	}
	return mapFile(f, size)
}

// openShared maps an existing file created by createShared.
func openShared(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mapFile(f, size)
}

func mapFile(f *os.File, size int) ([]byte, error) {
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return b, nil
}

// Futex operations on a word shared between processes (not
// FUTEX_PRIVATE_FLAG, which is for one process).
const (
	futexWait = 0
	futexWake = 1
)

func futexWord(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off:][:4][0])) }

// futexWaitOn sleeps while *addr == val, for at most timeout.
func futexWaitOn(addr *uint32, val uint32, timeout time.Duration) {
	ts := unix.NsecToTimespec(int64(timeout))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWakeOne wakes one waiter on addr.
func futexWakeOne(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, 1, 0, 0, 0)
}

// startRawShm serves a shared-file baseline in the peer.
func (t *target) startRawShm(req request) error {
	if t.done != nil {
		return errors.New("a measurement is running")
	}
	size := rawPingPongSize
	if req.Cmd == "raw-ring" {
		size = rawRingFileSize(req.Slots, req.Size)
	}
	b, err := openShared(req.Path, size)
	if err != nil {
		return err
	}
	t.cleanup = append(t.cleanup, func() error { return unix.Munmap(b) })
	switch req.Cmd {
	case "raw-shm":
		w := &waiter{stop: &t.stop}
		t.launch(func() result { return rawShmEcho(w, b) })
	case "raw-futex":
		t.launch(func() result { return rawFutexEcho(&t.stop, b) })
	case "raw-ring":
		w := &waiter{stop: &t.stop}
		off := rawCreditsOffset(req.Slots, req.Size)
		t.launch(func() result {
			return consumeRing(w, b, req.Slots, req.Size, func(head uint64) error {
				rdma.Store64(b, off, head)
				return nil
			})
		})
	}
	return nil
}

// rawShmEcho is the target of the raw shared-memory ping-pong: spin on an
// atomic load of its word, answer with an atomic store into the other's.
func rawShmEcho(w *waiter, b []byte) result {
	var res result
	for want := uint64(1); ; want++ {
		if err := w.until(func() bool { return rdma.Load64(b, rawTargetWord) == want }); err != nil {
			res.err = err
			return res
		}
		rdma.Store64(b, rawInitiatorWord, want)
		res.seen++
	}
}

// rawFutexEcho is the target of the futex ping-pong: sleep in FUTEX_WAIT
// until its word changes, answer with a store and FUTEX_WAKE. No spinning.
func rawFutexEcho(stop *atomic.Bool, b []byte) result {
	var res result
	mine, theirs := futexWord(b, rawTargetWord), futexWord(b, rawInitiatorWord)
	for want := uint32(1); ; want++ {
		for {
			v := atomic.LoadUint32(mine)
			if v == want {
				break
			}
			if stop.Load() {
				return res
			}
			futexWaitOn(mine, v, 50*time.Millisecond)
		}
		atomic.StoreUint32(theirs, want)
		futexWakeOne(theirs)
		res.seen++
	}
}

// tcpEcho is the target of the raw TCP ping-pong: read 8 bytes, write them
// back, until the initiator closes.
func tcpEcho(c *net.TCPConn) result {
	var res result
	var buf [8]byte
	for {
		if _, err := io.ReadFull(c, buf[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return res
			}
			res.err = err
			return res
		}
		if _, err := c.Write(buf[:]); err != nil {
			res.err = err
			return res
		}
		res.seen++
	}
}

// tcpSink is the target of the raw TCP stream: it reads messages of size
// bytes, checks the sequence number in each one's first word, and closes
// its side when the initiator has closed its own.
func tcpSink(c *net.TCPConn, size int) result {
	var res result
	buf := make([]byte, 256*size)
	have := 0
	for {
		n, err := c.Read(buf[have:])
		have += n
		k := have / size
		for i := range k {
			if binary.NativeEndian.Uint64(buf[i*size:]) != res.seen+1 {
				res.bad++
			}
			res.seen++
		}
		have = copy(buf, buf[k*size:have])
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = err
			}
			c.CloseWrite() // tells the initiator all is consumed
			return res
		}
	}
}

func atomicStore32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
func atomicLoad32(p *uint32) uint32     { return atomic.LoadUint32(p) }
