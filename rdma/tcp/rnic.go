package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"golang.org/x/sys/unix"
)

const (
	ioBufSize = 64 << 10
	// ackEvery forces an ack (and a flush) after this many ops even while
	// more requests are buffered, so a streaming initiator's send queue
	// keeps draining.
	ackEvery = 256
)

// sock is an incoming connection's socket, taken out of Go's network
// poller after the handshake and used with blocking system calls. The
// RNIC goroutine then sleeps in read(2) and the kernel wakes its thread
// directly when a request arrives: it does not wait for the Go scheduler
// to poll the network, which a process whose goroutines spin (yielding
// with runtime.Gosched) or compute can put off for up to 10 ms. It costs
// one OS thread per incoming connection while it waits.
type sock struct {
	fd     int
	alive  *atomic.Bool
	yield  bool       // the RNIC rang the doorbell since the last Read
	mu     sync.Mutex // guards closed against fd reuse by shutdown
	closed bool
}

// detach moves nc's socket to a blocking descriptor of its own and closes
// nc.
func detach(nc net.Conn, alive *atomic.Bool) (*sock, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("tcp: %T has no file descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(f uintptr) { fd, derr = unix.Dup(int(f)) }); err != nil || derr != nil {
		return nil, fmt.Errorf("tcp: duplicate descriptor: %w", errors.Join(err, derr))
	}
	nc.Close()
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tcp: blocking mode: %w", err)
	}
	return &sock{fd: fd, alive: alive}, nil
}

// Read implements io.Reader with read(2). If the RNIC rang the doorbell
// since the last Read, it first yields the processor: a thread blocked in
// a system call keeps its P (Go's scheduler context) until sysmon takes it
// back, 20 us or more later, so a goroutine the ring just woke (a Notify
// doorbell waiter) would wait that long to run. Otherwise it does not:
// Gosched wakes another thread (wakep) that finds nothing to do, an extra
// wake-up of an idle CPU per request.
func (k *sock) Read(p []byte) (int, error) {
	if k.yield {
		k.yield = false
		runtime.Gosched()
	}
	for {
		n, err := unix.Read(k.fd, p)
		switch {
		case n > 0:
			k.alive.Store(true)
			return n, nil
		case err == unix.EINTR:
		case err != nil:
			return 0, err
		default:
			return 0, io.EOF
		}
	}
}

// Write implements io.Writer with write(2).
func (k *sock) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(k.fd, p[done:])
		if n > 0 {
			done += n
		}
		if err != nil && err != unix.EINTR {
			return done, err
		}
	}
	return done, nil
}

// shutdown wakes a read or write blocked on the socket (how: unix.SHUT_*);
// any goroutine may call it.
func (k *sock) shutdown(how int) {
	k.mu.Lock()
	if !k.closed {
		unix.Shutdown(k.fd, how)
	}
	k.mu.Unlock()
}

// close releases the descriptor; only the RNIC goroutine calls it, once it
// is out of its reads and writes.
func (k *sock) close() {
	k.mu.Lock()
	if !k.closed {
		k.closed = true
		unix.Close(k.fd)
	}
	k.mu.Unlock()
}

// rnic is the software RNIC serving one incoming connection: it applies
// the peer's requests in order and answers them. One goroutine runs serve;
// only the keepalive loop touches silent.
type rnic struct {
	n      *Node
	sock   *sock
	peer   rdma.NodeID
	alive  atomic.Bool
	silent time.Duration

	br       *bufio.Reader
	bw       *bufio.Writer
	seq      uint64 // ops applied (or failed) so far
	asked    uint64 // latest op the initiator wants acknowledged
	reported uint64 // ops the initiator has been told about
	flushed  uint64 // seq at the last flush
	scratch  []byte
	cache    *Region
}

// serve runs until the connection fails, a frame is malformed or an op
// fails (then the error is reported and the connection wound down).
func (s *rnic) serve() {
	s.br = bufio.NewReaderSize(s.sock, ioBufSize)
	s.bw = bufio.NewWriterSize(s.sock, ioBufSize)
	maxFrame := s.n.opts.MaxFrame
	for {
		if s.br.Buffered() < headerLen && s.flush() != nil {
			return
		}
		hb, err := s.br.Peek(headerLen)
		if err != nil {
			return
		}
		h, err := decodeHeader(hb, maxFrame)
		if err != nil {
			return
		}
		total := headerLen + int(h.Len)
		var body []byte
		if total <= s.br.Size() {
			if s.br.Buffered() < total && s.flush() != nil {
				return
			}
			fr, err := s.br.Peek(total)
			if err != nil {
				return
			}
			body = fr[headerLen:]
		} else {
			if s.flush() != nil {
				return
			}
			s.br.Discard(headerLen)
			total = 0 // the body is read past, not peeked
			if cap(s.scratch) < int(h.Len) {
				s.scratch = make([]byte, h.Len)
			}
			body = s.scratch[:h.Len]
			if _, err := io.ReadFull(s.br, body); err != nil {
				return
			}
		}
		fail, ok := s.handle(h.Type, body)
		if !ok {
			return // protocol violation: close without applying
		}
		s.br.Discard(total)
		if fail != nil {
			s.windDown(fail)
			return
		}
		if s.seq-s.flushed >= ackEvery {
			s.asked = s.seq
			if s.flush() != nil {
				return
			}
		}
	}
}

// flush acks every op applied but not yet reported, if the initiator
// asked for an ack of one of them, and writes out all buffered responses.
func (s *rnic) flush() error {
	if s.asked > s.reported {
		s.bw.Write(appendWord(s.room(), typeAck, s.seq))
		s.reported = s.seq
	}
	s.flushed = s.seq
	return s.bw.Flush()
}

// room returns the writer's free space for appending a small response,
// flushing first if it is nearly full (appending beyond it would allocate).
// A failed flush is noticed by the next one.
func (s *rnic) room() []byte {
	if s.bw.Available() < 32 {
		s.bw.Flush()
	}
	return s.bw.AvailableBuffer()
}

// region returns the target region, from a one-entry cache.
func (s *rnic) region(id rdma.RegionID) *Region {
	if r := s.cache; r != nil && r.ID() == id && !r.Gone() {
		return r
	}
	r := s.n.region(id)
	if r != nil {
		s.cache = r
	}
	return r
}

func (s *rnic) apply(wr *rdma.WR) (uint64, error) {
	r := s.region(wr.Region)
	if r == nil {
		return 0, rdma.ErrNoRegion
	}
	return r.Apply(s.peer, wr)
}

// handle decodes and applies one frame. ok is false on a protocol
// violation; fail is the op error that breaks the connection.
func (s *rnic) handle(typ uint8, body []byte) (fail error, ok bool) {
	switch typ {
	case typeWrite:
		w, err := decodeWriteReq(body)
		if err != nil {
			return nil, false
		}
		s.seq++
		if w.Ack {
			s.asked = s.seq
		}
		wr := rdma.WR{Kind: rdma.OpWrite, Region: w.Region, Offset: w.Offset, Buf: w.Data}
		if _, err := s.apply(&wr); err != nil {
			return err, true
		}
		if w.Notify {
			s.n.db.Ring()
			s.sock.yield = true
		}
	case typeRead:
		rq, err := decodeReadReq(body)
		if err != nil {
			return nil, false
		}
		s.seq++
		n := int(rq.Len)
		if n > s.n.opts.MaxFrame-headerLen-rspFixed {
			return rdma.ErrInvalidOp, true
		}
		need := headerLen + rspFixed + n
		var out []byte
		if need <= s.bw.Size() {
			if s.bw.Available() < need && s.bw.Flush() != nil {
				return nil, false
			}
			out = s.bw.AvailableBuffer()[:need]
		} else {
			if cap(s.scratch) < need {
				// Not the scratch holding body: reads have 16-byte bodies,
				// which always sit in the bufio buffer.
				s.scratch = make([]byte, need)
			}
			out = s.scratch[:need]
		}
		wr := rdma.WR{Kind: rdma.OpRead, Region: rq.Region, Offset: rq.Offset, Buf: out[headerLen+rspFixed:]}
		if _, err := s.apply(&wr); err != nil {
			return err, true
		}
		appendReadRspHeader(out[:0], s.seq, n)
		s.bw.Write(out)
		s.reported = s.seq
	case typeCAS, typeFAA:
		var a atomicReq
		var err error
		kind := rdma.OpCompareAndSwap
		if typ == typeCAS {
			a, err = decodeCASReq(body)
		} else {
			a, err = decodeFAAReq(body)
			kind = rdma.OpFetchAdd
		}
		if err != nil {
			return nil, false
		}
		s.seq++
		wr := rdma.WR{Kind: kind, Region: a.Region, Offset: a.Offset, Compare: a.Compare, Value: a.Value}
		old, err := s.apply(&wr)
		if err != nil {
			return err, true
		}
		s.bw.Write(appendAtomRsp(s.room(), s.seq, old))
		s.reported = s.seq
	case typePing:
		tok, err := decodeWord(body)
		if err != nil {
			return nil, false
		}
		s.asked = s.seq // a keepalive retires unacknowledged writes
		s.bw.Write(appendWord(s.room(), typePong, tok))
	default:
		return nil, false // a response type sent to the RNIC
	}
	return nil, true
}

// windDown reports the failed op (every earlier one succeeded), stops
// applying anything, and lingers until the initiator has read the report
// and closed, so that our close does not reset the connection under it.
func (s *rnic) windDown(cause error) {
	if s.seq-1 > s.reported {
		s.bw.Write(appendWord(s.room(), typeAck, s.seq-1))
	}
	s.bw.Write(appendErrorRsp(s.room(), s.seq, errCode(cause)))
	if s.bw.Flush() != nil {
		return
	}
	s.sock.shutdown(unix.SHUT_WR)
	tv := unix.NsecToTimeval(s.n.opts.PeerTimeout.Nanoseconds())
	unix.SetsockoptTimeval(s.sock.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	io.Copy(io.Discard, s.br)
}
