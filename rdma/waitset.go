package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// WaitSet waits for any of several doorbells at once: a poller that owns
// the replicas of several nodes parks once for all of them. It is built
// once (NewWaitSet) and reused for every park, so a park allocates
// nothing.
//
// The protocol against lost wake-ups is the Doorbell's, for the whole set:
// snap := Snapshot(snap[:0]), look at memory, and if there is nothing to
// do call Wait(snap, deadline). Any ring after the Snapshot, and any Kick
// since the set's last Wait returned, makes Wait return at once.
//
// Snapshot and Wait are for one goroutine (the set's owner); Kick may be
// called from any goroutine. Close the set before closing its nodes.
type WaitSet interface {
	// Snapshot appends the current Seq of every doorbell to dst.
	Snapshot(dst []uint64) []uint64
	// Wait parks until a doorbell's Seq differs from snap, a Kick, or
	// until the Mono clock reaches deadline; it reports whether it was
	// woken (false: the deadline passed with nothing rung). A deadline
	// already past only checks. It does not spin: the caller decides.
	Wait(snap []uint64, deadline time.Duration) bool
	// Kick wakes the set's Wait (or makes its next one return at once).
	Kick()
	// Close releases the set. Its doorbells are not closed.
	Close()
}

// HoldingWaitSet is a WaitSet that can also park holding the caller's
// P (the Go runtime's processor): WaitHolding is Wait in a plain system
// call, which keeps the P, where Wait enters the kernel as a system call
// known to block and gives the P back at once. A held park costs less
// at both ends (the runtime starts no other thread to take the P over,
// takes it back without a hand-off, and does not wake its monitor
// thread, sysmon, out of its deep sleep), but while it lasts no other
// goroutine runs on that P: only a caller that knows another P is free
// and the wait is short uses it (package poller).
type HoldingWaitSet interface {
	WaitSet
	WaitHolding(snap []uint64, deadline time.Duration) bool
}

// WaitSetter is a doorbell whose fabric builds its own WaitSet (shm: one
// FUTEX_WAITV over every node's doorbell word). NewWaitSet returns nil
// if some doorbell of dbs is not of its kind.
type WaitSetter interface {
	NewWaitSet(dbs []Doorbell) WaitSet
}

// localBell is a doorbell built on a LocalDoorbell (mem, tcp).
type localBell interface{ local() *LocalDoorbell }

func (d *LocalDoorbell) local() *LocalDoorbell { return d }

// PreParker is a doorbell that needs a call before its owner parks (tcp:
// it sends Conn readers that stood aside back to their sockets).
type PreParker interface{ PrePark() }

// NewWaitSet returns a WaitSet over dbs: the fabric's own (WaitSetter) if
// every doorbell is of its kind, a local one if every doorbell is a
// LocalDoorbell (mem, tcp), else one that waits on the first doorbell and
// looks at the others at least every millisecond.
func NewWaitSet(dbs []Doorbell) WaitSet {
	if len(dbs) > 0 {
		if s, ok := dbs[0].(WaitSetter); ok {
			if ws := s.NewWaitSet(dbs); ws != nil {
				return ws
			}
		}
	}
	ls := &localWaitSet{wake: make(chan struct{}, 1), dbs: append([]Doorbell(nil), dbs...)}
	for _, db := range dbs {
		lb, ok := db.(localBell)
		if !ok {
			return &slowWaitSet{dbs: ls.dbs, kick: make(chan struct{}, 1)}
		}
		ls.bells = append(ls.bells, lb.local())
		if p, ok := db.(PreParker); ok {
			ls.pre = append(ls.pre, p)
		}
	}
	for _, b := range ls.bells {
		b.addSet(ls)
	}
	ls.timer = time.NewTimer(time.Hour)
	ls.timer.Stop()
	return ls
}

// localWaitSet waits for LocalDoorbells: each rings the set's wake channel
// while the set is parked (parked is set before the set's last look at the
// seqs, a ringer bumps seq before looking at parked).
type localWaitSet struct {
	dbs    []Doorbell
	bells  []*LocalDoorbell
	pre    []PreParker
	parked atomic.Int32
	kicks  atomic.Uint64
	seen   uint64 // kicks when the last Wait returned
	wake   chan struct{}
	timer  *time.Timer
	closed bool
}

func (s *localWaitSet) Snapshot(dst []uint64) []uint64 {
	for _, b := range s.bells {
		dst = append(dst, b.seq.Load())
	}
	return dst
}

func (s *localWaitSet) changed(snap []uint64) bool {
	if s.kicks.Load() != s.seen {
		return true
	}
	for i, b := range s.bells {
		if b.seq.Load() != snap[i] {
			return true
		}
	}
	return false
}

func (s *localWaitSet) Wait(snap []uint64, deadline time.Duration) bool {
	woken := s.wait(snap, deadline)
	s.seen = s.kicks.Load()
	return woken
}

func (s *localWaitSet) wait(snap []uint64, deadline time.Duration) bool {
	if s.changed(snap) {
		return true
	}
	left := deadline - Mono()
	if left <= 0 {
		return false
	}
	for _, p := range s.pre {
		p.PrePark()
	}
	s.parked.Store(1)
	defer s.parked.Store(0)
	if s.changed(snap) {
		return true
	}
	s.timer.Reset(left)
	defer s.timer.Stop()
	for {
		select {
		case <-s.wake:
			if s.changed(snap) {
				return true
			}
		case <-s.timer.C:
			return s.changed(snap)
		}
	}
}

func (s *localWaitSet) ring() {
	if s.parked.Load() != 0 {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (s *localWaitSet) Kick() {
	s.kicks.Add(1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *localWaitSet) Close() {
	if s.closed {
		return
	}
	s.closed = true
	for _, b := range s.bells {
		b.removeSet(s)
	}
}

// slowWaitSet is the fallback for doorbells of mixed or unknown kinds: it
// waits on the first doorbell and looks at the others every millisecond.
type slowWaitSet struct {
	dbs  []Doorbell
	kick chan struct{}
}

func (s *slowWaitSet) Snapshot(dst []uint64) []uint64 {
	for _, db := range s.dbs {
		dst = append(dst, db.Seq())
	}
	return dst
}

func (s *slowWaitSet) Wait(snap []uint64, deadline time.Duration) bool {
	for {
		select {
		case <-s.kick:
			return true
		default:
		}
		for i, db := range s.dbs {
			if db.Seq() != snap[i] {
				return true
			}
		}
		left := deadline - Mono()
		if left <= 0 {
			return false
		}
		if len(s.dbs) == 0 {
			select {
			case <-s.kick:
				return true
			case <-time.After(min(left, time.Millisecond)):
			}
			continue
		}
		s.dbs[0].Wait(snap[0], min(left, time.Millisecond))
	}
}

func (s *slowWaitSet) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
	if len(s.dbs) > 0 {
		s.dbs[0].Ring()
	}
}

func (s *slowWaitSet) Close() {}

// localSets is the list of WaitSets a LocalDoorbell rings (copy on write:
// Ring reads it with one atomic load).
type localSets struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*localWaitSet]
}

func (d *LocalDoorbell) addSet(s *localWaitSet) {
	d.sets.mu.Lock()
	defer d.sets.mu.Unlock()
	var l []*localWaitSet
	if p := d.sets.list.Load(); p != nil {
		l = append(l, *p...)
	}
	l = append(l, s)
	d.sets.list.Store(&l)
}

func (d *LocalDoorbell) removeSet(s *localWaitSet) {
	d.sets.mu.Lock()
	defer d.sets.mu.Unlock()
	p := d.sets.list.Load()
	if p == nil {
		return
	}
	var l []*localWaitSet
	for _, x := range *p {
		if x != s {
			l = append(l, x)
		}
	}
	if len(l) == 0 {
		d.sets.list.Store(nil)
		return
	}
	d.sets.list.Store(&l)
}

// ringSets wakes the parked WaitSets that include d.
func (d *LocalDoorbell) ringSets() {
	if p := d.sets.list.Load(); p != nil {
		for _, s := range *p {
			s.ring()
		}
	}
}
