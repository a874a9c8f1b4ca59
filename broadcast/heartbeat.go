package broadcast

import "time"

// Heartbeater is a polled task that reports its heartbeat interval, so
// that its poller (package poller) parks no longer than that: a Replica,
// and each layer that wraps one, reports its Replica's.
type Heartbeater interface {
	HeartbeatInterval() time.Duration
}

// HeartbeatInterval is the replica's (Heartbeater).
func (r *Replica) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }
