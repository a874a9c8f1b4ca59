package rdma

import (
	"math/rand/v2"
	"time"
)

// Backoff spaces out retries of something that keeps failing (a
// reconnect, a snapshot fetch): exponential from Min to Max, with jitter.
// It works on the caller's clock and randomness, so a protocol that is
// deterministic for one seed stays so. The zero Backoff retries after 1ms
// growing to 1s. Not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration

	cur time.Duration // the last step; 0 after Reset
}

// Default bounds of a Backoff whose Min or Max is not set.
const (
	DefaultBackoffMin = time.Millisecond
	DefaultBackoffMax = time.Second
)

// Next records one more failure at now and returns when to retry: the
// step b is Min after a Reset and doubles at each call up to Max, and the
// retry comes after a delay drawn uniformly from [b/2, b) with rng (one
// Int64N call; with a nil rng the delay is b, no jitter).
func (b *Backoff) Next(now time.Duration, rng *rand.Rand) (retryAt time.Duration) {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultBackoffMin
	}
	if hi <= 0 {
		hi = max(DefaultBackoffMax, lo)
	}
	hi = max(hi, lo)
	switch {
	case b.cur == 0:
		b.cur = lo
	case b.cur >= hi/2:
		b.cur = hi
	default:
		b.cur = min(2*b.cur, hi)
	}
	step := b.cur
	if rng == nil || step < 2 {
		return now + step
	}
	half := step / 2
	return now + step - half + time.Duration(rng.Int64N(int64(half)))
}

// Step is the current step (0 after Reset): the last retry came after a
// delay in [Step/2, Step).
func (b *Backoff) Step() time.Duration { return b.cur }

// Reset forgets the failures: the next Next steps Min again. Call it once
// the retried thing worked.
func (b *Backoff) Reset() { b.cur = 0 }
