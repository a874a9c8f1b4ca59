package multicast_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/groupproc"
	"github.com/rdmakv/rdmakv/internal/mcproc"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/mcheck"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/shm"
)

// rpChildEnv makes a re-executed test binary an mcproc process (a TRAM
// replica or client, as its config line says).
const rpChildEnv = "MULTICAST_REALPROC_CHILD"

// rpRoundsEnv asks TestRealProc for that many more kill rounds (the test's
// deadline grows with them); with rpClientKillsEnv set, half of them also
// kill -9 a client process and start a new incarnation in its slot.
const (
	rpRoundsEnv      = "MULTICAST_REALPROC_ROUNDS"
	rpClientKillsEnv = "MULTICAST_REALPROC_CLIENT_KILLS"
)

// TestRealProcChild is the child's entry point: it does nothing in a
// normal run.
func TestRealProcChild(t *testing.T) {
	if os.Getenv(rpChildEnv) == "" {
		return
	}
	if err := mcproc.Serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "mcproc child: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// rpRace reports whether the binary was built with the race detector.
func rpRace() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// rpReplica is one replica's process and config.
type rpReplica struct {
	cfg mcproc.Config
	p   *mcproc.Proc // nil while down
}

// rpDone is one outcome's timing.
type rpDone struct {
	client        uint32
	start, done   int64 // Unix ns
	retries, ndst int
}

// rpCluster is TestRealProc's cluster of processes and its record of
// what they reported.
type rpCluster struct {
	t     *testing.T
	t0    time.Time
	chk   *mcheck.Checker
	reps  [][]*rpReplica
	cls   []*mcproc.Proc
	ccfgs []mcproc.Config

	mu       sync.Mutex
	failures []string
	dones    []rpDone
	restores map[[3]int]int // (group, replica, inc) -> restores
	events   int
	// killed client incarnations (as mcheck names clients) and the
	// messages that completed (for Final's Completed once a client died)
	deadClients map[uint64]bool
	completed   map[mcheck.MsgID]bool
}

func (c *rpCluster) since() time.Duration { return time.Since(c.t0).Round(time.Millisecond) }

func (c *rpCluster) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failures) < 50 {
		c.failures = append(c.failures, fmt.Sprintf("+%v ", c.since())+fmt.Sprintf(format, args...))
	}
}

// onEvent records one event line of any process in the checker.
func (c *rpCluster) onEvent(l *mcproc.Line) {
	var err error
	switch {
	case l.Deliver != nil:
		d := l.Deliver
		if d.Malformed {
			c.fail("group %d replica %d delivered a payload without an id at %d", d.Group, d.Replica, d.Index)
		}
		err = c.chk.Deliver(d.Group, d.Replica, d.Inc, d.Index, mcproc.CheckID(d.Msg), d.Result)
	case l.Restore != nil:
		r := l.Restore
		c.mu.Lock()
		c.restores[[3]int{int(r.Group), int(r.Replica), r.Inc}]++
		c.mu.Unlock()
		err = c.chk.Restore(r.Group, r.Replica, r.Inc, r.Index)
	case l.Multicast != nil:
		err = c.chk.Multicast(mcproc.CheckID(l.Multicast.Msg), uint64(l.Multicast.Dst))
	case l.Outcome != nil:
		o := l.Outcome
		if len(o.Replies) != o.Dst.Len() {
			c.fail("%v: %d replies for destinations %v", o.Msg, len(o.Replies), o.Dst)
		}
		for _, rp := range o.Replies {
			if e := c.chk.Reply(mcproc.CheckID(o.Msg), rp.Group, rp.Index, rp.Result); e != nil {
				err = e
			}
		}
		c.mu.Lock()
		c.dones = append(c.dones, rpDone{client: o.Msg.Client, start: o.StartNS, done: o.DoneNS, retries: o.Retries, ndst: o.Dst.Len()})
		c.completed[mcproc.CheckID(o.Msg)] = true
		c.mu.Unlock()
	case l.Failure != nil:
		c.fail("failure: %v dst %v: %s", l.Failure.Msg, l.Failure.Dst, l.Failure.Err)
	}
	c.mu.Lock()
	c.events++
	c.mu.Unlock()
	if err != nil {
		c.fail("checker: %v", err)
	}
}

func (c *rpCluster) spawn(cfg mcproc.Config) (*mcproc.Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^TestRealProcChild$")
	cmd.Env = append(os.Environ(), rpChildEnv+"=1")
	cmd.Stderr = os.Stderr
	return mcproc.Spawn(cmd, cfg, c.onEvent, 60*time.Second)
}

// spawnAll starts the given replicas in parallel.
func (c *rpCluster) spawnAll(rs []*rpReplica) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() { r.p, errs[i] = c.spawn(r.cfg) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			c.t.Fatalf("spawn group %d replica %d: %v", rs[i].cfg.Group, rs[i].cfg.Replica, err)
		}
	}
}

// status asks a live replica for its status (nil if down or silent).
func (c *rpCluster) status(r *rpReplica) *mcproc.Status {
	if r.p == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.p.Status(ctx)
	if err != nil {
		return nil
	}
	return &s
}

// leader waits until a live replica of group g leads a committed epoch
// and returns it (the highest epoch's, if a deposed one still says so).
func (c *rpCluster) leader(ctx context.Context, g int) int {
	c.t.Helper()
	for {
		best, be := -1, broadcast.Epoch(0)
		for i, r := range c.reps[g] {
			if s := c.status(r); s != nil && s.Leading && s.Epoch > be {
				best, be = i, s.Epoch
			}
		}
		if best >= 0 {
			return best
		}
		if ctx.Err() != nil {
			c.t.Fatalf("+%v: group %d has no leader: %v%s", c.since(), g, ctx.Err(), c.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// describe lists every replica's status for a failure message.
func (c *rpCluster) describe() string {
	var b strings.Builder
	for g, rs := range c.reps {
		for i, r := range rs {
			if s := c.status(r); s == nil {
				fmt.Fprintf(&b, "\n\tgroup %d replica %d: down or silent", g, i)
			} else {
				fmt.Fprintf(&b, "\n\tgroup %d replica %d inc %d: leading %v epoch %v delivered %d role %v index %d catching-up %v counters %+v anomalies %d/%d/%d",
					g, i, s.Inc, s.Leading, s.Epoch, s.Delivered, s.Broadcast.Role, s.Broadcast.Index, s.Broadcast.CatchingUp, s.Counters, s.Dups, s.Gaps, s.Stale)
			}
		}
	}
	return b.String()
}

// outcomesSince counts, per client slot, the outcomes of calls started
// after t.
func (c *rpCluster) outcomesSince(t time.Time) map[uint32]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := map[uint32]int{}
	for _, d := range c.dones {
		if d.start > t.UnixNano() {
			n[d.client]++
		}
	}
	return n
}

// waitProgress waits until every client completed at least n calls that
// started after t.
func (c *rpCluster) waitProgress(ctx context.Context, t time.Time, n int, what string) time.Duration {
	c.t.Helper()
	for {
		got := c.outcomesSince(t)
		ok := true
		for k := range c.cls {
			if got[uint32(k)] < n {
				ok = false
			}
		}
		if ok {
			return time.Since(t)
		}
		if ctx.Err() != nil {
			c.mu.Lock()
			f := slices.Clone(c.failures)
			c.mu.Unlock()
			c.t.Fatalf("+%v: %s: clients made no progress (%v of %d calls each): %v; failures %q%s", c.since(), what, got, n, ctx.Err(), f, c.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stall describes the clients' view of a kill at k: when the first call
// started after it completed, the longest gap between completions
// around it, the slowest call that completed after it, and the
// throughput of the second before and after.
func (c *rpCluster) stall(k time.Time) string {
	c.mu.Lock()
	ds := slices.Clone(c.dones)
	c.mu.Unlock()
	kn := k.UnixNano()
	var times []int64
	first := int64(-1)
	var slow int64
	before, after := 0, 0
	for _, d := range ds {
		if d.done >= kn-int64(100*time.Millisecond) && d.done <= kn+int64(3*time.Second) {
			times = append(times, d.done)
		}
		if d.start > kn && (first < 0 || d.done < first) {
			first = d.done
		}
		if d.done > kn && d.start < kn+int64(time.Second) {
			slow = max(slow, d.done-d.start)
		}
		switch {
		case d.done > kn-int64(time.Second) && d.done <= kn:
			before++
		case d.done > kn && d.done <= kn+int64(time.Second):
			after++
		}
	}
	slices.Sort(times)
	var gap int64
	for i := 1; i < len(times); i++ {
		gap = max(gap, times[i]-times[i-1])
	}
	return fmt.Sprintf("first call started after the kill done in %v; longest gap between completions %v; slowest call done after it %v; completions in the second before/after: %d/%d",
		time.Duration(first-kn).Round(100*time.Microsecond), time.Duration(gap).Round(100*time.Microsecond),
		time.Duration(slow).Round(100*time.Microsecond), before, after)
}

// kill kills the leaders of groups gs (all at one instant), waits for new
// leaders and for the clients to make progress, keeps the load on for
// down, then restarts the killed replicas with their stable files and
// waits until they caught up.
func (c *rpCluster) kill(ctx context.Context, round int, gs []int, down time.Duration) {
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
				c.fail("kill group %d replica %d: %v", g, i, err)
			}
		})
	}
	wg.Wait()
	var elect []string
	for _, g := range gs {
		n := c.leader(ctx, g)
		elect = append(elect, fmt.Sprintf("g%d: replica %d -> %d after %v", g, victims[g], n, time.Since(at).Round(time.Millisecond)))
	}
	prog := c.waitProgress(ctx, at, 50, fmt.Sprintf("round %d after the kill", round))
	c.t.Logf("+%v round %d: kill -9 of the leaders %v; new leaders: %s; 50 new calls per client done %v after the kill", c.since(), round, victims, strings.Join(elect, ", "), prog.Round(time.Millisecond))
	if rest := down - time.Since(at); rest > 0 {
		time.Sleep(rest)
	}
	// Restart each with its config and stable file: it rejoins.
	var rs []*rpReplica
	targets := map[*rpReplica]uint64{}
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
	spawned := time.Since(rat)
	for _, r := range rs {
		for {
			s := c.status(r)
			if s != nil && s.Delivered >= targets[r] && !s.Broadcast.CatchingUp {
				break
			}
			if ctx.Err() != nil {
				c.t.Fatalf("+%v: round %d: restarted group %d replica %d did not catch up to %d: %+v%s", c.since(), round, r.cfg.Group, r.cfg.Replica, targets[r], s, c.describe())
			}
			time.Sleep(2 * time.Millisecond)
		}
		c.mu.Lock()
		nr := c.restores[[3]int{int(r.cfg.Group), int(r.cfg.Replica), r.cfg.Inc}]
		c.mu.Unlock()
		how := "by replaying the log"
		if nr > 0 {
			how = fmt.Sprintf("by snapshot (%d restores)", nr)
		}
		c.t.Logf("+%v round %d: group %d replica %d restarted (inc %d, processes up in %v), caught up to %d %s %v after the restart",
			c.since(), round, r.cfg.Group, r.cfg.Replica, r.cfg.Inc, spawned.Round(time.Millisecond), targets[r], how, time.Since(rat).Round(time.Millisecond))
	}
	c.t.Logf("+%v round %d: clients: %s", c.since(), round, c.stall(at))
}

// killClient kills client k's process and starts a new incarnation in its
// slot.
func (c *rpCluster) killClient(k int) {
	c.t.Helper()
	p := c.cls[k]
	c.cls[k] = nil
	if err := p.Kill(); err != nil {
		c.t.Fatalf("kill client %d: %v", k, err)
	}
	c.mu.Lock()
	c.deadClients[mcproc.CheckID(multicast.MsgID{Client: uint32(k), Inc: p.ClientInc()}).Client] = true
	c.mu.Unlock()
	cfg := c.ccfgs[k]
	cfg.Load.Seed = uint64(time.Now().UnixNano())
	at := time.Now()
	np, err := c.spawn(cfg)
	if err != nil {
		c.t.Fatalf("restart client %d: %v", k, err)
	}
	c.cls[k] = np
	c.t.Logf("+%v: client %d killed and started again (incarnation %d registered in %v)", c.since(), k, np.ClientInc(), time.Since(at).Round(time.Millisecond))
}

// TestRealProc is TRAM with real processes: 3 groups (tree 0:1,2) of 3
// replicas on the shm fabric, each replica an OS process with its stable
// state in a file, and 2 client processes whose 8 goroutines each
// multicast to random destination sets. Under load it kills -9 the leader
// of every group at one instant, restarts them (they rejoin with empty
// memory and catch up by snapshot, which their FSM reports), then kills
// the root group's leader again and restarts it (-short: the first round
// only, with shorter loads). Clients must make progress after
// each kill and no call may fail (the client retries by itself); at the
// end every replica delivered its group's whole sequence, no replica saw
// an anomaly, and the recorded deliveries, restores, multicasts and
// replies pass every mcheck property.
func TestRealProc(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	race := rpRace()
	warm, run := 3*time.Second, time.Second
	if testing.Short() {
		warm, run = time.Second, 500*time.Millisecond
	}
	dir, err := shm.MkdirOwned("/dev/shm", "mcproc-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	stable := t.TempDir()

	const treeSpec = "0:1,2"
	tr, err := tree.Parse(treeSpec)
	if err != nil {
		t.Fatal(err)
	}
	members := [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
	cnodes := []rdma.NodeID{100, 101}
	hb, et := 5*time.Millisecond, 50*time.Millisecond
	retry := 100 * time.Millisecond
	base := mcproc.Config{ShmDir: dir, ShmCluster: "mc", Spin: -1, PeerTimeout: 500 * time.Millisecond,
		Tree: treeSpec, Members: members, ClientNodes: cnodes, ClientSlots: 8}
	c := &rpCluster{t: t, t0: time.Now(), chk: mcheck.New(tr.Len()), restores: map[[3]int]int{},
		deadClients: map[uint64]bool{}, completed: map[mcheck.MsgID]bool{}}
	defer func() { // whatever happened: no process outlives the test
		for _, rs := range c.reps {
			for _, r := range rs {
				if r.p != nil {
					r.p.Kill()
				}
			}
		}
		for _, p := range c.cls {
			if p != nil {
				p.Kill()
			}
		}
	}()
	extra, _ := strconv.Atoi(os.Getenv(rpRoundsEnv))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second+time.Duration(max(extra, 0))*10*time.Second)
	defer cancel()

	var all []*rpReplica
	for g, ms := range members {
		var rs []*rpReplica
		for i := range ms {
			cfg := base
			cfg.Role, cfg.Group, cfg.Replica, cfg.Inc = mcproc.RoleReplica, tree.Group(g), uint32(i), 1
			cfg.StablePath = filepath.Join(stable, fmt.Sprintf("g%d-r%d.stable", g, i))
			cfg.Start = broadcast.StartNew
			cfg.Tuning = groupproc.Tuning{RingSize: 256 << 10, HeartbeatInterval: hb, ElectionTimeout: et}
			r := &rpReplica{cfg: cfg}
			rs = append(rs, r)
			all = append(all, r)
		}
		c.reps = append(c.reps, rs)
	}
	c.spawnAll(all)
	for g := range members {
		c.leader(ctx, g)
	}
	t.Logf("+%v: %d replica processes up (race %v), every group has a leader", c.since(), len(all), race)

	c.cls = make([]*mcproc.Proc, len(cnodes))
	var wg sync.WaitGroup
	cerrs := make([]error, len(cnodes))
	for k := range cnodes {
		cfg := base
		cfg.Role, cfg.Slot, cfg.RetryAfter = mcproc.RoleClient, uint32(k), retry
		cfg.Load = mcproc.LoadSpec{Workers: 8, PayloadSize: 64, CallTimeout: 30 * time.Second, Seed: uint64(k + 1)}
		c.ccfgs = append(c.ccfgs, cfg)
		wg.Go(func() { c.cls[k], cerrs[k] = c.spawn(cfg) })
	}
	wg.Wait()
	for k, err := range cerrs {
		if err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
	}
	loadAt := time.Now()
	t.Logf("+%v: %d client processes registered and loading", c.since(), len(cnodes))
	c.waitProgress(ctx, loadAt, 50, "warm-up")
	time.Sleep(warm - time.Since(loadAt))
	c.t.Logf("+%v: warm-up: outcomes per client %v", c.since(), c.outcomesSince(time.Time{}))

	c.kill(ctx, 1, []int{0, 1, 2}, run/2)
	time.Sleep(run)
	if !testing.Short() {
		c.kill(ctx, 2, []int{0}, run/2)
		time.Sleep(run / 2)
	}
	// More rounds on request, back to back: the leaders of a random set
	// of groups, often one elected in the round before.
	if n, _ := strconv.Atoi(os.Getenv(rpRoundsEnv)); n > 0 {
		seed := uint64(time.Now().UnixNano())
		t.Logf("%d more rounds, seed %d", n, seed)
		rng := rand.New(rand.NewPCG(seed, 0))
		for i := range n {
			var gs []int
			for len(gs) == 0 {
				for g := range members {
					if rng.IntN(2) == 0 {
						gs = append(gs, g)
					}
				}
			}
			if os.Getenv(rpClientKillsEnv) != "" && rng.IntN(2) == 0 {
				c.killClient(rng.IntN(len(c.cls)))
			}
			c.kill(ctx, 3+i, gs, time.Duration(rng.Int64N(int64(run/2))))
		}
		time.Sleep(run / 2)
	}

	// Stop the load: every call in progress completes.
	stopAt := time.Now()
	var total mcproc.LoadResult
	for k, p := range c.cls {
		sctx, scancel := context.WithTimeout(ctx, 40*time.Second)
		res, err := p.StopLoad(sctx)
		scancel()
		if err != nil {
			t.Fatalf("client %d: stop: %v%s", k, err, c.describe())
		}
		t.Logf("client %d: %+v", k, res)
		if res.Failed > 0 || res.Completed != res.Multicast {
			t.Errorf("client %d: %d calls failed, %d of %d multicast completed", k, res.Failed, res.Completed, res.Multicast)
		}
		total.Multicast += res.Multicast
		total.Completed += res.Completed
		total.Retried += res.Retried
		total.Retries += res.Retries
	}
	t.Logf("+%v: load stopped in %v: %d messages multicast, %d completed (%d after retries, %d retries in all)",
		c.since(), time.Since(stopAt).Round(time.Millisecond), total.Multicast, total.Completed, total.Retried, total.Retries)

	// Converge: every replica delivers what its group's longest did.
	convAt := time.Now()
	var final [][]mcproc.Status
	for {
		final = final[:0]
		done := true
		for _, rs := range c.reps {
			var ss []mcproc.Status
			var most uint64
			for _, r := range rs {
				s := c.status(r)
				if s == nil {
					t.Fatalf("group %d replica %d not answering at the end%s", r.cfg.Group, r.cfg.Replica, c.describe())
				}
				ss = append(ss, *s)
				most = max(most, s.Delivered)
			}
			for _, s := range ss {
				if s.Delivered != most {
					done = false
				}
			}
			final = append(final, ss)
		}
		if done {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("replicas did not converge: %v%s", ctx.Err(), c.describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for g, ss := range final {
		var parts []string
		for i, s := range ss {
			parts = append(parts, fmt.Sprintf("r%d(inc %d) %d", i, s.Inc, s.Delivered))
			if s.Leading {
				c := s.Counters
				parts = append(parts, fmt.Sprintf("(leader: ordered %d, forwarded %d, retransmits %d, replies %d, resets %d, blocked %d, dropped %d)",
					c.Ordered, c.Forwarded, c.Retransmits, c.Replies, c.Resets, c.Blocked, c.Dropped))
			}
			if s.Dups != 0 || s.Gaps != 0 || s.Stale != 0 {
				t.Errorf("group %d replica %d: anomalies: %d duplicates, %d gaps, %d stale", g, i, s.Dups, s.Gaps, s.Stale)
			}
			if s.Counters.Malformed != 0 {
				t.Errorf("group %d replica %d: %d malformed records", g, i, s.Counters.Malformed)
			}
		}
		t.Logf("group %d delivered: %s", g, strings.Join(parts, ", "))
	}
	t.Logf("+%v: converged in %v", c.since(), time.Since(convAt).Round(time.Millisecond))

	// Close every process cleanly: each writes its last lines and removes
	// its shm files.
	var cwg sync.WaitGroup
	for _, rs := range c.reps {
		for _, r := range rs {
			cwg.Go(func() {
				if err := r.p.Close(20 * time.Second); err != nil {
					c.fail("group %d replica %d: exit: %v", r.cfg.Group, r.cfg.Replica, err)
				}
				r.p = nil
			})
		}
	}
	for k, p := range c.cls {
		cwg.Go(func() {
			if err := p.Close(20 * time.Second); err != nil {
				c.fail("client %d: exit: %v", k, err)
			}
		})
	}
	cwg.Wait()
	c.cls = nil

	live := map[uint32][]uint32{}
	for g, rs := range c.reps {
		for i := range rs {
			live[uint32(g)] = append(live[uint32(g)], uint32(i))
		}
	}
	// A killed client's messages without an outcome may or may not be
	// delivered; every other message must be.
	err = c.chk.Final(mcheck.FinalOptions{Live: live, Completed: func(id mcheck.MsgID) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.deadClients[id.Client] || c.completed[id]
	}})
	st := c.chk.Stats()
	t.Logf("+%v: checker: %d messages, %d deliveries, %d replies, group lengths %v, %d event lines", c.since(), st.Messages, st.Deliveries, st.Replies, st.GroupLen, c.events)
	if err != nil {
		t.Errorf("mcheck: %v", err)
	}
	for _, f := range c.failures {
		t.Error(f)
	}
	nres := 0
	for _, n := range c.restores {
		nres += n
	}
	if nres == 0 {
		t.Errorf("no restarted replica restored a snapshot: the FSM's Restore went untested")
	}
	if len(c.deadClients) == 0 && st.Messages != total.Multicast {
		t.Errorf("checker saw %d messages, clients multicast %d", st.Messages, total.Multicast)
	}

	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		if e.Name() != "rdmakv.owner" {
			left = append(left, e.Name())
		}
	}
	if len(left) > 0 {
		t.Errorf("shm files left behind after every process closed: %v", left)
	}
}
