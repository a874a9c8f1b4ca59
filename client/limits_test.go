package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestClientRate checks limits.client_rate: each of two clients writing
// as fast as it can gets at most its burst plus the rate's worth of
// writes acknowledged, and at least a quarter of the rate's (the bucket
// refills on time: the leader wakes for it). Without the bound (rate 0)
// the same loop gets many times more through, so the upper bound is the
// bucket's.
func TestClientRate(t *testing.T) {
	const rate, dur = 200.0, 500 * time.Millisecond
	count := func(rateLimit float64) (limited, other int64) {
		m := testMap(fmt.Sprintf("rate%v", rateLimit), "mem", 1, 2)
		m.Limits.ClientRate = rateLimit
		lc := startLocal(t, m)
		a, b := open(t, lc, 0), open(t, lc, 1)
		ctx := context.Background()
		// The limited client's burst goes first, then the clock starts.
		var n [2]atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(dur)
		for i, c := range []*client.Client{a, b} {
			wg.Go(func() {
				for k := 0; time.Now().Before(stop); k++ {
					if _, err := c.Put(ctx, []byte(fmt.Sprintf("k%d-%d", i, k%50)), []byte("v")); err != nil {
						t.Error(err)
						return
					}
					n[i].Add(1)
				}
			})
		}
		wg.Wait()
		return n[0].Load(), n[1].Load()
	}
	limited, other := count(rate)
	// Burst (ClientSlots, 8) + rate x duration, plus one for the
	// rounding of the clock.
	if max := int64(8 + rate*dur.Seconds() + 1); limited > max {
		t.Errorf("client_rate %v: %d writes in %v, want at most %d", rate, limited, dur, max)
	}
	if min := int64(rate * dur.Seconds() / 4); limited < min {
		t.Errorf("client_rate %v: only %d writes in %v, want at least %d", rate, limited, dur, min)
	}
	if max := int64(8 + rate*dur.Seconds() + 1); other > max || other < int64(rate*dur.Seconds()/4) {
		t.Errorf("client_rate %v: the second client got %d writes in %v, want a quarter of the rate to %d", rate, other, dur, max)
	}
	free, _ := count(0)
	if free < 3*limited {
		t.Errorf("without client_rate the same loop got %d writes through, with it %d: the bound is not what limits it", free, limited)
	}
	t.Logf("in %v: %d writes at client_rate %v (the second client %d), %d without", dur, limited, rate, other, free)
}
