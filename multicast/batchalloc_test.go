package multicast

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// TestBatchAllocs: a leader that finds a client's whole window in its ring
// orders it in batch entries (a client's whole window a scan,
// filled in place in the broadcast slab),
// commits and applies it, and writes the replies, without allocating: the
// batch, its child positions and the records' copies are reused scratch,
// and the entry is carved from a reused slab. One group of one replica,
// polled on this goroutine in virtual time; the client is played by
// writing its ring and header directly.
func TestBatchAllocs(t *testing.T) {
	f := mem.New(mem.Options{})
	n1, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	cn, err := f.NewNode(100)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	tr, _ := tree.Parse("0:")
	cfg := Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1}}, ClientNodes: []rdma.NodeID{100},
		Broadcast: broadcast.Config{Self: 1, Start: broadcast.StartNew, PersistInline: true}}
	r, err := New(cfg, n1, staticFSM{}, &broadcast.MemStable{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := r.cfg.ClientSlots
	const replyReg = 7
	reg, err := cn.Register(replyReg, w*replySlot(r.cfg.MaxResult)+8)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if err := reg.Grant(1, rdma.PermWrite); err != nil {
		t.Fatal(err)
	}
	now := time.Duration(0)
	poll := func(until func() bool) {
		for range 100000 {
			if until() {
				return
			}
			now += 10 * time.Microsecond
			r.Poll(now)
		}
		t.Fatalf("no progress (delivered %d, counters %+v)", r.Delivered(), r.ctr)
	}
	poll(func() bool { return r.lead != 0 })
	// Register client slot 0, incarnation 1.
	hdr := r.regs[regClients].Bytes()
	rdma.Store64(hdr, hAddr, Addr{Node: 100, Region: replyReg}.word())
	rdma.Store64(hdr, hInc, 1)
	poll(func() bool { return r.st.cinc[0] == 1 })
	ring := r.regs[regRings].Bytes()
	payload := make([]byte, 100)
	seq := uint64(0)
	window := func() {
		for range w {
			seq++
			rec := record{pos: seq, id: MsgID{Client: 0, Inc: 1, Seq: seq}, dst: tree.Of(0), reply: Addr{Node: 100, Region: replyReg}, payload: payload}
			off := int(seq%uint64(w)) * r.cfg.SlotSize
			encodeRecord(ring[off:off+r.cfg.SlotSize], &rec)
		}
		want := seq
		poll(func() bool { return r.Delivered() == want && len(r.replyQ) == 0 })
	}
	for range 50 { // warm up: slabs, the Log's ring, Conn staging
		window()
	}
	batches, ordered := r.ctr.Batches, r.ctr.Ordered
	allocs := testing.AllocsPerRun(200, window)
	nb, no := r.ctr.Batches-batches, r.ctr.Ordered-ordered
	// A scan takes a client's whole window (at most ClientSlots).
	if per := uint64(min(w, r.cfg.ClientSlots)); no != nb*per || nb == 0 {
		t.Fatalf("%d messages in %d entries, want batch entries of %d", no, nb, per)
	}
	if allocs > 0 {
		t.Fatalf("a window of %d messages, ordered in batches, committed, applied and answered, allocates %.2f times", w, allocs)
	}
}

// staticFSM is nopFSM with a result that is not allocated per Apply.
type staticFSM struct{ nopFSM }

var staticResult = []byte("r")

func (staticFSM) Apply(broadcast.Entry) []byte { return staticResult }
