package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
)

// TestClientRate checks that limits.client_rate reaches the replicas and
// slows a client over it without refusing it: each of two clients writes
// burst + 2 x rate keys one after the other (one message each); every
// write succeeds, and none can have finished in less than the time the
// bucket needs to earn the writes beyond its burst. That is a lower bound
// on time only (a loaded machine can only make the writes slower), less a
// burst for every election meanwhile (a new leader starts each client with
// a full bucket; a loaded machine can make a group elect); the
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
	clients := []*client.Client{open(t, lc, 0), open(t, lc, 1)}
	round := func() uint32 {
		st, err := clients[0].Status(ctx)
		if err != nil || len(st.Groups) != 1 {
			t.Fatalf("status: %v %+v", err, st)
		}
		return broadcast.Epoch(st.Groups[0].Epoch).Round()
	}
	before := round()
	took := make([]time.Duration, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			start := time.Now()
			for k := range n {
				if _, err := c.Put(ctx, []byte(fmt.Sprintf("k%d-%d", i, k)), []byte("v")); err != nil {
					t.Errorf("client %d, write %d of %d at client_rate %v: %v (a client over the rate must be slowed, not refused)", i, k+1, n, rate, err)
					return
				}
			}
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if elections := round() - before; elections > 0 {
		least -= time.Duration(float64(int(elections)*burst) / rate * float64(time.Second))
		t.Logf("%d elections during the writes: each gave the clients a fresh bucket; least time lowered to %v", elections, least)
	}
	for i, d := range took {
		if d < least {
			t.Errorf("client %d: %d writes at client_rate %v done in %v, the bucket cannot let them through in less than %v", i, n, rate, d, least)
		}
	}
}
