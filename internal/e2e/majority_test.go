package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// maxRecoveryElections bounds the elections group 1's replicas start (the
// sum of their counters.elections_started) from the restart of the two
// killed replicas until every replica of the group is ready: the group
// must recover by itself in a bounded number of election rounds, counted
// by the replicas, not by the clock.
const maxRecoveryElections = 40

// TestMajorityKill (issue 19, "a group that lost the memory of a
// majority", with durable modes): 2 groups x 3 kvserver processes on shm
// under the kill test's recorded load; kill -9 of two replicas of group 1
// at once (its leader and a follower), restarted from their data dirs
// 1.5 s later. The group must recover by itself: every replica's /readyz
// says 200 within maxRecoveryElections elections started by the group's
// replicas (from /status), group 0 serves throughout (its writes are
// acknowledged while group 1 is down), and the history with final reads
// of every key is linearizable (porcupine): nothing acknowledged was
// lost. In sync mode that is the promise (a majority's disks hold every
// acknowledged write). In async mode the survivor never lost its memory
// and holds every committed entry, and the recovering pair must not
// elect a log shorter than the survivor's: the same check applies.
func TestMajorityKill(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			h, final, keys := majorityKill(t, mode, false)
			n := checkFinal(t, h, keys, final)
			t.Logf("final reads: %d of %d keys present; %d keys' last writes checked directly", len(final), len(keys), n)
			checkHistory(t, h)
		})
	}
}

// TestMajorityKillPlanted: the same with the two restarted replicas' data
// dirs wiped (sync mode), as if their disks were lost. A replica without
// its data comes back catching up (it cannot vote until a leader catches
// it up), so two such replicas and the survivor cannot elect: the group
// must not recover by itself (no leader with a shorter log may appear),
// and what the survivor holds is not lost. The test checks both: group 1
// has no ready replica while the other group serves, and after the
// operator's force-new-cluster of the survivor the history with final
// reads is linearizable.
func TestMajorityKillPlanted(t *testing.T) {
	h, final, keys := majorityKill(t, "sync", true)
	n := checkFinal(t, h, keys, final)
	t.Logf("final reads: %d of %d keys present; %d keys' last writes checked directly", len(final), len(keys), n)
	res, err := kvcheck.CheckLinearizable(h, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != kvcheck.Ok {
		t.Fatalf("the wiped pair and the survivor lost acknowledged writes: %v (%s)", res.Err(), summary(h))
	}
}

func majorityKill(t *testing.T, mode string, wipe bool) (h []kvcheck.Op, final map[string]string, keys []string) {
	if testing.Short() {
		t.Skip("runs 6 kvserver processes")
	}
	const groups, progress = killGroups, killProgress
	c, cls, l, seed := startKillLoad(t, "majk", mode)
	// A writer of group 0's own keys (outside the load's, which its
	// workers, blocked on group 1's keys, would stop using): group 0
	// must serve it while group 1 is down.
	var g0acked, g0failed atomic.Int64
	var g0err atomic.Value
	g0stop := make(chan struct{})
	var g0wg sync.WaitGroup
	g0wg.Go(func() {
		n := 0
		m := cls[0].Map()
		for {
			select {
			case <-g0stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := cls[0].Put(ctx, keyOf(m, 0, "g0", &n), []byte("v"))
			cancel()
			if err != nil {
				g0failed.Add(1)
				g0err.Store(err.Error())
			} else {
				g0acked.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	})
	// Stopped before the convergence check (a group written every
	// millisecond does not hold still for it), and at any return.
	stopG0 := sync.OnceFunc(func() { close(g0stop); g0wg.Wait() })
	defer stopG0()
	time.Sleep(500 * time.Millisecond)

	leader := c.leader(1, 10*time.Second)
	survivor := c.followers(1, leader)[1]
	victims := []int64{leader, c.followers(1, leader)[0]}
	for _, id := range victims {
		c.kill(id)
	}
	c.logf("kill -9 of group 1's leader %d and follower %d at once (seed %d); %d survives; acknowledged writes per group %v", victims[0], victims[1], seed, survivor, l.ackedNow())
	down := g0acked.Load()
	time.Sleep(1500 * time.Millisecond)
	// Group 0 served while group 1 was down.
	if a := g0acked.Load() - down; a < progress {
		t.Errorf("group 0 acknowledged %d puts in the 1.5 s group 1 was down (want >= %d): a group that cannot elect must hold back only its own calls", a, progress)
	}
	before := map[int64]uint64{}
	if s, err := c.status(survivor); err == nil {
		before[survivor] = s.Counters.ElectionsStarted // the restarted ones count from 0
	}
	for _, id := range victims {
		if wipe {
			if err := os.RemoveAll(c.cfg.ReplicaDir(id)); err != nil {
				t.Fatal(err)
			}
		}
		c.start(id)
	}
	mark := l.ackedNow()
	if wipe {
		plantedMajority(t, c, l, survivor, before, progress, &g0acked)
	} else {
		deadline := time.Now().Add(40 * time.Second) // a harness bound; the assertion is the count below
		for _, id := range c.members(1) {
			for ok, why := c.ready(id); !ok; ok, why = c.ready(id) {
				if time.Now().After(deadline) {
					t.Fatalf("replica %d of group 1 not ready 40 s after the restart: %s; elections started %v%s", id, why, elections(c, 1, before), c.describe())
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		n := elections(c, 1, before)
		c.logf("group 1 ready again after %d elections started by its replicas", n)
		if n > maxRecoveryElections {
			t.Errorf("group 1 started %d elections before every replica was ready (bound %d)", n, maxRecoveryElections)
		}
		l.waitProgress(t, mark, progress, 30*time.Second, "after the restart", c.describe)
		time.Sleep(500 * time.Millisecond)
	}
	if !l.end(2 * l.timeout) {
		t.Fatalf("the workers' calls had not returned %v after the load stopped%s", 2*l.timeout, c.describe())
	}
	final, err := l.finalReads(cls[0])
	if err != nil {
		t.Fatal(err)
	}
	stopG0()
	if n := g0failed.Load(); n > 0 {
		t.Errorf("%d puts to group 0 failed, the last: %v", n, g0err.Load())
	}
	nerr, errs := l.errors()
	for _, e := range errs {
		t.Errorf("unexpected error: %s", e)
	}
	if nerr > len(errs) {
		t.Errorf("and %d more unexpected errors", nerr-len(errs))
	}
	c.waitConverged(30 * time.Second)
	c.logf("load stopped: %d calls, acknowledged writes per group %v, %d of unknown outcome", l.ops.Load(), l.ackedNow(), l.unknown.Load())
	return l.rec.History(), final, l.keys
}

// elections is the elections group g's replicas started since before
// (a replica absent from before counts from 0).
func elections(c *tcluster, g int, before map[int64]uint64) uint64 {
	n := uint64(0)
	for _, id := range c.members(g) {
		if s, err := c.status(id); err == nil {
			n += s.Counters.ElectionsStarted - min(before[id], s.Counters.ElectionsStarted)
		}
	}
	return n
}

// plantedMajority: group 1's two restarted replicas came back without
// their data. The group must not elect by itself: the two come back
// catching up (they cannot vote until a leader catches them up) and the
// survivor alone is no majority. The test waits until it sees that state
// (the survivor electing, the other two catching up), then 10 election
// timeouts more, and checks that no replica of group 1 is ready and that
// group 0 served meanwhile. Then the operator's kvserver
// force-new-cluster --yes lets the survivor lead, and the load must
// progress in both groups again.
func plantedMajority(t *testing.T, c *tcluster, l *load, survivor int64, before map[int64]uint64, progress int64, g0acked *atomic.Int64) {
	t.Helper()
	mark := g0acked.Load()
	stuck := func() string {
		for _, id := range c.members(1) {
			s, err := c.status(id)
			switch {
			case err != nil:
				return err.Error()
			case s.Role != "electing":
				return fmt.Sprintf("replica %d is %s", id, s.Role)
			case id == survivor && s.CatchingUp:
				return fmt.Sprintf("the survivor %d is catching up", id)
			case id != survivor && !s.CatchingUp:
				return fmt.Sprintf("replica %d, restarted without its data, is not catching up", id)
			}
			if ok, _ := c.ready(id); ok {
				return fmt.Sprintf("replica %d is ready", id)
			}
		}
		return ""
	}
	deadline := time.Now().Add(30 * time.Second) // a harness bound
	for why := stuck(); why != ""; why = stuck() {
		if time.Now().After(deadline) {
			t.Fatalf("group 1 is not stuck as expected: %s%s", why, c.describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // 10 election timeouts (100 ms)
	if why := stuck(); why != "" {
		t.Fatalf("group 1 changed without a force: %s%s", why, c.describe())
	}
	if a := g0acked.Load() - mark; a < progress {
		t.Errorf("group 0 acknowledged %d puts while group 1 was stuck (want >= %d)", a, progress)
	}
	c.logf("group 1 stuck as it must be (%d elections started, no replica ready); forcing it to go on from replica %d", elections(c, 1, before), survivor)
	code, out, errOut := runOnce(t, c.bin, 90*time.Second, "force-new-cluster", "--config", c.path, "--group", "1", "--yes", "--timeout", "60s")
	if code != 0 || !strings.Contains(out, "serves again") {
		t.Fatalf("force-new-cluster --yes: exit %d, stdout %q, stderr %q%s", code, out, errOut, c.describe())
	}
	c.waitReady(30*time.Second, c.members(1)...)
	l.waitProgress(t, l.ackedNow(), progress, 30*time.Second, "after the force", c.describe)
	time.Sleep(500 * time.Millisecond)
}
