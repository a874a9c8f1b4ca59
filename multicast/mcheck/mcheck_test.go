package mcheck

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func id(n uint64) MsgID { return MsgID{Client: 1, Seq: n} }

func set(gs ...uint32) uint64 {
	var d uint64
	for _, g := range gs {
		d |= 1 << g
	}
	return d
}

func res(g uint32, idx uint64) []byte { return fmt.Appendf(nil, "r%d.%d", g, idx) }

// hist plants a history: each group's sequence is delivered by replicas
// 0..replicas-1 (incarnation 1, consecutive indices, results res(g, idx)),
// and every message gets its replies. Tests then break it in one place.
type hist struct {
	t        *testing.T
	c        *Checker
	replicas int
	seqs     map[uint32][]MsgID
}

func newHist(t *testing.T, groups, replicas int) *hist {
	return &hist{t: t, c: New(groups), replicas: replicas, seqs: make(map[uint32][]MsgID)}
}

func (h *hist) multicast(n uint64, gs ...uint32) {
	h.t.Helper()
	if err := h.c.Multicast(id(n), set(gs...)); err != nil {
		h.t.Fatalf("Multicast: %v", err)
	}
}

// deliver has every replica of g deliver ids in order, after what g has.
func (h *hist) deliver(g uint32, ids ...uint64) {
	for _, n := range ids {
		h.seqs[g] = append(h.seqs[g], id(n))
		idx := uint64(len(h.seqs[g]))
		for r := 0; r < h.replicas; r++ {
			h.c.Deliver(g, uint32(r), 1, idx, id(n), res(g, idx))
		}
	}
}

// replyAll sends every reply the planted sequences imply.
func (h *hist) replyAll() {
	for g, seq := range h.seqs {
		for i, m := range seq {
			h.c.Reply(m, g, uint64(i)+1, res(g, uint64(i)+1))
		}
	}
}

func (h *hist) live() map[uint32][]uint32 {
	live := make(map[uint32][]uint32)
	for g := range h.c.groups {
		for r := 0; r < h.replicas; r++ {
			live[uint32(g)] = append(live[uint32(g)], uint32(r))
		}
	}
	return live
}

func (h *hist) final() error { return h.c.Final(FinalOptions{Live: h.live()}) }

// expectOnly asserts that err is a *Violation of p and that p is the only
// property the checker found violated.
func expectOnly(t *testing.T, c *Checker, err error, p Property) {
	t.Helper()
	var v *Violation
	if !errors.As(err, &v) {
		t.Fatalf("got %v; want a %s violation", err, p)
	}
	if v.Property != p {
		t.Fatalf("got %v; want a %s violation", err, p)
	}
	if !strings.HasPrefix(v.Error(), string(p)+": ") {
		t.Fatalf("Error() = %q; want it to start with %q", v.Error(), p)
	}
	expectProps(t, c, p)
}

// expectProps asserts the set of violated properties found so far.
func expectProps(t *testing.T, c *Checker, ps ...Property) {
	t.Helper()
	got := c.Stats().Violations
	var names []string
	for q := range got {
		names = append(names, string(q))
	}
	sort.Strings(names)
	want := make([]string, len(ps))
	for i, p := range ps {
		want[i] = string(p)
	}
	sort.Strings(want)
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("violated properties %v; want %v (violations: %v)", names, want, c.Violations())
	}
}

func TestValidHistory(t *testing.T) {
	h := newHist(t, 3, 3)
	h.multicast(1, 0, 1)
	h.multicast(2, 1, 2)
	h.multicast(3, 0, 2)
	h.multicast(4, 0, 1, 2)
	h.deliver(0, 1, 3, 4)
	h.deliver(1, 1, 2, 4)
	h.deliver(2, 2, 3, 4)
	h.replyAll()
	if err := h.final(); err != nil {
		t.Fatal(err)
	}
	s := h.c.Stats()
	if s.Messages != 4 || s.Deliveries != 27 || s.Replies != 9 || fmt.Sprint(s.GroupLen) != "[3 3 3]" || len(s.Violations) != 0 {
		t.Fatalf("Stats = %+v", s)
	}
}

func TestPrefixOrder(t *testing.T) {
	h := newHist(t, 2, 3)
	h.multicast(1, 0, 1)
	h.multicast(2, 0, 1)
	h.deliver(0, 1, 2)
	h.deliver(1, 2, 1)
	h.replyAll()
	err := h.final()
	var v *Violation
	if !errors.As(err, &v) || v.Property != UniformPrefixOrder {
		t.Fatalf("got %v; want a UniformPrefixOrder violation first", err)
	}
	// Two groups ordering two messages differently is also a cycle.
	expectProps(t, h.c, UniformPrefixOrder, AcyclicOrder)
	if !strings.Contains(v.Detail, "c1#1") || !strings.Contains(v.Detail, "c1#2") {
		t.Fatalf("Detail %q does not name both messages", v.Detail)
	}
}

func TestAcyclicOrderOnly(t *testing.T) {
	// m1 < m2 in g0, m2 < m3 in g1, m3 < m1 in g2: no two messages share
	// two groups, so prefix order holds, but the relation has a cycle.
	h := newHist(t, 3, 3)
	h.multicast(1, 0, 2)
	h.multicast(2, 0, 1)
	h.multicast(3, 1, 2)
	h.deliver(0, 1, 2)
	h.deliver(1, 2, 3)
	h.deliver(2, 3, 1)
	h.replyAll()
	err := h.final()
	expectOnly(t, h.c, err, AcyclicOrder)
	var v *Violation
	errors.As(err, &v)
	for _, s := range []string{"c1#1", "c1#2", "c1#3", "(g0)", "(g1)", "(g2)", "of 3 messages"} {
		if !strings.Contains(v.Detail, s) {
			t.Fatalf("Detail %q does not contain %q", v.Detail, s)
		}
	}
}

func TestAcyclicOrderLongCycle(t *testing.T) {
	// A cycle through 40 groups: m_i < m_{i+1} in group i, m_39 < m_0 in
	// group 39; the Detail is shortened.
	const n = 40
	h := newHist(t, n, 1)
	for i := uint64(0); i < n; i++ {
		h.multicast(i, uint32((i+n-1)%n), uint32(i))
	}
	for g := uint32(0); g < n; g++ {
		h.deliver(g, uint64(g), uint64((g+1)%n))
	}
	h.replyAll()
	err := h.final()
	expectOnly(t, h.c, err, AcyclicOrder)
	var v *Violation
	errors.As(err, &v)
	if !strings.Contains(v.Detail, "of 40 messages") || !strings.Contains(v.Detail, "(24 more)") || len(v.Detail) > 600 {
		t.Fatalf("Detail %q", v.Detail)
	}
}

func TestExactlyOnce(t *testing.T) {
	// A retried message ordered twice in g0.
	h := newHist(t, 1, 3)
	h.multicast(1, 0)
	h.multicast(1, 0) // the retry: fine
	h.multicast(2, 0)
	h.deliver(0, 1, 2)
	h.c.Reply(id(1), 0, 1, res(0, 1))
	h.c.Reply(id(2), 0, 2, res(0, 2))
	h.seqs[0] = append(h.seqs[0], id(1))
	var immediate error
	for r := uint32(0); r < 3; r++ {
		err := h.c.Deliver(0, r, 1, 3, id(1), res(0, 3))
		if r == 0 {
			immediate = err
		}
	}
	expectOnly(t, h.c, immediate, ExactlyOnce)
	expectOnly(t, h.c, h.final(), ExactlyOnce)
}

func TestIntegrityNotDestination(t *testing.T) {
	h := newHist(t, 2, 3)
	h.multicast(1, 0)
	h.multicast(2, 1)
	h.deliver(0, 1)
	err := h.c.Deliver(1, 0, 1, 1, id(1), res(1, 1)) // g1 is not m1's destination
	expectOnly(t, h.c, err, UniformIntegrity)
	h.seqs[1] = append(h.seqs[1], id(1))
	h.c.Deliver(1, 1, 1, 1, id(1), res(1, 1))
	h.c.Deliver(1, 2, 1, 1, id(1), res(1, 1))
	h.deliver(1, 2)
	h.c.Reply(id(1), 0, 1, res(0, 1))
	h.c.Reply(id(2), 1, 2, res(1, 2))
	expectOnly(t, h.c, h.final(), UniformIntegrity)
}

func TestIntegrityNeverMulticast(t *testing.T) {
	h := newHist(t, 1, 3)
	h.multicast(1, 0)
	h.deliver(0, 1)
	h.seqs[0] = append(h.seqs[0], id(9))
	for r := uint32(0); r < 3; r++ {
		if err := h.c.Deliver(0, r, 1, 2, id(9), res(0, 2)); err != nil {
			t.Fatalf("Deliver of a message not (yet) multicast: %v; want it left to Multicast or Final", err)
		}
	}
	h.c.Reply(id(1), 0, 1, res(0, 1))
	expectOnly(t, h.c, h.final(), UniformIntegrity)
}

func TestIntegrityMulticastRecordedLate(t *testing.T) {
	// Recorders race: the delivery in a non-destination is recorded before
	// the multicast, which then reports it.
	c := New(2)
	c.Deliver(1, 0, 1, 1, id(1), nil)
	err := c.Multicast(id(1), set(0))
	expectOnly(t, c, err, UniformIntegrity)
}

func TestIntegrityRedelivery(t *testing.T) {
	// Replica 2 delivers index 2 twice in one incarnation.
	h := newHist(t, 1, 3)
	h.multicast(1, 0)
	h.multicast(2, 0)
	h.deliver(0, 1, 2)
	err := h.c.Deliver(0, 2, 1, 2, id(2), res(0, 2))
	expectOnly(t, h.c, err, UniformIntegrity)
	// Another incarnation may deliver it again.
	if err := h.c.Deliver(0, 2, 2, 2, id(2), res(0, 2)); err != nil {
		t.Fatal(err)
	}
	h.replyAll()
	expectOnly(t, h.c, h.final(), UniformIntegrity)
}

func TestValidity(t *testing.T) {
	h := newHist(t, 2, 3)
	h.multicast(1, 0, 1)
	h.multicast(2, 0, 1)
	h.deliver(0, 1, 2)
	h.deliver(1, 1) // m2 never delivered in g1
	h.replyAll()
	err := h.final()
	expectOnly(t, h.c, err, Validity)
	var v *Violation
	errors.As(err, &v)
	if !strings.Contains(v.Detail, "c1#2") || !strings.Contains(v.Detail, "{1}") {
		t.Fatalf("Detail %q", v.Detail)
	}
	// A message whose client is not correct need not be delivered.
	err = h.c.Final(FinalOptions{Live: h.live(), Completed: func(m MsgID) bool { return m != id(2) }})
	if err != nil {
		t.Fatalf("Final with m2 not completed: %v", err)
	}
}

func TestAgreementReplicaBehind(t *testing.T) {
	h := newHist(t, 1, 3)
	h.multicast(1, 0)
	h.multicast(2, 0)
	h.multicast(3, 0)
	h.deliver(0, 1, 2)
	h.seqs[0] = append(h.seqs[0], id(3))
	h.c.Deliver(0, 0, 1, 3, id(3), res(0, 3))
	h.c.Deliver(0, 1, 1, 3, id(3), res(0, 3)) // replica 2 stops at 2
	h.replyAll()
	err := h.final()
	expectOnly(t, h.c, err, UniformAgreement)
	// Not live, replica 2 is not held to it.
	if err := h.c.Final(FinalOptions{Live: map[uint32][]uint32{0: {0, 1}}}); err != nil {
		t.Fatal(err)
	}
}

func TestAgreementHole(t *testing.T) {
	// Index 2 of g0 is never reported by anyone, though replicas restored
	// snapshots past it.
	h := newHist(t, 1, 2)
	h.multicast(1, 0)
	h.multicast(3, 0)
	h.deliver(0, 1)
	for r := uint32(0); r < 2; r++ {
		h.c.Restore(0, r, 2, 2)
		h.c.Deliver(0, r, 2, 3, id(3), res(0, 3))
	}
	h.c.Reply(id(1), 0, 1, res(0, 1))
	h.c.Reply(id(3), 0, 3, res(0, 3))
	err := h.final()
	expectOnly(t, h.c, err, UniformAgreement)
}

func TestRestore(t *testing.T) {
	h := newHist(t, 1, 3)
	h.multicast(1, 0)
	h.multicast(2, 0)
	h.multicast(3, 0)
	h.seqs[0] = []MsgID{id(1), id(2), id(3)}
	for i := uint64(1); i <= 3; i++ {
		h.c.Deliver(0, 0, 1, i, id(i), res(0, i))
	}
	// Replica 1 restarted and restored a snapshot through 3, delivering
	// nothing since: caught up only if the restore is reported.
	h.c.Deliver(0, 1, 1, 1, id(1), res(0, 1))
	// Replica 2 fell behind and caught up by snapshot in its incarnation.
	h.c.Deliver(0, 2, 1, 1, id(1), res(0, 1))
	if err := h.c.Restore(0, 2, 1, 2); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Deliver(0, 2, 1, 3, id(3), res(0, 3)); err != nil {
		t.Fatal(err)
	}
	h.replyAll()
	expectOnly(t, h.c, h.final(), UniformAgreement)
	h.c.Restore(0, 1, 2, 3)
	if err := h.final(); err != nil {
		t.Fatal(err)
	}
	// A snapshot behind what the incarnation delivered rolls it back.
	expectOnly(t, h.c, h.c.Restore(0, 0, 1, 1), UniformIntegrity)
}

func TestReplies(t *testing.T) {
	setup := func(t *testing.T) *hist {
		h := newHist(t, 2, 1)
		h.multicast(1, 0, 1)
		h.multicast(2, 0)
		h.deliver(0, 2, 1)
		h.deliver(1, 1)
		return h
	}
	t.Run("index", func(t *testing.T) {
		h := setup(t)
		h.c.Reply(id(2), 0, 1, res(0, 1))
		h.c.Reply(id(1), 1, 1, res(1, 1))
		err := h.c.Reply(id(1), 0, 1, res(0, 1)) // delivered at 2
		expectOnly(t, h.c, err, Replies)
		expectOnly(t, h.c, h.final(), Replies)
	})
	t.Run("result", func(t *testing.T) {
		h := setup(t)
		h.c.Reply(id(2), 0, 1, res(0, 1))
		h.c.Reply(id(1), 0, 2, res(0, 2))
		err := h.c.Reply(id(1), 1, 1, []byte("other"))
		expectOnly(t, h.c, err, Replies)
		expectOnly(t, h.c, h.final(), Replies)
	})
	t.Run("missing", func(t *testing.T) {
		h := setup(t)
		h.c.Reply(id(2), 0, 1, res(0, 1))
		h.c.Reply(id(1), 0, 2, res(0, 2))
		expectOnly(t, h.c, h.final(), Replies)
		if err := h.c.Final(FinalOptions{Live: h.live(), Completed: func(m MsgID) bool { return m == id(2) }}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("before delivery", func(t *testing.T) {
		// The reply is recorded first; the delivery contradicts it.
		c := New(1)
		c.Multicast(id(1), set(0))
		if err := c.Reply(id(1), 0, 2, nil); err != nil {
			t.Fatal(err)
		}
		expectOnly(t, c, c.Deliver(0, 0, 1, 1, id(1), nil), Replies)
	})
	t.Run("never delivered", func(t *testing.T) {
		c := New(1)
		c.Multicast(id(1), set(0))
		c.Reply(id(1), 0, 1, nil)
		err := c.Final(FinalOptions{Completed: func(MsgID) bool { return false }})
		expectOnly(t, c, err, Replies)
	})
	t.Run("retry differs", func(t *testing.T) {
		c := New(1)
		c.Multicast(id(1), set(0))
		c.Reply(id(1), 0, 1, []byte("a"))
		expectOnly(t, c, c.Reply(id(1), 0, 1, []byte("b")), Replies)
	})
}

func TestGroupOrder(t *testing.T) {
	t.Run("message", func(t *testing.T) {
		h := newHist(t, 1, 1)
		h.multicast(1, 0)
		h.multicast(2, 0)
		h.deliver(0, 1, 2)
		// Replica 1 delivers them the other way round.
		err := h.c.Deliver(0, 1, 1, 1, id(2), res(0, 1))
		expectOnly(t, h.c, err, GroupOrder)
		h.c.Deliver(0, 1, 1, 2, id(1), res(0, 2))
		h.replyAll()
		h.replicas = 2
		expectOnly(t, h.c, h.final(), GroupOrder)
		if n := h.c.Stats().Violations[GroupOrder]; n != 2 {
			t.Fatalf("%d GroupOrder violations; want 2", n)
		}
	})
	t.Run("result", func(t *testing.T) {
		h := newHist(t, 1, 2)
		h.multicast(1, 0)
		h.deliver(0, 1)
		err := h.c.Deliver(0, 2, 1, 1, id(1), []byte("diverged"))
		if v, ok := err.(*Violation); !ok || v.Property != GroupOrder {
			t.Fatalf("Deliver: %#v; want a *Violation itself", err)
		}
		expectOnly(t, h.c, err, GroupOrder)
		h.replyAll()
		expectOnly(t, h.c, h.final(), GroupOrder)
	})
}

func TestMisuse(t *testing.T) {
	c := New(2)
	if err := c.Multicast(id(1), set(0)); err != nil {
		t.Fatal(err)
	}
	errs := []error{
		c.Multicast(id(1), set(0, 1)), // another dst
		c.Multicast(id(2), 0),
		c.Multicast(id(3), set(2)),
		c.Deliver(2, 0, 1, 1, id(1), nil),
		c.Deliver(0, 0, 1, 0, id(1), nil),
		c.Deliver(0, 0, 1, 1<<40, id(1), nil),
		c.Reply(id(1), 5, 1, nil),
		c.Restore(3, 0, 1, 1),
	}
	for i, err := range errs {
		var v *Violation
		if err == nil || errors.As(err, &v) {
			t.Errorf("misuse %d: got %v; want a non-Violation error", i, err)
		}
	}
	c.Deliver(0, 0, 1, 1, id(1), nil)
	c.Reply(id(1), 0, 1, nil)
	err := c.Final(FinalOptions{Live: map[uint32][]uint32{7: {0}}})
	var v *Violation
	if err == nil || errors.As(err, &v) || !strings.Contains(err.Error(), "earlier to {0}") || !strings.Contains(err.Error(), "Live names group 7") {
		t.Fatalf("Final: %v; want the misuse errors and no violation", err)
	}
	if s := c.Stats(); s.Misuse != len(errs) {
		t.Fatalf("Stats.Misuse = %d; want %d", s.Misuse, len(errs))
	}
}

// event is one recorder call of a generated history.
type event struct {
	kind  byte // 'm' Multicast, 'd' Deliver, 'r' Reply, 's' Restore
	g, r  uint32
	inc   int
	idx   uint64
	id    MsgID
	dst   uint64
	res   []byte
	lives bool // a Deliver or Restore of a replica live at the end
}

func (e *event) apply(c *Checker) error {
	switch e.kind {
	case 'm':
		return c.Multicast(e.id, e.dst)
	case 'd':
		return c.Deliver(e.g, e.r, e.inc, e.idx, e.id, e.res)
	case 'r':
		return c.Reply(e.id, e.g, e.idx, e.res)
	default:
		return c.Restore(e.g, e.r, e.inc, e.idx)
	}
}

// genHistory generates a valid random history: one global sequence of
// messages, each group delivering the subsequence destined to it; replicas
// at random prefixes, restarting with snapshots (reported by Restore or
// not) or catching up by one within an incarnation, some of them down at
// the end; clients crashing (their messages delivered everywhere or
// nowhere, replies partial), retrying multicasts and replies. Every
// multicast comes first; the other recorders are interleaved at random, so
// replies often precede the deliveries they name. It returns the events
// and the Final options.
func genHistory(rng *rand.Rand, groups, replicas, nmsgs int) ([]event, FinalOptions) {
	type msg struct {
		id       MsgID
		dst      uint64
		lost     bool // never delivered (its client crashed)
		complete bool
	}
	msgs := make([]msg, nmsgs)
	seqs := make([][]int, groups)
	seqNo := make(map[uint64]uint64)
	for i := range msgs {
		cl := rng.Uint64N(8)
		seqNo[cl]++
		m := msg{id: MsgID{cl, seqNo[cl]}}
		for m.dst == 0 {
			m.dst = rng.Uint64() & (1<<groups - 1)
			if rng.IntN(2) == 0 { // mostly one or two groups
				m.dst &= -m.dst
			}
		}
		m.lost = rng.IntN(20) == 0
		m.complete = !m.lost && rng.IntN(10) != 0
		msgs[i] = m
		if !m.lost {
			for g := range groups {
				if m.dst&(1<<g) != 0 {
					seqs[g] = append(seqs[g], i)
				}
			}
		}
	}
	result := func(g int, idx uint64, m MsgID) []byte {
		return fmt.Appendf(nil, "%d/%d/%v", g, idx, m)
	}

	var out []event
	for _, m := range msgs {
		out = append(out, event{kind: 'm', id: m.id, dst: m.dst})
	}
	// Streams of recorder calls, interleaved at random below.
	var streams [][]event
	live := make(map[uint32][]uint32)
	for g := range groups {
		L := uint64(len(seqs[g]))
		for r := range uint32(replicas) {
			var s []event
			inc, next := 1, uint64(1)
			isLive := r == 0 || rng.IntN(4) != 0
			stops := 0
			if r != 0 { // replica 0 delivers every index once: no holes
				stops = rng.IntN(3)
			}
			for k := 0; k <= stops; k++ {
				end := L
				if k < stops || !isLive {
					end = next - 1 + rng.Uint64N(L-next+2)
				}
				for ; next <= end; next++ {
					m := msgs[seqs[g][next-1]].id
					s = append(s, event{kind: 'd', g: uint32(g), r: r, inc: inc, idx: next, id: m, res: result(g, next, m), lives: isLive})
				}
				if k == stops {
					break
				}
				// A restart, or a catch-up by snapshot within the incarnation.
				restart := rng.IntN(2) == 0
				at := next - 1 + rng.Uint64N(L-next+2)
				if restart {
					inc++
					at = rng.Uint64N(L + 1)
				}
				if !restart || rng.IntN(2) == 0 || at == L {
					s = append(s, event{kind: 's', g: uint32(g), r: r, inc: inc, idx: at, lives: isLive})
				} // else an unreported snapshot: the incarnation starts later
				next = at + 1
			}
			if isLive {
				live[uint32(g)] = append(live[uint32(g)], r)
			}
			streams = append(streams, s)
		}
	}
	// Replies: one client stream per message.
	for _, m := range msgs {
		if m.lost {
			continue
		}
		var s []event
		for g := range groups {
			if m.dst&(1<<g) == 0 || (!m.complete && rng.IntN(2) == 0) {
				continue
			}
			var idx uint64
			for i, mi := range seqs[g] {
				if msgs[mi].id == m.id {
					idx = uint64(i) + 1
				}
			}
			for range 1 + rng.IntN(2) {
				s = append(s, event{kind: 'r', g: uint32(g), idx: idx, id: m.id, res: result(g, idx, m.id)})
			}
			if rng.IntN(10) == 0 {
				s = append(s, event{kind: 'm', id: m.id, dst: m.dst}) // a retry
			}
		}
		streams = append(streams, s)
	}
	nonEmpty := streams[:0]
	for _, s := range streams {
		if len(s) > 0 {
			nonEmpty = append(nonEmpty, s)
		}
	}
	streams = nonEmpty
	for len(streams) > 0 {
		i := rng.IntN(len(streams))
		out = append(out, streams[i][0])
		if streams[i] = streams[i][1:]; len(streams[i]) == 0 {
			streams[i] = streams[len(streams)-1]
			streams = streams[:len(streams)-1]
		}
	}
	complete := make(map[MsgID]bool)
	for _, m := range msgs {
		complete[m.id] = m.complete
	}
	return out, FinalOptions{Live: live, Completed: func(id MsgID) bool { return complete[id] }}
}

func record(c *Checker, evs []event) {
	for i := range evs {
		evs[i].apply(c)
	}
}

func TestRandomValidHistories(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	var restores, restarts, early int
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 0x6d636865636b))
		groups := 1 + rng.IntN(6)
		evs, opts := genHistory(rng, groups, 1+rng.IntN(3), rng.IntN(120))
		c := New(groups)
		delivered := make(map[[2]uint64]bool)
		for _, e := range evs {
			if err := e.apply(c); err != nil {
				t.Fatalf("seed %d: %c %+v: %v", seed, e.kind, e, err)
			}
			switch e.kind {
			case 's':
				restores++
			case 'd':
				delivered[[2]uint64{uint64(e.g), e.idx}] = true
				if e.inc > 1 {
					restarts++
				}
			case 'r':
				if !delivered[[2]uint64{uint64(e.g), e.idx}] {
					early++
				}
			}
		}
		if err := c.Final(opts); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if v := c.Violations(); len(v) != 0 {
			t.Fatalf("seed %d: violations %v", seed, v)
		}
	}
	// The generator exercises what it claims to.
	if restores == 0 || restarts == 0 || early == 0 {
		t.Fatalf("%d restores, %d deliveries after a restart, %d replies before their delivery: want all > 0", restores, restarts, early)
	}
}

// TestRandomHistoryMutations breaks valid random histories in one place and
// checks the checker reports exactly the properties that broke.
func TestRandomHistoryMutations(t *testing.T) {
	type mutation struct {
		name string
		want []Property
		// mutate edits evs (valid, recorded in order) and returns them, or
		// nil if the history offers no place for it.
		mutate func(rng *rand.Rand, evs []event, opts FinalOptions) []event
	}
	pick := func(rng *rand.Rand, evs []event, ok func(i int) bool) int {
		var is []int
		for i := range evs {
			if ok(i) {
				is = append(is, i)
			}
		}
		if len(is) == 0 {
			return -1
		}
		return is[rng.IntN(len(is))]
	}
	// firstAt reports whether evs[i], a delivery, is the first report of
	// its (group, index).
	firstAt := func(evs []event, i int) bool {
		for j := range i {
			if evs[j].kind == 'd' && evs[j].g == evs[i].g && evs[j].idx == evs[i].idx {
				return false
			}
		}
		return true
	}
	// appendToGroup has every live replica of g deliver m at g's next index.
	appendToGroup := func(evs []event, opts FinalOptions, g uint32, m MsgID) []event {
		var n uint64
		latest := make(map[uint32]int)
		for _, e := range evs {
			if (e.kind == 'd' || e.kind == 's') && e.g == g {
				n = max(n, e.idx)
				latest[e.r] = max(latest[e.r], e.inc)
			}
		}
		for _, r := range opts.Live[g] {
			evs = append(evs, event{kind: 'd', g: g, r: r, inc: latest[r], idx: n + 1, id: m})
		}
		return evs
	}
	mutations := []mutation{
		{"reply result", []Property{Replies}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'r' })
			if i < 0 {
				return nil
			}
			evs[i].res = []byte("wrong")
			return evs
		}},
		{"reply index", []Property{Replies}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'r' })
			if i < 0 {
				return nil
			}
			evs[i].idx++
			return evs
		}},
		{"redelivery", []Property{UniformIntegrity}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'd' })
			if i < 0 {
				return nil
			}
			return append(evs[:i+1], append([]event{evs[i]}, evs[i+1:]...)...)
		}},
		{"replica result", []Property{GroupOrder}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'd' && !firstAt(evs, i) })
			if i < 0 {
				return nil
			}
			evs[i].res = []byte("diverged")
			return evs
		}},
		{"replica message", []Property{GroupOrder}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'd' && !firstAt(evs, i) })
			if i < 0 {
				return nil
			}
			j := pick(rng, evs, func(j int) bool { return evs[j].kind == 'd' && evs[j].g == evs[i].g && evs[j].id != evs[i].id })
			if j < 0 {
				return nil
			}
			evs[i].id = evs[j].id
			return evs
		}},
		{"live replica behind", []Property{UniformAgreement}, func(rng *rand.Rand, evs []event, _ FinalOptions) []event {
			// Replica 0 of a group delivers every index and never restores:
			// drop its last delivery, one another replica reported too (else
			// the message would be lost, not just late).
			i := pick(rng, evs, func(i int) bool {
				if evs[i].kind != 'd' || evs[i].r != 0 {
					return false
				}
				other := false
				for j, e := range evs {
					if j > i && e.kind == 'd' && e.g == evs[i].g && e.r == 0 {
						return false
					}
					other = other || e.kind == 'd' && e.g == evs[i].g && e.idx == evs[i].idx && e.r != 0
				}
				return other
			})
			if i < 0 {
				return nil
			}
			return append(evs[:i], evs[i+1:]...)
		}},
		{"message lost in a group", []Property{Validity, UniformAgreement}, func(rng *rand.Rand, evs []event, opts FinalOptions) []event {
			// Not the group's last message: its index becomes a hole.
			i := pick(rng, evs, func(i int) bool {
				if evs[i].kind != 'd' || !opts.Completed(evs[i].id) {
					return false
				}
				for _, e := range evs {
					if e.kind == 'd' && e.g == evs[i].g && e.idx > evs[i].idx {
						return true
					}
				}
				return false
			})
			if i < 0 {
				return nil
			}
			g, m := evs[i].g, evs[i].id
			out := evs[:0]
			for _, e := range evs {
				if (e.kind == 'd' || e.kind == 'r') && e.g == g && e.id == m {
					continue
				}
				out = append(out, e)
			}
			return out
		}},
		{"ordered twice", []Property{ExactlyOnce}, func(rng *rand.Rand, evs []event, opts FinalOptions) []event {
			i := pick(rng, evs, func(i int) bool { return evs[i].kind == 'd' })
			if i < 0 {
				return nil
			}
			return appendToGroup(evs, opts, evs[i].g, evs[i].id)
		}},
		{"not a destination", []Property{UniformIntegrity}, func(rng *rand.Rand, evs []event, opts FinalOptions) []event {
			// A new message, to one group, delivered (only) in another.
			g := uint32(rng.IntN(len(opts.Live)))
			m := MsgID{1000, 1}
			evs = append(evs, event{kind: 'm', id: m, dst: 1 << ((g + 1) % uint32(len(opts.Live)))})
			return appendToGroup(evs, opts, g, m)
		}},
		{"never multicast", []Property{UniformIntegrity}, func(rng *rand.Rand, evs []event, opts FinalOptions) []event {
			return appendToGroup(evs, opts, uint32(rng.IntN(len(opts.Live))), MsgID{1000, 2})
		}},
	}
	for _, mu := range mutations {
		t.Run(mu.name, func(t *testing.T) {
			applied := 0
			for seed := range uint64(40) {
				rng := rand.New(rand.NewPCG(seed, 1))
				evs, opts := genHistory(rng, 3, 3, 20+rng.IntN(30))
				// Every group has live replicas (replica 0): len(Live) is
				// the group count.
				evs = mu.mutate(rng, evs, opts)
				if evs == nil {
					continue
				}
				applied++
				c := New(3)
				record(c, evs)
				err := c.Final(opts)
				var v *Violation
				if !errors.As(err, &v) {
					t.Fatalf("seed %d: Final: %v; want a violation", seed, err)
				}
				expectProps(t, c, mu.want...)
			}
			if applied < 20 {
				t.Fatalf("applied to %d of 40 histories", applied)
			}
		})
	}
}

func TestConcurrentRecording(t *testing.T) {
	const groups, replicas, n = 4, 3, 500
	c := New(groups)
	dst := func(i uint64) uint64 { return 1<<(i%groups) | 1<<((i/groups)%groups) }
	for i := range uint64(n) {
		c.Multicast(MsgID{i % 7, i}, dst(i))
	}
	// One global order: message i; group g's sequence is the subsequence.
	idx := make([][]uint64, n)
	var lens [groups]uint64
	for i := range n {
		for g := range groups {
			if dst(uint64(i))&(1<<g) != 0 {
				lens[g]++
				idx[i] = append(idx[i], uint64(g)<<32|lens[g])
			}
		}
	}
	var wg sync.WaitGroup
	for g := range uint32(groups) {
		for r := range uint32(replicas) {
			wg.Go(func() {
				for i := range uint64(n) {
					for _, p := range idx[i] {
						if uint32(p>>32) == g {
							if err := c.Deliver(g, r, 1, p&(1<<32-1), MsgID{i % 7, i}, nil); err != nil {
								t.Error(err)
							}
						}
					}
				}
			})
		}
	}
	wg.Go(func() {
		for i := range uint64(n) {
			for _, p := range idx[i] {
				if err := c.Reply(MsgID{i % 7, i}, uint32(p>>32), p&(1<<32-1), nil); err != nil {
					t.Error(err)
				}
			}
		}
	})
	wg.Wait()
	live := map[uint32][]uint32{}
	for g := range uint32(groups) {
		live[g] = []uint32{0, 1, 2}
	}
	if err := c.Final(FinalOptions{Live: live}); err != nil {
		t.Fatal(err)
	}
}

// TestScale checks a valid history of ~200k deliveries and then the same
// with a cycle planted at its end, in well under the test timeout.
func TestScale(t *testing.T) {
	const groups, replicas, n = 8, 3, 40000
	rng := rand.New(rand.NewPCG(7, 7))
	start := time.Now()
	c := New(groups)
	var lens [groups]uint64
	live := map[uint32][]uint32{}
	for g := range uint32(groups) {
		live[g] = []uint32{0, 1, 2}
	}
	for i := range uint64(n) {
		m := MsgID{i % 64, i}
		d := uint64(1) << rng.IntN(groups)
		d |= 1 << rng.IntN(groups)
		c.Multicast(m, d)
		for g := range uint32(groups) {
			if d&(1<<g) == 0 {
				continue
			}
			lens[g]++
			for r := range uint32(replicas) {
				c.Deliver(g, r, 1, lens[g], m, nil)
			}
			c.Reply(m, g, lens[g], nil)
		}
	}
	if err := c.Final(FinalOptions{Live: live}); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if s.Deliveries < 200000 {
		t.Fatalf("%d deliveries; want >= 200000", s.Deliveries)
	}
	// A three-group cycle at the end.
	a, b, e := MsgID{100, 1}, MsgID{100, 2}, MsgID{100, 3}
	c.Multicast(a, set(0, 2))
	c.Multicast(b, set(0, 1))
	c.Multicast(e, set(1, 2))
	for _, d := range []struct {
		g uint32
		m MsgID
	}{{0, a}, {0, b}, {1, b}, {1, e}, {2, e}, {2, a}} {
		lens[d.g]++
		for r := range uint32(replicas) {
			c.Deliver(d.g, r, 1, lens[d.g], d.m, nil)
		}
		c.Reply(d.m, d.g, lens[d.g], nil)
	}
	expectOnly(t, c, c.Final(FinalOptions{Live: live}), AcyclicOrder)
	t.Logf("%d deliveries, two Finals: %v", s.Deliveries, time.Since(start))
}

func TestViolationCap(t *testing.T) {
	// A systematic bug: replica 1 is one index off for 1200 indices.
	const n = 1200
	c := New(1)
	for i := uint64(1); i <= n+1; i++ {
		c.Multicast(id(i), set(0))
		c.Deliver(0, 0, 1, i, id(i), nil)
		c.Reply(id(i), 0, i, nil)
	}
	for i := uint64(1); i <= n; i++ {
		c.Deliver(0, 1, 1, i, id(i+1), nil)
	}
	c.Deliver(0, 1, 1, n+1, id(n+1), nil)
	err := c.Final(FinalOptions{Live: map[uint32][]uint32{0: {0, 1}}})
	expectOnly(t, c, err, GroupOrder)
	if got := c.Stats().Violations[GroupOrder]; got != n {
		t.Fatalf("%d GroupOrder violations counted; want %d", got, n)
	}
	if got := len(c.Violations()); got != maxKept {
		t.Fatalf("%d violations kept; want %d", got, maxKept)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("%d more violations", n-20)) {
		t.Fatalf("Final error does not count the violations it leaves out: ...%s", err.Error()[len(err.Error())-200:])
	}
}
