package sim_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// Overlapping reads (Options.ReadOverlap). A publisher stores a step
// number into the data words of its region, one by one with a Yield after
// each, and then into the flag word (word 0), as a writer publishes data
// before the flag that says it is there. A reader posts, in one list, a
// read of the flag and then a read of the data. What the mode promises:
//   - every word read is a value the word held (no garbage);
//   - reads on a Conn see the target's stores in order: data read after a
//     flag showing step s shows step s or later in every word;
//   - some reads return words from two moments (the mode does something);
//   - a seed's run is the same every time, and without the mode no read
//     is held.

const ovWords = 8 // the flag and 7 data words

type publisher struct {
	env       *sim.Env
	reg       rdma.Region
	step      uint64
	flagFirst bool // the bug: the flag before the data
}

func (p *publisher) Start(env *sim.Env) error {
	p.env = env
	r, err := env.Node().Register(1, 8*ovWords)
	if err != nil {
		return err
	}
	p.reg = r
	return r.Grant(2, rdma.PermRead)
}

func (p *publisher) Step(now time.Duration) bool {
	p.step++
	b := p.reg.Bytes()
	if p.flagFirst {
		rdma.Store64(b, 0, p.step)
		p.env.Yield()
	}
	for i := 1; i < ovWords; i++ {
		rdma.Store64(b, 8*i, p.step)
		p.env.Yield()
	}
	rdma.Store64(b, 0, p.step)
	p.env.Yield()
	p.env.WakeAfter(3 * time.Microsecond)
	return false
}

type flagReader struct {
	env        *sim.Env
	conn       rdma.Conn
	flag, data []byte
	posted     bool
	pub        *publisher
	reads      int
	err        error
}

func (r *flagReader) Start(env *sim.Env) error {
	r.env = env
	r.flag, r.data = make([]byte, 8), make([]byte, 8*(ovWords-1))
	c, err := env.Node().Connect(1)
	r.conn = c
	return err
}

func (r *flagReader) Step(now time.Duration) bool {
	var cs [4]rdma.Completion
	for _, c := range cs[:r.conn.Poll(cs[:])] {
		if c.Err != nil {
			r.err = c.Err
			return false
		}
		if c.ID == 2 {
			r.posted = false
			r.reads++
			f := binary.LittleEndian.Uint64(r.flag)
			for i := 0; i < ovWords-1; i++ {
				d := binary.LittleEndian.Uint64(r.data[8*i:])
				if d > r.pub.step {
					r.err = fmt.Errorf("data word %d is %d, never written (step %d)", i+1, d, r.pub.step)
				}
				if d < f {
					r.err = fmt.Errorf("flag read first shows step %d, data word %d read after it shows %d", f, i+1, d)
				}
			}
			if f > r.pub.step {
				r.err = fmt.Errorf("flag is %d, never written (step %d)", f, r.pub.step)
			}
		}
	}
	if !r.posted && r.reads < 2000 {
		r.conn.PostList([]rdma.WR{
			{Kind: rdma.OpRead, Region: 1, Buf: r.flag, ID: 1},
			{Kind: rdma.OpRead, Region: 1, Offset: 8, Buf: r.data, Flags: rdma.Signaled, ID: 2},
		})
		r.posted = true
	}
	r.env.WakeAfter(2 * time.Microsecond)
	return false
}

func runOverlap(t *testing.T, seed uint64, overlap float64, flagFirst bool) (s *sim.Sim, held int, err error) {
	t.Helper()
	s = sim.New(sim.Options{Seed: seed, Tick: -1, ReadOverlap: overlap, ReadOverlapSpan: 20 * time.Microsecond})
	t.Cleanup(func() { s.Close() })
	pub := &publisher{flagFirst: flagFirst}
	rd := &flagReader{pub: pub}
	s.AddNode(1, func() sim.Process { return pub })
	s.AddNode(2, func() sim.Process { return rd })
	s.Observe(func(ev sim.Event) {
		if ev.Kind == sim.EvHold {
			held++
		}
	})
	s.Invariant(func() error { return rd.err })
	if err := s.RunUntil(2 * time.Millisecond); err != nil {
		return s, held, err
	}
	if rd.reads < 50 {
		t.Fatalf("seed %d: only %d reads completed", seed, rd.reads)
	}
	return s, held, nil
}

// overlapSeeds is how many seeds the tests below run.
func overlapSeeds() uint64 {
	if raceEnabled {
		return 2
	}
	return 10
}

func TestReadOverlap(t *testing.T) {
	var mixed uint64
	for seed := uint64(1); seed <= overlapSeeds(); seed++ {
		s, held, err := runOverlap(t, seed, 0.5, false)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if held == 0 {
			t.Fatalf("seed %d: no read held", seed)
		}
		mixed += s.OverlapMixed()
		if s2, _, _ := runOverlap(t, seed, 0.5, false); s2.TraceHash() != s.TraceHash() {
			t.Fatalf("seed %d: two runs differ (trace hash %x, %x)", seed, s.TraceHash(), s2.TraceHash())
		}
		if s, held, _ := runOverlap(t, seed, 0, false); held != 0 || s.OverlapMixed() != 0 {
			t.Fatalf("seed %d: %d reads held without ReadOverlap", seed, held)
		}
	}
	if mixed == 0 {
		t.Fatal("no read returned words from two moments")
	}
	t.Logf("%d reads returned words from two moments", mixed)
}

// TestReadOverlapCatchesFlagFirst: a publisher that stores the flag before
// the data passes without ReadOverlap (a step is seen whole) and is caught
// with it.
func TestReadOverlapCatchesFlagFirst(t *testing.T) {
	for seed := uint64(1); seed <= overlapSeeds(); seed++ {
		if _, _, err := runOverlap(t, seed, 0, true); err != nil {
			t.Fatalf("seed %d: caught without ReadOverlap: %v", seed, err)
		}
	}
	for seed := uint64(1); seed <= 10; seed++ {
		if _, _, err := runOverlap(t, seed, 0.5, true); err != nil {
			t.Logf("seed %d caught it: %v", seed, err)
			return
		}
	}
	t.Fatal("the flag stored before the data was not caught in 10 seeds")
}
