package kv

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/sim"
)

// The ordered keyspace in the kv simulator (issue 18, stage B1): every
// replica has a btree.Store as its table's ordered part; group 0 owns the
// one tablet (-inf, +inf), the other groups none. Clients send ordered
// writes (put, delete, CAS, batch, merge) and reads through the log (get,
// scan) to group 0, and an eighth of them first to group 1, as a client
// with a stale directory would: group 1 must refuse them (StatusMoved) and
// the client sends them again to group 0. The history, ordered ops among
// the hashed ones, is checked by porcupine with the ordered-map model
// (kvcheck.Scan); each group's replicas must end with the same entries;
// and a one-sided scan of each replica's published regions (btree.Cache
// over the header's root at its applied index) must return its tree.

// ordPending is an ordered request under way.
type ordPending struct {
	req  []byte
	read bool
	g    int // the group it was sent to
	// Moves (sim_move_test.go): the tablet of its keys, and when to
	// send it again (a frozen tablet's StatusMoving).
	tablet int
	at     time.Duration
}

const orderedKeys = 24

// orderedStore makes group g's store for a replica (kvRepProc.Start).
func (p *kvRepProc) orderedStore(g int) (*btree.Store, error) {
	h := p.h
	var tablets []btree.Tablet
	if g == 0 {
		tablets = []btree.Tablet{btree.All}
	}
	if h.o.moves != nil {
		tablets = placedTablets(g, len(h.members))
	}
	// GarbageStep 2: a dropped tablet's keys (a few here) are deleted
	// over several entries, so snapshots, restores and tablets moving
	// back meet them (btree/garbage.go).
	st, err := btree.NewStore(btree.StoreConfig{Group: uint32(g), Tree: btree.Config{NodeSize: 256, MaxKey: 4},
		ChunkSlots: 16, FreeAfter: 8, MaxResult: MultiResultSize, Tablets: tablets, Readers: h.cnodes, GarbageStep: 2}, p.env.Node())
	if err != nil {
		return nil, err
	}
	if h.o.skipOwnerCheck {
		btree.PlantSkipOwnerCheck(st)
	}
	if h.o.moves != nil {
		h.o.moves.plantStore(st)
	}
	return st, nil
}

// issueOrdered starts one ordered op; false if there is no room now.
func (p *kvCliProc) issueOrdered(rng *rand.Rand) bool {
	h := p.h
	if p.c.Outstanding() >= p.c.Window()-1 {
		return false
	}
	key := func() string { return fmt.Sprintf("o%02d", rng.IntN(orderedKeys)) }
	ti := -1
	if h.mv != nil && len(p.resend) > 0 {
		// A write waits for a moving tablet: no more ordered requests
		// meanwhile (ops that overlap for milliseconds make porcupine's
		// search long).
		return false
	}
	if h.mv != nil {
		// Moves: the keys of one tablet (a request's keys must lie in
		// one group's tablets).
		ti = rng.IntN(len(moveFences) + 1)
		key = func() string { return fmt.Sprintf("o%02d", 8*ti+rng.IntN(8)) }
	}
	var ops []btree.Op
	var op kvcheck.Op
	read := false
	switch x := rng.IntN(100); {
	case x < 15:
		k := key()
		ops = []btree.Op{{Kind: btree.OpGet, Key: []byte(k)}}
		op, read = kvcheck.Op{Kind: kvcheck.Get, Key: k}, true
	case x < 30:
		// Limits keep a result within the slot's MaxResult.
		start, end := "", ""
		if rng.IntN(3) > 0 {
			start = key()
		}
		if rng.IntN(2) == 0 {
			end = fmt.Sprintf("o%02d", rng.IntN(orderedKeys+1))
			if end <= start {
				end = ""
			}
		}
		if ti >= 0 {
			// Within the tablet.
			lo, hi := "", ""
			if ti > 0 {
				lo = moveFences[ti-1]
			}
			if ti < len(moveFences) {
				hi = moveFences[ti]
			}
			start, end = cmp.Or(start, lo), hi
			if rng.IntN(2) == 0 {
				if e := fmt.Sprintf("o%02d", 8*ti+1+rng.IntN(8)); e > start && (hi == "" || e <= hi) {
					end = e
				}
			}
		}
		limit := 1 + rng.IntN(8)
		ops = []btree.Op{{Kind: btree.OpScan, Key: []byte(start), Value: []byte(end), CmpVersion: uint64(limit)}}
		// Recorded over the ordered keys only ("o" to "p"): the
		// history's hashed keys are another keyspace.
		op, read = kvcheck.Op{Kind: kvcheck.Scan, Key: cmp.Or(start, "o"), End: cmp.Or(end, "p"), Limit: limit}, true
	case x < 55:
		k, v := key(), p.value(rng)
		ops = []btree.Op{{Kind: btree.OpPut, Key: []byte(k), Value: []byte(v)}}
		op = kvcheck.Op{Kind: kvcheck.Put, Key: k, Value: v}
	case x < 67:
		k := key()
		ops = []btree.Op{{Kind: btree.OpDelete, Key: []byte(k)}}
		op = kvcheck.Op{Kind: kvcheck.Delete, Key: k}
	case x < 77:
		k, v := key(), p.value(rng)
		op = kvcheck.Op{Kind: kvcheck.CAS, Key: k, Value: v}
		c := btree.Op{Kind: btree.OpPut, Cmp: btree.CmpValue, Key: []byte(k), Value: []byte(v)}
		if rng.IntN(3) == 0 {
			op.OldAbsent, c.CmpVersion = true, 1
		} else {
			op.Old = fmt.Sprintf("c%d.%d.%d", rng.IntN(h.o.clients), 1, max(1, p.seq-rng.IntN(3)))
			c.CmpValue = []byte(op.Old)
		}
		ops = []btree.Op{c}
	case x < 90:
		op = kvcheck.Op{Kind: kvcheck.Batch}
		for range 2 + rng.IntN(2) {
			k := key()
			if rng.IntN(4) == 0 {
				ops = append(ops, btree.Op{Kind: btree.OpDelete, Key: []byte(k)})
				op.Batch = append(op.Batch, kvcheck.BatchOp{Key: k, Delete: true})
			} else {
				v := p.value(rng)
				ops = append(ops, btree.Op{Kind: btree.OpPut, Key: []byte(k), Value: []byte(v)})
				op.Batch = append(op.Batch, kvcheck.BatchOp{Key: k, Value: v})
			}
		}
	default:
		k := key()
		// Two field names: a merged value stays within the inline
		// bound of 256-byte nodes.
		f := map[string]string{fmt.Sprintf("f%d", rng.IntN(2)): p.value(rng)}
		ops = []btree.Op{{Kind: btree.OpMerge, Key: []byte(k), Value: []byte(kvcheck.EncodeFields(f))}}
		op = kvcheck.Op{Kind: kvcheck.Merge, Key: k, Fields: f}
	}
	req := btree.AppendRequest(nil, ops)
	if len(req) > multicast.MaxPayload(512) {
		return false
	}
	g := 0
	if len(h.members) > 1 && rng.IntN(8) == 0 {
		g = 1 // a stale directory
	}
	if ti >= 0 {
		g = h.mv.route[p.slot][ti] // where the tablet was last found
	}
	mid, err := p.c.Multicast(tree.Of(tree.Group(g)), req)
	if errors.Is(err, multicast.ErrWindowFull) {
		return false
	}
	if err != nil {
		h.fail(fmt.Errorf("client %d: ordered multicast: %v", p.slot, err))
		return false
	}
	op.Client = p.slot
	rid := h.rec.Begin(p.slot, op)
	p.writes[mid] = pendingWrite{rec: rid, op: op, ord: &ordPending{req: req, read: read, g: g, tablet: ti}}
	h.stats.writes++
	return true
}

// doneOrdered records an ordered request's outcome, or sends it again to
// group 0 when the group it went to does not own the keys.
func (p *kvCliProc) doneOrdered(o *multicast.Outcome, pw pendingWrite) {
	h := p.h
	if len(o.Replies) != 1 {
		h.fail(fmt.Errorf("client %d: %d replies to an ordered request", p.slot, len(o.Replies)))
		return
	}
	rp := o.Replies[0]
	moved := func() {
		if h.mv != nil {
			// The next group may own the tablet now.
			ng := (pw.ord.g + 1) % len(h.members)
			h.mv.route[p.slot][pw.ord.tablet] = ng
			pw.ord = &ordPending{req: pw.ord.req, read: pw.ord.read, g: ng, tablet: pw.ord.tablet, at: h.s.Now() + 50*time.Microsecond}
			p.resend = append(p.resend, pw)
			h.stats.moved++
			h.mv.stats.rerouted++
			return
		}
		if pw.ord.g == 0 {
			h.fail(fmt.Errorf("client %d: group 0 (the owner) refused %v as moved", p.slot, pw.op.Kind))
			return
		}
		pw.ord = &ordPending{req: pw.ord.req, read: pw.ord.read, g: 0}
		p.resend = append(p.resend, pw)
		h.stats.moved++
	}
	if pw.ord.read {
		r, err := btree.DecodeReadResult(rp.Result)
		switch {
		case err != nil:
			h.fail(fmt.Errorf("client %d: ordered read result: %v", p.slot, err))
		case r.Status == btree.StatusMoved:
			moved()
		case r.Status != btree.StatusOK || r.More:
			h.fail(fmt.Errorf("client %d: ordered %v: status %d, more %v", p.slot, pw.op.Kind, r.Status, r.More))
		case r.Index != rp.Index:
			h.fail(fmt.Errorf("client %d: a read applied at %d says %d", p.slot, rp.Index, r.Index))
		default:
			out := kvcheck.Output{Group: int(rp.Group)}
			if pw.op.Kind == kvcheck.Get {
				if out.Found = len(r.Pairs) == 1; out.Found {
					out.Value = string(r.Pairs[0].Value)
				}
			} else {
				for _, pr := range r.Pairs {
					out.Pairs = append(out.Pairs, kvcheck.KV{Key: string(pr.Key), Value: string(pr.Value)})
				}
				h.stats.scans++
			}
			h.rec.End(pw.rec, out)
		}
		return
	}
	r, err := btree.DecodeResult(rp.Result)
	switch {
	case err != nil:
		h.fail(fmt.Errorf("client %d: ordered result: %v", p.slot, err))
	case r.Status == btree.StatusMoved:
		moved()
	case r.Status == btree.StatusMoving && h.mv != nil:
		// The tablet is frozen for a move: nothing applied; send it
		// again in a moment.
		pw.ord = &ordPending{req: pw.ord.req, g: pw.ord.g, tablet: pw.ord.tablet, at: h.s.Now() + 100*time.Microsecond + time.Duration(h.rng.Int64N(int64(200*time.Microsecond)))}
		p.resend = append(p.resend, pw)
		h.mv.stats.frozen++
	case r.Status == btree.StatusOK || r.Status == btree.StatusCondFailed:
		out := kvcheck.Output{OK: r.Status == btree.StatusOK, Group: int(rp.Group)}
		if out.OK && r.Count > 0 {
			out.Index, out.Version = rp.Index, r.Version
			// A group that took a tablet in issues versions above the
			// moved ones (its version offset): index<<16 | op + offset.
			if r.Version>>16 != rp.Index && (h.mv == nil || r.Version>>16 < rp.Index) {
				h.fail(fmt.Errorf("client %d: version %x of an ordered write at index %d", p.slot, r.Version, rp.Index))
			}
		}
		if !out.OK && pw.op.Kind != kvcheck.CAS && pw.op.Kind != kvcheck.Merge {
			h.fail(fmt.Errorf("client %d: unconditional ordered %v failed its condition", p.slot, pw.op.Kind))
		}
		h.rec.End(pw.rec, out)
	default:
		h.fail(fmt.Errorf("client %d: ordered %v: %+v", p.slot, pw.op.Kind, r))
	}
}

// flushResends sends again, to group 0, the requests group 1 refused.
func (p *kvCliProc) flushResends() bool {
	progress := false
	for len(p.resend) > 0 && p.c.Ready() && p.c.Outstanding() < p.c.Window()-1 {
		pw := p.resend[0]
		if pw.ord.at > p.h.s.Now() {
			break
		}
		mid, err := p.c.Multicast(tree.Of(tree.Group(pw.ord.g)), pw.ord.req)
		if errors.Is(err, multicast.ErrWindowFull) {
			break
		}
		if err != nil {
			p.h.fail(fmt.Errorf("client %d: ordered resend: %v", p.slot, err))
			break
		}
		p.resend = p.resend[1:]
		p.writes[mid] = pw
		progress = true
	}
	return progress
}

// storePairs is every entry of a store's tree, in order.
func storePairs(st *btree.Store) []btree.KV {
	var out []btree.KV
	st.Tree().Ascend(nil, func(k, v []byte) bool {
		e, _ := st.Tree().Get(k)
		out = append(out, btree.KV{Key: bytes.Clone(k), Value: bytes.Clone(v), Version: e.Version})
		return true
	})
	return out
}

func samePairs(a, b []btree.KV) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d entries and %d", len(a), len(b))
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Version != b[i].Version {
			return fmt.Errorf("entry %d: %q=%q@%x and %q=%q@%x", i, a[i].Key, a[i].Value, a[i].Version, b[i].Key, b[i].Value, b[i].Version)
		}
	}
	return nil
}

// oneSided scans a replica's store as a client reading it one-sided
// would: the header as published, then the leaves through a cache, at
// the header's applied index. It returns the pairs, or an error the
// caller decides about (btree.ErrChanged while writes are unpublished).
func oneSided(st *btree.Store) ([]btree.KV, btree.Header, error) {
	hd, read, err := st.Regions().Local()
	if err != nil {
		return nil, hd, err
	}
	kvs, _, err := btree.NewCache(1<<20).Scan(read, hd.Root, hd.Applied, nil, nil, 0, nil)
	return kvs, hd, err
}

// checkOneSided scans the replica's published regions one-sided after
// a Poll (every 8th): the scan must succeed (every leaf stamped at most
// the published applied index, contiguous: no btree.ErrChanged) and return
// exactly the tree the replica holds, since the table publishes the
// ordered header after each batch and each ordered request outside one.
func (p *kvRepProc) checkOneSided() {
	h := p.h
	if h.mv != nil {
		h.mv.note(p)
	}
	if p.steps++; p.steps%8 != 0 {
		return
	}
	kvs, hd, err := oneSided(p.store)
	switch {
	case err != nil:
		h.fail(fmt.Errorf("node %d: one-sided scan: %v", p.env.ID(), err))
	default:
		if err := samePairs(kvs, storePairs(p.store)); err != nil {
			h.fail(fmt.Errorf("node %d: one-sided scan at applied %d and the tree after Poll differ: %v", p.env.ID(), hd.Applied, err))
		}
		h.stats.oneSided++
		h.stats.leaves = max(h.stats.leaves, p.store.Tree().Stats().Leaves)
	}
}

// checkOrdered: after the run, every live replica's tree checks, a
// group's replicas hold the same entries, group 1 (no tablet) holds none,
// and a one-sided scan of each replica's published regions returns
// exactly its tree.
func (h *kvRun) checkOrdered() error {
	for g, ms := range h.members {
		var ref []btree.KV
		refID := -1
		for _, id := range ms {
			if h.gone[id] || !h.s.Live(id) {
				continue
			}
			st := h.procs[id].store
			if err := st.Tree().Check(); err != nil {
				return fmt.Errorf("group %d node %d: ordered tree: %v", g, id, err)
			}
			got := storePairs(st)
			gr, _ := st.Garbage()
			for _, kv := range got {
				if !slices.ContainsFunc(st.Tablets(), func(tb btree.Tablet) bool { return tb.Contains(kv.Key) }) &&
					!slices.ContainsFunc(gr, func(tb btree.Tablet) bool { return tb.Contains(kv.Key) }) {
					return fmt.Errorf("group %d node %d holds ordered key %q, in none of its %d tablets and %d garbage ranges", g, id, kv.Key, len(st.Tablets()), len(gr))
				}
			}
			if err := st.CheckKeys(); err != nil {
				return fmt.Errorf("group %d node %d: ordered keys: %v", g, id, err)
			}
			kvs, hd, err := oneSided(st)
			if err != nil {
				return fmt.Errorf("group %d node %d: one-sided scan at applied %d: %v", g, id, hd.Applied, err)
			}
			if err := samePairs(kvs, got); err != nil {
				return fmt.Errorf("group %d node %d: one-sided scan at applied %d and its tree differ: %v", g, id, hd.Applied, err)
			}
			h.stats.oneSided++
			if refID < 0 {
				ref, refID = got, int(id)
				continue
			}
			if err := samePairs(ref, got); err != nil {
				return fmt.Errorf("group %d: node %d and node %d: ordered entries differ: %v", g, refID, id, err)
			}
		}
	}
	if h.mv != nil {
		return h.checkMoves()
	}
	return nil
}

// kvSimOrderedSeeds is TestSimOrdered's seeds per case (-seeds N for more).
const kvSimOrderedSeeds = 20

// The ordered cases: every fault kind of the kv simulator, with ordered
// ops among the hashed ones.
var kvSimOrderedCases = []struct {
	name string
	o    kvOpts
}{
	{"faults", kvOpts{ops: 100, crashes: true, partitions: true, slow: true, merges: true, clientCrash: true}},
	{"leaders", kvOpts{ops: 100, leaders: 2, isolate: 3, stall: true, gap: 100 * time.Microsecond}},
	{"slow-new-leaders", kvOpts{ops: 120, crashAfterCommit: 3, newLeaderStall: true, gap: 100 * time.Microsecond}},
	// lagging-restore: followers catch up by snapshots, which carry the
	// ordered section and restore it by a bulk load.
	{"lagging-restore", kvOpts{ops: 160, gap: 200 * time.Microsecond, lag: 2, logEntries: 16}},
	{"down-for-good", kvOpts{ops: 100, downForGood: true, partitions: true}},
	// batches: one one-sided reader per client (six clients' concurrent
	// scans make porcupine's search long).
	{"batches", kvOpts{ops: 120, gap: 40 * time.Microsecond, crashAfterCommit: 1, leaders: 1, crashes: true, clients: 6, ordReaders: 1}},
}

func orderedRunOpts(o kvOpts) kvOpts {
	o.ordered = true
	o.groups, o.replicas, o.clients, o.keys = 2, 3, cmp.Or(o.clients, 3), 24
	o.until = 60 * time.Millisecond
	o.oneSided, o.ordReaders = true, cmp.Or(o.ordReaders, 2)
	if o.gap == 0 {
		o.gap = 200 * time.Microsecond
	}
	return o
}

func TestSimOrdered(t *testing.T) {
	simNoRace(t)
	def := kvSimOrderedSeeds
	if raceEnabled {
		def = 2
	}
	flags := simFlags.WithDefault(def)
	for _, c := range kvSimOrderedCases {
		t.Run(c.name, func(t *testing.T) {
			o := orderedRunOpts(c.o)
			var scans, moved, oneSided, restores, leaves, lookups, oscans, retries, joined int
			flags.Run(t, func(sd sim.Seed) error {
				h, err := runKV(sd.WithLog(t), o)
				if h != nil {
					scans, moved, oneSided, restores = scans+h.stats.scans, moved+h.stats.moved, oneSided+h.stats.oneSided, restores+h.stats.restores
					leaves = max(leaves, h.stats.leaves)
					lookups, oscans, retries, joined = lookups+h.stats.ordLookups, oscans+h.stats.ordScans, retries+h.stats.ordRetries, joined+h.stats.ordJoined
				}
				return err
			})
			t.Logf("%d scans through the log, %d requests refused as moved and sent again, %d one-sided scans checked, %d snapshots restored, up to %d leaves; reader: %d one-sided lookups, %d one-sided scans, %d attempts retried, %d node reads joined",
				scans, moved, oneSided, restores, leaves, lookups, oscans, retries, joined)
			if scans == 0 || moved == 0 || oneSided == 0 || leaves < 2 || lookups == 0 || oscans == 0 {
				t.Errorf("the case tested nothing: %d scans, %d moved, %d one-sided scans, up to %d leaves, %d reader lookups, %d reader scans", scans, moved, oneSided, leaves, lookups, oscans)
			}
			if o.lag > 0 && restores == 0 {
				t.Errorf("no snapshot restored")
			}
		})
	}
}

// TestSimOrderedMutants plants each bug of the ordered part and requires
// the check aimed at it to catch it within 20 seeds:
//   - skipOwnerCheck: a group applies ordered writes it owns no tablet of;
//     they are lost to the owner's readers (linearizability);
//   - skipOrderedPublish: the ordered header is not published after
//     applies, so one-sided readers see an applied index behind the tree;
//   - skipFence (the clients' caches): a one-sided lookup answers from
//     the leaf a stale cached parent names without checking that its
//     fences hold the key, so a key a split moved right reads as absent
//     (linearizability, or the stale-ok check);
//   - staleCacheAfterSplit (the clients' caches): a lookup through a
//     cached parent that predates a leaf's split does not move right, so
//     a key the split moved reads as absent (the same checks);
//   - joinOlder (the clients' Delegations): a lookup takes another
//     lookup's node read posted before it began, which may predate a
//     write acknowledged before it began (linearizability);
//   - noQuorum (the one-sided ordered readers only; the hashed gets keep
//     the check): a linearizable lookup or scan trusts a leader's serving
//     word without f+1 promises, and a deposed leader cut off by a
//     partition keeps saying it serves (linearizability).
func TestSimOrderedMutants(t *testing.T) {
	simNoRace(t)
	for _, m := range []struct {
		name     string
		owner    bool
		knobs    testingKnobs
		fence    int // 1: skipFence, 2: staleCacheAfterSplit, 3: the Delegation's joinOlder
		ordKnobs testingKnobs
		base     kvOpts
		want     []string
	}{
		{"skip-owner-check", true, testingKnobs{}, 0, testingKnobs{}, kvOpts{ops: 100}, []string{"linearizability"}},
		{"skip-ordered-publish", false, testingKnobs{skipOrderedPublish: true}, 0, testingKnobs{}, kvOpts{ops: 100}, []string{"one-sided scan"}},
		{"reader-skip-fence", false, testingKnobs{}, 1, testingKnobs{}, kvOpts{ops: 100}, []string{"linearizability", "stale-ok gets"}},
		{"reader-stale-cache-after-split", false, testingKnobs{}, 2, testingKnobs{}, kvOpts{ops: 100}, []string{"linearizability", "stale-ok gets"}},
		{"reader-join-older", false, testingKnobs{}, 3, testingKnobs{}, kvOpts{ops: 100}, []string{"linearizability", "stale-ok gets"}},
		{"reader-no-quorum", false, testingKnobs{}, 0, testingKnobs{noQuorum: true}, kvOpts{ops: 120, isolate: 4, gap: 100 * time.Microsecond}, []string{"linearizability"}},
	} {
		t.Run(m.name, func(t *testing.T) {
			o := orderedRunOpts(m.base)
			o.skipOwnerCheck, o.knobs, o.skipFence, o.staleSplit, o.ordKnobs = m.owner, m.knobs, m.fence == 1, m.fence == 2, m.ordKnobs
			o.joinOlder = m.fence == 3
			catchMutant(t, o, m.want)
		})
	}
}

// catchMutant runs seeds 1 to 20 of o (a planted bug) and requires one to
// fail, caught by a check whose error contains one of want (the ordered
// and the moves mutants).
func catchMutant(t *testing.T, o kvOpts, want []string) {
	t.Helper()
	for seed := uint64(1); seed <= 20; seed++ {
		_, err := runKV(sim.Seed{Seed: seed}, o)
		if err == nil {
			continue
		}
		if !slices.ContainsFunc(want, func(w string) bool { return strings.Contains(err.Error(), w) }) {
			t.Fatalf("seed %d: caught by the wrong check (want %q): %v", seed, want, err)
		}
		t.Logf("seed %d caught it: %s", seed, firstLine(err.Error()))
		return
	}
	t.Fatal("not caught in 20 seeds")
}

// One-sided ordered reads (stage B2): each client has two OrderedReaders
// of group 0 (the owner) sharing a cache and a Delegation (lookups of one
// leaf share reads), and issues lookups and scans, forward and reverse,
// linearizable and stale-ok, at most one per reader at a time.
// Linearizable ones join the history checked by porcupine (a lookup as a
// Get of the key, a scan as a Scan). A stale-ok lookup is a stale Get
// (CheckStale, at the kv applied index it reports); a stale-ok scan is the
// replica's tree as of the btree applied index it read (Scanned), so it is
// recorded as one stale Get per ordered key of the range it covered (each
// found or absent at exactly that index).
type oneSidedReads struct {
	cache *btree.Cache
	deleg *Delegation
	rs    []*ordRead
	mv    *moveReads // a moves run's reads instead (sim_move_test.go)
}

// ordRead is one reader and the read under way.
type ordRead struct {
	r     *OrderedReader
	recs  []int
	keys  []string // stale scans: the key of each record
	op    kvcheck.Op
	stale bool
	seen  uint64 // r.Joined counted so far
}

func (p *kvCliProc) startOneSided() {
	h := p.h
	if h.o.moves != nil {
		p.ord = &oneSidedReads{mv: p.startMoveReads()}
		return
	}
	o := &oneSidedReads{cache: btree.NewCache(1 << 16), deleg: NewDelegation()}
	o.deleg.joinOlder = h.o.joinOlder
	if h.o.skipFence {
		btree.PlantSkipFence(o.cache)
	}
	if h.o.staleSplit {
		btree.PlantStaleCacheAfterSplit(o.cache)
	}
	for range h.o.ordReaders {
		r := NewOrderedReader(p.env.Node(), 0, h.members[0], p.slot, o.cache)
		r.gr.knobs = h.o.ordKnobs
		r.SetDelegation(o.deleg)
		o.rs = append(o.rs, &ordRead{r: r})
	}
	p.ord = o
}

// busy reports whether a one-sided read is under way.
func (o *oneSidedReads) busy() bool {
	if o.mv != nil {
		return o.mv.busy()
	}
	for _, x := range o.rs {
		if x.r.Busy() {
			return true
		}
	}
	return false
}

// nextDeadline is the earliest deadline of the readers.
func (o *oneSidedReads) nextDeadline() time.Duration {
	if o.mv != nil {
		return o.mv.nextDeadline()
	}
	d := time.Duration(1<<63 - 1)
	for _, x := range o.rs {
		d = min(d, x.r.NextDeadline())
	}
	return d
}

// issueOneSided starts a one-sided ordered read; false if every reader
// is busy.
func (p *kvCliProc) issueOneSided(now time.Duration, rng *rand.Rand) bool {
	h := p.h
	if p.ord.mv != nil {
		return p.issueMoveRead(now, rng)
	}
	var o *ordRead
	for _, x := range p.ord.rs {
		if !x.r.Busy() {
			o = x
			break
		}
	}
	if o == nil {
		return false
	}
	stale := rng.IntN(3) == 0
	mode := Linearizable
	if stale {
		mode = StaleOK
	}
	key := func() string { return fmt.Sprintf("o%02d", rng.IntN(orderedKeys)) }
	o.recs, o.keys, o.stale = o.recs[:0], o.keys[:0], stale
	if rng.IntN(2) == 0 {
		k := key()
		o.op = kvcheck.Op{Kind: kvcheck.Get, Key: k, Stale: stale}
		o.recs = append(o.recs, h.rec.Begin(p.slot, o.op))
		o.r.BeginLookup([]byte(k), mode)
		h.stats.ordLookups++
	} else {
		start, end := "", ""
		if rng.IntN(3) > 0 {
			start = key()
		}
		if rng.IntN(2) == 0 {
			end = fmt.Sprintf("o%02d", rng.IntN(orderedKeys+1))
			if end <= start {
				end = ""
			}
		}
		limit := 0
		if rng.IntN(3) > 0 {
			limit = 1 + rng.IntN(8)
		}
		o.op = kvcheck.Op{Kind: kvcheck.Scan, Key: cmp.Or(start, "o"), End: cmp.Or(end, "p"), Limit: limit, Reverse: rng.IntN(2) == 0}
		if stale {
			for i := range orderedKeys {
				if k := fmt.Sprintf("o%02d", i); k >= o.op.Key && k < o.op.End {
					o.keys = append(o.keys, k)
					o.recs = append(o.recs, h.rec.Begin(p.slot, kvcheck.Op{Kind: kvcheck.Get, Key: k, Stale: true}))
				}
			}
		} else {
			o.recs = append(o.recs, h.rec.Begin(p.slot, o.op))
		}
		var e []byte
		if end != "" {
			e = []byte(end)
		}
		o.r.BeginScan([]byte(start), e, limit, mode, o.op.Reverse)
		h.stats.ordScans++
	}
	p.pollOneSided(now)
	return true
}

// pollOneSided polls the reads under way and records those that end.
func (p *kvCliProc) pollOneSided(now time.Duration) bool {
	if p.ord.mv != nil {
		return p.pollMoveReads(now)
	}
	progress := false
	for _, o := range p.ord.rs {
		if o.r.Busy() && o.r.Poll(now) {
			p.endOneSided(o)
			progress = true
		}
	}
	return progress
}

func (p *kvCliProc) endOneSided(o *ordRead) {
	h := p.h
	res, err := o.r.Result()
	o.r.st = osIdle
	h.stats.ordRetries += res.Retries
	h.stats.ordJoined += int(o.r.Joined - o.seen)
	o.seen = o.r.Joined
	if err != nil {
		for _, id := range o.recs {
			h.rec.End(id, kvcheck.Output{Unknown: true})
		}
		return
	}
	switch {
	case o.op.Kind == kvcheck.Get:
		out := kvcheck.Output{Found: res.Found, Value: string(res.Value), Group: 0}
		if o.stale {
			out.Applied = res.Applied
		}
		h.rec.End(o.recs[0], out)
	case !o.stale:
		out := kvcheck.Output{Group: 0}
		for _, kv := range res.Pairs {
			out.Pairs = append(out.Pairs, kvcheck.KV{Key: string(kv.Key), Value: string(kv.Value)})
		}
		h.rec.End(o.recs[0], out)
	default:
		got := map[string]string{}
		for _, kv := range res.Pairs {
			got[string(kv.Key)] = string(kv.Value)
		}
		// The keys the scan covered: all of its range, or up to its
		// last pair when the limit cut it.
		full := o.op.Limit == 0 || len(res.Pairs) < o.op.Limit
		var last string
		if len(res.Pairs) > 0 {
			last = string(res.Pairs[len(res.Pairs)-1].Key)
		}
		for i, k := range o.keys {
			covered := full || !o.op.Reverse && k <= last || o.op.Reverse && k >= last
			if !covered {
				h.rec.End(o.recs[i], kvcheck.Output{Unknown: true})
				continue
			}
			v, ok := got[k]
			h.rec.End(o.recs[i], kvcheck.Output{Found: ok, Value: v, Applied: res.Scanned, Group: 0})
		}
	}
}
