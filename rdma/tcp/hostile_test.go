package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestHostileFrames feeds the RNIC raw bytes over TCP: frames before or
// without authentication, garbage, truncated, oversized, unknown-type and
// malformed frames. Each must close the connection and leave the region
// untouched; valid frames before the bad one are applied.
func TestHostileFrames(t *testing.T) {
	b := openT(t, 2, func(o *Options) { o.MaxFrame = 4096 })
	r := mustRegion(t, b, 1, 4096, 1, rdma.PermReadWrite)
	payload := bytes.Repeat([]byte{0xAB}, 64)
	write := func(off uint64) []byte {
		return appendWriteReq(nil, &writeReq{Region: 1, Offset: off, Data: payload})
	}
	hdr := func(ver, typ byte, n uint32) []byte {
		return le.AppendUint32([]byte{ver, typ, 0, 0}, n)
	}
	badFlags := write(0)
	badFlags[headerLen] = 0x80
	badReserved := write(0)
	badReserved[2] = 1
	cases := []struct {
		name      string
		handshake bool
		secret    []byte
		send      []byte
	}{
		{"write before the handshake", false, nil, write(0)},
		{"write after a failed handshake", true, []byte("not-the-cluster-secret"), write(0)},
		{"garbage", true, nil, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"oversized frame", true, nil, append(hdr(wireVersion, typeWrite, 4096), write(0)...)},
		{"length near 2^32", true, nil, append(hdr(wireVersion, typeWrite, ^uint32(0)), write(0)...)},
		{"unknown type", true, nil, append(hdr(wireVersion, 42, 80), write(0)[headerLen:]...)},
		{"wrong frame version", true, nil, append(hdr(wireVersion+1, typeWrite, 80), write(0)[headerLen:]...)},
		{"nonzero reserved header bytes", true, nil, badReserved},
		{"unknown write flags", true, nil, badFlags},
		{"write without data", true, nil, append(hdr(wireVersion, typeWrite, writeFixed), write(0)[headerLen:headerLen+writeFixed]...)},
		{"truncated write", true, nil, write(0)[:headerLen+writeFixed+20]},
		{"truncated header", true, nil, write(0)[:5]},
		{"response type sent to the RNIC", true, nil, appendWord(nil, typeAck, 1)},
		{"read of zero bytes", true, nil, appendReadReq(nil, &readReq{Region: 1, Len: 0})},
		{"cas with a short body", true, nil, append(hdr(wireVersion, typeCAS, 24), make([]byte, 24)...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", b.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(10 * time.Second))
			if tc.handshake {
				secret := testSecret
				if tc.secret != nil {
					secret = tc.secret
				}
				err := dialHandshake(nc, 1, 2, b.Addr(), secret)
				if tc.secret != nil && !errors.Is(err, ErrAuth) {
					t.Fatalf("handshake with a wrong secret = %v, want ErrAuth", err)
				} else if tc.secret == nil && err != nil {
					t.Fatalf("handshake: %v", err)
				}
			}
			nc.Write(tc.send)
			if tc.name == "truncated write" || tc.name == "truncated header" {
				nc.(*net.TCPConn).CloseWrite()
			}
			expectClosed(t, nc)
			if !bytes.Equal(r.Bytes(), make([]byte, 4096)) {
				t.Fatal("region modified")
			}
		})
	}
	t.Run("valid frames before a bad one land", func(t *testing.T) {
		nc, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := dialHandshake(nc, 1, 2, b.Addr(), testSecret); err != nil {
			t.Fatal(err)
		}
		frames := append(write(1024), append(hdr(wireVersion, 42, 80), write(0)[headerLen:]...)...)
		nc.Write(frames)
		expectClosed(t, nc)
		if !bytes.Equal(r.Bytes()[1024:1024+64], payload) {
			t.Fatal("the valid write before the bad frame did not land")
		}
		if !bytes.Equal(r.Bytes()[:1024], make([]byte, 1024)) || !bytes.Equal(r.Bytes()[1024+64:], make([]byte, 4096-1024-64)) {
			t.Fatal("the bad frame touched the region")
		}
	})
}

// expectClosed reads until the peer closes the connection; anything it
// sends first must be well-formed (an ack of applied ops at most).
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_, err := io.Copy(io.Discard, nc)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the RNIC kept the connection open")
	}
}
