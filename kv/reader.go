package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// One-sided gets (docs/kv.md, "Gets"). A GroupReader reads one group's
// replicas through its own rdma.Link to each; it is used by one goroutine
// at a time (the client keeps a pool).
//
// A get takes two dependent rounds when the key is there, one when it is
// not:
//
//  1. on one replica's Conn, in one posted list: its header, the key's two
//     bucket pairs (and, while the index grows, the old generation's pairs
//     before the new one's), its header again. For a linearizable get the
//     replica is the leader, and the same round reads the header (whose
//     first word is the member's promise) of f other members.
//  2. the record a matching slot points to.
//
// Round 1 is accepted when both header reads agree on the layout and
// validate. A linearizable get further needs the replica to serve epoch E
// (its diff committed and applied there: every write acknowledged so far,
// by this leader or an earlier one, is in its table, and its table only
// moves forward) and f+1 members, counted with the leader, to promise
// exactly E: a leader of a later epoch needs the votes of f+1 members,
// each of which promised its epoch before voting, so quorum intersection
// shows that no later leader was elected before those reads, which were
// made after the get began. No acknowledged write is therefore missing,
// and the get is linearizable at the read of round 1 (or of round 2 for
// the record's bytes, which hold exactly the version the slot named).

// Consistency is what a get promises.
type Consistency uint8

const (
	// Linearizable gets read the leader and confirm its epoch with a
	// quorum of promises (the default).
	Linearizable Consistency = iota
	// StaleOK gets read one replica (the reader's nearest) and report how
	// far behind it may be.
	StaleOK
)

func (c Consistency) String() string {
	switch c {
	case Linearizable:
		return "linearizable"
	case StaleOK:
		return "stale-ok"
	}
	return fmt.Sprintf("consistency(%d)", uint8(c))
}

// GetResult is what a get found.
type GetResult struct {
	Found   bool
	Value   []byte // valid until the reader's next call
	Version uint64
	// Member is the index of the replica read; Applied and AppliedAt are
	// its last applied entry when the get began and when it was applied
	// (Unix ns): the value is the key's value after entry Applied or a
	// later one, never older.
	Member    int
	Applied   uint64
	AppliedAt int64
	// Epoch is the serving epoch a linearizable get confirmed.
	Epoch uint64
	// Retries counts rounds read again (torn reads, layout changes, a
	// leader not confirmed).
	Retries int
}

// Errors of a get.
var (
	// ErrNoLeader: no member serves linearizable gets now (an election
	// is under way, or too few members are reachable).
	ErrNoLeader = errors.New("kv: no confirmed leader")
	// errRetry: read round 1 again.
	errRetry = errors.New("kv: retry")
	// errConnecting: the member's Conn is being connected in the
	// background (tcp).
	errConnecting = errors.New("still connecting")
	// ErrCatchingUp: the member read restarted without its data and has
	// not been caught up by a leader yet (its header says so): its table
	// is empty or behind by a whole outage, so a stale-ok get reads
	// another member.
	ErrCatchingUp = errors.New("kv: the replica restarted without its data and is catching up")
)

// GroupReader reads one group's tables one-sided. A get is a polled state
// machine (Begin, then Poll until it reports done), so that the simulator
// drives it like every protocol here; Get runs one to the end in real time.
type GroupReader struct {
	group   uint32
	members []rdma.NodeID
	node    rdma.Node
	quorum  int
	leader  int
	// Stale-ok gets read member near. It starts as home, the member the
	// reader was made for; a failed read moves near to the next member,
	// and near comes back to home as soon as home answers again: once
	// homeAt has passed, a get whose near is not home reads home when
	// home's Conn is up (connecting it in the background if need be).
	// homeWait is the wait before home is tried again after it failed;
	// it doubles from homeRetryMin to homeRetryMax while home keeps
	// failing, and is 0 once home answered.
	near, home       int
	homeAt, homeWait time.Duration
	// Timeout bounds the wait for one read's completion on the reader's
	// clock (the now given to Poll): a member's Link whose read does not
	// complete in time fails (its OpTimeout), and reconnects after its
	// backoff. A read takes microseconds; one that takes this long is to
	// a member that is stopped or cut off (on tcp: shm memory stays
	// readable), and the get tries another. Default 250 ms. Set it, and
	// Reconnect and Rand, before the first get: a member's Link is made
	// at its first read.
	Timeout time.Duration
	// Reconnect spaces the reconnects of a member's Link after it failed
	// (zero: rdma.Backoff's defaults, 1 ms doubling to 1 s); a
	// successful read resets it.
	Reconnect rdma.Backoff
	// Rand draws the jitter of the reader's backoffs (reconnects and
	// attempts); nil: none. A simulated reader is given its process's
	// seeded one.
	Rand *rand.Rand
	// BackoffMin and BackoffMax bound the wait before an attempt that
	// follows one that found no leader or a failed read; it doubles
	// (rdma.Backoff: zero bounds are its defaults). Default 50 µs and
	// 20 ms.
	BackoffMin, BackoffMax time.Duration
	// HedgeAfter is how long a linearizable get waits for the f promise
	// words it asked for before it asks every other member too (a member
	// that is stopped, or cut off, never answers: its read would hold
	// the get until Timeout). Default 1 ms.
	HedgeAfter time.Duration
	r1At       time.Duration // when round 1 was posted
	hedged     bool
	m          []*memberState

	// The get under way.
	st       getState
	key      []byte
	h        uint64
	mode     Consistency
	at       int // the member read (round 1 and 2)
	geo      Geometry
	pairs    int
	asked    []bool
	cand     [4 * 2 * slotsPer]Slot
	nc       int
	res      GetResult
	err      error
	fetching Slot // the slot whose record round 2 reads
	recSize  int  // the bytes round 2 reads
	retryAt  time.Duration
	backoff  rdma.Backoff // between attempts of the get
	attempt  int
	// catching has bit i set for each member i found catching up since
	// the last member read that was not (stale-ok): the get fails with
	// ErrCatchingUp once every member is in it. A set, not a count of
	// reads in a row: reads of one catching-up member between failed
	// reads of the others do not add up to "every member".
	catching uint64
	lastErr  error

	// Reads counts one-sided reads posted; Rounds the rounds.
	Reads, Rounds uint64

	knobs testingKnobs // planted bugs, tests only (knobs.go)

	now  time.Duration
	h1   Header // the header the attempt's reads are bracketed from
	lead bool   // round 1 reads the header first (else h1 is the cached one)
}

// FreshHeader is how recent a member's cached header must be for a
// stale-ok get to use it as its lower bound instead of reading the header
// first.
const FreshHeader = time.Millisecond

// Bounds of the wait before a reader whose stale-ok gets left their home
// member tries it again (see GroupReader.near).
const (
	homeRetryMin = 10 * time.Millisecond
	homeRetryMax = time.Second
)

type getState uint8

const (
	gsIdle getState = iota
	gsStart
	gsFind // reading every member's header for the leader
	gsHdr  // reading the header of the member to read (no geometry known)
	gsR1   // round 1 posted
	gsR2   // round 2 (a record) posted
	gsWait // backing off until retryAt
	gsDone
)

// memberState is one member's Link and the buffers its reads land in
// (each member's own, so a read left behind by an abandoned attempt lands
// where nothing else is read). At most one list of reads is out on a
// member: a new one is posted only once the last one finished (the
// pending rule), so its buffers are never the destination of two reads.
type memberState struct {
	link *rdma.Link // nil until the member's first read
	// pending: the list posted last, the ops with seq < until on the
	// Link's Conn epoch, is not known finished.
	pending bool
	until   uint64
	epoch   uint64
	perr    error // how the finished list failed
	pdone   bool  // the list finished (perr says how), not consumed
	// connecting: a background connect is under way, since connAt (the
	// reader's clock).
	connecting bool
	connAt     time.Duration
	// hdr[:hdrSize] takes a first header read (and promise reads);
	// hdr[hdrSize:] the header that ended this member's last round,
	// read at lastAt.
	hdr    [2 * hdrSize]byte
	lastAt time.Duration
	pairs  []byte
	rec    []byte
	wrs    []rdma.WR
	hwr    []rdma.WR // a header read alone
}

// readerLinkDepth is a member Link's window: one list in flight (at most
// 6 reads: two headers and four bucket pairs), and one more for a planted
// bug that ignores the pending rule.
const readerLinkDepth = 16

// NewGroupReader reads group g's members from node. near is the member
// stale-ok gets read first (on shm any; on tcp the closest).
func NewGroupReader(node rdma.Node, g uint32, members []rdma.NodeID, near int) *GroupReader {
	n := len(members)
	r := &GroupReader{group: g, members: members, node: node, quorum: n/2 + 1, leader: -1,
		near: near % n, home: near % n, Timeout: 250 * time.Millisecond, BackoffMin: 50 * time.Microsecond, BackoffMax: 20 * time.Millisecond, HedgeAfter: time.Millisecond, asked: make([]bool, n), m: make([]*memberState, n)}
	for i := range r.m {
		r.m[i] = &memberState{pairs: make([]byte, 8*bucketSize), rec: make([]byte, 256)}
	}
	return r
}

// Close closes the reader's Links.
func (r *GroupReader) Close() {
	for _, ms := range r.m {
		if ms.link != nil {
			ms.link.Close()
		}
		ms.pending, ms.connecting = false, false
	}
}

// Leader is the member the reader last found serving (-1: unknown).
func (r *GroupReader) Leader() int { return r.leader }

// link is member i's Link, made at its first use.
func (r *GroupReader) link(i int) *rdma.Link {
	ms := r.m[i]
	if ms.link == nil {
		ms.link = rdma.NewLink(rdma.LinkConfig{Node: r.node, Peer: r.members[i], Backoff: r.Reconnect, Rand: r.Rand,
			OpTimeout: r.Timeout, Depth: readerLinkDepth, SignalEvery: readerLinkDepth / 2, QuietReads: true})
	}
	return ms.link
}

// post posts wrs on member i's Link as one list, the last read signalled,
// unless a list posted to i before is still out (false). A member whose
// Link is down (connecting in the background, or backing off after a
// failure) or whose post fails finishes the list at once with the error.
func (r *GroupReader) post(i int, wrs []rdma.WR) bool {
	ms := r.m[i]
	if ms.pending && !r.reap(i) && !r.knobs.reuseInFlight {
		return false // a read of an abandoned attempt is still out
	}
	ms.pending, ms.pdone, ms.perr = false, false, nil // whatever an abandoned attempt left
	l := r.link(i)
	if !l.Up(r.now) {
		// This attempt counts as a failed read of the member (a stale-ok
		// get waits for a background connect up to Timeout: see fail).
		ms.perr, ms.pdone = r.downErr(i), true
		return true
	}
	ms.connecting = false
	var last uint64
	for k, wr := range wrs {
		if k == len(wrs)-1 {
			wr.Flags |= rdma.Signaled // the list's completion
		}
		seq, ok := l.Queue(wr, false)
		if !ok { // the window: not with one list out at a time
			l.Fail(r.now, fmt.Errorf("kv: reader's link window full"))
			ms.perr, ms.pdone = r.linkErr(i), true
			return true
		}
		last = seq
	}
	r.Reads += uint64(len(wrs))
	ms.pending, ms.until, ms.epoch = true, last+1, l.Conn()
	l.Flush(r.now)
	if !l.IsUp() {
		ms.pending, ms.perr, ms.pdone = false, r.linkErr(i), true // the post failed
	}
	return true
}

// downErr is the error of a read of member i whose Link is down: still
// connecting in the background (tcp; noted since when), or backing off
// after a failure.
func (r *GroupReader) downErr(i int) error {
	ms, l := r.m[i], r.m[i].link
	if l.RetryAt() <= r.now {
		if !ms.connecting {
			ms.connecting, ms.connAt = true, r.now
		}
		return fmt.Errorf("kv: node %d: %w: %w", r.members[i], errConnecting, rdma.ErrPeerDead)
	}
	ms.connecting = false
	cause := l.Err()
	if cause == nil {
		cause = rdma.ErrClosed
	}
	return fmt.Errorf("kv: node %d: link down until its reconnect: %w", r.members[i], cause)
}

// linkErr is the error of a read of member i whose Link failed.
func (r *GroupReader) linkErr(i int) error {
	cause := r.m[i].link.Err()
	if errors.Is(cause, rdma.ErrOpTimeout) {
		return fmt.Errorf("kv: read from node %d: no completion in %v: %w", r.members[i], r.Timeout, cause)
	}
	return fmt.Errorf("kv: read from node %d: %w", r.members[i], cause)
}

// homeReady reports whether a stale-ok get may go back to its home member:
// its Link is up (connected now if need be, without waiting) and no read
// of an abandoned attempt is still out on it.
func (r *GroupReader) homeReady() bool {
	i := r.home
	ms := r.m[i]
	if ms.pending && !r.reap(i) {
		return false
	}
	// A read left behind that failed failed the Link: going back rests on
	// a new Conn's read.
	ms.pdone, ms.perr = false, nil
	l := r.link(i)
	if !l.Up(r.now) {
		if l.RetryAt() > r.now {
			r.homeFailed() // backing off, or the connect failed
		}
		return false
	}
	return true
}

// homeFailed puts off the next try of the home member.
func (r *GroupReader) homeFailed() {
	r.homeWait = min(max(2*r.homeWait, homeRetryMin), homeRetryMax)
	r.homeAt = r.now + r.homeWait
}

// postHeader posts a read of member i's header into buf, with the
// member's own work-request slice (no allocation per get).
func (r *GroupReader) postHeader(i int, buf []byte) bool {
	ms := r.m[i]
	ms.hwr = append(ms.hwr[:0], rdma.WR{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: buf})
	return r.post(i, ms.hwr)
}

// reap reaps member i's Link; it reports whether the list awaited is
// finished (done, with perr set if it failed: an error completion, or no
// completion within Timeout on the reader's clock).
func (r *GroupReader) reap(i int) bool {
	ms := r.m[i]
	if ms.pdone {
		return true
	}
	if !ms.pending {
		return false
	}
	l := ms.link
	if l.IsUp() && l.Conn() == ms.epoch {
		l.Reap(r.now)
		if l.Queued() > 0 && l.IsUp() {
			l.Flush(r.now) // a send queue smaller than the list cut it short
		}
	}
	switch {
	case !l.IsUp() || l.Conn() != ms.epoch:
		// The Link failed, dropping the list: its Conn is closed.
		ms.pending, ms.perr, ms.pdone = false, r.linkErr(i), true
		return true
	case l.Completed() >= ms.until:
		ms.pending, ms.pdone = false, true
		return true
	}
	return false
}

// consume takes member i's finished op (its error).
func (r *GroupReader) consume(i int) error {
	ms := r.m[i]
	ms.pdone = false
	err := ms.perr
	ms.perr = nil
	return err
}

// Begin starts a get of key (copied). The reader must be idle (a new
// reader is; a get ends when Poll reports done).
func (r *GroupReader) Begin(key []byte, mode Consistency) {
	r.key = append(r.key[:0], key...)
	r.h = hashKey(key)
	r.mode = mode
	r.res = GetResult{}
	r.err = nil
	r.attempt = 0
	r.catching = 0
	r.backoff = rdma.Backoff{Min: r.BackoffMin, Max: r.BackoffMax}
	r.lastErr = nil
	r.st = gsStart
}

// Busy reports whether a get is under way.
func (r *GroupReader) Busy() bool { return r.st != gsIdle && r.st != gsDone }

// MaxAttempts bounds the attempts of one get before it fails with the last
// cause.
const MaxAttempts = 1000

// Poll advances the get; when it returns true the get is over and Result
// has its outcome. now is the caller's clock (backoff between attempts).
func (r *GroupReader) Poll(now time.Duration) bool {
	r.now = now
	for {
		switch r.st {
		case gsIdle, gsDone:
			return true
		case gsWait:
			if now < r.retryAt {
				return false
			}
			r.st = gsStart
		case gsStart:
			r.startAttempt()
		case gsFind:
			if !r.pollFind() {
				return false
			}
		case gsHdr:
			if !r.reap(r.at) {
				return false
			}
			if err := r.consume(r.at); err != nil {
				r.fail(err)
			} else if _, err := DecodeHeader(r.m[r.at].hdr[hdrSize:]); err != nil {
				r.fail(errRetry)
			} else {
				r.m[r.at].lastAt = now
				r.st = gsStart
			}
		case gsR1:
			if !r.pollR1() {
				return false
			}
		case gsR2:
			if !r.pollR2() {
				return false
			}
		}
	}
}

// Result is the outcome of the get that finished.
func (r *GroupReader) Result() (GetResult, error) { return r.res, r.err }

// NextDeadline is when a get wants its next Poll even if no read
// completes: the end of its backoff, or the timeout of a read it awaits.
func (r *GroupReader) NextDeadline() time.Duration {
	if r.st == gsWait {
		return r.retryAt
	}
	next := time.Duration(1<<63 - 1)
	for _, ms := range r.m {
		if ms.pending && ms.link.IsUp() {
			next = min(next, ms.link.NextDeadline())
		}
	}
	return next
}

// fail ends the attempt: retry (after a backoff for some causes) or give up.
func (r *GroupReader) fail(err error) {
	r.lastErr = err
	r.attempt++
	r.res.Retries = r.attempt
	if r.attempt >= MaxAttempts {
		r.err = fmt.Errorf("kv: group %d: get gave up after %d attempts: %w", r.group, r.attempt, err)
		r.st = gsDone
		return
	}
	if errors.Is(err, errRetry) && r.attempt%16 != 0 {
		r.st = gsStart // a torn read or a layout change: at once
		return
	}
	if r.mode == Linearizable {
		r.leader = -1
	} else if errors.Is(err, errConnecting) && r.now-r.m[r.near].connAt < r.Timeout {
		// The member is being connected (tcp): not a failure of it
		// until that takes Timeout, the bound of a read.
	} else if !errors.Is(err, errRetry) {
		if r.near == r.home {
			r.homeFailed()
		}
		r.near = (r.near + 1) % len(r.members)
	}
	r.retryAt = r.backoff.Next(r.now, r.Rand)
	r.st = gsWait
}

func (r *GroupReader) startAttempt() {
	r.Rounds++
	if r.mode == Linearizable && r.leader < 0 {
		for i := range r.members {
			r.postHeader(i, r.m[i].hdr[hdrSize:])
		}
		r.st = gsFind
		return
	}
	if r.mode == StaleOK && r.near != r.home && r.now >= r.homeAt && r.homeReady() {
		r.near = r.home
	}
	m := r.near
	if r.mode == Linearizable {
		m = r.leader
	}
	r.at = m
	ms := r.m[m]
	// The header tells the geometry; use the last one seen (a layout
	// change shows as disagreeing header reads: read again).
	prev, err := DecodeHeader(ms.hdr[hdrSize:])
	if err != nil {
		if r.postHeader(m, ms.hdr[hdrSize:]) {
			r.st = gsHdr
		} else {
			r.fail(errRetry)
		}
		return
	}
	g := prev.Geometry
	r.geo = g
	if r.knobs.newGenOnly {
		g.Migrating = false
	}
	// The reads are bracketed by two header reads agreeing on the layout
	// (and, for a linearizable get, on serving the epoch): the header
	// this member's last round ended with serves as the first one, the
	// layout counter being monotonic (and serving an epoch, once given
	// up, never coming back). A stale-ok get reads a fresh first header
	// when the cached one is older than FreshHeader, as its report of
	// how far behind the replica is rests on it.
	wrs := ms.wrs[:0]
	r.h1, r.lead = prev, r.mode == StaleOK && r.now-ms.lastAt > FreshHeader
	if r.lead {
		wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: ms.hdr[:hdrSize]})
	}
	r.pairs = 2
	if g.Migrating {
		r.pairs = 4
	}
	pb := ms.pairs[:r.pairs*2*bucketSize]
	k := 0
	add := func(gen, log int) {
		b1, b2 := candidates(r.h, log)
		for _, b := range [2]int{b1, b2} {
			wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: indexRegion(r.group, gen),
				Offset: uint64(pairOf(b) * bucketSize), Buf: pb[k*2*bucketSize : (k+1)*2*bucketSize]})
			k++
		}
	}
	if g.Migrating {
		add(g.OldGen, g.OldLog) // the old generation first: see get's comment
	}
	add(g.Gen, g.LogBuckets)
	wrs = append(wrs, rdma.WR{Kind: rdma.OpRead, Region: headerRegion(r.group), Buf: ms.hdr[hdrSize:]})
	ms.wrs = wrs
	for i := range r.asked {
		r.asked[i] = false
	}
	r.asked[m] = true
	if !r.post(m, wrs) {
		r.fail(errRetry) // a read of an abandoned attempt is still out
		return
	}
	if r.mode == Linearizable {
		// f other members' promise words, in parallel with the round.
		r.askPromises(r.quorum - 1)
		r.r1At, r.hedged = r.now, false
	}
	r.st = gsR1
}

// askPromises posts header reads to up to k members not asked yet.
func (r *GroupReader) askPromises(k int) int {
	n := 0
	for j := 1; j < len(r.members) && n < k; j++ {
		o := (r.at + j) % len(r.members)
		if r.asked[o] {
			continue
		}
		r.asked[o] = true
		if r.postHeader(o, r.m[o].hdr[:hdrSize]) {
			n++
		}
	}
	return n
}

func (r *GroupReader) pollFind() bool {
	done, err := r.found()
	if !done {
		return false
	}
	if err != nil {
		r.fail(err)
		return true
	}
	r.st = gsStart
	return true
}

// found waits for the header reads that startAttempt posted to every
// member and sets leader to the member serving the highest epoch (done
// false while reads are out; err when none serves). The ordered reader
// finds the leader with it too.
func (r *GroupReader) found() (done bool, err error) {
	for i := range r.members {
		if r.m[i].pending && !r.reap(i) {
			return false, nil
		}
	}
	best, be := -1, uint64(0)
	var errs []error
	for i := range r.members {
		if err := r.consume(i); err != nil {
			errs = append(errs, err) // it names the node
			continue
		}
		h, err := DecodeHeader(r.m[i].hdr[hdrSize:])
		if err == nil && h.Serving > be {
			best, be = i, h.Serving
		}
	}
	if best < 0 {
		return true, fmt.Errorf("%w in group %d: %w", ErrNoLeader, r.group, errors.Join(errs...))
	}
	r.leader = best
	return true, nil
}

// pollR1 waits for round 1 (and the promise reads), then evaluates it.
func (r *GroupReader) pollR1() bool {
	m := r.at
	if !r.reap(m) {
		return false
	}
	ms := r.m[m]
	if ms.perr != nil {
		clear(ms.hdr[hdrSize:]) // read the header alone next time
		r.fail(r.consume(m))
		return true
	}
	h1, err1 := r.h1, error(nil)
	if r.lead {
		h1, err1 = DecodeHeader(ms.hdr[:hdrSize])
	}
	h2, err2 := DecodeHeader(ms.hdr[hdrSize:])
	if err2 == nil {
		ms.lastAt = r.now
	}
	if err1 != nil || err2 != nil || !sameLayout(&h1, &h2) || h1.Geometry != r.geo {
		// Torn, or the layout changed (hdr[hdrSize:] keeps the new one
		// for the next attempt); the promise reads may stay out.
		r.consume(m)
		r.fail(errRetry)
		return true
	}
	if r.mode != Linearizable && (h1.CatchingUp || h2.CatchingUp) && !r.knobs.readCatchingUp {
		// Its table holds nothing of what the group stored before the
		// member restarted: read another member (and come back to it,
		// as to a member that failed, once a leader caught it up).
		r.consume(m)
		if r.catching |= 1 << m; bits.OnesCount64(r.catching) >= len(r.members) {
			// Every member in a row: the group lost its data (every
			// replica restarted without it). Say so now, rather than
			// after MaxAttempts.
			r.err = fmt.Errorf("kv: group %d: every replica read restarted without its data and is catching up: %w", r.group, ErrCatchingUp)
			r.st = gsDone
			return true
		}
		r.fail(fmt.Errorf("kv: node %d: %w", r.members[m], ErrCatchingUp))
		return true
	}
	r.catching = 0
	if r.mode == Linearizable {
		done, err := r.confirm(m, &h1, &h2)
		if !done {
			return false
		}
		if err != nil {
			r.consume(m)
			r.fail(err)
			return true
		}
		r.res.Epoch = h1.Serving
	}
	r.consume(m)
	if m == r.home {
		r.homeWait = 0
	}
	// The buckets were read between the two header reads, so the value
	// is the key's state after some entry from h1.Applied on: report
	// that, a bound the value is never older than.
	r.res.Member, r.res.Applied, r.res.AppliedAt = m, h1.Applied, h1.AppliedAt
	// The matching slots: buckets of the old generation that were not
	// yet moved (read first), then the new one's. A key has one slot at a
	// time, but a read may see it in two places (a migration, a delete
	// and an insert in between): the newest version wins.
	fp := fpOf(r.h)
	pb := ms.pairs
	r.nc = 0
	for k := range r.pairs {
		for j := range 2 {
			bk := pb[(2*k+j)*bucketSize : (2*k+j+1)*bucketSize]
			if k < r.pairs-2 && bucketMoved(bk) {
				continue
			}
			for i := range slotsPer {
				// The fingerprint (the ref word's low byte) first: most
				// slots stop there.
				if bk[bucketHdr+i*slotSize+8] != fp {
					continue
				}
				if s := decodeSlot(bk, i); s.Version != 0 {
					r.cand[r.nc] = s
					r.nc++
				}
			}
		}
	}
	r.nextCandidate()
	return true
}

// consumeAsked takes the finished promise reads (others stay pending and
// are reaped by a later attempt).
func (r *GroupReader) consumeAsked() {
	for o := range r.members {
		if o != r.at && r.asked[o] && r.m[o].pdone {
			r.consume(o)
		}
	}
}

// confirm is round 1's leader check (see the comment at the top of this
// file): member m served epoch e at both header reads h1 and h2 that
// bracket the round, and f+1 members, counted with m, promise exactly e.
// done is false while promise reads it asked for are still out (it hedges
// to every other member after HedgeAfter, and asks more when answers fell
// short); err is ErrNoLeader when the check failed. The caller consumes
// m's own list. The ordered reader (ordered_reader.go) confirms its
// rounds with it too.
func (r *GroupReader) confirm(m int, h1, h2 *Header) (done bool, err error) {
	e := h1.Serving
	if e == 0 || h2.Serving != e {
		return true, ErrNoLeader
	}
	votes := 0
	if h1.Promise == e && h2.Promise == e {
		votes++
	}
	waiting := false
	for o := range r.members {
		if o == m || !r.asked[o] {
			continue
		}
		if !r.reap(o) {
			waiting = true
			continue
		}
		if r.m[o].perr != nil {
			continue
		}
		if ho, err := DecodeHeader(r.m[o].hdr[:hdrSize]); err == nil && ho.Promise == e {
			votes++
		}
	}
	if r.knobs.noQuorum {
		votes = r.quorum
	}
	if votes < r.quorum {
		if waiting {
			if !r.hedged && r.now-r.r1At >= r.HedgeAfter {
				r.hedged = true
				r.askPromises(len(r.members))
			}
			return false, nil
		}
		// Ask the members not asked yet; give up when none is left.
		if r.askPromises(r.quorum-votes) > 0 {
			return false, nil
		}
		r.consumeAsked()
		return true, ErrNoLeader
	}
	r.consumeAsked()
	return true, nil
}

// nextCandidate posts round 2 for the newest remaining candidate, or ends
// the get with the key absent.
func (r *GroupReader) nextCandidate() {
	if r.nc == 0 {
		r.res.Found, r.res.Value, r.res.Version = false, nil, 0
		r.st = gsDone
		return
	}
	bi := 0
	for i := 1; i < r.nc; i++ {
		if r.cand[i].Version > r.cand[bi].Version {
			bi = i
		}
	}
	s := r.cand[bi]
	r.cand[bi] = r.cand[r.nc-1]
	r.nc--
	r.postRecord(s, int(s.Units)*recAlign)
}

func (r *GroupReader) postRecord(s Slot, size int) {
	if s.Units == unitsLarge && size == unitsLarge*recAlign {
		size = recHdr + 8 // a large record: learn its size first
	}
	ms := r.m[r.at]
	if cap(ms.rec) < size {
		ms.rec = make([]byte, size)
	}
	r.fetching, r.recSize = s, size
	wrs := append(ms.wrs[:0], rdma.WR{Kind: rdma.OpRead, Region: heapRegion(r.group, int(s.Heap)), Offset: s.Off, Buf: ms.rec[:size]})
	ms.wrs = wrs
	if !r.post(r.at, wrs) {
		r.fail(errRetry)
		return
	}
	r.st = gsR2
}

// pollR2 validates the record read: a record that validates with the
// slot's version but holds another key is a fingerprint collision (try the
// next candidate); anything else that does not validate (torn, memory
// reused since the slot was read) reads round 1 again.
func (r *GroupReader) pollR2() bool {
	m := r.at
	if !r.reap(m) {
		return false
	}
	if err := r.consume(m); err != nil {
		r.fail(err)
		return true
	}
	r.Rounds++
	s := r.fetching
	b := r.m[m].rec[:r.recSize]
	if s.Units == unitsLarge && r.recSize == recHdr+8 {
		ri := recordInfo(b)
		if ri.Version != s.Version || ri.KLen < 0 || ri.VLen < 0 || ri.Size() > 1<<31 || ri.Size() < unitsLarge*recAlign {
			r.fail(errRetry)
			return true
		}
		r.postRecord(s, ri.Size())
		return true
	}
	ri, k, v, err := decodeRecord(b, !r.knobs.noRecordCheck)
	if err != nil || ri.Version != s.Version && !r.knobs.anyVersion {
		r.fail(errRetry)
		return true
	}
	if !bytes.Equal(k, r.key) {
		r.nextCandidate()
		return true
	}
	r.res.Found, r.res.Value, r.res.Version = true, v, ri.Version
	r.st = gsDone
	return true
}

// Get runs a get to the end in real time: it polls, spinning while reads
// complete at once (shm), then waiting on the Conn awaited.
func (r *GroupReader) Get(key []byte, mode Consistency) (GetResult, error) {
	return r.GetCtx(context.Background(), nil, time.Time{}, key, mode)
}

// ErrStopped is returned by GetCtx when stop is closed.
var ErrStopped = errors.New("kv: get stopped")

// GetCtx is Get that gives up when ctx ends (its error), stop is closed
// (ErrStopped) or the deadline, if not zero, passes
// (context.DeadlineExceeded). A read it leaves behind lands in this
// reader's own buffers and is reaped by its next get.
func (r *GroupReader) GetCtx(ctx context.Context, stop <-chan struct{}, deadline time.Time, key []byte, mode Consistency) (GetResult, error) {
	r.Begin(key, mode)
	err := runPolled(r, ctx, stop, deadline)
	r.st = gsIdle
	if errors.Is(err, errDeadline) {
		return GetResult{}, fmt.Errorf("%w (last cause: %v)", context.DeadlineExceeded, r.lastErr)
	}
	if err != nil {
		return GetResult{}, err
	}
	return r.res, r.err
}

// backoffUntil reports whether the get waits between attempts, and until
// when (runPolled).
func (r *GroupReader) backoffUntil() (time.Duration, bool) { return r.retryAt, r.st == gsWait }

// polled is a reader's state machine as runPolled drives it.
type polled interface {
	Poll(now time.Duration) bool
	backoffUntil() (time.Duration, bool)
}

// errDeadline: runPolled's deadline passed.
var errDeadline = errors.New("kv: deadline passed")

// runPolled drives p in real time until its Poll reports it done (nil):
// it spins, then yields, then sleeps 20 µs between Polls (on tcp the
// answer is a round trip away), and sleeps through a backoff between
// attempts. It returns ctx's error when ctx ends, ErrStopped when stop
// closes (nil: never) and errDeadline once deadline passed (zero: none);
// the caller then resets p.
func runPolled(p polled, ctx context.Context, stop <-chan struct{}, deadline time.Time) error {
	done := ctx.Done()
	for spins := 0; !p.Poll(rdma.Mono()); spins++ {
		if spins < 64 {
			continue
		}
		select {
		case <-done:
			return ctx.Err()
		case <-stop:
			return ErrStopped
		default:
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return errDeadline
		}
		if at, ok := p.backoffUntil(); ok {
			t := time.NewTimer(at - rdma.Mono())
			select {
			case <-done:
			case <-stop:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if spins < 1024 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}
