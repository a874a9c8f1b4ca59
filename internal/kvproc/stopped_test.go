package kvproc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/internal/kvproc"
)

// stoppedWant is what a key must read.
type stoppedWant struct {
	found   bool
	value   string
	version uint64
}

// TestStoppedReplicasStillAnswer is "gets without the servers' CPU" on
// real processes: after some writes, every replica process of every group
// is stopped (SIGSTOP), and linearizable gets (through the leader and the
// promise quorum) and stale-ok gets (from each replica, through clients
// near each one, whose readers connect only now) of every key still return
// exactly what was written, for longer than an election timeout, while
// the stopped processes use no CPU time at all (/proc/<pid>/stat). Once
// the processes continue (SIGCONT), writes work again.
func TestStoppedReplicasStillAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const groups = 2
	c := newCluster(t, ctx, groups, 4, testTuning)
	t.Logf("+%v: %d replica processes up (race %v)", c.since(), 3*groups, raceEnabled())

	// Client 0 writes and reads linearizably; clients 1..3 read stale-ok
	// near replica 0, 1, 2, and only once the replicas are stopped.
	cls := make([]*client.Client, 4)
	defer func() {
		for _, cl := range cls {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	for k := range cls {
		cl, err := c.openClient(ctx, k, client.WithTimeout(20*time.Second), client.WithNearReplica(k-1+3))
		if err != nil {
			t.Fatalf("open client %d: %v", k, err)
		}
		cls[k] = cl
	}
	w := cls[0]

	// Writes: puts, overwrites, a delete, a CAS, and a batch over both
	// groups; absent keys too.
	want := map[string]stoppedWant{}
	last := make([]uint64, groups) // each group's last write's index
	note := func(key string, wr client.WriteResult) {
		want[key] = stoppedWant{found: true, value: want[key].value, version: wr.Version}
		g := c.m.GroupOf([]byte(key))
		last[g] = max(last[g], wr.Version>>16)
	}
	for i := range 24 {
		key, v := fmt.Sprintf("s%d", i), fmt.Sprintf("v%d", i)
		if i%3 == 0 {
			if _, err := w.Put(ctx, []byte(key), []byte("first")); err != nil {
				t.Fatalf("put %q: %v", key, err)
			}
		}
		wr, err := w.Put(ctx, []byte(key), []byte(v))
		if err != nil {
			t.Fatalf("put %q: %v", key, err)
		}
		want[key] = stoppedWant{value: v}
		note(key, wr)
	}
	wr, err := w.Delete(ctx, []byte("s5"))
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	last[c.m.GroupOf([]byte("s5"))] = max(last[c.m.GroupOf([]byte("s5"))], wr.Version>>16)
	want["s5"] = stoppedWant{}
	if wr, err = w.CompareAndSwap(ctx, []byte("s6"), []byte("v6"), []byte("swapped")); err != nil {
		t.Fatalf("cas: %v", err)
	}
	want["s6"] = stoppedWant{value: "swapped"}
	note("s6", wr)
	var b client.Batch
	bkeys := []string{"s7", "s8", "s9", "s10"}
	for _, k := range bkeys {
		b.Put([]byte(k), []byte("batched-"+k))
	}
	br, err := w.Commit(ctx, &b)
	if err != nil {
		t.Fatalf("batch: %v", err)
	}
	if len(br.Groups) != groups {
		t.Logf("the batch spans %d groups", len(br.Groups))
	}
	for i, k := range bkeys {
		want[k] = stoppedWant{value: "batched-" + k}
		note(k, client.WriteResult{Version: br.Versions[i]})
	}
	for i := range 4 {
		want[fmt.Sprintf("absent%d", i)] = stoppedWant{}
	}
	// A linearizable get before the stop warms client 0's readers; the
	// stale-ok clients have never read.
	if _, err := w.GetItem(ctx, []byte("s0"), client.Linearizable); err != nil {
		t.Fatalf("get before the stop: %v", err)
	}
	probe := map[uint32]string{} // a key of each group
	for k := range want {
		probe[c.m.GroupOf([]byte(k))] = k
	}

	var procs []*kvproc.Proc
	for _, rs := range c.reps {
		for _, r := range rs {
			procs = append(procs, r.p)
		}
	}
	stopped := false
	cont := func() {
		if !stopped {
			return
		}
		for _, p := range procs {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT pid %d: %v", p.Pid(), err)
			}
		}
		stopped = false
	}
	defer cont()
	// Stop every replica process, once every replica applied every write
	// (stale-ok gets must then read exactly the last values) and every
	// group has a leader. A stop that lands in an election (on a loaded
	// machine a follower may time out at any time) freezes a group without
	// a confirmed leader, which stays so until it runs again: a probe get
	// per group sees it, and the stop is tried again.
	var final [][]kvproc.Status
	var stopAt time.Time
	cpu := map[int]uint64{}
	for attempt := 1; ; attempt++ {
		final = c.converge(ctx)
		for g, ss := range final {
			c.leader(ctx, g)
			for i, s := range ss {
				if s.Applied < last[g] {
					t.Fatalf("group %d replica %d applied %d, before the last write's %d", g, i, s.Applied, last[g])
				}
			}
		}
		for _, p := range procs {
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP pid %d: %v", p.Pid(), err)
			}
		}
		stopped = true
		stopAt = time.Now()
		for _, p := range procs {
			for {
				ticks, state, err := kvproc.CPUTime(p.Pid())
				if err != nil {
					t.Fatalf("pid %d: %v", p.Pid(), err)
				}
				if state == 'T' {
					cpu[p.Pid()] = ticks
					break
				}
				if time.Since(stopAt) > 10*time.Second {
					t.Fatalf("pid %d not stopped 10 s after SIGSTOP: state %c", p.Pid(), state)
				}
				time.Sleep(time.Millisecond)
			}
		}
		var perr error
		for g, k := range probe {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err := w.GetItem(pctx, []byte(k), client.Linearizable)
			pcancel()
			if err != nil && !errors.Is(err, client.ErrNotFound) {
				perr = fmt.Errorf("group %d: %w", g, err)
			}
		}
		if perr == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("+%v: stopped 3 times, and each time a group had no confirmed leader: %v%s", c.since(), perr, c.describe())
		}
		t.Logf("+%v: stop %d froze a group without a confirmed leader (%v): continue and stop again", c.since(), attempt, perr)
		cont()
		time.Sleep(10 * testTuning.ElectionTimeout)
	}
	t.Logf("+%v: every replica process stopped (state T)", c.since())
	// Longer than an election timeout: nothing in the gets may depend on
	// time passing at the replicas.
	time.Sleep(10 * testTuning.ElectionTimeout)

	var ngets int
	var slowest, total time.Duration
	get := func(cl *client.Client, key string, mode client.Consistency, near int) {
		t.Helper()
		gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
		defer gcancel()
		at := time.Now()
		it, err := cl.GetItem(gctx, []byte(key), mode)
		d := time.Since(at)
		ngets++
		total += d
		slowest = max(slowest, d)
		wt := want[key]
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Errorf("%v get %q (near %d) with every replica stopped: %v", mode, key, near, err)
			return
		}
		if got := (stoppedWant{found: err == nil, value: string(it.Value), version: it.Version}); got != wt {
			t.Errorf("%v get %q (near %d) with every replica stopped: %+v, want %+v", mode, key, near, got, wt)
		}
		g := c.m.GroupOf([]byte(key))
		if near >= 0 {
			if node := c.m.Groups[g][near]; it.Replica != node || it.Applied != final[g][near].Applied {
				t.Errorf("stale-ok get %q near replica %d read node %d at applied %d, want node %d at %d", key, near, it.Replica, it.Applied, node, final[g][near].Applied)
			}
		}
	}
	for round := range 3 {
		for key := range want {
			get(w, key, client.Linearizable, -1)
			for i := range 3 {
				get(cls[1+i], key, client.StaleOK, i)
			}
		}
		if round < 2 {
			time.Sleep(testTuning.ElectionTimeout)
		}
	}
	t.Logf("+%v: %d gets (linearizable and stale-ok from each replica) with every replica stopped for %v: mean %v, slowest %v",
		c.since(), ngets, time.Since(stopAt).Round(time.Millisecond), (total / time.Duration(ngets)).Round(time.Microsecond), slowest.Round(time.Microsecond))

	for _, p := range procs {
		ticks, state, err := kvproc.CPUTime(p.Pid())
		if err != nil {
			t.Fatalf("pid %d: %v", p.Pid(), err)
		}
		if state != 'T' || ticks != cpu[p.Pid()] {
			t.Errorf("pid %d: state %c, CPU time %d ticks (%d when stopped): it ran while stopped", p.Pid(), state, ticks, cpu[p.Pid()])
		}
	}
	cont()
	contAt := time.Now()

	// Writes work again, in both groups, and linearizable gets see them.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			key, v := fmt.Sprintf("s%d", i), fmt.Sprintf("after-%d", i)
			if _, err := w.Put(ctx, []byte(key), []byte(v)); err != nil {
				t.Errorf("put %q after SIGCONT: %v", key, err)
				return
			}
			if got, err := w.Get(ctx, []byte(key)); err != nil || string(got) != v {
				t.Errorf("get %q after SIGCONT: %q %v, want %q", key, got, err, v)
			}
		})
	}
	wg.Wait()
	t.Logf("+%v: after SIGCONT, 8 puts and gets in both groups done in %v", c.since(), time.Since(contAt).Round(time.Millisecond))
	for g := range groups {
		t.Logf("group %d leader after SIGCONT: replica %d", g, c.leader(ctx, g))
	}

	for k, cl := range cls {
		if err := cl.Close(); err != nil {
			t.Errorf("client %d: close: %v", k, err)
		}
		cls[k] = nil
	}
	c.closeAll()
	c.checkNoFiles()
}

// TestWriteContextWhileStopped: a write needs the servers' CPU, so with
// every replica stopped (SIGSTOP) a put gets no answer; it must return
// ErrOutcomeUnknown when its context ends (client.ErrOutcomeUnknown's
// contract), not hang until the servers run again. After SIGCONT the put
// may or may not have been applied, once, and writes work again.
func TestWriteContextWhileStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 1, 1, testTuning)
	w, err := c.openClient(ctx, 0, client.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Put(ctx, []byte("before"), []byte("1")); err != nil {
		t.Fatalf("put: %v", err)
	}
	var procs []*kvproc.Proc
	for _, r := range c.reps[0] {
		procs = append(procs, r.p)
	}
	for _, p := range procs {
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP pid %d: %v", p.Pid(), err)
		}
	}
	stopped := true
	cont := func() {
		if !stopped {
			return
		}
		stopped = false
		for _, p := range procs {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT pid %d: %v", p.Pid(), err)
			}
		}
	}
	defer cont()
	// On a goroutine: a put that ignores its context would hang the test.
	werrc := make(chan error, 1)
	at := time.Now()
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer wcancel()
		_, err := w.Put(wctx, []byte("while-stopped"), []byte("x"))
		werrc <- err
	}()
	returned := false
	select {
	case werr := <-werrc:
		returned = true
		if !errors.Is(werr, client.ErrOutcomeUnknown) {
			t.Errorf("a put with every replica stopped returned %v after %v, want ErrOutcomeUnknown", werr, time.Since(at).Round(time.Millisecond))
		} else {
			t.Logf("a put with a 300 ms context and every replica stopped returned after %v: %v", time.Since(at).Round(time.Millisecond), werr)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("a put with a 300 ms context and every replica stopped had not returned after 5 s; it must end with ErrOutcomeUnknown when its context ends")
	}
	cont()
	if _, err := w.Put(ctx, []byte("after"), []byte("2")); err != nil {
		t.Fatalf("put after SIGCONT: %v", err)
	}
	got, err := w.Get(ctx, []byte("while-stopped"))
	if err != nil && !errors.Is(err, client.ErrNotFound) || err == nil && string(got) != "x" {
		t.Errorf("the put of unknown outcome: %q %v, want x or not found", got, err)
	}
	t.Logf("after SIGCONT: writes work; the put of unknown outcome was applied: %v", err == nil)
	if !returned {
		select {
		case <-werrc:
		case <-time.After(10 * time.Second):
			t.Errorf("the put of unknown outcome had not returned 10 s after SIGCONT")
		}
	}
	w.Close()
	c.closeAll()
	c.checkNoFiles()
}
