package rdma

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// Link is a polled protocol's one-sided I/O to one peer: a Conn opened
// through a Connector (never blocking the poller) and reopened after a
// Backoff when it fails, a staging ring for the bytes of writes the caller
// wants to reuse at once, an op window that keeps the Conn's send queue
// from filling (ErrQueueFull cannot happen), selective signalling, and a
// list of queued work requests that Flush posts as one PostList with at
// most one Notify.
//
// Time is the caller's: every method that may fail the link, connect or
// time out takes now (a monotonic duration), and jitter is drawn from the
// caller's seeded rand.Rand, so a simulated protocol stays deterministic.
// A Link is used by one goroutine at a time; Close may be called once the
// user is done.
//
// The contract with a protocol: a Queue that returns ok is posted by the
// next Flush (by a later one if the fabric's send queue is smaller than
// the window), or the link fails before. A failure (an error completion, a
// Post error, an op outstanding for OpTimeout) drops what was queued and
// in flight, closes the Conn and starts the backoff; the next Up after it
// connects a new Conn and Conn() changes. A protocol settles its state when
// it queues and re-posts what the peer may have missed when Conn() changes.
type Link struct {
	cfg  LinkConfig
	dial *Connector
	conn Conn
	rng  *rand.Rand

	up      bool
	epoch   uint64
	retryAt time.Duration
	backoff Backoff
	err     error

	next      uint64 // seq of the next op queued
	posted    uint64 // every op with seq < posted was posted (or dropped by a failure)
	completed uint64 // every op with seq < completed is done (or dropped by a failure)
	lastSig   uint64 // 1 + seq of the last signaled op posted (the Conn's first seq if none)
	sigBytes  uint64 // stage head at the last signaled op posted

	stage      []byte
	head, tail uint64 // stage positions (monotonic): [tail, head) in use

	ends []uint64       // per op, by seq % Depth: the stage head once it was queued
	sig  []sigOp        // signaled ops in flight, oldest first, a ring of Depth
	sigH int            // index of the oldest in sig
	sigN int            // how many
	wrs  []WR           // queued, posted by Flush
	note bool           // a queued op asked for Notify
	cs   [32]Completion // Reap's buffer
	st   LinkStats
}

type sigOp struct {
	seq uint64
	at  time.Duration // posted at
}

// LinkConfig configures a Link.
type LinkConfig struct {
	Node Node
	Peer NodeID
	// Backoff spaces reconnects (Min, Max; zero: DefaultBackoffMin and
	// DefaultBackoffMax). Rand draws its jitter; nil means no jitter.
	Backoff Backoff
	Rand    *rand.Rand
	// SignalEvery: at most SignalEvery-1 unsignaled ops in a row;
	// default DefaultSignalEvery.
	SignalEvery int
	// StageBytes is the staging ring's size (Stage), rounded up to 8;
	// 0: no staging.
	StageBytes int
	// OpTimeout fails the link when a signaled op stays outstanding that
	// long on the caller's clock; 0: no timeout.
	OpTimeout time.Duration
	// Depth bounds the ops queued or in flight (the window); default
	// DefaultLinkDepth. Within the fabric's QueueDepth, Post never finds
	// the send queue full.
	Depth int
	// QuietReads signals reads as writes are (when the caller asks with
	// Signaled, by SignalEvery, last of a timed list) instead of always:
	// for a caller that posts a list of reads into its own buffers and
	// waits for the whole list, marking its last read Signaled (ops
	// complete in order, so that completion is the list's). One
	// completion per list, not one per read. Atomics stay signaled.
	QuietReads bool
}

// Defaults of a LinkConfig.
const (
	DefaultSignalEvery = 16
	DefaultLinkDepth   = 1024
)

// ErrOpTimeout is the failure of a link whose signaled op stayed
// outstanding for LinkConfig.OpTimeout.
var ErrOpTimeout = errors.New("rdma: op timed out")

// LinkStats counts what a Link did since NewLink.
type LinkStats struct {
	Connects uint64 // Conns opened
	Failures uint64 // failures (each closes the Conn and starts the backoff)
	Timeouts uint64 // failures by OpTimeout
	Lists    uint64 // PostList calls
	Posted   uint64 // ops posted
	Signaled uint64 // of them signaled
	Notifies uint64 // of them carrying Notify
	Dropped  uint64 // queued ops a failure dropped before they were posted
	Refused  uint64 // Stage or Queue calls refused (down, window or stage full)
	// QueueFull counts Flushes the fabric's send queue cut short (its
	// QueueDepth is below Depth): the rest stays queued for the next.
	QueueFull uint64
}

// NewLink returns a Link to cfg.Peer; it connects at the first Up.
func NewLink(cfg LinkConfig) *Link {
	if cfg.SignalEvery <= 0 {
		cfg.SignalEvery = DefaultSignalEvery
	}
	if cfg.Depth <= 0 {
		cfg.Depth = DefaultLinkDepth
	}
	cfg.Depth = max(cfg.Depth, 2)
	cfg.StageBytes = Round8(max(cfg.StageBytes, 0))
	cfg.SignalEvery = min(cfg.SignalEvery, cfg.Depth/2)
	return &Link{
		cfg:     cfg,
		dial:    NewConnector(cfg.Node, cfg.Peer),
		rng:     cfg.Rand,
		backoff: cfg.Backoff,
		stage:   make([]byte, cfg.StageBytes),
		ends:    make([]uint64, cfg.Depth),
		sig:     make([]sigOp, cfg.Depth),
		wrs:     make([]WR, 0, cfg.Depth),
	}
}

// Peer is the link's peer.
func (l *Link) Peer() NodeID { return l.cfg.Peer }

// Up reports whether the link has a usable Conn, opening one if it is down
// and its backoff has passed (through the Connector: on tcp the first call
// starts a background connect and returns false; the node's doorbell rings
// when it is done). A connect error fails the link as an op error does.
func (l *Link) Up(now time.Duration) bool {
	if l.up {
		return true
	}
	if now < l.retryAt {
		return false
	}
	c, err, ok := l.dial.Connect()
	if !ok {
		return false
	}
	if err != nil {
		l.fail(now, err)
		return false
	}
	l.conn, l.up = c, true
	l.epoch++
	l.st.Connects++
	l.lastSig, l.sigBytes = l.posted, l.head
	return true
}

// IsUp reports whether the link has a usable Conn, without connecting.
func (l *Link) IsUp() bool { return l.up }

// Conn is the connection epoch: 0 before the first connect, then one more
// at each. A protocol re-posts what its peer may have missed when it
// changes.
func (l *Link) Conn() uint64 { return l.epoch }

// Err is the cause of the last failure (kept after a reconnect, for
// status), nil if the link never failed.
func (l *Link) Err() error { return l.err }

// Completed is the op window's low edge: every op with a smaller seq has
// completed, or was dropped by a failure.
func (l *Link) Completed() uint64 { return l.completed }

// Queued is how many ops are queued for the next Flush.
func (l *Link) Queued() int { return len(l.wrs) }

// Idle reports that the link has nothing for Reap or Flush to do: no op
// in flight (or it is down) and none queued. Until the owner queues
// again, Reap finds nothing, changes no counter and cannot fail.
func (l *Link) Idle() bool { return (!l.up || l.completed == l.posted) && len(l.wrs) == 0 }

// Stats returns the link's counters.
func (l *Link) Stats() LinkStats { return l.st }

// Failed is Stats().Failures and Stats().Dropped without copying the
// whole LinkStats: what an owner syncing its own counters after every
// Reap or Flush needs.
func (l *Link) Failed() (failures, dropped uint64) { return l.st.Failures, l.st.Dropped }

// RetryAt is when a link that is down may connect again.
func (l *Link) RetryAt() time.Duration { return l.retryAt }

// room reports whether one more op fits the window.
func (l *Link) room() bool {
	return l.next-l.completed < uint64(l.cfg.Depth)
}

// Stage returns n bytes, 8-byte aligned, of the staging ring for the next
// op's buffer (a write's source the caller fills, or a read's
// destination), or nil while the link is down, the window is full, or the
// ring has no n contiguous bytes free (reap completions, or flush what is
// queued, and retry). The
// bytes are the caller's until the next Queue, whose op owns them until
// it completes: Stage never hands them out again before. A Stage of at
// most StageBytes/4 succeeds once the ops in flight completed.
func (l *Link) Stage(n int) []byte {
	size := uint64(len(l.stage))
	if !l.up || !l.room() || n <= 0 || uint64(n) > size {
		l.st.Refused++
		return nil
	}
	if l.tail == l.head && l.head%size != 0 {
		// Nothing staged is in flight: start over at the ring's start,
		// where the most contiguous room is.
		l.head += size - l.head%size
		l.tail, l.sigBytes = l.head, l.head
	}
	start := (l.head + 7) &^ 7 // 8-byte aligned, as a buffer of words should be
	if start%size+uint64(n) > size {
		start += size - start%size // contiguous: skip the ring's end
	}
	if start+uint64(n)-l.tail > size {
		l.st.Refused++
		return nil
	}
	l.head = start + uint64(n) // the skipped end is freed with this op
	off := start % size
	return l.stage[off : off+uint64(n) : off+uint64(n)]
}

// Queue adds wr to the list the next Flush posts and returns its seq (its
// Completion ID; Completed passes it once it completed). notify asks that
// the list's last op ring the peer's doorbell (at most one Notify per
// Flush). wr.Flags' Signaled forces a completion; the link signals
// otherwise as it needs (atomics always, reads unless
// QuietReads). It refuses (ok false)
// while the link is down or the window is full.
func (l *Link) Queue(wr WR, notify bool) (seq uint64, ok bool) {
	if !l.up || !l.room() {
		l.st.Refused++
		return 0, false
	}
	seq = l.next
	l.next++
	wr.ID = seq
	wr.Flags &^= Notify
	l.ends[seq%uint64(l.cfg.Depth)] = l.head
	l.wrs = append(l.wrs, wr)
	l.note = l.note || notify
	return seq, true
}

// Flush posts the queued ops as one PostList and returns how many were
// posted. An op is signaled when its caller asked, when it is not a write
// (the caller wants its result; with QuietReads, when it is an atomic),
// when SignalEvery-1 unsignaled ops precede
// it, or when over a quarter of the staging ring was staged since the last
// signaled op; so a full window or stage always has a completion coming
// that frees most of it (SignalEvery is at most Depth/2). With an
// OpTimeout, the list's last op is signaled too, so that every op posted is
// covered by a timeout. Notify goes on the last op if any queued op asked
// for it. A Post error fails the link (now), dropping what was not posted,
// except ErrQueueFull (a fabric whose QueueDepth is below Depth): what was
// not posted stays queued for the next Flush.
func (l *Link) Flush(now time.Duration) int {
	q := len(l.wrs)
	if q == 0 {
		return 0
	}
	every := uint64(l.cfg.SignalEvery)
	quarter := uint64(len(l.stage)) / 4
	depth := uint64(l.cfg.Depth)
	last := l.lastSig
	sigBytes := l.sigBytes
	for k := range l.wrs {
		wr := &l.wrs[k]
		end := l.ends[wr.ID%depth]
		sig := wr.Flags&Signaled != 0 || wr.Kind != OpWrite && (wr.Kind != OpRead || !l.cfg.QuietReads) || wr.ID+1-last >= every ||
			(quarter > 0 && end-sigBytes > quarter)
		if k == q-1 && l.cfg.OpTimeout > 0 {
			sig = true // every list is timed
		}
		if sig {
			wr.Flags |= Signaled
			last, sigBytes = wr.ID+1, end
		}
	}
	if l.note {
		l.wrs[q-1].Flags |= Notify
	}
	n, err := l.conn.PostList(l.wrs)
	l.st.Lists++
	for k := range n {
		wr := &l.wrs[k]
		l.st.Posted++
		if wr.Flags&Signaled != 0 {
			l.st.Signaled++
			l.lastSig, l.sigBytes = wr.ID+1, l.ends[wr.ID%depth]
			i := (l.sigH + l.sigN) % len(l.sig)
			l.sig[i] = sigOp{seq: wr.ID, at: now}
			l.sigN++
		}
		if wr.Flags&Notify != 0 {
			l.st.Notifies++
		}
	}
	l.posted += uint64(n)
	if n < q && errors.Is(err, ErrQueueFull) {
		// The fabric's send queue is smaller than the window: keep the
		// rest queued, in order, for a Flush after the next Reap.
		l.st.QueueFull++
		rest := copy(l.wrs, l.wrs[n:])
		clear(l.wrs[rest:])
		l.wrs = l.wrs[:rest]
		l.wrs[rest-1].Flags &^= Notify // Flush puts it on the last again
		return n
	}
	clear(l.wrs) // drop the references to the caller's buffers
	l.wrs, l.note = l.wrs[:0], false
	if err != nil || n < q {
		if err == nil {
			err = ErrConnBroken
		}
		l.st.Dropped += uint64(q - n)
		l.fail(now, err)
	}
	return n
}

// Reap polls the Conn's completions and reports whether any arrived. An
// error completion fails the link, and so does a signaled op outstanding
// for OpTimeout at now. A successful completion resets the backoff. It
// polls while any op posted is not known complete (an unsignaled op's
// error is reported too).
func (l *Link) Reap(now time.Duration) bool {
	if !l.up {
		return false
	}
	if l.completed == l.posted {
		return false // nothing in flight: no completion, no error to come
	}
	progress := false
	depth := uint64(l.cfg.Depth)
	for {
		k := l.conn.Poll(l.cs[:])
		if k == 0 {
			break
		}
		progress = true
		for _, c := range l.cs[:k] {
			if c.Err != nil {
				l.fail(now, c.Err)
				return true
			}
			if c.ID+1 > l.completed && c.ID < l.posted {
				l.completed = c.ID + 1
				l.tail = max(l.tail, l.ends[c.ID%depth])
			}
		}
		for l.sigN > 0 && l.sig[l.sigH].seq < l.completed {
			l.sigH = (l.sigH + 1) % len(l.sig)
			l.sigN--
		}
		l.backoff.Reset()
		if k < len(l.cs) {
			break
		}
	}
	if l.cfg.OpTimeout > 0 && l.sigN > 0 && now-l.sig[l.sigH].at >= l.cfg.OpTimeout {
		l.st.Timeouts++
		l.fail(now, ErrOpTimeout)
		return true
	}
	return progress
}

// NextDeadline is when the link wants its owner's next Up or Reap even if
// nothing lands: its retry time while down, the oldest signaled op's
// timeout while one is outstanding, else never (math.MaxInt64).
func (l *Link) NextDeadline() time.Duration {
	if !l.up {
		return l.retryAt
	}
	if l.cfg.OpTimeout > 0 && l.sigN > 0 {
		return l.sig[l.sigH].at + l.cfg.OpTimeout
	}
	return math.MaxInt64
}

// Fail fails the link at now with cause, as an op error would: for a
// protocol that saw the peer misbehave (a torn or impossible reply).
func (l *Link) Fail(now time.Duration, cause error) {
	if l.up {
		l.fail(now, cause)
	}
}

// fail closes the Conn, drops what is queued and in flight and starts the
// backoff.
func (l *Link) fail(now time.Duration, cause error) {
	l.err = cause
	l.st.Failures++
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
	l.up = false
	if q := len(l.wrs); q > 0 {
		l.st.Dropped += uint64(q)
		clear(l.wrs)
		l.wrs, l.note = l.wrs[:0], false
	}
	l.posted, l.completed = l.next, l.next
	l.sigH, l.sigN = 0, 0
	l.tail = l.head
	l.sigBytes = l.head
	l.retryAt = l.backoff.Next(now, l.rng)
}

// Close closes the Conn and abandons a background connect. The link is
// down for good.
func (l *Link) Close() {
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
	l.up = false
	l.retryAt = math.MaxInt64
	l.dial.Close()
}
