package broadcast

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/rdmakv/rdmakv/rdma"
)

// keyFSM is a test state machine for keyed proposals: it records what it
// applied as "index:data" (indices may skip duplicates) and returns
// "r<index>:<data>" as the result. Snapshots carry the record.
type keyFSM struct {
	applied []string
	long    bool // results of 2 KiB (longer than the keyed table keeps)
}

func (f *keyFSM) Apply(e Entry) []byte {
	f.applied = append(f.applied, fmt.Sprintf("%d:%s", e.Index, e.Data))
	res := fmt.Sprintf("r%d:%s", e.Index, e.Data)
	if f.long {
		res += strings.Repeat(".", 2048)
	}
	return []byte(res)
}

func (f *keyFSM) Snapshot() (FSMSnapshot, error) {
	return BytesSnapshot([]byte(strings.Join(f.applied, "\n"))), nil
}

func (f *keyFSM) Restore(b []byte) error {
	f.applied = nil
	if len(b) > 0 {
		f.applied = strings.Split(string(b), "\n")
	}
	return nil
}

// keyCluster is a queued cluster of three whose replicas apply to keyFSMs
// (logFSM insists on consecutive indices), led by node 1.
func keyCluster(t *testing.T, mod func(*Config)) (*qcluster, map[rdma.NodeID]*keyFSM) {
	c := newQCluster(t, []rdma.NodeID{1, 2, 3}, mod)
	fsms := map[rdma.NodeID]*keyFSM{}
	for _, n := range c.nodes {
		fsms[n.id] = &keyFSM{}
		n.r.fsm = fsms[n.id]
	}
	c.settle(nil)
	c.get(1).r.startElection(true)
	c.settle(nil)
	if e := c.get(1).r.Status().ECur; e.Leader() != 1 {
		t.Fatalf("node 1 does not lead: %v", e)
	}
	return c, fsms
}

// applied returns the data node id's FSM applied, in order.
func appliedData(f *keyFSM) []string {
	var out []string
	for _, a := range f.applied {
		out = append(out, a[strings.IndexByte(a, ':')+1:])
	}
	return out
}

// sameApplied checks that every replica's FSM applied the same entries at
// the same indices, and that their data is want.
func sameApplied(t *testing.T, fsms map[rdma.NodeID]*keyFSM, want ...string) {
	t.Helper()
	for id, f := range fsms {
		if !slices.Equal(f.applied, fsms[1].applied) {
			t.Errorf("node %d applied %q, node 1 %q", id, f.applied, fsms[1].applied)
		}
		if got := appliedData(f); !slices.Equal(got, want) {
			t.Errorf("node %d applied %q, want %q", id, got, want)
		}
	}
}

func settleN(c *qcluster, k int) {
	for range k {
		c.settle(nil)
	}
}

// TestKeyedDuplicate: a keyed proposal made at a follower and again at the
// leader (a retry) is delivered twice but applied once, on every replica,
// and both proposals resolve with the original's index and result (the
// handle with a copy, the callback with the table's bytes). A proposal of
// an older Seq of the client fails with ErrDuplicate; invalid keys and
// data too large for a key fail at once.
func TestKeyedDuplicate(t *testing.T) {
	c, fsms := keyCluster(t, nil)
	n1, n2 := c.get(1).r, c.get(2).r
	k := Key{Client: 7, Seq: 1}
	pa := n2.ProposeKeyed(k, []byte("x")) // forwarded by a follower
	var cbIndex uint64
	var cbResult []byte
	var cbErr error
	cbCalls := 0
	n1.ProposeKeyedFunc(k, []byte("x"), func(i uint64, res []byte, err error) {
		cbCalls++
		cbIndex, cbResult, cbErr = i, append([]byte(nil), res...), err
	})
	settleN(c, 3)
	ia, err := waitProposal(t, pa, "pa", 0, qreplicas(c)...)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("r%d:x", ia)
	if string(pa.Reply()) != want {
		t.Errorf("pa: Reply %q, want %q", pa.Reply(), want)
	}
	if cbCalls != 1 || cbErr != nil || cbIndex != ia || string(cbResult) != want {
		t.Errorf("retry: %d callbacks, index %d, result %q, err %v; want one with %d, %q", cbCalls, cbIndex, cbResult, cbErr, ia, want)
	}
	if d := n1.Status().Counters.Duplicates; d != 1 {
		t.Errorf("node 1 counted %d duplicates, want 1", d)
	}

	// The next Seq applies; then the old one is a duplicate of an older Seq.
	pb := n1.ProposeKeyed(Key{Client: 7, Seq: 2}, []byte("y"))
	settleN(c, 3)
	pc := c.get(3).r.ProposeKeyed(k, []byte("x"))
	settleN(c, 3)
	if _, err := waitProposal(t, pb, "pb", 0, qreplicas(c)...); err != nil {
		t.Fatal(err)
	}
	if i, err := waitProposal(t, pc, "pc", 0, qreplicas(c)...); !errors.Is(err, ErrDuplicate) || i != 0 || pc.Reply() != nil {
		t.Errorf("old Seq: index %d, err %v, Reply %q; want ErrDuplicate", i, err, pc.Reply())
	}
	sameApplied(t, fsms, "x", "y")

	// An unkeyed proposal with the same data is applied as usual.
	pd := n2.Propose([]byte("x"))
	settleN(c, 3)
	if _, err := waitProposal(t, pd, "pd", 0, qreplicas(c)...); err != nil {
		t.Fatal(err)
	}
	sameApplied(t, fsms, "x", "y", "x")

	for _, bad := range []Key{{}, {Client: 1}, {Seq: 1}} {
		if _, err := n1.ProposeKeyed(bad, []byte("z")).Result(); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("key %+v: %v, want ErrInvalidKey", bad, err)
		}
	}
	if _, err := n1.ProposeKeyed(Key{Client: 1, Seq: 1}, make([]byte, n1.MaxProposal()-15)).Result(); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxProposal()-15 bytes keyed: %v, want ErrTooLarge", err)
	}
	pe := n1.ProposeKeyed(Key{Client: 1, Seq: 1}, make([]byte, n1.MaxProposal()-16))
	settleN(c, 3)
	if _, err := waitProposal(t, pe, "pe", 0, qreplicas(c)...); err != nil {
		t.Errorf("MaxProposal()-16 bytes keyed: %v", err)
	}
}

// TestKeyedLongResult: a result longer than the table keeps is not kept: a
// duplicate resolves with the original's index and a nil result.
func TestKeyedLongResult(t *testing.T) {
	c, fsms := keyCluster(t, nil)
	for _, f := range fsms {
		f.long = true
	}
	k := Key{Client: 3, Seq: 9}
	pa := c.get(1).r.ProposeKeyed(k, []byte("x"))
	settleN(c, 3)
	pb := c.get(2).r.ProposeKeyed(k, []byte("x"))
	settleN(c, 3)
	ia, _ := waitProposal(t, pa, "pa", 0, qreplicas(c)...)
	ib, err := waitProposal(t, pb, "pb", 0, qreplicas(c)...)
	if err != nil || ib != ia || pb.Reply() != nil || len(pa.Reply()) < 2048 {
		t.Errorf("duplicate of a long result: index %d (original %d), err %v, Reply of %d bytes (original %d)", ib, ia, err, len(pb.Reply()), len(pa.Reply()))
	}
	sameApplied(t, fsms, "x")
}

// TestKeyedLeaderChange: the table is replicated state: after another
// member takes over as leader, a retry of a delivered key is still not
// applied, and resolves with the original index and result.
func TestKeyedLeaderChange(t *testing.T) {
	c, fsms := keyCluster(t, nil)
	k := Key{Client: 11, Seq: 4}
	pa := c.get(3).r.ProposeKeyed(k, []byte("x"))
	settleN(c, 3)
	ia, err := waitProposal(t, pa, "pa", 0, qreplicas(c)...)
	if err != nil {
		t.Fatal(err)
	}
	e1 := c.get(1).r.Status().ECur
	c.loseLeader(not(1), 2, 3)
	c.get(2).r.startElection(true)
	for range 5 {
		c.settle(not(1))
	}
	if e := c.get(2).r.Status().ECur; e <= e1 || e.Leader() == 1 || !c.newLeader(e1) {
		t.Fatalf("no new leader: %v", statuses(qreplicas(c)))
	}
	pb := c.get(3).r.ProposeKeyed(k, []byte("x"))
	pc := c.get(2).r.ProposeKeyed(k, []byte("x"))
	for range 5 {
		c.settle(not(1))
	}
	for _, p := range []*Proposal{pb, pc} {
		i, err := waitProposal(t, p, "retry", 0, c.get(2).r, c.get(3).r)
		if err != nil || i != ia || string(p.Reply()) != string(pa.Reply()) {
			t.Errorf("retry after the leader change: index %d, err %v, Reply %q; want %d, %q", i, err, p.Reply(), ia, pa.Reply())
		}
	}
	for _, id := range []rdma.NodeID{2, 3} {
		if got := appliedData(fsms[id]); !slices.Equal(got, []string{"x"}) {
			t.Errorf("node %d applied %q, want [x]", id, got)
		}
	}
}

// TestKeyedSnapshot: the table travels in snapshots: a member that
// catches up by snapshot (it was down, with its memory lost, while the
// keyed entry and 250 more were delivered and the Log keeps 8) drops a
// retry of the key proposed at it, and resolves it with the original
// index and result, taken from the restored table.
func TestKeyedSnapshot(t *testing.T) {
	c, fsms := keyCluster(t, func(cfg *Config) { cfg.MaxLogEntries = 8 })
	n1, n3 := c.get(1), c.get(3)
	c.crash(3, 0)
	k := Key{Client: 5, Seq: 1}
	pa := n1.r.ProposeKeyed(k, []byte("keyed"))
	want := []string{"keyed"}
	for i := range 250 {
		d := fmt.Sprintf("m%03d-%s", i, strings.Repeat("x", 40))
		want = append(want, d)
		n1.r.Propose([]byte(d))
	}
	for range 3 {
		c.settle(not(3))
	}
	ia, err := waitProposal(t, pa, "pa", 0, n1.r, c.get(2).r)
	if err != nil {
		t.Fatal(err)
	}
	c.boot(n3)
	fsms[3] = &keyFSM{}
	n3.r.fsm = fsms[3]
	settleN(c, 20)
	if s := n3.r.Status().Counters; s.SnapshotsRestored != 1 {
		t.Fatalf("node 3 restored %d snapshots, want 1: %+v", s.SnapshotsRestored, s)
	}
	if n3.r.keys.len() != 1 {
		t.Fatalf("node 3's restored table holds %d clients, want 1", n3.r.keys.len())
	}
	pb := n3.r.ProposeKeyed(k, []byte("keyed"))
	settleN(c, 5)
	ib, err := waitProposal(t, pb, "pb", 0, qreplicas(c)...)
	if err != nil || ib != ia || string(pb.Reply()) != fmt.Sprintf("r%d:keyed", ia) {
		t.Errorf("retry at the restored member: index %d, err %v, Reply %q; want %d, %q", ib, err, pb.Reply(), ia, pa.Reply())
	}
	if d := n3.r.Status().Counters.Duplicates; d != 1 {
		t.Errorf("node 3 counted %d duplicates, want 1", d)
	}
	sameApplied(t, fsms, want...)
}

// TestKeyedEviction: with MaxKeyedClients 2, a third client evicts the one
// whose last delivery is the oldest, on every replica alike: a retry of an
// evicted client's Seq is applied again, a retry of a kept one is not.
func TestKeyedEviction(t *testing.T) {
	c, fsms := keyCluster(t, func(cfg *Config) { cfg.MaxKeyedClients = 2 })
	props := []struct {
		at   rdma.NodeID
		key  Key
		data string
	}{
		{1, Key{1, 1}, "a1"},
		{2, Key{2, 1}, "b1"},
		{3, Key{3, 1}, "c1"}, // evicts client 1
		{1, Key{2, 1}, "b1"}, // duplicate: client 2 kept (its last delivery is unchanged)
		{2, Key{1, 1}, "a1"}, // client 1 was evicted: applied again, evicts client 2
		{3, Key{2, 1}, "b1"}, // client 2 was evicted: applied again, evicts client 3
		{1, Key{1, 1}, "a1"}, // duplicate
		{2, Key{3, 1}, "c1"}, // applied again
	}
	for _, p := range props {
		pp := c.get(p.at).r.ProposeKeyed(p.key, []byte(p.data))
		settleN(c, 3)
		if _, err := waitProposal(t, pp, p.data, 0, qreplicas(c)...); err != nil {
			t.Fatalf("%s: %v", p.data, err)
		}
	}
	sameApplied(t, fsms, "a1", "b1", "c1", "a1", "b1", "c1")
	for _, n := range c.nodes {
		if l := n.r.keys.len(); l != 2 {
			t.Errorf("node %d's table holds %d clients, want 2", n.id, l)
		}
	}
}

// TestKeyTableSnapshotRoundTrip: a table captured for a snapshot encodes,
// decodes and restores to the same table, eviction order included.
func TestKeyTableSnapshotRoundTrip(t *testing.T) {
	var kt keyTable
	for i := range uint64(6) {
		res := []byte(fmt.Sprint("res", i))
		if i == 3 {
			res = make([]byte, maxKeptResult+1)
		}
		if i == 4 {
			res = nil
		}
		kt.record(Key{Client: 10 + i%4, Seq: i + 1}, 2*i+1, res, 3)
	}
	members := []rdma.NodeID{4, 5, 6}
	m := snapMeta{index: 20, table: make([]tableRec, 3), keys: kt.capture()}
	b := encodeSnapMeta(members, m)
	got, err := decodeSnapMeta(b, members)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.keys) != fmt.Sprint(m.keys) || len(got.keys) != 3 {
		t.Fatalf("keys %v decode as %v", m.keys, got.keys)
	}
	var back keyTable
	back.restore(got.keys, 3)
	if fmt.Sprint(back.capture()) != fmt.Sprint(m.keys) {
		t.Errorf("restored table %v, want %v", back.capture(), m.keys)
	}
	back.restore(got.keys, 2) // a smaller limit keeps the newest
	if c := back.capture(); len(c) != 2 || c[0].client != m.keys[1].client {
		t.Errorf("restored with limit 2: %v", c)
	}
}
