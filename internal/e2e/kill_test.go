package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// TestProcessesKillRestartUnderLoad runs 2 groups x 3 kvserver processes,
// on shm and on tcp over loopback, under a load of linearizable gets,
// puts, deletes and compare-and-swaps on 16 keys (6 workers sharing 2
// clients of the test process). Under the load it
//
//   - kills -9 the leader of every group at once (found through the
//     control ports' /status), waits for new leaders and for writes to be
//     acknowledged in every group, restarts the killed replicas from their
//     data dirs (they must restart as the same members: start=existing)
//     and waits until they are ready (/readyz) and writes go on; twice;
//   - kills -9 a follower of group 0 and restarts it the same way.
//
// Then the load stops, a final linearizable get of every key joins the
// history, and every replica must have applied what its group's leader
// applied (/status). The history, calls with their invoke and return
// times and writes of unknown outcome as such, must be linearizable
// (porcupine through internal/kvcheck); it includes the final reads, so
// no acknowledged write may be lost. Every call but those of unknown
// outcome must succeed. At the end SIGTERM stops every replica with exit
// code 0, and on shm no file is left in the shm dir.
func TestProcessesKillRestartUnderLoad(t *testing.T) {
	for _, fabric := range []string{"shm", "tcp"} {
		t.Run(fabric, func(t *testing.T) { testKillRestart(t, fabric) })
	}
}

func testKillRestart(t *testing.T, fabric string) {
	const groups, keys, clients, workersPerClient = 2, 16, 2, 3
	race := raceEnabled()
	s := loopbackSpec(t, "kill", fabric, groups)
	c := newCluster(t, s)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	c.logf("%d replica processes of cluster %q on %s ready (race %v)", 3*groups, s.Name, fabric, race)

	cls := make([]*client.Client, clients)
	for k := range cls {
		cls[k] = c.openClient(k)
	}
	l := newLoad(cls[0].Map(), keys, 15*time.Second, 2*time.Millisecond)
	t.Cleanup(func() { l.end(0) })
	seed := uint64(time.Now().UnixNano())
	for _, cl := range cls {
		l.start(cl, workersPerClient, seed)
	}
	const progress = 20                  // acknowledged writes per group after each fault
	const dwell = 700 * time.Millisecond // the load runs this long between faults
	l.waitProgress(t, make([]int64, groups), progress, 20*time.Second, "warm-up", c.describe)
	time.Sleep(dwell)
	c.logf("load running (seed %d): %d workers on %d clients, %d keys; acknowledged writes per group %v", seed, clients*workersPerClient, clients, keys, l.ackedNow())

	all := make([]int, groups)
	for g := range all {
		all[g] = g
	}
	for round := 1; round <= 2; round++ {
		victims := map[int]int64{}
		for _, g := range all {
			victims[g] = c.leader(g, 10*time.Second)
		}
		killRestart(t, c, l, fmt.Sprintf("round %d: the leaders", round), victims, progress)
		time.Sleep(dwell)
	}
	ldr := c.leader(0, 10*time.Second)
	killRestart(t, c, l, "a follower", map[int]int64{0: c.followers(0, ldr)[0]}, progress)
	time.Sleep(dwell)

	stopAt := time.Now()
	if !l.end(2 * l.timeout) {
		t.Fatalf("the workers' calls had not returned %v after the load stopped%s", 2*l.timeout, c.describe())
	}
	c.logf("load stopped in %v: %d calls, acknowledged writes per group %v, %d of unknown outcome", time.Since(stopAt).Round(time.Millisecond), l.ops.Load(), l.ackedNow(), l.unknown.Load())
	final, err := l.finalReads(cls[0])
	if err != nil {
		t.Fatal(err)
	}
	applied := c.waitConverged(20 * time.Second)
	c.logf("every replica applied what its leader applied: %v (group: applied index)", applied)

	nerr, errs := l.errors()
	for _, e := range errs {
		t.Errorf("unexpected error: %s", e)
	}
	if nerr > len(errs) {
		t.Errorf("and %d more unexpected errors", nerr-len(errs))
	}
	l.mu.Lock()
	for _, u := range l.unknowns {
		t.Logf("unknown outcome: %s", u)
	}
	for _, s := range l.slow {
		t.Logf("slow: %s", s)
	}
	l.mu.Unlock()
	h := l.rec.History()
	n := checkFinal(t, h, l.keys, final)
	t.Logf("final reads: %d of %d keys present; %d keys' last writes overlapped no other and were checked directly", len(final), keys, n)
	checkHistory(t, h)

	for k, cl := range cls {
		if err := cl.Close(); err != nil {
			t.Errorf("client %d: close: %v", k, err)
		}
	}
	for _, id := range c.allIDs() {
		if code := c.term(id); code != 0 {
			t.Errorf("replica %d: exit code %d after SIGTERM: %s", id, code, tail(c.proc(id).stderr.String(), 2<<10))
		}
	}
	if fabric == "shm" {
		if left, _ := os.ReadDir(s.ShmDir); len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("files left in the shm dir after every process stopped: %s", strings.Join(names, " "))
		}
	}
	c.logf("every replica stopped with exit code 0")
}

// killRestart kills -9 the replicas victims (group: replica) at once,
// waits for each group to have a leader among the others and for writes
// to be acknowledged in every group, restarts the victims from their data
// dirs and waits until they are ready and writes go on.
func killRestart(t *testing.T, c *tcluster, l *load, what string, victims map[int]int64, progress int64) {
	t.Helper()
	mark, at := l.ackedNow(), time.Now()
	for _, id := range victims {
		c.kill(id)
	}
	var leaders []string
	for g, id := range victims {
		nl := c.leader(g, 15*time.Second, id)
		leaders = append(leaders, fmt.Sprintf("group %d: %d", g, nl))
	}
	l.waitProgress(t, mark, progress, 20*time.Second, what+": after the kill", c.describe)
	c.logf("%s: kill -9 of %v (group: replica); leaders %s; writes acknowledged in every group %v after the kill",
		what, victims, strings.Join(leaders, ", "), time.Since(at).Round(time.Millisecond))
	rat := time.Now()
	mark = l.ackedNow()
	for _, id := range victims {
		p := c.start(id)
		if !p.logged("start=existing") {
			t.Errorf("replica %d did not restart as the same member (start=existing): %s", id, p.stderr.String())
		}
	}
	for _, id := range victims {
		c.waitReady(30*time.Second, id)
	}
	ready := time.Since(rat)
	l.waitProgress(t, mark, progress, 20*time.Second, what+": after the restart", c.describe)
	c.logf("%s: restarted from their data dirs, ready %v later; writes go on", what, ready.Round(time.Millisecond))
}
