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
