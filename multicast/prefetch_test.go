package multicast

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
)

// prefetchFSM is a traceFSM that prefetches batches.
type prefetchFSM struct{ traceFSM }

func (f prefetchFSM) Prefetch(p []byte) { *f.log = append(*f.log, fmt.Sprintf("prefetch %s", p)) }

// TestBatchPrefetch: an application that is a BatchPrefetcher gets
// Prefetch for each message of a batch entry destined to the group, in
// order, before BeginBatch (a duplicate included, a message passing
// through to a child not), then the batch is applied as without it; a
// plain message entry gets no Prefetch; an application that is not a
// BatchFSM gets none.
func TestBatchPrefetch(t *testing.T) {
	var log []string
	s := fuzzState(t)
	tr, err := tree.Parse("0:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{Group: 0, Tree: tr, Members: [][]rdma.NodeID{{1}, {2}}, ClientNodes: []rdma.NodeID{9},
		ClientSlots: 2, ParentSlots: 4, SlotSize: 128, MaxResult: 16}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if newState(&cfg, traceFSM{log: &log}, new(testingKnobs)).preApp != nil {
		t.Fatal("a BatchFSM without Prefetch was taken for a BatchPrefetcher")
	}
	app := prefetchFSM{traceFSM{log: &log}}
	if st := newState(&cfg, app, new(testingKnobs)); st.preApp == nil {
		t.Fatal("a BatchPrefetcher was not recognised")
	}
	s.app, s.batchApp, s.preApp = app, app, app
	s.onReply = func(c uint32, slot int) { log = append(log, fmt.Sprintf("reply c%d", c)) }
	s.reset(0, 1, Addr{Node: 9, Region: 1})
	s.reset(1, 1, Addr{Node: 9, Region: 2})
	msg := func(c uint32, pos uint64, dst tree.Set, p string) batchMsg {
		m := batchMsg{src: srcClient, client: c, pos: pos,
			rec: record{pos: pos, id: MsgID{Client: c, Inc: 1, Seq: pos}, dst: dst, payload: []byte(p)}}
		if dst.Has(1) {
			m.fwd = []uint64{s.out[0] + 1}
		}
		return m
	}
	check := func(step string, want ...string) {
		t.Helper()
		if !slices.Equal(log, want) {
			t.Fatalf("%s: calls %q, want %q", step, log, want)
		}
		log = log[:0]
	}
	s.Apply(entryOf(encodeBatch([]batchMsg{msg(0, 1, tree.Of(0), "a"), msg(1, 1, tree.Of(1), "b"), msg(0, 2, tree.Of(0, 1), "c")})))
	check("batch of 3, one passing through", "prefetch a", "prefetch c", "begin", "apply 1", "apply 2", "end", "reply c0", "reply c0")
	m := msg(0, 3, tree.Of(0), "d")
	s.Apply(entryOf(appendMessageEntry(nil, m.src, m.client, m.pos, m.fwd, &m.rec)))
	check("message entry", "apply 3", "reply c0")
	s.Apply(entryOf(encodeBatch([]batchMsg{msg(0, 3, tree.Of(0), "d"), msg(0, 4, tree.Of(0), "e")})))
	check("batch with a duplicate", "prefetch d", "prefetch e", "begin", "apply 4", "end", "reply c0")
}
