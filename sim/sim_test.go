package sim_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// fabricChecker observes op events and checks the fabric's promises: on
// every Conn, ops land and complete in post order without gaps, nothing
// completes before it landed, and after a crash only the kept prefix of a
// Conn's queue lands.
type fabricChecker struct {
	err   error
	conns map[uint64]*connTrack
}

type connTrack struct {
	posted, landed, completed uint64 // next expected sequence numbers
}

func newFabricChecker() *fabricChecker { return &fabricChecker{conns: map[uint64]*connTrack{}} }

func (f *fabricChecker) observe(ev sim.Event) {
	if f.err != nil || ev.Conn == 0 {
		return
	}
	t := f.conns[ev.Conn]
	if t == nil {
		t = &connTrack{}
		f.conns[ev.Conn] = t
	}
	bad := func(format string, args ...any) {
		f.err = fmt.Errorf("fabric: %v: %s", ev, fmt.Sprintf(format, args...))
	}
	switch ev.Kind {
	case sim.EvPost:
		if ev.Seq != t.posted {
			bad("posted as #%d, expected #%d", ev.Seq, t.posted)
		}
		t.posted++
	case sim.EvTear, sim.EvLand:
		switch {
		case ev.Seq >= t.posted:
			bad("landed an op that is not queued (posted up to #%d; a crash may have dropped it)", t.posted)
		case ev.Seq != t.landed:
			bad("landed out of order: expected #%d (FIFO per Conn)", t.landed)
		}
		if ev.Kind == sim.EvLand {
			t.landed++
		}
	case sim.EvComplete:
		if ev.Seq != t.completed || ev.Seq >= t.landed {
			bad("completed out of order or before landing: expected #%d, landed up to #%d", t.completed, t.landed)
		}
		t.completed++
	case sim.EvFail:
		if ev.Seq != t.completed {
			bad("failed from #%d, expected #%d", ev.Seq, t.completed)
		}
		t.landed, t.completed = t.posted, t.posted
	case sim.EvDrop:
		if ev.Seq < t.landed || ev.Seq+uint64(ev.Len) != t.posted {
			bad("dropped [#%d,+%d) of a queue [#%d,#%d): not a tail", ev.Seq, ev.Len, t.landed, t.posted)
		}
		t.posted = ev.Seq
	}
}

func TestSameSeedSameTrace(t *testing.T) {
	t.Parallel()
	const seeds = 8
	hashes := map[uint64]uint64{}
	for seed := uint64(1); seed <= seeds; seed++ {
		var h [2]uint64
		var ev [2]uint64
		for i := range 2 {
			r, err := runCounter(sim.Seed{Seed: seed}, counterConfig{}, nil)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			h[i], ev[i] = r.s.TraceHash(), r.s.Events()
		}
		if h[0] != h[1] || ev[0] != ev[1] {
			t.Fatalf("seed %d: two runs differ: hash %x vs %x, %d vs %d events", seed, h[0], h[1], ev[0], ev[1])
		}
		if ev[0] < 300 {
			t.Fatalf("seed %d: only %d events: the workload did not run", seed, ev[0])
		}
		hashes[h[0]] = seed
	}
	if len(hashes) != seeds {
		t.Fatalf("%d seeds gave only %d distinct traces", seeds, len(hashes))
	}
}

// prober is a scripted process: the test drives it through hooks.
type prober struct {
	env    *sim.Env
	peer   rdma.NodeID
	region rdma.Region
	conn   rdma.Conn
	got    []rdma.Completion
	onStep func(p *prober, now time.Duration)
}

func (p *prober) Start(env *sim.Env) error {
	p.env = env
	r, err := env.Node().Register(1, 4096)
	if err != nil {
		return err
	}
	p.region = r
	for _, id := range env.Nodes() {
		if err := r.Grant(id, rdma.PermReadWrite); err != nil {
			return err
		}
	}
	if p.peer != 0 {
		p.conn, err = env.Node().Connect(p.peer)
	}
	return err
}

func (p *prober) Step(now time.Duration) bool {
	if p.conn != nil {
		var cs [8]rdma.Completion
		for k := p.conn.Poll(cs[:]); k > 0; k = p.conn.Poll(cs[:]) {
			p.got = append(p.got, cs[:k]...)
		}
	}
	if p.onStep != nil {
		p.onStep(p, now)
	}
	return false
}

// twoNodes returns a sim where node 1 connects to node 2, without random
// delay tails or torn writes unless opts asks for them.
func twoNodes(t *testing.T, opts sim.Options) *sim.Sim {
	t.Helper()
	if opts.TailProb == 0 {
		opts.TailProb = -1
	}
	if opts.TearProb == 0 {
		opts.TearProb = -1
	}
	s := sim.New(opts)
	t.Cleanup(func() { s.Close() })
	if err := s.AddNode(1, func() sim.Process { return &prober{peer: 2} }); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNode(2, func() sim.Process { return &prober{} }); err != nil {
		t.Fatal(err)
	}
	run(t, s, 50*time.Microsecond) // boot
	return s
}

func run(t *testing.T, s *sim.Sim, d time.Duration) {
	t.Helper()
	if err := s.RunFor(d); err != nil {
		t.Fatal(err)
	}
}

func proc(s *sim.Sim, id rdma.NodeID) *prober { return s.Process(id).(*prober) }

func post(t *testing.T, p *prober, off, v uint64) {
	t.Helper()
	buf := binary.LittleEndian.AppendUint64(nil, v)
	if err := p.conn.Post(rdma.WR{ID: v, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Offset: off, Buf: buf}); err != nil {
		t.Fatal(err)
	}
}

func memWord(s *sim.Sim, id rdma.NodeID, off int) uint64 {
	return rdma.Load64(proc(s, id).region.Bytes(), off)
}

// failTimes records, per Conn, when each op was posted and when the Conn
// failed.
func failTimes(s *sim.Sim) (posts, fails map[uint64]time.Duration) {
	posts, fails = map[uint64]time.Duration{}, map[uint64]time.Duration{}
	s.Observe(func(ev sim.Event) {
		switch ev.Kind {
		case sim.EvPost:
			posts[ev.Conn] = ev.Time
		case sim.EvFail:
			fails[ev.Conn] = ev.Time
		}
	})
	return posts, fails
}

func TestCutLinkHoldsOpsThenFailsThem(t *testing.T) {
	timeout := time.Millisecond
	s := twoNodes(t, sim.Options{Seed: 1, FabricTimeout: timeout})
	posts, fails := failTimes(s)
	p := proc(s, 1)

	// Cut, then heal before the timeout: the op waits, then lands.
	s.Cut(1, 2)
	post(t, p, 0, 11)
	run(t, s, timeout/2)
	if got := memWord(s, 2, 0); got != 0 || len(p.got) != 0 {
		t.Fatalf("over a cut link the write landed (word %d) or completed (%v)", got, p.got)
	}
	s.Heal(1, 2)
	run(t, s, 100*time.Microsecond)
	if got := memWord(s, 2, 0); got != 11 || len(p.got) != 1 || p.got[0].Err != nil {
		t.Fatalf("after heal: word %d, completions %v; want 11 and one success", got, p.got)
	}

	// Cut for longer than the timeout: the op fails with ErrPeerDead, not
	// before the timeout, and never lands.
	s.Cut(1, 2)
	post(t, p, 8, 12)
	post(t, p, 16, 13)
	run(t, s, 3*timeout)
	if len(p.got) != 3 || !errors.Is(p.got[1].Err, rdma.ErrPeerDead) || !errors.Is(p.got[2].Err, rdma.ErrPeerDead) {
		t.Fatalf("completions %v: want the two held ops failed with ErrPeerDead", p.got)
	}
	c := uint64(1)
	if held := fails[c] - posts[c]; held < timeout {
		t.Fatalf("ops failed after %v, before the fabric timeout %v", held, timeout)
	}
	s.Heal(1, 2)
	run(t, s, timeout)
	if memWord(s, 2, 8) != 0 || memWord(s, 2, 16) != 0 {
		t.Fatal("a failed op landed after the link healed")
	}
	if p.conn.Err() == nil || p.conn.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: make([]byte, 8)}) == nil {
		t.Fatal("the Conn is not broken after its ops timed out")
	}
}

func TestLostAcknowledgementFailsALandedOp(t *testing.T) {
	s := twoNodes(t, sim.Options{Seed: 2})
	p := proc(s, 1)
	s.Cut(2, 1) // only the way back
	post(t, p, 0, 21)
	run(t, s, 3*time.Millisecond)
	if got := memWord(s, 2, 0); got != 21 {
		t.Fatalf("the write did not land (word %d) though its way there works", got)
	}
	if len(p.got) != 1 || !errors.Is(p.got[0].Err, rdma.ErrPeerDead) {
		t.Fatalf("completions %v: want ErrPeerDead, the acknowledgement never came back", p.got)
	}
}

func TestCrashedTargetFailsOpsAfterTimeoutAndRestartsEmpty(t *testing.T) {
	timeout := 2 * time.Millisecond
	s := twoNodes(t, sim.Options{Seed: 3, FabricTimeout: timeout})
	posts, fails := failTimes(s)
	p := proc(s, 1)
	post(t, p, 0, 31)
	run(t, s, 100*time.Microsecond)
	if memWord(s, 2, 0) != 31 {
		t.Fatal("write did not land")
	}
	if err := s.Crash(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Crash(2); !errors.Is(err, sim.ErrNodeState) {
		t.Fatalf("second crash: %v, want ErrNodeState", err)
	}
	post(t, p, 8, 32)
	run(t, s, timeout/2)
	if len(p.got) != 1 {
		t.Fatalf("an op to a crashed node completed before the fabric timeout: %v", p.got)
	}
	run(t, s, timeout)
	if len(p.got) != 2 || !errors.Is(p.got[1].Err, rdma.ErrPeerDead) {
		t.Fatalf("completions %v: want the op to the crashed node failed with ErrPeerDead", p.got)
	}
	if held := fails[1] - posts[1]; held < timeout {
		t.Fatalf("op failed %v after posting, before the timeout %v", held, timeout)
	}
	if _, err := p.env.Node().Connect(2); !errors.Is(err, rdma.ErrPeerDead) {
		t.Fatalf("connect to a crashed node: %v, want ErrPeerDead", err)
	}
	if err := s.Restart(2, true); err != nil {
		t.Fatal(err)
	}
	if s.Incarnation(2) != 2 || memWord(s, 2, 0) != 0 {
		t.Fatalf("restarted node: incarnation %d, word 0 = %d; want 2 and fresh memory", s.Incarnation(2), memWord(s, 2, 0))
	}
	c, err := p.env.Node().Connect(2)
	if err != nil {
		t.Fatal(err)
	}
	p.conn = c
	post(t, p, 0, 33)
	run(t, s, 100*time.Microsecond)
	if memWord(s, 2, 0) != 33 {
		t.Fatal("a write over a new Conn did not land in the restarted node")
	}
}

func TestRestartKeepsOrLosesDisk(t *testing.T) {
	s := twoNodes(t, sim.Options{Seed: 4})
	if err := proc(s, 2).env.Disk().Put("vote", []byte("epoch 7")); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{true, false} {
		s.Crash(2)
		run(t, s, time.Millisecond)
		if err := s.Restart(2, keep); err != nil {
			t.Fatal(err)
		}
		v, ok := proc(s, 2).env.Disk().Get("vote")
		if ok != keep || keep && string(v) != "epoch 7" {
			t.Fatalf("restart keep=%v: disk has %q, %v", keep, v, ok)
		}
	}
}

// TestCrashLandsOnlyAPrefix: a node posts a numbered series of writes and
// crashes at a random moment; at the target the writes that landed must be
// exactly a prefix of the series, and over the seeds all kinds of prefixes
// (none, some, all) occur.
func TestCrashLandsOnlyAPrefix(t *testing.T) {
	t.Parallel()
	const n = 40
	kinds := map[string]int{}
	simFlags.Run(t, func(sd sim.Seed) error {
		s := sim.New(sd.WithLog(t).Options())
		defer s.Close()
		s.AddNode(1, func() sim.Process { return &prober{peer: 2} })
		s.AddNode(2, func() sim.Process { return &prober{} })
		if err := s.RunFor(10 * time.Microsecond); err != nil {
			return err
		}
		p := proc(s, 1)
		for i := range n {
			buf := binary.LittleEndian.AppendUint64(nil, uint64(i+1))
			if err := p.conn.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(8 * i), Buf: buf}); err != nil {
				return err
			}
		}
		crashAt := time.Duration(sd.Seed%30) * time.Microsecond
		s.At(s.Now()+crashAt, func() { s.Crash(1) })
		if err := s.RunFor(5 * time.Millisecond); err != nil {
			return err
		}
		k := 0
		for k < n && memWord(s, 2, 8*k) == uint64(k+1) {
			k++
		}
		for i := k; i < n; i++ {
			if w := memWord(s, 2, 8*i); w != 0 {
				return fmt.Errorf("write %d landed (word %d) though write %d did not: not a prefix", i, w, k)
			}
		}
		switch {
		case k == 0:
			kinds["none"]++
		case k == n:
			kinds["all"]++
		default:
			kinds["some"]++
		}
		return nil
	})
	// Over enough seeds every kind of prefix must show up.
	if kinds["none"]+kinds["some"]+kinds["all"] >= 100 && (kinds["none"] == 0 || kinds["some"] == 0 || kinds["all"] == 0) {
		t.Fatalf("prefixes seen %v: the crash model does not explore none/some/all", kinds)
	}
}

// TestTornWrites: with TearProb 1 every long write lands in two parts and
// the target can step in between; the final memory is the whole write.
func TestTornWrites(t *testing.T) {
	s := sim.New(sim.Options{Seed: 5, TearProb: 1})
	t.Cleanup(func() { s.Close() })
	torn := 0
	s.AddNode(1, func() sim.Process { return &prober{peer: 2} })
	s.AddNode(2, func() sim.Process {
		return &prober{onStep: func(p *prober, _ time.Duration) {
			b := p.region.Bytes()
			first, last := rdma.Load64(b, 0), rdma.Load64(b, 56)
			if first != last {
				torn++
			}
		}}
	})
	run(t, s, 10*time.Microsecond)
	p := proc(s, 1)
	for v := uint64(1); v <= 20; v++ {
		buf := make([]byte, 64)
		for i := 0; i < 64; i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], v)
		}
		if err := p.conn.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: buf, Flags: rdma.Notify}); err != nil {
			t.Fatal(err)
		}
		run(t, s, 30*time.Microsecond)
	}
	if torn == 0 {
		t.Fatal("the target never saw a torn write")
	}
	for i := 0; i < 64; i += 8 {
		if w := memWord(s, 2, i); w != 20 {
			t.Fatalf("word %d is %d after all writes landed, want 20", i/8, w)
		}
	}
}

func TestSlowNodeStepsLess(t *testing.T) {
	s := sim.New(sim.Options{Seed: 6})
	t.Cleanup(func() { s.Close() })
	steps := map[rdma.NodeID]int{}
	s.Observe(func(ev sim.Event) {
		if ev.Kind == sim.EvStep {
			steps[ev.Node]++
		}
	})
	s.AddNode(1, func() sim.Process { return &prober{} })
	s.AddNode(2, func() sim.Process { return &prober{} })
	s.SetSlow(2, 10)
	run(t, s, 40*time.Millisecond)
	if steps[1] < 100 || steps[2]*5 > steps[1] {
		t.Fatalf("steps: fast node %d, slow (x10) node %d", steps[1], steps[2])
	}
}

func TestTimersWakeANode(t *testing.T) {
	s := sim.New(sim.Options{Seed: 7, Tick: -1})
	t.Cleanup(func() { s.Close() })
	var at []time.Duration
	s.AddNode(1, func() sim.Process {
		return &prober{onStep: func(p *prober, now time.Duration) {
			at = append(at, now)
			if len(at) < 4 {
				p.env.WakeAfter(time.Millisecond)
			}
		}}
	})
	run(t, s, 10*time.Millisecond)
	if len(at) != 4 {
		t.Fatalf("steps at %v: want the boot step and three timer steps, nothing else (ticks are off)", at)
	}
	for i := 1; i < 4; i++ {
		if at[i]-at[i-1] != time.Millisecond {
			t.Fatalf("steps at %v: timers not 1ms apart", at)
		}
	}
}

func TestInvariantFailureNamesTheSeed(t *testing.T) {
	s := sim.New(sim.Options{Seed: 4242})
	t.Cleanup(func() { s.Close() })
	s.AddNode(1, func() sim.Process { return &prober{} })
	errBoom := errors.New("boom")
	s.Invariant(func() error {
		if s.Now() > time.Millisecond {
			return errBoom
		}
		return nil
	})
	err := s.RunFor(10 * time.Millisecond)
	var f *sim.Failure
	if !errors.As(err, &f) || !errors.Is(err, errBoom) || f.Seed != 4242 || len(f.Recent) == 0 {
		t.Fatalf("err = %v; want a *Failure for seed 4242 wrapping the invariant's error, with recent events", err)
	}
	if s.Now() > 2*time.Millisecond {
		t.Fatalf("the run went on to %v after the invariant failed", s.Now())
	}
	cmd := sim.RerunCommand("TestCounterSim", 4242)
	if want := "go test ./sim -run '^TestCounterSim$' -seed 4242 -v -simtrace"; cmd != want {
		t.Fatalf("rerun command %q, want %q", cmd, want)
	}
}

// TestRandomFaultsRespectKnobsAndHeal: the random schedule draws every kind
// of fault, never has more than MaxDown nodes down at once, loses disks
// when told to, and at Until ends every fault.
func TestRandomFaultsRespectKnobsAndHeal(t *testing.T) {
	t.Parallel()
	until := 30 * time.Millisecond
	s := sim.New(sim.Options{Seed: 8, Faults: sim.Faults{Until: until, Every: 500 * time.Microsecond, MaxDown: 2, LoseDisk: 1}})
	t.Cleanup(func() { s.Close() })
	ids := []rdma.NodeID{1, 2, 3, 4, 5}
	for _, id := range ids {
		s.AddNode(id, func() sim.Process { return &prober{} })
	}
	kinds := map[sim.EventKind]int{}
	down, maxDown, emptyDisk := 0, 0, 0
	s.Observe(func(ev sim.Event) {
		kinds[ev.Kind]++
		switch ev.Kind {
		case sim.EvCrash:
			down++
			maxDown = max(maxDown, down)
		case sim.EvRestart:
			down--
			if ev.Len == 0 {
				emptyDisk++
			}
		}
	})
	run(t, s, until+time.Microsecond)
	for _, k := range []sim.EventKind{sim.EvCrash, sim.EvRestart, sim.EvCut, sim.EvHeal, sim.EvSlow} {
		if kinds[k] == 0 {
			t.Errorf("no %v events in %v of random faults: %v", k, until, kinds)
		}
	}
	if maxDown > 2 || maxDown == 0 {
		t.Errorf("at most %d nodes were down at once, want 1 or 2 (MaxDown 2)", maxDown)
	}
	if emptyDisk == 0 {
		t.Error("LoseDisk 1, yet no restart before Until got an empty disk")
	}
	for _, a := range ids {
		if !s.Live(a) {
			t.Errorf("node %d is still down after Until", a)
		}
		for _, b := range ids {
			if !s.Linked(a, b) {
				t.Errorf("link %d->%d still cut after Until", a, b)
			}
		}
	}
	// Nothing happens after Until but steps.
	before := kinds[sim.EvCrash] + kinds[sim.EvCut] + kinds[sim.EvSlow]
	run(t, s, 20*time.Millisecond)
	if after := kinds[sim.EvCrash] + kinds[sim.EvCut] + kinds[sim.EvSlow]; after != before {
		t.Errorf("%d faults started after Until", after-before)
	}
}
