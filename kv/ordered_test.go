package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/kv/opwire"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/rdma/mem"
)

// The ordered request format and results are kv's op encoding and result
// layout: the constants btree keeps must be kv's, and kv decodes btree's
// write results.
func TestOrderedSharesEncoding(t *testing.T) {
	for _, c := range [][2]int{
		{OrderedFormat, btree.RequestFormat},
		{OpPut, btree.OpPut}, {OpDelete, btree.OpDelete}, {OpMerge, btree.OpMerge},
		{CmpNone, btree.CmpNone}, {CmpVersion, btree.CmpVersion}, {CmpValue, btree.CmpValue}, {CmpExists, btree.CmpExists},
		{StatusOK, btree.StatusOK}, {StatusCondFailed, btree.StatusCondFailed}, {StatusMalformed, btree.StatusMalformed},
		{StatusRefused, btree.StatusRefused}, {StatusMoved, btree.StatusMoved}, {StatusMixed, btree.StatusMixed},
		{LimitKey, btree.LimitKey}, {LimitValue, btree.LimitValue}, {LimitHeap, btree.LimitHeap},
		{opwire.OpHdr, 24}, {opwire.ReqHdr, 4}, {resSize, 24},
	} {
		if c[0] != c[1] {
			t.Fatalf("kv's %d is btree's %d", c[0], c[1])
		}
	}
	ops := []Op{{Kind: OpPut, Cmp: CmpValue, Key: []byte("k"), Value: []byte("v"), CmpValue: []byte("old")}, {Kind: OpDelete, Key: []byte("j")}}
	kvReq := AppendRequest(nil, ops)
	bReq := btree.AppendRequest(nil, []btree.Op{{Kind: btree.OpPut, Cmp: btree.CmpValue, Key: []byte("k"), Value: []byte("v"), CmpValue: []byte("old")}, {Kind: btree.OpDelete, Key: []byte("j")}})
	if !bytes.Equal(kvReq[1:], bReq[1:]) || bReq[0] != OrderedFormat {
		t.Fatalf("kv encodes %x, btree %x", kvReq, bReq)
	}
	for _, r := range []btree.Result{{Status: btree.StatusOK, Count: 2, Version: 7 << 16, Prev: 3}, {Status: btree.StatusMoved, FailedOp: 1},
		{Status: btree.StatusMixed}, {Status: btree.StatusRefused, Limit: btree.LimitHeap, Max: 10, Size: 11}} {
		got, err := DecodeResult(btree.AppendResult(nil, &r))
		if err != nil || got.Status != r.Status || got.FailedOp != r.FailedOp || got.Count != r.Count || got.Version != r.Version || got.Limit != r.Limit || got.Max != r.Max {
			t.Fatalf("btree's %+v decodes in kv as %+v, %v", r, got, err)
		}
	}
}

func orderedTable(t *testing.T, tablets []btree.Tablet) (*Table, *btree.Store) {
	t.Helper()
	f := mem.New(mem.Options{})
	n1, _ := f.NewNode(1)
	st, err := btree.NewStore(btree.StoreConfig{Tree: btree.Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 8, Tablets: tablets}, n1)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := NewTable(TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, Ordered: st}, n1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close(); st.Close(); n1.Close() })
	return tb, st
}

func orderedPut(tb *Table, idx uint64, k, v string) {
	tb.Apply(broadcast.Entry{Index: idx, Data: btree.AppendRequest(nil, []btree.Op{{Kind: btree.OpPut, Key: []byte(k), Value: []byte(v)}})})
}

// A table routes ordered requests to its ordered part, publishes the
// part's header outside batches and at EndBatch, and refuses them as
// malformed without one.
func TestTableRoutesOrdered(t *testing.T) {
	tb, st := orderedTable(t, []btree.Tablet{btree.All})
	orderedPut(tb, 3, "b", "1")
	put(tb, 4, Op{Kind: OpPut, Key: []byte("h"), Value: []byte("x")})
	if st.Tree().Len() != 1 || tb.Len() != 1 {
		t.Fatalf("%d ordered keys, %d hashed", st.Tree().Len(), tb.Len())
	}
	hd, _, err := st.Regions().Local()
	if err != nil || hd.Applied != 3 {
		t.Fatalf("ordered header after an ordered request outside a batch: %+v, %v", hd, err)
	}
	tb.BeginBatch()
	orderedPut(tb, 5, "c", "1")
	if hd, _, _ := st.Regions().Local(); hd.Applied != 3 {
		t.Fatalf("ordered header published inside a batch: %+v", hd)
	}
	put(tb, 6, Op{Kind: OpPut, Key: []byte("i"), Value: []byte("x")})
	tb.EndBatch()
	if hd, _, _ := st.Regions().Local(); hd.Applied != 6 {
		t.Fatalf("ordered header after EndBatch: %+v", hd)
	}
	plain, _ := soloTable(t, TableConfig{})
	r, _ := DecodeResult(plain.Apply(broadcast.Entry{Index: 1, Data: btree.AppendRequest(nil, []btree.Op{{Kind: btree.OpPut, Key: []byte("k")}})}))
	if r.Status != StatusMalformed {
		t.Fatalf("an ordered request to a table without an ordered part: %+v", r)
	}
}

// The ordered section travels in the table's snapshot: a restore into
// another table replaces both parts; a section the ordered part refuses
// fails the restore and leaves both parts as they were; a table without
// an ordered part refuses a snapshot carrying one.
func TestSnapshotCarriesOrdered(t *testing.T) {
	src, sst := orderedTable(t, []btree.Tablet{btree.All})
	for i := range 50 {
		orderedPut(src, uint64(i+1), fmt.Sprintf("o%02d", i), "value")
	}
	put(src, 60, Op{Kind: OpPut, Key: []byte("h"), Value: []byte("x")})
	snap := snapshotOf(t, src)

	dst, dsto := orderedTable(t, []btree.Tablet{btree.All})
	orderedPut(dst, 1, "zzz", "old")
	if err := dst.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if err := dsto.Tree().Check(); err != nil {
		t.Fatal(err)
	}
	if dsto.Tree().Len() != 50 || dst.Len() != 1 {
		t.Fatalf("restored %d ordered keys, %d hashed", dsto.Tree().Len(), dst.Len())
	}
	if _, ok := dsto.Tree().Get([]byte("zzz")); ok {
		t.Fatal("the restore kept an ordered key the snapshot lacks")
	}
	if hd, _, _ := dsto.Regions().Local(); hd.Applied != 60 {
		t.Fatalf("restored ordered header %+v", hd)
	}
	if !bytes.Equal(sst.Snapshot(), dsto.Snapshot()) {
		t.Fatal("restored ordered section differs")
	}

	// A section the part refuses (a key out of order): nothing changes.
	bad := bytes.Clone(snap)
	i := bytes.Index(bad, []byte("o01"))
	copy(bad[i:], "o99")
	before := snapshotOf(t, dst)
	if err := dst.Restore(bad); err == nil {
		t.Fatal("a section with keys out of order restored")
	}
	if !bytes.Equal(snapshotOf(t, dst), before) {
		t.Fatal("a refused restore changed the table")
	}

	plain, _ := soloTable(t, TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
	if err := plain.Restore(snap); err == nil {
		t.Fatal("a table without an ordered part restored an ordered section")
	}
}

// TestOrderedRemoteScan: a reader on another node scans the ordered part
// one-sided (btree.Remote: the published header, then the leaves through
// its cache at the header's applied index) after each batch of ordered
// requests and after a restore that replaced the tree under its cache, and
// gets exactly the replica's entries.
func TestOrderedRemoteScan(t *testing.T) {
	f := mem.New(mem.Options{})
	n1, _ := f.NewNode(1)
	n2, _ := f.NewNode(2)
	defer n2.Close()
	st, err := btree.NewStore(btree.StoreConfig{Tree: btree.Config{NodeSize: 256, MaxKey: 8}, ChunkSlots: 8, FreeAfter: 4,
		Tablets: []btree.Tablet{btree.All}, Readers: []rdma.NodeID{2}}, n1)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := NewTable(TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10, Ordered: st, Readers: []rdma.NodeID{2}}, n1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { tb.Close(); st.Close(); n1.Close() }()
	conn, err := n2.Connect(1)
	if err != nil {
		t.Fatal(err)
	}
	rem := btree.NewRemote(conn, 0)
	cache := btree.NewCache(64 << 10)
	check := func(when string) {
		t.Helper()
		var want []btree.KV
		st.Tree().Ascend(nil, func(k, v []byte) bool {
			want = append(want, btree.KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
			return true
		})
		var got []btree.KV
		var err error
		for range 8 { // a stale cached node costs a retry (one level dropped), never an answer
			hd, herr := rem.Header()
			if herr != nil {
				t.Fatalf("%s: header: %v", when, herr)
			}
			if got, _, err = cache.Scan(rem.Read, hd.Root, hd.Applied, nil, nil, 0, nil); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: one-sided scan: %v", when, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: one-sided scan found %d keys, the replica holds %d", when, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) {
				t.Fatalf("%s: pair %d: %q=%q, the replica holds %q=%q", when, i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
			}
		}
	}
	idx := uint64(0)
	for round := range 30 {
		tb.BeginBatch()
		for j := range 5 {
			idx++
			k := fmt.Sprintf("k%03d", (round*7+j*13)%120)
			if j == 4 && round%3 == 0 {
				tb.Apply(broadcast.Entry{Index: idx, Data: btree.AppendRequest(nil, []btree.Op{{Kind: btree.OpDelete, Key: []byte(k)}})})
				continue
			}
			orderedPut(tb, idx, k, fmt.Sprintf("v%d", idx))
		}
		tb.EndBatch()
		check(fmt.Sprintf("after batch %d", round))
	}
	// Restore another replica's state under the reader's cache.
	src, _ := orderedTable(t, []btree.Tablet{btree.All})
	for i := range 80 {
		orderedPut(src, uint64(i+1), fmt.Sprintf("r%03d", i), "restored")
	}
	if err := tb.Restore(snapshotOf(t, src)); err != nil {
		t.Fatal(err)
	}
	check("after a restore")
}

// TestRestoreVersion1: a replica of this release restores the snapshot a
// replica of the previous one serves during a rolling upgrade (version 1:
// no ordered section length), as a table with an empty ordered part; a
// version 1 snapshot with bytes after its staged requests is refused.
func TestRestoreVersion1(t *testing.T) {
	src, _ := soloTable(t, TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
	for i := range 20 {
		put(src, uint64(i+1), Op{Kind: OpPut, Key: fmt.Appendf(nil, "h%02d", i), Value: []byte("v")})
	}
	snap := snapshotOf(t, src)
	// A version 2 snapshot without an ordered part ends with its zero
	// ordered length; version 1 is the same bytes without it.
	if binary.LittleEndian.Uint64(snap[len(snap)-8:]) != 0 {
		t.Fatal("the snapshot does not end with a zero ordered length")
	}
	v1 := bytes.Clone(snap[:len(snap)-8])
	binary.LittleEndian.PutUint64(v1, snapMagicV1)

	dst, dsto := orderedTable(t, []btree.Tablet{btree.All})
	orderedPut(dst, 1, "zzz", "old")
	if err := dst.Restore(v1); err != nil {
		t.Fatalf("restore a version 1 snapshot: %v", err)
	}
	if dst.Len() != 20 || dsto.Tree().Len() != 0 {
		t.Fatalf("restored %d hashed keys and %d ordered, want 20 and 0", dst.Len(), dsto.Tree().Len())
	}
	plain, _ := soloTable(t, TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10})
	if err := plain.Restore(v1); err != nil || plain.Len() != 20 {
		t.Fatalf("restore a version 1 snapshot into a table without an ordered part: %v, %d keys", err, plain.Len())
	}
	if err := plain.Restore(append(bytes.Clone(v1), make([]byte, 8)...)); err == nil {
		t.Fatal("a version 1 snapshot with trailing bytes restored")
	}
}

// A table's Stats carry its ordered part's size and work: the keys, the
// live nodes, the leaves' bytes and the requests, writes and inserts
// applied; a table without an ordered part reports none.
func TestTableStatsOrdered(t *testing.T) {
	tb, _ := orderedTable(t, []btree.Tablet{btree.All})
	idx := uint64(2)
	for i := range 40 {
		idx++
		orderedPut(tb, idx, fmt.Sprintf("k%03d", i), "v")
	}
	idx++
	orderedPut(tb, idx, "k000", "w") // an overwrite: a write, not an insert
	o := tb.Stats().Ordered
	switch {
	case o == nil:
		t.Fatal("no ordered stats")
	case o.Keys != 40 || o.Requests != 41 || o.Writes != 41 || o.Inserts != 40:
		t.Fatalf("keys %d, requests %d, writes %d, inserts %d; want 40, 41, 41, 40", o.Keys, o.Requests, o.Writes, o.Inserts)
	case o.Leaves < 2 || o.LeafSplits == 0 || o.LeafBytes <= 40*4 || o.LeafBytes > o.Leaves*o.NodeSize || o.ArenaBytes < (o.Leaves+o.Inner)*o.NodeSize:
		t.Fatalf("40 keys in 256-byte nodes: %+v", *o)
	}
	f := mem.New(mem.Options{})
	n, _ := f.NewNode(1)
	defer n.Close()
	plain, err := NewTable(TableConfig{LogBuckets: 2, HeapRegionSize: 1 << 16, MaxValue: 1 << 10}, n)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if o := plain.Stats().Ordered; o != nil {
		t.Fatalf("a table without an ordered part reports %+v", *o)
	}
}

// TestCaptureOrderedIsStateAtCapture: a table's capture (Snapshot) is
// followed by ordered puts that split leaves and the tablet, overwrites
// of other lengths, deletes, and hashed puts; its Persist writes exactly
// the snapshot persisted at capture, ordered section included, and the
// capture copied no ordered entry on the polling goroutine (the section
// is walked by Persist: btree/capture.go). Planted persistLive in the
// ordered part (its Persist reads the live tree), after overwrites in
// place, persists a snapshot that differs from the one at capture.
func TestCaptureOrderedIsStateAtCapture(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			tb, st := orderedTable(t, []btree.Tablet{btree.All})
			idx := uint64(0)
			for i := range 200 {
				idx++
				orderedPut(tb, idx, fmt.Sprintf("o%03d", i), "value")
			}
			idx++
			put(tb, idx, Op{Kind: OpPut, Key: []byte("h"), Value: []byte("x")})
			if planted {
				btree.PlantPersistLive(st)
			}
			want := snapshotOf(t, tb)
			c, err := tb.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			if c.Size() != len(want) {
				t.Fatalf("Size %d, the snapshot at capture has %d bytes", c.Size(), len(want))
			}
			for i := range 200 {
				idx++
				if planted {
					orderedPut(tb, idx, fmt.Sprintf("o%03d", i), "VALUE") // in place, same length
					continue
				}
				orderedPut(tb, idx, fmt.Sprintf("o%03d", i), strings.Repeat("w", i%13))
				idx++
				orderedPut(tb, idx, fmt.Sprintf("p%03d", i), "new")
				if i%3 == 0 {
					idx++
					tb.Apply(broadcast.Entry{Index: idx, Data: btree.AppendRequest(nil, []btree.Op{{Kind: btree.OpDelete, Key: []byte(fmt.Sprintf("o%03d", i+1))}})})
				}
			}
			idx++
			put(tb, idx, Op{Kind: OpPut, Key: []byte("h2"), Value: []byte("y")})
			got := make([]byte, c.Size())
			err = c.Persist(got)
			if planted {
				if err != nil || bytes.Equal(got, want) {
					t.Fatalf("planted persistLive: err %v, equal %v; want a snapshot that differs from the one at capture", err, bytes.Equal(got, want))
				}
				t.Log("planted persistLive caught: the persisted snapshot differs from the one at capture")
				return
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("persisted snapshot differs from the one at capture (err %v)", err)
			}
		})
	}
}

// TestTableOrderedPrefetch: a batch's ordered messages reach the ordered
// part's prefetch (btree.Store.Prefetch, then TouchBatch at BeginBatch,
// as hashed ones reach touchBatch): the batch's keys' leaves are found
// before the applies, and the applies take them. With kv's noPrefetch no
// batch is prefetched (a multi request still touches its own keys).
func TestTableOrderedPrefetch(t *testing.T) {
	for _, off := range []bool{false, true} {
		tb, st := orderedTable(t, []btree.Tablet{btree.All})
		tb.knobs.noPrefetch = off
		for i := range 40 {
			orderedPut(tb, uint64(i+1), fmt.Sprintf("k%02d", i), "v")
		}
		var msgs [][]byte
		for m := range 3 {
			ops := []btree.Op{{Kind: btree.OpPut, Key: fmt.Appendf(nil, "k%02da", m), Value: []byte("w")},
				{Kind: btree.OpPut, Key: fmt.Appendf(nil, "k%02d", 10+m), Value: []byte("w")}}
			msgs = append(msgs, btree.AppendMulti(nil, ops))
		}
		before := st.Stats()
		for _, m := range msgs {
			tb.Prefetch(m)
		}
		tb.BeginBatch()
		for j, m := range msgs {
			tb.Apply(broadcast.Entry{Index: uint64(100 + j), Data: m})
		}
		tb.EndBatch()
		after := st.Stats()
		kept, used, batches := after.Prefetched-before.Prefetched, after.PrefetchUsed-before.PrefetchUsed, after.PrefetchBatches-before.PrefetchBatches
		switch {
		case off && batches != 0:
			t.Fatalf("noPrefetch: %d batches prefetched", batches)
		case !off && (batches != 1 || kept != 6 || used < 6):
			t.Fatalf("%d batches prefetched, %d keys of the batch's 6, %d applies took a prefetched leaf", batches, kept, used)
		}
		if after.Keys != 43 {
			t.Fatalf("%d keys after the batch, want 43", after.Keys)
		}
	}
}
