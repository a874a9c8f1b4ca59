package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestClientRate checks that limits.client_rate reaches the replicas and
// slows a client over it without refusing it: each of two clients writes
// burst + 2 x rate keys one after the other (one message each); every
// write succeeds, and none can have finished in less than the time the
// bucket needs to earn the writes beyond its burst. That is a lower bound
// on time only (a loaded machine can only make the writes slower); the
// bucket's decisions themselves are checked on the replica's clock, in
// virtual time, by multicast's TestSimClientRate.
func TestClientRate(t *testing.T) {
	const rate, burst = 20.0, 8 // burst: ClientSlots, the default depth
	const n = burst + 2*int(rate)
	m := testMap("rate", "mem", 1, 2)
	m.Limits.ClientRate = rate
	lc := startLocal(t, m)
	ctx := context.Background()
	// The bucket's least time to let n messages through: n-burst tokens
	// to earn, less one for the rounding of the clock.
	least := time.Duration(float64(n-burst-1) / rate * float64(time.Second))
	var wg sync.WaitGroup
	for i, c := range []*client.Client{open(t, lc, 0), open(t, lc, 1)} {
		wg.Go(func() {
			start := time.Now()
			for k := range n {
				if _, err := c.Put(ctx, []byte(fmt.Sprintf("k%d-%d", i, k)), []byte("v")); err != nil {
					t.Errorf("client %d, write %d of %d at client_rate %v: %v (a client over the rate must be slowed, not refused)", i, k+1, n, rate, err)
					return
				}
			}
			if took := time.Since(start); took < least {
				t.Errorf("client %d: %d writes at client_rate %v done in %v, the bucket cannot let them through in less than %v", i, n, rate, took, least)
			}
		})
	}
	wg.Wait()
}
