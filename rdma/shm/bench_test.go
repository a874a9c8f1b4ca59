package shm

import (
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// benchConn returns a Conn from node 1 to a region of node 2 (both in this
// process; the op path is the same as across processes).
func benchConn(b *testing.B) rdma.Conn {
	o := newTestOptions(b)
	n1, n2 := mustOpen(b, 1, o), mustOpen(b, 2, o)
	mustRegister(b, n2, 1, 4096, 1, rdma.PermReadWrite)
	c := mustConnect(b, n1, 2)
	if err := rdma.Write(c, 1, 0, make([]byte, 8)); err != nil { // map the region
		b.Fatal(err)
	}
	return c
}

// benchOps posts b.N ops of kind, signalling every 64th and polling it.
func benchOps(b *testing.B, kind rdma.OpKind) {
	c := benchConn(b)
	buf := make([]byte, 8)
	var cs [1]rdma.Completion
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wr := rdma.WR{ID: uint64(i), Kind: kind, Region: 1, Offset: uint64(i%512) * 8, Buf: buf}
		if i%64 == 63 {
			wr.Flags = rdma.Signaled
		}
		if err := c.Post(wr); err != nil {
			b.Fatal(err)
		}
		if wr.Flags != 0 && (c.Poll(cs[:]) != 1 || cs[0].Err != nil) {
			b.Fatalf("completion %+v", cs[0])
		}
	}
}

func BenchmarkWrite8(b *testing.B) { benchOps(b, rdma.OpWrite) }

func BenchmarkRead8(b *testing.B) { benchOps(b, rdma.OpRead) }

// benchRing posts batches of 64 unsignaled 64-byte slot writes and a tail
// write with Notify (signaled every 16th batch), as a ring producer does,
// one Post per work request or one PostList per batch. b.N counts slots.
func benchRing(b *testing.B, list bool) {
	c := benchConn(b)
	const batch = 64
	slots := make([]byte, batch*64)
	tail := make([]byte, 8)
	wrs := make([]rdma.WR, batch+1)
	var cs [1]rdma.Completion
	b.ReportAllocs()
	b.SetBytes(64)
	for i := 0; i < b.N; i += batch {
		for s := range batch {
			wrs[s] = rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(8 + s*56), Buf: slots[s*64 : s*64+56]}
		}
		wrs[batch] = rdma.WR{ID: uint64(i), Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Buf: tail}
		if i/batch%16 == 15 {
			wrs[batch].Flags |= rdma.Signaled
		}
		if list {
			if n, err := c.PostList(wrs); err != nil || n != len(wrs) {
				b.Fatal(n, err)
			}
		} else if n, err := rdma.PostEach(c, wrs); err != nil || n != len(wrs) {
			b.Fatal(n, err)
		}
		if wrs[batch].Flags&rdma.Signaled != 0 && (c.Poll(cs[:]) != 1 || cs[0].Err != nil) {
			b.Fatalf("completion %+v", cs[0])
		}
	}
}

func BenchmarkRingPost(b *testing.B) { benchRing(b, false) }

func BenchmarkRingPostList(b *testing.B) { benchRing(b, true) }
