package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

const testMuxMember = MuxMember | 3

// muxDrain polls m and runs its IOs until the log is idle (or failed,
// or waiting for space), its drops done.
func muxDrain(t testing.TB, m *Mux, d *testDevice, now time.Duration) {
	t.Helper()
	w := m.w
	m.Poll(now)
	d.runAll()
	for i := 0; w.phase != pIdle || len(w.queued) > 0 || w.failErr == nil && (!w.Idle() && (w.fullErr == nil || w.now >= w.retryAt) || w.dropDue()); i++ {
		if i > 1e6 {
			t.Fatalf("mux never idle")
		}
		w.Flush() // a marker planDrop appended is lazy
		m.Poll(now)
		d.runAll()
	}
	m.Poll(now)
}

// muxModel is what a test appended to each stream: stream -> seq -> record.
type muxModel map[uint32]map[uint64]Record

func (mm muxModel) add(t testing.TB, s *Stream, typ RecType, flags uint8, data []byte, lazy bool) bool {
	t.Helper()
	want := s.NextSeq()
	var seq uint64
	var ok bool
	if lazy {
		seq, ok = s.AppendLazy(typ, flags, data[:len(data)/2], data[len(data)/2:])
	} else {
		seq, ok = s.AppendFlags(typ, flags, data[:len(data)/2], data[len(data)/2:])
	}
	if !ok {
		return false
	}
	if seq != want {
		t.Fatalf("stream %d: append got seq %d, want %d", s.id, seq, want)
	}
	if mm[s.id] == nil {
		mm[s.id] = map[uint64]Record{}
	}
	mm[s.id][seq] = Record{Type: typ, Flags: flags, Seq: seq, Data: data}
	return true
}

// muxState is what the property compares a recovery with: per stream,
// the seqs synced at the crash and its DropBefore mark.
type muxState struct {
	synced, mark, next map[uint32]uint64
}

func snapState(m *Mux) muxState {
	st := muxState{synced: map[uint32]uint64{}, mark: map[uint32]uint64{}, next: map[uint32]uint64{}}
	for _, s := range m.streams {
		st.synced[s.id], st.mark[s.id], st.next[s.id] = s.synced, s.mark, s.next
	}
	return st
}

// checkMux returns the properties a recovery breaks: every stream's
// records are written ones, consecutive, cover [mark, synced], its
// NextSeq follows them and is past synced, its log starts at its first
// record; no corruption (none planted).
func checkMux(mm muxModel, st muxState, mr *MuxRecovered) []string {
	return checkMuxCorrupt(mm, st, mr, nil)
}

// checkMuxCorrupt is checkMux for a log with flipped records (flipped:
// stream -> its seqs whose records were flipped; nil: none): a synced
// record may be missing, and seqs may jump, only inside a corruption
// range the stream's Recovered reports; a flipped record is never
// returned.
func checkMuxCorrupt(mm muxModel, st muxState, mr *MuxRecovered, flipped map[uint32][]uint64) []string {
	var failed []string
	fail := func(format string, args ...any) { failed = append(failed, fmt.Sprintf(format, args...)) }
	for id, synced := range st.synced {
		r := mr.Streams[id]
		if r == nil && flipped != nil {
			r = mr.For(id)
		}
		if r == nil {
			if synced > 0 {
				fail("stream %d: next seq lost: the stream is missing from the recovery (synced %d)", id, synced)
			}
			continue
		}
		covered := func(q uint64) bool {
			return flipped != nil && slices.ContainsFunc(r.Corrupt, func(c Corruption) bool { return c.FromSeq <= q && q <= c.ToSeq })
		}
		if len(r.Corrupt) > 0 && flipped == nil {
			fail("stream %d: corruption reported: %+v", id, r.Corrupt)
		}
		for _, q := range flipped[id] {
			if slices.ContainsFunc(r.Records, func(x Record) bool { return x.Seq == q }) {
				fail("stream %d: flipped seq %d returned", id, q)
			}
		}
		for i, x := range r.Records {
			want, ok := mm[id][x.Seq]
			if !ok || want.Type != x.Type || want.Flags != x.Flags || !bytes.Equal(want.Data, x.Data) {
				fail("stream %d: recovered seq %d (type %d, %d bytes) that it was not written (written: %v)", id, x.Seq, x.Type, len(x.Data), ok)
				break
			}
			if i > 0 && x.Seq != r.Records[i-1].Seq+1 && !covered(r.Records[i-1].Seq+1) {
				fail("stream %d: seq %d follows %d", id, x.Seq, r.Records[i-1].Seq)
				break
			}
		}
		for q := st.mark[id]; q <= synced; q++ {
			if !slices.ContainsFunc(r.Records, func(x Record) bool { return x.Seq == q }) && !covered(q) {
				fail("stream %d: synced record lost: seq %d (mark %d, synced %d, recovered %d records)", id, q, st.mark[id], synced, len(r.Records))
				break
			}
		}
		if n := len(r.Records); n > 0 && r.NextSeq != r.Records[n-1].Seq+1 && !covered(r.Records[n-1].Seq+1) || r.NextSeq <= synced && !covered(synced) || r.NextSeq > st.next[id] {
			fail("stream %d: next seq %d (synced %d, appended up to %d, %d records)", id, r.NextSeq, synced, st.next[id]-1, len(r.Records))
		}
		if flipped == nil && len(r.Segments) > 0 && len(r.Records) > 0 && r.Segments[0].FirstSeq != r.Records[0].Seq {
			fail("stream %d: first seq %d, first record %d", id, r.Segments[0].FirstSeq, r.Records[0].Seq)
		}
	}
	return failed
}

var muxIDs = []uint32{1, 2, 257, 1000, 70000}

// muxRun: streams written interleaved at random, with random polls, IO
// steps, clock moves and DropBefore marks (one stream goes idle halfway);
// a crash at a random step (random unsynced pages kept, the last one
// torn, or all unsynced pages lost); recovery must give every stream
// exactly what checkMux says. Then the Mux continues from the recovery
// and a second recovery must hold the recovered records and the new
// ones. It returns the properties that failed.
func muxRun(t testing.TB, seed uint64, steps int, knobs testingKnobs) []string {
	return muxRunFlips(t, seed, steps, 0, knobs)
}

// muxRunFlips is muxRun with flips random bits flipped, after the crash,
// in records strictly below the last synced batch (bit rot: a valid batch
// follows, so it is corruption, not a tear); checkMuxCorrupt judges the
// recovery, and the Mux does not continue.
func muxRunFlips(t testing.TB, seed uint64, steps, flips int, knobs testingKnobs) []string {
	rng := rand.New(rand.NewPCG(seed, 0x6d7578))
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	mr, err := recoverMux(mem, testDir, testMuxMember, knobs)
	if err != nil {
		t.Fatal(err)
	}
	mode := Mode(rng.IntN(2))
	cfg := Config{Dir: testDir, Member: testMuxMember, Mode: mode, SegmentBytes: int64(4096 * (1 + rng.IntN(3))), FsyncInterval: time.Millisecond}
	// Odd seeds gather (Sync only): held batches must keep every rule.
	// (From the seed, not rng: the other seeds' runs stay as they were.)
	cfg.GatherWindow = time.Duration(seed%2) * 300 * time.Microsecond
	// Seeds 2 and 3 mod 4 zero-write ahead of the tail (a page to three,
	// from the seed too): zeros after the tail keep every rule.
	if seed%4 >= 2 {
		cfg.ZeroAhead = int64(4096 * (1 + seed%3))
	}
	grng := rand.New(rand.NewPCG(seed, 0x676174))
	// Half the device's completions continue the log on the device's side
	// (Mux.Continue, as the shared log's FileDevice does): a Poll at any
	// moment must keep every rule. (Its own rng: the other draws stay.)
	crng := rand.New(rand.NewPCG(seed, 0x636f6e))
	// Half the records repeat the payload of the one before (of any
	// stream), as a process's replicas write one entry each: the Mux
	// writes references. (Its own rng too.)
	rrng := rand.New(rand.NewPCG(seed, 0x726566))
	var lastData []byte
	m, err := OpenMux(d, cfg, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs = knobs
	m.w.knobs = knobs
	nstreams := 2 + rng.IntN(len(muxIDs)-1)
	ids := muxIDs[:nstreams]
	var streams []*Stream
	for _, id := range ids {
		streams = append(streams, m.Stream(id, nil))
	}
	idle := streams[len(streams)-1]
	mm := muxModel{}
	var now time.Duration
	crashAt := steps/2 + rng.IntN(steps/2+1)
	var lastSynced, belowLast uint64 // the Writer's synced, and before its last move
	for step := 0; step < crashAt; step++ {
		if s := m.w.Synced(); s != lastSynced {
			belowLast, lastSynced = lastSynced, s
		}
		switch x := rng.IntN(20); {
		case x < 9:
			s := streams[rng.IntN(len(streams))]
			if s == idle && step > steps/4 {
				s = streams[0]
			}
			typ := RecEntry
			if rng.IntN(5) == 0 {
				typ = RecCommit
			}
			flags, data := uint8(rng.IntN(3)), payload(rng, uint64(step), rng.IntN(600))
			if lastData != nil && rrng.IntN(2) == 0 {
				data = lastData
			}
			lastData = data
			mm.add(t, s, typ, flags, data, rng.IntN(6) == 0)
		case x < 13:
			m.Poll(now)
			if cfg.GatherWindow > 0 && grng.IntN(2) == 0 {
				// a device faster than the polls: batches end, and
				// the next record finds the log idle (a gather start)
				d.runAll()
				m.Poll(now)
			}
		case x < 17:
			quiet := len(d.queue) > 0 && d.queue[0].Quiet
			if d.step() && !quiet && crng.IntN(2) == 0 {
				m.Continue(now)
			}
		case x < 18:
			now += time.Duration(rng.IntN(1500)) * time.Microsecond
		default:
			// a snapshot: everything synced, or a random point below it
			s := streams[rng.IntN(len(streams))]
			if s == idle && step > steps/4 || rng.IntN(2) == 0 {
				s.DropBefore(s.Synced() + 1)
			} else {
				s.DropBefore(1 + uint64(rng.IntN(int(s.Synced())+1)))
			}
		}
		if f := checkPub(m); f != "" {
			return []string{fmt.Sprintf("step %d: %s", step, f)}
		}
		if f := checkQuiet(m); f != "" {
			return []string{fmt.Sprintf("step %d: %s", step, f)}
		}
	}
	if err := m.w.Err(); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	muxZeroWrites.Add(m.w.stats.ZeroWrites)
	st := snapState(m)
	segsBefore := len(m.w.segs)
	if rng.IntN(2) == 0 {
		mem.Crash(rng)
	} else {
		mem.DropUnsynced()
	}
	if flips > 0 {
		return flipAndCheck(t, rng, mem, belowLast, flips, mm, st, knobs)
	}
	mr, err = recoverMux(mem, testDir, testMuxMember, knobs)
	if err != nil {
		return []string{fmt.Sprintf("recover: %v", err)}
	}
	failed := checkMux(mm, st, mr)
	if len(failed) > 0 {
		return failed
	}
	// Continue from the recovery; recover again.
	for id, r := range mr.Streams {
		for q := range mm[id] {
			if q >= r.NextSeq {
				delete(mm[id], q)
			}
		}
	}
	d = newTestDevice(mem)
	m, err = OpenMux(d, cfg, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.knobs, m.w.knobs = knobs, knobs
	for _, id := range ids {
		s := m.Stream(id, nil)
		for range 1 + rng.IntN(4) {
			mm.add(t, s, RecEntry, 0, payload(rng, uint64(id), rng.IntN(800)), false)
		}
	}
	muxDrain(t, m, d, now)
	if err := m.w.Err(); err != nil {
		t.Fatalf("seed %d: continuing: %v", seed, err)
	}
	st2 := snapState(m)
	for id := range st2.mark {
		st2.mark[id] = 1 // every record the first recovery returned, and the new ones
		if r := mr.Streams[id]; r != nil && len(r.Records) > 0 {
			st2.mark[id] = r.Records[0].Seq
		} else if r != nil {
			st2.mark[id] = r.NextSeq
		}
	}
	mem.DropUnsynced()
	mr2, err := recoverMux(mem, testDir, testMuxMember, knobs)
	if err != nil {
		return []string{fmt.Sprintf("recover after continuing: %v", err)}
	}
	for _, f := range checkMux(mm, st2, mr2) {
		failed = append(failed, "after continuing: "+f)
	}
	_ = segsBefore
	return failed
}

// checkPub compares what every stream's getters read without the Mux's
// mutex (Mux.publish) with the state under it: "" when they agree.
func checkPub(m *Mux) string {
	type want struct {
		oldest              time.Duration
		synced, next, bytes uint64
	}
	m.mu.Lock()
	ws := make([]want, len(m.streams))
	for i, s := range m.streams {
		ws[i] = want{oldest: -1, synced: s.synced, next: s.next, bytes: s.bytes}
		if s.head < len(s.pend) {
			ws[i].oldest = s.pend[s.head].at
		}
	}
	unsynced, err, full := m.w.unsynced(), m.w.Err(), m.w.Full()
	streams := slices.Clone(m.streams)
	m.mu.Unlock()
	for i, s := range streams {
		w := ws[i]
		got := want{oldest: s.OldestUnsynced(), synced: s.Synced(), next: s.NextSeq(), bytes: s.BytesWritten()}
		if got != w {
			return fmt.Sprintf("stream %d: published %+v, the Mux holds %+v", s.id, got, w)
		}
		if u := s.UnsyncedBytes(); u != unsynced {
			return fmt.Sprintf("stream %d: published UnsyncedBytes %d, the log holds %d", s.id, u, unsynced)
		}
		if e := s.Err(); (e == nil) != (err == nil) || s.Full() != full {
			return fmt.Sprintf("stream %d: published Err %v Full %v, the log's %v %v", s.id, e, s.Full(), err, full)
		}
	}
	return ""
}

// checkQuiet checks the Mux's published quietUntil (the streams' Polls
// that skip the mutex) against its state: when set, it is what
// publishQuiet would store now, and nothing could complete or be due
// before it.
func checkQuiet(m *Mux) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	got := m.quietUntil.Load()
	knobs := m.knobs
	m.knobs.muxQuietAlways = false
	m.publishQuiet()
	want := m.quietUntil.Load()
	m.knobs = knobs
	m.quietUntil.Store(got)
	// 0 (poll) is always safe: DropBefore stores it for the next Poll
	// to plan the drop.
	if got != 0 && got != want {
		return fmt.Sprintf("quiet: published until %v, the Writer's state gives %v (phase %d, %d bytes open since %v, flush %v)",
			time.Duration(got), time.Duration(want), m.w.phase, len(m.w.open), m.w.openSince, m.w.flush)
	}
	if got != 0 && (m.w.phase != pIdle && !m.devContinues || m.w.flush || len(m.w.open) > 0 && time.Duration(got) > m.w.openSince+m.w.cfg.FsyncInterval) {
		return fmt.Sprintf("quiet: until %v with phase %d, flush %v, %d bytes open since %v",
			time.Duration(got), m.w.phase, m.w.flush, len(m.w.open), m.w.openSince)
	}
	return ""
}

// flipAndCheck flips bits in records with global seqs up to below (each
// flip names the stream record it hit) and checks the recovery.
func flipAndCheck(t testing.TB, rng *rand.Rand, mem *vfs.Mem, below uint64, flips int, mm muxModel, st muxState, knobs testingKnobs) []string {
	view := mem.Clone()
	view.DropUnsynced()
	before, err := Recover(view, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	var cands []Record
	for _, r := range before.Records {
		if r.Seq <= below {
			cands = append(cands, r)
		}
	}
	type at struct {
		seg uint32
		off int64
	}
	net := map[at]byte{}
	owner := map[at]Record{}
	for range flips {
		if len(cands) == 0 {
			break
		}
		r := cands[rng.IntN(len(cands))]
		off := r.Pos.Off + int64(rng.IntN(recHdrSize+len(r.Data)))
		bit := byte(1) << rng.IntN(8)
		if err := mem.Corrupt(testDir+"/"+SegName(r.Pos.Seg), off, bit); err != nil {
			t.Fatal(err)
		}
		net[at{r.Pos.Seg, off}] ^= bit
		owner[at{r.Pos.Seg, off}] = r
	}
	flipped := map[uint32][]uint64{}
	for a, x := range net {
		if x == 0 {
			continue
		}
		h, ok := ParseMuxRecord(owner[a].Data)
		if !ok || h.Type == recMarker {
			continue
		}
		flipped[h.Stream] = append(flipped[h.Stream], h.Seq)
	}
	mr, err := recoverMux(mem, testDir, testMuxMember, knobs)
	if err != nil {
		return []string{fmt.Sprintf("recover: %v", err)}
	}
	if len(net) > 0 && len(mr.Log.Corrupt) == 0 && len(flipped) > 0 {
		return []string{fmt.Sprintf("flipped %v, no corruption found", flipped)}
	}
	return checkMuxCorrupt(mm, st, mr, flipped)
}

// muxZeroWrites sums the zero-ahead writes of muxRun's Mux logs before
// their crash (Config.ZeroAhead, seeds 2 and 3 mod 4).
var muxZeroWrites atomic.Uint64

func TestMuxCrashSeeds(t *testing.T) {
	n := uint64(150)
	if testing.Short() {
		n = 60
	}
	z := muxZeroWrites.Load()
	for seed := range n {
		if f := muxRun(t, seed, 400, testingKnobs{}); len(f) > 0 {
			t.Fatalf("seed %d: %q", seed, f)
		}
	}
	if muxZeroWrites.Load() == z {
		t.Fatal("no zero-ahead write in the seeds: the crash property never saw one")
	}
}

// A zero-ahead write that starts at the page below the tail zeroes
// synced records: the crash seeds that zero-write must catch it.
func TestMuxCatchesZeroAlignDown(t *testing.T) {
	caughtBy(t, testingKnobs{zeroAlignDown: true}, 40, "synced record lost")
}

// Bit rot below the last synced batch: each stream loses only records a
// corruption report of its own covers.
func TestMuxCorruptSeeds(t *testing.T) {
	for seed := range uint64(100) {
		if f := muxRunFlips(t, seed, 300, 1+int(seed%3), testingKnobs{}); len(f) > 0 {
			t.Fatalf("seed %d: %q", seed, f)
		}
	}
}

// A stream's records lost to corruption must be reported to it.
func TestMuxCatchesHideLoss(t *testing.T) {
	caught := 0
	var first []string
	for seed := range uint64(30) {
		f := muxRunFlips(t, seed, 300, 2, testingKnobs{muxHideLoss: true})
		if slices.ContainsFunc(f, func(s string) bool {
			return strings.Contains(s, "follows") || strings.Contains(s, "synced record lost")
		}) {
			caught++
			if first == nil {
				first = f
			}
		}
	}
	if caught == 0 {
		t.Fatal("muxHideLoss never caught in 30 seeds")
	}
	t.Logf("caught in %d of 30 seeds: %q", caught, first)
}

// caughtBy runs muxRun over seeds with knobs and reports the first
// failure whose text contains want (and how many seeds failed).
func caughtBy(t *testing.T, knobs testingKnobs, seeds uint64, want string) {
	t.Helper()
	caught := 0
	var first []string
	for seed := range seeds {
		f := muxRun(t, seed, 400, knobs)
		if slices.ContainsFunc(f, func(s string) bool { return strings.Contains(s, want) }) {
			caught++
			if first == nil {
				first = f
			}
		}
	}
	if caught == 0 {
		t.Fatalf("planted bug %+v: no seed of %d failed with %q", knobs, seeds, want)
	}
	t.Logf("caught in %d of %d seeds: %q", caught, seeds, first)
}

// Truncation: a stream's DropBefore must not remove a segment another
// stream still needs.
func TestMuxCatchesDropOwnMark(t *testing.T) {
	caughtBy(t, testingKnobs{muxDropOwnMark: true}, 60, "synced record lost")
}

// The getters a poller calls without the Mux's mutex (OldestUnsynced for
// Async's back-pressure at every ring record, Synced, NextSeq, ...) read
// what the Mux published: stale values would let a late replica take
// records, or hold a dA back.
func TestMuxCatchesStalePub(t *testing.T) {
	caughtBy(t, testingKnobs{muxStalePub: true}, 10, "published")
}

// Recovery must not mix streams (ids 1 and 257 share a low byte).
func TestMuxCatchesMixStreams(t *testing.T) {
	caughtBy(t, testingKnobs{muxMixStreams: true}, 20, "recover: wal: corrupt log: stream 1:")
}

// A stream whose records were all dropped keeps its next seq.
func TestMuxCatchesNoEvidence(t *testing.T) {
	caughtBy(t, testingKnobs{muxNoEvidence: true}, 40, "next seq")
}

// The Mux's log is the Writer's: a failed sync after a page drop must stop
// it (retrySync counts the batch durable).
func TestMuxCatchesRetrySync(t *testing.T) {
	f := muxSyncFailRun(t, testingKnobs{retrySync: true})
	if !slices.ContainsFunc(f, func(s string) bool { return strings.Contains(s, "synced record lost") }) {
		t.Fatalf("retrySync not caught: %q", f)
	}
	t.Logf("retrySync caught: %q", f)
}

// EIO or ENOSPC on fsync: every stream fails stop (ErrFailStop), appends are
// refused, Synced never moves again, and recovery keeps every stream's
// synced records.
func TestMuxSyncFailStop(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
		t.Run(errno.Error(), func(t *testing.T) {
			if f := muxSyncFailRunErr(t, testingKnobs{}, errno); len(f) > 0 {
				t.Fatalf("%q", f)
			}
		})
	}
}

func muxSyncFailRun(t *testing.T, knobs testingKnobs) []string {
	return muxSyncFailRunErr(t, knobs, syscall.EIO)
}

func muxSyncFailRunErr(t *testing.T, knobs testingKnobs, errno syscall.Errno) []string {
	mem := vfs.NewMem()
	var syncs atomic.Int32
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpSync && syncs.Add(1) == 6 {
			mem.DropDirty(op.Path)
			return errno
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(5, 5))
	d := newTestDevice(fs)
	mr, err := RecoverMux(fs, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 1 << 16}, mr)
	if err != nil {
		t.Fatal(err)
	}
	m.w.knobs = knobs
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	mm := muxModel{}
	var failed []string
	fail := func(format string, args ...any) { failed = append(failed, fmt.Sprintf(format, args...)) }
	for i := range 12 {
		mm.add(t, a, RecEntry, 0, payload(rng, uint64(i), 100), false)
		mm.add(t, b, RecEntry, 0, payload(rng, uint64(i), 100), false)
		muxDrain(t, m, d, 0)
	}
	if !errors.Is(a.Err(), ErrFailStop) || !errors.Is(b.Err(), ErrFailStop) {
		fail("Err() = %v, %v, want ErrFailStop", a.Err(), b.Err())
	}
	st := snapState(m)
	if _, ok := a.Append(RecEntry, []byte("x")); ok {
		fail("append accepted after the failed sync")
	}
	muxDrain(t, m, d, time.Second)
	if a.Synced() != st.synced[1] || b.Synced() != st.synced[2] {
		fail("synced moved after the failure")
	}
	mem.DropUnsynced()
	mr, err = RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		return append(failed, "recover: "+err.Error())
	}
	return append(failed, checkMux(mm, st, mr)...)
}

// ENOSPC when the next segment is preallocated: every stream sees Full,
// appends are refused, nothing is lost; once space returns the batch goes
// through and every stream's records are read back.
func TestMuxDiskFull(t *testing.T) {
	mem := vfs.NewMem()
	var noSpace atomic.Bool
	fs := errorfs.Wrap(mem, errorfs.Func(func(op errorfs.Op) error {
		if noSpace.Load() && op.Kind == errorfs.OpAllocate {
			return syscall.ENOSPC
		}
		return nil
	}))
	rng := rand.New(rand.NewPCG(6, 6))
	d := newTestDevice(fs)
	mr0, err := RecoverMux(fs, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 4096}, mr0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	mm := muxModel{}
	for i := range 6 {
		mm.add(t, a, RecEntry, 0, payload(rng, uint64(i), 200), false)
		mm.add(t, b, RecEntry, 0, payload(rng, uint64(i), 200), false)
		muxDrain(t, m, d, 0)
	}
	noSpace.Store(true)
	for i := range 10 {
		mm.add(t, a, RecEntry, 0, payload(rng, uint64(i), 300), false)
	}
	muxDrain(t, m, d, 0)
	if !a.Full() || !b.Full() || !errors.Is(b.Err(), ErrDiskFull) {
		t.Fatalf("full %v %v, err %v", a.Full(), b.Full(), b.Err())
	}
	if _, ok := b.Append(RecEntry, []byte("x")); ok {
		t.Fatal("append accepted while the disk is full")
	}
	noSpace.Store(false)
	retry := m.w.retryAt
	muxDrain(t, m, d, retry)
	if a.Err() != nil || a.Synced() != a.NextSeq()-1 {
		t.Fatalf("after space returned: err %v, synced %d next %d", a.Err(), a.Synced(), a.NextSeq())
	}
	st := snapState(m)
	mem.DropUnsynced()
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	if f := checkMux(mm, st, mr); len(f) > 0 {
		t.Fatalf("%q", f)
	}
}

// A stream's DiffBegin without its DiffEnd is dropped for that stream
// only; the Mux continuing the log writes the marker that voids it, so
// the stream's next records reuse its seqs and a second recovery reads
// them, not the dropped diff.
func TestMuxUnfinishedDiff(t *testing.T) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	cfg := Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 1 << 16}
	if err := mem.MkdirAll(testDir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	app := func(s *Stream, typ RecType, v string) {
		if _, ok := s.Append(typ, []byte(v)); !ok {
			t.Fatal(s.Err())
		}
	}
	app(a, RecEntry, "a1")
	app(a, RecDiffBegin, "a-diff")
	app(b, RecEntry, "b1")
	app(a, RecEntry, "a-diff-e")
	app(b, RecDiffBegin, "b-diff")
	app(b, RecEntry, "b-diff-e")
	app(b, RecDiffEnd, "b-diff")
	muxDrain(t, m, d, 0)
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := mr.Streams[1], mr.Streams[2]
	if len(ra.Records) != 1 || ra.NextSeq != 2 || ra.DroppedDiff != 2 || len(rb.Records) != 4 || rb.DroppedDiff != 0 {
		t.Fatalf("a: %d records, next %d, dropped %d; b: %d records, dropped %d", len(ra.Records), ra.NextSeq, ra.DroppedDiff, len(rb.Records), rb.DroppedDiff)
	}
	d = newTestDevice(mem)
	m, err = OpenMux(d, cfg, mr)
	if err != nil {
		t.Fatal(err)
	}
	a = m.Stream(1, nil)
	app(a, RecEntry, "a2")
	muxDrain(t, m, d, 0)
	mr, err = RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	ra = mr.Streams[1]
	if len(ra.Records) != 2 || string(ra.Records[1].Data) != "a2" || ra.Records[1].Seq != 2 || ra.NextSeq != 3 {
		t.Fatalf("a after continuing: %+v next %d", ra.Records, ra.NextSeq)
	}
}

// A per-replica Recover of a Mux's directory and RecoverMux of a
// replica's log both refuse (the member check).
func TestMuxRefusesOtherLogs(t *testing.T) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	w := mustOpen(t, d, mustRecover(t, mem), Config{Mode: Sync})
	w.Append(RecEntry, []byte("x"))
	drain(t, w, d, 0)
	if _, err := RecoverMux(mem, testDir, testMuxMember); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("RecoverMux of a replica's log: %v", err)
	}
	mem2 := vfs.NewMem()
	d2 := newTestDevice(mem2)
	if err := mem2.MkdirAll(testDir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d2, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 1 << 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Stream(7, nil).Append(RecEntry, []byte("x"))
	muxDrain(t, m, d2, 0)
	if _, err := Recover(mem2, testDir, 7); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Recover of a mux log: %v", err)
	}
}

// Truncation goes on with an idle stream: its last record's segment is
// dropped once a marker of its next seq is synced in a later one.
func TestMuxIdleStreamTruncates(t *testing.T) {
	mem := vfs.NewMem()
	d := newTestDevice(mem)
	if err := mem.MkdirAll(testDir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := OpenMux(d, Config{Dir: testDir, Member: testMuxMember, Mode: Sync, SegmentBytes: 4096}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	a, b := m.Stream(1, nil), m.Stream(2, nil)
	mm := muxModel{}
	for i := range 3 {
		mm.add(t, a, RecEntry, 0, payload(rng, uint64(i), 100), false)
	}
	muxDrain(t, m, d, 0)
	a.DropBefore(a.Synced() + 1)
	maxSegs := 0
	for i := range 200 {
		mm.add(t, b, RecEntry, 0, payload(rng, uint64(i), 300), false)
		muxDrain(t, m, d, 0)
		b.DropBefore(b.Synced() + 1)
		maxSegs = max(maxSegs, len(m.w.segs))
	}
	muxDrain(t, m, d, 0)
	if n := len(m.w.segs); n > 2 || m.w.segs[0].Seq < 5 {
		t.Fatalf("%d segments live (first %d, at most %d at once): the idle stream holds the log back", n, m.w.segs[0].Seq, maxSegs)
	}
	st := snapState(m)
	mem.DropUnsynced()
	mr, err := RecoverMux(mem, testDir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	if f := checkMux(mm, st, mr); len(f) > 0 {
		t.Fatalf("%q", f)
	}
	if r := mr.Streams[1]; len(r.Records) != 0 || r.NextSeq != 4 || r.Segments[0].FirstSeq != 4 {
		t.Fatalf("idle stream: %d records, next %d, first %d", len(r.Records), r.NextSeq, r.Segments[0].FirstSeq)
	}
}

// FuzzMuxRecord: ParseMuxRecord never panics; what it accepts encodes
// back to the same bytes; what putMuxHdr writes (a valid header) parses
// back to the same fields.
func FuzzMuxRecord(f *testing.F) {
	f.Add([]byte{}, uint32(1), uint8(2), uint8(0), uint64(1))
	hdr := make([]byte, muxHdrSize)
	putMuxHdr(hdr, 257, RecEntry, 3, 99)
	f.Add(append(hdr, "data"...), uint32(0), uint8(0), uint8(0), uint64(5))
	f.Fuzz(func(t *testing.T, b []byte, stream uint32, typ, flags uint8, seq uint64) {
		if r, ok := ParseMuxRecord(b); ok {
			enc := make([]byte, muxHdrSize)
			putMuxHdr(enc, r.Stream, r.Type, r.Flags, r.Seq)
			if r.Ref {
				enc[6] = muxRefFlag
				if r.Type == recMarker || len(r.Data) != muxRefSize {
					t.Fatalf("accepted a reference %x: type %d, %d bytes", b, r.Type, len(r.Data))
				}
			}
			if !bytes.Equal(append(enc, r.Data...), b) {
				t.Fatalf("accepted %x, re-encodes as %x", b, append(enc, r.Data...))
			}
		}
		enc := make([]byte, muxHdrSize, muxHdrSize+len(b))
		putMuxHdr(enc, stream, RecType(typ), flags, seq)
		data := b
		if RecType(typ) == recMarker {
			data, flags = nil, 0
			putMuxHdr(enc, stream, RecType(typ), flags, seq)
		}
		enc = append(enc, data...)
		r, ok := ParseMuxRecord(enc)
		valid := RecType(typ) != RecBatch && RecType(typ) != RecMux && seq != 0
		if ok != valid {
			t.Fatalf("type %d seq %d: ok %v, want %v", typ, seq, ok, valid)
		}
		if ok && (r.Stream != stream || r.Type != RecType(typ) || r.Flags != flags || r.Seq != seq || !bytes.Equal(r.Data, data)) {
			t.Fatalf("round trip: %+v from stream %d type %d flags %d seq %d", r, stream, typ, flags, seq)
		}
	})
}

// FuzzMuxRecover is muxRun's property (flips 0) and muxRunFlips' over
// fuzzed seeds.
func FuzzMuxRecover(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i, uint16(100+50*i), uint8(i%3))
	}
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16, flips uint8) {
		if fl := muxRunFlips(t, seed, 20+int(steps%1000), int(flips%4), testingKnobs{}); len(fl) > 0 {
			t.Fatalf("seed %d steps %d flips %d: %q", seed, steps, flips%4, fl)
		}
	})
}

// Streams used from their own goroutines (each replica's poller) over one
// FileDevice on real files, the device continuing the log as the shared
// log's does (Continue, then Kick); every stream's records read back (run
// with -race).
func TestMuxConcurrentStreams(t *testing.T) {
	dir := t.TempDir() + "/wal"
	mr, err := RecoverMux(vfs.OS, dir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	var m *Mux
	dev := NewFileDevice(vfs.OS, func() { m.Continue(0); m.Kick() })
	defer dev.Close()
	m, err = OpenMux(dev, Config{Dir: dir, Member: testMuxMember, Mode: Sync, SegmentBytes: 16 << 10, GatherWindow: 50 * time.Microsecond}, mr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const streams, records = 3, 60
	errs := make(chan error, streams)
	for i := range streams {
		kick := make(chan struct{}, 1)
		s := m.Stream(uint32(i+1), func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		})
		go func() {
			for r := range records {
				seq, ok := s.Append(RecEntry, fmt.Appendf(nil, "%d-%d", s.ID(), r))
				if !ok {
					errs <- fmt.Errorf("stream %d: append refused: %v", s.ID(), s.Err())
					return
				}
				for s.Synced() < seq {
					if s.Err() != nil {
						errs <- s.Err()
						return
					}
					if !s.Poll(time.Since(start)) {
						select {
						case <-kick:
						case <-time.After(time.Millisecond):
						}
					}
				}
				s.DropBefore(seq - min(seq-1, 10))
			}
			errs <- nil
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mr, err = RecoverMux(vfs.OS, dir, testMuxMember)
	if err != nil {
		t.Fatal(err)
	}
	for i := range streams {
		r := mr.Streams[uint32(i+1)]
		if r == nil || r.NextSeq != records+1 || len(r.Records) == 0 {
			t.Fatalf("stream %d: %+v", i+1, r)
		}
		for _, x := range r.Records {
			if want := fmt.Sprintf("%d-%d", i+1, x.Seq-1); string(x.Data) != want {
				t.Fatalf("stream %d seq %d: %q, want %q", i+1, x.Seq, x.Data, want)
			}
		}
	}
}
