package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

var testSecret = []byte("0123456789abcdef-tcp-test-secret")

func openT(t testing.TB, id rdma.NodeID, mod func(*Options)) *Node {
	t.Helper()
	o := Options{Listen: "127.0.0.1:0", Secret: testSecret}
	if mod != nil {
		mod(&o)
	}
	n, err := Open(id, o)
	if err != nil {
		t.Fatalf("Open(%d): %v", id, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// pair returns an initiator node 1 and a target node 2 that know each other.
func pair(t testing.TB, mod func(*Options)) (a, b *Node) {
	a, b = openT(t, 1, mod), openT(t, 2, mod)
	a.SetPeer(2, b.Addr())
	b.SetPeer(1, a.Addr())
	return a, b
}

func mustRegion(t testing.TB, n *Node, id rdma.RegionID, size int, peer rdma.NodeID, p rdma.Perm) rdma.Region {
	t.Helper()
	r, err := n.Register(id, size)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := r.Grant(peer, p); err != nil {
		t.Fatalf("Grant: %v", err)
	}
	return r
}

func mustConnect(t testing.TB, a *Node, peer rdma.NodeID) rdma.Conn {
	t.Helper()
	c, err := a.Connect(peer)
	if err != nil {
		t.Fatalf("Connect(%d): %v", peer, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestVerbsRoundTrip(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 7, 4<<20, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)

	// Small and large (beyond the 64 KiB I/O buffers, up to the 1 MiB frame
	// limit) writes read back identically.
	for _, size := range []int{1, 8, 13, 4096, 100 << 10, 1 << 20} {
		src := make([]byte, size)
		for i := range src {
			src[i] = byte(i*31 + size)
		}
		off := uint64(size % 64)
		if err := rdma.Write(c, 7, off, src); err != nil {
			t.Fatalf("write %d bytes: %v", size, err)
		}
		if !bytes.Equal(r.Bytes()[off:off+uint64(size)], src) {
			t.Fatalf("write of %d bytes: region differs", size)
		}
		dst := make([]byte, size)
		if err := rdma.Read(c, 7, off, dst); err != nil {
			t.Fatalf("read %d bytes: %v", size, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("read of %d bytes returned other bytes", size)
		}
	}
	if old, err := rdma.CompareAndSwap(c, 7, 2<<20, 0, 42); err != nil || old != 0 {
		t.Fatalf("CAS = %d, %v; want 0, nil", old, err)
	}
	if old, err := rdma.CompareAndSwap(c, 7, 2<<20, 1, 5); err != nil || old != 42 {
		t.Fatalf("failing CAS = %d, %v; want 42, nil", old, err)
	}
	if old, err := rdma.FetchAdd(c, 7, 2<<20, 8); err != nil || old != 42 {
		t.Fatalf("FAA = %d, %v; want 42, nil", old, err)
	}
	if got := rdma.Load64(r.Bytes(), 2<<20); got != 50 {
		t.Fatalf("word after CAS+FAA = %d, want 50", got)
	}
	big := make([]byte, DefaultMaxFrame)
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 7, Buf: big}); !errors.Is(err, rdma.ErrInvalidOp) {
		t.Fatalf("Post of a write beyond MaxFrame = %v, want ErrInvalidOp", err)
	}
}

func TestSelectiveSignallingAndOrder(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 1, 1<<16, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	const n = 3000
	var buf [n][8]byte
	var cs [64]rdma.Completion
	var ids []uint64
	for i := 0; i < n; i++ {
		le.PutUint64(buf[i][:], uint64(i+1))
		wr := rdma.WR{ID: uint64(i), Kind: rdma.OpWrite, Region: 1, Offset: uint64(i%1024) * 8, Buf: buf[i][:]}
		if i%100 == 99 {
			wr.Flags = rdma.Signaled
		}
		for {
			err := c.Post(wr)
			if err == nil {
				break
			}
			if !errors.Is(err, rdma.ErrQueueFull) {
				t.Fatalf("Post %d: %v", i, err)
			}
			for _, cp := range cs[:c.Wait(cs[:], time.Second)] {
				ids = append(ids, cp.ID)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(ids) < n/100 && time.Now().Before(deadline) {
		for _, cp := range cs[:c.Wait(cs[:], time.Second)] {
			if cp.Err != nil {
				t.Fatalf("completion %d: %v", cp.ID, cp.Err)
			}
			ids = append(ids, cp.ID)
		}
	}
	if len(ids) != n/100 {
		t.Fatalf("got %d completions, want %d", len(ids), n/100)
	}
	for i, id := range ids {
		if id != uint64(i*100+99) {
			t.Fatalf("completion %d has id %d, want %d (posting order)", i, id, i*100+99)
		}
	}
	// The last signaled op completed, so every write is visible.
	for i := n - 1024; i < n; i++ {
		if got := rdma.Load64(r.Bytes(), (i%1024)*8); got != uint64(i+1) {
			t.Fatalf("slot %d = %d after the last completion, want %d", i%1024, got, i+1)
		}
	}
	if c.Outstanding() != 0 {
		t.Fatalf("Outstanding = %d after all completions", c.Outstanding())
	}
}

func TestUnsignaledOpsFreeQueueSlots(t *testing.T) {
	a, b := pair(t, func(o *Options) { o.QueueDepth = 16 })
	mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	var w [8]byte
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 1000; i++ {
		for {
			err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: w[:]})
			if err == nil {
				break
			}
			if !errors.Is(err, rdma.ErrQueueFull) || time.Now().After(deadline) {
				t.Fatalf("Post %d: %v (cumulative acks must free slots of unsignaled ops)", i, err)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	for c.Outstanding() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if c.Outstanding() != 0 {
		t.Fatalf("Outstanding = %d, unsignaled ops never acknowledged", c.Outstanding())
	}
}

func TestNotifyRingsTargetAndCompletionRingsInitiator(t *testing.T) {
	a, b := pair(t, nil)
	mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	var w [8]byte
	seqB, seqA := b.Doorbell().Seq(), a.Doorbell().Seq()
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Flags: rdma.Notify | rdma.Signaled, Region: 1, Buf: w[:]}); err != nil {
		t.Fatal(err)
	}
	if !b.Doorbell().Wait(seqB, 10*time.Second) {
		t.Fatal("target doorbell not rung by a Notify write")
	}
	if !a.Doorbell().Wait(seqA, 10*time.Second) {
		t.Fatal("initiator doorbell not rung by the completion")
	}
	seqB = b.Doorbell().Seq()
	if _, err := rdma.Do(c, rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: w[:]}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if b.Doorbell().Wait(seqB, 50*time.Millisecond) {
		t.Fatal("target doorbell rung by a write without Notify")
	}
}

func TestOpErrorsBreakConn(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 1, 64, 1, rdma.PermRead)
	mustRegion(t, b, 2, 64, 1, rdma.PermReadWrite)
	var w [8]byte
	le.PutUint64(w[:], 0xdeadbeef)
	cases := []struct {
		name string
		wr   rdma.WR
		want error
	}{
		{"write without permission", rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: w[:]}, rdma.ErrPermission},
		{"faa needs rw", rdma.WR{Kind: rdma.OpFetchAdd, Region: 1, Value: 1}, rdma.ErrPermission},
		{"read past the end", rdma.WR{Kind: rdma.OpRead, Region: 2, Offset: 60, Buf: w[:]}, rdma.ErrBounds},
		{"write at 2^64-4", rdma.WR{Kind: rdma.OpWrite, Region: 2, Offset: ^uint64(0) - 3, Buf: w[:]}, rdma.ErrBounds},
		{"cas past the end", rdma.WR{Kind: rdma.OpCompareAndSwap, Region: 2, Offset: 64}, rdma.ErrBounds},
		{"no region", rdma.WR{Kind: rdma.OpRead, Region: 99, Buf: w[:]}, rdma.ErrNoRegion},
	}
	for _, tc := range cases {
		c := mustConnect(t, a, 2)
		// An unsignaled write before the failing op succeeds; the op after
		// it fails with ErrConnBroken.
		ok := rdma.WR{ID: 1, Kind: rdma.OpWrite, Region: 2, Offset: 8, Buf: w[:]}
		tc.wr.ID, tc.wr.Flags = 2, rdma.Signaled
		after := rdma.WR{ID: 3, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 2, Offset: 16, Buf: w[:]}
		for _, wr := range []rdma.WR{ok, tc.wr} {
			if err := c.Post(wr); err != nil {
				t.Fatalf("%s: Post: %v", tc.name, err)
			}
		}
		want := 2
		if err := c.Post(after); errors.Is(err, rdma.ErrConnBroken) {
			want = 1 // the error arrived first
		} else if err != nil {
			t.Fatalf("%s: Post: %v", tc.name, err)
		}
		var got []rdma.Completion
		var cs [4]rdma.Completion
		deadline := time.Now().Add(10 * time.Second)
		for len(got) < want && time.Now().Before(deadline) {
			got = append(got, cs[:c.Wait(cs[:], time.Second)]...)
		}
		if len(got) != want || got[0].ID != 2 || !errors.Is(got[0].Err, tc.want) || (want == 2 && (got[1].ID != 3 || !errors.Is(got[1].Err, rdma.ErrConnBroken))) {
			t.Fatalf("%s: completions %+v, want op 2 failing with %v then op 3 (if posted) with ErrConnBroken", tc.name, got, tc.want)
		}
		if !errors.Is(c.Err(), tc.want) {
			t.Fatalf("%s: Err() = %v, want %v", tc.name, c.Err(), tc.want)
		}
		if err := c.Post(ok); !errors.Is(err, rdma.ErrConnBroken) {
			t.Fatalf("%s: Post after error = %v, want ErrConnBroken", tc.name, err)
		}
	}
	if !bytes.Equal(r.Bytes(), make([]byte, 64)) {
		t.Fatal("read-only region was modified")
	}
	c := mustConnect(t, a, 2)
	if err := c.Post(rdma.WR{Kind: rdma.OpFetchAdd, Region: 2, Offset: 4}); !errors.Is(err, rdma.ErrUnaligned) {
		t.Fatalf("unaligned FAA Post = %v, want ErrUnaligned", err)
	}
	if err := rdma.Write(c, 2, 0, w[:]); err != nil {
		t.Fatalf("a new Conn after errors: %v", err)
	}
}

func TestConnectErrors(t *testing.T) {
	a, b := pair(t, nil)
	if _, err := a.Connect(9); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Fatalf("Connect to an unconfigured node = %v, want ErrUnknownPeer", err)
	}
	// Another node answers at the address.
	a.SetPeer(3, b.Addr())
	if _, err := a.Connect(3); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Fatalf("Connect to the wrong node = %v, want ErrUnknownPeer", err)
	}
	// A wrong secret, either way round.
	other := openT(t, 4, func(o *Options) { o.Secret = []byte("another-secret-of-this-cluster!!") })
	a.SetPeer(4, other.Addr())
	if _, err := a.Connect(4); !errors.Is(err, ErrAuth) {
		t.Fatalf("Connect to a node with another secret = %v, want ErrAuth", err)
	}
	other.SetPeer(2, b.Addr())
	if _, err := other.Connect(2); !errors.Is(err, ErrAuth) {
		t.Fatalf("Connect from a node with another secret = %v, want ErrAuth", err)
	}
	// A dead address fails promptly with ErrPeerDead.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	a.SetPeer(5, dead)
	if _, err := a.Connect(5); !errors.Is(err, rdma.ErrPeerDead) {
		t.Fatalf("Connect to a closed port = %v, want ErrPeerDead", err)
	}
	// Something that accepts but never answers: the handshake times out.
	q := openT(t, 6, func(o *Options) { o.PeerTimeout = 300 * time.Millisecond })
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			nc, err := mute.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
		}
	}()
	q.SetPeer(7, mute.Addr().String())
	start := time.Now()
	if _, err := q.Connect(7); !errors.Is(err, rdma.ErrPeerDead) {
		t.Fatalf("Connect to a mute listener = %v, want ErrPeerDead", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Connect to a mute listener took %v", d)
	}
	if _, err := Open(1, Options{Listen: "127.0.0.1:0", Secret: []byte("short")}); !errors.Is(err, ErrOptions) {
		t.Fatalf("Open with a short secret = %v, want ErrOptions", err)
	}
	if _, err := Open(1, Options{Secret: testSecret}); !errors.Is(err, ErrOptions) {
		t.Fatalf("Open without Listen = %v, want ErrOptions", err)
	}
}

// fakeAcceptor answers one handshake with the given challenge mutation.
func fakeAcceptor(t *testing.T, mutate func(*hsMsg)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		hello, err := recvHs(nc)
		if err != nil {
			return
		}
		ch := hsMsg{Version: wireVersion, Type: hsChallenge, From: hello.To, To: hello.From}
		ch.MAC = handshakeMAC(testSecret, labelAcceptor, wireVersion, hello.From, hello.To, &hello.Nonce, &ch.Nonce)
		mutate(&ch)
		sendHs(nc, &ch)
		recvHs(nc)
	}()
	return ln.Addr().String()
}

func TestHandshakeVersion(t *testing.T) {
	a := openT(t, 1, nil)
	a.SetPeer(2, fakeAcceptor(t, func(m *hsMsg) { m.Version = wireVersion + 1 }))
	if _, err := a.Connect(2); !errors.Is(err, ErrVersion) {
		t.Fatalf("Connect to a newer acceptor = %v, want ErrVersion", err)
	}
	// A dialer of another version is rejected with a reason it can read.
	nc, err := net.Dial("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	sendHs(nc, &hsMsg{Version: wireVersion + 1, Type: hsHello, From: 2, To: 1})
	m, err := recvHs(nc)
	if err != nil || m.Type != hsReject || m.Status != stBadVersion || m.Version != wireVersion {
		t.Fatalf("answer to a newer hello = %+v, %v; want a version reject", m, err)
	}
}

// TestHandshakeDialerChecksAcceptor: an acceptor that cannot prove the
// secret (a forged MAC) is refused before the dialer proves anything.
func TestHandshakeDialerChecksAcceptor(t *testing.T) {
	a := openT(t, 1, nil)
	a.SetPeer(2, fakeAcceptor(t, func(m *hsMsg) { m.MAC[0] ^= 1 }))
	if _, err := a.Connect(2); !errors.Is(err, ErrAuth) {
		t.Fatalf("Connect to an acceptor with a forged MAC = %v, want ErrAuth", err)
	}
}

func TestDeadPeer(t *testing.T) {
	const timeout = 400 * time.Millisecond
	t.Run("target node closed", func(t *testing.T) {
		a, b := pair(t, func(o *Options) { o.PeerTimeout = timeout })
		mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
		c := mustConnect(t, a, 2)
		if _, err := rdma.FetchAdd(c, 1, 0, 1); err != nil {
			t.Fatal(err)
		}
		b.Close()
		_, err := rdma.Do(c, rdma.WR{Kind: rdma.OpFetchAdd, Region: 1, Value: 1}, 10*time.Second)
		if !errors.Is(err, rdma.ErrPeerDead) && !errors.Is(err, rdma.ErrConnBroken) {
			t.Fatalf("op to a closed node = %v, want ErrPeerDead", err)
		}
		if _, err := a.Connect(2); !errors.Is(err, rdma.ErrPeerDead) {
			t.Fatalf("Connect to a closed node = %v, want ErrPeerDead", err)
		}
	})
	t.Run("target silent", func(t *testing.T) {
		// A peer that completes the handshake, then neither reads nor answers.
		a := openT(t, 1, func(o *Options) { o.PeerTimeout = timeout })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		quit := make(chan struct{})
		defer close(quit)
		go func() {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
			if _, err := acceptHandshake(nc, 2, testSecret); err != nil {
				return
			}
			<-quit
		}()
		a.SetPeer(2, ln.Addr().String())
		c := mustConnect(t, a, 2)
		var w [8]byte
		for i := 0; i < 3; i++ {
			if err := c.Post(rdma.WR{ID: uint64(i), Kind: rdma.OpWrite, Region: 1, Buf: w[:]}); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		var got []rdma.Completion
		var cs [4]rdma.Completion
		for len(got) < 3 && time.Since(start) < 15*time.Second {
			got = append(got, cs[:c.Wait(cs[:], time.Second)]...)
		}
		if len(got) != 3 {
			t.Fatalf("%d of 3 outstanding ops failed after %v", len(got), time.Since(start))
		}
		for i, cp := range got {
			if cp.ID != uint64(i) || !errors.Is(cp.Err, rdma.ErrPeerDead) {
				t.Fatalf("completion %d = %+v, want op %d failing with ErrPeerDead", i, cp, i)
			}
		}
		if d := time.Since(start); d < timeout/2 {
			t.Fatalf("ops failed after %v, before the peer timeout %v", d, timeout)
		}
		if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: w[:]}); !errors.Is(err, rdma.ErrConnBroken) {
			t.Fatalf("Post after the peer died = %v, want ErrConnBroken", err)
		}
	})
}

func TestRevokeStopsWriter(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var w [8]byte
		var cs [64]rdma.Completion
		for i := uint64(1); !stop.Load(); i++ {
			le.PutUint64(w[:], i)
			if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: w[:]}); err != nil && !errors.Is(err, rdma.ErrQueueFull) {
				return
			}
			for _, cp := range cs[:c.Poll(cs[:])] {
				if cp.Err != nil && werr == nil {
					werr = cp.Err
				}
			}
			if i%64 == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for rdma.Load64(r.Bytes(), 0) < 100 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := r.Revoke(1); err != nil {
		t.Fatal(err)
	}
	snap := rdma.Load64(r.Bytes(), 0)
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if got := rdma.Load64(r.Bytes(), 0); got != snap {
		t.Fatalf("word changed from %d to %d after Revoke returned", snap, got)
	}
	if !errors.Is(c.Err(), rdma.ErrPermission) || (werr != nil && !errors.Is(werr, rdma.ErrPermission)) {
		t.Fatalf("writer's Conn error = %v (first completion error %v), want ErrPermission", c.Err(), werr)
	}
}

func TestRegisterAndClose(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 1, 10, 1, rdma.PermReadWrite)
	if len(r.Bytes()) != 16 {
		t.Fatalf("region of 10 bytes has %d, want 16", len(r.Bytes()))
	}
	if _, err := b.Register(1, 8); !errors.Is(err, rdma.ErrRegionExists) {
		t.Fatalf("second Register = %v, want ErrRegionExists", err)
	}
	c := mustConnect(t, a, 2)
	var w [8]byte
	if err := rdma.Write(c, 1, 8, w[:]); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if err := rdma.Write(c, 1, 8, w[:]); !errors.Is(err, rdma.ErrNoRegion) {
		t.Fatalf("write to a closed region = %v, want ErrNoRegion", err)
	}
	// The id is free again, and a new Conn reaches the new region.
	r2 := mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
	c2 := mustConnect(t, a, 2)
	le.PutUint64(w[:], 77)
	if err := rdma.Write(c2, 1, 56, w[:]); err != nil || rdma.Load64(r2.Bytes(), 56) != 77 {
		t.Fatalf("write to the re-registered region: %v", err)
	}
	b.Close()
	if _, err := b.Register(3, 8); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Register after Close = %v, want ErrClosed", err)
	}
}

func TestManyConnsConcurrentAtomics(t *testing.T) {
	a, b := pair(t, nil)
	r := mustRegion(t, b, 1, 64, 1, rdma.PermReadWrite)
	const workers, per = 4, 300
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	seen := make([][]uint64, workers)
	for w := 0; w < workers; w++ {
		c := mustConnect(t, a, 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				old, err := rdma.FetchAdd(c, 1, 8, 1)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				seen[w] = append(seen[w], old)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := rdma.Load64(r.Bytes(), 8); got != workers*per {
		t.Fatalf("counter = %d, want %d", got, workers*per)
	}
	uniq := map[uint64]bool{}
	for _, s := range seen {
		for _, v := range s {
			if uniq[v] {
				t.Fatalf("FetchAdd returned %d twice", v)
			}
			uniq[v] = true
		}
	}
}

// TestPostListBeyondSendLimit posts one list whose frames exceed the send
// buffer limit several times: PostList hands the first frames to the
// flusher and waits for room instead of growing the buffer or deadlocking,
// and every write lands in order.
func TestPostListBeyondSendLimit(t *testing.T) {
	a, b := pair(t, nil)
	const chunk, n = 256 << 10, 24 // 6 MiB in one list, sendLimit is 1 MiB
	r := mustRegion(t, b, 1, chunk*n, 1, rdma.PermReadWrite)
	c := mustConnect(t, a, 2)
	src := make([]byte, chunk*n)
	for i := range src {
		src[i] = byte(i*7 + i/chunk)
	}
	wrs := make([]rdma.WR, n)
	for i := range wrs {
		wrs[i] = rdma.WR{ID: uint64(i), Kind: rdma.OpWrite, Region: 1, Offset: uint64(i * chunk), Buf: src[i*chunk : (i+1)*chunk]}
	}
	wrs[n-1].Flags = rdma.Signaled
	if k, err := c.PostList(wrs); k != n || err != nil {
		t.Fatalf("PostList = %d, %v; want %d, nil", k, err, n)
	}
	var cs [4]rdma.Completion
	if k := c.Wait(cs[:], 10*time.Second); k != 1 || cs[0].Err != nil || cs[0].ID != n-1 {
		t.Fatalf("Wait = %d, %+v; want the last write's completion", k, cs[0])
	}
	if !bytes.Equal(r.Bytes(), src) {
		t.Fatal("region differs from the written data")
	}
}
