package main

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// errStalled reports a measurement that made no progress for stallTimeout:
// a lost write, a lost wake-up or a dead peer.
var errStalled = errors.New("kvbench: no progress")

// stallTimeout bounds every wait; generous, since the machine may be loaded.
const stallTimeout = 10 * time.Second

// waiter waits for a word of local region memory to reach a value, either
// by spinning on it or, in park mode, by parking in the node's doorbell with
// the Seq/Wait protocol. A spinning waiter yields the processor every few
// hundred loads, so a goroutine it waits for in the same process still runs.
type waiter struct {
	park bool
	db   rdma.Doorbell
	stop *atomic.Bool // if set, a stop request ends a wait with errStopped
}

// errStopped ends a peer's wait when the parent asks it to stop.
var errStopped = errors.New("kvbench: stopped")

// until waits until cond() holds.
func (w *waiter) until(cond func() bool) error {
	if cond() {
		return nil
	}
	if w.park {
		return w.parkUntil(cond)
	}
	var deadline time.Time
	for i := 1; ; i++ {
		if cond() {
			return nil
		}
		if i&255 == 0 {
			if w.stop != nil && w.stop.Load() {
				return errStopped
			}
			runtime.Gosched()
			if i&(1<<16-1) == 0 {
				now := time.Now()
				if deadline.IsZero() {
					deadline = now.Add(stallTimeout)
				} else if now.After(deadline) {
					return errStalled
				}
			}
		}
	}
}

func (w *waiter) parkUntil(cond func() bool) error {
	var deadline time.Time
	for {
		s := w.db.Seq()
		if cond() {
			return nil
		}
		if w.stop != nil && w.stop.Load() {
			return errStopped
		}
		if !w.db.Wait(s, 100*time.Millisecond) {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(stallTimeout)
			} else if now.After(deadline) {
				return errStalled
			}
		}
	}
}

// wordWriter posts 8-byte writes on a Conn with selective signalling. RDMA
// rules forbid touching a write's buffer until the op completes, so it keeps
// a window of buffers and signals every sigEvery-th write; a signaled
// completion retires every earlier write (FIFO), freeing their buffers. One
// wordWriter serves a Conn for its lifetime: write IDs count up from 0, and
// other signaled ops on the Conn must use IDs at or above readTag.
type wordWriter struct {
	c      rdma.Conn
	bufs   [wordWindow][8]byte
	posted uint64 // writes posted; the next write's ID
	done   uint64 // writes known complete
	cs     [16]rdma.Completion
}

const (
	readTag    = 1 << 63 // ID bit of the benchmark's reads
	wordWindow = 64
	sigEvery   = 16
)

// write posts v to (region, off) on the peer.
func (w *wordWriter) write(region rdma.RegionID, off uint64, v uint64, flags rdma.Flags) error {
	wr, err := w.next(region, off, v, flags)
	if err != nil {
		return err
	}
	if err := postRetry(w.c, &wr, w.reap); err != nil {
		return err
	}
	w.posted++
	return nil
}

// next prepares the next write of v to (region, off), waiting for a free
// buffer; the caller posts it and then counts it in posted.
func (w *wordWriter) next(region rdma.RegionID, off uint64, v uint64, flags rdma.Flags) (rdma.WR, error) {
	if w.posted-w.done >= wordWindow/2 {
		w.reap(0)
	}
	for w.posted-w.done >= wordWindow {
		if err := w.reap(stallTimeout); err != nil {
			return rdma.WR{}, err
		}
	}
	n := w.posted
	buf := &w.bufs[n%wordWindow]
	putWord(buf, v)
	if n%sigEvery == sigEvery-1 {
		flags |= rdma.Signaled
	}
	return rdma.WR{ID: n, Kind: rdma.OpWrite, Flags: flags, Region: region, Offset: off, Buf: buf[:]}, nil
}

// reap polls completions, waiting up to timeout for the first.
func (w *wordWriter) reap(timeout time.Duration) error {
	var k int
	if timeout > 0 {
		k = w.c.Wait(w.cs[:], timeout)
		if k == 0 {
			return fmt.Errorf("write completion (posted %d, done %d): %w after %v", w.posted, w.done, errStalled, timeout)
		}
	} else {
		k = w.c.Poll(w.cs[:])
	}
	for _, c := range w.cs[:k] {
		if c.Err != nil {
			return c.Err
		}
		if c.ID < w.posted { // not some other user's op on the Conn
			w.done = max(w.done, c.ID+1)
		}
	}
	return nil
}

// postRetry posts wr, reaping completions while the send queue is full.
// It is postListRetry of one WR, written out: a one-element slice handed
// to the Conn interface escapes, and this is on the measured path of every
// single-op benchmark, which must not allocate per op.
func postRetry(c rdma.Conn, wr *rdma.WR, reap func(time.Duration) error) error {
	var deadline time.Time
	for {
		err := c.Post(*wr)
		if !errors.Is(err, rdma.ErrQueueFull) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(stallTimeout)
		} else if time.Now().After(deadline) {
			return fmt.Errorf("post: send queue full: %w", errStalled)
		}
		if err := reap(0); err != nil {
			return err
		}
		runtime.Gosched()
	}
}

// postListRetry posts wrs with PostList, reaping completions and posting
// the rest while the send queue is full.
func postListRetry(c rdma.Conn, wrs []rdma.WR, reap func(time.Duration) error) error {
	var deadline time.Time
	for {
		n, err := c.PostList(wrs)
		wrs = wrs[n:]
		if len(wrs) == 0 || !errors.Is(err, rdma.ErrQueueFull) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(stallTimeout)
		} else if time.Now().After(deadline) {
			return fmt.Errorf("post: send queue full: %w", errStalled)
		}
		if err := reap(0); err != nil {
			return err
		}
		runtime.Gosched()
	}
}
