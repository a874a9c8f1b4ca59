package broadcast

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSaveGate: replicas that share a Config.SaveGate (a process's) save
// their periodic disk snapshots one at a time, and each of them keeps
// saving. Three groups of one, each taking a disk snapshot after every
// log write and proposing every fourth round, polled in turn as one
// poller does; after every Poll at most one of them may have a save
// under way (capture, Persist, the store's IOs: DiskSnapSaving), and
// each must reach several durable saves. Planted saveGateIgnored (a
// capture without the gate) is caught by "overlap:", saveGateKept (the
// gate kept after a save) and saveGateUnfair (the last holder takes it
// again first) by "starved:".
func TestSaveGate(t *testing.T) {
	if err := saveGateRun(t, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ bug, want string }{{"saveGateIgnored", "overlap:"}, {"saveGateKept", "starved:"}, {"saveGateUnfair", "starved:"}} {
		err := saveGateRun(t, c.bug)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Fatalf("planted %s: %v, want %s", c.bug, err, c.want)
		}
		t.Logf("planted %s caught: %v", c.bug, err)
	}
}

func saveGateRun(t *testing.T, bug string) error {
	const n, saves = 3, 4
	g := NewSaveGate()
	rs := make([]*Replica, n)
	for i := range rs {
		r, _ := diskReplica(t, &logFSM{})
		defer r.Close()
		r.cfg.SaveGate = g
		r.knobs.saveGateIgnored = bug == "saveGateIgnored"
		r.knobs.saveGateKept = bug == "saveGateKept"
		r.knobs.saveGateUnfair = bug == "saveGateUnfair"
		rs[i] = r
	}
	counts := func() []uint64 {
		c := make([]uint64, n)
		for i, r := range rs {
			c[i] = r.cfg.Snapshots.Saves()
		}
		return c
	}
	now := rs[0].now
	for i := 0; ; i++ {
		c := counts()
		if min(c[0], c[1], c[2]) >= saves {
			break
		}
		// A replica that made 4x the saves while another has not made
		// them all starved it; so did a run that ends no save at all.
		if max(c[0], c[1], c[2]) >= 4*saves || i == 200000 {
			return fmt.Errorf("starved: durable saves %v after %d rounds (gate taken %d, deferred %d)", c, i, g.Taken(), g.Deferred())
		}
		now += 100 * time.Microsecond
		for k, r := range rs {
			r.Poll(now)
			if e, _ := r.Leading(); e != 0 && i%4 == 0 {
				r.Propose(fmt.Appendf(nil, "entry %d of %d", i, k))
			}
			var saving []int
			for j, x := range rs {
				if x.DiskSnapSaving() {
					saving = append(saving, j)
				}
			}
			if len(saving) > 1 {
				return fmt.Errorf("overlap: replicas %v sharing the gate save at once (round %d, after replica %d's Poll)", saving, i, k)
			}
		}
	}
	// The replicas wanted to save together (every log write asks for a
	// snapshot): the gate held some back, or the run showed nothing.
	if g.Deferred() == 0 {
		return fmt.Errorf("deferred: the gate held no capture back (taken %d)", g.Taken())
	}
	if g.Held() {
		for _, r := range rs {
			if !r.DiskSnapSaving() && g.holder.Load() == r {
				return fmt.Errorf("held: a replica with no save under way holds the gate")
			}
		}
	}
	return nil
}

// TestSaveGateClose: a replica that closes with its save under way gives
// the gate back (another replica of the process would never save again).
func TestSaveGateClose(t *testing.T) {
	g := NewSaveGate()
	r, _ := diskReplica(t, &logFSM{})
	r.cfg.SaveGate = g
	pollUntil(t, r, g.Held, "capture taking the gate")
	r.Close()
	if g.Held() {
		t.Fatal("the gate is still held after its holder closed")
	}
	if !g.holder.CompareAndSwap(nil, r) {
		t.Fatal("the gate cannot be taken after its holder closed")
	}
}
