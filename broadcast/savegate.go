package broadcast

import "sync/atomic"

// SaveGate lets one replica at a time, of those whose Config shares it,
// capture and save a periodic disk snapshot (Config.SaveGate): a
// process's replicas (kvserver's embedded cluster runs 2 x 3 on one
// poller) otherwise reach SnapshotLogBytes together, a group's three
// members at about the same entry, so that one poller ran their three
// captures (an index copy each, 3-10 ms at 1 M records) in the same or
// adjacent passes, and then their Persist walks, hashes and file writes
// all ran at once beside the pollers, each taking a Go processor and a
// core (issue 19: no leader Poll over ET/20 while a snapshot is written).
//
// A replica takes the gate when it would capture and finds it free, and
// gives it back once its save is over (DiskSnapSaving false: the files
// durable and the older ones removed, or the capture, its Persist or the
// save failed), when it stops on a disk error, and at Close. A replica
// that finds the gate taken captures at a later Poll, when it is free:
// its log grows past SnapshotLogBytes meanwhile, by what the others'
// saves take. A snapshot a diff installed is never held back (the log's
// dA waits for it).
//
// Safe for concurrent use (the replicas may run on different pollers).
type SaveGate struct {
	// holder holds the gate; last took it last; wanted was refused it
	// at its last Poll (the last holder lets it go first).
	holder, last, wanted atomic.Pointer[Replica]
	deferred, taken      atomic.Uint64
	// closed: the process is stopping (Close): no capture starts.
	closed atomic.Bool
}

// Close refuses the gate to every replica from now on (a process's stop,
// before it closes its replicas): a replica that waits for its turn
// gives up at once instead of capturing and saving when the one ahead of
// it closed, which made a process's stop wait for its replicas' saves one
// after another. A save under way goes on (its replica's Close bounds
// it). For good: a stopped process does not reopen it.
func (g *SaveGate) Close() { g.closed.Store(true) }

// NewSaveGate returns a free gate.
func NewSaveGate() *SaveGate { return &SaveGate{} }

// Deferred counts the captures held back because another replica held the
// gate (one per Poll that found it taken); Taken the captures it let go.
func (g *SaveGate) Deferred() uint64 { return g.deferred.Load() }

// Taken counts the captures the gate let start.
func (g *SaveGate) Taken() uint64 { return g.taken.Load() }

// Held reports whether a replica holds the gate now.
func (g *SaveGate) Held() bool { return g.holder.Load() != nil }

// tryTake takes the gate for r (true), or counts a deferral (false).
// Fair among replicas polled in turn: the replica that held it last
// (whose next capture, after a save, can be due at the Poll that ended
// the save) takes it again only if no other replica was refused it at
// its last Poll; so a free gate goes to the next replica in the poll
// order that wants it.
func (g *SaveGate) tryTake(r *Replica) bool {
	if g.closed.Load() && !r.knobs.saveGateOpenAtClose {
		g.wanted.CompareAndSwap(r, nil)
		return false
	}
	if r.knobs.saveGateKept && g.holder.Load() == r {
		g.taken.Add(1)
		return true // planted: the gate stays with its holder
	}
	g.holder.CompareAndSwap(r, nil) // its save is over: r would not capture otherwise
	if w := g.wanted.Load(); w != nil && w != r && g.last.Load() == r && !r.knobs.saveGateUnfair {
		g.deferred.Add(1)
		return false
	}
	if g.holder.CompareAndSwap(nil, r) {
		g.last.Store(r)
		g.wanted.CompareAndSwap(r, nil)
		g.taken.Add(1)
		return true
	}
	g.wanted.Store(r)
	g.deferred.Add(1)
	return false
}

// release gives the gate back if r holds it.
func (g *SaveGate) release(r *Replica) { g.holder.CompareAndSwap(r, nil) }

// saveGateBegin (start of diskSnapPoll): r's mark as the replica refused
// the gate lasts until its next Poll, which sets it again if it is
// refused again (a replica that stopped on a disk error wants no more).
func (r *Replica) saveGateBegin() {
	// Load first: this runs every Poll, and a CAS takes the shared
	// gate's cache line even when it fails.
	if g := r.cfg.SaveGate; g != nil && g.wanted.Load() == r {
		g.wanted.CompareAndSwap(r, nil)
	}
}

// saveGateTake is the gate's check before a periodic capture: true if r
// may capture (no gate, or r took it). The planted saveGateIgnored
// captures without taking it.
func (r *Replica) saveGateTake() bool {
	g := r.cfg.SaveGate
	if g == nil || r.knobs.saveGateIgnored {
		return true
	}
	return g.tryTake(r)
}

// saveGateCheck (end of diskSnapPoll) gives the gate back once r's save
// is over or r stopped. The planted saveGateKept never gives it back
// after a save.
func (r *Replica) saveGateCheck() {
	g := r.cfg.SaveGate
	if g == nil || g.holder.Load() != r || r.knobs.saveGateKept {
		return
	}
	if !r.DiskSnapSaving() { // false once r stopped on a disk error too
		g.release(r)
	}
}

// saveGateClose gives the gate back at Close, whatever r's save.
func (r *Replica) saveGateClose() {
	if g := r.cfg.SaveGate; g != nil {
		g.release(r)
		g.wanted.CompareAndSwap(r, nil)
	}
}
