package fabrictest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// fillPattern gives every byte of mem a position-dependent value.
func fillPattern(mem []byte, seed byte) {
	for off := 0; off+8 <= len(mem); off += 8 {
		var b [8]byte
		for i := range b {
			b[i] = byte(off+i)*7 + seed
		}
		rdma.Store64(mem, off, le64(b[:]))
	}
}

// expectOpError posts wr on c (which must accept it), waits for its
// completion and checks that it fails with want, wrapped in an *rdma.OpError,
// and that the Conn is broken afterwards.
func expectOpError(t *testing.T, c rdma.Conn, wr rdma.WR, want error) {
	t.Helper()
	desc := fmt.Sprintf("%s region %d offset %d len %d", wr.Kind, wr.Region, wr.Offset, wr.Len())
	_, err := doOp(c, wr, opTimeout)
	switch {
	case err == nil:
		t.Errorf("%s succeeded, want %v", desc, want)
		return
	case errors.Is(err, errNoCompletion):
		t.Errorf("%s: %v", desc, err)
		return
	case !errors.Is(err, want):
		t.Errorf("%s failed with %v, want errors.Is(err, %v)", desc, err, want)
		return
	}
	var oe *rdma.OpError
	if !errors.As(err, &oe) {
		t.Errorf("%s: error %v (%T) is not an *rdma.OpError", desc, err, err)
	}
	expectBroken(t, c, desc)
}

// expectBroken checks that c is in the error state: Err is set and every
// kind of Post fails with ErrConnBroken.
func expectBroken(t *testing.T, c rdma.Conn, after string) {
	t.Helper()
	if c.Err() == nil {
		t.Errorf("after failed %s: Conn.Err() = nil, want the cause", after)
	}
	buf := make([]byte, 8)
	for _, wr := range []rdma.WR{
		{Kind: rdma.OpWrite, Region: 1, Buf: buf},
		{Kind: rdma.OpRead, Region: 1, Buf: buf},
		{Kind: rdma.OpCompareAndSwap, Region: 1},
		{Kind: rdma.OpFetchAdd, Region: 1, Value: 1},
	} {
		wr.Flags = rdma.Signaled
		if err := c.Post(wr); !errors.Is(err, rdma.ErrConnBroken) {
			t.Errorf("after failed %s: Post(%s) = %v, want ErrConnBroken", after, wr.Kind, err)
		}
	}
}

// testBounds: ops past a region's end fail with ErrBounds, break the Conn
// and touch neither the region, a neighbouring region nor the read buffer.
func testBounds(t *testing.T, h Harness) {
	const size = 4096
	cl := newCluster(t, h, 2)
	owner, peer := cl.open(1), cl.open(2)
	target := register(t, owner, 1, size)
	neighbour := register(t, owner, 2, size)
	odd := register(t, owner, 3, 1001) // rounded up to 1008
	for _, r := range []rdma.Region{target, neighbour, odd} {
		grant(t, r, 2, rdma.PermReadWrite)
		fillPattern(r.Bytes(), byte(r.ID()))
	}
	before := map[rdma.RegionID][]byte{}
	for _, r := range []rdma.Region{target, neighbour, odd} {
		before[r.ID()] = snapshot(r.Bytes())
	}
	unchanged := func(what string) {
		t.Helper()
		for _, r := range []rdma.Region{target, neighbour, odd} {
			if d := firstDiff(before[r.ID()], snapshot(r.Bytes())); d >= 0 {
				t.Fatalf("after %s: region %d changed at byte %d", what, r.ID(), d)
			}
		}
	}

	type op struct {
		kind   rdma.OpKind
		region rdma.RegionID
		off    uint64
		n      int
	}
	var bad []op
	for _, k := range []rdma.OpKind{rdma.OpWrite, rdma.OpRead} {
		bad = append(bad,
			op{k, 1, size, 8},                // starts at the end
			op{k, 1, size - 4, 8},            // straddles the end
			op{k, 1, 0, size + 8},            // longer than the region
			op{k, 1, 8, size},                // fits in length, overflows by 8
			op{k, 1, math.MaxUint64 - 7, 16}, // offset+len wraps around 2^64
			op{k, 1, math.MaxUint64, 1},
			op{k, 1, 1 << 63, 8},
			op{k, 3, 1004, 8}, // past a rounded-up size
		)
	}
	for _, k := range []rdma.OpKind{rdma.OpCompareAndSwap, rdma.OpFetchAdd} {
		bad = append(bad,
			op{k, 1, size, 8},
			op{k, 1, math.MaxUint64 - 7, 8},
			op{k, 1, 1 << 63, 8},
			op{k, 3, 1008, 8},
		)
	}
	for _, o := range bad {
		c := connect(t, peer, 1)
		wr := rdma.WR{Kind: o.kind, Region: o.region, Offset: o.off, Value: 1, Compare: 0}
		var buf []byte
		if o.kind == rdma.OpWrite || o.kind == rdma.OpRead {
			buf = make([]byte, o.n)
			for i := range buf {
				buf[i] = 0xA5
			}
			wr.Buf = buf
		}
		desc := fmt.Sprintf("%s region %d [%d,+%d)", o.kind, o.region, o.off, o.n)
		expectOpError(t, c, wr, rdma.ErrBounds)
		unchanged(desc)
		if o.kind == rdma.OpRead && strings.Trim(string(buf), "\xa5") != "" {
			t.Errorf("%s: the failed read wrote into the destination buffer", desc)
		}
		c.Close()
	}

	// Control: ops that end exactly at the end of a region succeed.
	c := connect(t, peer, 1)
	if err := write(c, 1, size-8, word(0x1111)); err != nil {
		t.Fatalf("write of the last word of region 1: %v", err)
	}
	if err := write(c, 3, 1000, word(0x2222)); err != nil {
		t.Fatalf("write of the last word of a 1001-byte region (rounded to 1008): %v", err)
	}
	if got, err := read64(c, 1, size-8); err != nil || got != 0x1111 {
		t.Fatalf("read of the last word of region 1 = %#x, %v; want 0x1111", got, err)
	}
	if _, err := faa(c, 1, size-8, 1); err != nil {
		t.Fatalf("FetchAdd on the last word of region 1: %v", err)
	}
	if got := rdma.Load64(target.Bytes(), size-8); got != 0x1112 {
		t.Fatalf("last word of region 1 = %#x after write 0x1111 and FetchAdd 1", got)
	}
	put64(before[1][size-8:], 0x1112)
	put64(before[3][1000:], 0x2222)
	unchanged("in-bounds writes at the ends")
}

// testPermissions: no grant, read-only and write-only peers; atomics need
// read-write; unknown regions and peers; misaligned atomics.
func testPermissions(t *testing.T, h Harness) {
	cl := newCluster(t, h, 3)
	owner, peer, other := cl.open(1), cl.open(2), cl.open(3)
	r := register(t, owner, 1, 256)
	mem := r.Bytes()
	fillPattern(mem, 9)
	before := snapshot(mem)
	unchanged := func(what string) {
		t.Helper()
		if d := firstDiff(before, snapshot(mem)); d >= 0 {
			t.Fatalf("after %s: region changed at byte %d", what, d)
		}
	}
	if _, err := owner.Register(1, 64); !errors.Is(err, rdma.ErrRegionExists) {
		t.Errorf("registering region 1 twice: %v, want ErrRegionExists", err)
	}
	buf := func() []byte { return []byte{1, 2, 3, 4, 5, 6, 7, 8} }
	wrs := map[rdma.OpKind]rdma.WR{
		rdma.OpWrite:          {Kind: rdma.OpWrite, Region: 1, Offset: 16},
		rdma.OpRead:           {Kind: rdma.OpRead, Region: 1, Offset: 16},
		rdma.OpCompareAndSwap: {Kind: rdma.OpCompareAndSwap, Region: 1, Offset: 16, Compare: rdma.Load64(mem, 16), Value: 7},
		rdma.OpFetchAdd:       {Kind: rdma.OpFetchAdd, Region: 1, Offset: 16, Value: 7},
	}
	try := func(p rdma.Perm, k rdma.OpKind) error {
		c := connect(t, peer, 1)
		defer c.Close()
		wr := wrs[k]
		if k == rdma.OpWrite || k == rdma.OpRead {
			wr.Buf = buf()
		}
		_, err := doOp(c, wr, opTimeout)
		if errors.Is(err, rdma.ErrPermission) {
			expectBroken(t, c, fmt.Sprintf("%s with grant %v", k, p))
			if k == rdma.OpRead && string(wr.Buf) != string(buf()) {
				t.Errorf("a read denied permission wrote into the destination buffer")
			}
		}
		return err
	}
	for _, p := range []rdma.Perm{rdma.PermNone, rdma.PermRead, rdma.PermWrite, rdma.PermReadWrite} {
		grant(t, r, 2, p)
		for _, k := range []rdma.OpKind{rdma.OpWrite, rdma.OpRead, rdma.OpCompareAndSwap, rdma.OpFetchAdd} {
			need := (&rdma.WR{Kind: k}).NeedPerm()
			err := try(p, k)
			if p&need != need {
				if !errors.Is(err, rdma.ErrPermission) {
					t.Errorf("%s with grant %v: %v, want ErrPermission", k, p, err)
				}
				unchanged(fmt.Sprintf("denied %s with grant %v", k, p))
				continue
			}
			if err != nil {
				t.Errorf("%s with grant %v: %v, want success", k, p, err)
			}
			before = snapshot(mem) // allowed ops may change the word
		}
	}

	// A grant is per peer: node 3 has none while node 2 has rw.
	c3 := connect(t, other, 1)
	expectOpError(t, c3, rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: 0, Buf: buf()}, rdma.ErrPermission)
	unchanged("write by a peer without a grant")

	// Revoke, then grant again: a new Conn works.
	if err := r.Revoke(2); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if err := try(rdma.PermNone, rdma.OpRead); !errors.Is(err, rdma.ErrPermission) {
		t.Errorf("read after Revoke: %v, want ErrPermission", err)
	}
	grant(t, r, 2, rdma.PermRead)
	if err := try(rdma.PermRead, rdma.OpRead); err != nil {
		t.Errorf("read after Revoke and a new read grant: %v", err)
	}

	// Unregistered region, and a region closed by its owner.
	c := connect(t, peer, 1)
	expectOpError(t, c, rdma.WR{Kind: rdma.OpWrite, Region: 99, Buf: buf()}, rdma.ErrNoRegion)
	r2 := register(t, owner, 2, 64)
	grant(t, r2, 2, rdma.PermReadWrite)
	c = connect(t, peer, 1)
	if err := write(c, 2, 0, word(5)); err != nil {
		t.Fatalf("write to region 2: %v", err)
	}
	if err := r2.Close(); err != nil {
		t.Fatalf("close region 2: %v", err)
	}
	expectOpError(t, c, rdma.WR{Kind: rdma.OpRead, Region: 2, Buf: make([]byte, 8)}, rdma.ErrNoRegion)

	// Unknown peer.
	if c, err := peer.Connect(1000); !errors.Is(err, rdma.ErrUnknownPeer) {
		t.Errorf("Connect(1000) outside the cluster: %v, want ErrUnknownPeer", err)
		if c != nil {
			c.Close()
		}
	}

	// Malformed requests fail at Post and do not break the Conn.
	c = connect(t, peer, 1)
	grant(t, r, 2, rdma.PermReadWrite)
	for _, wr := range []rdma.WR{
		{Kind: rdma.OpCompareAndSwap, Region: 1, Offset: 4},
		{Kind: rdma.OpFetchAdd, Region: 1, Offset: 12, Value: 1},
		{Kind: rdma.OpFetchAdd, Region: 1, Offset: 1},
	} {
		if err := c.Post(wr); !errors.Is(err, rdma.ErrUnaligned) {
			t.Errorf("Post(%s at offset %d) = %v, want ErrUnaligned", wr.Kind, wr.Offset, err)
		}
	}
	for _, wr := range []rdma.WR{
		{Kind: rdma.OpWrite, Region: 1},
		{Kind: rdma.OpRead, Region: 1, Buf: []byte{}},
		{Kind: 0, Region: 1, Buf: buf()},
		{Kind: 200, Region: 1, Buf: buf()},
	} {
		if err := c.Post(wr); !errors.Is(err, rdma.ErrInvalidOp) {
			t.Errorf("Post(%v with %d-byte buffer) = %v, want ErrInvalidOp", wr.Kind, len(wr.Buf), err)
		}
	}
	if err := c.Err(); err != nil {
		t.Errorf("a request refused at Post broke the Conn: %v", err)
	}
	if _, err := faa(c, 1, 0, 1); err != nil {
		t.Errorf("FetchAdd after refused requests: %v", err)
	}
}

// testErrorState: after an error every Post fails with ErrConnBroken; other
// Conns are unaffected; a new Connect works.
func testErrorState(t *testing.T, h Harness) {
	cl := newCluster(t, h, 2)
	owner, peer := cl.open(1), cl.open(2)
	r := register(t, owner, 1, 64)
	grant(t, r, 2, rdma.PermRead)
	bystander := connect(t, peer, 1)
	c := connect(t, peer, 1)
	if _, err := read64(c, 1, 0); err != nil {
		t.Fatalf("read: %v", err)
	}
	// A denied write breaks c; unsignaled ops posted behind it fail too.
	if err := c.Post(rdma.WR{ID: 1, Kind: rdma.OpWrite, Region: 1, Buf: word(1)}); err != nil {
		t.Fatalf("Post write: %v", err)
	}
	var failed error
	var cs [8]rdma.Completion
	deadline := time.Now().Add(opTimeout)
	for failed == nil && time.Now().Before(deadline) {
		for _, cp := range cs[:c.Wait(cs[:], 100*time.Millisecond)] {
			if cp.Err != nil && failed == nil {
				failed = cp.Err
				if cp.ID != 1 {
					t.Errorf("error completion has ID %d, want 1", cp.ID)
				}
			}
		}
	}
	if !errors.Is(failed, rdma.ErrPermission) {
		t.Fatalf("unsignaled denied write: completion error %v, want ErrPermission (errors are always reported)", failed)
	}
	if !errors.Is(c.Err(), rdma.ErrPermission) {
		t.Errorf("Conn.Err() = %v, want the cause ErrPermission", c.Err())
	}
	expectBroken(t, c, "write without permission")
	grant(t, r, 2, rdma.PermReadWrite)
	expectBroken(t, c, "write without permission, then a new grant")
	if _, err := read64(bystander, 1, 0); err != nil {
		t.Errorf("another Conn of the same node broke with it: %v", err)
	}
	c2 := connect(t, peer, 1)
	if err := write(c2, 1, 8, word(42)); err != nil {
		t.Fatalf("write on a new Conn after reconnect: %v", err)
	}
	if got := rdma.Load64(r.Bytes(), 8); got != 42 {
		t.Errorf("word after write on the new Conn = %d, want 42", got)
	}
	if err := c.Close(); err != nil {
		t.Errorf("closing a broken Conn: %v", err)
	}
	if err := c2.Post(rdma.WR{Kind: rdma.OpRead, Region: 1, Buf: make([]byte, 8)}); err != nil {
		t.Errorf("new Conn stopped working when the broken one closed: %v", err)
	}
}

// deadErr reports whether err says that the target died: ErrPeerDead,
// directly or as the cause carried by ErrConnBroken.
func deadErr(err error) bool {
	return errors.Is(err, rdma.ErrPeerDead)
}

// awaitDeath keeps posting ops on c (target region 1) until one fails or
// timeout passes, and returns the first error.
func awaitDeath(c rdma.Conn, timeout time.Duration) error {
	p := newPipe(c, 4)
	deadline := time.Now().Add(timeout)
	for i := uint64(0); time.Now().Before(deadline); i++ {
		if _, err := p.write64(1, 8*(i%8), i, 0); err != nil {
			return err
		}
		if i%4 == 3 {
			p.poll(20 * time.Millisecond)
			if p.err != nil {
				return p.err
			}
		}
	}
	return fmt.Errorf("ops on a Conn to a dead peer kept succeeding or hanging for %v: %w", timeout, errNoCompletion)
}

// testDeadPeer: when the target node closes, in-flight and later ops fail
// within a bounded time, and nothing hangs.
func testDeadPeer(t *testing.T, h Harness) {
	cl := newCluster(t, h, 2)
	target, peer := cl.open(1), cl.open(2)
	r := register(t, target, 1, 64)
	grant(t, r, 2, rdma.PermReadWrite)
	c := connect(t, peer, 1)
	if err := write(c, 1, 0, word(1)); err != nil {
		t.Fatalf("write before the target closes: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var inflight error
	started := make(chan struct{})
	go func() { // ops in flight while the target closes
		defer wg.Done()
		close(started)
		inflight = awaitDeath(c, deadTimeout)
	}()
	<-started
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	if err := target.Close(); err != nil {
		t.Fatalf("close target: %v", err)
	}
	wg.Wait()
	t.Logf("first error %v after the target closed: %v", time.Since(start).Round(time.Millisecond), inflight)
	if !deadErr(inflight) {
		t.Fatalf("ops to a closed target: %v, want ErrPeerDead (or ErrNoRegion)", inflight)
	}
	if c.Err() == nil {
		t.Errorf("Conn.Err() = nil after an op failed on the dead peer")
	}
	if err := c.Post(rdma.WR{Kind: rdma.OpWrite, Region: 1, Buf: word(2)}); !errors.Is(err, rdma.ErrConnBroken) {
		t.Errorf("Post after the dead-peer error: %v, want ErrConnBroken", err)
	}
	// A new Connect either fails or gives a Conn whose ops fail in time.
	if c2, err := peer.Connect(1); err == nil {
		defer c2.Close()
		if err := awaitDeath(c2, deadTimeout); !deadErr(err) {
			t.Errorf("ops on a new Conn to the closed target: %v, want ErrPeerDead", err)
		}
	}
}
