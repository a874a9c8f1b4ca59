package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

const (
	// helperReplica runs one replica like kvserver --config C --id N
	// (the same server.RunReplicas, the same start and failure lines) on
	// a file system that fails as faultsEnv says.
	helperReplica = "replica"
	// faultsEnv is the errorfs spec: "KIND:ERRNO:ARMFILE": operations of
	// KIND (sync, or write: writes, preallocations and free-space
	// queries, which answer 0 free for ENOSPC) on the replica's
	// write-ahead log fail with ERRNO (EIO, ENOSPC) once ARMFILE exists:
	// EIO for good, ENOSPC while it exists (space returns when the test
	// removes it).
	faultsEnv = "RDMAKV_E2E_ERRORFS"
	// replicaArgsEnv holds the replica's kvserver arguments, separated by
	// \x1f.
	replicaArgsEnv = "RDMAKV_E2E_REPLICA_ARGS"
)

// armedFaults is the injector faultsEnv describes.
type armedFaults struct {
	kinds []errorfs.OpKind
	err   error
	arm   string
	armed atomic.Bool
	last  atomic.Int64 // when arm was last looked for (unix ns)
}

func parseFaults(spec string) (*armedFaults, error) {
	f := strings.SplitN(spec, ":", 3)
	if len(f) != 3 {
		return nil, fmt.Errorf("errorfs spec %q: want KIND:ERRNO:ARMFILE", spec)
	}
	a := &armedFaults{arm: f[2]}
	switch f[0] {
	case "sync":
		a.kinds = []errorfs.OpKind{errorfs.OpSync}
	case "write":
		// A full disk also says so to a free-space query (statfs: 0
		// free), as a real one does.
		a.kinds = []errorfs.OpKind{errorfs.OpWrite, errorfs.OpAllocate, errorfs.OpStatFS}
	default:
		return nil, fmt.Errorf("errorfs spec %q: kind %q", spec, f[0])
	}
	switch f[1] {
	case "EIO":
		a.err = syscall.EIO
	case "ENOSPC":
		a.err = syscall.ENOSPC
	default:
		return nil, fmt.Errorf("errorfs spec %q: errno %q", spec, f[1])
	}
	return a, nil
}

func (a *armedFaults) MaybeError(op errorfs.Op) error {
	hit := false
	for _, k := range a.kinds {
		hit = hit || op.Kind == k
	}
	if !hit || !strings.Contains(op.Path, string(filepath.Separator)+"wal") {
		return nil
	}
	sticky := a.err != syscall.ENOSPC // a full disk frees up again; a failed fsync stays failed
	if !a.armed.Load() || !sticky {
		if now := time.Now().UnixNano(); now-a.last.Load() >= int64(2*time.Millisecond) {
			a.last.Store(now)
			_, err := os.Stat(a.arm)
			a.armed.Store(err == nil)
		}
	}
	if !a.armed.Load() {
		return nil
	}
	return a.err
}

// runFaultyReplica is the replica helper: kvserver's replica command
// (cmd/kvserver/replica.go) reduced to --config and --id, with the file
// system wrapped by errorfs.
func runFaultyReplica() int {
	inj, err := parseFaults(os.Getenv(faultsEnv))
	return runHelperReplica("replica helper", err, server.Options{FS: errorfs.Wrap(vfs.OS, inj)})
}

// runHelperReplica runs one replica the way kvserver's replica command
// does, reduced to the --config and --id of replicaArgsEnv, with opts
// (the helper's faults or hooks); setupErr is the helper's own set-up
// failure, reported with the arguments as a bad invocation (exit 2).
func runHelperReplica(helper string, setupErr error, opts server.Options) int {
	args := strings.Split(os.Getenv(replicaArgsEnv), "\x1f")
	var path string
	var id int64
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--config":
			path = args[i+1]
		case "--id":
			id, _ = strconv.ParseInt(args[i+1], 10, 64)
		}
	}
	if setupErr != nil || path == "" || id == 0 {
		fmt.Fprintf(os.Stderr, "kvserver: %s: %v (args %q)\n", helper, setupErr, args)
		return 2
	}
	cfg, err := cluster.LoadConfig(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	what := fmt.Sprintf("replica %d", id)
	opts.Ready = func(c string) {
		if c != "" {
			c = ", control http://" + c
		}
		fmt.Fprintf(os.Stdout, "kvserver: %s of cluster %q runs (pid %d%s)\n", what, cfg.Name, os.Getpid(), c)
	}
	if err := server.Run(ctx, cfg, id, opts, log); err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %s: %v\n", what, err)
		return 1
	}
	return 0
}

// TestDiskErrorsInProcess (issue 19 D5): disk faults injected into a real
// replica process (the test binary re-executed as the replica helper: the
// server code kvserver runs, on an errorfs file system armed by a file
// the test creates), 1 group x 3 on shm, durability sync, under puts:
//
//   - eio: fsync of one follower's log fails with EIO. That process
//     exits 1 with one line naming the replica, its data dir and the
//     error (fail-stop: never retry an fsync), and the group goes on
//     with the other two: puts succeed. Started again (unarmed), it
//     reads back what its disk holds (nothing corrupt: it starts, and
//     logs its recovery), catches up, and holds exactly the group's
//     records; every acknowledged put reads back.
//
// A full disk is not fail-stop: TestDiskFullInProcess.
func TestDiskErrorsInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 replica processes")
	}
	for _, tc := range []struct{ name, kind, errno, want string }{
		{"eio", "sync", "EIO", "input/output error"},
	} {
		t.Run(tc.name, func(t *testing.T) { diskErrors(t, tc.kind, tc.errno, tc.want) })
	}
}

func diskErrors(t *testing.T, kind, errno, want string) {
	s := loopbackSpec(t, "disk", "shm", 1)
	s.Durability = "sync"
	c := newCluster(t, s)
	arm := filepath.Join(c.dir, "arm")
	victim := int64(2)
	c.faults = map[int64]string{victim: kind + ":" + errno + ":" + arm}
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	if l := c.leader(0, 10*time.Second); l == victim {
		// the test wants a follower's disk to fail: make another lead
		c.term(victim)
		c.start(victim)
		c.waitReady(30*time.Second, c.allIDs()...)
	}
	cl := c.openClient(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	acked := map[string]string{}
	put := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			k, v := fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("v-%s-%d", prefix, i)
			pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := cl.Put(pctx, []byte(k), []byte(v))
			pcancel()
			if err != nil {
				t.Fatalf("put %s: %v%s", k, err, c.describe())
			}
			acked[k] = v
		}
	}
	put("before", 200)
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.logf("armed: %s of replica %d's log fail with %s", kind, victim, errno)
	p := c.proc(victim)
	// Puts go on while the victim fails; it must exit, not hang.
	deadline := time.Now().Add(40 * time.Second)
	n := 0
	for !p.exited() {
		if time.Now().After(deadline) {
			t.Fatalf("replica %d still runs 40 s after its disk failed (%d puts since)%s", victim, n, c.describe())
		}
		put(fmt.Sprintf("during-%d", n), 10)
		n++
	}
	if code := p.exitCode(); code != 1 {
		t.Errorf("replica %d exited %d, want 1", victim, code)
	}
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	last := lines[len(lines)-1]
	dir := c.cfg.ReplicaDir(victim)
	c.logf("replica %d's last line: %s", victim, last)
	for _, w := range []string{fmt.Sprintf("kvserver: replica %d: ", victim), fmt.Sprintf("replica %d (group 0) stopped on a disk error", victim), dir, want} {
		if !strings.Contains(last, w) {
			t.Errorf("replica %d's last line %q lacks %q", victim, last, w)
		}
	}
	// The group goes on with the other two.
	put("after", 200)

	// Space returns (the helper starts unarmed): the replica reads its
	// disk back and catches up.
	if err := os.Remove(arm); err != nil {
		t.Fatal(err)
	}
	q := c.start(victim)
	c.waitReady(30*time.Second, c.allIDs()...)
	if !q.logged("recovered ") {
		t.Errorf("replica %d logged no recovery line: %s", victim, tail(q.stderr.String(), 2<<10))
	}
	put("restarted", 50)
	c.waitConverged(30 * time.Second)
	// Every acknowledged put reads back, from the restarted replica's
	// memory too.
	bad, fromVictim := readBack(ctx, c, cl, acked, victim)
	c.logf("%d acknowledged puts read back (linearizable, and stale-ok: %d from replica %d); %d wrong", len(acked), fromVictim, victim, bad)
}

// readBack checks that every put of acked reads back its value through
// cl (linearizable) and through a stale-ok get of the nearest replica,
// victim (its own memory), and that some get did read victim. It reports
// the wrong values and the gets victim served.
func readBack(ctx context.Context, c *tcluster, cl *client.Client, acked map[string]string, victim int64) (bad, fromVictim int) {
	t := c.t
	t.Helper()
	near, err := client.Open(ctx, client.WithConfigFile(c.path), client.WithSlot(1), client.WithNearReplica(int(victim-1)), client.WithConsistency(client.StaleOK))
	if err != nil {
		t.Fatal(err)
	}
	defer near.Close()
	for k, v := range acked {
		got, err := cl.Get(ctx, []byte(k))
		if err != nil || string(got) != v {
			if bad++; bad <= 5 {
				t.Errorf("get %s: %q, %v; want %q", k, got, err, v)
			}
		}
		it, err := near.GetItem(ctx, []byte(k), client.StaleOK)
		if err != nil || string(it.Value) != v {
			if bad++; bad <= 5 {
				t.Errorf("stale-ok get %s from replica %d: %q, %v; want %q", k, it.Replica, it.Value, err, v)
			}
		}
		if int64(it.Replica) == victim {
			fromVictim++
		}
	}
	if fromVictim == 0 {
		t.Errorf("no stale-ok get read replica %d", victim)
	}
	return bad, fromVictim
}

// TestDiskFullInProcess (issue 19): ENOSPC on every write of some
// replicas' logs (the errorfs replica helper, armed by a file per
// replica, disarmed by removing it: space returns), 1 group x 3 on shm,
// durability sync, under sequential puts:
//
//   - follower: one follower's disk is full. It stays up, /readyz 503
//     naming "disk full", /status disk_full, rdmakv_disk_full 1; the
//     group goes on with the two that can write: 100 puts succeed while
//     it is full.
//   - leader: the leader's disk is full. Puts to the group fail with
//     client.ErrDiskFull (at once, never OK, never waiting for their
//     deadline) until the leader hands the group over (a majority can
//     write; it counts a step-down); then 50 puts in a row succeed while
//     its disk is still full.
//   - all: every replica's disk is full, armed while nothing is
//     written: each replica finds out through its log's probe (a record
//     written when the log took none for 8 election timeouts and the
//     free-space query, armed too, answers 0; or a write of an
//     election, on a loaded machine). Every
//     put fails with client.ErrDiskFull, promptly, and the group keeps
//     its leader: the leader, then a follower, is stopped (SIGSTOP) for
//     5 election timeouts, and no replica starts an election, the leader
//     leads and refuses, puts are refused at once (nobody could lead
//     better, and a new epoch needs a majority that can log).
//
// In each, the full replicas log one "disk full:" line when the log
// first finds it full and one "disk space returned" line when a write
// succeeds again; once space returns every replica is ready again, every
// acknowledged put reads back (linearizable, and stale-ok from a replica
// that was full), a put that failed with ErrOutcomeUnknown too reads back
// its value or nothing, and a replica that was full, restarted, recovers
// its log (nothing corrupt) and holds the same.
func TestDiskFullInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 replica processes")
	}
	for _, who := range []string{"follower", "leader", "all"} {
		t.Run(who, func(t *testing.T) { diskFull(t, who) })
	}
}

func diskFull(t *testing.T, who string) {
	s := loopbackSpec(t, "full", "shm", 1)
	s.Durability = "sync"
	c := newCluster(t, s)
	arm := func(id int64) string { return filepath.Join(c.dir, fmt.Sprintf("full-%d", id)) }
	c.faults = map[int64]string{}
	for _, id := range c.allIDs() {
		c.faults[id] = "write:ENOSPC:" + arm(id)
	}
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	leader := c.leader(0, 10*time.Second)
	var victims []int64
	switch who {
	case "follower":
		victims = c.followers(0, leader)[:1]
	case "leader":
		victims = []int64{leader}
	case "all":
		victims = c.allIDs()
	}
	cl := c.openClient(0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	acked, unknown := map[string]string{}, map[string]string{}
	refused, seq := 0, 0
	// try puts one key: nil, or a disk-full refusal (counted); anything
	// else fails the test. No put may wait for its deadline.
	try := func(prefix string) error {
		t.Helper()
		seq++
		k, v := fmt.Sprintf("%s-%d", prefix, seq), fmt.Sprintf("v-%s-%d", prefix, seq)
		start := time.Now()
		pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := cl.Put(pctx, []byte(k), []byte(v))
		pcancel()
		switch {
		case err == nil:
			acked[k] = v
		case errors.Is(err, client.ErrDiskFull):
			refused++
			if errors.Is(err, client.ErrOutcomeUnknown) {
				unknown[k] = v
			}
			if !strings.Contains(err.Error(), "group 0") || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("put %s: %q does not name the group and the disk", k, err)
			}
		default:
			t.Fatalf("put %s after %v: %v%s", k, time.Since(start).Round(time.Millisecond), err, c.describe())
		}
		// A refusal comes at once, never after the put's deadline. (A
		// put that succeeded did not wait for its deadline either,
		// however long the machine's load made it: at load ~40 one
		// before arming took 10.8 s, and failed a bound that was
		// meant for refusals.)
		if d := time.Since(start); err != nil && d > 10*time.Second {
			t.Fatalf("put %s refused after %v (%v)", k, d, err)
		}
		return err
	}
	// put puts n keys. A put refused unsent is tried again for a while:
	// right after space returns, a client whose window to the group is
	// full of writes the group refused fails new ones unsent until the
	// group answered those (client.ErrDiskFull alone).
	put := func(prefix string, n int) {
		t.Helper()
		for range n {
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := try(prefix)
				if err == nil {
					break
				}
				if errors.Is(err, client.ErrOutcomeUnknown) || time.Now().After(deadline) {
					t.Fatalf("put: %v%s", err, c.describe())
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	isFull := func(id int64) bool {
		st, err := c.status(id)
		return err == nil && st.DiskFull != ""
	}
	put("before", 100)
	if who == "all" {
		// Let the last commit's lazy Commit records reach the disks
		// (they wait up to 10 ms for a batch): then nothing writes, and
		// only the probes can find the disks full.
		time.Sleep(300 * time.Millisecond)
	}
	for _, id := range victims {
		if err := os.WriteFile(arm(id), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.logf("armed: ENOSPC on the logs of replicas %v (leader %d)", victims, leader)
	// The elections the others started until now: the full leader may
	// lose the lead to one of theirs before its step-down is due (a
	// loaded machine: they did not hear it for an election timeout).
	othersElected := func() uint64 {
		var n uint64
		for _, id := range c.allIDs() {
			if st, err := c.status(id); err == nil && id != leader {
				n += st.Counters.ElectionsStarted
			}
		}
		return n
	}
	electedAtArm := othersElected()
	// Until every victim's log found its disk full: puts fill the
	// follower's or the leader's; in the all case nothing is written and
	// each replica's probe finds it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := 0
		for _, id := range victims {
			if isFull(id) {
				n++
			}
		}
		if n == len(victims) {
			var b strings.Builder
			for _, id := range c.allIDs() {
				if st, err := c.status(id); err == nil {
					fmt.Fprintf(&b, " [replica %d: %s %s, %d elections, %d step-downs, %d probes]", id, st.Role, st.Epoch, st.Counters.ElectionsStarted, st.Counters.DiskFullStepDowns, st.Counters.DiskProbes)
				}
			}
			c.logf("every victim says disk full:%s", b.String())
			break
		}
		for _, id := range victims {
			if p := c.proc(id); p.exited() {
				t.Fatalf("replica %d exited on a full disk (%v): %s", id, p.state, tail(p.stderr.String(), 2<<10))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas %v: not all say disk full 30 s after arming%s", victims, c.describe())
		}
		switch who {
		case "follower":
			// A filling put may be refused, sent or unsent, as the
			// during puts below may: once the victim's row says its
			// log is full, a leader that did not hear the other
			// follower for an election timeout (a loaded machine)
			// counts fewer than a majority able to log
			// (broadcast's updateFull) and fails the put, queued,
			// with ErrDiskFull and ErrOutcomeUnknown. try counts
			// it and keeps it for the read-back.
			if try("filling") != nil {
				time.Sleep(5 * time.Millisecond)
			}
		case "leader":
			try("filling")
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, id := range victims {
		if p := c.proc(id); p.exited() {
			t.Fatalf("replica %d exited on a full disk: %s", id, tail(p.stderr.String(), 2<<10))
		}
		ok, why := c.ready(id)
		if ok || !strings.Contains(why, "disk full") {
			t.Errorf("replica %d: /readyz ready=%v %q, want 503 naming disk full", id, ok, why)
		}
		code, body, err := c.get(id, "/metrics")
		if err != nil || code != 200 || !strings.Contains(string(body), "rdmakv_disk_full{") || !regexp.MustCompile(`(?m)^rdmakv_disk_full\{[^}]*\} 1$`).Match(body) {
			t.Errorf("replica %d: /metrics %d (%v) has no rdmakv_disk_full 1", id, code, err)
		}
	}
	switch who {
	case "follower":
		// The two that can write go on. (A put may still be refused:
		// a leader that did not hear the other follower for an
		// election timeout counts a majority unable to write.)
		for ok := 0; ok < 100; {
			if try("during") == nil {
				ok++
			}
		}
		if !isFull(victims[0]) {
			t.Fatalf("replica %d no longer says disk full", victims[0])
		}
	case "leader":
		// Refused until the leader hands over, then the group goes on.
		before := refused
		deadline := time.Now().Add(40 * time.Second)
		for ok := 0; ok < 50; {
			if time.Now().After(deadline) {
				t.Fatalf("no 50 puts in a row within 40 s with the leader's disk full (%d refused)%s", refused, c.describe())
			}
			if try("during") == nil {
				ok++
			} else {
				ok = 0
				time.Sleep(5 * time.Millisecond) // refused at once: no busy loop while the leader waits to hand over
			}
		}
		// It no longer leads: it handed the group over (a step-down),
		// or, on a loaded machine, the others elected without it
		// before its step-down was due (CI at load 40-50: "role
		// follower, step-downs 0"). Without either the group would
		// have refused every put: no 50 in a row above.
		st, err := c.status(leader)
		elected := othersElected() - electedAtArm
		if err != nil || st.Role == "leader" || st.Counters.DiskFullStepDowns == 0 && elected == 0 {
			t.Errorf("replica %d (disk full) still leads, or lost the lead neither by a step-down nor by an election of the others: role %q, step-downs %d, the others' elections since arming %d (%v)", leader, st.Role, st.Counters.DiskFullStepDowns, elected, err)
		}
		// (How many puts it refused before it stepped down depends on
		// timing: the all case shows the refusals.)
		c.logf("leader %d full: %d puts refused (%d before it said so), %d since; step-downs %d, the others' elections since arming %d", leader, refused, before, refused-before, st.Counters.DiskFullStepDowns, elected)
	case "all":
		for range 20 {
			if err := try("during"); err == nil {
				t.Fatalf("a put succeeded with every disk full%s", c.describe())
			}
		}
		// The leader stops for 5 election timeouts (its followers stop
		// hearing it, and it hears nothing while stopped), then a
		// follower does (the leader hears a minority meanwhile). The
		// group keeps its leader all the same. (The leader may have
		// changed since the start: an election that ran before the
		// replicas found their disks full.)
		leader = c.leader(0, 10*time.Second)
		elections := func() map[int64]uint64 {
			k := map[int64]uint64{}
			for _, id := range c.allIDs() {
				st, err := c.status(id)
				if err != nil {
					t.Fatalf("replica %d: %v", id, err)
				}
				k[id] = st.Counters.ElectionsStarted
				c.logf("replica %d: %s %s, counters %+v", id, st.Role, st.Epoch, st.Counters)
			}
			return k
		}
		before := elections()
		et, err := time.ParseDuration(c.spec.Election)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []int64{leader, c.followers(0, leader)[0]} {
			c.stop(id)
			time.Sleep(5 * et)
			c.cont(id)
			c.logf("replica %d stopped for %v (5 election timeouts; leader %d)", id, 5*et, leader)
			for range 20 {
				if err := try("stalled"); err == nil {
					t.Fatalf("a put succeeded with every disk full%s", c.describe())
				}
				time.Sleep(et / 2)
			}
		}
		if after := elections(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("elections started by replica while every disk was full: %v before the stops, %v after%s", before, after, c.describe())
		}
		st, err := c.status(leader)
		if err != nil || st.Role != "leader" || !st.RefusingWrites {
			t.Errorf("replica %d (the leader) after the stops: role %q, refusing writes %v (%v)%s", leader, st.Role, st.RefusingWrites, err, c.describe())
		}
	}
	// Space returns.
	for _, id := range victims {
		if err := os.Remove(arm(id)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitReady(30*time.Second, c.allIDs()...)
	for _, id := range victims {
		if isFull(id) {
			t.Errorf("replica %d still says disk full once ready", id)
		}
	}
	put("after", 100)
	c.waitConverged(30 * time.Second)
	for _, id := range victims {
		p := c.proc(id)
		full, back := strings.Count(p.stderr.String(), "disk full: replica"), strings.Count(p.stderr.String(), "disk space returned")
		if full != 1 || back != 1 {
			t.Errorf("replica %d logged %d \"disk full\" and %d \"disk space returned\" lines, want 1 and 1: %s", id, full, back, tail(p.stderr.String(), 4<<10))
		}
	}
	// Nothing corrupt: a replica that was full restarts from its disk.
	victim := victims[0]
	if who == "all" {
		victim = leader
	}
	c.term(victim)
	q := c.start(victim)
	c.waitReady(30*time.Second, c.allIDs()...)
	if !q.logged("recovered ") {
		t.Errorf("replica %d logged no recovery line: %s", victim, tail(q.stderr.String(), 2<<10))
	}
	put("restarted", 20)
	c.waitConverged(30 * time.Second)
	bad, fromVictim := readBack(ctx, c, cl, acked, victim)
	for k, v := range unknown {
		got, err := cl.Get(ctx, []byte(k))
		if err == nil && string(got) != v || err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Errorf("get %s (outcome unknown: disk full): %q, %v; want %q or not found", k, got, err, v)
		}
	}
	c.logf("%d acknowledged puts read back (stale-ok: %d from replica %d); %d refused for a full disk (%d outcome unknown); %d wrong", len(acked), fromVictim, victim, refused, len(unknown), bad)
}
