package fabrictest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// testPostList: Conn.PostList is Post on each work request in order. The
// list's ops land and complete in list order (also across regions and
// verbs, reads seeing earlier writes of the list), a malformed request stops
// the list at its index without breaking the Conn, a failing op breaks the
// Conn as with Post (nothing after it lands), and the steady path allocates
// nothing.
func testPostList(t *testing.T, h Harness) {
	setup := func(t *testing.T) (rdma.Node, rdma.Conn, []rdma.Region) {
		cl := newCluster(t, h, 2)
		owner, peer := cl.open(1), cl.open(2)
		// Regions 1 and 2 are open to the peer, region 3 read-only.
		var rs []rdma.Region
		for i, p := range []rdma.Perm{rdma.PermReadWrite, rdma.PermReadWrite, rdma.PermRead} {
			r := register(t, owner, rdma.RegionID(i+1), 4096)
			grant(t, r, 2, p)
			rs = append(rs, r)
		}
		return owner, connect(t, peer, 1), rs
	}
	w64 := func(region rdma.RegionID, off, v uint64) rdma.WR {
		return rdma.WR{Kind: rdma.OpWrite, Region: region, Offset: off, Buf: word(v)}
	}

	t.Run("Order", func(t *testing.T) {
		owner, c, rs := setup(t)
		m1, m2 := rs[0].Bytes(), rs[1].Bytes()
		var wrs []rdma.WR
		for i := range uint64(32) {
			wrs = append(wrs, w64(1, 8*i, i+1), w64(2, 8*i, 1000+i))
		}
		for v := range uint64(3) {
			wrs = append(wrs, w64(1, 0, 100+v)) // the last one wins
		}
		readBuf := make([]byte, 8)
		wrs = append(wrs,
			rdma.WR{ID: 7, Kind: rdma.OpFetchAdd, Flags: rdma.Signaled, Region: 2, Offset: 512, Value: 5},
			rdma.WR{ID: 8, Kind: rdma.OpRead, Flags: rdma.Signaled, Region: 1, Offset: 0, Buf: readBuf},
			rdma.WR{ID: 9, Kind: rdma.OpWrite, Flags: rdma.Signaled | rdma.Notify, Region: 1, Offset: 1024, Buf: word(77)},
		)
		seq := owner.Doorbell().Seq()
		if n, err := c.PostList(wrs); n != len(wrs) || err != nil {
			t.Fatalf("PostList of %d work requests = %d, %v; want %d, nil", len(wrs), n, err, len(wrs))
		}
		got := collect(t, c, 9)
		if len(got) != 3 || got[0].ID != 7 || got[1].ID != 8 || got[2].ID != 9 {
			t.Fatalf("completions %v, want IDs 7, 8, 9 in list order", ids(got))
		}
		for _, cp := range got {
			if cp.Err != nil {
				t.Fatalf("completion %d: %v", cp.ID, cp.Err)
			}
		}
		if got[0].Value != 0 {
			t.Errorf("FetchAdd returned %d, want the word's previous value 0", got[0].Value)
		}
		if v := le64(readBuf); v != 102 {
			t.Errorf("read after three writes of the same list read %d, want 102 (the last write)", v)
		}
		for i := range 32 {
			want := uint64(i + 1)
			if i == 0 {
				want = 102
			}
			if v := rdma.Load64(m1, 8*i); v != want {
				t.Errorf("region 1 word %d = %d, want %d", i, v, want)
			}
			if v := rdma.Load64(m2, 8*i); v != 1000+uint64(i) {
				t.Errorf("region 2 word %d = %d, want %d", i, v, 1000+i)
			}
		}
		if v := rdma.Load64(m2, 512); v != 5 {
			t.Errorf("FetchAdd's word = %d, want 5", v)
		}
		if v := rdma.Load64(m1, 1024); v != 77 {
			t.Errorf("last write's word = %d, want 77", v)
		}
		if !eventually(liveTimeout, func() bool { return owner.Doorbell().Seq() != seq }) {
			t.Errorf("the list's Notify write did not ring the target's doorbell")
		}
		if n, err := c.PostList(nil); n != 0 || err != nil {
			t.Errorf("PostList(nil) = %d, %v; want 0, nil", n, err)
		}
	})

	t.Run("Malformed", func(t *testing.T) {
		_, c, rs := setup(t)
		m := rs[0].Bytes()
		wrs := []rdma.WR{w64(1, 0, 1), w64(1, 8, 2), {Kind: rdma.OpWrite, Region: 1, Offset: 16}, w64(1, 24, 4)}
		n, err := c.PostList(wrs)
		if n != 2 || !errors.Is(err, rdma.ErrInvalidOp) {
			t.Fatalf("PostList with an empty write at index 2 = %d, %v; want 2, ErrInvalidOp", n, err)
		}
		if err := c.Err(); err != nil {
			t.Fatalf("a malformed request broke the Conn: %v", err)
		}
		if err := write(c, 1, 32, word(5)); err != nil {
			t.Fatalf("write after the stopped list: %v", err)
		}
		for i, want := range []uint64{1, 2, 0, 0, 5} {
			if v := rdma.Load64(m, 8*i); v != want {
				t.Errorf("word %d = %d, want %d (posted: indexes 0 and 1, then a single write to word 4)", i, v, want)
			}
		}
	})

	t.Run("FailureBreaksConn", func(t *testing.T) {
		_, c, rs := setup(t)
		m1, before3 := rs[0].Bytes(), snapshot(rs[2].Bytes())
		wrs := []rdma.WR{
			w64(1, 32, 5),
			{ID: 21, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 3, Offset: 0, Buf: word(6)}, // read-only
			{ID: 22, Kind: rdma.OpWrite, Region: 1, Offset: 40, Buf: word(7)},
			{ID: 23, Kind: rdma.OpWrite, Flags: rdma.Signaled, Region: 1, Offset: 48, Buf: word(8)},
		}
		n, err := c.PostList(wrs)
		switch {
		case n == 2 && errors.Is(err, rdma.ErrConnBroken):
			// The fabric knew at once (the op ran inside PostList).
		case n == len(wrs) && err == nil:
			// The target reports the failure later.
		default:
			t.Fatalf("PostList with a denied write at index 1 = %d, %v; want 2, ErrConnBroken or %d, nil", n, err, len(wrs))
		}
		last := uint64(21)
		if n == len(wrs) {
			last = 23
		}
		got := collect(t, c, last)
		if len(got) == 0 || got[0].ID != 21 || !errors.Is(got[0].Err, rdma.ErrPermission) {
			t.Fatalf("completions %v, want the denied write (21) first, failing with ErrPermission", ids(got))
		}
		var oe *rdma.OpError
		if !errors.As(got[0].Err, &oe) {
			t.Errorf("the denied write's error %v (%T) is not an *rdma.OpError", got[0].Err, got[0].Err)
		}
		for _, cp := range got[1:] {
			if cp.ID <= 21 || !errors.Is(cp.Err, rdma.ErrConnBroken) {
				t.Errorf("completion %d after the failed op: %v, want a later op failing with ErrConnBroken", cp.ID, cp.Err)
			}
		}
		expectBroken(t, c, "write in a list")
		if n, err := c.PostList(wrs[:1]); n != 0 || !errors.Is(err, rdma.ErrConnBroken) {
			t.Errorf("PostList on the broken Conn = %d, %v; want 0, ErrConnBroken", n, err)
		}
		if v := rdma.Load64(m1, 32); v != 5 {
			t.Errorf("the write before the failed op: word = %d, want 5", v)
		}
		for _, off := range []int{40, 48} {
			if v := rdma.Load64(m1, off); v != 0 {
				t.Errorf("a write after the failed op landed: word at %d = %d", off, v)
			}
		}
		if d := firstDiff(before3, snapshot(rs[2].Bytes())); d >= 0 {
			t.Errorf("the denied write changed the read-only region at byte %d", d)
		}
	})

	t.Run("NoAllocs", func(t *testing.T) {
		if raceEnabled {
			t.Skip("the race detector allocates on its own")
		}
		_, c, _ := setup(t)
		wrs := make([]rdma.WR, 17)
		bufs := make([]byte, 8*len(wrs))
		for i := range wrs {
			wrs[i] = rdma.WR{ID: uint64(i), Kind: rdma.OpWrite, Region: 1 + rdma.RegionID(i%2), Offset: uint64(64 * i), Buf: bufs[8*i : 8*i+8]}
		}
		wrs[len(wrs)-1].Flags = rdma.Signaled | rdma.Notify
		var cs [4]rdma.Completion
		var loopErr error
		run := func() {
			if n, err := c.PostList(wrs); err != nil {
				loopErr = fmt.Errorf("PostList = %d, %w", n, err)
				return
			}
			if _, err := awaitAny(c, cs[:]); err != nil {
				loopErr = err
			}
		}
		run()
		allocs := testing.AllocsPerRun(200, run)
		if loopErr != nil {
			t.Fatal(loopErr)
		}
		if allocs != 0 {
			t.Errorf("PostList of 17 writes on two regions and Poll of the last one's completion: %v allocations per list, want 0", allocs)
		}
	})
}

// collect polls c until the completion with ID last arrives (or an error
// completion with a higher ID, or opTimeout), and returns all it polled.
func collect(t *testing.T, c rdma.Conn, last uint64) []rdma.Completion {
	t.Helper()
	var out []rdma.Completion
	var cs [8]rdma.Completion
	deadline := time.Now().Add(opTimeout)
	for time.Now().Before(deadline) {
		n := c.Wait(cs[:], 100*time.Millisecond)
		for _, cp := range cs[:n] {
			out = append(out, cp)
			if cp.ID >= last {
				return out
			}
		}
	}
	t.Fatalf("completion %d: %v (polled %v)", last, errNoCompletion, ids(out))
	return nil
}

// ids lists completions as "id:err" for messages.
func ids(cs []rdma.Completion) []string {
	var s []string
	for _, cp := range cs {
		s = append(s, fmt.Sprintf("%d:%v", cp.ID, cp.Err))
	}
	return s
}
