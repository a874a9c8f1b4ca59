package broadcast

import (
	"testing"
	"time"
)

// BenchmarkIdlePoll measures a Poll with nothing to do, at the leader and
// at a follower of an established 3-replica group on mem (in cache): the
// fixed cost a replica pays per Poll, and so about how late a spinning
// replica notices a write that lands while it polls.
func BenchmarkIdlePoll(b *testing.B) {
	g := newLockstep(b, time.Millisecond, time.Microsecond)
	for range 50 {
		g.round()
	}
	rs, now := g.rs, g.now
	for _, who := range []int{0, 1} {
		r := rs[who]
		b.Run([]string{"leader", "follower"}[who], func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				now += 10 * time.Nanosecond
				r.Poll(now)
			}
		})
	}
}
