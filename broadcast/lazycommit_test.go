package broadcast

import (
	"testing"
	"time"
)

// TestLazyCommitBound: while the leader streams, it may leave its
// CommitSST row out of pushes, but followers never deliver more than
// lazyCommitEntries (plus what is in flight) or lazyCommitDelay (plus a
// round trip) behind the leader, and once the stream stops they catch up
// at once, without waiting for a heartbeat.
func TestLazyCommitBound(t *testing.T) {
	// Heartbeats far apart: catching up must not depend on them.
	g := newLockstep(t, 10*time.Minute, 100*time.Nanosecond)
	rs, leader, round := g.rs, g.rs[0], g.round
	const window = 4
	msg := []byte("0123456789")
	behindSince := map[int]time.Duration{}
	var failed error
	delivered, proposed := 0, 0
	// A closed loop that proposes from the completion callbacks, as an
	// application's event loop does: the next record is then in the same
	// push as the moved commit point, which is when the row is deferred.
	var done func(uint64, error)
	propose := func() {
		proposed++
		leader.ProposeFunc(msg, done)
	}
	done = func(_ uint64, err error) {
		if err != nil && failed == nil {
			failed = err
		}
		delivered++
		if proposed < 3000 {
			propose()
		}
	}
	for range window {
		propose()
	}
	for delivered < 3000 {
		if failed != nil {
			t.Fatalf("proposal failed: %v", failed)
		}
		round()
		if g.now > time.Second {
			t.Fatalf("3000 proposals not delivered in a virtual second: %+v", leader.Status())
		}
		li := leader.Status().Index
		for k, r := range rs[1:] {
			fi := r.Status().Index
			if li > fi+lazyCommitEntries+window+1 {
				t.Fatalf("follower %d delivered %d, leader %d: more than %d behind", k+1, fi, li, lazyCommitEntries+window+1)
			}
			if fi >= li {
				delete(behindSince, k)
				continue
			}
			if _, ok := behindSince[k]; !ok {
				behindSince[k] = g.now
			}
			if lag := g.now - behindSince[k]; lag > lazyCommitDelay+5*time.Microsecond {
				t.Fatalf("follower %d has been behind the leader for %v", k+1, lag)
			}
		}
	}
	// The stream stopped: the next pushes carry no records, so the row goes
	// out at once and the followers deliver everything.
	for i := 0; i < 10; i++ {
		round()
	}
	li := leader.Status().Index
	for k, r := range rs[1:] {
		if fi := r.Status().Index; fi != li {
			t.Fatalf("follower %d delivered %d after the stream stopped, leader %d", k+1, fi, li)
		}
	}
}
