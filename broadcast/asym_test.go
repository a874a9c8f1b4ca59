package broadcast

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// Asymmetric partitions in the simulator (docs/broadcast.md, "Pre-vote and
// leader stickiness"): one-way link failures that last 40 election
// timeouts while clients propose at every member.
//
//   - leader-to-follower: the follower cannot hear the leader, everyone
//     else can: no election may start and the leader keeps its epoch; the
//     follower takes the stream again when the link heals;
//   - follower-to-leader: the leader cannot hear one follower: the same;
//   - into-follower: the follower hears nobody (every link into it cut):
//     it cannot disturb the others (no election starts);
//   - leader-cannot-reach: the leader hears everyone but reaches nobody:
//     it steps down within a few election timeouts, and another member
//     leads (proposals keep being delivered: the liveness check).
//
// Every run ends with runSim's checks: safety, every member caught up and
// every proposal resolved once the links heal, and no elections after.
func TestSimAsymmetricPartition(t *testing.T) {
	simNoRace(t)
	for _, kind := range []string{"leader-to-follower", "follower-to-leader", "into-follower", "leader-cannot-reach"} {
		for _, n := range []int{3, 5} {
			t.Run(fmt.Sprintf("%s/n%d", kind, n), func(t *testing.T) {
				t.Parallel()
				def := 40
				if raceEnabled {
					def = 1 // 8 cases of 190 ms runs: minutes under the race detector otherwise (make norace runs 40)
				}
				flags := simFlags.WithDefault(def)
				flags.Run(t, func(sd sim.Seed) error {
					return runSim(sd.WithLog(t), asymOpts(kind, n, testingKnobs{}), new(Counters))
				})
			})
		}
	}
}

// TestSimAsymmetricMutant: without the pre-vote and stickiness, a
// follower cut off from its leader makes the group elect again and again;
// the stickiness check (not any other) must say so.
func TestSimAsymmetricMutant(t *testing.T) {
	simNoRace(t)
	catchMutant(t, "no-pre-vote", asymOpts("leader-to-follower", 3, testingKnobs{noPreVote: true}), 20, "stickiness:")
}

const (
	asymStart = 20 * time.Millisecond
	asymCut   = 160 * time.Millisecond // 40 election timeouts of the sim config
)

func asymOpts(kind string, n int, knobs testingKnobs) simOpts {
	return simOpts{n: n, knobs: knobs, until: asymStart + asymCut + 10*time.Millisecond, script: func(h *simRun) {
		h.s.At(asymStart, func() { asymScript(h, kind) })
	}}
}

func asymScript(h *simRun, kind string) {
	s := h.s
	var leader *simProc
	for _, id := range s.Nodes() {
		if p := h.procs[id]; s.Live(id) && p.r.Status().Role == Leader {
			leader = p
		}
	}
	if leader == nil {
		h.c.fail("setup: no leader at %v", s.Now())
		return
	}
	st := leader.r.Status()
	l := st.Self
	var others []rdma.NodeID
	for _, id := range s.Nodes() {
		if id != l {
			others = append(others, id)
		}
	}
	f := others[h.rng.IntN(len(others))]
	var cuts [][2]rdma.NodeID
	switch kind {
	case "leader-to-follower":
		cuts = [][2]rdma.NodeID{{l, f}}
	case "follower-to-leader":
		cuts = [][2]rdma.NodeID{{f, l}}
	case "into-follower":
		for _, o := range s.Nodes() {
			if o != f {
				cuts = append(cuts, [2]rdma.NodeID{o, f})
			}
		}
	case "leader-cannot-reach":
		for _, o := range others {
			cuts = append(cuts, [2]rdma.NodeID{l, o})
		}
	}
	for _, c := range cuts {
		s.Cut(c[0], c[1])
	}
	end := s.Now() + asymCut
	s.At(end, func() {
		for _, c := range cuts {
			s.Heal(c[0], c[1])
		}
	})
	elections := h.electionsStarted()
	if kind == "leader-cannot-reach" {
		// It steps down within a few election timeouts (it no longer
		// hears that a majority follows it), and someone else leads.
		s.At(s.Now()+5*h.cfg.ElectionTimeout, func() {
			if ls := leader.r.Status(); ls.Role == Leader && ls.ECur == st.ECur {
				h.c.fail("step-down: node %d still leads %v after %v unable to reach any member", l, ls.ECur, 5*h.cfg.ElectionTimeout)
			}
		})
		return
	}
	// Check every millisecond of the cut: same leader, same epoch, no
	// election started anywhere.
	var check func()
	check = func() {
		if s.Now() >= end {
			return
		}
		if ls := leader.r.Status(); ls.Role != Leader || ls.ECur != st.ECur {
			h.c.fail("stickiness: %s cut (%v): leader %d of %v is now %v of %v at %v", kind, cuts, l, st.ECur, ls.Role, ls.ECur, s.Now())
			return
		}
		if e := h.electionsStarted(); e != elections {
			h.c.fail("stickiness: %s cut (%v): %d elections started while leader %d kept a live majority, at %v", kind, cuts, e-elections, l, s.Now())
			return
		}
		s.At(s.Now()+time.Millisecond, check)
	}
	check()
}

// TestRingTailSkip: a record that ends fewer than recHdr+8 bytes before
// the ring's end leaves no room for a pad record, so the reader wraps
// there and acknowledges the ring's end; the sender must count the tail
// as sent at once, or it refuses that acknowledgement (beyond what it
// sent) and the ring stalls for ever. Found by
// TestSimAsymmetricPartition/follower-to-leader (seed 14).
func TestRingTailSkip(t *testing.T) {
	const rs = 4096
	for tail := 8; tail < recHdr+8; tail += 8 {
		o := outRing{mirror: make([]byte, rs), rinc: 1}
		first := rs - tail - recSize(8) // a filler record, then one ending tail bytes short of the end
		o.reserve(first, 1)
		o.commitRecord(recHeader{len: first - recHdr - 8, kind: kMsg}, 1)
		o.reserve(recSize(8), 1)
		o.commitRecord(recHeader{len: 8, kind: kMsg}, 1)
		if o.sent != rs {
			t.Errorf("tail %d: sent %d after a record ending %d bytes before the end, want %d (the reader's wrap point)", tail, o.sent, tail, rs)
		}
	}
}
