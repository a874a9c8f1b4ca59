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
//
// Two clocks make each bound bite: with 100 ns rounds and a window of 4,
// 32 entries commit well inside 20 µs, so the entries bound sends the row;
// with 2 µs rounds and a window of 1, one entry commits every few rounds,
// so 20 µs pass long before 32 entries do.
func TestLazyCommitBound(t *testing.T) {
	for _, c := range []struct {
		name   string
		step   time.Duration
		window int
	}{
		{"entries", 100 * time.Nanosecond, 4},
		{"delay", 2 * time.Microsecond, 1},
	} {
		t.Run(c.name, func(t *testing.T) { testLazyCommitBound(t, c.step, c.window) })
	}
}

func testLazyCommitBound(t *testing.T, step time.Duration, window int) {
	// Heartbeats far apart: catching up must not depend on them.
	g := newLockstep(t, 10*time.Minute, step)
	rs, leader, round := g.rs, g.rs[0], g.round
	msg := []byte("0123456789")
	behindSince := map[int]time.Duration{}
	var failed error
	delivered, proposed := 0, 0
	// A closed loop that proposes from the completion callbacks, as an
	// application's event loop does: the next record is then in the same
	// push as the moved commit point, which is when the row is deferred.
	var done func(uint64, []byte, error)
	propose := func() {
		proposed++
		leader.ProposeFunc(msg, done)
	}
	done = func(_ uint64, _ []byte, err error) {
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
	// Bounded in virtual time and, since a round is real work (10 virtual
	// seconds are up to 10^8 rounds), in real time too.
	start := time.Now()
	for n := 0; delivered < 3000; n++ {
		if failed != nil {
			t.Fatalf("proposal failed: %v", failed)
		}
		round()
		if g.now > 10*time.Second || n%1024 == 0 && time.Since(start) > testWait {
			t.Fatalf("%d of 3000 proposals delivered after %v virtual, %v real (%d rounds)%s",
				delivered, g.now, time.Since(start).Round(time.Millisecond), n+1, statuses(rs))
		}
		li := leader.Status().Index
		for k, r := range rs[1:] {
			fi := r.Status().Index
			if li > fi+lazyCommitEntries+uint64(window)+1 {
				t.Fatalf("follower %d delivered %d, leader %d: more than %d behind", k+1, fi, li, lazyCommitEntries+window+1)
			}
			if fi >= li {
				delete(behindSince, k)
				continue
			}
			if _, ok := behindSince[k]; !ok {
				behindSince[k] = g.now
			}
			if lag := g.now - behindSince[k]; lag > lazyCommitDelay+5*step+5*time.Microsecond {
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
