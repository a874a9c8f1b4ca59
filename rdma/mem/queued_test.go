package mem_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// queuedPair returns node 1 connected to node 2, whose region 1 (4096
// bytes) node 1 may read and write.
func queuedPair(t *testing.T, opts mem.Options) (a, b *mem.Node, c *mem.Conn, r rdma.Region) {
	t.Helper()
	opts.Queued = true
	f := mem.New(opts)
	a, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	b, err = f.NewNode(2)
	if err != nil {
		t.Fatal(err)
	}
	r, err = b.Register(1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Grant(1, rdma.PermReadWrite); err != nil {
		t.Fatal(err)
	}
	c, err = a.Dial(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, c, r
}

func write(t *testing.T, c *mem.Conn, off, v uint64, flags rdma.Flags) {
	t.Helper()
	buf := binary.LittleEndian.AppendUint64(nil, v)
	if err := c.Post(rdma.WR{ID: v, Kind: rdma.OpWrite, Flags: flags, Region: 1, Offset: off, Buf: buf}); err != nil {
		t.Fatal(err)
	}
}

func TestQueuedOpsLandThenComplete(t *testing.T) {
	posted := 0
	_, _, c, r := queuedPair(t, mem.Options{OnPost: func(*mem.Conn) { posted++ }})
	for v := uint64(1); v <= 3; v++ {
		write(t, c, 0, v, rdma.Signaled)
	}
	var cs [4]rdma.Completion
	if posted != 3 || c.Pending() != 3 || c.Outstanding() != 3 || rdma.Load64(r.Bytes(), 0) != 0 {
		t.Fatalf("after posting: OnPost ran %d times, pending %d, outstanding %d, word %d", posted, c.Pending(), c.Outstanding(), rdma.Load64(r.Bytes(), 0))
	}
	wr, cp, ok := c.Land()
	if !ok || wr.ID != 1 || cp.Err != nil || rdma.Load64(r.Bytes(), 0) != 1 {
		t.Fatalf("Land: %v %+v %v, word %d; want op 1 visible", ok, cp, wr.ID, rdma.Load64(r.Bytes(), 0))
	}
	if c.Poll(cs[:]) != 0 || c.Outstanding() != 3 || c.Landed() != 1 {
		t.Fatal("a landed op completed before Complete")
	}
	if cp, pushed, ok := c.Complete(); !ok || !pushed || cp.ID != 1 {
		t.Fatalf("Complete: %+v pushed=%v ok=%v", cp, pushed, ok)
	}
	if n := c.Poll(cs[:]); n != 1 || cs[0].ID != 1 || c.Outstanding() != 2 {
		t.Fatalf("polled %d (%+v), outstanding %d", n, cs[0], c.Outstanding())
	}
	for c.Deliver() {
	}
	if n := c.Poll(cs[:]); n != 2 || cs[0].ID != 2 || cs[1].ID != 3 || rdma.Load64(r.Bytes(), 0) != 3 {
		t.Fatalf("after Deliver: %d completions %+v, word %d", n, cs[:n], rdma.Load64(r.Bytes(), 0))
	}
}

// TestQueuedFIFOAcrossManyOps interleaves posts and landings well past the
// queue's initial capacity: every landing shows exactly the next value.
func TestQueuedFIFOAcrossManyOps(t *testing.T) {
	_, _, c, r := queuedPair(t, mem.Options{})
	next, landed := uint64(1), uint64(0)
	for round := range 20 {
		for range 7 + round%5 {
			write(t, c, 8, next, 0)
			next++
		}
		for range 5 + round%3 {
			if _, _, ok := c.Land(); !ok {
				break
			}
			landed++
			if w := rdma.Load64(r.Bytes(), 8); w != landed {
				t.Fatalf("landing #%d shows %d: not FIFO", landed, w)
			}
			c.Complete()
		}
	}
	if c.Outstanding() != int(next-1-landed) {
		t.Fatalf("outstanding %d, want %d", c.Outstanding(), next-1-landed)
	}
}

func TestQueuedErrorBreaksConnAndFlushes(t *testing.T) {
	_, _, c, r := queuedPair(t, mem.Options{})
	write(t, c, 0, 1, 0)
	write(t, c, 8192, 2, 0) // out of bounds
	write(t, c, 16, 3, rdma.Signaled)
	write(t, c, 24, 4, 0)
	c.Land()
	if _, cp, _ := c.Land(); !errors.Is(cp.Err, rdma.ErrBounds) {
		t.Fatalf("out-of-bounds op landed with %v", cp.Err)
	}
	if _, cp, _ := c.Land(); !errors.Is(cp.Err, rdma.ErrConnBroken) || rdma.Load64(r.Bytes(), 16) != 0 {
		t.Fatalf("op after a failed one: %v, word %d; want flushed without effect", cp.Err, rdma.Load64(r.Bytes(), 16))
	}
	for {
		if _, _, ok := c.Complete(); !ok {
			break
		}
	}
	var cs [8]rdma.Completion
	n := c.Poll(cs[:])
	if n != 3 || !errors.Is(cs[0].Err, rdma.ErrBounds) || !errors.Is(cs[1].Err, rdma.ErrConnBroken) || !errors.Is(cs[2].Err, rdma.ErrConnBroken) {
		t.Fatalf("completions %+v: want the bounds error, then two flushed ops", cs[:n])
	}
	if c.Outstanding() != 0 || !errors.Is(c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: make([]byte, 8)}), rdma.ErrConnBroken) {
		t.Fatal("the Conn is not broken or still holds ops")
	}
	if rdma.Load64(r.Bytes(), 24) != 0 {
		t.Fatal("an op queued after the failure landed")
	}
}

func TestQueuedDropAndFailPending(t *testing.T) {
	_, _, c, r := queuedPair(t, mem.Options{})
	for v := uint64(1); v <= 5; v++ {
		write(t, c, 8*v, v, 0)
	}
	c.Land()
	c.DropPending(2) // ops 2 and 3 stay, 4 and 5 are gone
	if c.Pending() != 2 || c.Landed() != 1 {
		t.Fatalf("pending %d landed %d after DropPending(2)", c.Pending(), c.Landed())
	}
	c.Land()
	c.FailPending(rdma.ErrPeerDead)
	var cs [8]rdma.Completion
	n := c.Poll(cs[:])
	if n != 3 {
		t.Fatalf("%d completions, want ops 1-3 failed", n)
	}
	for _, cp := range cs[:n] {
		if !errors.Is(cp.Err, rdma.ErrPeerDead) {
			t.Fatalf("completion %+v: want ErrPeerDead", cp)
		}
	}
	for v := 1; v <= 5; v++ {
		want := uint64(0)
		if v <= 2 {
			want = uint64(v) // landed before the failure: the effect stays
		}
		if w := rdma.Load64(r.Bytes(), 8*v); w != want {
			t.Fatalf("word %d = %d, want %d", v, w, want)
		}
	}
}

func TestQueuedLandPrefixShowsATornWrite(t *testing.T) {
	_, _, c, r := queuedPair(t, mem.Options{})
	buf := make([]byte, 64)
	for i := range 8 {
		binary.LittleEndian.PutUint64(buf[8*i:], 7)
	}
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: buf}); err != nil {
		t.Fatal(err)
	}
	if !c.LandPrefix(28) { // rounds down to 24
		t.Fatal("LandPrefix applied nothing")
	}
	for i := range 8 {
		want := uint64(0)
		if i < 3 {
			want = 7
		}
		if w := rdma.Load64(r.Bytes(), 8*i); w != want {
			t.Fatalf("torn write: word %d = %d, want %d", i, w, want)
		}
	}
	if c.Pending() != 1 {
		t.Fatal("LandPrefix dequeued the op")
	}
	c.Land()
	for i := range 8 {
		if w := rdma.Load64(r.Bytes(), 8*i); w != 7 {
			t.Fatalf("after Land word %d = %d", i, w)
		}
	}
}

func TestCrashedInitiatorsOpsStillLand(t *testing.T) {
	a, b, c, r := queuedPair(t, mem.Options{})
	src, err := a.Register(9, 64) // the write's source is a's own region
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(src.Bytes(), 42)
	back, err := b.Dial(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: src.Bytes()[:8]}); err != nil {
		t.Fatal(err)
	}
	a.Crash()
	if !a.Closed() {
		t.Fatal("crashed node is not closed")
	}
	if _, cp, ok := c.Land(); !ok || cp.Err != nil || rdma.Load64(r.Bytes(), 0) != 42 {
		t.Fatalf("the crashed node's queued op did not land: %v %+v", ok, cp)
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	// The other way: ops targeting a crashed node fail with ErrPeerDead.
	write(t, back, 0, 1, 0)
	if _, cp, _ := back.Land(); !errors.Is(cp.Err, rdma.ErrPeerDead) {
		t.Fatalf("op to a crashed node: %v, want ErrPeerDead", cp.Err)
	}
}

// TestQueuedUnpolledCompletionsBoundPosting: completions nobody polled
// count against the queue depth, so Post says ErrQueueFull rather than a
// completion (an error's included) being dropped on the floor.
func TestQueuedUnpolledCompletionsBoundPosting(t *testing.T) {
	_, _, c, r := queuedPair(t, mem.Options{QueueDepth: 4})
	accepted := 0
	for round := 0; round < 3; round++ {
		for i := 0; i < 4; i++ {
			err := c.Post(rdma.WR{ID: uint64(accepted + 1), Kind: rdma.OpFetchAdd, Flags: rdma.Signaled, Region: 1, Offset: 0, Value: 1})
			if errors.Is(err, rdma.ErrQueueFull) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			accepted++
		}
		for c.Deliver() {
		}
	}
	var cs [16]rdma.Completion
	n := c.Poll(cs[:])
	if word := rdma.Load64(r.Bytes(), 0); n != accepted || word != uint64(accepted) {
		t.Fatalf("accepted %d posts, the word shows %d, but %d completions came back", accepted, word, n)
	}
	if accepted != 4 {
		t.Fatalf("accepted %d posts with depth 4 and nothing polled, want 4", accepted)
	}
}
