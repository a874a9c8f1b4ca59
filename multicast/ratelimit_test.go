package multicast

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/sim"
)

// TestSimClientRate checks Config.ClientRate's token bucket on the
// replica's clock, in the simulator (virtual time: what it asserts does
// not depend on how busy the machine is). Two clients multicast flat out
// (a new message as soon as their window has room) for 40 ms:
//
//   - with ClientRate, each gets at most its burst (ClientSlots) plus the
//     rate's worth of messages taken, so at most that plus its window
//     issued; and the bucket refills on time (the leader wakes for a
//     throttled client's next token), so each gets at least half the
//     rate's worth through;
//   - every message of the throttled clients is answered (runMC's
//     convergence and checks): slowed, not refused;
//   - without the bound the same clients issue three times the most the
//     bound lets through (and stop there) in the same virtual time.
func TestSimClientRate(t *testing.T) {
	simNoRace(t)
	const rate, until = 1000.0, 30 * time.Millisecond
	const slots = 4 // runMC's ClientSlots: the bucket's depth and the client's window
	upper := slots + int(rate*until.Seconds()) + 1 + slots
	lower := int(rate * until.Seconds() / 2)
	// Each client stops at 3 x upper messages: without the bound it gets
	// there (the with-rate runs never do).
	o := mcOpts{shape: "base", groups: 1, replicas: 3, clients: 2, msgs: 3 * upper, until: until, gap: time.Nanosecond, calm: true}
	issued := func(sd sim.Seed, rate float64) []int {
		o := o
		o.clientRate = rate
		h, err := runMC(sd.WithLog(t), o)
		if err != nil {
			t.Fatalf("seed %d, client rate %v: %v", sd.Seed, rate, err)
		}
		var n []int
		for _, id := range h.cnodes {
			n = append(n, h.clients[id].issued)
		}
		return n
	}
	simFlags.WithDefault(3).Run(t, func(sd sim.Seed) error {
		limited := issued(sd, rate)
		free := issued(sd, 0)
		t.Logf("seed %d: in %v of virtual time, clients issued %v at ClientRate %v, %v without", sd.Seed, until, limited, rate, free)
		for c, n := range limited {
			if n > upper || n < lower {
				return fmt.Errorf("ClientRate %v: client %d issued %d messages in %v, want %d to %d", rate, c, n, until, lower, upper)
			}
			if free[c] < o.msgs {
				return fmt.Errorf("without ClientRate client %d issued only %d messages in %v (%d with it): the run does not show the bound", c, free[c], until, n)
			}
		}
		return nil
	})
}
