package fabrictest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// Hammer layout: writer k owns area k of hammerArea bytes:
//
//	area k: +---------+---------------------------+
//	        | counter | block (hammerArea-8 bytes) |
//	        +---------+---------------------------+
//
// Each round it writes the block (one write, every byte = counter's low
// byte), then the counter (8 bytes): the counter only grows.
const hammerArea = 128

func hammerOff(k int) uint64 { return uint64(k) * hammerArea }

// hammer writes rounds into area k of region 1 on c until stop is set or an
// op fails, and returns the first error (nil if stopped). progress, if not
// nil, is set to the rounds posted.
func hammer(c rdma.Conn, k int, stop *atomic.Bool, progress *atomic.Uint64) error {
	p := newPipe(c, 8)
	block := make([]byte, hammerArea-8)
	for i := uint64(1); !stop.Load(); i++ {
		for j := range block {
			block[j] = byte(i)
		}
		if _, err := p.write(1, hammerOff(k)+8, block, 0); err != nil {
			return err
		}
		if _, err := p.write64(1, hammerOff(k), i, 0); err != nil {
			return err
		}
		if progress != nil {
			progress.Store(i)
		}
		if i%64 == 0 {
			// Pace the stream so that the queue drains and errors surface.
			p.poll(time.Millisecond)
			if p.err != nil {
				return p.err
			}
		}
	}
	return nil
}

// hammerList is hammer through Conn.PostList: each list carries
// hammerRounds rounds (block, counter, block, counter, ...), the last write
// signaled, and the next list waits for its completion.
func hammerList(c rdma.Conn, k int, stop *atomic.Bool, progress *atomic.Uint64) error {
	const rounds = 8
	bufs := make([]byte, rounds*hammerArea)
	wrs := make([]rdma.WR, 2*rounds)
	var cs [4]rdma.Completion
	for i := uint64(1); !stop.Load(); i += rounds {
		for r := range uint64(rounds) {
			b := bufs[r*hammerArea : (r+1)*hammerArea]
			for j := range b[8:] {
				b[8+j] = byte(i + r)
			}
			put64(b, i+r)
			wrs[2*r] = rdma.WR{Kind: rdma.OpWrite, Region: 1, Offset: hammerOff(k) + 8, Buf: b[8:]}
			wrs[2*r+1] = rdma.WR{ID: i + r, Kind: rdma.OpWrite, Region: 1, Offset: hammerOff(k), Buf: b[:8]}
		}
		wrs[len(wrs)-1].Flags = rdma.Signaled
		if _, err := c.PostList(wrs); err != nil {
			// A failed op's completion carries the cause.
			if _, cerr := awaitAny(c, cs[:]); cerr != nil {
				return cerr
			}
			return err
		}
		if _, err := awaitAny(c, cs[:]); err != nil {
			return err
		}
		if progress != nil {
			progress.Store(i + rounds - 1)
		}
	}
	return nil
}

// watchUnchanged checks, for d, that area [off, off+n) of mem stays equal
// to snap.
func watchUnchanged(mem []byte, off, n int, snap []byte, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if diff := firstDiff(snap, snapshot(mem[off:off+n])); diff >= 0 {
			return fmt.Errorf("byte %d of the revoked peer's area changed after Revoke returned (%#x -> %#x)", diff, snap[diff], mem[off+diff])
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testRevokeRacingWriters: writers hammer a region over their own Conns
// (with Post, and with PostList); the owner revokes one mid-stream. After
// Revoke returns none of that peer's writes land, its Conn fails with
// ErrPermission, and the others go on.
func testRevokeRacingWriters(t *testing.T, h Harness) {
	t.Run("Post", func(t *testing.T) { revokeRacingWriters(t, h, hammer) })
	t.Run("PostList", func(t *testing.T) { revokeRacingWriters(t, h, hammerList) })
}

func revokeRacingWriters(t *testing.T, h Harness, hammer func(rdma.Conn, int, *atomic.Bool, *atomic.Uint64) error) {
	const writers = 3
	cl := newCluster(t, h, writers+1)
	owner := cl.open(1)
	r := register(t, owner, 1, writers*hammerArea)
	mem := r.Bytes()
	var stop atomic.Bool
	var progress [writers]atomic.Uint64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	conns := make([]rdma.Conn, writers)
	for k := range writers {
		id := rdma.NodeID(2 + k)
		n := cl.open(id)
		grant(t, r, id, rdma.PermWrite)
		c := connect(t, n, 1)
		conns[k] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = hammer(c, k, &stop, &progress[k])
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	counter := func(k int) uint64 { return rdma.Load64(mem, int(hammerOff(k))) }

	// Mid-stream: every writer has landed writes.
	for k := range writers {
		if !eventually(liveTimeout, func() bool { return counter(k) >= 50 }) {
			t.Fatalf("writer %d made no progress: counter %d after %v", k, counter(k), liveTimeout)
		}
	}
	const victim = 0
	if err := r.Revoke(rdma.NodeID(2 + victim)); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	off := int(hammerOff(victim))
	snap := snapshot(mem[off : off+hammerArea])
	atRevoke := [writers]uint64{}
	for k := range writers {
		atRevoke[k] = counter(k)
	}
	if err := watchUnchanged(mem, off, hammerArea, snap, 300*time.Millisecond); err != nil {
		t.Error(err)
	}
	// The other writers keep going.
	for k := 1; k < writers; k++ {
		if !eventually(liveTimeout, func() bool { return counter(k) > atRevoke[k]+50 }) {
			t.Errorf("writer %d stalled after another peer was revoked: counter %d, %d at Revoke", k, counter(k), atRevoke[k])
		}
	}
	// The victim learns of it through ErrPermission.
	stop.Store(true)
	wg.Wait()
	if !errors.Is(errs[victim], rdma.ErrPermission) {
		t.Errorf("revoked writer's stream ended with %v, want ErrPermission", errs[victim])
	}
	if err := conns[victim].Err(); !errors.Is(err, rdma.ErrPermission) {
		t.Errorf("revoked writer's Conn.Err() = %v, want ErrPermission", err)
	}
	for k := 1; k < writers; k++ {
		if errs[k] != nil {
			t.Errorf("writer %d (not revoked): %v", k, errs[k])
		}
	}
	if d := firstDiff(snap, snapshot(mem[off:off+hammerArea])); d >= 0 {
		t.Errorf("byte %d of the revoked peer's area changed after Revoke returned", d)
	}
}
