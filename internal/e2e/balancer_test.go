package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/internal/syncbuf"
)

// The tablet balancer in kvserver processes (docs/btree.md, "Who
// decides"): no test here calls MoveTablet or Balance; the processes move
// the tablets by themselves.

const (
	// helperBalancer runs one replica like kvserver --config C --id N
	// (server.Run), whose balancer holds before the ingest of a move
	// while the file balancerHoldEnv names exists.
	helperBalancer  = "balancer-replica"
	balancerHoldEnv = "RDMAKV_E2E_BALANCER_HOLD"
	// holdLine is what a helper prints to stderr when it holds.
	holdLine = "balancer-hold: holding before the ingest"
)

// balancerSpec is a 2-group config on fabric with keyspace "users" (2
// KiB nodes) and a balancer every 200ms.
func balancerSpec(t *testing.T, what, fabric string) spec {
	s := loopbackSpec(t, what, fabric, 2)
	if fabric == "tcp" {
		// On tcp every process's balancer client takes a slot of the
		// one host (the highest free one) and gives it back a round
		// after its process stops hosting group 0's leader: with the
		// test's two clients, 4 slots ran out after elections at load
		// 30-40 ("all 4 client slots of this host are in use").
		s.Clients = 8
		s.ClientListen = fmt.Sprintf("127.0.0.1:%d", freePortRange(t, s.Clients))
	}
	s.Extra = "\n[[keyspace]]\nname = \"users\"\nkind = \"ordered\"\nnode_size = \"2KiB\"\n\n[ordered]\nbalance_interval = \"200ms\"\n"
	return s
}

// balancerLoadKeys is more than the 4096 keys past which a group's one
// tablet splits while it owns fewer tablets than there are groups, so
// the load leaves group 0 with 2 tablets, and the balancer moves one.
const balancerLoadKeys = 6000

// seqLoad puts keys user000000, user000001, ... (the order a sequential
// load writes: every put lands in the last tablet) from 8 writers and
// records each put's outcome.
type seqLoad struct {
	next  atomic.Int64
	mu    sync.Mutex
	hist  []kvcheck.Op
	errs  []error
	acked map[string]string
}

func (l *seqLoad) run(ks *client.Keyspace, clock func() int64, n int) {
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for {
				i := int(l.next.Add(1)) - 1
				if i >= n {
					return
				}
				k, v := fmt.Sprintf("user%06d", i), fmt.Sprintf("v%d", i)
				o := kvcheck.Op{Client: 100 + w, Kind: kvcheck.Put, Key: k, Value: v, Call: clock()}
				_, err := ks.Put(context.Background(), []byte(k), []byte(v))
				o.Return = clock()
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, fmt.Errorf("put %s: %w", k, err))
					o.Out.Unknown = true
				} else {
					o.Out.OK = true
					l.acked[k] = v
				}
				l.hist = append(l.hist, o)
				l.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// checkAcked scans the keyspace and wants every acknowledged put there
// with its value.
func checkAcked(t *testing.T, c *tcluster, ks *client.Keyspace, acked map[string]string, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := map[string]string{}
	for kv, err := range ks.Scan(ctx, []byte("user"), []byte("user~")) {
		if err != nil {
			t.Fatalf("%s: scan: %v%s", when, err, c.describe())
		}
		got[string(kv.Key)] = string(kv.Value)
	}
	for k, v := range acked {
		if got[k] != v {
			t.Fatalf("%s: acknowledged %s=%s reads %q (%d keys read, %d acknowledged)", when, k, v, got[k], len(got), len(acked))
		}
	}
}

// waitSpread waits until every group serves a tablet and none is moving.
func waitSpread(t *testing.T, c *tcluster, cl *client.Client, timeout time.Duration) []client.TabletInfo {
	t.Helper()
	var tbs []client.TabletInfo
	var err error
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tbs, err = cl.Tablets(ctx)
		cancel()
		serving := map[uint32]bool{}
		busy := false
		for _, tb := range tbs {
			serving[tb.Group] = serving[tb.Group] || tb.State == "serving"
			busy = busy || tb.State != "serving"
		}
		if err == nil && !busy && len(serving) == len(c.cfg.Groups) {
			return tbs
		}
		if time.Now().After(deadline) {
			t.Fatalf("+%v: tablets not spread over the groups after %v: %+v %v%s", c.since(), timeout, tbs, err, c.describe())
		}
	}
}

// balancerStatus is replica id's process's balancer status (nil: none).
func balancerStatus(c *tcluster, id int64) *client.BalancerStatus {
	code, b, err := c.get(id, "/status")
	if err != nil || code != http.StatusOK {
		return nil
	}
	var ps server.ProcessStatus
	if json.Unmarshal(b, &ps) != nil {
		return nil
	}
	return ps.Balancer
}

// TestBalancerProcesses: kvserver processes (2 groups x 3, shm) with the
// balancer on and a keyspace without split points. A sequential load of
// 6000 keys, with readers and writers of 4 hot keys of the last tablet
// and scans over them running throughout, ends with tablets on both
// groups without anyone asking (group 0's one tablet splits early at
// 4096 keys and group 0's leader's process moves one half); the history
// (every put of the load, the hot keys' puts, gets and scans) is
// linearizable (porcupine), every acknowledged put is there, and the
// process hosting group 0's leader shows its move in /status. On shm,
// and on tcp (TestBalancerProcessesTCP).
func TestBalancerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 6 replica processes")
	}
	balancerProcesses(t, "shm")
}

// TestBalancerProcessesTCP is TestBalancerProcesses on tcp (loopback: the
// balancer's client slot listens on the host of group 0's leader). It
// skips under -race and runs in make test's norace pass (the Makefile's
// NORACE_E2E): what it adds to the shm case is the tcp fabric, in
// kvserver processes built without -race anyway; the client's tcp code
// runs raced in rdma/tcp's and client's tests, and TestStoppedReplica's
// and TestProcessesKillRestartUnderLoad's tcp cases here. Raced, its
// client's load took 2m51s of the race pass at load 40 (shm: 20 s) and
// timed its ops out.
func TestBalancerProcessesTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 6 replica processes")
	}
	if raceEnabled() {
		t.Skip("runs in make test's norace pass (NORACE_E2E)")
	}
	balancerProcesses(t, "tcp")
}

func balancerProcesses(t *testing.T, fabric string) {
	c := newCluster(t, balancerSpec(t, "balancer", fabric))
	c.startAll()
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	rc := c.openClient(1) // reads only: its directory goes stale until a read fails its check
	ks, rks := cl.Keyspace("users"), rc.Keyspace("users")
	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	load := &seqLoad{acked: map[string]string{}}
	var stop atomic.Bool
	var mu sync.Mutex
	var hist []kvcheck.Op
	var errs []error
	var wg sync.WaitGroup
	hot := []string{"zz0", "zz1", "zz2", "zz3"} // after every user key: in the last tablet
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 18))
			for i := 0; !stop.Load(); i++ {
				time.Sleep(2 * time.Millisecond) // a history porcupine checks quickly
				key := hot[rng.IntN(len(hot))]
				o := kvcheck.Op{Client: w, Key: key, Call: clock()}
				var err error
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r := rng.IntN(10)
				if w == 3 {
					r = 5 + r%5 // the reading client: gets and scans
				}
				switch {
				case r < 5:
					o.Kind, o.Value = kvcheck.Put, fmt.Sprintf("w%d-%d", w, i)
					_, err = ks.Put(ctx, []byte(key), []byte(o.Value))
					o.Out.OK = err == nil
				case r < 8:
					o.Kind = kvcheck.Get
					k := ks
					if w == 3 {
						k = rks
					}
					var v []byte
					if v, err = k.Get(ctx, []byte(key)); err == nil {
						o.Out = kvcheck.Output{Found: true, Value: string(v)}
					} else if errors.Is(err, client.ErrNotFound) {
						err = nil
					}
				default:
					o.Kind, o.Key, o.End = kvcheck.Scan, "zz", "zz~"
					k := ks
					if w == 3 {
						k = rks
					}
					for kv, e := range k.Scan(ctx, []byte(o.Key), []byte(o.End)) {
						if e != nil {
							err = e
							break
						}
						o.Out.Pairs = append(o.Out.Pairs, kvcheck.KV{Key: string(kv.Key), Value: string(kv.Value)})
					}
				}
				cancel()
				o.Return = clock()
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("worker %d: %v %s: %w", w, o.Kind, key, err))
				} else {
					hist = append(hist, o)
				}
				mu.Unlock()
			}
		})
	}
	load.run(ks, clock, balancerLoadKeys)
	c.logf("load of %d keys done", balancerLoadKeys)
	tbs := waitSpread(t, c, cl, 60*time.Second)
	c.logf("tablets spread: %+v", tbs)
	time.Sleep(300 * time.Millisecond) // the hot keys' workers go on after the move
	stop.Store(true)
	wg.Wait()
	if len(errs) > 0 || len(load.errs) > 0 {
		t.Fatalf("errors: %v %v%s", errs, load.errs, c.describe())
	}
	checkAcked(t, c, ks, load.acked, "after the move")
	moved := false
	for _, id := range c.members(0) {
		if st := balancerStatus(c, id); st != nil && st.Moves > 0 {
			c.logf("replica %d's process balanced: %+v, last move %+v", id, *st, *st.Last)
			moved = st.Last != nil && st.Last.Source == 0 && st.Last.Target == 1 && st.Last.Err == ""
		}
	}
	if !moved {
		t.Fatalf("no process of group 0 shows its move in /status%s", c.describe())
	}
	all := append(hist, load.hist...)
	res, err := kvcheck.CheckLinearizable(all, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("%d ops: %v", len(all), err)
	}
	c.logf("%d ops (%d on the hot keys) while the balancer moved: linearizable", len(all), len(hist))
}

// TestBalancerKilledMidMove: the process whose balancer moves a tablet
// is killed with -9 after the freeze, before the ingest (it holds there:
// the helper's knob); group 0 elects a leader in another process, whose
// balancer finds the tablet frozen and, after StuckAfter (1s here),
// finishes the move. The load's writers, blocked on the frozen tablet,
// go on; every acknowledged put is there; the killed replica restarts
// (kvserver) and every put is still there.
func TestBalancerKilledMidMove(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 6 replica processes")
	}
	c := newCluster(t, balancerSpec(t, "balkill", "shm"))
	arm := filepath.Join(c.dir, "hold")
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for _, id := range c.allIDs() {
		ps = append(ps, c.spawnBalancerHelper(id, arm))
	}
	for _, p := range ps {
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(p.stdout.String(), " runs (pid "); time.Sleep(5 * time.Millisecond) {
			if p.exited() || time.Now().After(deadline) {
				t.Fatalf("replica %d did not start: %s", p.id, p.stderr.String())
			}
		}
	}
	c.waitReady(30*time.Second, c.allIDs()...)
	cl := c.openClient(0)
	ks := cl.Keyspace("users")
	start := time.Now()
	load := &seqLoad{acked: map[string]string{}}
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		load.run(ks, func() int64 { return int64(time.Since(start)) }, balancerLoadKeys)
	}()
	// The balancer of group 0's leader's process freezes a tablet and
	// holds before the ingest: find it by its line.
	var holder *proc
	for deadline := time.Now().Add(120 * time.Second); holder == nil; time.Sleep(10 * time.Millisecond) {
		for _, p := range ps {
			if strings.Contains(p.stderr.String(), holdLine) {
				holder = p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no balancer held a move%s", c.describe())
		}
	}
	if g, _ := c.replica(holder.id); g != 0 {
		t.Fatalf("replica %d of group %d holds a move: the balancer runs where group 0's leader is", holder.id, g)
	}
	// The directory is read from near replicas, which may apply the
	// freeze a moment after the holder saw it acknowledged.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tbs, err := cl.Tablets(context.Background())
		frozen := 0
		for _, tb := range tbs {
			frozen += b2i(tb.State == "frozen")
		}
		if err == nil && frozen == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("while the balancer holds: %+v %v, want one frozen tablet", tbs, err)
		}
	}
	c.kill(holder.id)
	os.Remove(arm)
	c.logf("replica %d, whose balancer held a move after the freeze, killed", holder.id)
	<-loaded
	if len(load.errs) > 0 {
		t.Fatalf("load errors: %v%s", load.errs, c.describe())
	}
	tbs := waitSpread(t, c, cl, 60*time.Second)
	c.logf("load done, tablets spread: %+v", tbs)
	resumed := false
	for _, id := range c.members(0) {
		if id == holder.id {
			continue
		}
		if st := balancerStatus(c, id); st != nil && st.Resumed > 0 {
			c.logf("replica %d's process finished the move: %+v, last move %+v", id, *st, *st.Last)
			resumed = st.Last != nil && st.Last.Resumed && st.Last.Err == ""
		}
	}
	if !resumed {
		t.Fatalf("no other process of group 0 shows a resumed move%s", c.describe())
	}
	checkAcked(t, c, ks, load.acked, "after the take-over")
	if len(load.acked) != balancerLoadKeys {
		t.Fatalf("%d puts acknowledged, want %d", len(load.acked), balancerLoadKeys)
	}
	c.start(holder.id)
	c.waitReady(30*time.Second, holder.id)
	checkAcked(t, c, ks, load.acked, "after the restart")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// spawnBalancerHelper starts replica id as the test binary's balancer
// helper (runBalancerReplica) whose balancer holds while arm exists.
func (c *tcluster) spawnBalancerHelper(id int64, arm string) *proc {
	c.t.Helper()
	args := []string{"--config", c.path, "--id", strconv.FormatInt(id, 10)}
	exe, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+helperBalancer, balancerHoldEnv+"="+arm, replicaArgsEnv+"="+strings.Join(args, "\x1f"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{id: id, args: args, cmd: cmd, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	c.mu.Lock()
	p.inc = 1
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		c.t.Fatalf("start replica %d: %v", id, err)
	}
	c.all = append(c.all, p)
	c.procs[id] = p
	c.mu.Unlock()
	go func() {
		cmd.Wait()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	return p
}

// runBalancerReplica is the balancer helper: kvserver's replica command
// reduced to --config and --id, whose balancer holds before the ingest
// of a move while the file balancerHoldEnv names exists.
func runBalancerReplica() int {
	arm := os.Getenv(balancerHoldEnv)
	var err error
	if arm == "" {
		err = fmt.Errorf("no %s", balancerHoldEnv)
	}
	hold := func(step string) {
		if step != "ingest" {
			return
		}
		if _, err := os.Stat(arm); err != nil {
			return
		}
		fmt.Fprintln(os.Stderr, holdLine)
		for {
			if _, err := os.Stat(arm); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return runHelperReplica("balancer helper", err, server.Options{BalancerBeforeStep: hold})
}
