package broadcast

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

var persistInPoll = flag.Bool("persistinpoll", false, "TestLargeSnapshotCatchUp: serialise snapshots on the polling goroutine (what the test must catch)")

var bigTrace = flag.Bool("bigtrace", false, "TestLargeSnapshotCatchUp: log protocol events other than commits and accepts")

var bigState = flag.Int("bigstate", 64, "TestLargeSnapshotCatchUp: the FSM state in MiB (the issue's figure: -bigstate 1024)")

// blobFSM is a state machine with a large state: nchunks chunks of
// blobChunk bytes, every Apply writing the entry into the chunk its index
// picks. Snapshot captures it copy-on-write in O(chunks) (the chunk
// pointers; Apply copies a chunk before its first write after a capture),
// so Poll never copies the state; Persist writes the header and the chunks.
type blobFSM struct {
	mu     sync.Mutex // Apply and Snapshot (Poll) against digest (the test)
	chunks [][]byte
	shared []bool   // chunk i is held by a capture: copy it before writing
	spare  [][]byte // chunks for those copies, allocated up front: an Apply
	// that allocates during a GC mark phase can be parked by the GC
	// (mark assist) for as long as the phase, tens of ms, which is the
	// FSM's cost, not the replica's
	retired [][]byte           // chunks copied away from while captures held them: spares once no live capture holds them
	live    map[*blobSnap]bool // captures not released yet
	index   uint64
	hash    uint64 // of the applied entries, in order
}

const blobChunk = 64 << 10

func newBlobFSM(mib int) *blobFSM {
	n := mib << 20 / blobChunk
	f := &blobFSM{chunks: make([][]byte, n), shared: make([]bool, n), spare: make([][]byte, n), live: map[*blobSnap]bool{}}
	backing := make([]byte, 2*n*blobChunk)
	for i := range f.chunks {
		f.chunks[i] = backing[i*blobChunk : (i+1)*blobChunk : (i+1)*blobChunk]
		binary.LittleEndian.PutUint64(f.chunks[i], uint64(i)) // not all zero pages
		f.spare[i] = backing[(n+i)*blobChunk : (n+i+1)*blobChunk : (n+i+1)*blobChunk]
		for p := 0; p < blobChunk; p += 4096 {
			f.spare[i][p] = 1 // fault the pages in now, not in an Apply's copy on write
		}
	}
	return f
}

func (f *blobFSM) Apply(e Entry) []byte {
	index, data := e.Index, e.Data
	f.mu.Lock()
	defer f.mu.Unlock()
	c := int(index % uint64(len(f.chunks)))
	if f.shared[c] {
		var fresh []byte
		if k := len(f.spare); k > 0 {
			fresh, f.spare = f.spare[k-1], f.spare[:k-1]
		} else {
			fresh = make([]byte, blobChunk) // more captures than spares
		}
		copy(fresh, f.chunks[c])
		f.retired = append(f.retired, f.chunks[c])
		f.chunks[c] = fresh
		f.shared[c] = false
	}
	off := int(index*64) % (blobChunk - len(data))
	copy(f.chunks[c][off:], data)
	f.index = index
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], f.hash)
	binary.LittleEndian.PutUint64(b[8:], index)
	f.hash = xxhash.Sum64(append(b[:], data...))
	return nil
}

type blobSnap struct {
	f           *blobFSM
	index, hash uint64
	chunks      [][]byte
}

func (f *blobFSM) Snapshot() (FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.shared {
		f.shared[i] = true
	}
	s := &blobSnap{f: f, index: f.index, hash: f.hash, chunks: slices.Clone(f.chunks)}
	f.live[s] = true
	return s, nil
}

func (s *blobSnap) Size() int { return 16 + len(s.chunks)*blobChunk }

func (s *blobSnap) Persist(dst []byte) error {
	binary.LittleEndian.PutUint64(dst, s.index)
	binary.LittleEndian.PutUint64(dst[8:], s.hash)
	for i, c := range s.chunks {
		copy(dst[16+i*blobChunk:], c)
	}
	return nil
}

// Release returns to the spares the chunks Apply copied away from that no
// live capture holds. The replica releases a capture off its polling
// goroutine, so a Release may run after the next capture was taken and
// Applies retired chunks that capture holds: returning every retired
// chunk then (as this did) let Apply overwrite the next capture before
// its Persist copied it, and a follower restored a state that no replica
// had (CI: same index and entries, a different state hash).
func (s *blobSnap) Release() {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, s)
	held := map[*byte]bool{}
	for c := range f.live {
		for _, b := range c.chunks {
			held[&b[0]] = true
		}
	}
	keep := f.retired[:0]
	for _, b := range f.retired {
		if held[&b[0]] {
			keep = append(keep, b)
		} else {
			f.spare = append(f.spare, b)
		}
	}
	f.retired = keep
}

// Restore adopts the fetched bytes: the chunks are slices of them.
func (f *blobFSM) Restore(b []byte) error {
	if len(b) != 16+len(f.chunks)*blobChunk {
		return fmt.Errorf("blob snapshot of %d bytes, want %d", len(b), 16+len(f.chunks)*blobChunk)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index = binary.LittleEndian.Uint64(b)
	f.hash = binary.LittleEndian.Uint64(b[8:])
	for i := range f.chunks {
		f.chunks[i] = b[16+i*blobChunk : 16+(i+1)*blobChunk : 16+(i+1)*blobChunk]
		f.shared[i] = false
	}
	return nil
}

// digest is (index, hash of entries, hash of the whole state).
func (f *blobFSM) digest() (uint64, uint64, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := xxhash.New()
	for _, c := range f.chunks {
		d.Write(c)
	}
	return f.index, f.hash, d.Sum64()
}

// cond adapts a boolean condition to awaitCond.
func cond(ok func() bool) func() error {
	return func() error {
		if ok() {
			return nil
		}
		return fmt.Errorf("not yet")
	}
}

// bigMember is a replica run by a loop like Driver.Run that also records
// how long each Poll took.
type bigMember struct {
	id     rdma.NodeID
	node   *mem.Node
	r      *Replica
	fsm    *blobFSM
	stable *MemStable
	cancel context.CancelFunc
	done   chan struct{}
	// The longest Poll since the last reset, in wall-clock time and in
	// CPU time of its thread (the loop locks its OS thread): on two cores
	// shared by three replicas, a Persist and the GC, a Poll is often
	// descheduled for tens of milliseconds with a fraction of that on CPU.
	maxPoll, maxPollCPU atomic.Int64
}

func (m *bigMember) start(t *testing.T, f *mem.Fabric, cfg Config, mib int) {
	var err error
	if m.node, err = f.NewNode(m.id); err != nil {
		t.Fatal(err)
	}
	cfg.Self = m.id
	if *bigTrace {
		t0 := time.Now()
		cfg.Trace = func(format string, args ...any) {
			if s := fmt.Sprintf(format, args...); !strings.Contains(s, "commits up to") && !strings.Contains(s, "accepts up to") {
				t.Logf("%8.3fs %s", time.Since(t0).Seconds(), s)
			}
		}
	}
	m.fsm = newBlobFSM(mib)
	if m.r, err = New(cfg, m.node, m.fsm, m.stable); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	db := m.node.Doorbell()
	go func() {
		defer close(m.done)
		runtime.LockOSThread()
		stop := context.AfterFunc(ctx, db.Ring)
		defer stop()
		t0 := time.Now()
		for ctx.Err() == nil {
			seq := db.Seq()
			now := time.Since(t0)
			var ts0, ts1 unix.Timespec
			unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts0)
			progress := m.r.Poll(now)
			unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts1)
			if took := int64(time.Since(t0) - now); took > m.maxPoll.Load() {
				m.maxPoll.Store(took)
			}
			if cpu := ts1.Nano() - ts0.Nano(); cpu > m.maxPollCPU.Load() {
				m.maxPollCPU.Store(cpu)
			}
			if progress {
				continue
			}
			if wait := min(m.r.NextDeadline()-now, cfg.HeartbeatInterval); wait > 0 {
				db.Wait(seq, wait)
			}
		}
	}()
}

func (m *bigMember) stop() {
	m.cancel()
	<-m.done
	m.r.Close()
	m.node.Close()
}

// TestLargeSnapshotCatchUp: a follower restarted with empty memory behind
// the pruned Log catches up by a snapshot of a large state (64 MiB here,
// -bigstate 1024 for the 1 GiB) on the mem fabric while a client
// keeps proposing at the leader. The capture is taken in Poll, the copy
// off it: no Poll of the leader runs for more than pollCPUBound (25 ms)
// on CPU, and the follower ends with the same state (-persistinpoll,
// serialising on the polling goroutine as the replica once did, fails it:
// a Persist copies and hashes the whole state in one Poll).
// It reports the catch-up time and the leader's commit latencies during
// the transfer against those before it. The bound is on the CPU time of
// a Poll: its wall-clock time on this 2-core machine mostly measures the
// OS scheduler (the log shows both).
//
// The election timeout is 1 s, the bound a fixed 25 ms (it was a quarter
// of a 100 ms timeout): the property is the Poll's CPU time, which load
// does not inflate, while a 100 ms timeout is one the OS scheduler breaks
// at load 30-40 (a polling thread not run for 100 ms), and each election
// ended the follower's fetch of the snapshot: CI failed 'the follower did
// not catch up' in 150 s after 44-206 elections.
// pollCPUBound is TestLargeSnapshotCatchUp's bound on the CPU time of one
// Poll of the leader during the transfer.
const pollCPUBound = 25 * time.Millisecond

func TestLargeSnapshotCatchUp(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	mib := *bigState
	if raceEnabled {
		mib = min(mib, 16) // for the race detector's sake; the timing is checked without it
	}
	const et = time.Second
	f := mem.New(mem.Options{})
	ids := []rdma.NodeID{1, 2, 3}
	cfg := Config{Members: ids, Start: StartNew, HeartbeatInterval: time.Millisecond, ElectionTimeout: et,
		MaxLogEntries: 1024, MaxCatchUpLogEntries: 1 << 20, MaxSnapshot: 2*mib<<20 + 4096}
	ms := make([]*bigMember, len(ids))
	for i, id := range ids {
		ms[i] = &bigMember{id: id, stable: &MemStable{}}
		ms[i].start(t, f, cfg, mib)
		if *persistInPoll {
			ms[i].r.runPersist = func(fn func()) { fn() }
		}
	}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()
	var leader *bigMember
	if err := awaitCond("a leader", testWait, cond(func() bool {
		for _, m := range ms {
			if s := m.r.Status(); s.Role == Leader && s.Committed.E == s.ECur {
				leader = m
				return true
			}
		}
		return false
	})); err != nil {
		t.Fatalf("no leader: %v", err)
	}
	var fol *bigMember
	for _, m := range ms {
		if m != leader {
			fol = m
		}
	}
	// A closed-loop client at the leader, W=1, recording each commit's
	// latency and when it completed. A proposal that found no leader
	// within ProposeTimeout (ErrTimeout: not delivered, safe to retry)
	// is proposed again and counted: on a loaded machine the two live
	// members can go without a leader for that long (elections are
	// reported, not asserted, below); any other error stops the client
	// and fails the test.
	type sample struct{ at, lat time.Duration }
	var (
		smu      sync.Mutex
		samples  = make([]sample, 0, 4<<20) // the callback runs in the leader's Poll: no allocation there
		stopped  atomic.Bool
		clientE  atomic.Value
		timeouts atomic.Int64
	)
	t0 := time.Now()
	msg := make([]byte, 64)
	var next func()
	next = func() {
		if stopped.Load() {
			return
		}
		sent := time.Since(t0)
		leader.r.ProposeFunc(msg, func(_ uint64, _ []byte, err error) {
			if errors.Is(err, ErrTimeout) {
				timeouts.Add(1)
				next()
				return
			}
			if err != nil {
				clientE.Store(err)
				return
			}
			now := time.Since(t0)
			smu.Lock()
			samples = append(samples, sample{now, now - sent})
			smu.Unlock()
			next()
		})
	}
	next()
	defer stopped.Store(true)
	elections := func() (k uint64) {
		for _, m := range ms {
			k += m.r.Status().Counters.ElectionsStarted
		}
		return k
	}
	e0 := elections()

	// The follower crashes; the leader commits past MaxLogEntries.
	fol.stop()
	crashIndex := leader.r.Status().Index
	// (Bounded as the catch-up is: at load 49 a closed-loop client
	// with no error took more than 30 s for these 3 k commits.)
	if err := awaitCond("commits without the follower", 5*testWait, cond(func() bool { return leader.r.Status().Index > crashIndex+3*1024 })); err != nil {
		t.Fatalf("the leader did not commit without the follower: %v (client: %v)", err, clientE.Load())
	}
	// It restarts with empty memory and catches up by snapshot.
	restart := time.Since(t0)
	for _, m := range ms {
		m.maxPoll.Store(0)
		m.maxPollCPU.Store(0)
	}
	fol.start(t, f, cfg, mib)
	target := leader.r.Status().Index
	if err := awaitCond("catch-up", 5*testWait, cond(func() bool { return fol.r.Status().Index >= target })); err != nil {
		t.Fatalf("the follower did not catch up: %v; leader %+v; follower %+v (client: %v)", err, leader.r.Status().Counters, fol.r.Status(), clientE.Load())
	}
	caught := time.Since(t0)
	maxPoll, maxCPU := time.Duration(leader.maxPoll.Load()), time.Duration(leader.maxPollCPU.Load())
	stopped.Store(true)
	if err := clientE.Load(); err != nil {
		t.Fatalf("client: %v", err)
	}
	// Elections during the transfer are reported, not asserted: on a
	// loaded machine a member's goroutine can go unscheduled for an
	// election timeout whatever the snapshot does. What the test asserts
	// (that the snapshot does not block the polling goroutine) is the
	// Poll's CPU time below, which load does not inflate.
	if e := elections(); e != e0 {
		t.Logf("%d elections started during the transfer", e-e0)
	}
	if n := timeouts.Load(); n > 0 {
		t.Logf("%d proposals timed out without a leader and were proposed again", n)
	}
	// The bound is 25 ms, not less: a Poll
	// that pays the GC's mark assist (seen up to 10 ms of CPU in a Dial of
	// the restarted follower, with 200 MiB of blob state in the process)
	// or first touches of the test FSM's copy-on-write pages (up to 6 ms)
	// is not blocked by the snapshot; a Persist on the polling goroutine
	// (-persistinpoll) copies and hashes all 64 MiB, far more.
	if maxCPU > pollCPUBound && !raceEnabled {
		t.Errorf("a Poll of the leader ran %v on CPU during the transfer (bound %v, election timeout %v): the snapshot blocks the polling goroutine", maxCPU, pollCPUBound, et)
	}
	fs := fol.r.Status()
	if fs.Counters.SnapshotsRestored == 0 {
		t.Errorf("the follower caught up without a snapshot: %+v", fs.Counters)
	}
	// Same state: once the client stopped, the last proposals in flight
	// commit and both replicas settle; wait until their digests (index,
	// entry hash, state hash) agree, and report them if they never do.
	var ld, fd [3]uint64
	if err := awaitCond("same state", testWait, func() error {
		ld[0], ld[1], ld[2] = leader.fsm.digest()
		fd[0], fd[1], fd[2] = fol.fsm.digest()
		if ld != fd {
			return fmt.Errorf("leader (%d %#x %#x), follower (%d %#x %#x)", ld[0], ld[1], ld[2], fd[0], fd[1], fd[2])
		}
		return nil
	}); err != nil {
		t.Errorf("states differ after the client stopped: %v", err)
	}
	smu.Lock()
	var before, during []time.Duration
	for _, s := range samples {
		switch {
		case s.at < restart && s.at > restart-(caught-restart):
			before = append(before, s.lat)
		case s.at >= restart && s.at <= caught:
			during = append(during, s.lat)
		}
	}
	smu.Unlock()
	pct := func(v []time.Duration, p float64) time.Duration {
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[min(len(v)-1, int(float64(len(v))*p))]
	}
	t.Logf("state %d MiB: catch-up %v (restart to index %d); leader's longest Poll %v (on CPU at most %v); commits during the transfer %d, p50 %v p99 %v max %v; in as long before it %d, p50 %v p99 %v max %v; snapshots taken %d sent %d",
		mib, (caught - restart).Round(time.Millisecond), target, maxPoll, maxCPU, len(during), pct(during, .5), pct(during, .99), pct(during, 1),
		len(before), pct(before, .5), pct(before, .99), pct(before, 1), leader.r.Status().Counters.SnapshotsTaken, leader.r.Status().Counters.SnapshotsSent)
}
