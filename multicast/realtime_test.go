package multicast

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/mcheck"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// lockedFSM records deliveries with a checker from a real-time replica.
type lockedFSM struct {
	chk *mcheck.Checker
	g   tree.Group
	rep uint32
	n   uint64
	mu  sync.Mutex
}

func (f *lockedFSM) Apply(e broadcast.Entry) []byte {
	id := decodeTestID(e.Data)
	res := []byte(fmt.Sprintf("g%d@%d", f.g, e.Index))
	f.mu.Lock()
	f.n = e.Index
	f.mu.Unlock()
	if err := f.chk.Deliver(f.g, f.rep, 1, e.Index, checkID(id), res); err != nil {
		panic(err)
	}
	return res
}

func (f *lockedFSM) Snapshot() (broadcast.FSMSnapshot, error) {
	return broadcast.BytesSnapshot(nil), nil
}
func (f *lockedFSM) Restore([]byte) error { return nil }

func decodeTestID(b []byte) MsgID {
	le := func(b []byte) uint64 {
		var v uint64
		for i := 7; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		return v
	}
	return MsgID{Client: uint32(le(b)), Inc: le(b[8:]), Seq: le(b[16:])}
}

// TestRealTime runs 3 groups (tree 0:1,2) of 3 replicas on the mem
// fabric, each replica on its own node driven by its own goroutine, and
// two clients whose ClientRunners multicast concurrently to random
// destinations; every outcome must have one reply per destination and the
// history must pass every checker.
func TestRealTime(t *testing.T) { runRealTime(t, false) }

// TestSharedNodes is TestRealTime with the three groups' replicas on
// three nodes, one replica of each group per node, polled by one
// poller.Group (the embedded cluster's layout), and one client on a replica's node: groups write to
// each other's regions on the same node.
func TestSharedNodes(t *testing.T) { runRealTime(t, true) }

func runRealTime(t *testing.T, shared bool) { runRealTimeOn(t, "mem", shared) }

// TestRealTimeTCP is TestRealTime on the tcp fabric (every node its own
// software RNIC on a loopback port, authenticated with a cluster secret):
// TRAM runs on the fabric that crosses hosts.
func TestRealTimeTCP(t *testing.T) { runRealTimeOn(t, "tcp", false) }

func runRealTimeOn(t *testing.T, fabric string, shared bool) {
	tr, err := tree.Parse("0:1,2")
	if err != nil {
		t.Fatal(err)
	}
	members := [][]rdma.NodeID{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
	cnodes := []rdma.NodeID{100, 101}
	if shared {
		members = [][]rdma.NodeID{{1, 2, 3}, {1, 2, 3}, {1, 2, 3}}
		cnodes = []rdma.NodeID{1, 101}
	}
	chk := mcheck.New(3)
	c := startCluster(t, clusterSpec{fabric: fabric, tree: tr, members: members, cnodes: cnodes,
		bcast: broadcast.Config{RingSize: 64 << 10},
		app:   func(g tree.Group, i int) broadcast.FSM { return &lockedFSM{chk: chk, g: g, rep: uint32(i)} }})
	reps := c.reps
	ctx := c.ctx
	var runners []*Client
	for k, id := range cnodes {
		runners = append(runners, c.client(t, uint32(k), id))
	}
	const perClient = 200
	// Every wait below is bounded for a hang, not for speed (hangBound):
	// CI under -race at load 35 on tcp once needed more than 10 s for a
	// multicast.
	deadline := time.Now().Add(hangBound(t))
	var cwg sync.WaitGroup
	errs := make(chan error, len(runners)*4*perClient)
	for k, cr := range runners {
		for w := range 4 { // 4 goroutines share each client's window
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				for i := range perClient / 4 {
					dst := tree.Set(1+(i*7+w*3+k)%7) & tr.All()
					mctx, mcancel := context.WithDeadline(ctx, deadline)
					o, err := cr.DoID(mctx, dst, func(id MsgID) []byte {
						if err := chk.Multicast(checkID(id), uint64(dst)); err != nil {
							errs <- err
						}
						return msgPayload(id, 40)
					})
					mcancel()
					if err != nil {
						errs <- fmt.Errorf("client %d: %v", k, err)
						return
					}
					if len(o.Replies) != dst.Len() {
						errs <- fmt.Errorf("client %d: %d replies for %v", k, len(o.Replies), dst)
						return
					}
					for _, rp := range o.Replies {
						if err := chk.Reply(checkID(o.ID), rp.Group, rp.Index, rp.Result); err != nil {
							errs <- err
						}
					}
				}
			}()
		}
	}
	cwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// let followers apply, then check everything
	want := chk.Stats().GroupLen
	for _, r := range reps {
		for {
			fsm := r.st.app.(*lockedFSM)
			fsm.mu.Lock()
			n := fsm.n
			fsm.mu.Unlock()
			if n >= want[r.g] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a replica of group %d applied up to index %d of the %d its group delivered, and no further before the test's deadline", r.g, n, want[r.g])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	live := map[uint32][]uint32{0: {0, 1, 2}, 1: {0, 1, 2}, 2: {0, 1, 2}}
	if err := chk.Final(mcheck.FinalOptions{Live: live}); err != nil {
		t.Fatal(err)
	}
	st := chk.Stats()
	t.Logf("%s: %d messages, %d deliveries, %d replies, group lengths %v", fabric, st.Messages, st.Deliveries, st.Replies, st.GroupLen)
	if st.Messages != len(runners)*perClient {
		t.Fatalf("%d messages recorded, want %d", st.Messages, len(runners)*perClient)
	}
}

// TestUnknownClientRefused: a client on a node the cluster does not list
// in ClientNodes is refused by every replica (no write access), and
// StartClient says so instead of hanging.
func TestUnknownClientRefused(t *testing.T) {
	tr, err := tree.Parse("0:")
	if err != nil {
		t.Fatal(err)
	}
	members := [][]rdma.NodeID{{1, 2, 3}}
	c := startCluster(t, clusterSpec{tree: tr, members: members, cnodes: []rdma.NodeID{100}, extra: []rdma.NodeID{200}})
	sctx, scancel := context.WithTimeout(c.ctx, 300*time.Millisecond)
	defer scancel()
	_, err = StartClient(sctx, ClientConfig{Slot: 0, Inc: 1, Tree: tr, Members: members}, c.nodes[200])
	if err == nil || !strings.Contains(err.Error(), "permission") || !strings.Contains(err.Error(), "did not register") {
		t.Fatalf("StartClient on an unlisted node: %v, want a refusal naming the permission error", err)
	}
	t.Log(err)
}

// TestSlotTooLargeForGroup: a slot that does not fit one Acuerdo proposal
// is refused at New, naming both sizes.
func TestSlotTooLargeForGroup(t *testing.T) {
	tr, _ := tree.Parse("0:")
	node, err := mem.New(mem.Options{}).NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1}}, SlotSize: 64 << 10,
		Broadcast: broadcast.Config{Self: 1, Start: broadcast.StartNew, RingSize: 64 << 10}}, node, nopFSM{}, &broadcast.MemStable{})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "largest proposal") {
		t.Fatalf("New with 64 KiB slots in a 64 KiB ring: %v", err)
	}
}
