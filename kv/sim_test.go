package kv

import (
	"cmp"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/btree"
	"github.com/rdmakv/rdmakv/internal/kvcheck"
	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/sim"
)

// The kv simulator test: groups of kv replicas (TRAM over Acuerdo, the
// table in registered memory) and clients that write through multicast and
// get one-sided, both kinds, under crashes, partitions, isolated and
// crashed leaders, slow replicas and client crashes. The clients' history
// is checked with porcupine (linearizable gets and every write) and with
// kvcheck.CheckStale (stale-ok gets), and the replicas of each group must
// end with the same table.

var simFlags = sim.RegisterFlags(flag.CommandLine)

type diskStable struct{ d *sim.Disk }

func (s diskStable) Load() (broadcast.StableState, error) {
	b, ok := s.d.Get("acuerdo")
	if !ok {
		return broadcast.StableState{}, nil
	}
	if len(b) != 16 {
		return broadcast.StableState{}, broadcast.ErrCorrupt
	}
	return broadcast.StableState{Incarnation: binary.LittleEndian.Uint64(b), ENew: broadcast.Epoch(binary.LittleEndian.Uint64(b[8:]))}, nil
}

func (s diskStable) Save(st broadcast.StableState) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], st.Incarnation)
	binary.LittleEndian.PutUint64(b[8:], uint64(st.ENew))
	return s.d.Put("acuerdo", b[:])
}

type kvOpts struct {
	groups, replicas, clients int
	ops                       int           // per client
	keys                      int           // key space
	until                     time.Duration // clients stop issuing then; faults end then
	gap                       time.Duration // mean gap between a client's ops

	crashes, partitions, slow bool
	leaders                   int  // crash every group's leader at once, this many times
	isolate                   int  // cut every leader from its group-mates, this many times
	stall                     bool // and pause it meanwhile (a stopped process whose memory clients still read)
	downForGood               bool // a replica per group crashes at 3 ms for good
	clientCrash               bool
	bigValues                 bool         // some values need staged parts
	merges                    bool         // a quarter of the writes are on the keys m0-m7: merges mostly (kvCliProc.mergeOp)
	knobs                     testingKnobs // planted bugs (TestSimMutants)
	keysSet                   int          // key space (default 24)
	maxLoad                   float64      // the tables' MaxLoad (default kv's)
	// lag makes a follower of every group fall behind (cut from its
	// group-mates) until its leader's log is pruned past it, this many
	// times; it then catches up by a snapshot restored into its table,
	// which still holds the records it had (lagFollowers).
	lag int
	// newLeaderStall stalls every newly elected leader right after its
	// election, before its diff commits and is applied: half the time
	// stopped (its memory still served) for 0.5 to 3 ms, else slowed
	// 4 to 12 times for 2 to 4 ms. A replica that says it serves before
	// its diff is applied then serves a stale table for milliseconds,
	// not microseconds.
	newLeaderStall bool
	// crashAfterCommit crashes every group's leader right after it
	// applied and acknowledged an entry, this many times, 12 ms apart: the
	// followers may not have learnt that the entry committed, so the next
	// leader applies it only with its diff (kvRun.crashAfterCommit).
	crashAfterCommit int
	// logEntries is the groups' MaxLogEntries (0: 256), so that a lag of
	// a few milliseconds is past the pruned log; with it, the rings to
	// the followers are 4 KiB (64 KiB otherwise).
	logEntries int
	// batches: the run fails unless some leader ordered several
	// messages in one log entry (multicast's batch entries, applied with
	// one header publication).
	batches  bool
	overlap  float64 // sim.Options.ReadOverlap (sim_torn_test.go)
	readBack bool    // get each key written while its write is under way (sim_torn_test.go)
	// ordered: every replica has an ordered part (a btree.Store, group
	// 0 owning the keyspace) and half the clients' ops are ordered
	// (sim_ordered_test.go); skipOwnerCheck plants that bug in the stores.
	ordered, skipOwnerCheck bool
	// oneSided: ordered clients also look keys up and scan one-sided
	// (an OrderedReader of group 0; sim_ordered_test.go). skipFence
	// and staleSplit (staleCacheAfterSplit) plant those bugs in the
	// clients' caches; ordKnobs are the planted
	// bugs of the ordered readers (the hashed ones get knobs).
	oneSided, skipFence, staleSplit bool
	joinOlder                       bool // Delegation's planted bug in the clients
	ordReaders                      int  // OrderedReaders per client (orderedRunOpts: 2)
	ordKnobs                        testingKnobs
	// durable: the replicas keep a log and snapshots on their sim disks
	// (sync or async), with whole-group and majority crashes
	// (sim_durable_test.go). The zero value is memory mode.
	durable kvDurable
	// moves: ordered tablets over the groups and a mover process that
	// moves them while the clients run (sim_move_test.go).
	moves *moveOpts
}

type kvRun struct {
	o       kvOpts
	s       *sim.Sim
	t       *tree.Tree
	members [][]rdma.NodeID
	cnodes  []rdma.NodeID
	slots   []uint32
	group   map[rdma.NodeID]int
	procs   map[rdma.NodeID]*kvRepProc
	rng     *rand.Rand
	down    map[rdma.NodeID]bool
	gone    map[rdma.NodeID]bool
	clients map[rdma.NodeID]*kvCliProc
	rec     *kvcheck.Recorder
	mv      *moveRun // kvOpts.moves
	err     error
	dur     *durRun // kvOpts.durable (sim_durable_test.go)
	stats   struct {
		gets, stale, writes, unknown, retries, grown, deposed, restores, restoresOver, lags, stalls, batched, catchingUpPolls, touched int
		scans, moved, oneSided, leaves                                                                                                 int
		ordLookups, ordScans, ordRetries, ordJoined                                                                                    int
	}
}

func (h *kvRun) fail(err error) {
	if h.err == nil && err != nil {
		h.err = err
	}
}

type kvRepProc struct {
	h   *kvRun
	env *sim.Env
	r   *Replica
	now time.Duration
	// pausedUntil stops polling until then (SIGSTOP): the fabric still
	// serves the node's memory to one-sided reads.
	pausedUntil time.Duration
	// crashAtCommit: crash after the next Poll that applies an entry
	// (kvOpts.crashAfterCommit).
	crashAtCommit bool
	store         *btree.Store // kvOpts.ordered
	steps         int
}

func (p *kvRepProc) Start(env *sim.Env) error {
	h := p.h
	p.env = env
	id := env.ID()
	g := h.group[id]
	bc := broadcast.Config{
		Self: id, Seed: env.Rand().Uint64() | 1, Start: broadcast.StartNew,
		RingSize: 64 << 10, MaxRecord: 8 << 10, PersistInline: true, MaxSnapshot: 64 << 20,
		HeartbeatInterval: time.Millisecond, ElectionTimeout: 4 * time.Millisecond,
		MaxLogEntries: cmp.Or(h.o.logEntries, 256), MaxCatchUpLogEntries: 2 * cmp.Or(h.o.logEntries, 256), ProposeTimeout: time.Second,
		ReconnectMin: 100 * time.Microsecond, ReconnectMax: time.Millisecond,
	}
	if h.o.logEntries != 0 {
		// A ring of a few dozen entries, so that a follower cut off
		// for a few milliseconds cannot find what it missed there.
		bc.RingSize, bc.MaxRecord = 4096, 1024
	}
	if h.o.newLeaderStall {
		bc.OnEvent = func(ev broadcast.Event) {
			if ev.Kind == broadcast.EventLeader {
				p.stallNewLeader()
			}
		}
	}
	if env.Incarnation() > 1 {
		bc.Start = broadcast.StartExisting
	}
	cfg := ReplicaConfig{
		Multicast: multicast.Config{Group: tree.Group(g), Tree: h.t, Members: h.members, ClientNodes: h.cnodes,
			ClientSlots: 4, ParentSlots: 16, SlotSize: 512, MaxResult: MultiResultSize,
			RetransmitAfter: 5 * time.Millisecond, Broadcast: bc},
		Table: TableConfig{SlotMap: h.slots, MaxKey: 64, MaxValue: 4096, LogBuckets: 2, MigrateStep: 1, MaxLoad: h.o.maxLoad,
			HeapRegionSize: 1 << 16, Inc: uint64(env.Incarnation()), Clock: func() int64 { return int64(p.now) }},
	}
	if h.o.ordered {
		st, err := p.orderedStore(g)
		if err != nil {
			return err
		}
		p.store, cfg.Table.Ordered = st, st
	}
	if h.dur != nil {
		if err := h.dur.open(p, &cfg.Multicast.Broadcast); err != nil {
			return err
		}
	}
	r, err := NewReplica(cfg, env.Node(), diskStable{env.Disk()})
	if err != nil {
		return err
	}
	r.t.knobs = h.o.knobs
	r.t.knobs.noQuorum = r.t.knobs.noQuorum || h.o.ordKnobs.noQuorum // the deposed leader's serving word, below
	r.t.yield = env.Yield
	p.r = r
	h.procs[id] = p
	return nil
}

// stallNewLeader stalls a replica just elected (kvOpts.newLeaderStall),
// from its OnEvent: the Poll under way ends, then nothing more for a while.
func (p *kvRepProc) stallNewLeader() {
	h := p.h
	now := h.s.Now()
	id := p.env.ID()
	h.stats.stalls++
	if h.rng.IntN(2) == 0 {
		p.pausedUntil = now + 500*time.Microsecond + time.Duration(h.rng.Int64N(int64(2500*time.Microsecond)))
		return
	}
	h.s.SetSlow(id, 4+h.rng.IntN(9))
	h.s.At(now+2*time.Millisecond+time.Duration(h.rng.Int64N(int64(2*time.Millisecond))), func() {
		if h.s.Live(id) {
			h.s.SetSlow(id, 1)
		}
	})
}

func (p *kvRepProc) Step(now time.Duration) bool {
	if now < p.pausedUntil {
		p.env.WakeAt(p.pausedUntil)
		return false
	}
	p.now = now
	restores, held := p.r.t.restores, p.r.t.count
	delivered := p.r.Multicast().Delivered()
	progress := p.r.Poll(now)
	if p.crashAtCommit && p.r.Multicast().Delivered() > delivered {
		p.crashAtCommit = false
		id, h := p.env.ID(), p.h
		if g := h.group[id]; h.downIn(g) < (len(h.members[g])-1)/2 {
			h.s.At(now, func() { h.crashFor(id, 3*time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond)))) })
		}
	}
	if p.store != nil {
		p.checkOneSided()
	}
	if p.r.t.restores > restores && held > 0 {
		p.h.stats.restoresOver++ // a snapshot restored into a table holding records
	}
	// The header says what broadcast says of catching up, after every
	// Poll: clients tell a group that cannot elect (a majority catching
	// up) from it, and a member that caught up must say so at once, even
	// if it applies nothing for a while.
	if bc, hc := p.r.Multicast().Broadcast().Status().CatchingUp, p.r.t.Header().CatchingUp; bc != hc {
		p.h.fail(fmt.Errorf("node %d: header says catching up %v after a Poll, broadcast says %v", p.env.ID(), hc, bc))
	} else if bc {
		p.h.stats.catchingUpPolls++
	}
	if p.r.t.knobs.noQuorum && p.r.t.knobs.lastServed != 0 {
		// A deposed leader keeps its serving word.
		if _, ok := p.r.Multicast().Broadcast().Leading(); !ok {
			p.r.t.serving = p.r.t.knobs.lastServed
			p.r.t.publish()
		}
	}
	if d, g, s := p.r.Multicast().Anomalies(); d+g+s != 0 {
		p.h.fail(fmt.Errorf("node %d: log anomalies: %d duplicates, %d gaps, %d stale", p.env.ID(), d, g, s))
	}
	p.env.WakeAt(p.r.NextDeadline())
	return progress
}

// kvCliProc is a client: writes through a multicast.Client, gets through a
// GroupReader per group, one get at a time.
type kvCliProc struct {
	h       *kvRun
	env     *sim.Env
	c       *multicast.Client
	slot    int
	readers []*GroupReader
	getRec  []int // the recorder id of each reader's get
	getOp   []kvcheck.Op
	ord     *oneSidedReads // kvOpts.oneSided
	writes  map[multicast.MsgID]pendingWrite
	issued  int
	next    time.Duration
	seq     int
	staged  map[multicast.MsgID]bool
	resend  []pendingWrite // ordered requests a non-owner refused, for group 0
}

type pendingWrite struct {
	rec   int
	multi []kvcheck.Op // a multi request's ops, recorded as multiRec
	mrec  []int
	recs  map[int]int // a batch spanning groups: one record per group
	op    kvcheck.Op
	part  bool // a part of a staged request: no record
	ord   *ordPending
}

func (p *kvCliProc) Start(env *sim.Env) error {
	h := p.h
	p.env = env
	p.writes = map[multicast.MsgID]pendingWrite{}
	cfg := multicast.ClientConfig{Slot: uint32(p.slot), Inc: uint64(env.Incarnation()), Tree: h.t, Members: h.members,
		ClientSlots: 4, SlotSize: 512, MaxResult: MultiResultSize, RetryAfter: 10 * time.Millisecond,
		ReconnectMin: 100 * time.Microsecond, ReconnectMax: time.Millisecond,
		OnDone: p.done}
	c, err := multicast.NewClient(cfg, env.Node())
	if err != nil {
		return err
	}
	p.c = c
	p.readers = make([]*GroupReader, len(h.members))
	p.getRec = make([]int, len(h.members))
	p.getOp = make([]kvcheck.Op, len(h.members))
	for g := range h.members {
		p.readers[g] = NewGroupReader(env.Node(), uint32(g), h.members[g], p.slot)
		p.readers[g].knobs = h.o.knobs
	}
	if h.o.oneSided {
		p.startOneSided()
	}
	return nil
}

// done records a write's outcome.
func (p *kvCliProc) done(o *multicast.Outcome) {
	pw, ok := p.writes[o.ID]
	if !ok {
		return
	}
	delete(p.writes, o.ID)
	if pw.part {
		return
	}
	if pw.ord != nil {
		p.doneOrdered(o, pw)
		return
	}
	if pw.multi != nil {
		if len(o.Replies) != 1 {
			p.h.fail(fmt.Errorf("client %d: %d replies to a multi request", p.slot, len(o.Replies)))
			return
		}
		rp := o.Replies[0]
		rs, err := DecodeMultiResult(rp.Result, nil)
		if err != nil || len(rs) != len(pw.multi) {
			p.h.fail(fmt.Errorf("client %d: multi result: %d results for %d ops, %v", p.slot, len(rs), len(pw.multi), err))
			return
		}
		for i, r := range rs {
			ok := r.Status == StatusOK
			if pw.multi[i].Kind != kvcheck.CAS && !ok {
				p.h.fail(fmt.Errorf("client %d: unconditional %v of a multi request failed", p.slot, pw.multi[i].Kind))
			}
			out := kvcheck.Output{OK: ok, Group: int(rp.Group)}
			if ok {
				out.Index, out.Version = rp.Index, r.Version
				if r.Version != rp.Index<<16|uint64(i) {
					p.h.fail(fmt.Errorf("client %d: multi op %d got version %x at index %d", p.slot, i, r.Version, rp.Index))
				}
			}
			p.h.rec.End(pw.mrec[i], out)
		}
		return
	}
	out := kvcheck.Output{OK: true}
	for _, rp := range o.Replies {
		res, err := DecodeResult(rp.Result)
		if err != nil {
			p.h.fail(fmt.Errorf("client %d: reply of group %d: %v", p.slot, rp.Group, err))
			return
		}
		if res.Status == StatusMalformed {
			p.h.fail(fmt.Errorf("client %d: group %d refused %v as malformed", p.slot, rp.Group, pw.op.Kind))
			return
		}
		if res.Status == StatusCondFailed {
			out.OK = false
		}
		if len(o.Replies) == 1 && res.Count > 0 {
			out.Index, out.Version, out.Group = rp.Index, res.Version, int(rp.Group)
			if res.Version>>16 != rp.Index {
				p.h.fail(fmt.Errorf("client %d: version %x of a write at index %d", p.slot, res.Version, rp.Index))
			}
		}
	}
	if pw.op.Kind != kvcheck.CAS && pw.op.Kind != kvcheck.Merge && !out.OK {
		p.h.fail(fmt.Errorf("client %d: unconditional %v failed its condition", p.slot, pw.op.Kind))
	}
	if pw.recs != nil {
		for g, id := range pw.recs {
			out := kvcheck.Output{OK: true}
			for _, rp := range o.Replies {
				if int(rp.Group) == g {
					res, _ := DecodeResult(rp.Result)
					out.Index, out.Version, out.Group = rp.Index, res.Version, g
				}
			}
			p.h.rec.End(id, out)
		}
		return
	}
	p.h.rec.End(pw.rec, out)
}

func (p *kvCliProc) Step(now time.Duration) bool {
	h := p.h
	progress := p.c.Poll(now)
	if len(p.resend) > 0 && p.flushResends() {
		progress = true
	}
	wake := p.c.NextDeadline()
	for g, r := range p.readers {
		if !r.Busy() {
			continue
		}
		if r.Poll(now) {
			p.endGet(g)
			progress = true
		} else {
			wake = min(wake, r.NextDeadline())
		}
	}
	if h.dur != nil && now >= h.o.until {
		if h.dur.finalReads(p, now) {
			progress = true
		}
		if !h.dur.readAll(p) {
			wake = min(wake, now+50*time.Microsecond)
		}
	}
	for p.c.Ready() && p.issued < h.o.ops && now < h.o.until && now >= p.next {
		if !p.issue(now) {
			break
		}
		p.issued++
		p.next = now + time.Duration(p.env.Rand().Int64N(int64(2*h.o.gap)))
		progress = true
	}
	if p.issued < h.o.ops && now < h.o.until || len(p.resend) > 0 {
		wake = min(wake, max(p.next, now+50*time.Microsecond))
	}
	for _, r := range p.readers {
		if r.Busy() {
			wake = min(wake, now+20*time.Microsecond)
		}
	}
	if p.ord != nil {
		if p.pollOneSided(now) {
			progress = true
		}
		if p.ord.busy() {
			wake = min(wake, p.ord.nextDeadline(), now+20*time.Microsecond)
		}
	}
	p.env.WakeAt(wake)
	return progress
}

var debugDeposed = false

func (p *kvCliProc) endGet(g int) {
	r := p.readers[g]
	res, err := r.Result()
	r.st = gsIdle
	p.h.stats.retries += res.Retries
	if err != nil {
		p.h.rec.End(p.getRec[g], kvcheck.Output{Unknown: true})
		return
	}
	if res.Epoch != 0 {
		id := p.h.members[g][res.Member]
		if rp := p.h.procs[id]; rp != nil {
			if e, ok := rp.r.Multicast().Broadcast().Leading(); !ok || uint64(e) != res.Epoch {
				p.h.stats.deposed++
				if debugDeposed {
					fmt.Printf("%v: get %s from node %d epoch %x (leading %v %x), found %v %q\n", p.h.s.Now(), string(p.readers[g].key), id, res.Epoch, ok, e, res.Found, res.Value)
				}
			}
		}
	}
	p.h.rec.End(p.getRec[g], kvcheck.Output{Found: res.Found, Value: string(res.Value), Applied: res.Applied, Group: g})
}

func (p *kvCliProc) key(rng *rand.Rand) string { return fmt.Sprintf("k%d", rng.IntN(p.h.o.keys)) }

// getKey is the key of a get: a third of them on the merged keys m0-m7
// when the run has merges.
func (p *kvCliProc) getKey(rng *rand.Rand) string {
	if p.h.o.merges && rng.IntN(3) == 0 {
		return fmt.Sprintf("m%d", rng.IntN(8))
	}
	return p.key(rng)
}

// mergeOp is a write on the merged keys m0-m7: mostly a merge of one or
// two of the fields f0-f3, with unique values; sometimes a delete, or a
// put of a value that is not a fielded value (which the merges after it
// fail on until a delete).
func (p *kvCliProc) mergeOp(rng *rand.Rand) ([]Op, kvcheck.Op) {
	k := fmt.Sprintf("m%d", rng.IntN(8))
	switch r := rng.IntN(12); {
	case r == 0:
		return []Op{{Kind: OpDelete, Key: []byte(k)}}, kvcheck.Op{Kind: kvcheck.Delete, Key: k}
	case r == 1:
		v := p.value(rng) // "c...": not a fielded value
		return []Op{{Kind: OpPut, Key: []byte(k), Value: []byte(v)}}, kvcheck.Op{Kind: kvcheck.Put, Key: k, Value: v}
	}
	f := map[string]string{}
	for range 1 + rng.IntN(2) {
		f[fmt.Sprintf("f%d", rng.IntN(4))] = p.value(rng)
	}
	v := kvcheck.EncodeFields(f)
	return []Op{{Kind: OpMerge, Key: []byte(k), Value: []byte(v)}}, kvcheck.Op{Kind: kvcheck.Merge, Key: k, Fields: f}
}

func (p *kvCliProc) value(rng *rand.Rand) string {
	p.seq++
	v := fmt.Sprintf("c%d.%d.%d", p.slot, p.env.Incarnation(), p.seq)
	if p.h.o.bigValues && rng.IntN(4) == 0 {
		v += strings.Repeat("x", 600+rng.IntN(2000)) // staged in parts
	}
	return v
}

// issue starts one random operation; false if there is no room now.
func (p *kvCliProc) issue(now time.Duration) bool {
	h := p.h
	rng := p.env.Rand()
	if h.o.ordered && rng.IntN(2) == 0 {
		if h.o.oneSided && rng.IntN(3) == 0 {
			return p.issueOneSided(now, rng)
		}
		return p.issueOrdered(rng)
	}
	x := rng.IntN(100)
	if x < 45 {
		k := p.getKey(rng)
		g := int(h.slots[HashSlot([]byte(k))])
		r := p.readers[g]
		if r.Busy() {
			return false
		}
		stale := x >= 30
		mode := Linearizable
		if stale {
			mode = StaleOK
			h.stats.stale++
		}
		h.stats.gets++
		op := kvcheck.Op{Client: p.slot, Kind: kvcheck.Get, Key: k, Stale: stale}
		p.getRec[g] = h.rec.Begin(p.slot, op)
		r.Begin([]byte(k), mode)
		if r.Poll(now) {
			p.endGet(g)
		}
		return true
	}
	if p.c.Outstanding() >= p.c.Window()-1 {
		return false
	}
	var ops []Op
	var op kvcheck.Op
	if x >= 90 && x < 95 {
		return p.issueMulti(rng)
	}
	switch {
	case h.o.merges && rng.IntN(4) == 0:
		ops, op = p.mergeOp(rng)
	case x < 70:
		k, v := p.key(rng), p.value(rng)
		ops = []Op{{Kind: OpPut, Key: []byte(k), Value: []byte(v)}}
		op = kvcheck.Op{Kind: kvcheck.Put, Key: k, Value: v}
	case x < 78:
		k := p.key(rng)
		ops = []Op{{Kind: OpDelete, Key: []byte(k)}}
		op = kvcheck.Op{Kind: kvcheck.Delete, Key: k}
	case x < 90:
		k, v := p.key(rng), p.value(rng)
		op = kvcheck.Op{Kind: kvcheck.CAS, Key: k, Value: v}
		cmp := Op{Kind: OpPut, Cmp: CmpValue, Key: []byte(k), Value: []byte(v)}
		if rng.IntN(3) == 0 {
			op.OldAbsent, cmp.CmpVersion = true, 1
		} else {
			op.Old = fmt.Sprintf("c%d.%d.%d", rng.IntN(h.o.clients), 1, max(1, p.seq-rng.IntN(3)))
			cmp.CmpValue = []byte(op.Old)
		}
		ops = []Op{cmp}
	default:
		// A batch's keys come from one family of 4 keys, so that the
		// linearizability check's partitions (keys linked by batches)
		// stay small.
		op = kvcheck.Op{Kind: kvcheck.Batch}
		fam := rng.IntN(h.o.keys / 4)
		for range 2 + rng.IntN(2) {
			k := fmt.Sprintf("k%d", fam*4+rng.IntN(4))
			if rng.IntN(4) == 0 {
				ops = append(ops, Op{Kind: OpDelete, Key: []byte(k)})
				op.Batch = append(op.Batch, kvcheck.BatchOp{Key: k, Delete: true})
			} else {
				v := p.value(rng)
				ops = append(ops, Op{Kind: OpPut, Key: []byte(k), Value: []byte(v)})
				op.Batch = append(op.Batch, kvcheck.BatchOp{Key: k, Value: v})
			}
		}
	}
	var dst tree.Set
	for i := range ops {
		dst = dst.Add(tree.Group(h.slots[HashSlot(ops[i].Key)]))
	}
	req := AppendRequest(nil, ops)
	op.Client = p.slot
	if len(req) > multicast.MaxPayload(512) {
		// Staged: the parts first (their order does not matter), then
		// the commit, all within the window (4 slots: at most 3 parts).
		chunk := multicast.MaxPayload(512) - PartOverhead
		nparts := (len(req) + chunk - 1) / chunk
		if p.c.Outstanding()+nparts+1 > p.c.Window() {
			return false
		}
		p.seq++
		id := StageID{Client: uint32(p.slot), Inc: uint64(p.env.Incarnation()), Stage: uint64(p.seq)}
		for off := 0; off < len(req); off += chunk {
			mid, err := p.c.Multicast(dst, AppendPart(nil, id, len(req), off, req[off:min(off+chunk, len(req))]))
			if errors.Is(err, multicast.ErrWindowFull) {
				return false // the parts sent are evicted by later stages
			}
			if err != nil {
				h.fail(fmt.Errorf("client %d: part: %v", p.slot, err))
				return false
			}
			p.writes[mid] = pendingWrite{part: true}
		}
		req = AppendCommit(nil, id, len(req))
	}
	mid, err := p.c.Multicast(dst, req)
	if errors.Is(err, multicast.ErrWindowFull) {
		return false
	}
	if err != nil {
		h.fail(fmt.Errorf("client %d: multicast: %v", p.slot, err))
		return false
	}
	// Begun after the write was posted, at the same virtual time (the
	// clock does not move within a step). A batch spanning groups is
	// recorded as one batch per group: each group applies its part
	// atomically, but a reader may see one group's part before another
	// group applied its own (docs/kv.md, "Batches"), so atomicity holds
	// per group.
	if op.Kind == kvcheck.Batch && dst.Len() > 1 {
		recs := map[int]int{}
		for g := range h.members {
			var part kvcheck.Op
			for _, bo := range op.Batch {
				if int(h.slots[HashSlot([]byte(bo.Key))]) == g {
					part.Batch = append(part.Batch, bo)
				}
			}
			if len(part.Batch) > 0 {
				part.Client, part.Kind = p.slot, kvcheck.Batch
				recs[g] = h.rec.Begin(p.slot, part)
			}
		}
		p.writes[mid] = pendingWrite{recs: recs, op: op}
		h.stats.writes++
		return true
	}
	rid := h.rec.Begin(p.slot, op)
	p.writes[mid] = pendingWrite{rec: rid, op: op}
	h.stats.writes++
	if h.o.readBack {
		p.readBack(now, rng, op.Key)
	}
	return true
}

// issueMulti sends a multi request: 2 or 3 independent single-key ops on
// keys of one group (what the client library's write combining sends),
// each recorded as its own op.
func (p *kvCliProc) issueMulti(rng *rand.Rand) bool {
	h := p.h
	g := uint32(rng.IntN(len(h.members)))
	var ops []Op
	var rec []kvcheck.Op
	for tries := 0; len(ops) < 2+rng.IntN(2) && tries < 64; tries++ {
		k := p.key(rng)
		if h.slots[HashSlot([]byte(k))] != g {
			continue
		}
		switch rng.IntN(3) {
		case 0:
			v := p.value(rng)
			ops = append(ops, Op{Kind: OpPut, Key: []byte(k), Value: []byte(v)})
			rec = append(rec, kvcheck.Op{Kind: kvcheck.Put, Key: k, Value: v})
		case 1:
			ops = append(ops, Op{Kind: OpDelete, Key: []byte(k)})
			rec = append(rec, kvcheck.Op{Kind: kvcheck.Delete, Key: k})
		default:
			v := p.value(rng)
			ops = append(ops, Op{Kind: OpPut, Cmp: CmpValue, Key: []byte(k), Value: []byte(v), CmpVersion: 1})
			rec = append(rec, kvcheck.Op{Kind: kvcheck.CAS, Key: k, Value: v, OldAbsent: true})
		}
	}
	req := AppendMulti(nil, ops)
	if len(ops) == 0 || len(req) > multicast.MaxPayload(512) {
		return false
	}
	mid, err := p.c.Multicast(tree.Of(g), req)
	if errors.Is(err, multicast.ErrWindowFull) {
		return false
	}
	if err != nil {
		h.fail(fmt.Errorf("client %d: multi: %v", p.slot, err))
		return false
	}
	pw := pendingWrite{multi: rec}
	for _, o := range rec {
		o.Client = p.slot
		pw.mrec = append(pw.mrec, h.rec.Begin(p.slot, o))
	}
	p.writes[mid] = pw
	h.stats.writes++
	return true
}

func (h *kvRun) leaderOf(g int) (rdma.NodeID, bool) {
	for _, id := range h.members[g] {
		if p := h.procs[id]; p != nil && h.s.Live(id) {
			if _, ok := p.r.Multicast().Broadcast().Leading(); ok {
				return id, true
			}
		}
	}
	return 0, false
}

func (h *kvRun) downIn(g int) int {
	k := 0
	for _, id := range h.members[g] {
		if h.down[id] || h.gone[id] || h.procs[id] != nil && h.s.Live(id) && h.procs[id].r.Multicast().Broadcast().Status().CatchingUp {
			k++
		}
	}
	return k
}

func (h *kvRun) crashFor(id rdma.NodeID, d time.Duration) {
	if h.down[id] || !h.s.Live(id) {
		return
	}
	if err := h.s.Crash(id); err != nil {
		h.fail(err)
		return
	}
	h.down[id] = true
	h.s.At(h.s.Now()+d, func() {
		if !h.s.Live(id) {
			if err := h.s.Restart(id, true); err != nil {
				h.fail(fmt.Errorf("restart %d: %v", id, err))
			}
		}
		delete(h.down, id)
	})
}

func (h *kvRun) scheduleFaults(at time.Duration) {
	h.s.At(at, func() {
		now := h.s.Now()
		if now >= h.o.until-5*time.Millisecond {
			return
		}
		var kinds []int
		if h.o.crashes {
			kinds = append(kinds, 0)
		}
		if h.o.partitions {
			kinds = append(kinds, 1)
		}
		if h.o.slow {
			kinds = append(kinds, 2)
		}
		if h.o.clientCrash {
			kinds = append(kinds, 3)
		}
		g := h.rng.IntN(len(h.members))
		ms := h.members[g]
		id := ms[h.rng.IntN(len(ms))]
		d := time.Millisecond + time.Duration(h.rng.Int64N(int64(8*time.Millisecond)))
		switch kinds[h.rng.IntN(len(kinds))] {
		case 0:
			if h.downIn(g) < (len(ms)-1)/2 {
				h.crashFor(id, d)
			}
		case 1:
			all := h.s.Nodes()
			other := all[h.rng.IntN(len(all))]
			if other != id {
				if h.rng.IntN(2) == 0 {
					h.s.Cut(id, other)
				} else {
					h.s.Partition(id, other)
				}
				h.s.At(now+d, func() {
					h.s.Heal(id, other)
					h.s.Heal(other, id)
				})
			}
		case 2:
			h.s.SetSlow(id, 2+h.rng.IntN(8))
			h.s.At(now+d, func() { h.s.SetSlow(id, 1) })
		case 3:
			c := h.cnodes[h.rng.IntN(len(h.cnodes))]
			if !h.down[c] {
				h.crashClient(c, d)
			}
		}
		h.scheduleFaults(now + time.Millisecond + time.Duration(h.rng.Int64N(int64(3*time.Millisecond))))
	})
}

// crashClient crashes a client: its writes under way get an unknown
// outcome, its gets are dropped.
func (h *kvRun) crashClient(id rdma.NodeID, d time.Duration) {
	if p := h.clients[id]; p != nil && h.s.Live(id) {
		{
			for _, pw := range p.writes {
				for _, id := range pw.recs {
					h.rec.End(id, kvcheck.Output{Unknown: true})
				}
				if !pw.part && pw.recs == nil && pw.mrec == nil {
					h.rec.End(pw.rec, kvcheck.Output{Unknown: true})
				}
				if !pw.part {
					h.stats.unknown++
				}
			}
			p.writes = map[multicast.MsgID]pendingWrite{}
			for _, pw := range p.resend {
				h.rec.End(pw.rec, kvcheck.Output{Unknown: true})
				h.stats.unknown++
			}
			p.resend = nil
			for g, r := range p.readers {
				if r.Busy() {
					h.rec.End(p.getRec[g], kvcheck.Output{Unknown: true})
				}
			}
		}
	}
	h.crashFor(id, d)
}

func (h *kvRun) crashLeaders(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g := range h.members {
			if id, ok := h.leaderOf(g); ok && h.downIn(g) < (len(h.members[g])-1)/2 {
				h.crashFor(id, 3*time.Millisecond+time.Duration(h.rng.Int64N(int64(3*time.Millisecond))))
			}
		}
		h.crashLeaders(at+12*time.Millisecond, times-1)
	})
}

// isolateLeaders cuts every group's leader from its group-mates (not from
// clients): a deposed leader whose memory clients still read.
func (h *kvRun) isolateLeaders(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g, ms := range h.members {
			id, ok := h.leaderOf(g)
			if !ok {
				continue
			}
			if h.o.stall {
				h.procs[id].pausedUntil = h.s.Now() + 8*time.Millisecond
			}
			for _, o := range ms {
				if o != id {
					h.s.Partition(id, o)
					h.s.At(h.s.Now()+4*time.Millisecond+time.Duration(h.rng.Int64N(int64(4*time.Millisecond))), func() {
						h.s.HealPair(id, o)
					})
				}
			}
		}
		h.isolateLeaders(at+12*time.Millisecond, times-1)
	})
}

// lagFollowers makes one follower of every group lag, times times, 20 ms
// apart: cut from its group-mates both ways (clients still reach it) until
// its leader's log is pruned past what it committed, or 15 ms at most. It
// then catches up with a snapshot restored into its table, which still
// holds what it had before (kvOpts.lag). (A stopped follower would not do:
// the leader's writes land in its ring meanwhile, and it catches up from
// there.)
func (h *kvRun) lagFollowers(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g, ms := range h.members {
			lid, ok := h.leaderOf(g)
			if !ok {
				continue
			}
			var fs []rdma.NodeID
			for _, id := range ms {
				if id != lid && h.s.Live(id) && !h.down[id] && !h.gone[id] && h.procs[id] != nil && h.procs[id].pausedUntil <= h.s.Now() {
					fs = append(fs, id)
				}
			}
			if len(fs) == 0 || h.downIn(g) > 0 {
				continue
			}
			id := fs[h.rng.IntN(len(fs))]
			p := h.procs[id]
			for _, o := range ms {
				if o != id {
					h.s.Partition(id, o)
				}
			}
			h.stats.lags++
			end := h.s.Now() + 15*time.Millisecond
			var check func()
			check = func() {
				past := false
				if l, ok := h.leaderOf(g); ok && h.procs[id] == p {
					fc, lst := p.r.Multicast().Broadcast().Status().Committed, h.procs[l].r.Multicast().Broadcast().Status()
					// Past the pruned log, and by more entries than the
					// ring holds.
					past = fc.Less(lst.Pruned) && (fc.E != lst.Committed.E || lst.Committed.Cnt-fc.Cnt >= 64)
				}
				if !past && h.s.Now() < end {
					h.s.At(h.s.Now()+500*time.Microsecond, check)
					return
				}
				for _, o := range ms {
					if o != id {
						h.s.HealPair(id, o)
					}
				}
			}
			h.s.At(h.s.Now()+500*time.Microsecond, check)
		}
		h.lagFollowers(at+20*time.Millisecond, times-1)
	})
}

// crashAfterCommit arms every group's leader, times times, 12 ms apart:
// it crashes right after the next Poll in which it applied (so
// committed, and acknowledged) an entry, in the same instant, so that
// of what that Poll queued, its replies to clients and its commit row to
// the followers, a random prefix per connection lands
// (kvOpts.crashAfterCommit).
func (h *kvRun) crashAfterCommit(at time.Duration, times int) {
	if times == 0 {
		return
	}
	h.s.At(at, func() {
		for g := range h.members {
			if id, ok := h.leaderOf(g); ok && h.downIn(g) < (len(h.members[g])-1)/2 {
				h.procs[id].crashAtCommit = true
			}
		}
		h.crashAfterCommit(at+12*time.Millisecond, times-1)
	})
}

func runKV(sd sim.Seed, o kvOpts) (*kvRun, error) {
	opts := sd.Options()
	opts.Tick = -1
	opts.ReadOverlap = o.overlap
	s := sim.New(opts)
	defer s.Close()
	parents := make([]int, o.groups)
	for g := range parents {
		parents[g] = g - 1
	}
	t, err := tree.FromParents(parents)
	if err != nil {
		return nil, err
	}
	h := &kvRun{o: o, s: s, t: t, group: map[rdma.NodeID]int{}, procs: map[rdma.NodeID]*kvRepProc{},
		clients: map[rdma.NodeID]*kvCliProc{}, rng: rand.New(rand.NewPCG(sd.Seed, 0x6b76)),
		down: map[rdma.NodeID]bool{}, gone: map[rdma.NodeID]bool{}}
	h.rec = kvcheck.NewRecorder(func() int64 { return int64(s.Now()) })
	if o.durable.mode != 0 {
		h.dur = newDurRun(h)
	}
	h.slots = make([]uint32, NumHashSlots)
	for i := range h.slots {
		h.slots[i] = uint32(i % o.groups)
	}
	next := rdma.NodeID(1)
	for g := range o.groups {
		var ms []rdma.NodeID
		for range o.replicas {
			ms = append(ms, next)
			h.group[next] = g
			next++
		}
		h.members = append(h.members, ms)
	}
	for range o.clients {
		h.cnodes = append(h.cnodes, next)
		next++
	}
	for _, ms := range h.members {
		for _, id := range ms {
			if err := s.AddNode(id, func() sim.Process { return &kvRepProc{h: h} }); err != nil {
				return nil, err
			}
		}
	}
	for k, id := range h.cnodes {
		if err := s.AddNode(id, func() sim.Process {
			p := &kvCliProc{h: h, slot: k}
			h.clients[id] = p
			return p
		}); err != nil {
			return nil, err
		}
	}
	if o.moves != nil {
		if err := h.setupMoves(); err != nil {
			return nil, err
		}
	}
	s.Invariant(func() error { return h.err })
	if o.crashes || o.partitions || o.slow || o.clientCrash {
		h.scheduleFaults(5 * time.Millisecond)
	}
	h.crashLeaders(8*time.Millisecond, o.leaders)
	h.isolateLeaders(10*time.Millisecond, o.isolate)
	h.lagFollowers(7*time.Millisecond, o.lag)
	h.crashAfterCommit(8*time.Millisecond, o.crashAfterCommit)
	if h.dur != nil {
		h.dur.schedule()
	}
	if o.downForGood {
		s.At(3*time.Millisecond, func() {
			for _, ms := range h.members {
				id := ms[h.rng.IntN(len(ms))]
				if err := s.Crash(id); err != nil {
					h.fail(err)
				}
				h.gone[id] = true
			}
		})
	}
	if err := s.RunUntil(o.until); err != nil {
		return h, err
	}
	converged := func() bool {
		if h.mv != nil && !h.mv.settled() {
			return false
		}
		for id, p := range h.clients {
			if !h.s.Live(id) {
				continue
			}
			if len(p.writes) > 0 || len(p.resend) > 0 || !p.c.Ready() || h.dur != nil && !h.dur.readAll(p) {
				return false
			}
			for _, r := range p.readers {
				if r.Busy() {
					return false
				}
			}
		}
		for _, ms := range h.members {
			var want uint64
			for _, id := range ms {
				if !h.gone[id] {
					want = max(want, h.procs[id].r.Multicast().Delivered())
				}
			}
			for _, id := range ms {
				if !h.gone[id] && h.procs[id].r.Multicast().Delivered() != want {
					return false
				}
			}
		}
		return true
	}
	if err := s.Await(converged, o.until+2*time.Second); err != nil {
		if h.err != nil {
			return h, h.err
		}
		return h, fmt.Errorf("no convergence: %w\n%s", err, h.dump())
	}
	if h.err != nil {
		return h, h.err
	}
	// Every live replica of a group holds the same records.
	for g, ms := range h.members {
		var ref map[string]uint64
		var refID rdma.NodeID
		for _, id := range ms {
			if h.gone[id] {
				continue
			}
			tb := h.procs[id].r.t
			if tb.Stats().Gen > 0 {
				h.stats.grown++
			}
			// messages ordered in a batch after its first (this
			// incarnation, as leader)
			c := h.procs[id].r.Multicast().Counters()
			h.stats.batched += int(c.Ordered - c.Batches)
			h.stats.touched += int(tb.batchTouches) // batches prefetched (prefetch.go)
			h.stats.restores += tb.Stats().Restores
			got := tb.contents()
			if ref == nil {
				ref, refID = got, id
				continue
			}
			if err := sameContents(ref, got); err != nil {
				return h, fmt.Errorf("group %d: node %d and node %d differ: %v", g, refID, id, err)
			}
		}
	}
	hist := h.rec.History()
	if h.dur != nil && h.dur.outages() {
		// A whole-group outage: CheckDurable (sim_durable_test.go).
		if err := h.dur.check(hist); err != nil {
			return h, err
		}
	} else {
		res, err := kvcheck.CheckLinearizable(hist, 60*time.Second)
		if err != nil {
			return h, err
		}
		if err := res.Err(); err != nil {
			return h, fmt.Errorf("linearizability: %w\n%s", err, failedOps(hist, res))
		}
		if err := kvcheck.CheckStale(hist); err != nil {
			return h, fmt.Errorf("stale-ok gets: %w", err)
		}
	}
	if o.ordered {
		if err := h.checkOrdered(); err != nil {
			return h, err
		}
	}

	if sd.Trace || testing.Verbose() && sd.Seed <= 2 {
		fmt.Printf("seed %d: %d messages ordered in a batch after its first\n", sd.Seed, h.stats.batched)
		fmt.Printf("seed %d: %d ops (%d gets, %d stale-ok, %d writes, %d unknown), %d get retries, %d tables grown, %d snapshots restored (%d of %d lags into a table holding records), %d linearizable gets served by a deposed leader\n",
			sd.Seed, len(hist), h.stats.gets, h.stats.stale, h.stats.writes, h.stats.unknown, h.stats.retries, h.stats.grown, h.stats.restores, h.stats.restoresOver, h.stats.lags, h.stats.deposed)
		if h.o.merges {
			merges, applied, gets := 0, 0, 0
			for i := range hist {
				switch o := &hist[i]; {
				case o.Kind == kvcheck.Merge:
					merges++
					if o.Out.OK {
						applied++
					}
				case o.Kind == kvcheck.Get && !o.Stale && o.Out.Found && strings.HasPrefix(o.Key, "m"):
					gets++
				}
			}
			fmt.Printf("seed %d: %d merges, %d applied; %d linearizable gets found a merged key's value\n", sd.Seed, merges, applied, gets)
		}
	}
	return h, nil
}

// contents maps every key to its version (polling goroutine).
func (t *Table) contents() map[string]uint64 {
	out := map[string]uint64{}
	t.eachSlot(func(s Slot) { out[string(t.recordKey(s))] = s.Version })
	return out
}

func sameContents(a, b map[string]uint64) error {
	for k, v := range a {
		if b[k] != v {
			return fmt.Errorf("key %q: version %x and %x", k, v, b[k])
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			return fmt.Errorf("key %q: absent and version %x", k, v)
		}
	}
	return nil
}

const kvSimSeeds = 100

var kvSimCases = []struct {
	name string
	o    kvOpts
}{
	{"calm", kvOpts{ops: 60, gap: 500 * time.Microsecond}},
	{"faults", kvOpts{ops: 80, crashes: true, partitions: true, slow: true, merges: true}},
	{"leaders", kvOpts{ops: 80, leaders: 2, isolate: 3}},
	// stalled: every leader is cut from its group and stalled at once
	// (its memory stays readable): the group elects past it while
	// clients still read its table.
	{"stalled-leaders", kvOpts{ops: 100, isolate: 4, stall: true, gap: 100 * time.Microsecond}},
	{"down-for-good", kvOpts{ops: 60, downForGood: true, partitions: true}},
	{"clients", kvOpts{ops: 60, clientCrash: true, crashes: true, bigValues: true, merges: true}},
	// growth: 160 keys in tables of 4 buckets to start with, so that the
	// index grows through several generations while gets read it.
	{"growth", kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond, crashes: true}},
	// full-buckets: tables filled to 95% before they grow, so that puts
	// find a key's four buckets full and grow the index in the middle of
	// a request.
	{"full-buckets", kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond, maxLoad: 0.95}},
	// lagging-restore: a follower of every group falls behind (cut off)
	// until its leader's log of 16 entries is pruned past it,
	// twice, and catches up with a snapshot restored into a table that
	// still holds its old records; its table must then equal its
	// leader's.
	{"lagging-restore", kvOpts{ops: 200, gap: 200 * time.Microsecond, lag: 2, logEntries: 16}},
	// slow-new-leaders: every group's leader crashes right after it
	// acknowledged a write, which its followers may not know committed,
	// and every new leader stalls between its election and the commit
	// (and apply) of its diff. A get served from its table in that
	// window has milliseconds to find it stale.
	{"slow-new-leaders", kvOpts{ops: 150, crashAfterCommit: 4, newLeaderStall: true, gap: 100 * time.Microsecond}},
	// batches: 8 clients busy enough that leaders order several writes in
	// one entry (one header publication for them), with leaders crashing
	// right after they applied one, crashing at once, and replicas and
	// clients crashing.
	{"batches", kvOpts{ops: 150, gap: 40 * time.Microsecond, batches: true, crashAfterCommit: 2, leaders: 1, crashes: true, clientCrash: true, merges: true, clients: 8}},
}

func TestSim(t *testing.T) {
	simNoRace(t)
	// -seeds N (any N, kvSimSeeds included) runs N a case; without it
	// kvSimSeeds a case (make norace; the batches case a third), 1 under the race detector (a seed
	// is one goroutine: the detector has little to check in it), a tenth
	// with -short. The cases run in parallel, each seed its own Sim.
	def := kvSimSeeds
	if raceEnabled {
		def = 1
	}
	flags := simFlags.WithDefault(def)
	// The batches case (8 clients, crashes aimed at batches) takes ~4
	// times a plain case's time a seed: a third of the seeds by default.
	batchFlags := simFlags.WithDefault(max(1, def/3))
	for _, c := range kvSimCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := c.o
			flags := flags
			if o.batches {
				flags = batchFlags
			}
			o.groups, o.replicas, o.clients, o.keys = 2, 3, cmp.Or(o.clients, 3), max(24, o.keysSet)
			o.until = 60 * time.Millisecond
			if o.gap == 0 {
				o.gap = 200 * time.Microsecond
			}
			seeds, over, batched, catching, touched := 0, 0, 0, 0, 0
			flags.Run(t, func(sd sim.Seed) error {
				h, err := runKV(sd.WithLog(t), o)
				if seeds++; h != nil && h.stats.restoresOver > 0 {
					over++
				}
				if h != nil && h.stats.batched > 0 {
					batched++
				}
				if h != nil && h.stats.touched > 0 {
					touched++
				}
				if h != nil && h.stats.catchingUpPolls > 0 {
					catching++
				}
				return err
			})
			// Crashed replicas restart catching up: the header check
			// (catching up as broadcast says) must have seen some.
			if o.crashes && seeds >= 3 && catching == 0 {
				t.Errorf("no replica of %d seeds restarted catching up", seeds)
			}
			// The batches case must mostly see leaders order several
			// messages in one entry, or it tests nothing (a seed whose
			// crashes keep every batch to one message is not a failure).
			if o.batches && seeds >= 10 && batched < seeds/2 {
				t.Errorf("only %d of %d seeds ordered a batch of several messages", batched, seeds)
			}
			// Their batches must have been prefetched (multicast's
			// Prefetch, the table's touch at BeginBatch), so that the
			// checkers see the apply as it runs with it.
			if o.batches && seeds >= 10 && touched < batched/2 {
				t.Errorf("only %d of %d seeds with batches prefetched a batch's keys", touched, batched)
			}
			if o.batches {
				t.Logf("%d of %d seeds ordered a batch of several messages, %d prefetched a batch's keys", batched, seeds, touched)
			}
			// The lagging followers must mostly catch up by a snapshot
			// restored over their records, or the case tests nothing.
			if o.lag > 0 && seeds >= 10 && over < seeds/2 {
				t.Errorf("only %d of %d seeds restored a snapshot into a table holding records", over, seeds)
			}
			if o.lag > 0 {
				t.Logf("%d of %d seeds restored a snapshot into a table holding records", over, seeds)
			}
		})
	}
}

// simNoRace skips a simulator test under the race detector. Each of its
// runs is one Sim on the test's goroutine (PersistInline), deterministic:
// the detector has no second goroutine to check, and the same seeds catch
// the same planted bugs without it. make norace runs these tests in full
// (its kv -run list names them: a new one goes there too).
func simNoRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("single-goroutine simulation: runs without -race (make norace)")
	}
}

// TestSimMutants plants each bug and checks that the checker aimed at it
// catches it within a few seeds.
func TestSimMutants(t *testing.T) {
	simNoRace(t)
	for _, m := range []struct {
		name  string
		knobs testingKnobs
		o     kvOpts
		want  string
		or    string // another check the bug may show up in first
	}{
		{"no-quorum", testingKnobs{noQuorum: true}, kvOpts{ops: 120, isolate: 4, gap: 100 * time.Microsecond}, "linearizability", ""},
		{"new-generation-only", testingKnobs{newGenOnly: true}, kvOpts{ops: 150, keysSet: 160, gap: 60 * time.Microsecond}, "linearizability", "stale-ok gets"},
		{"late-promise", testingKnobs{latePromise: true}, kvOpts{ops: 150, isolate: 4, stall: true, gap: 60 * time.Microsecond}, "linearizability", ""},
		{"no-condition", testingKnobs{noCondition: true}, kvOpts{ops: 120, gap: 100 * time.Microsecond}, "linearizability", ""},
		// A merge that drops the fields it does not name.
		{"merge-replaces", testingKnobs{mergeReplaces: true}, kvOpts{ops: 80, merges: true, gap: 200 * time.Microsecond}, "linearizability", ""},
		// Only a replica restored over its own records shows it: the
		// tables compared at the end differ.
		{"restore-keeps", testingKnobs{restoreKeeps: true}, kvOpts{ops: 200, gap: 200 * time.Microsecond, lag: 2, logEntries: 16}, "differ", ""},
		// Needs the new leaders' stall: without it, not caught in 20
		// seeds of this case, nor in 20 of any other.
		{"serve-early", testingKnobs{serveEarly: true}, kvOpts{ops: 150, crashAfterCommit: 4, newLeaderStall: true, gap: 100 * time.Microsecond}, "linearizability", ""},
		// A member that caught up goes on saying it cannot vote until it
		// applies an entry.
		{"late-catch-up", testingKnobs{lateCatchUp: true}, kvOpts{ops: 80, crashes: true, gap: 200 * time.Microsecond}, "header says catching up true after a Poll, broadcast says false", ""},
	} {
		t.Run(m.name, func(t *testing.T) {
			o := m.o
			o.groups, o.replicas, o.clients, o.keys, o.knobs = 2, 3, 3, cmp.Or(o.keysSet, 24), m.knobs
			o.until = 60 * time.Millisecond
			for seed := uint64(1); seed <= 20; seed++ {
				_, err := runKV(sim.Seed{Seed: seed}, o)
				if err == nil {
					continue
				}
				if !strings.Contains(err.Error(), m.want) && (m.or == "" || !strings.Contains(err.Error(), m.or)) {
					t.Fatalf("seed %d: caught by the wrong check: %v", seed, err)
				}
				t.Logf("seed %d caught it: %s", seed, firstLine(err.Error()))
				return
			}
			t.Fatalf("not caught in 20 seeds")
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// dump describes every replica and client, for a failed run.
func (h *kvRun) dump() string {
	var b strings.Builder
	for g, ms := range h.members {
		for _, id := range ms {
			p := h.procs[id]
			if p == nil {
				continue
			}
			e, lead := p.r.Multicast().Broadcast().Leading()
			fmt.Fprintf(&b, "group %d node %d live %v gone %v: delivered %d, leading %v %v, header %+v\n", g, id, h.s.Live(id), h.gone[id],
				p.r.Multicast().Delivered(), e, lead, p.r.t.Header())
			st := p.r.Multicast().Broadcast().Status()
			fmt.Fprintf(&b, "  broadcast: role %v ECur %v ENew %v accepted %v committed %v durable %v catching-up %v from-disk %v repair %v vote %+v\n",
				st.Role, st.ECur, st.ENew, st.Accepted, st.Committed, st.Durable, st.CatchingUp, st.FromDisk, st.Repair, st.Vote)
			for _, m := range st.Members {
				fmt.Fprintf(&b, "    member %+v\n", m)
			}
		}
	}
	for id, p := range h.clients {
		busy := []int{}
		for g, r := range p.readers {
			if r.Busy() {
				busy = append(busy, g)
				fmt.Fprintf(&b, "  reader %d: state %d attempt %d leader %d last %v\n", g, r.st, r.attempt, r.leader, r.lastErr)
			}
		}
		fmt.Fprintf(&b, "client %d (node %d) live %v: ready %v, %d writes pending, outstanding %d, readers busy %v, issued %d\n",
			p.slot, id, h.s.Live(id), p.c.Ready(), len(p.writes), p.c.Outstanding(), busy, p.issued)
	}
	return b.String()
}

// failedOps lists the ops of the partitions that failed, by call time.
func failedOps(hist []kvcheck.Op, res kvcheck.Result) string {
	keys := map[string]bool{}
	for _, p := range res.Failed {
		for _, k := range p.Keys {
			keys[k] = true
		}
	}
	var b strings.Builder
	for i := range hist {
		o := &hist[i]
		in := keys[o.Key]
		for _, bo := range o.Batch {
			in = in || keys[bo.Key]
		}
		if in {
			fmt.Fprintf(&b, "  c%d [%v, %v] %v\n", o.Client, time.Duration(o.Call), time.Duration(o.Return), o)
		}
	}
	return b.String()
}
