package poller

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// holdSet is a WaitSet that records its parks: every park returns at once
// as if a ring had ended it (a stream of messages), a spin's try (deadline
// 0) finds nothing.
type holdSet struct {
	mu      sync.Mutex
	parks   int           // parks of either kind
	held    int           // WaitHolding calls
	longest time.Duration // the longest held park asked for (deadline - call)
	enough  chan struct{} // closed after want parks
	want    int
	kick    chan struct{}
	tries   int // spin tries after the first park
}

func (s *holdSet) Snapshot(dst []uint64) []uint64 { return append(dst, 0) }

func (s *holdSet) park(deadline time.Duration, held bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if deadline == 0 {
		if s.parks > 0 {
			s.tries++
		}
		return false // a spin's try
	}
	s.parks++
	if held {
		s.held++
		s.longest = max(s.longest, deadline-rdma.Mono())
	}
	if s.parks == s.want {
		close(s.enough)
	}
	return true
}

func (s *holdSet) Wait(_ []uint64, deadline time.Duration) bool { return s.park(deadline, false) }
func (s *holdSet) WaitHolding(_ []uint64, deadline time.Duration) bool {
	return s.park(deadline, true)
}
func (s *holdSet) Kick()  {}
func (s *holdSet) Close() {}

// holdBell is a doorbell whose WaitSet is a holdSet.
type holdBell struct{ s *holdSet }

func (b holdBell) Seq() uint64                             { return 0 }
func (b holdBell) Wait(uint64, time.Duration) bool         { return false }
func (b holdBell) Ring()                                   {}
func (b holdBell) NewWaitSet([]rdma.Doorbell) rdma.WaitSet { return b.s }

// holdNode is a node with a holdBell (only its doorbell is used).
type holdNode struct{ b holdBell }

func (n holdNode) ID() rdma.NodeID                                  { return 1 }
func (n holdNode) Register(rdma.RegionID, int) (rdma.Region, error) { return nil, rdma.ErrClosed }
func (n holdNode) Connect(rdma.NodeID) (rdma.Conn, error)           { return nil, rdma.ErrClosed }
func (n holdNode) Doorbell() rdma.Doorbell                          { return n.b }
func (n holdNode) Close() error                                     { return nil }

// heldParks runs a group of pollers (one task on a holdSet) with
// GOMAXPROCS procs until the set saw 200 parks, and returns how many held
// their P and the longest a held park asked for. cfg.Spin 0 means no spin.
func heldParks(t *testing.T, procs, pollers int, cfg GroupConfig) (held int, longest time.Duration) {
	held, longest, _ = heldRun(t, procs, pollers, cfg)
	return held, longest
}

// heldRun is heldParks that also returns the spin tries after the first
// park.
func heldRun(t *testing.T, procs, pollers int, cfg GroupConfig) (held int, longest time.Duration, tries int) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	s := &holdSet{want: 200, enough: make(chan struct{})}
	if cfg.Spin == 0 {
		cfg.Spin = -1
	}
	cfg.Pollers, cfg.MaxPark = pollers, time.Hour
	g := NewGroup(cfg)
	g.Add(&idleTask{}, holdNode{holdBell{s}})
	stop := runGroup(t, g)
	select {
	case <-s.enough:
	case <-time.After(30 * time.Second):
		t.Fatal("the poller parked fewer than 200 times in 30 s")
	}
	stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held, s.longest, s.tries
}

// heldFault checks the held parks of a group configured by cfg: with a
// spare P a stream's parks hold, each for at most Hold; with none, none
// holds. It returns the first rule broken ("" for none).
func heldFault(t *testing.T, cfg GroupConfig) string {
	held, longest := heldParks(t, 2, 1, cfg)
	if held < 150 {
		return fmt.Sprintf("a stream's parks with a spare P: %d of 200 held", held)
	}
	if longest > DefaultHold {
		return fmt.Sprintf("a held park asked for %v, beyond Hold %v", longest, DefaultHold)
	}
	if held, _ := heldParks(t, 2, 2, cfg); held != 0 {
		return fmt.Sprintf("%d held parks with no spare P (GOMAXPROCS 2, 2 pollers)", held)
	}
	if held, _ := heldParks(t, 2, 1, GroupConfig{Hold: -1}); held != 0 {
		return fmt.Sprintf("%d held parks with Hold < 0", held)
	}
	// With a spin budget: a stream's parks hold and no spin comes before
	// them (only the first park, before the stream was seen, spins).
	// Hold is a minute here: a park that a loaded machine kept off its
	// core beyond the default 4 ms ends the stream's held streak, and the
	// next park spins by the rule (1 run in 18 of -race at load 30 did).
	spinning := cfg
	spinning.Spin = 50 * time.Microsecond
	spinning.Hold = time.Minute
	if held, _, tries := heldRun(t, 2, 1, spinning); held < 150 || tries != 0 {
		return fmt.Sprintf("spun %d tries between a stream's parks (%d of 200 held)", tries, held)
	}
	return ""
}

// TestHeldParks: a poller holds its P only with a spare P, for at most
// Hold, and does not spin before a held park; the planted holdNoSpare
// (holding with no spare P), holdUnbounded (a held park until the task's
// deadline) and holdSpins (a spin before each held park) are caught.
func TestHeldParks(t *testing.T) {
	if f := heldFault(t, GroupConfig{}); f != "" {
		t.Fatalf("held parks: %s", f)
	}
	if f := heldFault(t, GroupConfig{holdUnbounded: true}); f == "" || !strings.Contains(f, "beyond Hold") {
		t.Fatalf("planted holdUnbounded: the check said %q, want a held park beyond Hold", f)
	}
	if f := heldFault(t, GroupConfig{holdNoSpare: true}); f == "" || !strings.Contains(f, "no spare P") {
		t.Fatalf("planted holdNoSpare: the check said %q, want held parks with no spare P", f)
	}
	if f := heldFault(t, GroupConfig{holdSpins: true}); f == "" || !strings.Contains(f, "tries between a stream's parks") {
		t.Fatalf("planted holdSpins: the check said %q, want spins before held parks", f)
	}
}
