package broadcast

import (
	"context"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Poller is what a Driver runs: a deterministic polled step and the
// latest time it wants its next one. Replica implements it; so may a layer
// that wraps a Replica (and polls it from its own Poll).
type Poller interface {
	// Poll runs one step at now and reports whether it made progress.
	Poll(now time.Duration) bool
	// NextDeadline is the latest time the poller wants its next Poll even
	// if nothing lands in its memory.
	NextDeadline() time.Duration
}

// Driver runs one or more Pollers in real time on one goroutine: it polls
// while there is progress, then waits on the node's doorbell (which spins
// for the fabric's spin budget, then parks) until a Notify write lands, a
// proposal rings it, or the earliest of the pollers' next deadlines.
type Driver struct {
	ps    []Poller
	db    rdma.Doorbell
	start time.Time
	// MaxPark bounds one park; default the smallest HeartbeatInterval of
	// the pollers that report one (Heartbeater: a Replica, or a layer
	// that wraps one), DefaultHeartbeatInterval if none does.
	MaxPark time.Duration
}

// NewDriver returns a driver for r that parks on db (normally the node's
// Doorbell).
func NewDriver(r *Replica, db rdma.Doorbell) *Driver {
	return NewMultiDriver(db, r)
}

// Heartbeater is a Poller that reports its heartbeat interval, so that a
// driver parks it no longer than that: a Replica, and each layer that wraps
// one reports its Replica's.
type Heartbeater interface {
	HeartbeatInterval() time.Duration
}

// HeartbeatInterval is the replica's (Heartbeater).
func (r *Replica) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }

// NewMultiDriver returns a driver for several pollers on one node, e.g.
// the replicas of several groups (each with its own Config.RegionBase,
// see rdma/regions), parking on the node's one doorbell db. Each pass
// polls every poller once, in turn, at the driver's clock; passes go on
// while any poller made progress, so a busy group does not starve the
// others. Then the driver parks until the earliest NextDeadline (at most
// MaxPark).
func NewMultiDriver(db rdma.Doorbell, ps ...Poller) *Driver {
	park := time.Duration(0)
	for _, p := range ps {
		if h, ok := p.(Heartbeater); ok && (park == 0 || h.HeartbeatInterval() < park) {
			park = h.HeartbeatInterval()
		}
	}
	if park == 0 {
		park = DefaultHeartbeatInterval
	}
	return &Driver{ps: append([]Poller(nil), ps...), db: db, start: time.Now(), MaxPark: park}
}

// Now is the driver's clock, the time it passes to Poll.
func (d *Driver) Now() time.Duration { return time.Since(d.start) }

// Run polls the pollers until ctx ends, then returns ctx's error. It does
// not close them.
func (d *Driver) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, d.db.Ring)
	defer stop()
	for {
		seq := d.db.Seq()
		if err := ctx.Err(); err != nil {
			return err
		}
		// One clock read a pass: every poller of the pass polls at it,
		// and a pass without progress takes its waiting time from it.
		now := d.Now()
		progress := false
		for _, p := range d.ps {
			if p.Poll(now) {
				progress = true
			}
		}
		if progress {
			continue
		}
		wait := d.MaxPark
		for _, p := range d.ps {
			wait = min(wait, p.NextDeadline()-now)
		}
		if wait > 0 {
			d.db.Wait(seq, wait)
		}
	}
}
