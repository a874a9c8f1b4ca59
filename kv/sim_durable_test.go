package kv

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
	"github.com/rdmakv/rdmakv/wal"
)

// The kv simulator with durable replicas (issue 19): every replica keeps
// its log (wal.Writer) and its snapshots (broadcast.SnapStore) on its
// node's sim.Disk, whose crash model loses unsynced writes and tears the
// last one, and restarts from the disk image its crash left. On top of
// the random crashes and partitions of kvOpts, whole groups crash at one
// instant (all members restarted from their disks, at once or one by
// one) and majorities crash at one instant. The history is checked with
// kvcheck.CheckDurable where an outage may have lost something (sync:
// nothing acknowledged lost; async: only writes acknowledged inside the
// fsync window, counted), else with the linearizability check as in
// memory mode; stale-ok gets with kvcheck.CheckStale.

// kvDurable is kvOpts.durable: the replicas' durability and the crashes
// that need it.
type kvDurable struct {
	// mode is broadcast.Sync or broadcast.Async (Memory: the zero value,
	// no disk).
	mode broadcast.Durability
	// wholeGroup crashes every member of a random group at one instant,
	// that many times, and restarts each from its disk image after 1-4
	// ms; staggered spreads the restarts (one by one, up to 9 ms more).
	wholeGroup int
	staggered  bool
	// majority crashes a majority of a random group at one instant, that
	// many times, restarted from their disks after 1-4 ms: the group
	// cannot elect until they are back.
	majority int
	// fsyncInterval is the async replicas' FsyncInterval (0: 1 ms).
	fsyncInterval time.Duration
	// snapLog is SnapshotLogBytes (0: only the snapshots diffs install
	// go to disk): disk snapshots and log truncation run constantly.
	snapLog int64
	// isolated: before the one whole-group crash (wholeGroup must be
	// 0), a member of group 0 crashes, restarts from its disk 1 ms later
	// cut off from the rest of its group, and the whole group crashes 3
	// windows after that: a member crashed earlier and not synced again,
	// whose crash the async window counts from.
	isolated bool
	// downOnly plants the earlier reading of the async window (too
	// strict): from the first crash of the members down at the outage
	// only, not of a member restarted and not synced again.
	downOnly bool
	// dropTail plants a bug: a member restarted after a whole-group
	// outage finds the last dropTail records of its log gone (synced or
	// not) before it recovers, as a disk that acknowledged syncs it did
	// not do. TestSimDurableMutants.
	dropTail int
}

func (d *kvDurable) fsyncIvl() time.Duration { return cmp.Or(d.fsyncInterval, time.Millisecond) }

// window is how long before an outage's start (the crash of the whole
// group, or the first crash of a member not synced again since:
// crashGroup) a write acknowledged in async mode may still be lost (the
// reasoning of broadcast's asyncBound):
// a record waits at most FsyncInterval for its batch to start, then for
// the batch in flight and its own (2 x FsyncInterval plus two syncs:
// back-pressure holds the oldest unsynced record to 2 x FsyncInterval),
// plus a millisecond of slack for the commit to reach the replica that
// acknowledges. The history's clock is the clients': a reply seen later
// than the replica sent it counts as later, which is on the lenient side.
func (d *kvDurable) window() time.Duration {
	return 2*d.fsyncIvl() + 2*sim.DefaultSyncMax + time.Millisecond
}

// durRun is a run's durable state: the outages, the final reads.
type durRun struct {
	h    *kvRun
	o    kvDurable
	outs []*outage
	// unsynced: the members whose disks may lack what they acknowledged
	// before a crash: crashed and not synced again since (async loss
	// bound: the window counts from the first of those crashes).
	unsynced map[rdma.NodeID]*unsynced
	// restarted: the node's next start follows a whole-group outage
	// (dropTail plants there).
	restarted map[rdma.NodeID]bool
	all       []*kvRepProc // every incarnation
	// read: per client slot, how many keys of its share it began to read
	// after the load (finalReads).
	read map[int]int
	keys []string // finalKeys
	// checkedAt: when invariant last looked at the replicas' disks
	checkedAt time.Duration
	ctr       struct {
		wholeGroup, majority, dropped, clientRestarts int
	}
	lost int // CheckDurable's count (async)
	// isolatedAt: when kvDurable.isolated crashed its member
	isolatedAt time.Duration
	// relayed: parts of batches across groups checked as of unknown
	// outcome (relayedParts)
	relayed int
}

// unsynced is a member that crashed (first at crash) and was not synced
// again since: a leader's sync (or a recovery election) ends its catching
// up, it delivered at least target (the most any member of its group had
// delivered when it crashed, 0 after an outage, whose recovery may lose
// entries: then catching up is the sign), and that reached its disk,
// window() later. syncedAt < 0: not synced yet.
type unsynced struct {
	crash, syncedAt time.Duration
	target          uint64
}

// outage is a whole-group or majority crash of group g.
type outage struct {
	g          int
	start, end time.Duration // end < 0: not known yet (a majority crash)
	whole      bool
	epoch      broadcast.Epoch // majority: the highest epoch at the crash
	restartAt  time.Duration   // majority: the first restart
}

func newDurRun(h *kvRun) *durRun {
	return &durRun{h: h, o: h.o.durable, unsynced: map[rdma.NodeID]*unsynced{}, restarted: map[rdma.NodeID]bool{}, read: map[int]int{}}
}

// open gives a replica starting on env its durable state: the newest
// valid disk snapshot and the log read back from its disk, the log's
// writer and the snapshot store on one device of its disk, as
// broadcast's simulator and internal/server.OpenDurable wire them.
func (d *durRun) open(p *kvRepProc, bc *broadcast.Config) error {
	env, id := p.env, p.env.ID()
	if d.o.dropTail > 0 && d.restarted[id] {
		if err := d.dropLogTail(env.Disk(), id); err != nil {
			return err
		}
	}
	delete(d.restarted, id)
	rec, err := wal.Recover(env.Disk(), "wal", uint64(id))
	if err != nil {
		return fmt.Errorf("recoverable: node %d incarnation %d: the log: %w", id, env.Incarnation(), err)
	}
	snap, warn, err := broadcast.LoadFor(env.Disk(), "snap", rec)
	for _, w := range warn {
		if err == nil && !broadcast.StaleWarning(w) {
			// The sim plants no corruption in snapshots (a stale file
			// removed: a crash inside an install's window).
			err = fmt.Errorf("%q", warn)
		}
	}
	if err != nil {
		return fmt.Errorf("recoverable: node %d incarnation %d: snapshots: %v", id, env.Incarnation(), err)
	}
	if err := env.Disk().MkdirAll("snap", 0o755); err != nil {
		return err
	}
	dev, snapDev := wal.Share(env.DiskDevice())
	mode := wal.Sync
	if d.o.mode == broadcast.Async {
		mode = wal.Async
		bc.FsyncInterval = d.o.fsyncIvl()
	}
	seg := int64(64 << 10)
	if d.o.snapLog > 0 {
		seg = 4 << 10 // truncation drops segments often
	}
	w, err := wal.Open(dev, wal.Config{Dir: "wal", Mode: mode, FsyncInterval: bc.FsyncInterval, Member: uint64(id), SegmentBytes: seg}, rec)
	if err != nil {
		return err
	}
	if bc.Recovery, err = broadcast.RecoverFrom(rec, snap); err != nil {
		return fmt.Errorf("recoverable: node %d incarnation %d: %w", id, env.Incarnation(), err)
	}
	bc.Durability, bc.WAL = d.o.mode, w
	bc.Snapshots = broadcast.NewSnapStore(snapDev, "snap", uint64(id), snap)
	bc.SnapshotLogBytes = d.o.snapLog
	if d.o.snapLog == 0 {
		bc.SnapshotLogBytes = 1 << 40 // only the snapshots diffs install
	}
	d.all = append(d.all, p)
	return nil
}

// dropLogTail (the dropTail bug) zeroes the node's log from its
// dropTail-th last record on, synced: recovery cuts the batch it tears
// and everything after it.
func (d *durRun) dropLogTail(fs *sim.Disk, id rdma.NodeID) error {
	rec, err := wal.Recover(fs, "wal", uint64(id))
	if err != nil || len(rec.Records) < 2 {
		return err
	}
	at := rec.Records[max(1, len(rec.Records)-d.o.dropTail)].Pos
	for _, s := range rec.Segments {
		switch {
		case s.Seq > at.Seg:
			if err := fs.Remove(s.Path); err != nil {
				return err
			}
		case s.Seq == at.Seg && s.End > at.Off:
			f, err := fs.OpenFile(s.Path, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteAt(make([]byte, s.End-at.Off), at.Off)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	d.ctr.dropped++
	return fs.SyncDir("wal")
}

// schedule plants the outages and the checks that run during the run.
func (d *durRun) schedule() {
	h := d.h
	h.s.Observe(func(e sim.Event) {
		if e.Kind == sim.EvCrash {
			d.crashed(e.Node, e.Time)
		}
	})
	h.s.Invariant(d.invariant)
	// The clients that issued all their ops sleep: wake them for the
	// final reads.
	if d.o.mode == broadcast.Async {
		h.s.At(h.o.until+10*time.Millisecond, d.restartStuckClients)
	}
	h.s.At(h.o.until, func() {
		for _, id := range h.cnodes {
			if p := h.clients[id]; p != nil && h.s.Live(id) && p.env != nil {
				p.env.WakeAt(h.o.until)
			}
		}
	})
	lo, hi := 6*time.Millisecond, h.o.until-20*time.Millisecond
	for range d.o.wholeGroup {
		h.s.At(lo+time.Duration(h.rng.Int64N(int64(hi-lo))), func() { d.crashGroup(h.rng.IntN(len(h.members)), true) })
	}
	if d.o.isolated {
		d.isolate(lo)
	}
	for range d.o.majority {
		h.s.At(lo+time.Duration(h.rng.Int64N(int64(hi-lo))), func() { d.crashGroup(h.rng.IntN(len(h.members)), false) })
	}
}

// isolate (kvDurable.isolated) crashes a member of group 0 at at,
// restarts it from its disk 1 ms later cut off from the rest of its
// group (it stays catching up, unsynced), and crashes group 0 whole 3
// windows later.
func (d *durRun) isolate(at time.Duration) {
	h := d.h
	ms := h.members[0]
	id := ms[h.rng.IntN(len(ms))]
	h.s.At(at, func() {
		h.crashFor(id, time.Millisecond)
		d.isolatedAt = h.s.Now()
		for _, m := range ms {
			if m != id {
				h.s.Partition(id, m)
			}
		}
	})
	h.s.At(at+time.Millisecond+3*d.o.window(), func() {
		for _, m := range ms {
			if m != id {
				h.s.HealPair(id, m)
			}
		}
		d.crashGroup(0, true)
	})
}

// crashGroup crashes every member of group g (whole) or a majority of it
// at this instant, and restarts each from its disk image after 1-4 ms
// (staggered: one by one). A group still down from an outage is left
// alone.
func (d *durRun) crashGroup(g int, whole bool) {
	h := d.h
	ms := h.members[g]
	now := h.s.Now()
	busy := !whole && !d.allLive(g) // a majority crash with a member down already would not be one
	for _, o := range d.outs {
		busy = busy || o.g == g && (o.end < 0 || !d.allLive(g))
	}
	if busy {
		if now < h.o.until-15*time.Millisecond {
			h.s.At(now+time.Millisecond, func() { d.crashGroup(g, whole) })
		}
		return
	}
	var ids []rdma.NodeID
	if whole {
		ids = slices.Clone(ms)
	} else {
		for _, k := range h.rng.Perm(len(ms))[:len(ms)/2+1] {
			ids = append(ids, ms[k])
		}
	}
	o := &outage{g: g, start: now, end: now, whole: whole}
	// The outage's window counts from the first crash of a member not
	// synced again since (down now, or restarted and not yet brought up
	// to date by a leader, or brought up to date less than the window
	// ago): its disk lacks what it acknowledged and had not synced
	// before that crash, so the disks of a majority may lack it
	// (docs/broadcast.md, "What it can lose"; broadcast's simulator
	// checks the same promise per member disk). Counting only the
	// members down now (as before) raised false alarms for a member
	// restarted but not synced again, e.g. partitioned from its leader.
	if d.o.downOnly {
		for _, id := range ms {
			if u := d.unsynced[id]; u != nil && !h.s.Live(id) {
				o.start = min(o.start, u.crash)
			}
		}
	} else {
		o.start = min(o.start, d.unsyncedSince(g, now))
	}
	for _, p := range d.outs {
		if p.g == g {
			// kvcheck's outages of a group do not overlap: writes kept
			// at the previous one are not lost at this one (stricter
			// than the promise if a member was not synced again since).
			o.start = max(o.start, p.end+1)
		}
	}
	if !whole {
		o.end = -1
		for _, id := range ms {
			if p := h.procs[id]; p != nil && h.s.Live(id) {
				st := p.r.Multicast().Broadcast().Status()
				o.epoch = max(o.epoch, st.Committed.E, st.Accepted.E)
				if e, ok := p.r.Multicast().Broadcast().Leading(); ok {
					o.epoch = max(o.epoch, e)
				}
			}
		}
	}
	for _, id := range ids {
		if !h.s.Live(id) {
			continue
		}
		if err := h.s.Crash(id); err != nil {
			h.fail(err)
			return
		}
		h.down[id] = true
	}
	for _, id := range ids {
		// The recovery may lose entries: the group's index may stay
		// below what it was; a leader's sync or the recovery election
		// (catching up over) is the sign.
		if u := d.unsynced[id]; u != nil {
			u.target = 0
		}
	}
	if whole {
		d.ctr.wholeGroup++
	} else {
		d.ctr.majority++
	}
	d.outs = append(d.outs, o)
	last := now
	defer func() {
		if d.o.mode == broadcast.Async {
			h.s.At(last+10*time.Millisecond, d.restartStuckClients)
		}
	}()
	for k, id := range ids {
		down := time.Millisecond + time.Duration(h.rng.Int64N(int64(3*time.Millisecond)))
		if d.o.staggered {
			down += time.Duration(k) * time.Duration(h.rng.Int64N(int64(3*time.Millisecond)))
		}
		if !whole && (o.restartAt == 0 || now+down < o.restartAt) {
			o.restartAt = now + down
		}
		if whole {
			d.restarted[id] = true
		}
		last = max(last, now+down)
		h.s.At(now+down, func() {
			if !h.s.Live(id) {
				if err := h.s.Restart(id, true); err != nil {
					h.fail(fmt.Errorf("restart %d: %v", id, err))
				}
			}
			delete(h.down, id)
		})
	}
}

// restartStuckClients (async) restarts every client that has writes
// under way: a group that recovered without entries it had ordered and
// answered waits in a client's ring for positions the client will never
// write again. A started multicast.Client sees every replica of the group
// replaced and takes a new incarnation (its calls end with ErrRestarted:
// outcome unknown); a polled one, as here, does not watch for it, so the
// harness restarts it, which has the same effect.
func (d *durRun) restartStuckClients() {
	h := d.h
	for _, id := range h.cnodes {
		if p := h.clients[id]; p != nil && h.s.Live(id) && !h.down[id] && (len(p.writes) > 0 || len(p.resend) > 0) {
			d.ctr.clientRestarts++
			h.crashClient(id, 500*time.Microsecond)
		}
	}
}

// crashed (EvCrash) notes that member id crashed at t: unsynced since t,
// unless it already was (then since that earlier crash, and no longer
// synced).
func (d *durRun) crashed(id rdma.NodeID, t time.Duration) {
	g := d.groupOf(id)
	if g < 0 {
		return // a client
	}
	if u := d.unsynced[id]; u != nil && u.syncedAt >= 0 && t >= u.syncedAt+d.o.window() {
		delete(d.unsynced, id) // synced and on its disk before this crash
	}
	var target uint64
	for _, m := range d.h.members[g] {
		if p := d.h.procs[m]; p != nil && d.h.s.Live(m) && p.r != nil {
			target = max(target, p.r.Multicast().Broadcast().Status().Index)
		}
	}
	u := d.unsynced[id]
	if u == nil {
		u = &unsynced{crash: t}
		d.unsynced[id] = u
	}
	u.syncedAt, u.target = -1, max(u.target, target)
}

// unsyncedSince is the first crash of a member of group g not synced
// again since, as of now (now if none).
func (d *durRun) unsyncedSince(g int, now time.Duration) time.Duration {
	since := now
	for _, id := range d.h.members[g] {
		u := d.unsynced[id]
		if u == nil {
			continue
		}
		if u.syncedAt >= 0 && now >= u.syncedAt+d.o.window() {
			delete(d.unsynced, id)
			continue
		}
		since = min(since, u.crash)
	}
	return since
}

// noteSynced (invariant) notes when an unsynced member, live, is synced
// again: not catching up and at its target.
func (d *durRun) noteSynced(id rdma.NodeID, st *broadcast.Status, now time.Duration) {
	if u := d.unsynced[id]; u != nil && u.syncedAt < 0 && !st.CatchingUp && st.Index >= u.target {
		u.syncedAt = now
	}
}

func (d *durRun) groupOf(id rdma.NodeID) int {
	for g, ms := range d.h.members {
		if slices.Contains(ms, id) {
			return g
		}
	}
	return -1
}

func (d *durRun) allLive(g int) bool {
	for _, id := range d.h.members[g] {
		if !d.h.s.Live(id) || d.h.down[id] {
			return false
		}
	}
	return true
}

// invariant runs after every step: a replica never stops on its disk
// (the sim disk never fails), and a majority outage ends once its group
// committed in an epoch above every epoch it had at the crash (from then
// on ops are served by the group that recovered; until then the member
// that survived may serve what it held).
func (d *durRun) invariant() error {
	h := d.h
	now := h.s.Now()
	if now-d.checkedAt >= 100*time.Microsecond {
		// (Status is not cheap: every 100 µs of virtual time is enough
		// to see a stopped replica.)
		d.checkedAt = now
		for _, ms := range h.members {
			for _, id := range ms {
				if p := h.procs[id]; p != nil && h.s.Live(id) && p.r != nil {
					st := p.r.Multicast().Broadcast().Status()
					if st.DiskErr != nil {
						return fmt.Errorf("disk: node %d: %v", id, st.DiskErr)
					}
					d.noteSynced(id, &st, now)
				}
			}
		}
	}
	for _, o := range d.outs {
		if o.end >= 0 || now < o.restartAt {
			continue
		}
		for _, id := range h.members[o.g] {
			p := h.procs[id]
			if p == nil || !h.s.Live(id) {
				continue
			}
			if e, ok := p.r.Multicast().Broadcast().Leading(); ok && e > o.epoch && p.r.Multicast().Broadcast().Status().Committed.E == e {
				o.end = now
			}
		}
	}
	return nil
}

// finalReads: once the load is over and the client's writes are done,
// each client reads its share of the keys (every key once across the
// clients), linearizable, so that a write an outage lost is seen by a
// read after it (CheckDurable sees a loss only through a later read).
func (d *durRun) finalReads(p *kvCliProc, now time.Duration) bool {
	h := d.h
	if len(p.writes) > 0 || len(p.resend) > 0 {
		return false
	}
	keys := d.finalKeys()
	progress := false
	for i := d.read[p.slot]; i < len(keys); i = d.read[p.slot] {
		if i%len(h.clients) != p.slot {
			d.read[p.slot]++
			continue
		}
		k := keys[i]
		g := int(h.slots[HashSlot([]byte(k))])
		r := p.readers[g]
		if r.Busy() {
			break
		}
		d.read[p.slot]++
		op := kvcheck.Op{Client: p.slot, Kind: kvcheck.Get, Key: k}
		p.getRec[g] = h.rec.Begin(p.slot, op)
		r.Begin([]byte(k), Linearizable)
		if r.Poll(now) {
			p.endGet(g)
		}
		progress = true
	}
	return progress
}

// readAll: the client read its share and no get is under way.
func (d *durRun) readAll(p *kvCliProc) bool {
	if d.read[p.slot] < len(d.finalKeys()) {
		return false
	}
	for _, r := range p.readers {
		if r.Busy() {
			return false
		}
	}
	return true
}

func (d *durRun) finalKeys() []string {
	if d.keys != nil {
		return d.keys
	}
	var keys []string
	for i := range d.h.o.keys {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	if d.h.o.merges {
		for i := range 8 {
			keys = append(keys, fmt.Sprintf("m%d", i))
		}
	}
	d.keys = keys
	return keys
}

// outages: the run had an outage that may lose what a group held (a
// whole group, or in async mode a majority too: its members recover from
// their disks, and the survivor's entries above theirs may be lost).
func (d *durRun) outages() bool { return len(d.checked()) > 0 }

func (d *durRun) checked() []kvcheck.Outage {
	var outs []kvcheck.Outage
	for _, o := range d.outs {
		if !o.whole && d.o.mode == broadcast.Sync {
			continue // nothing may be lost: the plain check
		}
		if o.end < 0 {
			// A majority crash after which the group never committed in
			// a new epoch: the member that kept running led throughout
			// and the others caught up from it; nothing was lost.
			continue
		}
		outs = append(outs, kvcheck.Outage{Group: o.g, Start: int64(o.start), End: int64(o.end)})
	}
	return outs
}

// check checks the history of a run with outages: CheckDurable for the
// writes and linearizable gets, CheckStale for the stale-ok gets (in
// async mode with the indexes an outage reused told apart: staleHistory).
func (d *durRun) check(hist []kvcheck.Op) error {
	outs := d.checked()
	// CheckDurable finds a key's group from the ops that report one; the
	// clients report it only with a write's index. The harness knows it.
	hist = slices.Clone(hist)
	for i := range hist {
		if op := &hist[i]; op.Kind != kvcheck.Batch && op.Kind != kvcheck.Scan && !op.Out.Unknown {
			op.Out.Group = int(d.h.slots[HashSlot([]byte(op.Key))])
		}
	}
	mode := kvcheck.DurableSync
	if d.o.mode == broadcast.Async {
		mode = kvcheck.DurableAsync
		d.relayed = relayedParts(hist, outs, d.o.window())
	}
	lost, err := kvcheck.CheckDurable(hist, mode, outs, d.o.window(), kvcheck.Options{Timeout: 60 * time.Second})
	if err != nil {
		return fmt.Errorf("durability (%v, outages %v): %w", mode, outs, err)
	}
	d.lost = lost
	if d.o.mode == broadcast.Async {
		hist = d.staleHistory(hist, outs)
	}
	if err := kvcheck.CheckStale(hist); err != nil {
		return fmt.Errorf("stale-ok gets: %w", err)
	}
	return nil
}

// relayedParts (async) makes the part, in a group, of a batch across
// groups (recorded as one batch per group, with one call time) of unknown
// outcome when an outage of that group ended after the batch was called
// and began less than the window after it returned (an outage may lose
// it):
// if the outage lost it, the group that ordered the message, which kept
// it, relays it to that group again, so it comes back after the
// recovery although writes of the group acknowledged before it are lost
// (multicast's cross-group recovery; docs/deploy.md, async caveats). Its
// effect may then be at any time after its call, which is what an unknown
// outcome allows. It returns how many parts it changed.
func relayedParts(hist []kvcheck.Op, outs []kvcheck.Outage, window time.Duration) int {
	type call struct {
		client int
		at     int64
	}
	parts := map[call]int{}
	for i := range hist {
		if op := &hist[i]; op.Kind == kvcheck.Batch {
			parts[call{op.Client, op.Call}]++
		}
	}
	n := 0
	for i := range hist {
		op := &hist[i]
		if op.Kind != kvcheck.Batch || parts[call{op.Client, op.Call}] < 2 || op.Out.Unknown {
			continue
		}
		for _, o := range outs {
			if o.Group == op.Out.Group && o.End >= op.Call && op.Return >= o.Start-int64(window) {
				op.Out = kvcheck.Output{Unknown: true}
				n++
				break
			}
		}
	}
	return n
}

// staleHistory prepares an async history for CheckStale: an outage that
// lost entries makes its group number the entries after it from where
// it recovered, so the indexes of lost writes come back on other writes.
// Each outage starts a new numbering: the writes acknowledged after its
// End and the gets called after it are put in a group of their own (the
// writes of before count there as writes of another group: their values
// may be read, with no index to hold them to); a get that spans End is
// left out (its applied index may be of either numbering).
func (d *durRun) staleHistory(hist []kvcheck.Op, outs []kvcheck.Outage) []kvcheck.Op {
	out := make([]kvcheck.Op, 0, len(hist))
	era := func(g int, t int64) int {
		k := 0
		for _, o := range outs {
			if o.Group == g && t > o.End {
				k++
			}
		}
		return k
	}
	for _, op := range hist {
		g := op.Out.Group
		if op.Kind == kvcheck.Get {
			if !op.Stale {
				continue
			}
			if e := era(g, op.Call); e != era(g, op.Return) {
				continue
			} else if e > 0 {
				op.Out.Group = g + 1000*e
			}
		} else if e := era(g, op.Return); e > 0 && !op.Out.Unknown {
			op.Out.Group = g + 1000*e
		}
		out = append(out, op)
	}
	return out
}

const kvDurSeeds = 20

var kvDurCases = []struct {
	name string
	o    kvOpts
}{
	// A whole group crashes at one instant under the mixed load (puts,
	// CAS, deletes, batches across groups, merges, multi requests,
	// linearizable and stale-ok gets), with random crashes and
	// partitions around it; every member restarts from its disk.
	{"sync-whole-group", kvOpts{ops: 100, crashes: true, partitions: true, merges: true, durable: kvDurable{mode: broadcast.Sync, wholeGroup: 1}}},
	{"sync-staggered", kvOpts{ops: 100, partitions: true, slow: true, durable: kvDurable{mode: broadcast.Sync, wholeGroup: 1, staggered: true, snapLog: 2 << 10}}},
	// A majority crashes at once: the group elects again only once they
	// are back, from their logs.
	{"sync-majority", kvOpts{ops: 100, crashes: true, merges: true, durable: kvDurable{mode: broadcast.Sync, majority: 2}}},
	// The random schedule of the memory-mode cases, on disks.
	{"sync-random", kvOpts{ops: 100, crashes: true, partitions: true, slow: true, leaders: 1, merges: true, durable: kvDurable{mode: broadcast.Sync}}},
	{"async-whole-group", kvOpts{ops: 100, crashes: true, partitions: true, merges: true, durable: kvDurable{mode: broadcast.Async, wholeGroup: 1}}},
	{"async-staggered", kvOpts{ops: 100, partitions: true, slow: true, durable: kvDurable{mode: broadcast.Async, wholeGroup: 2, staggered: true, snapLog: 2 << 10}}},
	{"async-majority", kvOpts{ops: 100, crashes: true, merges: true, durable: kvDurable{mode: broadcast.Async, majority: 2}}},
	// A member crashed earlier and not synced again (restarted cut off
	// from its group) when its group crashes whole: the window counts
	// from that earlier crash.
	{"async-isolated", kvOpts{ops: 100, slow: true, merges: true, durable: kvDurable{mode: broadcast.Async, isolated: true}}},
	{"async-random", kvOpts{ops: 100, crashes: true, partitions: true, slow: true, leaders: 1, merges: true, durable: kvDurable{mode: broadcast.Async}}},
}

// TestSimDurable runs the durable cases: kvDurSeeds seeds a case (1 under
// the race detector, a tenth with -short); -seeds N runs N (make soak).
// A failing seed prints the command that reruns it.
func TestSimDurable(t *testing.T) {
	simNoRace(t)
	def := kvDurSeeds
	if raceEnabled {
		def = 1
	}
	flags := simFlags.WithDefault(def)
	for _, c := range kvDurCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := c.o
			o.groups, o.replicas, o.clients, o.keys = 2, 3, cmp.Or(o.clients, 3), 24
			o.until = 60 * time.Millisecond
			o.gap = cmp.Or(o.gap, 200*time.Microsecond)
			var seeds, whole, majority, fromDisk, recoveries, lost, reported, outageRuns, clientRestarts, relayed int
			flags.Run(t, func(sd sim.Seed) error {
				h, err := runKV(sd.WithLog(t), o)
				seeds++
				if h == nil || h.dur == nil {
					return err
				}
				if testing.Verbose() {
					t.Logf("seed %d: converged at %v", sd.Seed, h.s.Now())
				}
				whole += h.dur.ctr.wholeGroup
				majority += h.dur.ctr.majority
				clientRestarts += h.dur.ctr.clientRestarts
				relayed += h.dur.relayed
				if h.dur.outages() {
					outageRuns++
				}
				lost += h.dur.lost
				for _, p := range h.dur.all {
					if p.r == nil {
						continue
					}
					st := p.r.Multicast().Broadcast().Status()
					if st.FromDisk {
						fromDisk++
					}
					recoveries += int(st.RecoveryElections)
					reported += int(st.RecoveryLost)
				}
				return err
			})
			t.Logf("%d seeds: %d whole-group and %d majority crashes, %d runs checked with CheckDurable, %d incarnations replayed their log, %d recovery elections; acknowledged writes lost: %d (CheckDurable's count, async window %v), %d reported by the recoveries; %d clients restarted with writes stuck; %d parts of batches across groups checked as of unknown outcome (relayed after an outage)",
				seeds, whole, majority, outageRuns, fromDisk, recoveries, lost, o.durable.window(), reported, clientRestarts, relayed)
			d := o.durable
			if seeds >= 5 {
				switch {
				case (d.wholeGroup > 0 || d.isolated) && whole < seeds:
					t.Errorf("only %d whole-group crashes in %d seeds", whole, seeds)
				case d.majority > 0 && majority < seeds:
					t.Errorf("only %d majority crashes in %d seeds", majority, seeds)
				case fromDisk == 0:
					t.Errorf("no incarnation replayed its log in %d seeds", seeds)
				case d.mode == broadcast.Async && (d.wholeGroup > 0 || d.isolated) && recoveries == 0:
					t.Errorf("no recovery election in %d seeds with whole-group crashes", seeds)
				case d.mode == broadcast.Sync && lost != 0:
					t.Errorf("sync mode counted %d writes lost", lost)
				}
			}
		})
	}
}

// TestSimDurableMutants plants a bug in the durable runs and checks that
// the check aimed at it catches it, with the property it breaks.
func TestSimDurableMutants(t *testing.T) {
	simNoRace(t)
	for _, m := range []struct {
		name string
		o    kvOpts
		want kvcheck.DurableProperty
	}{
		// The replicas of a group restarted after a whole-group crash
		// find the last records of their logs gone, synced ones too: in
		// sync mode, acknowledged writes are lost.
		{"sync-drop-synced-tail", kvOpts{ops: 150, gap: 100 * time.Microsecond, durable: kvDurable{mode: broadcast.Sync, wholeGroup: 1, dropTail: 8}}, kvcheck.AcknowledgedLost},
		// In async mode, far more than the window's worth.
		{"async-drop-old-tail", kvOpts{ops: 150, gap: 100 * time.Microsecond, durable: kvDurable{mode: broadcast.Async, wholeGroup: 1, dropTail: 400}}, kvcheck.AsyncLossBound},
	} {
		t.Run(m.name, func(t *testing.T) {
			o := m.o
			o.groups, o.replicas, o.clients, o.keys = 2, 3, 3, 24
			o.until = 60 * time.Millisecond
			for seed := uint64(1); seed <= 20; seed++ {
				h, err := runKV(sim.Seed{Seed: seed}, o)
				if err == nil {
					continue
				}
				var de *kvcheck.DurableError
				if !errors.As(err, &de) || de.Property != m.want {
					t.Fatalf("seed %d: caught by the wrong check (want %v): %v", seed, m.want, err)
				}
				if h.dur.ctr.dropped == 0 {
					t.Fatalf("seed %d: caught with no log cut: %v", seed, err)
				}
				t.Logf("seed %d caught it (%d logs cut): %s", seed, h.dur.ctr.dropped, firstLine(err.Error()))
				// The same run without the bug passes.
				o.durable.dropTail = 0
				if _, err := runKV(sim.Seed{Seed: seed}, o); err != nil {
					t.Fatalf("seed %d fails without the bug too: %v", seed, err)
				}
				return
			}
			t.Fatalf("not caught in 20 seeds")
		})
	}
}

// TestSimDurableWindowFromUnsyncedCrash: the async window of a
// whole-group crash counts from the first crash of a member not synced
// again since (docs/broadcast.md, "What it can lose"), here a member
// that crashed 3 windows before and restarted cut off from its group
// (kvDurable.isolated); with downOnly (the reading that counted only the
// members down at the crash) it counts from the whole-group crash.
func TestSimDurableWindowFromUnsyncedCrash(t *testing.T) {
	simNoRace(t)
	o := kvOpts{ops: 100, slow: true, merges: true, durable: kvDurable{mode: broadcast.Async, isolated: true}}
	o.groups, o.replicas, o.clients, o.keys = 2, 3, 3, 24
	o.until = 60 * time.Millisecond
	o.gap = 200 * time.Microsecond
	for seed := uint64(1); seed <= 3; seed++ {
		for _, downOnly := range []bool{false, true} {
			o.durable.downOnly = downOnly
			h, err := runKV(sim.Seed{Seed: seed}, o)
			if err != nil {
				t.Fatalf("seed %d (downOnly %v): %v", seed, downOnly, err)
			}
			var whole []*outage
			for _, out := range h.dur.outs {
				if out.whole {
					whole = append(whole, out)
				}
			}
			if len(whole) != 1 || h.dur.isolatedAt == 0 {
				t.Fatalf("seed %d: %d whole-group outages, member isolated at %v: want 1 after an isolated member", seed, len(whole), h.dur.isolatedAt)
			}
			out, want := whole[0], h.dur.isolatedAt
			if downOnly {
				want = out.end // every member was live at the crash
			}
			if out.start != want {
				t.Errorf("seed %d (downOnly %v): the window counts from %v, want %v (member crashed at %v, group crashed at %v)", seed, downOnly, out.start, want, h.dur.isolatedAt, out.end)
			}
			if h.dur.lost > 0 {
				t.Logf("seed %d (downOnly %v): %d writes lost", seed, downOnly, h.dur.lost)
			}
		}
	}
	// With random crashes and partitions around it, seed 31 (found in
	// 400 seeds) loses writes acknowledged more than the window before
	// the whole-group crash but after the isolated member's crash: within
	// the promise, a false alarm ("async loss bound") of downOnly.
	o.crashes, o.partitions = true, true
	for _, downOnly := range []bool{false, true} {
		o.durable.downOnly = downOnly
		h, err := runKV(sim.Seed{Seed: 31}, o)
		var de *kvcheck.DurableError
		switch {
		case !downOnly && err != nil:
			t.Errorf("seed 31: %v", err)
		case !downOnly:
			if h.dur.lost == 0 {
				t.Errorf("seed 31: no write lost (the schedule changed: find another seed)")
			}
			t.Logf("seed 31: %d writes lost, window from %v", h.dur.lost, h.dur.outs[0].start)
		case !errors.As(err, &de) || de.Property != kvcheck.AsyncLossBound:
			t.Errorf("seed 31 with downOnly: want %v, got %v", kvcheck.AsyncLossBound, err)
		}
	}
}
