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
	"github.com/rdmakv/rdmakv/rdma/tcp"
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

// pollLoop drives p in real time on db until ctx ends.
func pollLoop(ctx context.Context, p interface {
	Poll(time.Duration) bool
	NextDeadline() time.Duration
}, db rdma.Doorbell) {
	start := time.Now()
	stop := context.AfterFunc(ctx, db.Ring)
	defer stop()
	for ctx.Err() == nil {
		seq := db.Seq()
		now := time.Since(start)
		if p.Poll(now) {
			continue
		}
		if w := min(p.NextDeadline()-now, time.Millisecond); w > 0 {
			db.Wait(seq, w)
		}
	}
}

// TestRealTime runs 3 groups (tree 0:1,2) of 3 replicas on the mem
// fabric, each replica on its own node driven by its own goroutine, and
// two clients whose ClientRunners multicast concurrently to random
// destinations; every outcome must have one reply per destination and the
// history must pass every checker.
func TestRealTime(t *testing.T) { runRealTime(t, false) }

// TestSharedNodes is TestRealTime with the three groups' replicas on
// three nodes, one replica of each group per node, polled by one
// broadcast.MultiDriver per node on the node's one doorbell (the embedded
// cluster's layout), and one client on a replica's node: groups write to
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
	nodes := map[rdma.NodeID]rdma.Node{}
	var ids []rdma.NodeID
	for _, ms := range members {
		ids = append(ids, ms...)
	}
	ids = append(ids, cnodes...)
	memf := mem.New(mem.Options{})
	secret := []byte("multicast realtime test cluster secret, 32+ bytes")
	for _, id := range ids {
		if nodes[id] != nil {
			continue
		}
		var n rdma.Node
		var err error
		switch fabric {
		case "mem":
			n, err = memf.NewNode(id)
		case "tcp":
			n, err = tcp.Open(id, tcp.Options{Listen: "127.0.0.1:0", Secret: secret})
		}
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
	}
	if fabric == "tcp" {
		for _, a := range nodes {
			for id, b := range nodes {
				a.(*tcp.Node).SetPeer(id, b.(*tcp.Node).Addr())
			}
		}
		defer func() {
			for _, n := range nodes {
				n.Close()
			}
		}()
	}
	node := func(id rdma.NodeID) rdma.Node { return nodes[id] }
	perNode := map[rdma.NodeID][]broadcast.Poller{}
	chk := mcheck.New(3)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reps []*Replica
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range reps {
			r.Close()
		}
	}()
	for g, ms := range members {
		for i, id := range ms {
			node := node(id)
			cfg := Config{Group: tree.Group(g), Tree: tr, Members: members, ClientNodes: cnodes,
				Broadcast: broadcast.Config{Self: id, Start: broadcast.StartNew, RingSize: 64 << 10}}
			r, err := New(cfg, node, &lockedFSM{chk: chk, g: tree.Group(g), rep: uint32(i)}, &broadcast.MemStable{})
			if err != nil {
				t.Fatal(err)
			}
			reps = append(reps, r)
			perNode[id] = append(perNode[id], r)
		}
	}
	for id, ps := range perNode {
		db := nodes[id].Doorbell()
		wg.Add(1)
		if shared {
			d := broadcast.NewMultiDriver(db, ps...)
			go func() { defer wg.Done(); d.Run(ctx) }()
		} else {
			go func() { defer wg.Done(); pollLoop(ctx, ps[0], db) }()
		}
	}
	var runners []*ClientRunner
	for k, id := range cnodes {
		node := node(id)
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		cr, err := StartClient(sctx, ClientConfig{Slot: uint32(k), Inc: uint64(time.Now().UnixNano()), Tree: tr, Members: members}, node)
		scancel()
		if err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
		defer cr.Close()
		runners = append(runners, cr)
	}
	const perClient = 200
	var cwg sync.WaitGroup
	errs := make(chan error, len(runners)*4*perClient)
	for k, cr := range runners {
		for w := range 4 { // 4 goroutines share each client's window
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				for i := range perClient / 4 {
					dst := tree.Set(1+(i*7+w*3+k)%7) & tr.All()
					mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
					o, err := cr.MulticastID(mctx, dst, func(id MsgID) []byte {
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
	deadline := time.Now().Add(5 * time.Second)
	for _, r := range reps {
		for {
			fsm := r.st.app.(*lockedFSM)
			fsm.mu.Lock()
			n := fsm.n
			fsm.mu.Unlock()
			if n >= want[r.g] || time.Now().After(deadline) {
				break
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
	f := mem.New(mem.Options{})
	members := [][]rdma.NodeID{{1, 2, 3}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reps []*Replica
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range reps {
			r.Close()
		}
	}()
	for _, id := range members[0] {
		node, err := f.NewNode(id)
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{Group: 0, Tree: tr, Members: members, ClientNodes: []rdma.NodeID{100},
			Broadcast: broadcast.Config{Self: id, Start: broadcast.StartNew}}, node, nopFSM{}, &broadcast.MemStable{})
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
		wg.Add(1)
		go func() { defer wg.Done(); pollLoop(ctx, r, node.Doorbell()) }()
	}
	node, err := f.NewNode(200)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	_, err = StartClient(sctx, ClientConfig{Slot: 0, Inc: 1, Tree: tr, Members: members}, node)
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
