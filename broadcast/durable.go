package broadcast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rdmakv/rdmakv/wal"
)

// Durability (docs/broadcast.md, "Durability"; docs/dev/durability-plan.md
// §2-3): in Sync and Async modes the replica writes what it accepts to a
// wal.Writer, in the order it accepts it; Sync acknowledges only what is
// synced, Async what it accepted (back-pressure bounds how far the disk
// trails: diskLate; a restarted member votes only in a recovery election:
// election.go, recoveryReady).
//
// Records (payloads little-endian; wal adds the Batch records):
//
//	Entry     [E u64][Cnt u64][proposal id, 16 bytes][data ...]   Fig. 5 l.49 / Fig. 4 l.40: Log[hdr] = M
//	DiffBegin [E u64][Cnt u64][baseE u64][baseCnt u64][n u32][flags u32]
//	SnapMark  [E u64][Cnt u64][index u64]                        inside a diff: the snapshot it installs, in snap/
//	DiffEnd   [E u64][Cnt u64]                                   Fig. 5 l.62-64, applied as one unit on replay
//	Commit    [E u64][Cnt u64][index u64][seen index u64]        the commit point, lazily
//
// A diff's records sit between its DiffBegin and DiffEnd (the entries
// flagged recInDiff); recovery applies a diff only when its DiffEnd is
// there (wal.Recover drops an unfinished one at the tail). A leader's
// election writes an empty diff of its epoch, so that replay finds E_cur
// and Accepted = (E, 0).
//
// A network snapshot that a diff installs is not in the log: it is saved
// as a disk snapshot through Config.Snapshots (snap/, off Poll like the
// periodic ones), and the diff's SnapMark only names it. dA does not move
// to the SnapMark's record or past it (the gate) until the snapshot file
// is durable too; recovery finds a SnapMark whose snapshot is not on disk
// only if that snapshot was never acknowledged or the disk lost it: it
// boots catching up (Repair). The snapshot may lie below disk snapshots
// the member holds (Async: a recovery that lost entries it had delivered
// rolls it back, diffReset); those predate the diff (install.stale). The
// store gets the snapshot only once the diff is synced, and removes them
// durably before the save counts (SnapStore.SaveImage), so the gate never
// passes the SnapMark while a crash could bring one back; a crash before
// that may leave one, which LoadFor removes, starting from the snapshot
// the SnapMark names and replaying the log from its diff.

// WAL is the log a durable replica writes (Config.WAL): exactly the
// methods the replica and its SnapStore call. A *wal.Writer (one log per
// replica; the simulator's) and a *wal.Stream (one stream of a process's
// shared log, wal.Mux: docs/dev/durability-plan.md, "One log per
// process") both have them. Seqs are the log's own (a Stream's are its
// stream seqs), so the replica's rules read the same over either.
type WAL interface {
	AppendFlags(typ wal.RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool)
	AppendLazy(typ wal.RecType, flags uint8, parts ...[]byte) (seq uint64, ok bool)
	Poll(now time.Duration) bool
	NextDeadline() time.Duration
	Flush()
	Synced() uint64
	NextSeq() uint64
	OldestUnsynced() time.Duration
	DropBefore(seq uint64)
	Err() error
	Full() bool
	CheckSpace()
	Space() wal.Space
	SpaceLow(wal.Space) bool
	// UnsyncedBytes and MaxUnsyncedBytes are the whole log's (a Mux's
	// queue is shared, and the Writer refuses records past twice the
	// maximum): Async's back-pressure reads them.
	UnsyncedBytes() int64
	MaxUnsyncedBytes() int64
	BytesWritten() uint64
	Stats() wal.Stats
}

var (
	_ WAL = (*wal.Writer)(nil)
	_ WAL = (*wal.Stream)(nil)
)

// recInDiff flags an Entry record that belongs to a diff.
const recInDiff = 1

// durMark is an accepted header and the seq of the record that made it
// Accepted: dA is the last mark whose record is synced.
type durMark struct {
	seq uint64
	hdr MsgHdr
}

// durable is a Sync or Async replica's log state.
type durable struct {
	w    WAL
	ring []durMark // not yet synced, in seq order
	dA   MsgHdr    // durable accepted: the last synced mark
	// commitSeq is the seq of the last Commit record (0: none yet);
	// commitLogged the point it records.
	commitSeq    uint64
	commitLogged MsgHdr
	err          error // sticky: the writer failed or refused a record (fail-stop)
	hdr          [48]byte
	// parts holds a record's parts while walAdd appends it (cleared
	// after): see walAdd.
	parts [2][]byte
	// units are the (first seq, header) of every entry and diff written
	// since the last disk snapshot's capture, in seq (and header) order:
	// a capture at commit point C may drop the log below the first unit
	// above C.
	units     []durMark
	snapBytes uint64       // the writer's BytesWritten at the last capture
	snapJob   *diskSnapJob // a capture being persisted
	snapDrop  uint64       // the save in flight: DropBefore this once durable
	cut       uint64       // the newest durable snapshot's: the log below it is dropped

	// savingImg is the file image of the periodic save in flight (nil:
	// none, or a diff's install); spareImg the image of the last one
	// that became durable, which the next capture's Persist writes into
	// (snapImageInto): a fresh image of a 1 M-record table is tens of
	// MB whose first writes fault every page in beside the pollers.
	savingImg, spareImg []byte
	imgReuses           uint64 // captures that took spareImg (tests)

	// A network snapshot a diff installed, waiting for the store (net)
	// and in it (netSaving). gate: marks at or above this seq do not
	// move dA until the snapshot is durable (0: no gate). netDrop,
	// netEnd: once the snapshot is durable and the record netEnd synced,
	// the log below netDrop (the diff's DiffBegin) is covered.
	net, netSaving  *netSnapSave
	gate            uint64
	netDrop, netEnd uint64
	netSaves        uint64 // network snapshots made durable
	// flushedFor (Async) is the append time of the oldest unsynced
	// record when walPoll last flushed the writer for it.
	flushedFor time.Duration
	// late (Async): the last walPoll found the replica late (diskLate)
	// since lateSince (Counters.DiskLateSpells, DiskLateNanos).
	late      bool
	lateSince time.Duration
	// work: the snapshot work diskSnapPoll did on the polling goroutine
	// (Config.StatClock; SnapWork).
	work SnapWork
	// full: the writer found the disk full (wal.Writer.Full) as of the
	// last walPoll, since fullSince.
	full      bool
	fullSince time.Duration
	fullErr   error // the writer's error when the episode began
	// idleSeq is the writer's NextSeq as walCommit last saw it, and
	// idleSince when it last changed (or when an idle round found space
	// to spare): a writer that took no record for fullProbeEvery
	// election timeouts is checked for a full disk (idleProbe).
	// spaceAsked: the round asked the writer for free space, whose
	// answer count was then spaceN.
	idleSeq    uint64
	idleSince  time.Duration
	spaceAsked bool
	spaceN     uint64
}

// netSnapSave is a network snapshot being saved as a disk snapshot.
type netSnapSave struct {
	at         MsgHdr
	index      uint64
	begin, end uint64 // the diff's DiffBegin and DiffEnd seqs
	img        []byte // the file image (encodeSnapFile), built off Poll
	done       atomic.Bool
}

// ErrDisk wraps a disk failure that stopped the replica: a save of the
// stable state that failed (any mode; a full disk is retried), or, in
// Sync and Async, a write-ahead log failure: the writer's own error
// (wal.ErrFailStop), a record it refused,
// or a snapshot a diff installed that found no space (wal.ErrDiskFull: the
// log already names it). A full disk under the log alone does not stop
// the replica (diskFull). The replica no longer polls; Status.DiskErr says why.
var ErrDisk = errors.New("broadcast: write-ahead log failed")

// ErrLogCorrupt: Recover or New found a log this package did not write,
// or one that breaks the protocol's order (a bug or a damaged disk that
// the wal's checks did not see). The replica does not start.
var ErrLogCorrupt = errors.New("broadcast: log corrupt")

// ackHdr is what our AcceptSST row acknowledges, and what a leader counts
// for itself (Fig. 6 l.72-74): Accepted in Memory mode, min(Accepted, dA)
// in Sync (plan §2 D3: a majority's acknowledgement is on a majority's
// disks).
func (r *Replica) ackHdr() MsgHdr {
	if r.dur == nil || r.cfg.Durability == Async || r.knobs.ackUnsynced || r.knobs.ackRefused && r.dur.full {
		return r.accepted // Async: acknowledged before it is on disk
	}
	return minHdr(r.accepted, r.dur.dA)
}

// diskLate is Async's back-pressure (plan §2.4): while the oldest record
// not yet synced is older than 2 x FsyncInterval (or half the writer's
// MaxUnsyncedBytes are queued), the replica accepts no
// new entry (a follower leaves records in its ring, a leader broadcasts
// nothing new), so that what it acknowledges is on its disk within about
// 2 x FsyncInterval plus one batch's write and sync, however slow the
// disk. A Poll that finds the writer late counts it (Counters.DiskLate).
func (r *Replica) diskLate() bool {
	if r.dur == nil || r.cfg.Durability != Async || r.knobs.asyncNoBackpressure {
		return false
	}
	w := r.dur.w
	o := w.OldestUnsynced()
	// Also once half the writer's MaxUnsyncedBytes is queued: a burst
	// accepted in one Poll (a ring's records, a leader's waiting
	// proposals) would otherwise make one batch, and its write, as large
	// as the burst, and a queue past twice MaxUnsyncedBytes makes the
	// writer refuse records (fail-stop).
	return o >= 0 && (r.now-o > 2*r.cfg.FsyncInterval || !r.knobs.timeOnlyBackpressure && w.UnsyncedBytes() >= w.MaxUnsyncedBytes()/2)
}

// A full disk (issue 19; plan §1, "fsyncgate"). A write that finds no
// space (ENOSPC, EDQUOT) is not a failed fsync: nothing synced was lost,
// and the writer cuts the batch back and retries it later
// (wal.ErrDiskFull). Until a retry succeeds it refuses every record, so
// the replica must not do anything that needs one, or its log would get
// a hole (a later dA would claim entries the disk does not hold). While
// full (diskFull), the replica therefore:
//
//   - reads no ring record (as Async's back-pressure: records, diffs and
//     forwarded proposals wait in the ring, and the sender with them);
//   - acknowledges nothing more: Sync's AcceptSST row is min(Accepted,
//     dA), and dA stays at the last synced record (the batch the writer
//     refused is not synced); a Sync leader does not count itself;
//   - as leader, broadcasts nothing new: Append and AppendFunc fail with
//     ErrDiskFull, waiting proposals end with it (never broadcast, so
//     never delivered), AppendRoom is 0; forwarded proposals wait;
//   - never stands for election nor wins one (becomeLeader writes its
//     epoch's empty diff), and a leader whose disk stays full for
//     fullStepDownAfter election timeouts steps down once a majority of
//     the others can log
//     (they say so in their AcceptSST rows, word wAckFull), so that the
//     group goes on without it;
//   - still delivers what its leader commits (committed entries are on
//     a majority's disks in Sync) and serves one-sided reads.
//
// A leader also refuses (ErrDiskFull: fullRefuse) when fewer than a
// majority of members can log, counting itself and the followers it
// heard within an election timeout that do not say wAckFull: the group
// could not commit the entry. Everything is decided on the Poll's clock;
// the writer retries the batch every wal.Config.DiskFullRetry.

// A group where a majority's disks are full cannot start a new epoch:
// its leader must write the epoch's empty diff and a majority must log
// it (becomeLeader, acceptDiff). An election started then runs until
// space returns, and meanwhile nobody leads: writes wait for a leader
// instead of being refused with ErrDiskFull, and no linearizable get is
// served. One pause longer than an election timeout of the leader, or of
// the follower it needs for its majority (a loaded machine, a GC, a
// stopped process: seen after 12-25 s in real processes), was enough to
// end the epoch: the others stop hearing it, and their rows say so, and
// a leader steps down when fewer than a majority say they follow it,
// while a follower hears its leader again only while the leader says it
// is followed. So:
//
//   - a follower whose disk is full does not start an election when its
//     leader times out: it waits for it, as when the pre-vote fails
//     (fullDefers), and takes part in no election until space returns
//     (it could neither stand nor log a new leader's diff; members that
//     can log elect without it: its CommitSST row still says it hears no
//     leader). Once space returns it elects if its leader is still
//     silent. A leader that restarted ends the epoch as before;
//   - a leader that refuses for full disks keeps its epoch when it hears
//     fewer than a majority (after a pause of its own the links to it
//     may take a while to come back: the fabric's dead-peer detection
//     closed them), and counts as following it every member it heard
//     within an election timeout, whatever their rows say about hearing
//     it (fullKeeps, timers and followedBy): its row then says it is
//     followed, and its followers take its heartbeat again. It gives up
//     the majority and one-way partition checks, which are moot while
//     no new epoch can start; when members that can log elect past it,
//     it sees their vote and joins it (at once if it hears fewer than a
//     majority, else after the two election timeouts of leader
//     stickiness). Nothing here is a safety rule: the leader commits
//     nothing without a majority's acknowledgements, and linearizable
//     gets do not rely on leadership timing (the promise quorum,
//     docs/kv.md).
//
// A member also finds out that its disk is full without a write of its
// own: a writer that took no record for fullProbeEvery election timeouts
// asks its device for the free space of the log's file system (statfs on
// the device's goroutine, no disk IO: idleProbe), and when the answer is
// low (wal.Config.LowSpaceBytes) or the query fails it gets a Commit
// record restating the commit point (walCommit), written and synced like
// any other; it fails while the log cannot write. So an idle follower
// shows disk_full (and /readyz 503) within that time, stops standing for
// election, and its leader counts it out (wAckFull) before a write needs
// it. A probe costs an fsync; the query costs none, so an idle member
// with space to spare syncs nothing (an idle cluster that probed every
// round did an fsync per replica every 8 election timeouts, for ever). The
// query has the same period as the probe had, so the bounds above
// (fullStepDownAfter) are unchanged: a disk that fills while idle is
// found at the next round's query, which answers 0 (or little), and its
// probe.

// fullProbeEvery is how many election timeouts a writer that took no
// record waits before walCommit probes the disk; fullStepDownAfter how
// many a full leader waits before it hands over (a probe's round and one
// more for its write and sync).
const (
	fullProbeEvery    = 8
	fullStepDownAfter = fullProbeEvery + 1
)

// fullKeeps reports that this leader refuses for full disks (as of this
// Poll's rows): it keeps its epoch when it hears fewer than a majority,
// and followedBy counts the members it hears, not only those that say
// they follow it.
func (r *Replica) fullKeeps() bool { return r.fullRefuse && !r.knobs.fullElects }

// fullDefers reports that this follower, whose disk is full, waits for
// its leader instead of starting an election when it times out.
func (r *Replica) fullDefers() bool { return r.diskFull() && !r.knobs.fullElects }

// diskFull reports that this replica's log refuses records for a full
// disk (wal.Writer.Full), as of its last Poll.
func (r *Replica) diskFull() bool { return r.dur != nil && r.dur.full }

// RefusingFull reports that this replica leads and refuses new entries
// with ErrDiskFull (Status.GroupDiskFull) as of its last Poll: Append,
// AppendFunc and waiting proposals fail with it, AppendRoom is 0. Like
// Append, it is for the polling goroutine (multicast tells its clients).
func (r *Replica) RefusingFull() bool { return r.fullRefuse }

// updateFull recomputes fullRefuse: a leader refuses new entries while
// its own disk is full or fewer than a majority of members can log (and
// one of them because its disk is full).
func (r *Replica) updateFull() {
	r.fullRefuse = false
	if r.dur == nil || r.role != Leader {
		return
	}
	if r.dur.full {
		r.fullRefuse = true
		return
	}
	k, full := 1, false
	for i := range r.mems {
		m := &r.mems[i]
		if i == r.me || !m.valid[tAccept] || r.now-m.heardAt > r.cfg.ElectionTimeout {
			continue
		}
		if m.rows[tAccept][wAckFull] != 0 {
			full = true
			continue
		}
		k++
	}
	r.fullRefuse = full && k < r.quorum
}

// othersCanLog counts the other members that follow this leader, were
// heard within an election timeout and whose logs can write (no
// wAckFull): a majority of them can elect a leader without us.
func (r *Replica) othersCanLog() int {
	k := 0
	for i := range r.mems {
		m := &r.mems[i]
		if i != r.me && m.valid[tAccept] && m.valid[tCommit] && m.rows[tAccept][wAckFull] == 0 &&
			r.now-m.heardAt <= r.cfg.ElectionTimeout && m.follows() == r.eCur {
			k++
		}
	}
	return k
}

// fullStepDown: a leader whose disk has been full for fullStepDownAfter
// election timeouts hands the group over when a majority of the others
// can log and follow it (they elect without us; we do not stand while
// full). It waits that long so that the others had the time to find out
// whether their disks are full too (a write or a probe, walCommit): a
// follower that has not written since the disk filled does not know it
// yet, and handing over to it would make the group elect leaders that
// then refuse (found by TestSimDiskFullProbe).
func (r *Replica) fullStepDown() bool {
	d := r.dur
	if d == nil || !d.full || r.knobs.fullNoStepDown || r.now-d.fullSince < fullStepDownAfter*r.cfg.ElectionTimeout || r.othersCanLog() < r.quorum {
		return false
	}
	r.ctr.DiskFullStepDowns++
	r.tracef("node %d: its disk has been full since %v: leader hands over epoch %v", r.self, d.fullSince, r.eCur)
	r.startElection(true)
	return true
}

// recoveryVoter reports whether this member restarted from its disk in
// Async mode and waits for a recovery election: catching up (it may have
// acknowledged entries its disk lost), but with its log replayed.
func (r *Replica) recoveryVoter() bool {
	return r.fromDisk && r.catchingUp && r.dur != nil && r.cfg.Durability == Async
}

// awaitsRecovery reports whether this member restarted in Async mode
// without its memory and waits for a recovery election: a recovery
// voter, or a member whose log recovery could not replay (Repair: a
// SnapMark naming a snapshot that never became durable, or corruption),
// which counts among the members that lost their memory (recoveryReady's
// (i): at most a minority kept it) and joins votes (repairVoter). Without
// it, a majority crash that left one member restarted from its disk and
// one in Repair could never elect: the member that kept its memory needs
// a vote, and the one from its disk votes only in a recovery election,
// which needed a majority of recovery voters (kv's TestSimDurable,
// async-majority seed 9, once an install's save waited for its diff's
// sync); nor could a whole-group crash that left two of three members
// in Repair (async-staggered seed 57).
func (r *Replica) awaitsRecovery() bool {
	return r.recoveryVoter() || r.repairVoter()
}

// repairVoter reports whether this member restarted in Async mode in
// Repair (its log not replayed) and waits for a recovery election. It
// counts among the members that lost their memory (recoveryReady's (i))
// and votes, but only to join a candidate whose Acpt is at least what
// its disk held before the install that never became durable
// (Recovery.held; zero for a corrupt log): it has no state to lead with,
// and a winner below that could lose entries a majority's disks hold
// (TestSimAsyncRepairHeld: a from-disk member with a shorter log would
// win with its vote while the member whose disk holds the most is down).
func (r *Replica) repairVoter() bool {
	return r.repair && r.catchingUp && r.dur != nil && r.cfg.Durability == Async && !r.knobs.repairUncounted
}

// repairHeld is a Repair member's Acpt in a recovery election
// (repairVoter).
func (r *Replica) repairHeld() MsgHdr {
	if rc := r.cfg.Recovery; rc != nil && !r.knobs.repairVoteZero {
		return rc.held
	}
	return MsgHdr{}
}

// Durable is the header of the last accepted entry (or diff) on disk, dA:
// what recovery would give back now. Accepted in Memory mode.
func (r *Replica) durableHdr() MsgHdr {
	if r.dur == nil {
		return r.accepted
	}
	return r.dur.dA
}

// walAppend appends one record; a refusal (the writer failed, or its queue
// is full) stops the replica: a record missing from the middle of the log
// would make a later dA claim entries the disk does not hold.
func (r *Replica) walAppend(typ wal.RecType, flags uint8, parts ...[]byte) uint64 {
	return r.walAdd(false, typ, flags, parts)
}

// walAdd is walAppend; lazy appends with wal.Writer.AppendLazy (the
// record does not start a batch of its own in Sync mode).
func (r *Replica) walAdd(lazy bool, typ wal.RecType, flags uint8, parts [][]byte) uint64 {
	d := r.dur
	if d.err != nil {
		return 0
	}
	// The parts go to the WAL interface through d.parts: the callers'
	// slices then stay on their stacks (passed on directly they escaped,
	// an allocation a record on every replica: branch asy5).
	if len(parts) > len(d.parts) {
		panic(fmt.Sprintf("broadcast: a %d-part log record (at most %d)", len(parts), len(d.parts)))
	}
	p := d.parts[:copy(d.parts[:], parts)]
	var seq uint64
	var ok bool
	if lazy && !r.knobs.eagerCommit {
		seq, ok = d.w.AppendLazy(typ, flags, p...)
	} else {
		seq, ok = d.w.AppendFlags(typ, flags, p...)
	}
	clear(d.parts[:]) // the records' data is not kept alive
	if !ok {
		d.err = d.w.Err()
		if d.err == nil {
			d.err = fmt.Errorf("the writer refused a %d-byte record (%d bytes unsynced)", recLen(parts), d.w.Stats().UnsyncedBytes)
		}
		d.err = fmt.Errorf("%w: member %d: %w", ErrDisk, r.self, d.err)
		r.tracef("node %d stops: %v", r.self, d.err)
	}
	return seq
}

func recLen(parts [][]byte) int {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return n
}

// walMark notes that the record seq made hdr our Accepted.
func (r *Replica) walMark(seq uint64, hdr MsgHdr) {
	if seq != 0 {
		r.dur.ring = append(r.dur.ring, durMark{seq: seq, hdr: hdr})
	}
}

// walEntry appends e as an Entry record and returns its seq.
func (r *Replica) walEntry(e *entry, flags uint8) uint64 {
	b := r.dur.hdr[:32]
	binary.LittleEndian.PutUint64(b[0:], uint64(e.hdr.E))
	binary.LittleEndian.PutUint64(b[8:], e.hdr.Cnt)
	putMeta(b[16:], e.id)
	return r.walAppend(wal.RecEntry, flags, b, e.data)
}

// walAccept logs an entry this replica accepted (follower, Fig. 5 l.49) or
// broadcast (leader, Fig. 4 l.40) as its new Accepted.
func (r *Replica) walAccept(e *entry) {
	if r.dur != nil {
		seq := r.walEntry(e, 0)
		r.walMark(seq, e.hdr)
		r.walUnit(seq, e.hdr)
	}
}

// DiskSnapSaving reports whether a disk snapshot is under way (polling
// goroutine, between Polls): a capture being persisted off Poll, a
// snapshot a diff installed waiting for the store, or a save in the store
// (its files written, synced, renamed, older ones removed); false once
// the replica stopped on a disk error. kvserver's
// /status counts the passes of a leader's poller that overlap one
// (issue 19 bounds them). It is a statistic's input: nothing in the
// protocol reads it.
func (r *Replica) DiskSnapSaving() bool {
	d := r.dur
	if d == nil || r.cfg.Snapshots == nil || d.err != nil {
		return false // a stopped replica writes nothing more
	}
	return d.snapJob != nil || d.net != nil || d.netSaving != nil || r.cfg.Snapshots.Busy()
}

// cutUnits forgets the units at or below at and returns the seq the log
// may be dropped before once a snapshot at at is durable: the first unit
// above at, or the next seq if there is none.
func (d *durable) cutUnits(at MsgHdr) uint64 {
	drop, k := d.w.NextSeq(), 0
	for k < len(d.units) && !at.Less(d.units[k].hdr) {
		k++
	}
	if k < len(d.units) {
		drop = d.units[k].seq
	}
	d.units = d.units[:copy(d.units, d.units[k:])]
	return drop
}

// walUnit notes a unit (an entry, or a diff from its DiffBegin) for
// truncation behind a disk snapshot.
func (r *Replica) walUnit(seq uint64, hdr MsgHdr) {
	if seq != 0 && r.cfg.Snapshots != nil {
		r.dur.units = append(r.dur.units, durMark{seq: seq, hdr: hdr})
	}
}

// walDiff logs a diff accepted with base: a SnapMark naming its snapshot
// (at snapAt, index snapIdx; meta, state) if it installs one, its entries,
// and its end, the point from which it is replayed as one unit. The
// snapshot itself goes to the disk snapshot store (diskSnapPoll).
func (r *Replica) walDiff(hdr, base MsgHdr, entries []*entry, snapAt MsgHdr, snapIdx uint64, meta, state []byte) {
	if r.dur == nil {
		return
	}
	b := r.dur.hdr[:40]
	binary.LittleEndian.PutUint64(b[0:], uint64(hdr.E))
	binary.LittleEndian.PutUint64(b[8:], hdr.Cnt)
	binary.LittleEndian.PutUint64(b[16:], uint64(base.E))
	binary.LittleEndian.PutUint64(b[24:], base.Cnt)
	binary.LittleEndian.PutUint32(b[32:], uint32(len(entries)))
	var flags uint32
	if meta != nil {
		flags = diffSnapshot
	}
	binary.LittleEndian.PutUint32(b[36:], flags)
	d := r.dur
	if meta != nil {
		// Everything logged before this diff is below the snapshot or
		// removed by the diff: the diff is the log's first unit.
		d.units = d.units[:0]
	}
	begin := r.walAppend(wal.RecDiffBegin, 0, b)
	r.walUnit(begin, hdr)
	var ns *netSnapSave
	if meta != nil {
		s := d.hdr[:24]
		binary.LittleEndian.PutUint64(s[0:], uint64(snapAt.E))
		binary.LittleEndian.PutUint64(s[8:], snapAt.Cnt)
		binary.LittleEndian.PutUint64(s[16:], snapIdx)
		seq := r.walAppend(wal.RecSnapMark, 0, s)
		if d.gate == 0 && !r.knobs.ackBeforeSnapSync {
			d.gate = seq
		}
		ns = &netSnapSave{at: snapAt, index: snapIdx, begin: begin}
	}
	for _, e := range entries {
		r.walEntry(e, recInDiff)
	}
	b = d.hdr[:16]
	binary.LittleEndian.PutUint64(b[0:], uint64(hdr.E))
	binary.LittleEndian.PutUint64(b[8:], hdr.Cnt)
	end := r.walAppend(wal.RecDiffEnd, 0, b)
	r.walMark(end, hdr)
	if ns != nil {
		ns.end = end
		r.saveNetSnap(ns, meta, state)
	}
}

// saveNetSnap queues the network snapshot a diff installed for the disk
// snapshot store: its file image is built off Poll (runPersist), then
// diskSnapPoll hands it to the store. A newer one replaces one not yet in
// the store (the gate stays at the older SnapMark: the newer snapshot
// covers it). A periodic capture under way is abandoned: it is older.
func (r *Replica) saveNetSnap(ns *netSnapSave, meta, state []byte) {
	d := r.dur
	d.net = ns
	d.snapJob = nil
	member, now := uint64(r.self), r.now
	if r.cfg.Snapshots != nil {
		member = r.cfg.Snapshots.member
	}
	r.tracef("node %d saves the snapshot at %v (index %d, %d bytes) its diff installed", r.self, ns.at, ns.index, len(state))
	r.startPersist(persistDiff, func() {
		ns.img = encodeSnapFile(ns.index, ns.at, member, now, meta, state)
		ns.done.Store(true)
		r.node.Doorbell().Ring()
	})
}

// walCommit logs the commit point when it moved, at most once per batch
// of the writer: only once the previous Commit record is synced. The
// record is lazy (wal.Writer.AppendLazy): in Sync mode it rides with the
// next batch of entries instead of costing an fsync of its own, which the
// next entry's batch would wait for (one batch in flight). Recovery may
// then find a lower commit point, as after any crash before the record's
// batch was synced: replay delivers less and the group commits the rest
// again.
//
// A writer that took no record for fullProbeEvery election timeouts is
// checked for a full disk although the commit point did not move
// (idleProbe): a probe record (not lazy: written and synced now) when
// its disk is low on space ("A full disk").
func (r *Replica) walCommit() {
	d := r.dur
	if seq := d.w.NextSeq(); seq != d.idleSeq {
		d.idleSeq, d.idleSince = seq, r.now
		d.spaceAsked = false // a record went out: the round starts again
	}
	if d.err != nil || d.full || d.commitSeq > d.w.Synced() {
		return
	}
	probe := r.now-d.idleSince >= fullProbeEvery*r.cfg.ElectionTimeout && !r.knobs.noFullProbe && r.idleProbe()
	if d.commitLogged == r.committed && !probe {
		return
	}
	if probe {
		r.ctr.DiskProbes++
	}
	b := d.hdr[:32]
	binary.LittleEndian.PutUint64(b[0:], uint64(r.committed.E))
	binary.LittleEndian.PutUint64(b[8:], r.committed.Cnt)
	binary.LittleEndian.PutUint64(b[16:], r.index)
	binary.LittleEndian.PutUint64(b[24:], r.seenIdx) // async loss counting (election.go, recoveryLoss)
	if seq := r.walAdd(!probe, wal.RecCommit, 0, [][]byte{b}); seq != 0 {
		d.commitSeq, d.commitLogged = seq, r.committed
	}
}

// idleProbe runs an idle writer's round (walCommit, fullProbeEvery
// election timeouts without a record) and reports whether it needs a
// probe record now. A probe costs a write and an fsync, so the round
// first asks the device how much space the log's file system has left
// (wal.Writer.CheckSpace: statfs on the device's goroutine, a few
// microseconds and no disk IO); the answer comes at a later Poll. Only a
// low answer (below wal.Config.LowSpaceBytes: two segments and twice the
// writer's queue), or none (the query failed, or the file system cannot
// say), gets the probe: a write that could find the disk full soon. With
// space to spare the round ends without one, and the next starts
// fullProbeEvery election timeouts later: an idle member with space
// syncs nothing, and a disk that fills is still found within a round
// (plus the query's and the probe's IO).
func (r *Replica) idleProbe() bool {
	d := r.dur
	if r.knobs.probeAlways {
		return true
	}
	if !d.spaceAsked {
		d.w.CheckSpace()
		d.spaceAsked, d.spaceN = true, d.w.Space().N
		return false
	}
	sp := d.w.Space()
	if sp.N == d.spaceN {
		return false // not answered yet
	}
	d.spaceAsked = false
	r.ctr.DiskSpaceChecks++
	if d.w.SpaceLow(sp) && !r.knobs.spaceAlwaysPlenty {
		return true
	}
	d.idleSince = r.now // plenty: no probe this round
	return false
}

// walPoll polls the writer and moves dA to the last synced mark. It
// reports whether anything happened.
func (r *Replica) walPoll(now time.Duration) bool {
	d := r.dur
	if r.cfg.Durability == Async {
		// The writer syncs at least every FsyncInterval, whatever its
		// own interval (NextDeadline asks for this Poll).
		if o := d.w.OldestUnsynced(); o >= 0 && now-o >= r.cfg.FsyncInterval && o != d.flushedFor {
			d.w.Flush()
			d.flushedFor = o
		}
	}
	progress := d.w.Poll(now)
	if d.err == nil && d.w.Err() != nil && !d.w.Full() {
		d.err = fmt.Errorf("%w: member %d: %w", ErrDisk, r.self, d.w.Err())
		r.tracef("node %d stops: %v", r.self, d.err)
	}
	if full := d.err == nil && d.w.Full(); full != d.full {
		// A full disk is not fail-stop: the writer retries the batch it
		// cut back; meanwhile the replica takes nothing new (diskFull).
		d.full = full
		progress = true
		if full {
			d.fullSince, d.fullErr = now, d.w.Err()
			r.ctr.DiskFull++
			r.tracef("node %d: disk full, takes no new entry until space returns: %v", r.self, d.w.Err())
			if r.cfg.OnEvent != nil {
				r.cfg.OnEvent(Event{Kind: EventDiskFull, Epoch: r.eCur, Err: d.w.Err()})
			}
		} else {
			r.tracef("node %d: disk space returned after %v", r.self, now-d.fullSince)
			r.event(EventDiskSpace, r.eCur)
		}
	}
	synced := d.w.Synced()
	if d.gate == 0 && d.netEnd != 0 && d.netEnd <= synced {
		// The network snapshot and its diff are durable: the log below
		// the diff is covered.
		d.cut, d.netDrop, d.netEnd = d.netDrop, 0, 0
		d.w.DropBefore(d.cut)
	}
	k := 0
	for k < len(d.ring) && d.ring[k].seq <= synced && (d.gate == 0 || d.ring[k].seq < d.gate) {
		d.dA = d.ring[k].hdr
		k++
	}
	if k > 0 {
		n := copy(d.ring, d.ring[k:])
		d.ring = d.ring[:n]
		progress = true
	}
	if r.cfg.Durability == Async {
		r.countLate(now)
	}
	return progress
}

// countLate follows Async's back-pressure spells for the counters: a
// statistic (nothing in the protocol reads it).
func (r *Replica) countLate(now time.Duration) {
	d := r.dur
	late := r.diskLate()
	switch {
	case late && !d.late:
		d.late, d.lateSince = true, now
		r.ctr.DiskLateSpells++
	case !late && d.late:
		d.late = false
		r.ctr.DiskLateNanos += uint64(max(0, now-d.lateSince))
	}
}

// Recovery is a log read back by Recover, checked, for New to replay.
type Recovery struct {
	recs []wal.Record
	snap *DiskSnap // the disk snapshot the log continues (nil: none)
	// Repair: the log has corruption (wal.Recovered.Corrupt); it is not
	// replayed and the member boots catching up (no vote) until a
	// leader's diff repaired it. Corruption repair in place is not built.
	Repair bool
	// Reason says why Repair is set.
	Reason string
	// held (Repair for a SnapMark naming a snapshot not on disk): the
	// last header the log accepted before the first diff whose snapshot
	// is missing, at least the loaded snapshot's: what the disk held
	// before that diff. A member in Repair votes with it in a recovery
	// election, joining only (awaitsRecovery).
	held MsgHdr
	// Entries, Diffs and Commits count the records of each kind.
	Entries, Diffs, Commits int
}

// release drops what New replayed: the log's records (whose bytes are
// wal.Recover's read buffers) and the disk snapshot's image. Repair,
// Reason, held and the counts stay. Kept, they held every read buffer
// and the whole snapshot file for the replica's life (~145 MB of buffers
// a replica after replaying a 1 M-record log): the entries the replica
// keeps in its log hold only their own buffers, until they are pruned.
func (rc *Recovery) release() {
	if rc.snap != nil {
		rc.snap.recycle() // LoadForReuse's image: to the next replica's load
	}
	rc.recs, rc.snap = nil, nil
}

// Recover checks a log wal.Recover read back: every record is one this
// package writes, well formed, diffs complete, and the log starts at its
// first record (RecoverFrom: or continues a disk snapshot). A log
// with corruption is returned with Repair set, not replayed. It reads the
// records only; New replays them.
func Recover(rec *wal.Recovered) (*Recovery, error) { return RecoverFrom(rec, nil) }

// RecoverFrom is Recover for a log that continues the disk snapshot snap
// (LoadFor's; nil: none): the log may then start after seq 1, and
// records at its start that belong to a diff whose beginning was dropped
// with the segments below the snapshot are left out (they are older than
// the snapshot). Replay starts from the snapshot and skips what it
// covers.
func RecoverFrom(rec *wal.Recovered, snap *DiskSnap) (*Recovery, error) {
	return recoverFrom(rec, snap, recoverKnobs{})
}

func recoverFrom(rec *wal.Recovered, snap *DiskSnap, k recoverKnobs) (*Recovery, error) {
	rc := &Recovery{snap: snap}
	if rec == nil {
		return rc, nil
	}
	if snap != nil && len(rec.Corrupt) == 0 {
		k := 0
		for k < len(rec.Records) {
			x := &rec.Records[k]
			if x.Type == wal.RecEntry && x.Flags&recInDiff != 0 || x.Type == wal.RecSnapMark || x.Type == wal.RecDiffEnd {
				k++
				continue
			}
			break
		}
		if k > 0 {
			rec.Records = rec.Records[k:]
		}
	}
	if len(rec.Corrupt) > 0 {
		c := rec.Corrupt[0]
		rc.Repair = true
		rc.Reason = fmt.Sprintf("corrupt log at %s+%d (seq %d-%d: %s): catching up from the group, not replaying it", c.Path, c.At.Off, c.FromSeq, c.ToSeq, c.Reason)
		return rc, nil
	}
	if snap == nil && len(rec.Segments) > 0 && rec.Segments[0].FirstSeq > 1 {
		return nil, fmt.Errorf("broadcast: log %s starts at seq %d, not 1 (no disk snapshot to start from): %w", rec.Segments[0].Path, rec.Segments[0].FirstSeq, ErrLogCorrupt)
	}
	inDiff, left := false, 0
	lastMark, markBegin, begin := -1, 0, 0 // the last SnapMark, its DiffBegin; the current DiffBegin
	whole := -1                            // the last diff from base 0 (fromZero)
	for i := range rec.Records {
		x := &rec.Records[i]
		bad := func(why string) error {
			return fmt.Errorf("broadcast: log record seq %d (type %d) at %+v: %s: %w", x.Seq, x.Type, x.Pos, why, ErrLogCorrupt)
		}
		switch x.Type {
		case wal.RecEntry:
			if len(x.Data) < 32 {
				return nil, bad("entry too short")
			}
			if (x.Flags&recInDiff != 0) != inDiff {
				return nil, bad("entry flag and diff disagree")
			}
			if inDiff {
				if left == 0 {
					return nil, bad("more entries than the diff announced")
				}
				left--
			}
			rc.Entries++
		case wal.RecDiffBegin:
			if len(x.Data) != 40 || inDiff {
				return nil, bad("malformed or nested diff")
			}
			inDiff, left, begin = true, int(binary.LittleEndian.Uint32(x.Data[32:])), i
			if fromZero(x) {
				whole = i
			}
		case wal.RecSnapMark:
			if !inDiff || len(x.Data) != 24 {
				return nil, bad("snapshot record outside a diff or malformed")
			}
			lastMark, markBegin = i, begin
		case wal.RecDiffEnd:
			if len(x.Data) != 16 || !inDiff || left != 0 {
				return nil, bad("diff end without its begin or entries")
			}
			inDiff = false
			rc.Diffs++
		case wal.RecCommit:
			if len(x.Data) != 32 {
				return nil, bad("malformed commit")
			}
			rc.Commits++
		default:
			return nil, bad("unknown record type")
		}
	}
	if inDiff {
		return nil, fmt.Errorf("broadcast: log ends inside a diff (wal.Recover should have dropped it): %w", ErrLogCorrupt)
	}
	if lastMark >= 0 {
		x := &rec.Records[lastMark]
		at := getHdr(x.Data)
		if (snap == nil || snap.At.Less(at)) && whole > lastMark {
			// A diff from base 0 after the SnapMark replaced the whole
			// Log (Fig. 5 l.62-63): the log from it on continues the
			// snapshot loaded (or none), and what it holds before is
			// superseded. This is a member that booted in Repair for
			// that SnapMark and that a leader then synced from its empty
			// commit point (Fig. 7 l.119-123; nothing pruned, so no
			// snapshot): without the cut, every later crash before its
			// next disk snapshot or install booted it in Repair again.
			rc.recs = rec.Records[whole:]
			return rc, nil
		}
		if snap == nil || snap.At.Less(at) {
			// The snapshot the last SnapMark names is not on disk (never
			// made durable, so nothing from its diff on was
			// acknowledged; or lost, or set aside as corrupt): boot
			// catching up, as for corruption.
			rc.Repair = true
			rc.Reason = fmt.Sprintf("log record seq %d names the snapshot %s, which is not on disk: catching up from the group, not replaying the log", x.Seq, SnapName(binary.LittleEndian.Uint64(x.Data[16:]), at))
			rc.held = heldBeforeMissing(rec.Records, snap)
			return rc, nil
		}
		if in := lastInstall(rec.Records[markBegin:]); in.stale(snap.At) && !k.staleSnapUsed {
			// LoadFor never returns such a snapshot (it removes it and
			// starts from the one the mark names): this is a caller
			// that chose the snapshot without the log. It holds state
			// the group no longer has; boot catching up.
			rc.Repair = true
			rc.Reason = fmt.Sprintf("the disk snapshot %s predates the log's last diff (epoch %v), which installed %s: catching up from the group, not replaying the log", SnapName(snap.Index, snap.At), in.diff.E, SnapName(in.index, in.at))
			return rc, nil
		}
		// The diff installed the whole state: what the log holds before
		// it is superseded (among it, SnapMarks of an incarnation that
		// booted catching up, naming snapshots never made durable).
		rec.Records = rec.Records[markBegin:]
	}
	rc.recs = rec.Records
	return rc, nil
}

// fromZero reports whether the DiffBegin record x is of a diff from base
// 0: it replaces the whole Log.
func fromZero(x *wal.Record) bool {
	return len(x.Data) == 40 && getHdr(x.Data[16:]) == MsgHdr{}
}

// heldBeforeMissing is the last header recs accepted (an entry outside a
// diff, or a diff's end) before the first SnapMark naming a snapshot that
// snap does not cover, and at least snap's header: the state the disk
// held before the first install that never became durable.
func heldBeforeMissing(recs []wal.Record, snap *DiskSnap) MsgHdr {
	var a MsgHdr
	for i := range recs {
		x := &recs[i]
		switch {
		case x.Type == wal.RecSnapMark && (snap == nil || snap.At.Less(getHdr(x.Data))):
			if snap != nil {
				a = maxHdr(a, snap.At)
			}
			return a
		case x.Type == wal.RecEntry && x.Flags&recInDiff == 0, x.Type == wal.RecDiffEnd:
			a = getHdr(x.Data)
		}
	}
	return a
}

// install is what a log says about the last network snapshot a diff
// installed (walDiff): the snapshot its SnapMark names (at, index), the
// diff's header and the headers of its entries.
type install struct {
	ok      bool
	markSeq uint64
	at      MsgHdr
	index   uint64
	diff    MsgHdr
	entries []MsgHdr
}

// lastInstall finds the last complete diff of recs that installed a
// snapshot (a SnapMark between its DiffBegin and its DiffEnd). It skips
// what it does not understand: recoverFrom checks the records.
func lastInstall(recs []wal.Record) install {
	var cur, last install
	in := false
	for i := range recs {
		x := &recs[i]
		switch x.Type {
		case wal.RecDiffBegin:
			cur, in = install{diff: getHdr(x.Data)}, len(x.Data) == 40
		case wal.RecSnapMark:
			if in && len(x.Data) == 24 {
				cur.ok, cur.markSeq, cur.at, cur.index = true, x.Seq, getHdr(x.Data), binary.LittleEndian.Uint64(x.Data[16:])
			}
		case wal.RecEntry:
			if in && cur.ok && x.Flags&recInDiff != 0 && len(x.Data) >= 16 {
				cur.entries = append(cur.entries, getHdr(x.Data))
			}
		case wal.RecDiffEnd:
			if in && cur.ok {
				last = cur
			}
			in = false
		}
	}
	return last
}

// stale reports that a disk snapshot at at predates the install: it lies
// above the snapshot the diff installed and below the diff, so it was
// taken before the diff replaced the state (in Async mode, a recovery that
// lost entries this member had delivered rolls it back with such a diff:
// diffReset), and may hold entries the group no longer has. A snapshot
// taken after the diff is at or above the diff's header, or at one of
// its entries (a commit point inside it); the latter is the group's state
// whenever it was taken (one header, one entry).
func (in *install) stale(at MsgHdr) bool {
	return in.ok && in.at.Less(at) && at.Less(in.diff) && !slices.Contains(in.entries, at)
}

func getHdr(b []byte) MsgHdr {
	return MsgHdr{E: Epoch(binary.LittleEndian.Uint64(b[0:])), Cnt: binary.LittleEndian.Uint64(b[8:])}
}

// replay rebuilds the protocol state from the log (plan §4 D2, recovery
// steps 3-5): entries into the Log, diffs as units (remove above the
// base, insert, E_cur and Accepted), the commit point; then it delivers
// the committed entries to the FSM in order and bounds the Log as prune
// would. It runs in New, before anything is published.
func (r *Replica) replay(rc *Recovery) error {
	type pend struct {
		seq       uint64 // the DiffBegin's
		hdr, base MsgHdr
		entries   []entry
	}
	var diff *pend
	var delivered MsgHdr // entries at or below it are in the FSM already (a snapshot's)
	var commitIdx uint64
	if sn := rc.snap; sn != nil {
		m, err := decodeSnapMeta(sn.Meta, r.cfg.Members)
		if err != nil {
			return fmt.Errorf("broadcast: disk snapshot %s: %w", sn.Path, err)
		}
		if hashChunked(sn.State) != m.stateCheck {
			return fmt.Errorf("broadcast: disk snapshot %s: state check mismatch: %w", sn.Path, ErrLogCorrupt)
		}
		if err := r.restore(&m, sn.State, sn.At); err != nil {
			return fmt.Errorf("broadcast: disk snapshot %s: restore: %w", sn.Path, err)
		}
		delivered, commitIdx = sn.At, m.index
		r.accepted, r.eCur = sn.At, sn.At.E
	}
	for i := range rc.recs {
		x := &rc.recs[i]
		switch x.Type {
		case wal.RecEntry:
			hdr := getHdr(x.Data)
			if diff == nil {
				r.walUnit(x.Seq, hdr)
				if !delivered.Less(hdr) {
					continue // covered by the disk snapshot
				}
			}
			id := getMeta(x.Data[16:])
			// The entry keeps the record's bytes where wal.Recover read
			// them (memory of the recovery's own, never reused or
			// written), not a copy in a slab (issue 19: the copy and
			// its fresh slabs' page faults were ~12% of a 1 M-record
			// log's replay). Capped: nothing appends over the next
			// record.
			n := len(x.Data)
			e := entry{hdr: hdr, id: id, data: x.Data[32:n:n]}
			if diff != nil {
				diff.entries = append(diff.entries, e)
				continue
			}
			if hdr.E != r.accepted.E || hdr.Cnt != r.accepted.Cnt+1 {
				return fmt.Errorf("broadcast: log entry %v at seq %d does not follow Accepted %v: %w", hdr, x.Seq, r.accepted, ErrLogCorrupt)
			}
			r.log.Set(e)
			r.accepted = hdr
		case wal.RecDiffBegin:
			diff = &pend{seq: x.Seq, hdr: getHdr(x.Data), base: getHdr(x.Data[16:])}
		case wal.RecSnapMark:
			// RecoverFrom checked that the disk snapshot covers it.
		case wal.RecDiffEnd:
			r.walUnit(diff.seq, diff.hdr)
			if !delivered.Less(diff.hdr) {
				for _, e := range diff.entries { // a diff the disk snapshot covers
					e.slab.unref()
				}
				diff = nil
				continue
			}
			for {
				last, ok := r.log.Max()
				if !ok || !diff.base.Less(last.hdr) {
					break
				}
				r.log.PopMax()
			}
			for _, e := range diff.entries {
				if !delivered.Less(e.hdr) {
					e.slab.unref() // in the FSM already
					continue
				}
				r.log.Set(e)
			}
			r.eCur = diff.hdr.E
			r.accepted = diff.hdr
			diff = nil
		case wal.RecCommit:
			r.seenIdx = max(r.seenIdx, binary.LittleEndian.Uint64(x.Data[16:]), binary.LittleEndian.Uint64(x.Data[24:]))
			if h := getHdr(x.Data); r.committed.Less(h) {
				r.committed = h
				commitIdx = binary.LittleEndian.Uint64(x.Data[16:])
			}
		}
	}
	if r.eCur > r.eNew {
		return fmt.Errorf("broadcast: the log holds epoch %v, the stable state promised only %v: %w", r.eCur, r.eNew, ErrLogCorrupt)
	}
	if r.accepted.Less(r.committed) {
		return fmt.Errorf("broadcast: the log's commit point %v is above its last entry %v: %w", r.committed, r.accepted, ErrLogCorrupt)
	}
	// Recovery step 4: the FSM (and the keyed table) to the commit point.
	for i := r.log.above(delivered); i < r.log.Len(); i++ {
		e := r.log.at(i)
		if r.committed.Less(e.hdr) {
			break
		}
		r.deliver(e)
	}
	if commitIdx != 0 && r.index != commitIdx {
		return fmt.Errorf("broadcast: replay delivered %d entries up to %v, the log's commit record says %d: %w", r.index, r.committed, commitIdx, ErrLogCorrupt)
	}
	for r.log.above(r.committed) > r.cfg.MaxLogEntries {
		e, _ := r.log.Min()
		r.pruned = maxHdr(r.pruned, e.hdr)
		r.log.PopMin()
	}
	r.dur.dA = r.accepted
	r.dur.commitLogged = r.committed
	if sn := rc.snap; sn != nil {
		// The log below the first unit above the snapshot is covered (a
		// crash may have come between the save and its drop).
		r.dur.cut = r.dur.cutUnits(sn.At)
		r.dur.w.DropBefore(r.dur.cut)
	}
	r.fromDisk = true
	r.tracef("node %d replays its log: %d entries, %d diffs, %d commits: accepted %v, committed %v (index %d), e_cur %v", r.self, rc.Entries, rc.Diffs, rc.Commits, r.accepted, r.committed, r.index, r.eCur)
	return nil
}
