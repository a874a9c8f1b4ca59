package broadcast

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// TestProposalSizeLimit: every size Propose accepts can be delivered on
// every path, at the exact boundary. Proposals of MaxProposal-8 ..
// MaxProposal bytes, made at the leader and at a follower (forwarded),
// reach node 3 only; the leader crashes; node 3 wins the election and must
// send them to node 2 inside its diff, one entry per part at the limit.
// MaxProposal+1 bytes fail at once with ErrTooLarge. (Before the limit was
// derived from the diff layout, sizes a few bytes below the old limit were
// accepted and then never fitted a diff part: the group stalled.)
func TestProposalSizeLimit(t *testing.T) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, func(cfg *Config) { cfg.MaxRecord = 512 })
	n1, n2, n3 := c.get(1), c.get(2), c.get(3)
	max := n1.r.MaxProposal()
	if max != 512-64 {
		t.Fatalf("MaxProposal %d with MaxRecord 512, want 448", max)
	}
	if _, err := waitProposal(t, n1.r.Propose(make([]byte, max+1)), "MaxProposal+1 bytes", 0, qreplicas(c)...); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a proposal of MaxProposal+1 bytes: %v, want ErrTooLarge", err)
	}
	c.settle(nil)
	n1.r.startElection(true)
	c.settle(nil)
	c.settle(nil)

	data := func(tag byte, size int) []byte { return bytes.Repeat([]byte{tag}, size) }
	var want []string
	// Forwarded at the limit: committed normally first.
	p := n2.r.Propose(data('f', max))
	c.settle(nil)
	if _, err := waitProposal(t, p, "forwarded at the limit", 0, qreplicas(c)...); err != nil {
		t.Fatalf("forwarded proposal of %d bytes: %v", max, err)
	}
	want = append(want, string(data('f', max)))
	// Sizes at and just below the limit, accepted by node 3 only.
	for size := max - 8; size <= max; size++ {
		n1.r.Propose(data(byte('a'+size-(max-8)), size))
		want = append(want, string(data(byte('a'+size-(max-8)), size)))
	}
	n1.r.Poll(c.now)
	c.deliver(func(from, to rdma.NodeID) bool { return from == 1 && to == 3 })
	n3.r.Poll(c.now)
	if s := n3.r.Status(); s.Accepted.Cnt != 10 {
		t.Fatalf("node 3 accepted %v, want 10 entries of epoch (0,1)", s.Accepted)
	}
	if s := n2.r.Status(); s.Accepted.Cnt != 1 {
		t.Fatalf("node 2 accepted %v, want only the forwarded entry", s.Accepted)
	}
	c.crash(1, 0)
	n3.r.startElection(true)
	n2.r.startElection(false)
	for k := 0; k < 20 && n3.r.Status().Role != Leader; k++ {
		c.settle(not(1))
	}
	for k := 0; k < 5; k++ {
		c.settle(not(1))
	}
	if s := n3.r.Status(); s.Role != Leader {
		t.Fatalf("node 3 did not win: %+v", s)
	}
	if s := n2.r.Status(); s.Counters.DiffParts < 10 {
		t.Errorf("node 2 got its diff in %d parts, want one part per entry at the limit (10)", s.Counters.DiffParts)
	}
	for _, id := range []rdma.NodeID{2, 3} {
		got := c.delivered(id)
		if len(got) != len(want) {
			t.Fatalf("node %d delivered %d entries, want %d", id, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("node %d entry %d: %s", id, i+1, describe(got[i]))
			}
		}
	}
}

func describe(s string) string {
	if len(s) == 0 {
		return "empty"
	}
	return fmt.Sprintf("%d bytes of %q", len(s), s[0])
}
