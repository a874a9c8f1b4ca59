package kvproc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/internal/kvproc"
)

// testTuning is the replicas' Acuerdo tuning: a heartbeat every 5 ms, an
// election after 50 ms of silence, and a short log (512 entries), so that
// a restarted replica catches up by snapshot.
var testTuning = kvproc.Tuning{RingSize: 256 << 10, HeartbeatInterval: 5 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
	MaxLogEntries: 512}

// kill kills -9 the leaders of groups gs at one instant (found from the
// replicas' status lines), waits for new leaders and for every client to
// make progress (and every group to acknowledge writes), then restarts the
// killed replicas with their stable files, waits until they caught up, and
// for progress again.
func (c *kvCluster) kill(ctx context.Context, l *kvLoad, nclients int, round int, gs []int) {
	c.t.Helper()
	victims := map[int]int{}
	for _, g := range gs {
		victims[g] = c.leader(ctx, g)
	}
	var wg sync.WaitGroup
	at := time.Now()
	for g, i := range victims {
		r := c.reps[g][i]
		p := r.p
		r.p = nil
		wg.Go(func() {
			if err := p.Kill(); err != nil {
				c.t.Errorf("kill group %d replica %d: %v", g, i, err)
			}
		})
	}
	wg.Wait()
	var elect []string
	for _, g := range gs {
		n := c.leader(ctx, g)
		elect = append(elect, fmt.Sprintf("g%d: replica %d -> %d after %v", g, victims[g], n, time.Since(at).Round(time.Millisecond)))
	}
	c.waitProgress(ctx, l, nclients, at, fmt.Sprintf("round %d, after the kill", round))
	c.t.Logf("+%v (%s) round %d: kill -9 of the leaders %v; new leaders: %s; progress (%d ops per client, %d writes per group) %v after the kill",
		c.since(), at.Format("15:04:05.000"), round, victims, strings.Join(elect, ", "), perClient, perGroup, time.Since(at).Round(time.Millisecond))
	// Restart each with its config and stable file: it rejoins.
	var rs []*replica
	targets := map[*replica]uint64{}
	for g, i := range victims {
		r := c.reps[g][i]
		r.cfg.Inc++
		r.cfg.Start = broadcast.StartExisting
		rs = append(rs, r)
		for _, o := range c.reps[g] {
			if s := c.status(o); s != nil {
				targets[r] = max(targets[r], s.Delivered)
			}
		}
	}
	rat := time.Now()
	c.spawnAll(rs)
	for _, r := range rs {
		s := c.waitCaughtUp(ctx, r, targets[r], fmt.Sprintf("round %d", round))
		how := "by log"
		if s.SnapshotsRestored > 0 {
			how = fmt.Sprintf("by snapshot (%d restored)", s.SnapshotsRestored)
		}
		c.t.Logf("+%v round %d: group %d replica %d restarted (inc %d, StartExisting), caught up to %d %s %v after the restart",
			c.since(), round, r.cfg.Group, r.cfg.Replica, r.cfg.Inc, targets[r], how, time.Since(rat).Round(time.Millisecond))
	}
	c.waitProgress(ctx, l, nclients, rat, fmt.Sprintf("round %d, after the restart", round))
	c.t.Logf("+%v round %d: progress after the restart; clients around the kill: %s", c.since(), round, l.stall(at))
}

// Progress: each client completes perClient ops, and each group
// acknowledges perGroup writes, called after a kill or a restart.
const perClient, perGroup = 30, 10

// waitProgress waits until the clients made progress since t.
func (c *kvCluster) waitProgress(ctx context.Context, l *kvLoad, nclients int, t time.Time, what string) {
	c.t.Helper()
	for {
		ops, writes := l.progress(t, nclients, len(c.reps))
		ok := true
		for _, n := range ops {
			ok = ok && n >= perClient
		}
		for _, n := range writes {
			ok = ok && n >= perGroup
		}
		if ok {
			return
		}
		if ctx.Err() != nil {
			n, errs := l.errors()
			c.t.Fatalf("+%v: %s: no progress (ops per client %v, acknowledged writes per group %v; want %d and %d): %v; %d client errors %q%s",
				c.since(), what, ops, writes, perClient, perGroup, ctx.Err(), n, errs, c.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestRealProcKV is the kv store with real processes: 2 groups of 3
// replicas on the shm fabric, each replica an OS process with its stable
// state in a file, and 3 clients in the test process (each on its own
// client slot and shm node) doing a random mix of linearizable and
// stale-ok gets, puts, deletes, compare-and-swaps and batches over 32
// keys. Under load it kills -9 the leader of every group at one instant,
// restarts them (they rejoin with empty memory and catch up, by snapshot
// with the short log used here), then kills group 0's leader again and
// restarts it. The clients must make progress after each kill and no call
// may fail. At the end every replica of a group has applied the same
// entries, stale-ok gets of every key from each replica (fresh clients
// near each one) agree with linearizable gets, every process exits
// cleanly leaving no shm file, and the recorded history is linearizable
// (kvcheck.CheckLinearizable) with stale-ok gets keeping their promises
// (kvcheck.CheckStale).
func TestRealProcKV(t *testing.T) {
	race := raceEnabled()
	warm, run := 1500*time.Millisecond, time.Second
	if testing.Short() {
		warm, run = 500*time.Millisecond, 300*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const groups, nclients, keys = 2, 3, 32
	c := newCluster(t, ctx, groups, 2*nclients, testTuning)
	t.Logf("+%v: %d replica processes up (race %v), every group has a leader; cluster %q in %s", c.since(), 3*groups, race, c.m.Name, c.dir)

	// Clients: slots 0..2 run the load, slots 3..5 (one near each
	// replica) read every key at the end.
	cls := make([]*client.Client, 2*nclients)
	defer func() {
		for _, cl := range cls {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(cls))
	for k := range cls {
		wg.Go(func() {
			cls[k], errs[k] = c.openClient(ctx, k, client.WithTimeout(30*time.Second), client.WithNearReplica(k%3))
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("open client %d: %v", k, err)
		}
	}
	l := newLoad(c.t0, c.m, keys, 20*time.Second, 300*time.Microsecond)
	loadAt := time.Now()
	for k := range nclients {
		l.start(k, cls[k], uint64(loadAt.UnixNano()))
	}
	defer l.end(0) // on failure: stop the workers (closing the clients ends their calls)
	t.Logf("+%v: %d clients registered and loading", c.since(), nclients)
	time.Sleep(warm)
	ops, writes := l.progress(loadAt, nclients, groups)
	t.Logf("+%v: warm-up: ops per client %v, acknowledged writes per group %v", c.since(), ops, writes)

	c.kill(ctx, l, nclients, 1, []int{0, 1})
	time.Sleep(run)
	c.kill(ctx, l, nclients, 2, []int{0})
	time.Sleep(run / 2)

	stopAt := time.Now()
	if !l.end(2 * l.callTimeout) {
		t.Fatalf("+%v: the clients' calls under way had not returned %v after the load stopped%s", c.since(), 2*l.callTimeout, c.describe())
	}
	t.Logf("+%v: load stopped in %v: %s", c.since(), time.Since(stopAt).Round(time.Millisecond), l.counts())
	l.mu.Lock()
	for _, s := range l.slow {
		t.Logf("slow: %s", s)
	}
	l.mu.Unlock()

	// Converge: every replica applied what its group's most advanced did.
	final := c.converge(ctx)
	for g, ss := range final {
		var parts []string
		for i, s := range ss {
			parts = append(parts, fmt.Sprintf("r%d(inc %d%s) delivered %d applied %d records %d", i, s.Inc, map[bool]string{true: ", leader"}[s.Leading], s.Delivered, s.Applied, s.Records))
			if s.Dups != 0 || s.Gaps != 0 || s.Stale != 0 {
				t.Errorf("group %d replica %d: anomalies: %d duplicates, %d gaps, %d stale", g, i, s.Dups, s.Gaps, s.Stale)
			}
			if s.Records != ss[0].Records {
				t.Errorf("group %d: replica %d holds %d records, replica 0 %d", g, i, s.Records, ss[0].Records)
			}
		}
		t.Logf("group %d: %s", g, strings.Join(parts, ", "))
	}

	// Every key, from every replica: the stale-ok gets of the clients
	// near each replica agree with a linearizable get (value and
	// version). They are recorded too.
	for key := range keys {
		k := fmt.Sprintf("k%d", key)
		g := l.groupOf(k)
		id := l.rec.Begin(0, kvcheck.Op{Kind: kvcheck.Get, Key: k})
		want, werr := cls[0].GetItem(ctx, []byte(k), client.Linearizable)
		if werr != nil && !errors.Is(werr, client.ErrNotFound) {
			l.rec.End(id, kvcheck.Output{Unknown: true})
			t.Fatalf("final get %q: %v", k, werr)
		}
		l.rec.End(id, kvcheck.Output{Found: werr == nil, Value: string(want.Value), Applied: want.Applied, Group: g})
		// A linearizable get's Applied is a lower bound only: the
		// reader brackets its reads with the header it cached at its
		// last read of that member, however old (kv.GroupReader).
		if want.Applied > final[g][0].Applied {
			t.Errorf("final get %q: applied %d, beyond the group's %d", k, want.Applied, final[g][0].Applied)
		}
		for i := range 3 {
			cl := cls[nclients+i]
			id := l.rec.Begin(nclients+i, kvcheck.Op{Kind: kvcheck.Get, Key: k, Stale: true})
			it, err := cl.GetItem(ctx, []byte(k), client.StaleOK)
			if err != nil && !errors.Is(err, client.ErrNotFound) {
				l.rec.End(id, kvcheck.Output{Unknown: true})
				t.Fatalf("final stale-ok get %q near replica %d: %v", k, i, err)
			}
			l.rec.End(id, kvcheck.Output{Found: err == nil, Value: string(it.Value), Applied: it.Applied, Group: g})
			if node := c.m.Groups[g][i]; it.Replica != node {
				t.Errorf("final stale-ok get %q near replica %d read node %d, want %d", k, i, it.Replica, node)
			}
			if (err == nil) != (werr == nil) || string(it.Value) != string(want.Value) || it.Version != want.Version || it.Applied != final[g][i].Applied {
				t.Errorf("key %q: group %d replica %d has %q version %x (err %v) applied %d (its status: %d); the leader %q version %x (err %v)",
					k, g, i, it.Value, it.Version, err, it.Applied, final[g][i].Applied, want.Value, want.Version, werr)
			}
		}
	}

	// Close everything cleanly: no shm file may be left.
	for k, cl := range cls {
		if err := cl.Close(); err != nil {
			t.Errorf("client %d: close: %v", k, err)
		}
		cls[k] = nil
	}
	c.closeAll()
	c.checkNoFiles()

	n, cerrs := l.errors()
	for _, e := range cerrs {
		t.Error(e)
	}
	if n > len(cerrs) {
		t.Errorf("and %d more client errors", n-len(cerrs))
	}

	hist := l.rec.History()
	nstale := 0
	for i := range hist {
		if hist[i].Stale {
			nstale++
		}
	}
	checkAt := time.Now()
	res, err := kvcheck.CheckLinearizable(hist, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != kvcheck.Ok {
		t.Errorf("linearizability: %v\n%s", res.Err(), failedOps(hist, res))
		keys := map[string]bool{}
		for _, p := range res.Failed {
			for _, k := range p.Keys {
				keys[k] = true
			}
		}
		var gets []int
		for i := range hist {
			if hist[i].Kind == kvcheck.Get && keys[hist[i].Key] {
				gets = append(gets, i)
			}
		}
		for _, h := range halfBatches(hist, gets) {
			t.Errorf("a get saw a batch half applied (the known kv bug TestBatchAtomicForReaders shows): %s", h)
		}
	}
	if err := kvcheck.CheckStale(hist); err != nil {
		t.Errorf("stale-ok gets: %v", err)
		var ses []*kvcheck.StaleError
		if je, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range je.Unwrap() {
				if se, ok := e.(*kvcheck.StaleError); ok {
					ses = append(ses, se)
				}
			}
		}
		var pos []int
		for _, se := range ses {
			pos = append(pos, se.Pos)
		}
		for _, h := range halfBatches(hist, pos) {
			t.Errorf("a stale-ok get saw a batch half applied (the known kv bug TestBatchAtomicForReaders shows): %s", h)
		}
		for i, se := range ses {
			if i == 3 {
				break
			}
			t.Logf("ops on %q around stale get %d (at +%v, times since the test began):\n%s", se.Op.Key, se.Pos, time.Duration(se.Op.Call),
				l.keyOps(hist, se.Op.Key, se.Op.Call, 200*time.Millisecond))
		}
		c.mu.Lock()
		t.Logf("replica events:\n\t%s", strings.Join(c.log, "\n\t"))
		c.mu.Unlock()
	}
	t.Logf("+%v: history of %d ops (%d stale-ok gets) in %d partitions checked in %v: %v", c.since(), len(hist), nstale, len(res.Partitions),
		time.Since(checkAt).Round(time.Millisecond), res.Outcome)
}
