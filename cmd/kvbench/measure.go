package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmakv/rdmakv/internal/hist"
	"github.com/rdmakv/rdmakv/rdma"
)

// timing bounds one measurement: warm is run and thrown away, then the
// measured part lasts at least dur.
type timing struct {
	dur, warm time.Duration
}

// stat is the outcome of one measurement. For ping-pongs and reads the
// latencies are round trips; for rings they are zero.
type stat struct {
	p50, p99 time.Duration
	n        uint64  // ops measured
	opsPerS  float64 // ops per second of the measured part
	run      int     // which run (from 1) measured it
	otherCPU float64 // CPUs other processes used meanwhile (-1: unknown)
	retries  int     // repeats because of background load
}

// timeLoop calls step(1), step(2), ... and times each call into h: first
// for tm.warm (not recorded), then for tm.dur.
func timeLoop(tm timing, h *hist.Hist, step func(i uint64) error) (stat, error) {
	h.Reset()
	i := uint64(0)
	for end := time.Now().Add(tm.warm); time.Now().Before(end); {
		i++
		if err := step(i); err != nil {
			return stat{}, fmt.Errorf("warm-up op %d: %w", i, err)
		}
	}
	start := time.Now()
	t0 := start
	for {
		i++
		if err := step(i); err != nil {
			return stat{}, fmt.Errorf("op %d: %w", i, err)
		}
		t1 := time.Now()
		h.Record(t1.Sub(t0))
		t0 = t1
		if t1.Sub(start) >= tm.dur {
			break
		}
	}
	el := t0.Sub(start)
	return stat{p50: h.Quantile(0.50), p99: h.Quantile(0.99), n: h.N(), opsPerS: float64(h.N()) / el.Seconds()}, nil
}

// ringPoster is how a ring producer writes: through a fabric Conn, or by
// hand into a shared mapping (the baseline).
type ringPoster interface {
	slot(off int, buf []byte) error // write one slot
	publish(tail uint64) error      // write the tail word
}

// produceRing fills the ring with messages of size bytes, batch slots then
// one tail, waiting on head() for credits when the ring is full. It measures
// messages consumed per second, and returns how many it published in all.
func produceRing(p ringPoster, w *waiter, head func() uint64, slots, size, batch int, tm timing) (stat, uint64, error) {
	stage := make([]byte, slots*size)
	for s := range slots {
		fillSlot(stage[s*size : (s+1)*size])
	}
	var m uint64
	now := time.Now()
	warmEnd := now.Add(tm.warm)
	var start, end time.Time
	var headAtStart uint64
	for {
		if err := w.until(func() bool { return m+uint64(batch)-head() <= uint64(slots) }); err != nil {
			return stat{}, m, fmt.Errorf("wait for credits at message %d: %w", m, err)
		}
		for range batch {
			s := int(m % uint64(slots))
			buf := stage[s*size : (s+1)*size]
			// Reusing buf is safe: head says the consumer has seen the
			// message that last used it, so its write has landed.
			encodeSlot(buf, m+1)
			if err := p.slot(ringHeader+s*size, buf); err != nil {
				return stat{}, m, fmt.Errorf("write message %d: %w", m, err)
			}
			m++
		}
		if err := p.publish(m); err != nil {
			return stat{}, m, fmt.Errorf("publish tail %d: %w", m, err)
		}
		now = time.Now()
		if start.IsZero() {
			if now.After(warmEnd) {
				start, headAtStart = now, head()
			}
		} else if now.Sub(start) >= tm.dur {
			break
		}
	}
	if err := w.until(func() bool { return head() == m }); err != nil {
		return stat{}, m, fmt.Errorf("wait for the consumer to drain %d messages: %w", m, err)
	}
	end = time.Now()
	n := m - headAtStart
	return stat{n: n, opsPerS: float64(n) / end.Sub(start).Seconds()}, m, nil
}

// session is the initiator's side of one fabric in one mode: its node, a
// Conn to the target and the peer that runs the target.
type session struct {
	fabric string
	park   bool
	node   rdma.Node
	conn   rdma.Conn
	ww     *wordWriter // all 8-byte writes on conn
	peer   peer
	close  func() error
}

// register creates an initiator region for measurement k, open to the target.
func (s *session) register(k, role, size int) (rdma.Region, error) {
	r, err := s.node.Register(regionID(k, role), size)
	if err != nil {
		return nil, fmt.Errorf("register region %d: %w", regionID(k, role), err)
	}
	if err := r.Grant(targetID, rdma.PermReadWrite); err != nil {
		r.Close()
		return nil, fmt.Errorf("grant region %d: %w", regionID(k, role), err)
	}
	return r, nil
}

func (s *session) waiter() *waiter { return &waiter{park: s.park, db: s.node.Doorbell()} }

// stopPeer ends the peer's side of a measurement and reports its result.
func stopPeer(p peer) (reply, error) { return callOK(p, request{Cmd: "stop"}) }

// writeLatency is the 8-byte write ping-pong: write the target's word,
// wait until it writes ours. Round trips are recorded; one-way is half.
func (s *session) writeLatency(k int, tm timing, h *hist.Hist) (stat, error) {
	r, err := s.register(k, regPingPong, pingPongSize)
	if err != nil {
		return stat{}, err
	}
	defer r.Close()
	if _, err := callOK(s.peer, request{Cmd: "pingpong", K: k}); err != nil {
		return stat{}, err
	}
	mine, w, ww := r.Bytes(), s.waiter(), s.ww
	var flags rdma.Flags
	if s.park {
		flags = rdma.Notify
	}
	target := regionID(k, regPingPong)
	st, err := timeLoop(tm, h, func(i uint64) error {
		if err := ww.write(target, 0, i, flags); err != nil {
			return err
		}
		return w.until(func() bool { return rdma.Load64(mine, 0) == i })
	})
	_, perr := stopPeer(s.peer)
	return st, errors.Join(err, perr)
}

// readLatency is the 8-byte read round trip: a signaled OpRead of the
// target's word, then wait for its completion (spin on Poll, or Conn.Wait
// in park mode).
func (s *session) readLatency(k int, tm timing, h *hist.Hist) (stat, error) {
	if _, err := callOK(s.peer, request{Cmd: "passive", K: k}); err != nil {
		return stat{}, err
	}
	var buf [8]byte
	var cs [4]rdma.Completion
	region := regionID(k, regPingPong)
	st, err := timeLoop(tm, h, func(i uint64) error {
		id := readTag | i
		wr := rdma.WR{ID: id, Kind: rdma.OpRead, Flags: rdma.Signaled, Region: region, Buf: buf[:]}
		if err := s.conn.Post(wr); err != nil {
			return err
		}
		for spins := 1; ; spins++ {
			var n int
			if s.park {
				if n = s.conn.Wait(cs[:], stallTimeout); n == 0 {
					return fmt.Errorf("read completion: %w", errStalled)
				}
			} else if n = s.conn.Poll(cs[:]); n == 0 {
				if spins&255 == 0 {
					runtime.Gosched()
				}
				continue
			}
			for _, c := range cs[:n] {
				if c.Err != nil {
					return c.Err
				}
				if c.ID == id {
					return nil
				}
			}
		}
	})
	_, perr := stopPeer(s.peer)
	return st, errors.Join(err, perr)
}

// fabricPoster writes a batch of ring slots unsignaled and the tail with
// Notify (signaled now and then, to retire the slot writes) in one
// Conn.PostList: the batched publication of a ring producer.
type fabricPoster struct {
	c    rdma.Conn
	ring rdma.RegionID
	ww   *wordWriter
	wrs  []rdma.WR // the batch so far
}

func (p *fabricPoster) slot(off int, buf []byte) error {
	p.wrs = append(p.wrs, rdma.WR{Kind: rdma.OpWrite, Region: p.ring, Offset: uint64(off), Buf: buf})
	return nil
}

func (p *fabricPoster) publish(tail uint64) error {
	wr, err := p.ww.next(p.ring, 0, tail, rdma.Notify)
	if err != nil {
		return err
	}
	p.wrs = append(p.wrs, wr)
	err = postListRetry(p.c, p.wrs, p.ww.reap)
	p.wrs = p.wrs[:0]
	if err != nil {
		return err
	}
	p.ww.posted++
	return nil
}

// ringThroughput streams size-byte messages into the target's ring.
func (s *session) ringThroughput(k, size, slots, batch int, tm timing) (stat, error) {
	r, err := s.register(k, regCredits, 64)
	if err != nil {
		return stat{}, err
	}
	defer r.Close()
	if _, err := callOK(s.peer, request{Cmd: "ring", K: k, Size: size, Slots: slots}); err != nil {
		return stat{}, err
	}
	credits := r.Bytes()
	p := &fabricPoster{c: s.conn, ring: regionID(k, regRing), ww: s.ww, wrs: make([]rdma.WR, 0, batch+1)}
	st, m, err := produceRing(p, s.waiter(), func() uint64 { return rdma.Load64(credits, 0) }, slots, size, batch, tm)
	rep, perr := stopPeer(s.peer)
	if err == nil && perr == nil {
		err = checkConsumed(rep, m)
	}
	return st, errors.Join(err, perr)
}

// checkConsumed checks that the consumer saw every message, intact.
func checkConsumed(rep reply, sent uint64) error {
	if rep.Seen != sent || rep.Bad != 0 {
		return fmt.Errorf("consumer saw %d of %d messages, %d of them torn or stale", rep.Seen, sent, rep.Bad)
	}
	return nil
}

// baselineRun measures one raw baseline with a fresh peer process.
type baselineRun struct {
	dir   string // for shared files
	tm    timing
	h     *hist.Hist
	k     int // makes file names unique
	guard guard
}

// emitRows ends a command's run: rows as JSON lines (asJSON) or the
// command's table, the done line on stderr, and an error naming the
// measurements that failed.
func emitRows[R any](cmd string, stdout, stderr io.Writer, rows []R, asJSON bool, table func(), failed []string) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		table()
	}
	fmt.Fprintf(stderr, "kvbench %s: done; load average %s\n", cmd, loadAvg())
	if len(failed) > 0 {
		return fmt.Errorf("%s: %d measurement(s) failed: %s", cmd, len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// retryDisturbed runs f, and again up to o.retries times while other
// processes used more than o.maxOther CPUs meanwhile (the stat's load);
// it keeps the least disturbed result, with the number of repeats.
func retryDisturbed[S any, P interface {
	*S
	load() float64
	setRetries(int)
}](cmd string, o commonFlags, stderr io.Writer, f func() (S, error)) (S, error) {
	var best S
	for try := 0; ; try++ {
		st, err := f()
		if err != nil {
			return st, err
		}
		if try == 0 || P(&st).load() < P(&best).load() {
			best = st
		}
		P(&best).setRetries(try)
		if P(&st).load() <= o.maxOther || try >= o.retries {
			return best, nil
		}
		fmt.Fprintf(stderr, "kvbench %s: other processes used %.2f CPUs; repeating\n", cmd, P(&st).load())
	}
}

// guard runs a measurement against a peer process (pid; 0 for this
// process), records the background load, and repeats it up to retries
// times while other processes used more than maxOther CPUs, keeping the
// least disturbed attempt.
type guard func(pid int, f func() (stat, error)) (stat, error)

func newGuard(maxOther float64, retries int, note func(string)) guard {
	return func(pid int, f func() (stat, error)) (stat, error) {
		var best stat
		for try := 0; ; try++ {
			a := takeCPU(pid)
			st, err := f()
			st.otherCPU = otherCPUs(a, takeCPU(pid), runtime.NumCPU())
			if err != nil {
				return st, err
			}
			if try == 0 || st.otherCPU < best.otherCPU {
				best = st
			}
			best.retries = try
			if st.otherCPU <= maxOther || try >= retries {
				return best, nil
			}
			note(fmt.Sprintf("other processes used %.2f CPUs; repeating", st.otherCPU))
		}
	}
}

func (b *baselineRun) withPeer(f func(p peer) (stat, error)) (stat, error) {
	p, err := startPeer()
	if err != nil {
		return stat{}, err
	}
	st, err := b.guard(p.pid(), func() (stat, error) { return f(p) })
	if cerr := p.close(); err == nil && cerr != nil {
		err = fmt.Errorf("peer exit: %w", cerr)
	}
	return st, err
}

// sharedFile creates a fresh shared file for one baseline.
func (b *baselineRun) sharedFile(name string, size int) (string, []byte, func(), error) {
	b.k++
	wd, err := workDir(b.dir)
	if err != nil {
		return "", nil, nil, fmt.Errorf("baseline %s: %w", name, err)
	}
	path := filepath.Join(wd, name+"-"+strconv.Itoa(b.k))
	m, err := createShared(path, size)
	if err != nil {
		return "", nil, nil, fmt.Errorf("baseline %s: %w", name, err)
	}
	return path, m, func() { unix.Munmap(m); os.Remove(path) }, nil
}

// rawShm is the spinning shared-memory ping-pong between two processes.
func (b *baselineRun) rawShm() (stat, error) {
	return b.withPeer(func(p peer) (stat, error) {
		path, m, done, err := b.sharedFile("raw-shm", rawPingPongSize)
		if err != nil {
			return stat{}, err
		}
		defer done()
		if _, err := callOK(p, request{Cmd: "raw-shm", Path: path}); err != nil {
			return stat{}, err
		}
		w := &waiter{}
		st, err := timeLoop(b.tm, b.h, func(i uint64) error {
			rdma.Store64(m, rawTargetWord, i)
			return w.until(func() bool { return rdma.Load64(m, rawInitiatorWord) == i })
		})
		_, perr := stopPeer(p)
		return st, errors.Join(err, perr)
	})
}

// rawFutex is the futex ping-pong between two processes: store, FUTEX_WAKE,
// then FUTEX_WAIT until the answer; nobody spins.
func (b *baselineRun) rawFutex() (stat, error) {
	return b.withPeer(func(p peer) (stat, error) {
		path, m, done, err := b.sharedFile("raw-futex", rawPingPongSize)
		if err != nil {
			return stat{}, err
		}
		defer done()
		if _, err := callOK(p, request{Cmd: "raw-futex", Path: path}); err != nil {
			return stat{}, err
		}
		mine, theirs := futexWord(m, rawInitiatorWord), futexWord(m, rawTargetWord)
		st, err := timeLoop(b.tm, b.h, func(i uint64) error {
			want := uint32(i)
			atomicStore32(theirs, want)
			futexWakeOne(theirs)
			deadline := time.Now().Add(stallTimeout)
			for {
				v := atomicLoad32(mine)
				if v == want {
					return nil
				}
				futexWaitOn(mine, v, 100*time.Millisecond)
				if time.Now().After(deadline) {
					return errStalled
				}
			}
		})
		_, perr := stopPeer(p)
		return st, errors.Join(err, perr)
	})
}

// rawPoster is the baseline's ring producer: a copy into the shared
// mapping and an atomic store of tail.
type rawPoster struct{ m []byte }

func (p rawPoster) slot(off int, buf []byte) error { copy(p.m[off:off+len(buf)], buf); return nil }
func (p rawPoster) publish(tail uint64) error      { rdma.Store64(p.m, 0, tail); return nil }

// rawRing is the ring by hand between two processes over a shared file:
// same layout, batches and credits as the fabric's ring, spinning.
func (b *baselineRun) rawRing(size, slots, batch int) (stat, error) {
	return b.withPeer(func(p peer) (stat, error) {
		path, m, done, err := b.sharedFile("raw-ring", rawRingFileSize(slots, size))
		if err != nil {
			return stat{}, err
		}
		defer done()
		if _, err := callOK(p, request{Cmd: "raw-ring", Path: path, Size: size, Slots: slots}); err != nil {
			return stat{}, err
		}
		off := rawCreditsOffset(slots, size)
		st, sent, err := produceRing(rawPoster{m}, &waiter{}, func() uint64 { return rdma.Load64(m, off) }, slots, size, batch, b.tm)
		rep, perr := stopPeer(p)
		if err == nil && perr == nil {
			err = checkConsumed(rep, sent)
		}
		return st, errors.Join(err, perr)
	})
}

// tcpPair listens on loopback, has the peer dial in with cmd, and returns
// the accepted connection.
func tcpPair(p peer, req request) (*net.TCPConn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	req.Addr = ln.Addr().String()
	if _, err := callOK(p, req); err != nil {
		return nil, err
	}
	c, err := ln.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	tc.SetNoDelay(true)
	return tc, nil
}

// rawTCP is the 8-byte ping-pong over loopback TCP with TCP_NODELAY.
func (b *baselineRun) rawTCP() (stat, error) {
	return b.withPeer(func(p peer) (stat, error) {
		c, err := tcpPair(p, request{Cmd: "raw-tcp"})
		if err != nil {
			return stat{}, err
		}
		var buf [8]byte
		st, err := timeLoop(b.tm, b.h, func(i uint64) error {
			putWord(&buf, i)
			if _, err := c.Write(buf[:]); err != nil {
				return err
			}
			_, err := io.ReadFull(c, buf[:])
			return err
		})
		c.Close()
		_, perr := stopPeer(p)
		return st, errors.Join(err, perr)
	})
}

// rawStream is the throughput baseline for tcp rings: size-byte messages
// written batch at a time into one loopback TCP connection.
func (b *baselineRun) rawStream(size, batch int) (stat, error) {
	return b.withPeer(func(p peer) (stat, error) {
		c, err := tcpPair(p, request{Cmd: "raw-stream", Size: size})
		if err != nil {
			return stat{}, err
		}
		defer c.Close()
		buf := make([]byte, batch*size)
		for i := range batch {
			fillSlot(buf[i*size : (i+1)*size])
		}
		var m uint64
		var start time.Time
		warmEnd := time.Now().Add(b.tm.warm)
		var mStart uint64
		for {
			for i := range batch {
				m++
				encodeSlot(buf[i*size:(i+1)*size], m)
			}
			if _, err := c.Write(buf); err != nil {
				return stat{}, err
			}
			now := time.Now()
			if start.IsZero() {
				if now.After(warmEnd) {
					start, mStart = now, m
				}
			} else if now.Sub(start) >= b.tm.dur {
				break
			}
		}
		c.CloseWrite()
		io.Copy(io.Discard, c) // returns when the sink has read all and closed
		el := time.Since(start)
		rep, perr := stopPeer(p)
		if perr == nil {
			perr = checkConsumed(rep, m)
		}
		n := m - mStart
		return stat{n: n, opsPerS: float64(n) / el.Seconds()}, perr
	})
}
