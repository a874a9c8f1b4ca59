package groupproc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/internal/childproc"
	"github.com/rdmakv/rdmakv/internal/freeport"
	"github.com/rdmakv/rdmakv/rdma"
)

// testWait bounds a test's wait for one proposal, a leader, a convergence:
// generous for a loaded 2-core machine under the race detector, far below
// the package timeout, so that a test fails with a message, never hangs.
const testWait = 30 * time.Second

// TestMain plays a member process when spawned as one (Spawn).
func TestMain(m *testing.M) {
	childproc.ServeIfChild()
	os.Exit(m.Run())
}

// group is a test's set of member processes.
type group struct {
	t     *testing.T
	cfgs  []Config
	procs []*Proc
}

func (g *group) spawn(i int) {
	g.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		g.t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Stderr = os.Stderr
	p, err := Spawn(cmd, g.cfgs[i], 30*time.Second)
	if err != nil {
		g.t.Fatal(err)
	}
	g.procs[i] = p
}

// statuses returns every live member's status (nil for dead ones).
func (g *group) statuses(ctx context.Context) []*broadcast.Status {
	out := make([]*broadcast.Status, len(g.procs))
	for i, p := range g.procs {
		if p == nil {
			continue
		}
		if s, err := p.Status(ctx); err == nil {
			out[i] = &s
		}
	}
	return out
}

// describe lists every member's status for a failure message.
func (g *group) describe(ctx context.Context) string {
	var b strings.Builder
	for i, s := range g.statuses(ctx) {
		if s == nil {
			fmt.Fprintf(&b, "\n\tmember %d: down or not answering", i+1)
		} else {
			fmt.Fprintf(&b, "\n\tmember %d: %+v", i+1, *s)
		}
	}
	return b.String()
}

// waitLeader waits until one live member leads an epoch whose diff has
// committed there, and returns its index.
func (g *group) waitLeader(ctx context.Context, not int) int {
	g.t.Helper()
	for {
		for i, s := range g.statuses(ctx) {
			if i != not && s != nil && s.Role == broadcast.Leader && s.Committed.E == s.ECur {
				return i
			}
		}
		if ctx.Err() != nil {
			g.t.Fatalf("no leader: %v", ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// client proposes at one member with a window of workers, each proposing
// distinct data one at a time, and records every outcome. A worker waits
// up to wait for each reply; a proposal still unanswered then is recorded
// as stuck and ends the worker (the test fails on it).
type client struct {
	mu      sync.Mutex
	acked   map[string]uint64 // delivered, at index (0: index unknown)
	dropped map[string]error  // refused: must never be delivered
	unknown map[string]error  // outcome unknown
	stuck   []string          // not answered within wait
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startClient(p *Proc, window int, wait time.Duration) *client {
	c := &client{acked: map[string]uint64{}, dropped: map[string]error{}, unknown: map[string]error{}, stop: make(chan struct{})}
	for w := range window {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			timer := time.NewTimer(wait)
			defer timer.Stop()
			for k := 0; ; k++ {
				select {
				case <-c.stop:
					return
				default:
				}
				d := fmt.Sprintf("w%d-%d", w, k)
				start := time.Now()
				timer.Reset(wait)
				var r Reply
				select {
				case r = <-p.Send(Request{Cmd: CmdPropose, Data: d}):
				case <-timer.C:
					c.mu.Lock()
					c.stuck = append(c.stuck, fmt.Sprintf("proposal %s at pid %d not resolved after %v (bound %v)", d, p.Pid(), time.Since(start).Round(time.Millisecond), wait))
					c.mu.Unlock()
					return
				}
				err := r.Error()
				c.mu.Lock()
				switch {
				case err == nil:
					c.acked[d] = r.Index
				case errors.Is(err, broadcast.ErrBusy), errors.Is(err, broadcast.ErrTimeout), errors.Is(err, broadcast.ErrTooLarge):
					c.dropped[d] = err
				default:
					c.unknown[d] = err
				}
				c.mu.Unlock()
				if errors.Is(err, ErrExited) {
					return
				}
			}
		}()
	}
	return c
}

func (c *client) nacked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.acked)
}

// waitAcked waits until at least n proposals were acknowledged; it fails
// when ctx ends first or a worker's proposal got stuck.
func (c *client) waitAcked(t *testing.T, ctx context.Context, g *group, n int, what string) {
	t.Helper()
	for c.nacked() < n {
		c.mu.Lock()
		a, d, u, stuck := len(c.acked), len(c.dropped), len(c.unknown), slices.Clone(c.stuck)
		c.mu.Unlock()
		if ctx.Err() != nil || len(stuck) > 0 {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st := g.describe(sctx)
			cancel()
			t.Fatalf("%s: %d of %d proposals acknowledged; %d refused, %d unknown; %v; stuck: %q%s", what, a, n, d, u, ctx.Err(), stuck, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopAndCheck stops the client's workers, waits for them (each waits at
// most its bound for its last proposal, so wait is a bound here too), and
// fails the test if one did not return or a proposal got stuck.
func (c *client) stopAndCheck(t *testing.T, g *group, wait time.Duration) {
	t.Helper()
	close(c.stop)
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Errorf("client workers still running %v after their stop", wait)
	}
	c.mu.Lock()
	stuck := slices.Clone(c.stuck)
	c.mu.Unlock()
	if len(stuck) > 0 {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t.Errorf("stuck proposals: %q%s", stuck, g.describe(sctx))
	}
}

// TestKillLeaderShm and TestKillLeaderTCP run a three-member group, each
// member its own OS process, with a client proposing at a follower; they
// kill -9 the leader mid-load, keep proposing through the election, restart
// the killed member with empty memory and its stable file, and check that
// it caught up and that no committed entry was lost, duplicated or
// reordered.
func TestKillLeaderShm(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "groupproc-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	killLeader(t, func(c *Config) { c.Fabric, c.ShmDir, c.ShmCluster = FabricShm, dir, "g" })
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if len(left) > 0 {
		t.Errorf("shm files left behind after every member closed: %v", left)
	}
}

func TestKillLeaderTCP(t *testing.T) {
	addrs := freeport.Addrs(t, 3)
	secret := make([]byte, 32)
	rand.Read(secret)
	killLeader(t, func(c *Config) {
		c.Fabric, c.Secret, c.Addrs = FabricTCP, secret, map[rdma.NodeID]string{}
		for i, a := range addrs {
			c.Addrs[rdma.NodeID(i+1)] = a
		}
	})
}

func killLeader(t *testing.T, fabric func(*Config)) {
	ids := []rdma.NodeID{1, 2, 3}
	stable := t.TempDir()
	g := &group{t: t, procs: make([]*Proc, len(ids))}
	for _, id := range ids {
		c := Config{Self: id, Members: ids, Record: true,
			StablePath:  filepath.Join(stable, fmt.Sprintf("node%d.stable", id)),
			Start:       broadcast.StartNew, // restarts find the file
			PeerTimeout: 500 * time.Millisecond,
			Tuning: Tuning{RingSize: 256 << 10, HeartbeatInterval: 2 * time.Millisecond,
				ElectionTimeout: 150 * time.Millisecond, MaxLogEntries: 2048, ProposeTimeout: 5 * time.Second}}
		fabric(&c)
		g.cfgs = append(g.cfgs, c)
	}
	defer func() {
		for _, p := range g.procs {
			if p != nil {
				p.Kill()
			}
		}
	}()
	for i := range ids {
		g.spawn(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	leader := g.waitLeader(ctx, -1)
	proposer := (leader + 1) % len(ids)
	c := startClient(g.procs[proposer], 16, testWait)
	stopClient := sync.OnceFunc(func() { c.stopAndCheck(t, g, testWait+5*time.Second) })
	defer stopClient()
	c.waitAcked(t, ctx, g, 1000, "before the kill")

	// kill -9 the leader mid-load; the client keeps proposing.
	killed := leader
	atKill := c.nacked()
	if err := g.procs[killed].Kill(); err != nil {
		t.Fatal(err)
	}
	g.procs[killed] = nil
	newLeader := g.waitLeader(ctx, killed)
	c.waitAcked(t, ctx, g, atKill+1000, "after the kill")
	t.Logf("leader %d killed after %d acks; member %d leads now", ids[killed], atKill, ids[newLeader])

	// Restart it with empty memory and the same stable file: it catches up.
	g.spawn(killed)
	ps, err := g.procs[proposer].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.waitAcked(t, ctx, g, c.nacked()+1000, "after the restart")
	for {
		st := g.statuses(ctx)
		if s := st[killed]; s != nil && !s.CatchingUp && s.Role == broadcast.Follower && s.Index >= ps.Index {
			t.Logf("restarted member: index %d, counters %+v", s.Index, s.Counters)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted member did not catch up: %+v", st[killed])
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopClient()

	// Quiesce: every member reaches the same digest.
	var digests []Digest
	for {
		digests = digests[:0]
		for _, p := range g.procs {
			r, err := p.Call(ctx, Request{Cmd: CmdDigest})
			if err != nil {
				t.Fatal(err)
			}
			digests = append(digests, *r.Digest)
		}
		if digests[0] == digests[1] && digests[1] == digests[2] {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("members did not converge: %v", digests)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var seqs [][]string
	for _, p := range g.procs {
		r, err := p.Call(ctx, Request{Cmd: CmdDump})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Entries)
	}
	checkHistory(t, seqs, c)

	for i, p := range g.procs {
		if err := p.Close(10 * time.Second); err != nil {
			t.Errorf("member %d: %v", ids[i], err)
		}
		g.procs[i] = nil
	}
}

// checkHistory checks total order (every two sequences are prefixes of one
// another), integrity (only proposed data, each at most once), that every
// acknowledged proposal is delivered exactly once at its index, and that
// no refused proposal is delivered.
func checkHistory(t *testing.T, seqs [][]string, c *client) {
	t.Helper()
	for i := range seqs {
		for j := i + 1; j < len(seqs); j++ {
			a, b := seqs[i], seqs[j]
			n := min(len(a), len(b))
			if !slices.Equal(a[:n], b[:n]) {
				k := 0
				for k < n && a[k] == b[k] {
					k++
				}
				t.Fatalf("members %d and %d diverge at index %d: %q vs %q", i+1, j+1, k+1, a[k], b[k])
			}
		}
	}
	longest := slices.MaxFunc(seqs, func(a, b []string) int { return len(a) - len(b) })
	at := map[string]int{}
	for i, d := range longest {
		if prev, ok := at[d]; ok {
			t.Fatalf("%q delivered twice, at %d and %d", d, prev+1, i+1)
		}
		at[d] = i
		if !strings.HasPrefix(d, "w") {
			t.Fatalf("index %d holds %q, which nobody proposed", i+1, d)
		}
	}
	for d, idx := range c.acked {
		i, ok := at[d]
		switch {
		case !ok:
			t.Errorf("%q acknowledged at index %d but never delivered", d, idx)
		case idx != 0 && uint64(i+1) != idx:
			t.Errorf("%q acknowledged at index %d but delivered at %d", d, idx, i+1)
		}
	}
	for d, err := range c.dropped {
		if _, ok := at[d]; ok {
			t.Errorf("%q refused (%v) but delivered", d, err)
		}
	}
	t.Logf("%d entries delivered in one order by %d members; %d acknowledged, %d refused, %d unknown",
		len(longest), len(seqs), len(c.acked), len(c.dropped), len(c.unknown))
}
