package tcp

import (
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// These benchmarks run both nodes in one process; cmd/kvbench measures
// across processes.

func benchConn(b *testing.B) (rdma.Conn, rdma.Region) {
	a, t := pair(b, nil)
	r := mustRegion(b, t, 1, 1<<20, 1, rdma.PermReadWrite)
	return mustConnect(b, a, 2), r
}

// BenchmarkRead8 is the round trip of one signaled 8-byte read, waiting
// with Conn.Wait.
func BenchmarkRead8(b *testing.B) {
	c, _ := benchConn(b)
	var buf [8]byte
	var cs [4]rdma.Completion
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Post(rdma.WR{Kind: rdma.OpRead, Flags: rdma.Signaled, Region: 1, Buf: buf[:]}); err != nil {
			b.Fatal(err)
		}
		if c.Wait(cs[:], 10*time.Second) != 1 || cs[0].Err != nil {
			b.Fatalf("no completion: %v", cs[0].Err)
		}
	}
}

// BenchmarkRead8Spin is BenchmarkRead8 polling with Gosched instead of
// parking.
func BenchmarkRead8Spin(b *testing.B) {
	c, _ := benchConn(b)
	var buf [8]byte
	var cs [4]rdma.Completion
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Post(rdma.WR{Kind: rdma.OpRead, Flags: rdma.Signaled, Region: 1, Buf: buf[:]}); err != nil {
			b.Fatal(err)
		}
		for c.Poll(cs[:]) == 0 {
			runtime.Gosched()
		}
	}
}

// BenchmarkWrite64 streams unsignaled 64-byte writes, one signaled every
// 64, keeping the send queue full.
func BenchmarkWrite64(b *testing.B) {
	c, _ := benchConn(b)
	buf := make([]byte, 64)
	var cs [64]rdma.Completion
	b.ReportAllocs()
	b.SetBytes(64)
	i := 0
	for b.Loop() {
		wr := rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: uint64(i%1024) * 64, Buf: buf}
		if i%64 == 63 {
			wr.Flags = rdma.Signaled
		}
		i++
		for {
			err := c.Post(wr)
			if err == nil {
				break
			}
			if !errors.Is(err, rdma.ErrQueueFull) {
				b.Fatal(err)
			}
			c.Wait(cs[:], 10*time.Second)
		}
		c.Poll(cs[:])
	}
	for c.Outstanding() > 0 {
		c.Wait(cs[:], 10*time.Second)
	}
}

// BenchmarkRawTCPPingPong is the floor BenchmarkRead8 is compared with:
// 24-byte requests and 24-byte answers over loopback TCP.
func BenchmarkRawTCPPingPong(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var buf [24]byte
		for {
			if _, err := io.ReadFull(nc, buf[:]); err != nil {
				return
			}
			if _, err := nc.Write(buf[:]); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var buf [24]byte
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nc.Write(buf[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSteadyStateAllocs: posting every verb and waiting for its completion
// (Conn.Wait, which parks in the network poller) allocates nothing once the
// Conn is warm.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	a, b := pair(t, nil)
	mustRegion(t, b, 1, 4096, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	buf := make([]byte, 64)
	var cs [8]rdma.Completion
	wrs := []rdma.WR{
		{Kind: rdma.OpWrite, Region: 1, Offset: 64, Buf: buf},
		{Kind: rdma.OpWrite, Flags: rdma.Notify, Region: 1, Offset: 128, Buf: buf[:8]},
		{Kind: rdma.OpRead, Region: 1, Offset: 256, Buf: buf},
		{Kind: rdma.OpCompareAndSwap, Region: 1, Offset: 512, Compare: 0, Value: 1},
		{Kind: rdma.OpFetchAdd, Region: 1, Offset: 520, Value: 1},
	}
	var failed error
	run := func() {
		for _, wr := range wrs {
			wr.Flags |= rdma.Signaled
			if err := c.Post(wr); err != nil {
				failed = err
				return
			}
			if n := c.Wait(cs[:], 10*time.Second); n != 1 || cs[0].Err != nil {
				failed = errors.Join(errors.New("no completion"), cs[0].Err)
				return
			}
		}
	}
	run()
	if allocs := testing.AllocsPerRun(200, run); allocs != 0 || failed != nil {
		t.Fatalf("%v allocations per round of five verbs (error %v), want 0", allocs, failed)
	}
}
