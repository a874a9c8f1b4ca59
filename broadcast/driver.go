package broadcast

import (
	"context"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Driver runs a Replica in real time on one goroutine: it polls while
// there is progress, then waits on the node's doorbell (which spins for the
// fabric's spin budget, then parks) until a Notify write lands, a proposal
// rings it, or the replica's next deadline.
type Driver struct {
	r     *Replica
	db    rdma.Doorbell
	start time.Time
	// MaxPark bounds one park; default the replica's HeartbeatInterval.
	MaxPark time.Duration
}

// NewDriver returns a driver for r that parks on db (normally the node's
// Doorbell).
func NewDriver(r *Replica, db rdma.Doorbell) *Driver {
	return &Driver{r: r, db: db, start: time.Now(), MaxPark: r.cfg.HeartbeatInterval}
}

// Now is the driver's clock, the time it passes to Poll.
func (d *Driver) Now() time.Duration { return time.Since(d.start) }

// Run polls the replica until ctx ends, then returns ctx's error. It does
// not close the replica.
func (d *Driver) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, d.db.Ring)
	defer stop()
	for {
		seq := d.db.Seq()
		if err := ctx.Err(); err != nil {
			return err
		}
		now := d.Now()
		if d.r.Poll(now) {
			continue
		}
		wait := min(d.r.NextDeadline()-now, d.MaxPark)
		if wait > 0 {
			d.db.Wait(seq, wait)
		}
	}
}
