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
