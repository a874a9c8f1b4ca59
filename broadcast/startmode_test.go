package broadcast

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// TestStartModes: a replica whose stable state is missing, unreadable or
// corrupt does not come back as a full voter: with the default start mode
// New refuses, with a message that says what to do; StartNew starts a
// member of a new group; StartRejoin starts a catching-up member with the
// incarnation it is given (and overwrites a corrupt file).
func TestStartModes(t *testing.T) {
	f := mem.New(mem.Options{})
	id := rdma.NodeID(1)
	start := func(mode StartMode, st Stable, inc uint64) (*Replica, error) {
		n, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		id++
		r, err := New(Config{Self: n.ID(), Members: []rdma.NodeID{n.ID(), 100, 101}, Start: mode, RejoinIncarnation: inc}, n, &logFSM{}, st)
		if err != nil {
			n.Close()
			return nil, err
		}
		t.Cleanup(func() { r.Close(); n.Close() })
		return r, nil
	}
	dir := t.TempDir()
	missing := FileStable{Path: filepath.Join(dir, "missing")}
	corrupt := FileStable{Path: filepath.Join(dir, "corrupt")}
	if err := os.WriteFile(corrupt.Path, []byte("not a stable file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreadable := FileStable{Path: dir} // a directory: reading it fails

	if _, err := start(StartExisting, missing, 0); !errors.Is(err, ErrNoStableState) || !strings.Contains(err.Error(), "StartRejoin") {
		t.Errorf("missing state, default mode: %v, want ErrNoStableState naming StartRejoin", err)
	}
	if _, err := start(StartExisting, corrupt, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("corrupt state, default mode: %v, want ErrCorrupt", err)
	}
	if _, err := start(StartExisting, unreadable, 0); err == nil {
		t.Errorf("unreadable state, default mode: started")
	}
	if _, err := start(StartRejoin, missing, 0); !errors.Is(err, ErrConfig) {
		t.Errorf("rejoin without an incarnation: %v, want ErrConfig", err)
	}
	r, err := start(StartNew, missing, 0)
	if err != nil {
		t.Fatalf("new member: %v", err)
	}
	if s := r.Status(); s.Incarnation != 1 || s.CatchingUp {
		t.Errorf("new member: %+v, want incarnation 1, a full voter", s)
	}
	r, err = start(StartRejoin, corrupt, 1<<40)
	if err != nil {
		t.Fatalf("rejoin over a corrupt file: %v", err)
	}
	if s := r.Status(); s.Incarnation != 1<<40 || !s.CatchingUp {
		t.Errorf("rejoining member: %+v, want incarnation 2^40, catching up", s)
	}
	if st, err := corrupt.Load(); err != nil || st.Incarnation != 1<<40 {
		t.Errorf("the corrupt file after a rejoin: %+v, %v; want incarnation 2^40 saved", st, err)
	}
	// With stable state every mode restarts as usual.
	saved := &MemStable{}
	saved.Save(StableState{Incarnation: 3, ENew: MakeEpoch(2, 7)})
	if r, err = start(StartExisting, saved, 0); err != nil {
		t.Fatal(err)
	} else if s := r.Status(); s.Incarnation != 4 || s.ENew != MakeEpoch(2, 7) || !s.CatchingUp {
		t.Errorf("restart: %+v, want incarnation 4, e_new (2,7), catching up", s)
	}
}

// TestRejoinLostDisk: a member that lost its stable state (and memory)
// rejoins with StartRejoin. It learns E_new from the other two members'
// rows before anything else, never votes or counts as accepting before a
// diff caught it up, and then delivers the group's sequence; meanwhile the
// other two commit without it.
func TestRejoinLostDisk(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) { cfg.ElectionTimeout = 5 * time.Millisecond })
	n1 := c.get(1)
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	// Two more elections (the leader gives up, the others time out on
	// it), so the epoch is not the first one.
	leader := n1
	for k := 0; k < 2; k++ {
		e := leader.r.Status().ECur
		leader.r.startElection(true)
		for i := 0; i < 200 && !c.newLeader(e); i++ {
			c.settle(nil)
		}
		if !c.newLeader(e) {
			t.Fatalf("election %d: no leader after %v", k, e)
		}
		for _, n := range c.nodes {
			if n.r.Status().Role == Leader {
				leader = n
			}
		}
	}
	n1 = leader
	epoch := n1.r.Status().ECur
	var want []string
	for i := 0; i < 5; i++ {
		want = append(want, fmt.Sprintf("m%d", i))
		n1.r.Propose([]byte(want[i]))
	}
	c.settle(nil)
	// A follower loses its memory and its disk.
	lost := c.nodes[0]
	for lost == n1 {
		lost = c.nodes[int(lost.id)%3]
	}
	n3 := lost
	c.crash(n3.id, 0)
	n3.stable = &MemStable{}
	cfg := c.cfg
	c.cfg.Start, c.cfg.RejoinIncarnation = StartRejoin, 1<<32
	c.boot(n3)
	c.cfg = cfg
	if s := n3.r.Status(); s.ENew != 0 || !s.CatchingUp || s.Incarnation != 1<<32 {
		t.Fatalf("rejoined: %+v, want e_new unknown (0), catching up, incarnation 2^32", s)
	}
	for i := 5; i < 10; i++ {
		want = append(want, fmt.Sprintf("m%d", i))
		n1.r.Propose([]byte(want[i]))
	}
	for i := 0; i < 10; i++ {
		c.settle(nil)
	}
	s := n3.r.Status()
	if s.ENew != epoch || s.CatchingUp || s.Vote.ENew != epoch || s.Counters.ElectionsStarted != 0 {
		t.Fatalf("rejoined member: %+v, want e_new %v learnt, caught up, no election\n%s", s, epoch, c.takeTrace())
	}
	if st, _ := n3.stable.Load(); st.ENew != epoch {
		t.Errorf("the rejoined member saved e_new %v, want %v", st.ENew, epoch)
	}
	for _, id := range []rdma.NodeID{1, 2, 3} {
		// Node n3 restored a snapshot of the epochs before it rejoined
		// (its memory was empty): the same sequence.
		if got := c.delivered(id); !equalStrings(got, want) {
			t.Errorf("node %d delivered %q, want %q", id, got, want)
		}
	}
	if !strings.Contains(c.takeTrace(), fmt.Sprintf("node %d rejoins: e_new %v from 2 members' rows", n3.id, epoch)) {
		t.Errorf("no rejoin line in the trace")
	}
}
