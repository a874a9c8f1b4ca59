package rdma_test

import (
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// TestLinkSmallSendQueue: on a fabric whose send queue is smaller than the
// Link's window, a Flush the queue cuts short keeps the rest queued, in
// order, and a later Flush posts it: the link does not fail, and the
// Notify goes once, on the last op.
func TestLinkSmallSendQueue(t *testing.T) {
	f := mem.New(mem.Options{QueueDepth: 4})
	owner, err := f.NewNode(1)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := f.NewNode(2)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	defer peer.Close()
	reg, err := owner.Register(1, 128)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Grant(2, rdma.PermReadWrite); err != nil {
		t.Fatal(err)
	}
	l := rdma.NewLink(rdma.LinkConfig{Node: peer, Peer: 1, StageBytes: 1024})
	defer l.Close()
	now := time.Duration(0)
	if !l.Up(now) {
		t.Fatalf("not up: %v", l.Err())
	}
	rings := owner.Doorbell().Seq()
	// Reads are always signaled: each holds a completion until reaped.
	for i := range 10 {
		b := l.Stage(8)
		if _, ok := l.Queue(rdma.WR{Kind: rdma.OpRead, Region: 1, Offset: uint64(8 * i), Buf: b}, false); !ok {
			t.Fatalf("Queue %d refused", i)
		}
	}
	b := l.Stage(8)
	b[0] = 42
	last, _ := l.Queue(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Offset: 120, Buf: b}, true)
	for range 10 {
		l.Flush(now)
		l.Reap(now)
		if !l.IsUp() {
			t.Fatalf("a full send queue failed the link: %v", l.Err())
		}
		if l.Queued() == 0 {
			break
		}
	}
	l.Reap(now)
	st := l.Stats()
	if l.Queued() != 0 || st.Posted != 11 || st.QueueFull == 0 || l.Completed() <= last {
		t.Fatalf("queued %d, completed %d, stats %+v: want all 11 posted and completed after cut-short Flushes", l.Queued(), l.Completed(), st)
	}
	if st.Notifies != 1 || owner.Doorbell().Seq() == rings || reg.Bytes()[120] != 42 {
		t.Fatalf("%d Notifies, doorbell rung %v, byte %d: want the last write to land with one Notify", st.Notifies, owner.Doorbell().Seq() != rings, reg.Bytes()[120])
	}
}
