package e2e

import (
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
)

// TestWholeGroupKillSync (issue 19 D5, sync mode): 2 groups x 3 kvserver
// processes on shm with durability sync, under the kill test's load of
// linearizable gets, puts, deletes and compare-and-swaps. All three
// replicas of group 1 are killed with kill -9 at once, and restarted from
// their data dirs after 0.2-2 s; they read their logs back, elect, and the
// load goes on. The history, final reads of every key included, must be
// linearizable (porcupine): nothing acknowledged was lost.
//
// The planted fault (TestWholeGroupKillSyncPlanted) restarts the three
// with their data dirs wiped: the same check must then fail, which proves
// it can see an acknowledged write lost.
func TestWholeGroupKillSync(t *testing.T) {
	h, final, keys := wholeGroupKill(t, false)
	n := checkFinal(t, h, keys, final)
	t.Logf("final reads: %d of %d keys present; %d keys' last writes checked directly", len(final), len(keys), n)
	checkHistory(t, h)
}

// TestWholeGroupKillSyncPlanted: the whole-group kill with the restarted
// replicas' data dirs wiped (as if they ran in memory mode) must be
// caught by the linearizability check of the history with its final
// reads: acknowledged writes lost.
func TestWholeGroupKillSyncPlanted(t *testing.T) {
	h, _, _ := wholeGroupKill(t, true)
	res, err := kvcheck.CheckLinearizable(h, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome == kvcheck.Ok {
		t.Fatalf("group 1 restarted with wiped data dirs and the history still checks as linearizable: the check cannot see acknowledged writes lost (%s)", summary(h))
	}
	t.Logf("caught, as it must be: %v", res.Err())
}

func wholeGroupKill(t *testing.T, wipe bool) (h []kvcheck.Op, final map[string]string, keys []string) {
	if testing.Short() {
		t.Skip("runs 6 kvserver processes")
	}
	const groups, progress = killGroups, killProgress
	c, cls, l, seed := startKillLoad(t, "wgk", "sync")
	time.Sleep(700 * time.Millisecond)
	c.logf("load running (seed %d); acknowledged writes per group %v", seed, l.ackedNow())

	victims := c.members(1)
	for _, id := range victims {
		c.kill(id)
	}
	down := time.Duration(200+rand.New(rand.NewPCG(seed, 1)).IntN(1800)) * time.Millisecond
	c.logf("kill -9 of group 1 (%v) at once; restarting in %v", victims, down)
	time.Sleep(down)
	mark := l.ackedNow()
	for _, id := range victims {
		if wipe {
			if err := os.RemoveAll(c.cfg.ReplicaDir(id)); err != nil {
				t.Fatal(err)
			}
		}
		c.start(id)
	}
	if wipe {
		time.Sleep(3 * time.Second) // the emptied group may not serve these clients: no progress to wait for
	} else {
		c.waitReady(30*time.Second, victims...)
		for _, id := range victims {
			if p := c.proc(id); !p.logged("recovered ") {
				t.Errorf("replica %d logged no recovery line: %s", id, tail(p.stderr.String(), 2<<10))
			}
		}
		l.waitProgress(t, mark, progress, 30*time.Second, "after the restart", c.describe)
		time.Sleep(700 * time.Millisecond)
	}
	if !l.end(2*l.timeout) && !wipe {
		t.Fatalf("the workers' calls had not returned %v after the load stopped%s", 2*l.timeout, c.describe())
	}
	final, err := l.finalReads(cls[0])
	if err != nil && !wipe {
		t.Fatal(err)
	}
	if !wipe {
		nerr, errs := l.errors()
		for _, e := range errs {
			t.Errorf("unexpected error: %s", e)
		}
		if nerr > len(errs) {
			t.Errorf("and %d more unexpected errors", nerr-len(errs))
		}
		c.waitConverged(30 * time.Second)
	}
	c.logf("load stopped: %d calls, acknowledged writes per group %v, %d of unknown outcome", l.ops.Load(), l.ackedNow(), l.unknown.Load())
	return l.rec.History(), final, l.keys
}

// The load of the kill tests (wholeGroupKill, majorityKill): 2 groups x 3
// replicas, 2 clients of 3 workers each over 16 keys; killProgress
// acknowledged writes per group mark progress.
const killGroups, killNKeys, killClients, killWorkers, killProgress = 2, 16, 2, 3, 20

// startKillLoad starts the kill tests' cluster (shm, durability mode,
// cluster name from name) and their recorded load, and waits for its
// warm-up progress in every group.
func startKillLoad(t *testing.T, name, mode string) (*tcluster, []*client.Client, *load, uint64) {
	t.Helper()
	s := loopbackSpec(t, name, "shm", killGroups)
	s.Durability = mode
	c := newCluster(t, s)
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cls := make([]*client.Client, killClients)
	for k := range cls {
		cls[k] = c.openClient(k)
	}
	l := newLoad(cls[0].Map(), killNKeys, 15*time.Second, 2*time.Millisecond)
	t.Cleanup(func() { l.end(0) })
	seed := uint64(time.Now().UnixNano())
	for _, cl := range cls {
		l.start(cl, killWorkers, seed)
	}
	l.waitProgress(t, make([]int64, killGroups), killProgress, 20*time.Second, "warm-up", c.describe)
	return c, cls, l, seed
}
